//! Everything a far-datacenter client does over its connection (#13): protocol negotiation,
//! and the sessions the downstream carries to the primary through a tunnel on the link
//! (base backups, logical replication, slot synchronization), each checked end to end with
//! real PostgreSQL clients and clusters and the real binary as separate halves.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use bytes::BytesMut;
use common::split::{Split, SplitOpts};
use common::*;
use walrelay_harness::cluster::Cluster;
use walrelay_pgwire::{encode, parse_tagged};

/// psql 18 asking for protocol 3.2 gets NegotiateProtocolVersion (3.0) and works; a startup
/// packet with an unknown `_pq_.` option gets the option listed back, and the session goes on;
/// a `replication` value PostgreSQL refuses is refused with the same FATAL and hint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_3_2_and_unknown_options_are_negotiated() {
    let env = Split::new(SplitOpts::default()).await;
    let pg18 = walrelay_harness::cluster::majors::install_for_major(18)
        .expect("PostgreSQL 18 client programs (scripts/install-pg-majors.sh)");
    let conninfo = format!(
        "host=127.0.0.1 port={} user={STANDBY_USER} replication=true max_protocol_version=3.2 min_protocol_version=3.0",
        env.down_port
    );
    let out = std::process::Command::new(pg18.bin("psql"))
        .args([&conninfo, "-XAt", "-c", "IDENTIFY_SYSTEM"])
        .env("PGPASSWORD", STANDBY_PASSWORD)
        .env("PGCONNECT_TIMEOUT", "20")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "psql 18 failed: {stderr}");
    let sysid = env
        .primary
        .query_one_string("select system_identifier::text from pg_control_system()")
        .await
        .unwrap();
    assert!(stdout.starts_with(&format!("{sysid}|")), "{stdout}");

    // A 3.0 client whose startup carries `_pq_.` options: 'v' names them, then the
    // authentication request follows (the session goes on).
    let mut pkt = BytesMut::new();
    encode::startup(
        &mut pkt,
        &[
            ("user", STANDBY_USER),
            ("replication", "true"),
            ("_pq_.walrelay_test", "1"),
        ],
    );
    let mut s = std::net::TcpStream::connect(("127.0.0.1", env.down_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&pkt).unwrap();
    let mut got = BytesMut::new();
    let mut msgs = Vec::new();
    let mut buf = [0u8; 4096];
    while msgs.len() < 2 {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed after {msgs:?}");
        got.extend_from_slice(&buf[..n]);
        while let Some(m) = parse_tagged(&mut got, |_| 1 << 16).unwrap() {
            msgs.push(m);
        }
    }
    assert_eq!(msgs[0].tag, b'v');
    assert_eq!(
        &msgs[0].body[..],
        b"\0\x03\0\0\0\0\0\x01_pq_.walrelay_test\0"
    );
    assert_eq!(
        msgs[1].tag, b'R',
        "authentication request after negotiation"
    );

    // A `replication` value PostgreSQL does not accept: the downstream refuses it with the
    // primary's own words (message and hint), before authentication.
    let refusal = |port: u16, password: &str| {
        let conninfo =
            format!("host=127.0.0.1 port={port} user={STANDBY_USER} replication=Database");
        let (ok, _, err) = psql_repl(&env.primary, &conninfo, password, "IDENTIFY_SYSTEM");
        assert!(!ok, "replication=Database was accepted on port {port}");
        err.split_once("failed: ")
            .map_or(err.clone(), |(_, e)| e.trim().to_string())
    };
    let from_primary = refusal(env.primary.port(), REPL_PASSWORD);
    assert!(
        from_primary.starts_with("FATAL:  invalid value for parameter \"replication\""),
        "{from_primary}"
    );
    assert_eq!(refusal(env.down_port, "not-even-asked"), from_primary);
}

/// Every file of a tar-format backup directory, concatenated, compressed as `zstd -3` would.
fn zstd3_of_tar_backup(dir: &std::path::Path) -> (u64, u64) {
    let mut raw = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "tar"))
        .collect();
    names.sort();
    for p in names {
        raw.extend_from_slice(&std::fs::read(p).unwrap());
    }
    let z = zstd::bulk::compress(&raw, 3).unwrap();
    (raw.len() as u64, z.len() as u64)
}

