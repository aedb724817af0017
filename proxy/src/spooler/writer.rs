//! The spool's writer thread: the owner of the [`Spool`], so that file I/O never runs on the
//! async runtime. It applies verified WAL and timeline switches in order, publishes the
//! spool's extent for the standbys' sessions after each, and has the sync thread
//! ([`super::syncer`]) make it durable at most [`SYNC_EVERY`] after the first unsynced write
//! and whenever a segment fills, without waiting for it; the sync thread publishes the durable
//! end for the stream (which tells the upstream, so the primary's slot advances).
//!
//! A small append (≤ [`INLINE_MAX`] bytes) that stays inside the current segment and finds the
//! writer idle is written by its sender (the stream's decode stage, [`super::decode`]) itself,
//! under the same lock, and published at once: a synchronous commit then waits for no thread
//! to wake up. It never syncs; the thread is nudged to sync it within [`SYNC_EVERY`], as it
//! would a write of its own. Order is kept as in the decode stage: one producer, and "idle"
//! means no op handed to the thread is still unapplied. The lock is never held across an
//! fsync (those are the sync thread's, outside it, except the final sync and a timeline
//! switch, which no inline append meets: they are ops in flight), so the sender may wait for
//! it.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use walrelay_wal::lsn::{Lsn, TimeLineId};
use walrelay_wal::segment::WalSegSize;

use super::lock;
use super::syncer::Syncer;
pub use super::writing::SpoolView;
use super::writing::{Publish, Writing};
use crate::metrics::{timed_wall, Metrics};
use crate::spool::{Durability, Spool, SpoolError};

/// Longest WAL stays written but not synced.
pub const SYNC_EVERY: Duration = Duration::from_millis(100);

/// What the stream asks of the spool, in order.
#[derive(Debug)]
pub enum Op {
    /// The primary's identity, from each Welcome (a new spool takes it).
    Bind {
        system_id: u64,
        seg: WalSegSize,
    },
    Append {
        tli: TimeLineId,
        start: Lsn,
        bytes: Vec<u8>,
    },
    Switch {
        tli: TimeLineId,
        history: Vec<u8>,
    },
    /// The history file of the timeline an empty spool starts on.
    History {
        tli: TimeLineId,
        history: Vec<u8>,
    },
}

/// Largest append the stream writes itself when the writer is idle.
pub const INLINE_MAX: usize = 16 * 1024;

/// Ops the thread's queue holds.
const QUEUE: usize = 64;

/// The stream's handle on the spool's writer.
pub struct SpoolWriter {
    /// Ops for the thread; `None` only wakes it (an inline write made the spool dirty).
    ops: std_mpsc::SyncSender<Option<Op>>,
    writing: Arc<Mutex<Writing>>,
    /// Ops handed to the thread and not yet applied.
    in_flight: Arc<AtomicUsize>,
    /// The spool's durable end, changed only when it moves.
    durable: watch::Receiver<Lsn>,
}

/// The writer thread stopped (the spool failed, see the view's `failed`).
#[derive(Debug)]
pub struct Stopped;

/// Starts the writer thread on an opened spool; returns its handle and the view.
pub fn start(
    mut spool: Spool,
    metrics: Arc<Metrics>,
) -> std::io::Result<(SpoolWriter, watch::Receiver<SpoolView>)> {
    let (tx, rx) = std_mpsc::sync_channel(QUEUE);
    spool.set_deferred(true);
    metrics.ops.spool.capacity.store(spool.capacity(), Relaxed);
    let (publish, view_rx, durable) = Publish::new(&spool, metrics);
    let writing = Arc::new(Mutex::new(Writing {
        spool,
        dirty_since: None,
        sync_pending: false,
        failed: false,
        publish,
    }));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let thread = WriterThread {
        writing: writing.clone(),
        in_flight: in_flight.clone(),
        syncer: Syncer::start(writing.clone())?,
    };
    std::thread::Builder::new()
        .name("walrelay-spool".into())
        .spawn(move || thread.run(rx))?;
    let writer = SpoolWriter {
        ops: tx,
        writing,
        in_flight,
        durable,
    };
    Ok((writer, view_rx))
}

