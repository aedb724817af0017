//! What the spool's writer thread, the stream's inline appends and the sync thread share:
//! the [`Spool`] with the writer's state under one lock ([`Writing`]), and where changes to
//! it are published ([`Publish`]) as a [`SpoolView`].
//!
//! A write or fsync that fails (a full disk, an I/O error) fails the spool: it takes no WAL
//! until it is opened again from its files ([`Writing::reopen`], as a restarted downstream
//! would open it), which the stream asks for between streams, [`REOPEN_AFTER`] after the
//! failure and as often again until the spool takes WAL again.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{info, warn};

use walrelay_wal::lsn::Lsn;

use crate::logging::Repeats;
use crate::metrics::Metrics;
use crate::spool::{Extent, Spool, SpoolError, SpoolFiles};

/// How long a failed spool waits before it is opened again (and again after each failure).
pub const REOPEN_AFTER: Duration = Duration::from_secs(10);

/// The spool as the rest of the downstream sees it.
#[derive(Debug, Clone)]
pub struct SpoolView {
    pub extent: Extent,
    pub files: SpoolFiles,
    pub system_id: u64,
    /// Set while the writer has failed (disk full, ...): nothing more is written until the
    /// spool is opened again (see the module docs).
    pub failed: Option<String>,
}

/// The spool and the writer's state, used by one of the writer thread, the inline path and
/// the sync thread at a time.
pub(super) struct Writing {
    pub(super) spool: Spool,
    /// When the oldest write not handed to the sync thread was made.
    pub(super) dirty_since: Option<Instant>,
    /// A periodic sync is with the sync thread (no second one is queued behind it).
    pub(super) sync_pending: bool,
    /// When a write or sync failed: nothing more is written until the spool is opened again.
    pub(super) failed: Option<Instant>,
    /// `failed` as the stream's sender reads it without the lock (it stops sending).
    pub(super) stopped: Arc<AtomicBool>,
    /// The failures and reopenings logged, once a minute when they repeat (a disk that stays
    /// full fails the spool again after each reopening).
    logged: Repeats,
    pub(super) publish: Publish,
}

impl Writing {
    pub(super) fn new(spool: Spool, publish: Publish) -> Writing {
        Writing {
            spool,
            dirty_since: None,
            sync_pending: false,
            failed: None,
            stopped: Arc::default(),
            logged: Repeats::default(),
            publish,
        }
    }

    pub(super) fn is_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// The spool failed (disk full, ...): nothing more is written until it is opened again,
    /// and the view says why.
    pub(super) fn fail(&mut self, e: &SpoolError) {
        if self.failed.is_none() {
            self.failed = Some(Instant::now());
            self.stopped.store(true, Ordering::Release);
            let why = format!(
                "the spool failed: {e}; it takes no WAL (standbys are served what it holds) \
                 until it is opened again, {} s from now and as often after, once its disk \
                 takes writes again",
                REOPEN_AFTER.as_secs()
            );
            if let Some(n) = self.logged.report(&why) {
                warn!("{why}{}", Repeats::since_text(n));
            }
        }
        self.publish.send(&self.spool, Some(e.to_string()));
    }

    /// Whether the failed spool has waited [`REOPEN_AFTER`] (None: it has not failed).
    pub(super) fn reopen_due(&self) -> Option<bool> {
        self.failed.map(|t| t.elapsed() >= REOPEN_AFTER)
    }