/// A standby seeded only with `pg_basebackup -h <downstream> -X stream -R` starts, streams
/// through the relay and ends with the primary's contents; the backup cost the link no more
/// than `zstd -3` of the same backup in tar format. `-X fetch` (plain, verified with
/// pg_verifybackup) and tar format work through the downstream too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_basebackup_through_the_relay_seeds_a_standby() {
    let env = Split::new(SplitOpts::default()).await;
    pgbench(&env.primary, &["-i", "-s", "3", "-q", "postgres"]);
    env.wait_spool_caught_up().await;

    // The reference: a tar-format backup straight from the primary, compressed with zstd -3.
    let direct = env.root.path().join("direct-tar");
    let (ok, err) = env.basebackup_direct(&direct, &["-Ft", "-X", "stream"]);
    assert!(ok, "{err}");
    let (tar_bytes, zstd3) = zstd3_of_tar_backup(&direct);

    let link0 = env.link_bytes();
    let standby = Cluster::standby_from_basebackup(
        env.primary.install(),
        &env.root,
        "seeded",
        &env.client_args().each_ref().map(String::as_str),
        &["-X", "stream", "-c", "fast"],
        &[("PGPASSWORD", STANDBY_PASSWORD)],
    )
    .unwrap();
    let link = env.link_bytes() - link0;
    eprintln!(
        "backup through the relay: {link} link bytes; the same backup as tar: {tar_bytes} bytes, zstd -3: {zstd3} bytes"
    );
    assert!(
        link <= zstd3,
        "the backup cost the link {link} bytes, more than zstd -3 of its tar ({zstd3})"
    );
    let auto = std::fs::read_to_string(standby.dir().join("postgresql.auto.conf")).unwrap();
    assert!(auto.contains(&format!("port={}", env.down_port)), "{auto}");

    seeded_standby_follows_the_primary(&env, &standby).await;
    fetch_and_tar_backups_through_the_relay(&env);
    env.downstream.assert_no_panic();
    env.upstream.assert_no_panic();
}

