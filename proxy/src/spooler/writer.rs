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
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use walrelay_wal::lsn::{Lsn, TimeLineId};
use walrelay_wal::segment::WalSegSize;

use super::lock;
use super::syncer::Syncer;
pub use super::writing::SpoolView;
pub use super::writing::REOPEN_AFTER;
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

/// What the thread's queue carries.
enum Queued {
    Op(Op),
    /// Only wakes the thread: an inline write made the spool dirty.
    Wake,
    /// Opens the failed spool again ([`SpoolWriter::reopen`]).
    Reopen,
    /// Syncs what is written now ([`SpoolWriter::sync_now`]).
    Sync,
}

/// The stream's handle on the spool's writer.
pub struct SpoolWriter {
    ops: std_mpsc::SyncSender<Queued>,
    writing: Arc<Mutex<Writing>>,
    /// Ops handed to the thread and not yet applied (a reopening counts as one).
    in_flight: Arc<AtomicUsize>,
    /// The spool failed: ops are refused until it is opened again.
    stopped: Arc<AtomicBool>,
    /// Streams' decode stages that may still hand ops on ([`SpoolWriter::producer`]).
    producers: Arc<AtomicUsize>,
    /// The spool's durable end, changed only when it moves.
    durable: watch::Receiver<Lsn>,
}

/// A stream's decode stage that may still hand ops on ([`SpoolWriter::producer`]).
pub struct Producer(Arc<AtomicUsize>);

impl Drop for Producer {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The spool failed (see the view's `failed`): it takes no ops until it is opened again.
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
    let writing = Writing::new(spool, publish);
    let stopped = writing.stopped.clone();
    let writing = Arc::new(Mutex::new(writing));
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
        stopped,
        producers: Arc::default(),
        durable,
    };
    Ok((writer, view_rx))
}

