//! What the spool's writer thread, the stream's inline appends and the sync thread share:
//! the [`Spool`] with the writer's state under one lock ([`Writing`]), and where changes to
//! it are published ([`Publish`]) as a [`SpoolView`].

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;
use tracing::warn;

use walrelay_wal::lsn::Lsn;

use crate::metrics::Metrics;
use crate::spool::{Extent, Spool, SpoolError, SpoolFiles};

/// The spool as the rest of the downstream sees it.
#[derive(Debug, Clone)]
pub struct SpoolView {
    pub extent: Extent,
    pub files: SpoolFiles,
    pub system_id: u64,
    /// Set when the writer failed (disk full, ...): nothing more is written until it is
    /// restarted.
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
    /// A write or sync failed: nothing more is written until the downstream restarts.
    pub(super) failed: bool,
    pub(super) publish: Publish,
}

impl Writing {
    /// The spool failed (disk full, ...): nothing more is written until the downstream
    /// restarts, and the view says why.
    pub(super) fn fail(&mut self, e: &SpoolError) {
        if !self.failed {
            warn!("the spool failed: {e}");
        }
        self.failed = true;
        self.publish.send(&self.spool, Some(e.to_string()));
    }

    /// Publishes the spool's extent as it is now.
    pub(super) fn published(&mut self) {
        if !self.failed {
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
}

pub(super) fn view(spool: &Spool, failed: Option<String>) -> SpoolView {
    SpoolView {
        extent: spool.extent(),
        files: spool.files(),
        system_id: spool.system_id(),
        failed,
    }
}
