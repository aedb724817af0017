use super::*;

pub(super) const MIB: u64 = 1 << 20;

fn seg() -> WalSegSize {
    WalSegSize::new(MIB).unwrap()
}

/// Deterministic "WAL": byte i of the address space is a function of i.
pub(super) fn wal(from: u64, n: usize) -> Vec<u8> {
    (from..from + n as u64)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

pub(super) fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

pub(super) const T1: TimeLineId = TimeLineId(1);

/// Appends the WAL from `from` to `to` in 300 kB pieces.
pub(super) fn fill(s: &mut Spool, from: u64, to: u64) {
    let mut at = from;
    while at < to {
        let n = (to - at).min(300_000);
        s.append(T1, Lsn(at), &wal(at, n as usize)).unwrap();
        at += n;
    }
}

pub(super) fn open(dir: &Path, system: u64, cap: u64) -> Spool {
    let mut s = Spool::open(dir, cap).unwrap();
    s.bind(system, seg()).unwrap();
    s
}

#[test]
fn appends_across_segments_and_reads_back() {
    let d = tempfile::tempdir().unwrap();
    let mut s = open(d.path(), 42, 100 * MIB);
    assert!(s.is_empty());
    let start = 3 * MIB;
    // Any chunking: odd sizes crossing two segment boundaries.
    let mut at = start;
    for n in [1usize, 70_000, 1_000_000, 1_500_000, 3] {
        s.append(T1, Lsn(at), &wal(at, n)).unwrap();
        at += n as u64;
    }
    let e = s.extent();
    assert_eq!((e.start, e.end), (Lsn(start), Lsn(at)));
    assert_eq!(
        names(d.path()),
        [
            "000000010000000000000003",
            "000000010000000000000004",
            "000000010000000000000005.partial",
            "spool.state"
        ]
    );
    // Complete segments are the primary's bytes.
    assert_eq!(
        std::fs::read(d.path().join("000000010000000000000004")).unwrap(),
        wal(4 * MIB, MIB as usize)
    );
    let mut got = Vec::new();
    let mut pos = start;
    while pos < at {
        let b = s.read(T1, Lsn(pos), Lsn(at), 300_000).unwrap();
        assert!(!b.is_empty() && b.len() <= 300_000);
        pos += b.len() as u64;
        got.extend(b);
    }
    assert_eq!(got, wal(start, (at - start) as usize));
    assert!(s.read(T1, Lsn(at), Lsn(at), 10).unwrap().is_empty());
    assert!(
        matches!(s.read(T1, Lsn(MIB), Lsn(at), 10), Err(SpoolError::Removed(n)) if n == "000000010000000000000001")
    );
}

#[test]
fn reopens_where_it_was_synced() {
    let d = tempfile::tempdir().unwrap();
    let mut s = open(d.path(), 42, 100 * MIB);
    s.append(T1, Lsn(0), &wal(0, 1_200_000)).unwrap();
    assert_eq!(s.sync().unwrap(), Lsn(1_200_000));
    // Written but never synced: gone after a crash (the state says 1_200_000).
    s.append(T1, Lsn(1_200_000), &wal(1_200_000, 5000)).unwrap();
    drop(s);
    let mut s = open(d.path(), 42, 100 * MIB);
    assert_eq!(s.extent().end, Lsn(1_200_000));
    assert_eq!(
        std::fs::metadata(d.path().join("000000010000000000000001.partial"))
            .unwrap()
            .len(),
        1_200_000 - MIB
    );
    s.append(T1, Lsn(1_200_000), &wal(1_200_000, 900_000))
        .unwrap();
    s.sync().unwrap();
    let b = s
        .read(T1, Lsn(MIB), Lsn(2_100_000), 2 * MIB as usize)
        .unwrap();
    assert_eq!(b, wal(MIB, MIB as usize));
    // Another cluster's spool is refused.
    drop(s);
    let mut other = Spool::open(d.path(), 100 * MIB).unwrap();
    assert!(matches!(
        other.bind(43, seg()),
        Err(SpoolError::OtherCluster(_))
    ));
    assert!(matches!(
        other.bind(42, WalSegSize::DEFAULT),
        Err(SpoolError::OtherCluster(_))
    ));
    other.bind(42, seg()).unwrap();
}

#[test]
fn a_torn_or_damaged_partial_segment_is_discarded_and_fetched_again() {
    for damage in ["truncate", "flip", "remove"] {
        let d = tempfile::tempdir().unwrap();
        let mut s = open(d.path(), 42, 100 * MIB);
        s.append(T1, Lsn(0), &wal(0, 1_500_000)).unwrap();
        s.sync().unwrap();
        drop(s);
        let p = d.path().join("000000010000000000000001.partial");
        let mut b = std::fs::read(&p).unwrap();
        match damage {
            "truncate" => std::fs::write(&p, &b[..b.len() - 100]).unwrap(),
            "flip" => {
                *b.last_mut().unwrap() ^= 1;
                std::fs::write(&p, &b).unwrap();
            }
            _ => std::fs::remove_file(&p).unwrap(),
        }
        let mut s = open(d.path(), 42, 100 * MIB);
        assert_eq!(
            s.extent().end,
            Lsn(MIB),
            "{damage}: back to the segment start"
        );
        assert!(!p.exists(), "{damage}");
        assert!(s.read(T1, Lsn(MIB), s.extent().end, 10).unwrap().is_empty());
        s.append(T1, Lsn(MIB), &wal(MIB, 600_000)).unwrap();
        assert_eq!(
            s.read(T1, Lsn(MIB), Lsn(MIB + 600_000), MIB as usize)
                .unwrap(),
            wal(MIB, 600_000)
        );
    }
}

#[test]
fn gaps_and_unaligned_starts_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let mut s = open(d.path(), 42, 100 * MIB);
    assert!(matches!(
        s.append(T1, Lsn(100), b"x"),
        Err(SpoolError::Gap { .. })
    ));
    s.append(T1, Lsn(0), b"abc").unwrap();
    assert!(matches!(
        s.append(T1, Lsn(4), b"x"),
        Err(SpoolError::Gap { .. })
    ));
    assert!(matches!(
        s.append(TimeLineId(2), Lsn(3), b"x"),
        Err(SpoolError::Gap { .. })
    ));
    // An empty spool's first WAL at the last segment of the WAL space, running past its end:
    // refused, not wrapped to position 0 (a debug build panicked).
    let d = tempfile::tempdir().unwrap();
    let mut s = open(d.path(), 42, 100 * MIB);
    let last = Lsn(u64::MAX - (MIB - 1));
    let past = vec![0u8; MIB as usize + 1];
    assert!(matches!(
        s.append(T1, last, &past),
        Err(SpoolError::Invalid(..))
    ));
}

