//! End-to-end: a real primary, a real standby streaming through the real walrelay binary.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use common::*;
use std::time::Duration;
use walrelay_harness::cluster::{wait_until, StandbyOpts};
use walrelay_wal::lsn::Lsn;
use walrelay_wal::segment::WalSegSize;

/// pgbench through the relay: contents equal, and the WAL the standby wrote is byte-identical
/// to the primary's over the streamed range; pg_stat_replication shows the real standby with an
/// advancing flush position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_through_relay_is_byte_identical() {
    pgbench_byte_identical(None).await;
}

/// The same on another major than the system's (WAL layout and page magic differ by major).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_through_relay_is_byte_identical_on_pg17() {
    pgbench_byte_identical(Some(17)).await;
}

/// The oldest major walrelay supports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_through_relay_is_byte_identical_on_pg14() {
    pgbench_byte_identical(Some(14)).await;
}

/// The newest major walrelay supports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_through_relay_is_byte_identical_on_pg18() {
    pgbench_byte_identical(Some(18)).await;
}

async fn pgbench_byte_identical(major: Option<u32>) {
    let env = env(EnvOpts {
        major,
        standby_extra_conf: vec![("hot_standby_feedback".into(), "on".into())],
        ..Default::default()
    })
    .await;
    if let Some(m) = major {
        // Both servers run the major asked for, not the system's.
        for pg in [&env.primary, &env.standby] {
            let v = pg
                .query_one_string("select current_setting('server_version_num')")
                .await
                .unwrap();
            assert_eq!(
                v.parse::<u32>().unwrap() / 10000,
                m,
                "server_version_num {v}"
            );
        }
    }
    let flush_sql = "select coalesce((select flush_lsn::text from pg_stat_replication where application_name = 'standby1'), '0/0')";
    let p = &env.primary;
    wait_until(
        "a flush position reported by standby1",
        TIMEOUT,
        || async move { Ok(parse_lsn(&p.query_one_string(flush_sql).await?) > 0) },
    )
    .await
    .unwrap();
    let flush_before = p.query_one_string(flush_sql).await.unwrap();
    pgbench(&env.primary, &["-i", "-s", "3", "-q", "postgres"]);
    pgbench(&env.primary, &["-c", "2", "-T", "6", "postgres"]);
    // Close the current segment so complete segments exist past the load.
    env.close_segment().await;
    env.wait_caught_up().await;

    // pg_stat_replication on the primary names the real standby, and its flush position
    // advanced; beside it, the stream's own connection ("walrelay") reads the WAL once.
    let rows = env.primary.query_one_string("select string_agg(application_name, ',' order by application_name) from pg_stat_replication").await.unwrap();
    assert_eq!(rows, "standby1,walrelay");
    let row = env.primary.query_one_string("select application_name || '|' || state || '|' || flush_lsn::text from pg_stat_replication where application_name = 'standby1'").await.unwrap();
    let parts: Vec<&str> = row.split('|').collect();
    assert_eq!(parts[..2], ["standby1", "streaming"], "{row}");
    assert!(
        parse_lsn(parts[2]) > parse_lsn(&flush_before),
        "flush_lsn did not advance: {flush_before} -> {}",
        parts[2]
    );

    // Hot-standby feedback crossed the link: the primary holds back xmin for the standby.
    wait_until("backend_xmin from hot-standby feedback", TIMEOUT, || async move {
        Ok(p.query_one_string("select coalesce((select (backend_xmin is not null)::text from pg_stat_replication where application_name = 'standby1'), 'false')").await? == "true")
    })
    .await
    .unwrap();

    let n = env.assert_identical().await;
    assert!(n >= 2, "only {n} complete segments to compare");
    env.relay.assert_no_panic();
}

/// A standby restart and a relay crash in the middle of a load: the standby reconnects by
/// itself, catches up, and holds the primary's contents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_and_relay_restart_mid_load() {
    let mut env = env(EnvOpts::default()).await;
    pgbench(&env.primary, &["-i", "-s", "2", "-q", "postgres"]);
    let load = pgbench_background(&env.primary, &["-c", "2", "-T", "14", "postgres"]);

    tokio::time::sleep(Duration::from_secs(3)).await;
    env.standby.restart().await.unwrap();
    env.wait_streaming_through_relay().await;

    tokio::time::sleep(Duration::from_secs(2)).await;
    env.relay.restart(); // SIGKILL, then start again with the same config
    env.wait_streaming_through_relay().await;

    finish_load_identical(&env, load, "during the restarts").await;
}

