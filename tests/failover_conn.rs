//! Connections that follow a failover: the upstream's `upstream.primary` host list with
//! `target_session_attrs`, and the downstream's list of upstream addresses. Real PostgreSQL,
//! the real binary.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use common::*;
use walrelay::conninfo::ConnInfo;
use walrelay::pgclient::{self, Continuity, PgClientError, ServerRole, SystemIdentity};
use walrelay_harness::certs::{Ca, CertFiles};
use walrelay_harness::cluster::{
    free_port, wait_replayed, wait_until, Cluster, StandbyOpts, TempRoot,
};
use walrelay_wal::lsn::TimeLineId;

const MAX_MESSAGE: usize = 4 << 20;

/// A primary, and a hot standby streaming from it directly.
async fn primary_and_hot_standby(root: &TempRoot) -> (Cluster, Cluster) {
    let primary = replication_primary(root).await;
    let mut opts = StandbyOpts::new(primary.conninfo());
    opts.application_name = Some("direct".into());
    let hot = primary.basebackup_standby(root, "hot", &opts).unwrap();
    hot.start().await.unwrap();
    (primary, hot)
}

/// `upstream.primary` listing `first` then `second` (both on 127.0.0.1).
fn two_hosts(first: u16, second: u16, attrs: &str) -> String {
    format!(
        "host=127.0.0.1,127.0.0.1 port={first},{second} user={STANDBY_USER} \
         password={REPL_PASSWORD} sslmode=disable connect_timeout=5 target_session_attrs={attrs}"
    )
}

async fn connect(conninfo: &str) -> Result<pgclient::PrimaryConn, PgClientError> {
    pgclient::connect(&ConnInfo::parse(conninfo).unwrap(), "probe", MAX_MESSAGE).await
}

/// application_names of the walsenders of `c`.
async fn walsenders(c: &Cluster) -> String {
    c.query_one_string(
        "select coalesce(string_agg(application_name, ',' order by application_name), '') \
         from pg_stat_replication",
    )
    .await
    .unwrap()
}

/// The standby listed first is skipped (read-only), the primary listed second chosen; a
/// standby behind walrelay streams from the primary. After the primary stops, no host
/// qualifies and the error names both; after the standby is promoted, a new connection
/// chooses it, on the next timeline, with that timeline's history, and the standby behind
/// walrelay follows onto that timeline with no configuration change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_skips_a_hot_standby_and_then_chooses_the_promoted_one() {
    let root = TempRoot::new().unwrap();
    let (primary, hot) = primary_and_hot_standby(&root).await;
    let read_write = two_hosts(hot.port(), primary.port(), "read-write");
    let before = choices_while_the_primary_runs(&primary, &hot).await;
    let (relay, behind, down) = standby_behind_walrelay(&root, &primary, &hot, &read_write).await;
    let received = root.path().join("received");
    let mut receiver = receivewal_streaming(&primary, &received, down, "recv").await;

    primary.stop().await.unwrap();
    no_host_qualifies(&read_write, &primary, &hot).await;
    hot.execute("select pg_promote()").await.unwrap();
    the_promoted_server_is_chosen(&read_write, &hot, &before).await;

    // The standby behind walrelay follows by itself: its next session reaches the promoted
    // server, and it switches to timeline 2 with the history relayed from there.
    hot.execute("create table after_promotion as select 1 x")
        .await
        .unwrap();
    let (b, h) = (&behind, &hot);
    wait_until(
        "the standby behind walrelay replays timeline 2",
        TIMEOUT,
        || async move {
            let on_behind = b
                .query_one_string(
                    "select (select count(*) from pg_class where relname = 'after_promotion') \
                     || ':' || coalesce((select received_tli || ':' || sender_port \
                     from pg_stat_wal_receiver where status = 'streaming'), '')",
                )
                .await?;
            Ok(on_behind == format!("1:2:{down}") && walsenders(h).await.contains("standby1"))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}", relay.log_text(), behind.log_tail(30)));
    receiver_follows_onto_timeline_2(&mut receiver, &received).await;
    relay.assert_no_panic();
}

