//! The spool writer's threads and inline path, on a spool in a temporary directory.

use super::*;

const MIB: u64 = 1 << 20;
const T1: TimeLineId = TimeLineId(1);

fn wal(from: u64, n: usize) -> Vec<u8> {
    (from..from + n as u64)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

/// The append of the next `n` bytes at `*at`, and the end it leaves.
fn append(at: &mut u64, n: usize) -> (Op, u64) {
    let op = Op::Append {
        tli: T1,
        start: Lsn(*at),
        bytes: wal(*at, n),
    };
    *at += n as u64;
    (op, *at)
}

/// A writer of a spool in `d`, bound to system 7 with 1 MiB segments, and its view.
fn bound(d: &std::path::Path) -> (SpoolWriter, watch::Receiver<SpoolView>) {
    let spool = Spool::open(d, 100 * MIB).unwrap();
    let (w, view) = start(spool, Metrics::new()).unwrap();
    let seg = WalSegSize::new(MIB).unwrap();
    w.send_now(Op::Bind { system_id: 7, seg }).unwrap();
    (w, view)
}

async fn until(view: &mut watch::Receiver<SpoolView>, f: impl Fn(&SpoolView) -> bool) {
    tokio::time::timeout(Duration::from_secs(5), view.wait_for(|v| f(v)))
        .await
        .expect("the spool's view within 5 s")
        .expect("the writer publishes");
}

/// Ops queued behind a busy writer (here: its lock held, as during a slow write) are
/// applied before `settled` returns, so the spool's end a new stream states is final.
#[tokio::test]
async fn settled_waits_for_the_ops_in_flight() {
    let d = tempfile::tempdir().unwrap();
    let (w, mut view) = bound(d.path());
    let mut at = MIB;
    let (op, end) = append(&mut at, 100);
    w.send(op).unwrap();
    until(&mut view, |v| v.extent.end == Lsn(end)).await;
    let (held_tx, held) = std_mpsc::channel();
    let writing = w.writing.clone();
    let release = std::thread::spawn(move || {
        let _busy = lock(&writing);
        held_tx.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
    });
    held.recv().unwrap();
    for _ in 0..5 {
        let (op, _) = append(&mut at, 100_000);
        w.send(op).unwrap();
    }
    assert_eq!(view.borrow().extent.end, Lsn(end), "still queued");
    // Not within 50 ms (the writer is held for 300): not settled, so no stream may start.
    assert!(!w.settled(&mut view, Duration::from_millis(50)).await);
    assert!(w.settled(&mut view, Duration::from_secs(10)).await);
    assert_eq!(view.borrow().extent.end, Lsn(at), "all applied");
    release.join().unwrap();
}

/// A stream's decode stage that outlived its stream (its writer was stuck) still applies
/// the frames it holds, with nothing in flight between two of them: `settled` waits for it
/// to be gone, so the spool's end a new stream states is final.
#[tokio::test]
async fn settled_waits_for_a_decode_stage_still_applying() {
    let d = tempfile::tempdir().unwrap();
    let (w, mut view) = bound(d.path());
    let w = Arc::new(w);
    let mut at = MIB;
    let (op, end) = append(&mut at, 100);
    let stage = w.producer();
    w.send(op).unwrap();
    until(&mut view, |v| v.extent.end == Lsn(end)).await;
    // The stage restores its next frame (300 ms), applies it, and stops.
    let (op, last) = append(&mut at, 100_000);
    let writer = w.clone();
    let stage = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        writer.send(op).unwrap();
        drop(stage);
    });
    assert!(!w.settled(&mut view, Duration::from_millis(50)).await);
    assert!(w.settled(&mut view, Duration::from_secs(10)).await);
    assert_eq!(
        view.borrow().extent.end,
        Lsn(last),
        "the stage's last frame applied"
    );
    stage.join().unwrap();
}

/// A bound, deferred spool in `dir` with the writer's state, run by the test (no threads).
fn writing(dir: &std::path::Path) -> (Writing, watch::Receiver<SpoolView>, watch::Receiver<Lsn>) {
    let mut spool = Spool::open(dir, 100 * MIB).unwrap();
    spool.set_deferred(true);
    spool.bind(7, WalSegSize::new(MIB).unwrap()).unwrap();
    let (publish, view, durable) = Publish::new(&spool, Metrics::new());
    (Writing::new(spool, publish), view, durable)
}

