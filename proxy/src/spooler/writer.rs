//! The spool's writer thread: the one owner of the [`Spool`], so file I/O and fsync never run
//! on the async runtime. It applies verified WAL and timeline switches in order, syncs at most
//! [`SYNC_EVERY`] after the first unsynced write (and whenever a segment completes), and
//! publishes the spool's extent for the standbys' sessions and for the stream (which tells the
//! upstream where the spool is durable, so the primary's slot advances).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::warn;

use walrelay_wal::lsn::{Lsn, TimeLineId};
use walrelay_wal::segment::WalSegSize;

use crate::metrics::Metrics;
use crate::spool::{Extent, Spool, SpoolError, SpoolFiles};

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

/// Starts the writer thread on an opened spool; returns where to send ops and the view.
pub fn start(
    spool: Spool,
    metrics: Arc<Metrics>,
) -> std::io::Result<(std_mpsc::SyncSender<Op>, watch::Receiver<SpoolView>)> {
    let (tx, rx) = std_mpsc::sync_channel::<Op>(64);
    let (view_tx, view_rx) = watch::channel(view(&spool, None));
    metrics.ops.spool.capacity.store(spool.capacity(), Relaxed);
    std::thread::Builder::new()
        .name("walrelay-spool".into())
        .spawn(move || run(spool, rx, Publish { view_tx, metrics }))?;
    Ok((tx, view_rx))
}

/// Where the writer tells what the spool holds.
struct Publish {
    view_tx: watch::Sender<SpoolView>,
    metrics: Arc<Metrics>,
}

impl Publish {
    fn send(&self, spool: &Spool, failed: Option<String>) {
        let e = spool.extent();
        let g = &self.metrics.ops.spool;
        g.start.store(e.start.0, Relaxed);
        g.end.store(e.end.0, Relaxed);
        g.durable.store(e.durable.0, Relaxed);
        self.view_tx.send_replace(view(spool, failed));
    }
}

fn view(spool: &Spool, failed: Option<String>) -> SpoolView {
    SpoolView {
        extent: spool.extent(),
        files: spool.files(),
        system_id: spool.system_id(),
        failed,
    }
}

fn run(mut spool: Spool, rx: std_mpsc::Receiver<Op>, publish: Publish) {
    let mut dirty_since: Option<Instant> = None;
    loop {
        let wait = match dirty_since {
            Some(t) => SYNC_EVERY.saturating_sub(t.elapsed()),
            None => Duration::from_secs(3600),
        };
        let op = match rx.recv_timeout(wait) {
            Ok(op) => Some(op),
            Err(std_mpsc::RecvTimeoutError::Timeout) => None,
            Err(std_mpsc::RecvTimeoutError::Disconnected) => {
                let _ = spool.sync();
                publish.send(&spool, None);
                return;
            }
        };
        let r = match op {
            Some(op) => apply(&mut spool, op).map(|_| {
                dirty_since.get_or_insert_with(Instant::now);
            }),
            None => Ok(()),
        };
        let r = r.and_then(|_| match dirty_since {
            Some(t) if t.elapsed() >= SYNC_EVERY => spool.sync().map(|_| dirty_since = None),
            _ => Ok(()),
        });
        if let Err(e) = r {
            warn!("the spool failed: {e}");
            publish.send(&spool, Some(e.to_string()));
            return;
        }
        publish.send(&spool, None);
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
