//! Bytes corrupted on the link are caught by the integrity checks and never reach a standby
//! (nor, toward the primary, the primary): the session ends, the standby resumes from its own
//! position, and what it wrote is still byte-identical to the primary's WAL.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use common::*;
use walrelay_harness::cluster::wait_until;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_link_bytes_never_reach_the_standby() {
    corrupted_link(false).await;
}

/// The same toward the upstream: the standby's feedback and commands are checked before
/// anything reaches the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_feedback_never_reaches_the_primary() {
    corrupted_link(true).await;
}

/// `upward`: flip a byte of the downstream → upstream direction, else of the other one.
async fn corrupted_link(upward: bool) {
    // No batching window: the link then carries mostly frames (WAL, feedback), few bytes of
    // HTTP/2 housekeeping (pings, window updates) where a flipped bit may go unnoticed
    // because it changes nothing.
    let env = env(EnvOpts {
        cuttable_link: true,
        link_extra: "batch_window_ms = 0".into(),
        ..Default::default()
    })
    .await;
    pgbench(&env.primary, &["-i", "-s", "2", "-q", "postgres"]);
    env.wait_caught_up().await;
    let proxy = env.cut.as_ref().unwrap();
    // Flip a byte well inside the WAL the next load produces, or inside the feedback the
    // standby sends about it.
    if upward {
        proxy.corrupt_up_once_after(3_000);
    } else {
        proxy.corrupt_once_after(300_000);
    }
    // The codec shrinks pgbench WAL 20-30x, so how long it takes to get 300 kB onto the link
    // depends on the machine: load in rounds until the byte has been flipped.
    for _ in 0..10 {
        pgbench(&env.primary, &["-c", "2", "-T", "3", "postgres"]);
        if !proxy.corruption_pending() {
            break;
        }
    }
    assert!(
        !proxy.corruption_pending(),
        "30 s of load did not push enough bytes through the link to corrupt one"
    );
    env.close_segment().await;
    env.wait_caught_up().await;

    // The corrupted byte was noticed (by the integrity checks of WAL, WAL headers and the
    // primary's other messages, or by the link's framing).
    let relay = &env.relay;
    wait_until("the relay reports the corruption", TIMEOUT, || async move {
        let log = relay.log_text();
        Ok(log.contains("failed verification") || log.contains("link to the upstream lost"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: the corruption went unnoticed:\n{}", relay.log_text()));
    let relay_log = env.relay.log_text();
    // Nothing corrupted reached the primary (it would have ended the connection).
    assert!(
        !relay_log.contains("the primary closed the replication connection"),
        "{relay_log}"
    );
    let s = &env.standby;
    wait_until("standby streaming again", TIMEOUT, || async move {
        Ok(
            s.query_one_string("select coalesce((select status from pg_stat_wal_receiver), '')")
                .await?
                == "streaming",
        )
    })
    .await
    .unwrap();
    let n = env.assert_identical().await;
    assert!(n >= 1, "no complete segment to compare");
    assert!(!relay_log.contains("panicked"));
}
