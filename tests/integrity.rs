//! Bytes corrupted on the link are caught by the integrity check and never reach a standby:
//! the session ends, the standby resumes from its own position, and what it wrote is still
//! byte-identical to the primary's WAL.

mod common;

use common::*;
use walrelay::cluster::wait_until;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_link_bytes_never_reach_the_standby() {
    let env = env(EnvOpts {
        cuttable_link: true,
        ..Default::default()
    })
    .await;
    pgbench(&env.primary, &["-i", "-s", "2", "-q", "postgres"]);
    env.wait_caught_up().await;
    let proxy = env.cut.as_ref().unwrap();
    // Flip a byte well inside the WAL the next load produces.
    proxy.corrupt_once_after(300_000);
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
    env.primary.execute("select pg_switch_wal()").await.unwrap();
    env.primary
        .execute("create table after_corruption as select 1 as x")
        .await
        .unwrap();
    env.wait_caught_up().await;

    // The corrupted byte was noticed (by the integrity check, or by the link's framing).
    let relay_log = env.relay.log_text();
    assert!(
        relay_log.contains("failed verification")
            || relay_log.contains("link to the upstream lost"),
        "the corruption went unnoticed:\n{relay_log}"
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
