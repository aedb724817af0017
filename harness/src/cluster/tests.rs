use std::time::Duration;

use super::install::parse_major;
use super::*;

#[test]
fn parses_major_versions() {
    assert_eq!(
        parse_major("postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)\n"),
        Some(15)
    );
    assert_eq!(parse_major("postgres (PostgreSQL) 16.2"), Some(16));
    assert_eq!(parse_major("16.2"), Some(16));
    assert_eq!(parse_major("postgres (PostgreSQL) 17devel"), Some(17));
    assert_eq!(parse_major("something else"), None);
}

#[test]
fn free_ports_are_not_repeated_and_not_ephemeral() {
    let ports: HashSet<u16> = (0..50).map(|_| free_port()).collect();
    assert_eq!(ports.len(), 50);
    // Outgoing connections cannot take them between the choice and the server's bind.
    let ephemeral = ephemeral_ports();
    assert!(
        ephemeral.start >= 1024 && ephemeral.start < ephemeral.end,
        "{ephemeral:?}"
    );
    let inside: Vec<_> = ports.iter().filter(|p| ephemeral.contains(p)).collect();
    assert!(inside.is_empty(), "{inside:?} lie in {ephemeral:?}");
}

#[tokio::test]
async fn wait_until_times_out_naming_what() {
    let err = wait_until("the impossible", Duration::from_millis(250), || async {
        Err::<bool, _>(ClusterError::Other("nope".into()))
    })
    .await
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("the impossible") && msg.contains("nope"),
        "{msg}"
    );
}

#[tokio::test]
async fn primary_and_standby_replicate() {
    let install = PgInstall::discover().expect("PostgreSQL binaries (see scripts/install-deps.sh)");
    let root = TempRoot::new().unwrap();
    let root_path = root.path().to_path_buf();

    let primary =
        Cluster::init_primary(&install, &root, "primary", &PrimaryOpts::default()).unwrap();
    primary.start().await.unwrap();
    assert!(primary.is_running());
    primary
        .execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        .await
        .unwrap();
    primary.create_replication_user("s3cret").await.unwrap();
    assert_eq!(
        primary
            .query_one_string("SHOW wal_keep_size")
            .await
            .unwrap(),
        "1GB"
    );

    let opts = StandbyOpts::new(format!(
        "host=127.0.0.1 port={} user=postgres",
        primary.port()
    ));
    let standby = primary.basebackup_standby(&root, "standby", &opts).unwrap();
    assert!(!standby.dir().join("postgres.log").exists());
    standby.start().await.unwrap();
    assert_eq!(
        standby
            .query_one_string("SELECT pg_is_in_recovery()")
            .await
            .unwrap(),
        "t"
    );

    primary
        .execute("INSERT INTO t VALUES (1, 'hello')")
        .await
        .unwrap();
    wait_until("row 1 on the standby", Duration::from_secs(30), || async {
        Ok(standby
            .query_one_string("SELECT count(*) FROM t WHERE id = 1")
            .await?
            == "1")
    })
    .await
    .unwrap();
    let app_name = primary
        .query_one_string("SELECT application_name FROM pg_stat_replication")
        .await
        .unwrap();
    assert_eq!(app_name, "standby");

    standby.stop().await.unwrap();
    primary.stop().await.unwrap();
    assert!(!standby.is_running() && !primary.is_running());
    primary.stop().await.unwrap(); // idempotent

    drop((standby, primary));
    assert!(root_path.exists());
    drop(root);
    assert!(!root_path.exists());
}

#[tokio::test]
async fn drop_stops_a_running_cluster() {
    let install = PgInstall::discover().expect("PostgreSQL binaries (see scripts/install-deps.sh)");
    let root = TempRoot::new().unwrap();
    let root_path = root.path().to_path_buf();
    let primary = Cluster::init_primary(&install, &root, "p", &PrimaryOpts::default()).unwrap();
    primary.start().await.unwrap();
    let pid_file = primary.dir().join("postmaster.pid");
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // Root goes first: the cluster keeps the directory alive until it has stopped.
    drop(root);
    assert!(root_path.exists());
    drop(primary);
    assert!(!root_path.exists());
    assert!(
        !super::instance::pid_alive(pid),
        "postmaster {pid} still alive"
    );
}

#[tokio::test]
async fn failures_explain_themselves() {
    let install = PgInstall::discover().expect("PostgreSQL binaries (see scripts/install-deps.sh)");
    let root = TempRoot::new().unwrap();
    let opts = PrimaryOpts {
        extra_conf: vec![("no_such_setting".into(), "1".into())],
        ..Default::default()
    };
    let bad = Cluster::init_primary(&install, &root, "bad", &opts).unwrap();
    let msg = bad.start().await.unwrap_err().to_string();
    assert!(
        msg.contains("pg_ctl") && msg.contains("no_such_setting"),
        "{msg}"
    );

    let good = Cluster::init_primary(&install, &root, "good", &PrimaryOpts::default()).unwrap();
    good.start().await.unwrap();
    let msg = good
        .execute("SELECT * FROM missing_table")
        .await
        .unwrap_err()
        .to_string();
    assert!(msg.contains("missing_table"), "{msg}");
    let standby = good.basebackup_standby(&root, "good", &StandbyOpts::default());
    let msg = standby.unwrap_err().to_string();
    assert!(msg.contains("pg_basebackup"), "{msg}");
}