impl SpoolWriter {
    /// Hands an op on in order, waiting while the thread's queue is full (call it off the
    /// runtime, or when [`SpoolWriter::idle`]); a small append that finds the writer idle is
    /// written here (see the module's doc).
    pub fn send(&self, op: Op) -> Result<(), Stopped> {
        match self.try_inline(op) {
            Ok(r) => r,
            Err(op) => self.send_now(op),
        }
    }

    /// The spool's durable end: changes only when it moves (not at every append, as the
    /// view does).
    pub fn durable(&self) -> watch::Receiver<Lsn> {
        self.durable.clone()
    }

    /// Whether every op handed on is applied (a `send` now does not wait for a full queue).
    pub fn idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }

    /// Waits until every op handed on is applied, the writer failed, or `max` passed. A
    /// stream must not start before: its Hello states where the spool ends, and ops of the
    /// stream before it still queued here would move that end after the upstream resumed
    /// from it (a gap, which fails the spool). Returns false when ops are still in flight
    /// (`max` passed first): then no stream may start yet.
    pub async fn settled(&self, view: &mut watch::Receiver<SpoolView>, max: Duration) -> bool {
        let until = tokio::time::Instant::now() + max;
        loop {
            let busy = self.in_flight.load(Ordering::Acquire) != 0;
            if !busy || view.borrow_and_update().failed.is_some() {
                return true;
            }
            if tokio::time::Instant::now() >= until {
                return false;
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), view.changed()).await;
        }
    }

    /// Hands an op to the thread, blocking while its queue is full (the few ops of a
    /// handshake, and what `send` does not write inline).
    pub fn send_now(&self, op: Op) -> Result<(), Stopped> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.ops.send(Some(op)).map_err(|_| Stopped)
    }

    /// Writes `op` here if it is a small append within the current segment and the writer
    /// is idle; gives it back otherwise.
    fn try_inline(&self, op: Op) -> Result<Result<(), Stopped>, Op> {
        let len = match &op {
            Op::Append { bytes, .. } if bytes.len() <= INLINE_MAX => bytes.len(),
            _ => return Err(op),
        };
        if self.in_flight.load(Ordering::Acquire) != 0 {
            return Err(op);
        }
        // Nobody holds the lock across an fsync (the sync thread takes it only to read the
        // state to write and to publish), so waiting for it is short.
        let mut w = lock(&self.writing);
        // Looked at again under the lock, which the thread holds until its op is applied
        // and counted: what the view shows applied is never still in flight here.
        if self.in_flight.load(Ordering::Acquire) != 0 || !w.fits_in_segment(len) {
            return Err(op);
        }
        let was_clean = w.dirty_since.is_none();
        // Within the segment and no sync: no durability work comes of it.
        let r = w.op(Some(op), false).map(|_| w.published());
        drop(w);
        if was_clean && r.is_ok() {
            // Full: the thread has ops to apply and looks at the sync deadline after them.
            let _ = self.ops.try_send(None);
        }
        Ok(r)
    }
}

impl Writing {
    /// Whether appending `len` bytes leaves the spool inside its current segment (filling one
    /// is the threads' work: the writer hands it to the sync thread).
    fn fits_in_segment(&self, len: usize) -> bool {
        let seg = self.spool.segment_size();
        let at = seg.offset_in_segment(self.spool.extent().end);
        !self.spool.is_empty() && at.saturating_add(len as u64) < seg.bytes()
    }

    /// Applies `op` (None: none; the caller publishes the spool after); returns the
    /// durability work for the sync thread: filled segments, and the periodic sync when due
    /// and `may_sync`.
    fn op(&mut self, op: Option<Op>, may_sync: bool) -> Result<Vec<Durability>, Stopped> {
        if self.failed {
            return Err(Stopped);
        }
        let g = &self.publish.metrics.ops.spool;
        let r = match op {
            Some(op) => timed_wall(&g.write_ns, || apply(&mut self.spool, op)).map(|_| {
                self.dirty_since.get_or_insert_with(Instant::now);
            }),
            None => Ok(()),
        };
        let r = r.and_then(|_| {
            let mut jobs = self.spool.take_filled();
            match self.dirty_since {
                Some(t) if may_sync && !self.sync_pending && t.elapsed() >= SYNC_EVERY => {
                    // None: all written is in a filled segment's job already.
                    if let Some(job) = self.spool.sync_job()? {
                        jobs.push(job);
                        self.sync_pending = true;
                    }
                    self.dirty_since = None;
                }
                _ => {}
            }
            Ok(jobs)
        });
        r.map_err(|e| {
            self.fail(&e);
            Stopped
        })
    }
}