#[test]
fn the_oldest_segments_go_when_the_spool_is_full() {
    let d = tempfile::tempdir().unwrap();
    let mut s = open(d.path(), 42, 2 * MIB);
    s.append(T1, Lsn(0), &wal(0, (5 * MIB + 10) as usize))
        .unwrap();
    assert_eq!(
        names(d.path()),
        [
            "000000010000000000000003",
            "000000010000000000000004",
            "000000010000000000000005.partial",
            "spool.state"
        ]
    );
    assert_eq!(s.extent().start, Lsn(3 * MIB));
    let e = s.read(T1, Lsn(10), Lsn(5 * MIB), 10).unwrap_err();
    assert_eq!(
        e.to_string(),
        "requested WAL segment 000000010000000000000000 has already been removed"
    );
}

/// After a switch inside a segment, the old timeline's partial segment goes when it is the
/// oldest, like a complete one, and the spool's start follows.
#[test]
fn an_old_timelines_partial_segment_goes_when_the_spool_is_full() {
    let d = tempfile::tempdir().unwrap();
    let mut s = open(d.path(), 42, 2 * MIB);
    s.append(T1, Lsn(MIB), &wal(MIB, 1000)).unwrap();
    let sp = MIB + 1000;
    let history = format!("1\t0/{sp:X}\tno recovery target specified\n");
    s.switch_timeline(TimeLineId(2), history.as_bytes())
        .unwrap();
    s.append(TimeLineId(2), Lsn(sp), &wal(sp, (5 * MIB) as usize))
        .unwrap();
    let left = names(d.path());
    assert!(
        !left.iter().any(|n| n.starts_with("00000001")),
        "timeline 1's partial segment stayed: {left:?}"
    );
    assert!(s.extent().start >= Lsn(3 * MIB), "{}", s.extent().start);
}