/// pg_receivewal through the relay (with its own slot, found through READ_REPLICATION_SLOT)
/// writes segments identical to the primary's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_receivewal_through_relay_writes_identical_segments() {
    receivewal_identical(None).await;
}

/// The same with PostgreSQL 14's pg_receivewal (no READ_REPLICATION_SLOT: it starts at the
/// segment of the position IDENTIFY_SYSTEM reports) and 18's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_receivewal_through_relay_on_pg14_and_pg18() {
    for major in [14, 18] {
        receivewal_identical(Some(major)).await;
    }
}

async fn receivewal_identical(major: Option<u32>) {
    let env = env(EnvOpts {
        major,
        ..Default::default()
    })
    .await;
    env.primary
        .create_physical_slot("receivewal")
        .await
        .unwrap();
    // pg_receivewal starts at the segment of the slot's position (READ_REPLICATION_SLOT) or,
    // PostgreSQL 14's, of the position IDENTIFY_SYSTEM reports: no later than the segment
    // being written now. So it starts first, and it stops at the start of the segment after
    // next: the next one it then writes whole, whether or not the relay had caught up with
    // the primary when it connected (a relay caught up before the load is written would
    // otherwise leave it nothing complete before the end).
    let p = &env.primary;
    let now = parse_lsn(
        &p.query_one_string("select pg_current_wal_insert_lsn()::text")
            .await
            .unwrap(),
    );
    let seg = WalSegSize::DEFAULT;
    let end = seg
        .segment_start(seg.segment_of(Lsn(now)) + 2)
        .expect("the segment after next starts at a valid LSN");
    let end_text = end.to_string();

    let dir = env.root.path().join("receivewal");
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = env.primary.command("pg_receivewal");
    cmd.arg("-D").arg(&dir).args([
        "-d",
        &format!("host=127.0.0.1 port={} user={STANDBY_USER}", env.down_port),
        "--slot=receivewal",
        "--no-loop",
        &format!("--endpos={end_text}"),
    ]);
    cmd.env("PGPASSWORD", STANDBY_PASSWORD);
    let receive = tokio::task::spawn_blocking(move || cmd.output());
    // Streaming (the relay opened its own connection to the primary for it): its start is
    // fixed.
    let streaming =
        "select count(*)::text from pg_stat_replication where application_name = 'pg_receivewal'";
    wait_until(
        "pg_receivewal streaming through the relay",
        TIMEOUT,
        || async move { Ok(p.query_one_string(streaming).await? == "1") },
    )
    .await
    .unwrap();
    pgbench(&env.primary, &["-i", "-s", "2", "-q", "postgres"]);
    // pg_receivewal stops once it has received WAL past --endpos: the primary switches to the
    // next segment until it reaches the end, then writes a little more until it stops (else
    // it waits for the next running-xacts record, ~15 s).
    let nudge = async {
        let sql = format!(
            "select txid_current(), case when pg_current_wal_insert_lsn() < '{end_text}' \
             then pg_switch_wal() end"
        );
        loop {
            let _ = p.execute(&sql).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    let out = tokio::select! {
        out = receive => out.unwrap().unwrap(),
        () = nudge => unreachable!(),
    };
    assert!(
        out.status.success(),
        "pg_receivewal failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let n = compare_segments(&dir, &env.primary.wal_dir(), &segment_name(1, end.0));
    assert!(n >= 1, "pg_receivewal wrote no complete segment to compare");
    // The streamed slot advanced on the primary as pg_receivewal flushed.
    let slot = env
        .primary
        .query_one_string(
            "select restart_lsn::text from pg_replication_slots where slot_name = 'receivewal'",
        )
        .await
        .unwrap();
    assert!(parse_lsn(&slot) > 0);
}

/// With a configured slot, the upstream creates it on the primary and the standby's stream
/// holds it: the slot's restart_lsn follows the standby.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_slot_is_created_and_advances() {
    let env = env(EnvOpts {
        upstream_extra: "slot = \"walrelay_dc2\"".into(),
        ..Default::default()
    })
    .await;
    let slot_lsn = "select coalesce((select restart_lsn::text from pg_replication_slots where slot_name = 'walrelay_dc2' and active), '0/0')";
    let p = &env.primary;
    wait_until("slot walrelay_dc2 active", TIMEOUT, || async move {
        Ok(parse_lsn(&p.query_one_string(slot_lsn).await?) > 0)
    })
    .await
    .unwrap();
    let before = parse_lsn(&p.query_one_string(slot_lsn).await.unwrap());
    p.execute("create table t as select generate_series(1, 100000) x")
        .await
        .unwrap();
    wait_until("slot restart_lsn advances", TIMEOUT, || async move {
        Ok(parse_lsn(&p.query_one_string(slot_lsn).await?) > before)
    })
    .await
    .unwrap();
}

/// A primary connection that goes silent without closing (its walsender stopped with
/// SIGSTOP, as a lost host leaves a TCP connection open) is given up after the upstream's
/// 60 s, as a walreceiver gives it up after `wal_receiver_timeout`, and opened again: first a
/// standby's own connection (its identity), then the stream's, after which the standby gets
/// what the primary wrote meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_primary_connection_is_given_up_and_opened_again() {
    let env = env(EnvOpts::default()).await;
    env.wait_caught_up().await;
    let p = &env.primary;
    let standby1_streams = || async move {
        let sql = "select count(*)::text from pg_stat_replication where application_name = 'standby1' and state = 'streaming'";
        Ok(p.query_one_string(sql).await? == "1")
    };
    wait_until("standby1's own connection", TIMEOUT, standby1_streams)
        .await
        .unwrap();
    let identity = silence(
        &env,
        "standby1",
        "connection to the primary ended (nothing from the primary for 60 s",
    )
    .await;
    wait_until("standby1's own connection again", TIMEOUT, standby1_streams)
        .await
        .unwrap();
    assert_ne!(
        walsender_pid(p, "standby1").await,
        identity,
        "not opened again"
    );
    silence(
        &env,
        "walrelay",
        "nothing from the primary for 60 s, though it was asked for a reply: taken for gone",
    )
    .await;
    env.primary
        .execute("create table after_silence as select 1 x")
        .await
        .unwrap();
    env.wait_caught_up().await;
    env.relay.assert_no_panic();
}

async fn walsender_pid(p: &walrelay_harness::cluster::Cluster, name: &str) -> i32 {
    let sql =
        format!("select pid::text from pg_stat_replication where application_name = '{name}'");
    p.query_one_string(&sql).await.unwrap().parse().unwrap()
}

/// Stops the primary's walsender for `name` until the relay logs `given_up`; returns its pid.
async fn silence(env: &Env, name: &str, given_up: &'static str) -> i32 {
    let pid = walsender_pid(&env.primary, name).await;
    // SAFETY: kill(2) takes plain integers; no memory is involved.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let relay = &env.relay;
    let r = wait_until(given_up, TIMEOUT, || async move {
        Ok(relay.log_text().contains(given_up))
    })
    .await;
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    r.unwrap_or_else(|e| panic!("{e}\n{}", env.relay.log_text()));
    pid
}

/// A standby that starts streaming from the spool while the link is down, naming a slot the
/// primary does not have: once the link is back the primary refuses its own connection, and
/// the standby hears that refusal (its session ends with it, and its next START gets it), as
/// from PostgreSQL itself, instead of streaming on unseen by the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_that_comes_after_the_start_reaches_the_standby() {
    let env = env(EnvOpts {
        cuttable_link: true,
        ..Default::default()
    })
    .await;
    let proxy = env.cut.as_ref().unwrap();
    proxy.cut();
    let mut opts = StandbyOpts::new(standby_conninfo(env.down_port));
    opts.application_name = Some("slotless".into());
    opts.slot = Some("missing".into());
    let slotless = env
        .primary
        .basebackup_standby(&env.root, "slotless", &opts)
        .unwrap();
    slotless.start().await.unwrap();
    // It streams from the spool, the link being down.
    let s = &slotless;
    wait_until(
        "the standby streams from the spool",
        TIMEOUT,
        || async move {
            Ok(s.query_one_string(
                "select count(*)::text from pg_stat_wal_receiver where status = 'streaming'",
            )
            .await?
                == "1")
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", slotless.log_tail(30)));
    proxy.restore();
    let refused = "replication slot \"missing\" does not exist";
    wait_until(
        "the standby hears the primary's refusal",
        TIMEOUT,
        || async move { Ok(s.log_tail(200).contains(refused)) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}", slotless.log_tail(30), env.relay.log_text()));
    env.relay.assert_no_panic();
}
