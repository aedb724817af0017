//! What link batching (link protocol 3) must never change, with real PostgreSQL and the real
//! binary: whatever is coalesced on the link, the primary ends with exactly the standby's
//! latest positions and its hot-standby feedback; a reply the primary asks for is not held by
//! the window; a standby that `synchronous_standby_names` lists gets no window at all.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use std::time::Duration;

use common::*;
use walrelay_harness::cluster::{wait_until, PrimaryOpts};

/// Standbys that report only when data arrives (and every 30 s), so that a status update
/// the relay failed to pass on would show on the primary for a long time.
fn quiet_standby() -> Vec<(String, String)> {
    vec![
        ("wal_receiver_status_interval".into(), "30s".into()),
        ("hot_standby_feedback".into(), "on".into()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_ends_with_the_standbys_latest_positions_and_feedback() {
    let env = env(EnvOpts {
        standby_extra_conf: quiet_standby(),
        link_extra: "batch_window_ms = 200".into(),
        ..Default::default()
    })
    .await;
    pgbench(&env.primary, &["-i", "-s", "2", "-q", "postgres"]);
    pgbench(&env.primary, &["-c", "4", "-T", "4", "-n", "postgres"]);
    env.primary
        .execute("create table last_one(x int); insert into last_one values (1)")
        .await
        .unwrap();
    env.wait_caught_up().await;
    // Well within the standby's 30 s status interval: the final write/flush positions reach
    // the primary only if the relay passed on the latest (coalesced) status update.
    let (primary, standby) = (&env.primary, &env.standby);
    wait_until(
        "the primary's view of the standby equals the standby's own positions",
        Duration::from_secs(10),
        || async move {
            let theirs = standby
                .query_one_string("select flushed_lsn::text from pg_stat_wal_receiver")
                .await?;
            let ours = primary
                .query_one_string("select coalesce((select write_lsn::text || ' ' || flush_lsn::text from pg_stat_replication where application_name = 'standby1'), '')")
                .await?;
            Ok(ours == format!("{theirs} {theirs}"))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nrelay log:\n{}", env.relay.log_text()));
    let xmin = env
        .primary
        .query_one_string("select coalesce(backend_xmin::text, 'none') from pg_stat_replication where application_name = 'standby1'")
        .await
        .unwrap();
    assert_ne!(
        xmin, "none",
        "hot-standby feedback never reached the primary"
    );
    env.close_segment().await;
    env.wait_caught_up().await;
    assert!(env.assert_identical().await > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_the_primary_asks_for_does_not_wait_for_the_window() {
    // The primary asks for a reply after 1 s without one and gives up after 2 s, while the
    // standby reports only every 30 s: the standby's own connection answers the primary's
    // requests itself, with the standby's latest feedback, never waiting for the window.
    let env = env(EnvOpts {
        primary: PrimaryOpts {
            extra_conf: vec![("wal_sender_timeout".into(), "2s".into())],
            ..Default::default()
        },
        standby_extra_conf: quiet_standby(),
        link_extra: "batch_window_ms = 1000".into(),
        ..Default::default()
    })
    .await;
    let p = &env.primary;
    wait_until(
        "the standby's walsender on the primary",
        TIMEOUT,
        || async move { Ok(walsender_pid(p).await != "gone") },
    )
    .await
    .unwrap();
    let before = walsender_pid(&env.primary).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        walsender_pid(&env.primary).await,
        before,
        "the primary's walsender was replaced: a requested reply came too late\nprimary log:\n{}",
        env.primary.log_tail(20)
    );
    assert!(!env
        .primary
        .log_tail(200)
        .contains("terminating walsender process due to replication timeout"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_that_commits_wait_on_gets_no_window() {
    let env = env(EnvOpts {
        link_extra: "batch_window_ms = 1000".into(),
        ..Default::default()
    })
    .await;
    let decided = |log: String, sync: bool| {
        log.lines().any(|l| {
            l.contains("the standby's own connection to the primary streams")
                && l.contains(&format!("synchronous={sync}"))
        })
    };
    let relay = &env.relay;
    wait_until(
        "the standby's own connection streams",
        TIMEOUT,
        || async move { Ok(decided(relay.log_text(), false)) },
    )
    .await
    .unwrap();
    // The upstream reads synchronous_standby_names when a standby's own connection opens
    // (when the standby connects to the downstream).
    env.primary
        .execute("alter system set synchronous_standby_names = 'ANY 1 (other, \"STANDBY1\")'")
        .await
        .unwrap();
    env.primary
        .execute("select pg_reload_conf()")
        .await
        .unwrap();
    env.standby.restart().await.unwrap();
    env.wait_streaming_through_relay().await;
    wait_until(
        "the standby's own connection streams as synchronous",
        TIMEOUT,
        || async move { Ok(decided(relay.log_text(), true)) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", env.relay.log_text()));
    let primary = &env.primary;
    wait_until("the primary counts the standby in its quorum", TIMEOUT, || async move {
        let s = primary
            .query_one_string("select coalesce(string_agg(sync_state, ','), '') from pg_stat_replication where application_name = 'standby1'")
            .await?;
        Ok(s == "quorum")
    })
    .await
    .unwrap();
    // Commits wait for the standby through the relay and complete.
    pgbench(&env.primary, &["-i", "-s", "1", "-q", "postgres"]);
    pgbench(&env.primary, &["-c", "2", "-t", "50", "-n", "postgres"]);
    env.close_segment().await;
    env.wait_caught_up().await;
    assert!(env.assert_identical().await > 0);
}

async fn walsender_pid(primary: &walrelay_harness::cluster::Cluster) -> String {
    primary
        .query_one_string("select coalesce((select pid::text from pg_stat_replication where application_name = 'standby1'), 'gone')")
        .await
        .unwrap()
}