/// The upstream reaches the primary only after a first host of `upstream.primary` that takes
/// connections and never answers has used its whole connect_timeout (33 s), longer than the
/// downstream waits for the link to answer (`link.connect_timeout_secs` 1, + 30 s). The
/// upstream answers the stream at once and sends its Welcome once the stream is open on the
/// primary; the downstream waits for it, and the standby behind it streams. (Before, the
/// downstream gave up at 31 s, the upstream's opening was dropped with the stream, and every
/// attempt started over at the silent host: the link never came up.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_link_comes_up_when_the_primary_takes_longer_to_reach_than_the_link_waits() {
    let root = TempRoot::new().unwrap();
    let primary = replication_primary(&root).await;
    // Connections queue in its backlog, and nobody ever answers them.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let conninfo = two_hosts(silent_port, primary.port(), "read-write")
        .replace("connect_timeout=5", "connect_timeout=33");
    let (up, down) = (free_port(), free_port());
    let toml = both_halves_toml(&primary, up, down, up, "", "")
        .replace(
            &format!(
                "host=127.0.0.1 port={} user={STANDBY_USER} password={REPL_PASSWORD} sslmode=disable",
                primary.port()
            ),
            &conninfo,
        )
        .replace("connect_timeout_secs = 3", "connect_timeout_secs = 1");
    let relay = Relay::start(root.path(), "relay", &toml, Some(down), Some(up));
    let mut opts = StandbyOpts::new(standby_conninfo(down));
    opts.application_name = Some("standby1".into());
    let behind = primary.basebackup_standby(&root, "behind", &opts).unwrap();
    behind.start().await.unwrap();
    let p = &primary;
    wait_until(
        "standby1 streaming from the primary through walrelay",
        TIMEOUT,
        || async move { Ok(walsenders(p).await.split(',').any(|a| a == "standby1")) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", relay.log_text()));
    primary
        .execute("create table after_the_wait as select 1 x")
        .await
        .unwrap();
    wait_replayed(&primary, &behind, TIMEOUT, || None)
        .await
        .unwrap();
    let log = relay.log_text();
    assert!(
        !log.contains("did not answer in time"),
        "the downstream gave up on the upstream:\n{log}"
    );
    relay.assert_no_panic();
    drop(silent);
}

/// The relay's spool holds WAL past the point where the promoted standby's timeline forks off
/// (that standby had stopped receiving before the primary wrote it): on the promoted server
/// the relay's slot and its flush position never pass what the relay was sent there, and
/// once the spool is cut back to the fork it reports timeline 2's WAL durable as it comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_past_the_fork_is_not_reported_durable_on_the_promoted_server() {
    let root = TempRoot::new().unwrap();
    let (primary, hot) = primary_and_hot_standby(&root).await;
    let read_write = two_hosts(hot.port(), primary.port(), "read-write");
    let (relay, behind, _down) = standby_behind_walrelay(&root, &primary, &hot, &read_write).await;

    // The hot standby stops receiving; the primary writes on, and the relay spools it.
    hot.execute("alter system set primary_conninfo = ''")
        .await
        .unwrap();
    hot.execute("select pg_reload_conf()").await.unwrap();
    let h = &hot;
    wait_until(
        "the hot standby's walreceiver stops",
        TIMEOUT,
        || async move {
            Ok(
                h.query_one_string("select count(*)::text from pg_stat_wal_receiver")
                    .await?
                    == "0",
            )
        },
    )
    .await
    .unwrap();
    primary
        .execute("create table past_fork as select generate_series(1, 200000) x")
        .await
        .unwrap();
    let end = primary
        .query_lsn("select pg_current_wal_flush_lsn()")
        .await
        .unwrap();
    wait_replayed(&primary, &behind, TIMEOUT, || None)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", relay.log_text()));

    primary.stop().await.unwrap();
    hot.execute("select pg_promote()").await.unwrap();
    let ahead = format!("select (pg_current_wal_flush_lsn() < '{end}'::pg_lsn)::text");
    assert_eq!(hot.query_one_string(&ahead).await.unwrap(), "true");

    // The relay streams from the promoted server; sample what it tells it.
    let feed = "select coalesce((select (restart_lsn <= pg_current_wal_flush_lsn())::text \
                from pg_replication_slots where slot_name = 'walrelay'), 'no slot') || ' ' || \
                coalesce((select state || ' ' || (flush_lsn <= sent_lsn)::text || ' ' || \
                flush_lsn::text from pg_stat_replication where application_name = 'walrelay'), \
                'no feed')";
    let deadline = std::time::Instant::now() + TIMEOUT;
    let mut streaming = 0;
    while streaming < 20 {
        let seen = hot.query_one_string(feed).await.unwrap();
        assert!(
            !seen.contains("false"),
            "the promoted server was told of WAL the relay has not received: {seen}\n{}",
            relay.log_text()
        );
        if seen.starts_with("true streaming") {
            streaming += 1;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the relay did not stream from the promoted server: {seen}\n{}",
            relay.log_text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }

    // Timeline 2's WAL reaches the spool and is reported durable as it comes, though the
    // spool held timeline 1 beyond it.
    hot.execute("create table on_2 as select generate_series(1, 10000) x")
        .await
        .unwrap();
    let target = hot
        .query_lsn("select pg_current_wal_flush_lsn()")
        .await
        .unwrap();
    let flushed = format!(
        "select coalesce((select (flush_lsn >= '{target}'::pg_lsn and flush_lsn <= sent_lsn)::text \
         from pg_stat_replication where application_name = 'walrelay'), 'no feed')"
    );
    wait_until(
        "the relay reports timeline 2's WAL durable",
        TIMEOUT,
        || async { Ok(h.query_one_string(&flushed).await? == "true") },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", relay.log_text()));
    relay.assert_no_panic();
}

/// A new downstream (its spool empty) whose slot was made on the standby before its
/// promotion: the slot holds WAL from a restartpoint on timeline 1, which the promoted server
/// has only under timeline 1's segment names. The stream starts there, on timeline 1, and
/// follows onto timeline 2; a standby behind walrelay replays what the promoted server writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_spool_starts_on_the_timeline_its_slot_names() {
    let root = TempRoot::new().unwrap();
    let (primary, hot) = primary_and_hot_standby(&root).await;
    primary
        .execute("create table before_promotion as select generate_series(1, 10000) x; checkpoint")
        .await
        .unwrap();
    wait_replayed(&primary, &hot, TIMEOUT, || None)
        .await
        .unwrap();
    // A restartpoint, then the slot on the standby: it reserves WAL from that redo point.
    hot.execute("checkpoint").await.unwrap();
    hot.execute("select pg_create_physical_replication_slot('walrelay', true)")
        .await
        .unwrap();
    // Later segments, so that the slot's lies before the one timeline 2 starts in.
    for _ in 0..2 {
        primary
            .execute(
                "select pg_switch_wal(); create table t_switch as select 1 x; drop table t_switch",
            )
            .await
            .unwrap();
    }
    wait_replayed(&primary, &hot, TIMEOUT, || None)
        .await
        .unwrap();
    primary.stop().await.unwrap();
    hot.execute("select pg_promote()").await.unwrap();
    let tli = "select restart_lsn::text || ' ' || (select timeline_id::text from pg_control_checkpoint()) \
               from pg_replication_slots where slot_name = 'walrelay'";
    let before = hot.query_one_string(tli).await.unwrap();

    let (up, down) = (free_port(), free_port());
    let relay = Relay::start(
        root.path(),
        "relay",
        &both_halves_toml(&hot, up, down, up, "", ""),
        Some(down),
        Some(up),
    );
    let mut opts = StandbyOpts::new(standby_conninfo(down));
    opts.application_name = Some("behind".into());
    let behind = hot.basebackup_standby(&root, "behind", &opts).unwrap();
    behind.start().await.unwrap();
    hot.execute("create table after_promotion as select 1 x")
        .await
        .unwrap();
    let b = &behind;
    wait_until(
        "the standby behind walrelay replays the promoted server's table",
        TIMEOUT,
        || async move {
            Ok(b.query_one_string(
                "select count(*)::text from pg_class where relname = 'after_promotion'",
            )
            .await?
                == "1")
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e} (slot before: {before})\n{}", relay.log_text()));
    relay.assert_no_panic();
}

/// pg_receivewal (`--no-loop`: it exits on any error) streamed timeline 1 through the
/// downstream: at its end it takes the next timeline from START_REPLICATION's answer, fetches
/// the history file and goes on streaming timeline 2.
async fn receiver_follows_onto_timeline_2(
    receiver: &mut std::process::Child,
    dir: &std::path::Path,
) {
    let on_2 = || {
        std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .any(|n| n.starts_with("00000002") && n.len() >= 24)
    };
    let history = dir.join("00000002.history");
    let deadline = std::time::Instant::now() + TIMEOUT;
    while !(history.exists() && on_2()) {
        if let Some(status) = receiver.try_wait().unwrap() {
            panic!("pg_receivewal exited at the timeline switch: {status}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pg_receivewal did not reach timeline 2"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(
        receiver.try_wait().unwrap().is_none(),
        "pg_receivewal exited"
    );
    let _ = receiver.kill();
    let _ = receiver.wait();
}

/// Directly: `any` takes the first host (the standby), read-write and primary the second.
/// Returns the primary's identity.
async fn choices_while_the_primary_runs(primary: &Cluster, hot: &Cluster) -> SystemIdentity {
    let mut conn = connect(&two_hosts(hot.port(), primary.port(), "any"))
        .await
        .unwrap();
    assert_eq!(conn.server.index, 0);
    assert_eq!(conn.role().await.unwrap(), ServerRole::HotStandby);
    conn.terminate().await;
    for attrs in ["read-write", "primary"] {
        let mut conn = connect(&two_hosts(hot.port(), primary.port(), attrs))
            .await
            .unwrap();
        assert_eq!(conn.server.index, 1, "{attrs}");
        assert_eq!(conn.server.host.port, primary.port());
        assert_eq!(conn.role().await.unwrap(), ServerRole::ReadWrite);
        conn.terminate().await;
    }
    let mut conn = connect(&two_hosts(hot.port(), primary.port(), "read-write"))
        .await
        .unwrap();
    let id = conn.identify_system().await.unwrap();
    conn.terminate().await;
    let sysid = primary
        .query_one_string("select system_identifier::text from pg_control_system()")
        .await
        .unwrap();
    assert_eq!(id.system_id.to_string(), sysid);
    assert_eq!(id.timeline, TimeLineId(1));
    assert!(id.xlogpos.0 > 0);
    assert_eq!(id.dbname, None);
    id
}

/// The relay with `upstream.primary = conninfo`, and a standby behind it that streams from
/// the primary (not from the hot standby). Returns the relay, the standby and the
/// downstream's port.
async fn standby_behind_walrelay(
    root: &TempRoot,
    primary: &Cluster,
    hot: &Cluster,
    conninfo: &str,
) -> (Relay, Cluster, u16) {
    let (up, down) = (free_port(), free_port());
    let toml = both_halves_toml(primary, up, down, up, "", "").replace(
        &format!(
            "host=127.0.0.1 port={} user={STANDBY_USER} password={REPL_PASSWORD} sslmode=disable",
            primary.port()
        ),
        conninfo,
    );
    let relay = Relay::start(root.path(), "relay", &toml, Some(down), Some(up));
    let mut opts = StandbyOpts::new(standby_conninfo(down));
    opts.application_name = Some("standby1".into());
    let behind = primary.basebackup_standby(root, "behind", &opts).unwrap();
    behind.start().await.unwrap();
    wait_until(
        "standby1 streaming from the primary through walrelay",
        TIMEOUT,
        || async move {
            Ok(walsenders(primary)
                .await
                .split(',')
                .any(|a| a == "standby1"))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", relay.log_text()));
    let on_hot = walsenders(hot).await;
    assert!(
        !on_hot.split(',').any(|a| a == "standby1"),
        "walrelay streams standby1 from the hot standby: {on_hot}"
    );
    assert!(relay
        .log_text()
        .contains("connected to a later host of upstream.primary"));
    (relay, behind, down)
}

/// The primary stopped: the standby left is read-only, the primary refuses; the error says
/// both.
async fn no_host_qualifies(conninfo: &str, primary: &Cluster, hot: &Cluster) {
    let e = connect(conninfo).await.map(|_| ()).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, PgClientError::NoHost { .. }), "{msg}");
    assert!(
        msg.starts_with("no host of upstream.primary is a primary (read-write): "),
        "{msg}"
    );
    let hot_why = format!("127.0.0.1:{}: read-only (hot standby)", hot.port());
    assert!(msg.contains(&hot_why), "{msg}");
    let primary_at = format!("127.0.0.1:{}: ", primary.port());
    assert!(msg.contains(&primary_at), "{msg}");
}

/// Promoted, the standby is chosen: same system, next timeline, its history file.
async fn the_promoted_server_is_chosen(conninfo: &str, hot: &Cluster, before: &SystemIdentity) {
    let mut conn = connect(conninfo).await.unwrap();
    assert_eq!(conn.server.index, 0);
    assert_eq!(conn.role().await.unwrap(), ServerRole::ReadWrite);
    let now = conn.identify_system().await.unwrap();
    assert_eq!(
        now.continuity_from(before),
        Continuity::Promoted {
            from: TimeLineId(1),
            to: TimeLineId(2)
        }
    );
    let history = conn.timeline_history(now.timeline).await.unwrap();
    assert_eq!(history.file_name, "00000002.history");
    let on_disk = std::fs::read(hot.wal_dir().join("00000002.history")).unwrap();
    assert_eq!(&history.content[..], &on_disk[..]);
    let entries = history.entries().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].tli, TimeLineId(1));
    assert!(entries[0].end >= before.xlogpos);
    // A timeline the server does not have is the server's error, not a guess.
    assert!(matches!(
        conn.timeline_history(TimeLineId(3)).await,
        Err(PgClientError::Server(_))
    ));
    conn.terminate().await;
}

/// `[link]` with mutual TLS files and a short connect timeout.
fn tls_link(ca: &std::path::Path, c: &CertFiles) -> String {
    format!(
        "tls_cert = \"{}\"\ntls_key = \"{}\"\ntls_ca = \"{}\"\nconnect_timeout_secs = 3\n",
        c.cert.display(),
        c.key.display(),
        ca.display()
    )
}

fn upstream_only(primary: &Cluster, up: u16, link: &str) -> String {
    format!(
        "[upstream]\nprimary = \"host=127.0.0.1 port={} user={STANDBY_USER} password={REPL_PASSWORD} sslmode=disable\"\nlisten = \"127.0.0.1:{up}\"\n\n[link]\n{link}",
        primary.port(),
    )
}

fn downstream_only(dir: &std::path::Path, down: u16, upstream: &str, link: &str) -> String {
    format!(
        "[downstream]\nlisten = \"127.0.0.1:{down}\"\nupstream = {upstream}\nauth = \"scram-sha-256\"\nusers = {{ {STANDBY_USER} = \"{}\" }}\nspool_dir = \"{}\"\n\n[link]\n{link}",
        walrelay_pgwire::scram::new_verifier(STANDBY_PASSWORD),
        dir.join(format!("spool-{down}")).display(),
    )
}

/// `downstream.upstream = [refusing, working]` with mutual TLS: the standby streams through
/// the second address, whose own host name is the one its certificate is checked against.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downstream_moves_on_to_the_next_upstream_address() {
    let root = TempRoot::new().unwrap();
    let dir = root.path();
    let primary = Cluster::init_primary(&install(), &root, "primary", &Default::default()).unwrap();
    primary.start().await.unwrap();
    primary
        .create_replication_user(REPL_PASSWORD)
        .await
        .unwrap();
    let ca = Ca::new("walrelay test CA").unwrap();
    let ca_pem = ca.write_ca(dir, "ca").unwrap();
    // Valid for localhost only: dialing 127.0.0.1 with its own name would fail the check.
    let server = ca.issue(dir, "upstream", &["localhost"]).unwrap();
    let client = ca.issue(dir, "downstream", &["downstream"]).unwrap();

    let (up, down) = (free_port(), free_port());
    let refusing = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let up_toml = upstream_only(&primary, up, &tls_link(&ca_pem, &server));
    let _upstream = Relay::start(dir, "upstream", &up_toml, None, Some(up));
    let list = format!("[\"127.0.0.1:{refusing}\", \"localhost:{up}\"]");
    let down_toml = downstream_only(dir, down, &list, &tls_link(&ca_pem, &client));
    let downstream = Relay::start(dir, "downstream", &down_toml, Some(down), None);
    let mut opts = StandbyOpts::new(standby_conninfo(down));
    opts.application_name = Some("standby1".into());
    let standby = primary.basebackup_standby(&root, "standby", &opts).unwrap();
    standby.start().await.unwrap();

    primary
        .execute("create table t as select generate_series(1, 1000) x")
        .await
        .unwrap();
    let s = &standby;
    wait_until(
        "the standby replays the new table",
        TIMEOUT,
        || async move {
            Ok(
                s.query_one_string("select count(*)::text from pg_class where relname = 't'")
                    .await?
                    == "1",
            )
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", downstream.log_text()));
    let receiver = standby
        .query_one_string("select status || ':' || sender_port from pg_stat_wal_receiver")
        .await
        .unwrap();
    assert_eq!(receiver, format!("streaming:{down}"));
    // The standby's own connection, and the stream's.
    assert_eq!(walsenders(&primary).await, "standby1,walrelay");
    let log = downstream.log_text();
    assert!(
        log.contains(&format!("127.0.0.1:{refusing}")) && log.contains("trying the next one"),
        "the downstream did not say it skipped the refusing address:\n{log}"
    );
    downstream.assert_no_panic();
}