/// The seeded standby starts, streams through the relay, replays the primary's changes made
/// after the backup and ends with its contents.
async fn seeded_standby_follows_the_primary(env: &Split, standby: &Cluster) {
    standby.start().await.unwrap();
    env.primary
        .execute("create table after_backup as select g from generate_series(1, 5000) g")
        .await
        .unwrap();
    pgbench(&env.primary, &["-t", "200", "-c", "2", "postgres"]);
    let port = env.down_port;
    walrelay_harness::cluster::wait_until("the seeded standby to stream through the relay", TIMEOUT, || async move {
        let r = standby.query_one_string("select coalesce((select status || ':' || sender_port from pg_stat_wal_receiver), '')").await?;
        Ok(r == format!("streaming:{port}"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", standby.log_tail(30)));
    let target = env.lsn().await;
    walrelay_harness::cluster::wait_until("the seeded standby to replay", TIMEOUT, || async move {
        Ok(parse_lsn(
            &standby
                .query_one_string("select pg_last_wal_replay_lsn()::text")
                .await?,
        ) >= target)
    })
    .await
    .unwrap();
    let mut tables = PGBENCH_TABLES.to_vec();
    tables.push("after_backup");
    assert_eq!(
        tables_digest(standby, &tables).await,
        tables_digest(&env.primary, &tables).await
    );
}

/// `-X fetch` (plain, checked by pg_verifybackup) and tar format through the downstream.
fn fetch_and_tar_backups_through_the_relay(env: &Split) {
    // -X fetch, plain: the WAL comes inside the backup stream; pg_verifybackup checks it all.
    let fetched = env.root.path().join("fetched");
    let (ok, err) = env.basebackup(&fetched, &["-X", "fetch"]);
    assert!(ok, "pg_basebackup -X fetch through the relay: {err}");
    let out = env
        .primary
        .command("pg_verifybackup")
        .arg(&fetched)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pg_verifybackup: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Tar format with -X stream: base.tar and pg_wal.tar.
    let tar = env.root.path().join("tar");
    let (ok, err) = env.basebackup(&tar, &["-Ft", "-X", "stream"]);
    assert!(ok, "pg_basebackup -Ft through the relay: {err}");
    for f in ["base.tar", "pg_wal.tar"] {
        assert!(std::fs::metadata(tar.join(f)).unwrap().len() > 0, "{f}");
    }
}

/// A subscriber's connection string to the primary's database through the downstream.
fn sub_conninfo(env: &Split, app: &str) -> String {
    format!(
        "host=127.0.0.1 port={} user={STANDBY_USER} password={STANDBY_PASSWORD} dbname=postgres application_name={app}",
        env.down_port
    )
}

async fn wait_same(what: &str, a: &Cluster, b: &Cluster, sql: &str) {
    walrelay_harness::cluster::wait_until(what, TIMEOUT, || async move {
        Ok(a.query_one_string(sql).await? == b.query_one_string(sql).await?)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nsubscriber log:\n{}", b.log_tail(30)));
}

async fn confirmed_flush(primary: &Cluster, slot: &str) -> u64 {
    parse_lsn(
        &primary
            .query_one_string(&format!(
                "select coalesce((select confirmed_flush_lsn::text from pg_replication_slots where slot_name = '{slot}'), '0/0')"
            ))
            .await
            .unwrap(),
    )
}

/// A PostgreSQL 16 subscriber whose subscriptions connect through the downstream: with
/// `downstream.allow_slot_commands` off, a subscription that would create its slot is refused
/// with the reason, and one on a slot made on the primary receives inserts, updates and
/// deletes while its feedback advances the slot; after a reload with the key on, a
/// subscription creates its slot, copies the table (table synchronization through the
/// tunnel), streams, and DROP SUBSCRIPTION drops the slot on the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logical_subscription_through_the_relay() {
    let mport = walrelay_harness::cluster::free_port();
    let env = Split::new(SplitOpts {
        primary: walrelay_harness::cluster::PrimaryOpts {
            wal_level: "logical".into(),
            ..Default::default()
        },
        downstream_extra: format!("\n[metrics]\nlisten = \"127.0.0.1:{mport}\"\n"),
        ..Default::default()
    })
    .await;
    let p = &env.primary;
    p.execute("create table items(id int primary key, v text); insert into items values (1, 'a'), (2, 'b'), (3, 'c'); create publication pub for table items; grant select on items to replicator").await.unwrap();
    p.execute("select pg_create_logical_replication_slot('sub_a', 'pgoutput')")
        .await
        .unwrap();
    let pg16 = walrelay_harness::cluster::majors::install_for_major(16)
        .expect("PostgreSQL 16 (scripts/install-pg-majors.sh)");
    let sub = Cluster::init_primary(&pg16, &env.root, "subscriber", &Default::default()).unwrap();
    sub.start().await.unwrap();
    sub.execute("create table items(id int primary key, v text); insert into items values (1, 'a'), (2, 'b'), (3, 'c'); create table more(id int primary key)").await.unwrap();

    slot_creation_is_refused(&env, &sub).await;
    subscription_on_a_primary_slot_streams(&env, &sub).await;
    recvlogical_through_the_downstream(&env).await;
    allow_slot_commands(&env).await;
    subscription_creates_copies_and_drops_its_slot(&env, &sub).await;
    tunnel_metrics_count(mport).await;
    env.downstream.assert_no_panic();
    env.upstream.assert_no_panic();
}

/// The ends of the supported range, publisher and subscriber of the same major: the
/// subscriber's catalog queries and pgoutput's protocol version depend on both, so a
/// PostgreSQL 14 and an 18 subscriber each create their slot through the downstream, copy the
/// table, stream an insert and drop the slot again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logical_subscriptions_on_pg14_and_pg18() {
    for major in [14, 18] {
        let env = Split::new(SplitOpts {
            primary: walrelay_harness::cluster::PrimaryOpts {
                wal_level: "logical".into(),
                ..Default::default()
            },
            downstream_extra: "allow_slot_commands = true\n".into(),
            major: Some(major),
            ..Default::default()
        })
        .await;
        let sub = Cluster::init_primary(
            env.primary.install(),
            &env.root,
            "subscriber",
            &Default::default(),
        )
        .unwrap();
        sub.start().await.unwrap();
        sub.execute("create table more(id int primary key)")
            .await
            .unwrap();
        subscription_creates_copies_and_drops_its_slot(&env, &sub).await;
        env.downstream.assert_no_panic();
        env.upstream.assert_no_panic();
    }
}

/// Slot creation is refused while downstream.allow_slot_commands is off, with the reason.
async fn slot_creation_is_refused(env: &Split, sub: &Cluster) {
    let err = sub
        .execute(&format!(
            "create subscription sub_x connection '{}' publication pub",
            sub_conninfo(env, "sub_x")
        ))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("allow_slot_commands"), "{err}");
    assert_eq!(
        confirmed_flush(&env.primary, "sub_x").await,
        0,
        "the refused slot must not exist"
    );
}

/// A subscription on slot `sub_a` (made on the primary) receives inserts, updates and
/// deletes while its feedback advances the slot, and goes on after a link cut.
async fn subscription_on_a_primary_slot_streams(env: &Split, sub: &Cluster) {
    let p = &env.primary;
    sub.execute(&format!("create subscription sub_a connection '{}' publication pub with (create_slot = false, slot_name = 'sub_a', copy_data = false)", sub_conninfo(env, "sub_a"))).await.unwrap();
    let flush0 = confirmed_flush(p, "sub_a").await;
    p.execute("insert into items values (4, 'd'), (5, 'e'); update items set v = 'A' where id = 1; delete from items where id = 2").await.unwrap();
    let all = "select string_agg(id || ':' || v, ',' order by id) from items";
    wait_same(
        "inserts, updates and deletes at the subscriber",
        p,
        sub,
        all,
    )
    .await;
    assert_eq!(sub.query_one_string(all).await.unwrap(), "1:A,3:c,4:d,5:e");
    let target = env.lsn().await;
    walrelay_harness::cluster::wait_until(
        "the subscriber's feedback to advance the slot",
        TIMEOUT,
        || async move { Ok(confirmed_flush(p, "sub_a").await >= target) },
    )
    .await
    .unwrap();
    assert!(confirmed_flush(p, "sub_a").await > flush0);

    // A link cut ends the subscription's tunnel; its worker reconnects through the restored
    // link and the slot resumes where the subscriber confirmed.
    env.link.cut();
    p.execute("insert into items values (7, 'after the cut')")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    env.link.restore();
    wait_same("changes made while the link was cut", p, sub, all).await;
}

/// pg_recvlogical through the downstream, on a slot made on the primary.
async fn recvlogical_through_the_downstream(env: &Split) {
    let p = &env.primary;
    p.execute("select pg_create_logical_replication_slot('recv', 'test_decoding')")
        .await
        .unwrap();
    p.execute("insert into items values (6, 'recvlogical')")
        .await
        .unwrap();
    let end = p
        .query_one_string("select pg_current_wal_lsn()::text")
        .await
        .unwrap();
    let out = p
        .command("pg_recvlogical")
        .args([
            "-d",
            &sub_conninfo(env, "recv"),
            "-S",
            "recv",
            "--start",
            "--no-loop",
            "-f",
            "-",
        ])
        .arg(format!("--endpos={end}"))
        .env("PGCONNECT_TIMEOUT", "20")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("INSERT: id[integer]:6 v[text]:'recvlogical'"),
        "pg_recvlogical: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Turns allow_slot_commands on in the downstream's config and reloads it (SIGHUP).
async fn allow_slot_commands(env: &Split) {
    let toml = std::fs::read_to_string(&env.downstream.config).unwrap();
    std::fs::write(
        &env.downstream.config,
        toml.replace(
            "[downstream]\n",
            "[downstream]\nallow_slot_commands = true\n",
        ),
    )
    .unwrap();
    env.downstream.signal(libc::SIGHUP);
    walrelay_harness::cluster::wait_until("the reload", TIMEOUT, || async {
        Ok(env
            .downstream
            .log_text()
            .contains("downstream.allow_slot_commands"))
    })
    .await
    .unwrap();
}

/// With allow_slot_commands on, a subscription creates its slot, copies the table (table
/// synchronization through the tunnel), streams, and DROP SUBSCRIPTION drops the slot.
async fn subscription_creates_copies_and_drops_its_slot(env: &Split, sub: &Cluster) {
    let p = &env.primary;
    p.execute("create table more(id int primary key); insert into more select generate_series(1, 100); create publication pub2 for table more; grant select on more to replicator").await.unwrap();
    sub.execute(&format!(
        "create subscription sub_b connection '{}' publication pub2",
        sub_conninfo(env, "sub_b")
    ))
    .await
    .unwrap();
    let count = "select count(*)::text from more";
    wait_same("table synchronization through the tunnel", p, sub, count).await;
    p.execute("insert into more select generate_series(101, 110)")
        .await
        .unwrap();
    wait_same("streaming after table synchronization", p, sub, count).await;
    assert_eq!(sub.query_one_string(count).await.unwrap(), "110");
    assert!(confirmed_flush(p, "sub_b").await > 0);
    sub.execute("drop subscription sub_b").await.unwrap();
    assert_eq!(
        confirmed_flush(p, "sub_b").await,
        0,
        "DROP SUBSCRIPTION dropped the slot"
    );
}

/// The downstream's metrics: the refusal counted, bytes relayed both ways.
async fn tunnel_metrics_count(mport: u16) {
    let text = walrelay_harness::prom::http_get(mport, "/metrics", Duration::from_secs(10))
        .await
        .unwrap();
    let samples = common::prom::parse_exposition(&text);
    let value = |name: &str, labels: &[(&str, &str)]| {
        samples
            .iter()
            .find(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
            .unwrap_or_else(|| panic!("no {name} {labels:?} in:\n{text}"))
    };
    assert!(value("walrelay_tunnel_refused_total", &[]) >= 1.0);
    for dir in ["from_primary", "to_primary"] {
        assert!(
            value(
                "walrelay_tunnel_bytes_total",
                &[("half", "downstream"), ("direction", dir)]
            ) > 0.0
        );
    }
}

/// Slot synchronization (PostgreSQL 17): a standby behind the relay with
/// `sync_replication_slots = on` (its slot-sync worker's SQL connection goes through the
/// downstream, read-only, its queries on the allowlist) shows the primary's failover logical
/// slot as synced; an SQL session asking for anything else is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_synchronization_through_the_relay() {
    slot_synchronization(17).await;
}

/// The same on PostgreSQL 18, whose slot-sync worker asks for more columns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_synchronization_through_the_relay_on_pg18() {
    slot_synchronization(18).await;
}

async fn slot_synchronization(major: u32) {
    let env = Split::new(SplitOpts {
        primary: walrelay_harness::cluster::PrimaryOpts {
            wal_level: "logical".into(),
            ..Default::default()
        },
        major: Some(major),
        ..Default::default()
    })
    .await;
    let p = &env.primary;
    p.create_physical_slot("sb1").await.unwrap();
    p.execute(
        "select pg_create_logical_replication_slot('fo_slot', 'pgoutput', false, false, true)",
    )
    .await
    .unwrap();
    let standby = env.slot_sync_standby("sb1").await;
    p.execute("create table t as select generate_series(1, 1000) x")
        .await
        .unwrap();
    let s = &standby;
    walrelay_harness::cluster::wait_until("the failover slot synced on the standby", TIMEOUT, || async move {
        p.execute("select pg_log_standby_snapshot()").await?;
        Ok(s.query_one_string("select coalesce((select synced::text from pg_replication_slots where slot_name = 'fo_slot'), 'absent')").await? == "true")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nstandby log:\n{}", standby.log_tail(30)));

    // Other SQL on such a session is refused by the downstream with the reason.
    let conninfo = format!(
        "host=127.0.0.1 port={} user={STANDBY_USER} dbname=postgres",
        env.down_port
    );
    let (ok, _, err) = psql_repl(
        p,
        &conninfo,
        STANDBY_PASSWORD,
        "select pg_drop_replication_slot('fo_slot')",
    );
    assert!(!ok && err.contains("allow_sql"), "{err}");
    assert_eq!(
        p.query_one_string(
            "select count(*)::text from pg_replication_slots where slot_name = 'fo_slot'"
        )
        .await
        .unwrap(),
        "1"
    );
    env.downstream.assert_no_panic();
}