#[test]
fn a_timeline_switch_starts_the_new_timeline_with_the_old_bytes() {
    let d = tempfile::tempdir().unwrap();
    let mut s = open(d.path(), 42, 100 * MIB);
    // The old timeline ran past the switchpoint (1 MiB + 1000) before the promotion elsewhere.
    s.append(T1, Lsn(0), &wal(0, (MIB + 5000) as usize))
        .unwrap();
    let sp = MIB + 1000;
    let history = format!("1\t0/{sp:X}\tno recovery target specified\n");
    assert!(matches!(
        s.switch_timeline(TimeLineId(2), b"1\t0/9000000\tx\n"),
        Err(SpoolError::Gap { .. })
    ));
    s.switch_timeline(TimeLineId(2), history.as_bytes())
        .unwrap();
    assert_eq!(s.extent().tli, TimeLineId(2));
    assert_eq!(s.extent().end, Lsn(sp));
    assert_eq!(s.history(TimeLineId(2)).unwrap(), history.as_bytes());
    let new_wal: Vec<u8> = wal(sp, 4000).iter().map(|b| b ^ 0x55).collect();
    s.append(TimeLineId(2), Lsn(sp), &new_wal).unwrap();
    let f2 = std::fs::read(d.path().join("000000020000000000000001.partial")).unwrap();
    assert_eq!(&f2[..1000], &wal(MIB, 1000)[..]);
    assert_eq!(&f2[1000..], &new_wal[..]);
    // The old timeline's file keeps what it had, past the switchpoint too.
    let f1 = std::fs::read(d.path().join("000000010000000000000001.partial")).unwrap();
    assert_eq!(f1, wal(MIB, 5000));
    // Reads follow the timeline asked for, up to the limit given.
    assert_eq!(
        s.read(T1, Lsn(MIB), Lsn(sp), 10_000).unwrap(),
        wal(MIB, 1000)
    );
    assert_eq!(
        s.read(TimeLineId(2), Lsn(sp), Lsn(sp + 4000), 10_000)
            .unwrap(),
        new_wal
    );
    s.sync().unwrap();
    drop(s);
    let s = open(d.path(), 42, 100 * MIB);
    assert_eq!(
        (s.extent().tli, s.extent().end),
        (TimeLineId(2), Lsn(sp + 4000))
    );
}

/// Deferred durability: a filled segment waits as `.partial` for its job, standbys read it
/// meanwhile, the durable end moves only when a job's state is written, and a crash with jobs
/// pending reopens at the last durable end.
#[test]
fn deferred_durability_completes_segments_in_jobs_and_survives_a_crash() {
    let d = tempfile::tempdir().unwrap();
    let mut s = open(d.path(), 42, 100 * MIB);
    s.set_deferred(true);
    s.append(T1, Lsn(MIB), &wal(MIB, 300_000)).unwrap();
    let sync = s.sync_job().unwrap().expect("WAL not yet durable");
    assert!(s.take_filled().is_empty());
    // The segment fills and the next begins: both .partial until the filled job is done.
    let end = 2 * MIB + 5000;
    s.append(
        T1,
        Lsn(MIB + 300_000),
        &wal(MIB + 300_000, (end - MIB - 300_000) as usize),
    )
    .unwrap();
    let filled = s.take_filled();
    assert_eq!(filled.len(), 1);
    assert!(names(d.path()).contains(&"000000010000000000000001.partial".to_string()));
    assert!(names(d.path()).contains(&"000000010000000000000002.partial".to_string()));
    assert_eq!(s.read(T1, Lsn(MIB), Lsn(end), 10).unwrap(), wal(MIB, 10));
    assert_eq!(s.extent().durable, Lsn(0));
    let done = |s: &mut Spool, job: Durability| {
        let filled = !job.is_data();
        let (tli, at) = job.perform(d.path(), seg()).unwrap();
        let st = s.state_at(tli, at).unwrap().expect("a newer durable end");
        s.state_file().write(&st).unwrap();
        s.made_durable(tli, at, filled).unwrap();
    };
    done(&mut s, sync);
    assert_eq!(s.extent().durable, Lsn(MIB + 300_000));
    // A sync job for WAL of the filled segment only is already covered by it.
    let second = s.sync_job().unwrap().expect("the new segment's WAL");
    for job in filled {
        done(&mut s, job);
    }
    assert_eq!(s.extent().durable, Lsn(2 * MIB));
    assert_eq!(
        std::fs::read(d.path().join("000000010000000000000001")).unwrap(),
        wal(MIB, MIB as usize)
    );
    // Crash now, the second sync never done: reopens at the segment's end; the bytes of
    // the next segment are fetched again.
    drop(second);
    drop(s);
    let s = Spool::open(d.path(), 100 * MIB).unwrap();
    assert_eq!(s.extent().end, Lsn(2 * MIB));
    // A stale job (older than the durable end) changes nothing.
    let mut s = s;
    s.append(T1, Lsn(2 * MIB), &wal(2 * MIB, 100)).unwrap();
    assert!(s.state_at(T1, Lsn(2 * MIB)).unwrap().is_none());
    assert!(s
        .state_at(TimeLineId(2), Lsn(2 * MIB + 50))
        .unwrap()
        .is_none());
}