/// A sync falls due on the append that fills a segment exactly: the filled segment's job
/// has that WAL, and no periodic sync is left pending (none could follow it).
#[test]
fn a_sync_due_at_a_filled_segment_leaves_none_pending() {
    let d = tempfile::tempdir().unwrap();
    let (mut w, _view, _durable) = writing(d.path());
    let long_ago = || Some(Instant::now() - 2 * SYNC_EVERY);
    let mut at = MIB;
    let (op, _) = append(&mut at, 1000);
    assert!(w.op(Some(op), true).unwrap().is_empty(), "not due yet");
    w.dirty_since = long_ago();
    let (op, _) = append(&mut at, (MIB - 1000) as usize);
    let jobs = w.op(Some(op), true).unwrap();
    assert!(matches!(jobs[..], [Durability::Filled { .. }]));
    assert!(!w.sync_pending && w.dirty_since.is_none());
    let (op, end) = append(&mut at, 10);
    w.op(Some(op), true).unwrap();
    w.dirty_since = long_ago();
    let jobs = w.op(None, true).unwrap();
    assert!(matches!(jobs[..], [Durability::Data { end: e, .. }] if e == Lsn(end)));
    assert!(w.sync_pending);
    w.dirty_since = long_ago();
    assert!(
        w.op(None, true).unwrap().is_empty(),
        "one periodic sync at a time"
    );
}

/// The durable end's receiver (the stream's send loop) changes only when the durable end
/// moves; the view changes at every append.
#[test]
fn the_durable_end_is_published_only_when_it_moves() {
    let d = tempfile::tempdir().unwrap();
    let (mut w, mut view, mut durable) = writing(d.path());
    let mut at = MIB;
    for _ in 0..3 {
        let (op, end) = append(&mut at, 1000);
        w.op(Some(op), false).unwrap();
        w.published();
        assert!(view.has_changed().unwrap(), "the view shows each append");
        assert_eq!(view.borrow_and_update().extent.end, Lsn(end));
        assert!(!durable.has_changed().unwrap(), "nothing more is durable");
    }
    w.spool.sync().unwrap();
    w.published();
    assert!(durable.has_changed().unwrap());
    assert_eq!(*durable.borrow_and_update(), Lsn(at));
    w.published();
    assert!(
        !durable.has_changed().unwrap(),
        "published again, not moved"
    );
}

/// Small appends are published by `send` itself (in order with the thread's work), the
/// thread still syncs them, and appends that complete a segment go to the thread.
#[tokio::test]
async fn small_appends_are_inline_and_still_synced_and_in_order() {
    let d = tempfile::tempdir().unwrap();
    let (w, mut view) = bound(d.path());
    let mut at = MIB;
    // An empty spool's first append and a large one: the thread's.
    for n in [100, 200_000] {
        let (op, end) = append(&mut at, n);
        w.send(op).unwrap();
        until(&mut view, |v| v.extent.end == Lsn(end)).await;
    }
    // Small ones: visible as soon as `send` returns, each of them.
    for n in [1, 5000, INLINE_MAX] {
        for _ in 0..20 {
            let (op, end) = append(&mut at, n);
            w.send(op).unwrap();
            assert_eq!(view.borrow().extent.end, Lsn(end), "{n} bytes");
        }
    }
    assert!(view.borrow().extent.durable < Lsn(at));
    // Not synced inline, but by the nudged thread within SYNC_EVERY (it would otherwise
    // sleep for an hour).
    let end = at;
    until(&mut view, |v| v.extent.durable == Lsn(end)).await;
    // Also the first write after a sync, when the thread had no deadline.
    let (op, end) = append(&mut at, 10);
    w.send(op).unwrap();
    assert_eq!(view.borrow().extent.end, Lsn(end));
    until(&mut view, |v| v.extent.durable == Lsn(end)).await;
    // A large append queued, then small ones right behind it: they wait their turn.
    let (big, _) = append(&mut at, 100_000);
    w.send(big).unwrap();
    for _ in 0..10 {
        let (op, _) = append(&mut at, 1000);
        w.send(op).unwrap();
    }
    // Up to 10 bytes before the segment's end, then an append completing it: the thread
    // syncs and renames the segment.
    let rest = usize::try_from((2 * MIB).checked_sub(at).unwrap()).unwrap();
    let (op, _) = append(&mut at, rest - 10);
    w.send(op).unwrap();
    let (op, end) = append(&mut at, 100);
    w.send(op).unwrap();
    until(&mut view, |v| {
        v.extent.end == Lsn(end) && v.extent.durable >= Lsn(2 * MIB)
    })
    .await;
    let seg1 = std::fs::read(d.path().join("000000010000000000000001")).unwrap();
    assert!(
        seg1 == wal(MIB, MIB as usize),
        "the segment holds the WAL in order"
    );
    assert_eq!(view.borrow().failed, None);
}