impl SpoolWriter {
    /// Hands an op on in order, waiting while the thread's queue is full (call it off the
    /// runtime, or when [`SpoolWriter::idle`]); a small append that finds the writer idle is
    /// written here (see the module's doc).
    pub fn send(&self, op: Op) -> Result<(), Stopped> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(Stopped);
        }
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

    /// Held by a stream's decode stage for as long as it may hand ops on: [`settled`] and
    /// [`reopen`] wait for it to be dropped, since a stage that outlived its stream (its
    /// writer stuck past `SETTLE_MAX`) still applies the frames it holds, and between two of
    /// them nothing of it is in flight.
    ///
    /// [`settled`]: SpoolWriter::settled
    /// [`reopen`]: SpoolWriter::reopen
    pub fn producer(&self) -> Producer {
        self.producers.fetch_add(1, Ordering::AcqRel);
        Producer(self.producers.clone())
    }

    /// Whether every op handed on is applied (a `send` now does not wait for a full queue).
    pub fn idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }

    /// Waits until every op handed on is applied and every [`Producer`] is gone, the writer
    /// failed, or `max` passed. A stream must not start before: its Hello states where the
    /// spool ends, and ops of the stream before it still queued here, or still to come from
    /// its decode stage, would move that end after the upstream resumed from it (a gap,
    /// which fails the spool). Returns false when ops are still in flight (`max` passed
    /// first): then no stream may start yet.
    pub async fn settled(&self, view: &mut watch::Receiver<SpoolView>, max: Duration) -> bool {
        self.applied(view, max, true, true).await
    }

    /// Opens the failed spool again from its files (see `super::writing`), once it has
    /// waited [`REOPEN_AFTER`] since it failed. Call it between streams: no WAL of a stream
    /// may still come (it would not continue the spool's new end). `Ok` when the spool takes
    /// WAL (it had not failed, or it was opened again), else why not.
    pub async fn reopen(
        &self,
        view: &mut watch::Receiver<SpoolView>,
        max: Duration,
    ) -> Result<(), String> {
        let failure = |v: &watch::Receiver<SpoolView>| match v.borrow().failed.clone() {
            Some(f) => Err(f),
            None => Ok(()),
        };
        // A stage of the last stream still applying would append to the reopened spool.
        let producing = self.producers.load(Ordering::Acquire) != 0;
        if producing || lock(&self.writing).reopen_due() != Some(true) {
            return failure(view);
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        if self.ops.try_send(Queued::Reopen).is_err() {
            // The queue full of a stream's ops, which the thread drops: next time.
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return failure(view);
        }
        self.applied(view, max, false, true).await;
        failure(view)
    }

    /// Makes everything written so far durable (`spool.state` included) and waits for it, at
    /// most `max`: the final sync at shutdown, so that a restart finds all of it rather than
    /// fetching the last period's WAL again. False when `max` passed first or the writer
    /// failed.
    pub async fn sync_now(&self, view: &mut watch::Receiver<SpoolView>, max: Duration) -> bool {
        let until = tokio::time::Instant::now() + max;
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        loop {
            match self.ops.try_send(Queued::Sync) {
                Ok(()) => break,
                Err(std_mpsc::TrySendError::Full(_)) if tokio::time::Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(_) => {
                    self.in_flight.fetch_sub(1, Ordering::AcqRel);
                    return false;
                }
            }
        }
        // The ops handed on before it, then it (a stage of the stream that shutdown dropped
        // may still hold a frame or two: not waited for, they are fetched again).
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        self.applied(view, left, true, false).await && view.borrow().failed.is_none()
    }

    /// Waits until every op handed on is applied and, with `producers`, no [`Producer`] is
    /// left (or, `or_failed`, the writer failed), or `max` passed; false in that last case.
    async fn applied(
        &self,
        view: &mut watch::Receiver<SpoolView>,
        max: Duration,
        or_failed: bool,
        producers: bool,
    ) -> bool {
        let until = tokio::time::Instant::now() + max;
        loop {
            let busy = self.in_flight.load(Ordering::Acquire) != 0
                || (producers && self.producers.load(Ordering::Acquire) != 0);
            if !busy || (or_failed && view.borrow_and_update().failed.is_some()) {
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
        if self.stopped.load(Ordering::Acquire) {
            return Err(Stopped);
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.ops.send(Queued::Op(op)).map_err(|_| Stopped)
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
            let _ = self.ops.try_send(Queued::Wake);
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
        if self.is_failed() {
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
    fn run(&self, rx: std_mpsc::Receiver<Queued>) {
        loop {
            let wait = {
                let w = lock(&self.writing);
                match w.dirty_since {
                    // Failed: nothing to sync until it is opened again.
                    _ if w.is_failed() => Duration::from_secs(3600),
                    // A sync still with the sync thread: look again a period later.
                    Some(_) if w.sync_pending => SYNC_EVERY,
                    Some(t) => SYNC_EVERY.saturating_sub(t.elapsed()),
                    None => Duration::from_secs(3600),
                }
            };
            let op = match rx.recv_timeout(wait) {
                Ok(Queued::Op(op)) => Some(op),
                Ok(Queued::Wake) | Err(std_mpsc::RecvTimeoutError::Timeout) => None,
                Ok(Queued::Reopen) => {
                    self.reopen();
                    continue;
                }
                Ok(Queued::Sync) => {
                    self.syncer.drain();
                    lock(&self.writing).sync_now();
                    self.in_flight.fetch_sub(1, Ordering::AcqRel);
                    continue;
                }
                Err(std_mpsc::RecvTimeoutError::Disconnected) => {
                    self.syncer.drain();
                    lock(&self.writing).sync_now();
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
            // Failed: the op is dropped (the stream learns from `send` or the view).
            let Ok(jobs) = r else { continue };
            for job in jobs {
                if !self.syncer.send(job) {
                    return;
                }
            }
        }
    }

    /// Opens the failed spool again, once the sync thread is done with the old one's jobs.
    fn reopen(&self) {
        self.syncer.drain();
        let mut w = lock(&self.writing);
        if w.is_failed() {
            w.reopen();
        }
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
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
mod tests;