/// The newest WAL is read from memory: with its file gone behind the spool's back, a read of it
/// still succeeds, while an older one (past the ring) goes to the files and fails.
#[test]
fn the_newest_wal_is_served_from_memory() {
    let d = tempfile::tempdir().unwrap();
    let mut s = open(d.path(), 42, 100 * MIB);
    let total = RECENT_BYTES as u64 + 3 * MIB + 17;
    fill(&mut s, 0, total);
    for (_, path) in files::segments(d.path(), seg()).unwrap() {
        std::fs::remove_file(path).unwrap();
    }
    let files = s.files();
    let from = total - RECENT_BYTES as u64;
    // Up to the end of `from`'s segment, and within the last one.
    let first = files.read(T1, Lsn(from), Lsn(total), usize::MAX).unwrap();
    assert_eq!(first, wal(from, (MIB - from % MIB) as usize));
    assert_eq!(
        files.read_recent(T1, Lsn(total - 5), Lsn(total), 128 * 1024),
        Some(wal(total - 5, 5))
    );
    assert_eq!(files.read_recent(T1, Lsn(from - 1), Lsn(total), 1), None);
    assert!(matches!(
        files.read(T1, Lsn(from - 1), Lsn(total), 1),
        Err(SpoolError::Removed(_))
    ));
}

/// A sync whose `spool.state` cannot be written (a full disk) leaves the durable end where
/// the state file says it is: the upstream lets the primary's slot advance to that end, and
/// a reopened spool starts from the state file, so an end moved before the file was written
/// would have the primary drop WAL the reopened spool still needs.
#[test]
fn a_sync_that_cannot_write_its_state_moves_no_durable_end() {
    let d = tempfile::tempdir().unwrap();
    let mut s = open(d.path(), 42, 100 * MIB);
    s.append(T1, Lsn(0), &wal(0, 1_200_000)).unwrap();
    assert_eq!(s.sync().unwrap(), Lsn(1_200_000));
    s.append(T1, Lsn(1_200_000), &wal(1_200_000, 5000)).unwrap();
    // The state's temporary file cannot be created, as on a full disk. A writer replaces the
    // file whole (through that file) the first time, in place after that; a new one, as a
    // restarted process has, writes it whole next.
    s.state_file = Arc::new(StateFile::new(d.path()));
    std::fs::create_dir(d.path().join("spool.state.tmp")).unwrap();
    assert!(s.sync().is_err());
    assert_eq!(
        s.extent().durable,
        Lsn(1_200_000),
        "not what spool.state says"
    );
    // A timeline switch syncs first: the same.
    let history = b"1\t0/100000\tno recovery target specified\n";
    assert!(s.switch_timeline(TimeLineId(2), history).is_err());
    assert_eq!((s.extent().tli, s.extent().durable), (T1, Lsn(1_200_000)));
    // What the state file says is what a reopened spool holds.
    std::fs::remove_dir(d.path().join("spool.state.tmp")).unwrap();
    drop(s);
    let s = open(d.path(), 42, 100 * MIB);
    assert_eq!(s.extent().end, Lsn(1_200_000));
}

/// A spool in `dir` whose segment 1 was completed (fsynced, renamed) after its last
/// `spool.state`, which still ends at 1_500_000: a crash between the rename and the state.
fn completed_after_the_state(dir: &Path) {
    let mut s = open(dir, 42, 100 * MIB);
    s.append(T1, Lsn(0), &wal(0, 1_500_000)).unwrap();
    s.sync().unwrap();
    let state = std::fs::read(dir.join("spool.state")).unwrap();
    let rest = (2 * MIB - 1_500_000) as usize;
    s.append(T1, Lsn(1_500_000), &wal(1_500_000, rest)).unwrap();
    drop(s);
    std::fs::write(dir.join("spool.state"), state).unwrap();
    assert!(dir.join("000000010000000000000001").exists());
}

#[test]
fn a_segment_completed_after_the_last_state_is_kept() {
    let d = tempfile::tempdir().unwrap();
    completed_after_the_state(d.path());
    let mut s = open(d.path(), 42, 100 * MIB);
    assert_eq!(s.extent().end, Lsn(2 * MIB), "the whole segment is kept");
    assert_eq!(
        s.read(T1, Lsn(MIB), Lsn(2 * MIB), MIB as usize).unwrap(),
        wal(MIB, MIB as usize)
    );
    s.append(T1, Lsn(2 * MIB), &wal(2 * MIB, 1000)).unwrap();
    s.sync().unwrap();
    drop(s);
    let s = open(d.path(), 42, 100 * MIB);
    assert_eq!(s.extent().end, Lsn(2 * MIB + 1000));

    // A completed segment whose bytes before the state's end differ is still discarded.
    let d = tempfile::tempdir().unwrap();
    completed_after_the_state(d.path());
    let p = d.path().join("000000010000000000000001");
    let mut b = std::fs::read(&p).unwrap();
    b[(1_500_000 - MIB - 1) as usize] ^= 1;
    std::fs::write(&p, &b).unwrap();
    let s = open(d.path(), 42, 100 * MIB);
    assert_eq!(s.extent().end, Lsn(MIB), "back to the segment's start");
}