/// A failed spool refuses ops, is opened again only once it has waited, then takes WAL from
/// its durable end, with the failure cleared from the view and the health gauge.
#[tokio::test]
async fn a_failed_spool_is_opened_again_and_takes_wal_from_its_durable_end() {
    let d = tempfile::tempdir().unwrap();
    let spool = Spool::open(d.path(), 100 * MIB).unwrap();
    let metrics = Metrics::new();
    let (w, mut view) = start(spool, metrics.clone()).unwrap();
    let seg = WalSegSize::new(MIB).unwrap();
    w.send_now(Op::Bind { system_id: 7, seg }).unwrap();
    let mut at = MIB;
    let (op, end) = append(&mut at, 5000);
    w.send(op).unwrap();
    until(&mut view, |v| v.extent.durable == Lsn(end)).await;
    // WAL that does not continue the spool: it fails (as a write error would).
    let mut skip = at + 100;
    let (op, _) = append(&mut skip, 100);
    assert!(w.send(op).is_err(), "written inline, and failed");
    until(&mut view, |v| v.failed.is_some()).await;
    assert!(metrics.ops.spool.failure().is_some());
    let (op, _) = append(&mut at.clone(), 100);
    assert!(w.send(op).is_err(), "a failed spool refuses ops");
    // Not before REOPEN_AFTER.
    let fail = w
        .reopen(&mut view, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(fail.contains("does not continue"), "{fail}");
    assert!(view.borrow().failed.is_some());
    // As if it had waited.
    lock(&w.writing).failed = Some(Instant::now() - REOPEN_AFTER);
    w.reopen(&mut view, Duration::from_secs(5)).await.unwrap();
    let v = view.borrow().clone();
    assert_eq!(
        (v.failed, v.extent.end, v.extent.durable),
        (None, Lsn(end), Lsn(end))
    );
    assert_eq!(metrics.ops.spool.failure(), None);
    // WAL from there on is taken, and made durable.
    let (op, end) = append(&mut at, 300);
    w.send(op).unwrap();
    until(&mut view, |v| v.extent.durable == Lsn(end)).await;
    let partial = std::fs::read(d.path().join("000000010000000000000001.partial")).unwrap();
    assert!(partial[..(end - MIB) as usize] == wal(MIB, (end - MIB) as usize)[..]);
    // A spool that did not fail is left as it is.
    w.reopen(&mut view, Duration::from_secs(5)).await.unwrap();
    assert_eq!(view.borrow().extent.end, Lsn(end));
}

/// The final sync at shutdown: what is written is durable when `sync_now` returns, not a
/// sync period later (the durable end moves only once `spool.state` says so), so a restart
/// resumes from all of it.
#[tokio::test]
async fn sync_now_makes_what_is_written_durable_at_once() {
    let d = tempfile::tempdir().unwrap();
    let (w, mut view) = bound(d.path());
    let mut at = MIB;
    for n in [100, 5_000, 300_000] {
        let (op, end) = append(&mut at, n);
        w.send(op).unwrap();
        assert!(w.sync_now(&mut view, Duration::from_secs(5)).await);
        assert_eq!(view.borrow().extent.durable, Lsn(end), "after {n} bytes");
    }
}
