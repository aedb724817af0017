//! The downstream's spool (issue #11) with real PostgreSQL and the real binary: a downstream
//! killed with -9 resumes from its spool and never serves a torn segment; a full spool drops
//! its oldest segments, a standby that needed them gets PostgreSQL's own error, the others
//! stream on, memory stays bounded.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use common::split::{pause, Split, SplitOpts};
use common::*;
use walrelay_harness::cluster::wait_until;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_downstream_resumes_from_its_spool_and_refetches_a_torn_segment() {
    let mut env = Split::new(SplitOpts::default()).await;
    env.add_standby("a");
    env.standbys[0].start().await.unwrap();
    env.wait_streaming(0).await;
    pgbench(&env.primary, &["-i", "-s", "3", "-q", "postgres"]);
    let load = pgbench_background(&env.primary, &["-c", "4", "-T", "10", "-n", "postgres"]);
    pause(4).await;
    env.downstream.kill();
    // A crash that left the segment being written shorter than what was synced: cut it below
    // the synced end recorded in spool.state (the writer may be far ahead of it under load,
    // so half the file's length could still cover everything synced).
    let synced = spool_end(&env.spool);
    let partial = env
        .spool
        .join(format!("{}.partial", segment_name(1, synced)));
    let need = synced % (16 << 20);
    assert!(
        need > 0 && partial.exists(),
        "the synced end {synced:X} should lie inside {}",
        partial.display()
    );
    std::fs::OpenOptions::new()
        .write(true)
        .open(&partial)
        .unwrap()
        .set_len(need / 2)
        .unwrap();
    env.downstream.restart();
    let _ = load.wait_with_output();
    let d = &env.downstream;
    wait_until(
        "the downstream discarded the torn segment",
        TIMEOUT,
        || async move { Ok(d.log_text().contains("discarding it, it is fetched again")) },
    )
    .await
    .unwrap();
    env.wait_streaming(0).await;
    for n in env.assert_all_identical().await {
        assert!(n >= 1);
    }
    // The spool's files are the primary's: every complete segment byte for byte.
    let end = spool_end(&env.spool);
    assert!(compare_segments(&env.primary.wal_dir(), &env.spool, &segment_name(1, end)) >= 1);
    env.downstream.assert_no_panic();
}

/// The synced end the spool's state file records (`end=X/Y`).
fn spool_end(spool: &std::path::Path) -> u64 {
    let state = std::fs::read_to_string(spool.join("spool.state")).unwrap();
    let end = state
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("end="))
        .unwrap_or_else(|| panic!("no end= in spool.state: {state}"));
    parse_lsn(end)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_spool_drops_its_oldest_segments() {
    let mut env = Split::new(SplitOpts {
        downstream_extra: "spool_bytes = 67108864".into(),
        ..Default::default()
    })
    .await;
    for name in ["running", "stopped"] {
        let i = env.add_standby(name);
        env.standbys[i].start().await.unwrap();
        env.wait_streaming(i).await;
    }
    pgbench(&env.primary, &["-i", "-s", "2", "-q", "postgres"]);
    env.wait_caught_up(1).await;
    env.standbys[1].stop().await.unwrap();
    // Well over the 64 MiB cap while the stopped standby is away.
    for _ in 0..6 {
        env.primary
            .execute("create table if not exists filler(x text); insert into filler select md5(g::text) from generate_series(1, 150000) g; select pg_switch_wal()")
            .await
            .unwrap();
    }
    env.wait_caught_up(0).await;
    let held = env.spool_bytes();
    assert!(
        held <= (64 << 20) + (16 << 20),
        "the spool holds {held} bytes over its cap"
    );
    let d = &env.downstream;
    assert!(d.log_text().contains("spool full"), "{}", d.log_text());
    // The stopped standby comes back to find its WAL gone: PostgreSQL's own error.
    env.standbys[1].start().await.unwrap();
    let s = &env.standbys[1];
    wait_until(
        "the returning standby hears its WAL is gone",
        TIMEOUT,
        || async move {
            let log = std::fs::read_to_string(s.log_path()).unwrap_or_default();
            Ok(log.contains("has already been removed"))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", env.standbys[1].log_tail(30)));
    // The other one streams on, and the downstream stayed small.
    pgbench(&env.primary, &["-c", "2", "-t", "200", "-n", "postgres"]);
    env.wait_caught_up(0).await;
    let rss = resident_bytes(&env.downstream);
    assert!(rss < 512 << 20, "the downstream uses {rss} bytes of memory");
}

/// Resident memory of a walrelay process, from /proc.
fn resident_bytes(r: &Relay) -> u64 {
    let pid = r.pid().expect("running");
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}