    /// Opens the failed spool again from its files ([`Spool::reopen`]); the writer's state
    /// starts over from what they hold. When that fails too, the spool stays failed and
    /// waits as long again. Every sync job of the old spool must be done (the sync thread
    /// drained): they would apply to this one.
    pub(super) fn reopen(&mut self) {
        match self.spool.reopen() {
            Ok(spool) => {
                self.spool = spool;
                self.dirty_since = None;
                self.sync_pending = false;
                self.failed = None;
                self.stopped.store(false, Ordering::Release);
                let e = self.spool.extent();
                let what = format!(
                    "the spool was opened again after its failure: it ends at {} on timeline {} \
                     (what was written after its last sync is fetched again)",
                    e.end, e.tli
                );
                if let Some(n) = self.logged.report(&what) {
                    info!("{what}{}", Repeats::since_text(n));
                }
                self.publish.recovered(&self.spool);
            }
            Err(e) => {
                self.failed = Some(Instant::now());
                self.publish
                    .send(&self.spool, Some(format!("opening it again: {e}")));
            }
        }
    }

    /// Syncs all that is written (and `spool.state`), as the periodic sync would a little
    /// later; every sync job must be done (the sync thread drained).
    pub(super) fn sync_now(&mut self) {
        if self.is_failed() {
            return;
        }
        match self.spool.sync() {
            Ok(_) => {
                self.dirty_since = None;
                self.sync_pending = false;
                self.published();
            }
            Err(e) => self.fail(&e),
        }
    }

    /// Publishes the spool's extent as it is now.
    pub(super) fn published(&mut self) {
        if self.failed.is_none() {
            self.publish.send(&self.spool, None);
        }
    }
}

/// Where the writer tells what the spool holds: the whole view after every change (the
/// standbys' sessions wait for new WAL on it), and the durable end only when it moves (the
/// stream's send loop waits on that alone, rather than waking at every append).
pub(super) struct Publish {
    view_tx: watch::Sender<SpoolView>,
    durable_tx: watch::Sender<Lsn>,
    pub(super) metrics: Arc<Metrics>,
}

impl Publish {
    /// A publisher starting from `spool` as it is, with the view's and the durable end's
    /// receivers.
    pub(super) fn new(
        spool: &Spool,
        metrics: Arc<Metrics>,
    ) -> (Publish, watch::Receiver<SpoolView>, watch::Receiver<Lsn>) {
        let (view_tx, view_rx) = watch::channel(view(spool, None));
        let (durable_tx, durable_rx) = watch::channel(spool.extent().durable);
        let publish = Publish {
            view_tx,
            durable_tx,
            metrics,
        };
        (publish, view_rx, durable_rx)
    }

    pub(super) fn send(&self, spool: &Spool, failed: Option<String>) {
        let e = spool.extent();
        let g = &self.metrics.ops.spool;
        g.start.store(e.start.0, Relaxed);
        g.end.store(e.end.0, Relaxed);
        g.durable.store(e.durable.0, Relaxed);
        g.reused.store(spool.reused(), Relaxed);
        if failed.is_some() {
            *g.failure.lock().unwrap_or_else(|e| e.into_inner()) = failed.clone();
        }
        self.view_tx.send_replace(view(spool, failed));
        self.durable_tx.send_if_modified(|d| {
            let moved = *d != e.durable;
            *d = e.durable;
            moved
        });
    }

    /// The spool was opened again: its new extent, and the failure cleared.
    fn recovered(&self, spool: &Spool) {
        let g = &self.metrics.ops.spool;
        *g.failure.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.send(spool, None);
    }
}

#[cfg(test)]
impl SpoolView {
    /// A spool of cluster `system_id` without WAL, its timeline `tli`, for tests.
    pub fn empty(system_id: u64, tli: walrelay_wal::lsn::TimeLineId) -> SpoolView {
        SpoolView {
            extent: Extent {
                tli,
                start: Lsn(0),
                end: Lsn(0),
                durable: Lsn(0),
            },
            files: SpoolFiles {
                dir: "/x".into(),
                seg: walrelay_wal::segment::WalSegSize::DEFAULT,
                recent: Default::default(),
            },
            system_id,
            failed: None,
        }
    }
}

pub(super) fn view(spool: &Spool, failed: Option<String>) -> SpoolView {
    SpoolView {
        extent: spool.extent(),
        files: spool.files(),
        system_id: spool.system_id(),
        failed,
    }
}
