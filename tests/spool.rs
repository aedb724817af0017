//! The downstream's spool (issue #11) with real PostgreSQL and the real binary: a downstream
//! killed with -9 resumes from its spool and never serves a torn segment; a full spool drops
//! its oldest segments, a standby that needed them gets PostgreSQL's own error, the others
//! stream on, memory stays bounded; a spool whose writes fail takes WAL again once they
//! succeed, with no restart.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use std::time::Duration;

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
        || async move {
            Ok(d.log_text()
                .contains("partial segment is discarded and its WAL fetched again: it is shorter"))
        },
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

/// A spool whose writes fail stops taking WAL, and takes it again once they succeed, with no
/// restart: here the writes go past the downstream's file size limit (EFBIG, where a full
/// disk gives ENOSPC; the process ignores SIGXFSZ as PostgreSQL does), which is then raised.
/// The spool is opened again from its files, fetches again what it had not synced, and the
/// standby catches up byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_whose_writes_failed_takes_wal_again_once_they_succeed() {
    const LIMIT: u64 = 4 << 20;
    let mut env = Split::new(SplitOpts::default()).await;
    env.add_standby("a");
    env.standbys[0].start().await.unwrap();
    env.wait_streaming(0).await;
    pgbench(&env.primary, &["-i", "-s", "1", "-q", "postgres"]);
    env.wait_caught_up(0).await;
    let pid = env.downstream.pid().expect("running");
    // The limit holds for the process's log file too: it must stay below it.
    assert!(env.downstream.log_text().len() < 1 << 20);
    let before = file_size_limit(pid, None);
    file_size_limit(pid, Some(LIMIT));
    // Over a segment of WAL: some of it lands past 4 MiB into a segment file.
    env.primary
        .execute("create table filler(x text); insert into filler select md5(g::text) from generate_series(1, 300000) g")
        .await
        .unwrap();
    let d = &env.downstream;
    let failed = wait_until("the spool fails", TIMEOUT, || async move {
        let log = d.log_text();
        Ok(log.contains("the spool failed") && log.contains("File too large"))
    })
    .await;
    file_size_limit(pid, Some(before));
    failed.unwrap_or_else(|e| panic!("{e}\n{}", env.downstream.log_text()));
    assert!(env.downstream.is_running(), "SIGXFSZ is ignored");
    let d = &env.downstream;
    wait_until("the spool is opened again", TIMEOUT, || async move {
        Ok(d.log_text()
            .contains("the spool was opened again after its failure"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", env.downstream.log_text()));
    env.primary
        .execute("insert into filler select md5(g::text) from generate_series(1, 1000) g")
        .await
        .unwrap();
    env.wait_caught_up(0).await;
    for n in env.assert_all_identical().await {
        assert!(n >= 1);
    }
    let end = spool_end(&env.spool);
    assert!(compare_segments(&env.primary.wal_dir(), &env.spool, &segment_name(1, end)) >= 1);
    env.downstream.assert_no_panic();
}

/// Sets the soft file size limit (RLIMIT_FSIZE) of process `pid` when `to` is given;
/// returns the one it had.
fn file_size_limit(pid: u32, to: Option<u64>) -> u64 {
    let pid = libc::pid_t::try_from(pid).unwrap();
    let mut old = libc::rlimit64 {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `old` is a valid rlimit64 the call writes; a null new limit only reads.
    let r = unsafe { libc::prlimit64(pid, libc::RLIMIT_FSIZE, std::ptr::null(), &mut old) };
    assert_eq!(r, 0, "prlimit: {}", std::io::Error::last_os_error());
    if let Some(cur) = to {
        let new = libc::rlimit64 {
            rlim_cur: cur,
            rlim_max: old.rlim_max,
        };
        // SAFETY: `new` is a valid rlimit64 the call only reads; no old limit is asked for.
        let r = unsafe { libc::prlimit64(pid, libc::RLIMIT_FSIZE, &new, std::ptr::null_mut()) };
        assert_eq!(r, 0, "prlimit: {}", std::io::Error::last_os_error());
    }
    old.rlim_cur
}

/// The synced end the spool's state file records (its newer whole slot, read as the
/// downstream reads it).
fn spool_end(spool: &std::path::Path) -> u64 {
    walrelay::spool::read_state(spool)
        .unwrap_or_else(|e| panic!("spool.state: {e}"))
        .expect("a spool.state")
        .end
        .0
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
    // Segments that went were kept and written over as new ones: those are still the
    // primary's bytes, and no more than two files wait for reuse.
    assert!(
        d.log_text().contains("its file kept to be written over"),
        "{}",
        d.log_text()
    );
    let end = spool_end(&env.spool);
    assert!(compare_segments(&env.primary.wal_dir(), &env.spool, &segment_name(1, end)) >= 1);
    let kept = std::fs::read_dir(&env.spool)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().starts_with("recycled.")
        })
        .count();
    assert!(kept <= 2, "{kept} files kept for reuse");
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

/// What the upstream makes of a record that begins right after a page header when it holds
/// that record back for its next message: a spool that ends just past the header. A standby
/// given exactly that stopped for good (PostgreSQL's WAL reader fails on it without a word,
/// and then stops every walreceiver it starts before it can write the rest); the downstream
/// now sends such a page only once more of it has come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_ending_just_past_a_page_header_keeps_its_standby_going() {
    page_header_end(None).await;
}

/// The same with PostgreSQL 17. (A PostgreSQL 18 standby given the same spool went on even
/// without the rule; 14 to 17 stopped.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_ending_just_past_a_page_header_keeps_a_pg17_standby_going() {
    page_header_end(Some(17)).await;
}

async fn page_header_end(major: Option<u32>) {
    let mut env = Split::new(SplitOpts {
        major,
        ..SplitOpts::default()
    })
    .await;
    let a = env.add_standby("a");
    pgbench(&env.primary, &["-i", "-s", "2", "-q", "postgres"]);
    env.wait_spool_caught_up().await;
    env.link.cut();
    env.downstream.terminate(Duration::from_secs(10));
    let page = cut_spool_after_a_page_header(&env.spool, env.root.path());
    env.downstream.restart();
    env.standbys[a].start().await.unwrap();
    let s = &env.standbys[a];
    wait_until(
        "the standby replayed up to the page",
        TIMEOUT,
        || async move {
            let at = s
                .query_one_string("select pg_last_wal_replay_lsn()::text")
                .await?;
            Ok(parse_lsn(&at) >= page)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", s.log_tail(30)));
    // Given only the page's header, the standby would fail here, at once.
    pause(3).await;
    env.link.restore();
    for n in env.assert_all_identical().await {
        assert!(n >= 1);
    }
    let log = std::fs::read_to_string(s.log_path()).unwrap();
    assert!(
        !log.contains("invalid record length"),
        "the standby read a record that was not there:\n{log}"
    );
    env.downstream.assert_no_panic();
}

/// Cuts the (stopped) downstream's spool back to end just past the header of its last page
/// that a record begins on (not a segment's first page); returns that page's start.
fn cut_spool_after_a_page_header(dir: &std::path::Path, root: &std::path::Path) -> u64 {
    use walrelay::spool::Spool;
    use walrelay_wal::lsn::Lsn;
    const PAGE: u64 = 8192;
    let old = Spool::open(dir, u64::MAX).unwrap();
    let (ext, seg) = (old.extent(), old.segment_size().bytes());
    let mut page = (ext.end.0 - 24) / PAGE * PAGE;
    let page = loop {
        assert!(
            page > ext.start.0,
            "no page with a record right after its header"
        );
        if page % seg != 0 {
            let h = old.read(ext.tli, Lsn(page), ext.end, 24).unwrap();
            let (magic, info) = (u16::from_le_bytes([h[0], h[1]]), h[2] & 1);
            // A WAL page (not the zeros after a segment switch), not continuing a record.
            if magic != 0 && info == 0 {
                break page;
            }
        }
        page -= PAGE;
    };
    let cut = root.join("spool-cut");
    let mut new = Spool::open(&cut, u64::MAX).unwrap();
    new.bind(old.system_id(), old.segment_size()).unwrap();
    let mut at = ext.start.0;
    while at < page + 24 {
        let bytes = old.read(ext.tli, Lsn(at), Lsn(page + 24), 1 << 20).unwrap();
        new.append(ext.tli, Lsn(at), &bytes).unwrap();
        at += bytes.len() as u64;
    }
    new.sync().unwrap();
    // The primary's parameters (and any history files) stay.
    for e in std::fs::read_dir(dir).unwrap() {
        let name = e.unwrap().file_name();
        let n = name.to_string_lossy();
        if !n.starts_with("0000000") && n != "spool.state" {
            std::fs::copy(dir.join(&name), cut.join(&name)).unwrap();
        }
    }
    drop((old, new));
    std::fs::remove_dir_all(dir).unwrap();
    std::fs::rename(&cut, dir).unwrap();
    page
}