struct WriterThread {
    writing: Arc<Mutex<Writing>>,
    in_flight: Arc<AtomicUsize>,
    syncer: Syncer,
}

impl WriterThread {
    fn run(&self, rx: std_mpsc::Receiver<Option<Op>>) {
        loop {
            let wait = {
                let w = lock(&self.writing);
                match w.dirty_since {
                    // A sync still with the sync thread: look again a period later.
                    Some(_) if w.sync_pending => SYNC_EVERY,
                    Some(t) => SYNC_EVERY.saturating_sub(t.elapsed()),
                    None => Duration::from_secs(3600),
                }
            };
            let op = match rx.recv_timeout(wait) {
                Ok(op) => op,
                Err(std_mpsc::RecvTimeoutError::Timeout) => None,
                Err(std_mpsc::RecvTimeoutError::Disconnected) => {
                    self.syncer.drain();
                    let mut w = lock(&self.writing);
                    if !w.failed {
                        let _ = w.spool.sync();
                        w.published();
                    }
                    return;
                }
            };
            // Anything but an append changes the spool in ways the sync thread's pending
            // jobs must not see half done: let them finish first.
            if !matches!(op, None | Some(Op::Append { .. })) {
                self.syncer.drain();
            }
            let counted = op.is_some();
            let r = {
                let mut w = lock(&self.writing);
                let r = w.op(op, true);
                if counted {
                    self.in_flight.fetch_sub(1, Ordering::AcqRel);
                }
                // Published once no longer counted in flight: a small append right behind
                // it, seeing it applied, finds the writer idle.
                if r.is_ok() {
                    w.published();
                }
                r
            };
            let Ok(jobs) = r else { return };
            for job in jobs {
                if !self.syncer.send(job) {
                    return;
                }
            }
        }
    }
}

fn apply(spool: &mut Spool, op: Op) -> Result<(), SpoolError> {
    match &op {
        Op::Append { tli, start, bytes } => {
            tracing::trace!(%tli, %start, len = bytes.len(), "spool append")
        }
        other => tracing::debug!(op = ?std::mem::discriminant(other), "spool op"),
    }
    match op {
        Op::Bind { system_id, seg } => spool.bind(system_id, seg),
        Op::Append { tli, start, bytes } => spool.append(tli, start, &bytes),
        Op::Switch { tli, history } => {
            let from = spool.extent().tli;
            spool.switch_timeline(tli, &history)?;
            tracing::info!(%from, to = %tli, at = %spool.extent().end, "the spool follows the primary onto a new timeline");
            Ok(())
        }
        Op::History { tli, history } => spool.write_history(tli, &history),
    }
}

#[cfg(test)]
mod tests {
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
        let spool = Spool::open(d.path(), 100 * MIB).unwrap();
        let (w, mut view) = start(spool, Metrics::new()).unwrap();
        w.send_now(Op::Bind {
            system_id: 7,
            seg: WalSegSize::new(MIB).unwrap(),
        })
        .unwrap();
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

    /// A bound, deferred spool in `dir` with the writer's state, run by the test (no threads).
    fn writing(
        dir: &std::path::Path,
    ) -> (Writing, watch::Receiver<SpoolView>, watch::Receiver<Lsn>) {
        let mut spool = Spool::open(dir, 100 * MIB).unwrap();
        spool.set_deferred(true);
        spool.bind(7, WalSegSize::new(MIB).unwrap()).unwrap();
        let (publish, view, durable) = Publish::new(&spool, Metrics::new());
        let w = Writing {
            spool,
            dirty_since: None,
            sync_pending: false,
            failed: false,
            publish,
        };
        (w, view, durable)
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
        let spool = Spool::open(d.path(), 100 * MIB).unwrap();
        let (w, mut view) = start(spool, Metrics::new()).unwrap();
        let seg = WalSegSize::new(MIB).unwrap();
        w.send_now(Op::Bind { system_id: 7, seg }).unwrap();
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
}
