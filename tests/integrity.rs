//! Bytes corrupted on the link are caught by the integrity checks and never reach a standby
//! (nor, toward the primary, the primary): the session ends, the standby resumes from its own
//! position, and what it wrote is still byte-identical to the primary's WAL.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use common::split::{Split, SplitOpts};
use common::*;
use std::time::Duration;
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
    // No batching window, so that small loads reach the link soon. The forwarder flips a
    // bit inside a DATA frame (a gRPC message): one in HTTP/2 housekeeping (a ping, a window
    // update) may change nothing that any check could see.
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

/// A bit flipped in the length of a gRPC message toward the upstream (here +2 MiB, under the
/// link's message limit) makes the upstream wait for bytes that never come: no check of the
/// relay's sees a thing, the HTTP/2 connection stays up, and the standby's feedback stops
/// reaching the primary. The downstream sends something at least every 5 s, so the upstream
/// ends a stream silent for 30 s; the downstream opens a new one and the feedback flows again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_feedback_stream_is_ended_and_opened_again() {
    stalled_stream(true).await;
}

/// The same toward the downstream: a message whose length grew by 2 MiB while the primary is
/// idle leaves the downstream waiting. The upstream sends something at least every 5 s, so
/// the downstream ends a stream silent for 30 s, opens a new one, and the standby streams
/// new WAL again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_wal_stream_is_ended_and_opened_again() {
    stalled_stream(false).await;
}

/// `upward`: flip the second length byte of a gRPC message toward the upstream, else of one
/// toward the downstream, on an idle stream.
async fn stalled_stream(upward: bool) {
    let env = env(EnvOpts {
        cuttable_link: true,
        ..Default::default()
    })
    .await;
    pgbench(&env.primary, &["-i", "-s", "1", "-q", "postgres"]);
    env.wait_caught_up().await;
    // Byte 2 of the next message's gRPC prefix: the second byte of its length.
    let proxy = env.cut.as_ref().unwrap();
    let silent = match upward {
        true => {
            proxy.corrupt_up_payload_byte_once_after(0, 2);
            "nothing from the downstream for 30 s"
        }
        false => {
            proxy.corrupt_down_payload_byte_once_after(0, 2);
            "nothing from the upstream for 30 s"
        }
    };
    wait_until("the flip", Duration::from_secs(30), || async {
        Ok(!proxy.corruption_pending())
    })
    .await
    .unwrap();
    let relay = &env.relay;
    wait_until("the stalled stream ended", TIMEOUT, || async move {
        Ok(relay.log_text().contains(silent))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}:\n{}", relay.log_text()));
    // The primary hears the standby again: its flush position there reaches new WAL.
    pgbench(&env.primary, &["-c", "2", "-t", "200", "postgres"]);
    let at = env
        .primary
        .query_one_string("select pg_current_wal_flush_lsn()::text")
        .await
        .unwrap();
    let q = format!(
        "select coalesce((select flush_lsn >= '{at}' from pg_stat_replication \
         where application_name = 'standby1'), false)::text"
    );
    let primary = &env.primary;
    wait_until("the standby's feedback at the primary", TIMEOUT, || async {
        Ok(primary.query_one_string(&q).await? == "true")
    })
    .await
    .unwrap();
    env.close_segment().await;
    env.wait_caught_up().await;
    assert!(
        env.assert_identical().await >= 1,
        "no complete segment to compare"
    );
    assert!(!env.relay.log_text().contains("panicked"));
}

/// A standby trusts that the WAL it has received ends at a record's end or at a page boundary:
/// its WAL reader takes the part of a record on the record's first page without waiting for
/// it. So walrelay must cut XLogData where PostgreSQL's walsender cuts them. Cut anywhere (as
/// it once was, every 128 KiB), a standby on a line slower than the primary's WAL read stale
/// bytes, failed a record's CRC ("incorrect resource manager data checksum") and restarted
/// its walreceiver again and again; the WAL still ended identical, so only the logs showed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_on_a_slow_line_never_reads_a_record_walrelay_cut() {
    let mut env = Split::new(SplitOpts::default()).await;
    // The standby's line carries 4 MB/s: walrelay has more to send than one XLogData holds,
    // and the standby replays each XLogData before the next one is in.
    let line = CutProxy::start(env.down_port).unwrap();
    let i = env.add_standby_at("slow", line.port);
    env.standbys[i].start().await.unwrap();
    wait_until("the standby streaming", Duration::from_secs(60), || async {
        Ok(env.standbys[i]
            .query_one_string("select coalesce((select status from pg_stat_wal_receiver), '')")
            .await?
            == "streaming")
    })
    .await
    .unwrap();
    env.wait_caught_up(i).await;
    let pid = || env.standbys[i].query_one_string("select pid::text from pg_stat_wal_receiver");
    let before = pid().await.unwrap();
    line.limit_from_target(4 << 20);
    // Multi-insert records of ~6.5 kB, most of them crossing a page boundary.
    pgbench(&env.primary, &["-i", "-s", "1", "-q", "postgres"]);
    env.wait_caught_up(i).await;
    let s = &env.standbys[i];
    let log = std::fs::read_to_string(s.log_path()).unwrap_or_default();
    assert!(
        !log.contains("incorrect resource manager data checksum"),
        "the standby read a record before walrelay had sent all of its first page:\n{}",
        s.log_tail(30)
    );
    assert_eq!(pid().await.unwrap(), before, "the walreceiver restarted");
    line.limit_from_target(0);
    env.assert_all_identical().await;
}
