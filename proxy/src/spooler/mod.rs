//! The spooler: the downstream's end of the stream. It keeps one stream open to an upstream
//! (reconnecting, trying the configured addresses in turn), writes the verified WAL to the
//! spool ([`writer`]), and carries the standbys' channels: their commands and feedback up,
//! their own connections' answers down.
//!
//! Standby sessions (`crate::walsender`) talk to the [`Spooler`] only: they read WAL from the
//! spool, open a channel, and learn whether the link is up. A link cut ends no standby's
//! session: they get what is spooled and wait; their channels are opened again, with their
//! latest feedback, when the stream is back.
//!
//! Feedback of a channel is held for up to `link.batch_window_ms` (only the latest of each
//! kind goes) unless its standby is synchronous, or the standby leaves; commands, starts and
//! closes go at once.

mod channels;
mod client;
mod decode;
pub mod handshake;
mod syncer;
pub mod writer;
mod writing;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch, Notify};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use walrelay_proto::frame::Feedback;
use walrelay_proto::link::{Command, StandbyInfo, StartReplication, Welcome};

use crate::config::{CodecKind, Limits, LinkConfig, ResolvedDownstream};
use crate::metrics::Metrics;
use crate::spool::Spool;
use channels::{Channels, Out};
use writer::{SpoolView, SpoolWriter};

/// How long sessions use plain zstd after WAL failed verification with the `wal` codec.
const CODEC_FALLBACK: Duration = Duration::from_secs(600);
/// Name of the file in the spool directory that keeps the primary's parameters, so standbys
/// can start while the link is down.
const PARAMS_FILE: &str = "primary.params";
/// The longest the final sync at shutdown waits for the spool's disk.
pub const SHUTDOWN_SYNC_MAX: Duration = Duration::from_secs(5);

/// What a standby's session hears on its channel.
#[derive(Debug)]
pub enum ChanEvent {
    /// The primary's answer to a command (whole backend messages, ending with ReadyForQuery,
    /// or an ErrorResponse refusing START_REPLICATION).
    Backend(Vec<u8>),
    /// The standby's own connection to the primary streams; `synchronous`: a commit may wait
    /// for this standby.
    Started { synchronous: bool },
    /// The link went down: an answer the session waits for will not come.
    LinkDown,
}

/// The downstream's end of the stream, shared by the standbys' sessions.
pub struct Spooler {
    pub cfg: ResolvedDownstream,
    pub link_cfg: LinkConfig,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    pub shutdown: CancellationToken,
    /// The spool as last published by its writer.
    pub view: watch::Receiver<SpoolView>,
    writer: SpoolWriter,
    /// The open stream's Welcome, None while the link is down.
    pub link: watch::Receiver<Option<Arc<Welcome>>>,
    link_tx: watch::Sender<Option<Arc<Welcome>>>,
    /// The primary's parameters (from the last Welcome, or the spool's file).
    params: Mutex<Vec<(String, String)>>,
    /// The primary's `data_directory_mode` as it last answered a standby's SHOW (it cannot
    /// change while the primary runs), for the SHOW of a client connecting while the link is
    /// down.
    data_directory_mode: Mutex<Option<String>>,
    channels: Mutex<Channels>,
    /// Something for the upstream is waiting.
    wake: Notify,
    fallback_until: Mutex<Option<Instant>>,
    /// Why the last stream attempt failed (for standbys that cannot start without the link).
    last_error: Mutex<Option<String>>,
    /// The primary's WAL end as the stream last stated it (Welcome, WAL, keepalives).
    primary_end: std::sync::atomic::AtomicU64,
    /// The link's TLS toward the upstream, for both channels' new connections (a reload
    /// replaces it when its files changed).
    pub link_tls: crate::link::ClientTls,
    /// The tunnels' gRPC channel to the upstream: one HTTP/2 connection, not the WAL
    /// stream's (see `client::run`).
    channel: std::sync::OnceLock<tonic::transport::Channel>,
    /// `limits.queue_messages` (live): the next stream's queue toward the upstream takes it.
    queue_messages: std::sync::atomic::AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Spooler {
    /// Opens the spool and starts its writer; the stream starts with [`Spooler::run`].
    pub fn new(
        cfg: ResolvedDownstream,
        link_cfg: LinkConfig,
        limits: Limits,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Arc<Spooler>> {
        use anyhow::Context;
        let spool = Spool::open(&cfg.spool_dir, cfg.spool_bytes)
            .with_context(|| format!("opening the spool in {}", cfg.spool_dir.display()))?;
        let params = read_params(&cfg.spool_dir);
        let (writer, view) =
            writer::start(spool, metrics.clone()).context("starting the spool's writer thread")?;
        let (link_tx, link) = watch::channel(None);
        let queue_messages = limits.queue_messages.into();
        let link_tls = crate::link::client_tls(&link_cfg).context("the link's TLS")?;
        Ok(Arc::new(Spooler {
            link_tls,
            cfg,
            link_cfg,
            limits,
            metrics,
            shutdown,
            view,
            writer,
            link,
            link_tx,
            params: Mutex::new(params),
            data_directory_mode: Mutex::default(),
            channels: Mutex::default(),
            wake: Notify::new(),
            fallback_until: Mutex::default(),
            last_error: Mutex::default(),
            primary_end: Default::default(),
            queue_messages,
            channel: Default::default(),
        }))
    }

    /// Keeps the stream open until shutdown (see [`client`]).
    pub async fn run(self: Arc<Self>) {
        client::run(self).await
    }

    /// Makes what the spool holds durable before the process exits (at most
    /// [`SHUTDOWN_SYNC_MAX`]), and says where it ends.
    pub async fn sync_at_shutdown(&self) {
        let synced = self
            .writer
            .sync_now(&mut self.view.clone(), SHUTDOWN_SYNC_MAX)
            .await;
        let e = self.view.borrow().extent;
        match synced {
            true => info!(end = %e.durable, timeline = e.tli.0, "spool synced"),
            false => warn!(
                durable = %e.durable,
                "the spool was not synced within {} s at shutdown (its disk is slow or failed): \
                 what is past its durable end is fetched again from the primary's slot",
                SHUTDOWN_SYNC_MAX.as_secs()
            ),
        }
    }

    /// A reloaded `limits.queue_messages`, for the streams opened from now on.
    pub fn set_queue_messages(&self, n: usize) {
        self.queue_messages
            .store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// The queue size a stream opened now takes.
    pub fn queue_messages(&self) -> usize {
        self.queue_messages
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The link's gRPC channel for a tunnel's call (None before the link was set up).
    pub fn channel(&self) -> Option<tonic::transport::Channel> {
        self.channel.get().cloned()
    }

    /// The primary's WAL end as last stated on the stream (0 before any).
    pub fn primary_end(&self) -> walrelay_wal::lsn::Lsn {
        walrelay_wal::lsn::Lsn(self.primary_end.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn saw_primary_end(&self, end: u64) {
        self.primary_end
            .fetch_max(end, std::sync::atomic::Ordering::Relaxed);
    }

    /// Why the link is down, if it is.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.last_error).clone()
    }

    fn set_error(&self, e: Option<String>) {
        *lock(&self.last_error) = e;
    }

    /// The primary's parameters for a standby's startup, if ever known.
    pub fn params(&self) -> Vec<(String, String)> {
        lock(&self.params).clone()
    }

    /// The primary's `data_directory_mode` as last shown to a standby, if ever.
    pub fn data_directory_mode(&self) -> Option<String> {
        lock(&self.data_directory_mode).clone()
    }

    pub fn saw_data_directory_mode(&self, mode: String) {
        *lock(&self.data_directory_mode) = Some(mode);
    }

    fn set_welcome(&self, w: Option<Arc<Welcome>>) {
        if let Some(w) = &w {
            let params: Vec<(String, String)> = w
                .params
                .iter()
                .map(|p| (p.name.clone(), p.value.clone()))
                .collect();
            // Written (and fsynced, on this runtime thread) only when they changed, which
            // is seldom: not at every reconnect.
            let changed = *lock(&self.params) != params;
            if changed {
                if let Err(e) = write_params(&self.cfg.spool_dir, &params) {
                    warn!("cannot keep the primary's parameters in the spool directory: {e}");
                }
                *lock(&self.params) = params;
            }
        }
        self.link_tx.send_replace(w);
    }

    /// The codec to ask for: the configured one, or `zstd` during a fallback.
    fn codec(&self) -> CodecKind {
        match (self.link_cfg.codec, *lock(&self.fallback_until)) {
            (CodecKind::Wal, Some(t)) if Instant::now() < t => CodecKind::Zstd,
            (c, _) => c,
        }
    }

    fn start_fallback(&self) {
        warn!("WAL failed verification with the wal codec: the stream uses plain zstd for the next {} s (please report this with the log)", CODEC_FALLBACK.as_secs());
        *lock(&self.fallback_until) = Some(Instant::now() + CODEC_FALLBACK);
    }

    /// Opens a channel for a standby; its events arrive on the receiver. The channel is
    /// opened on the stream now or when the link is back. None when the stream's channel ids
    /// ([`walrelay_proto::frame::MAX_CHANNELS`]) are all in use.
    pub fn open_channel(&self, info: StandbyInfo) -> Option<(u32, mpsc::Receiver<ChanEvent>)> {
        let (tx, rx) = mpsc::channel(16);
        let chan = lock(&self.channels).open(info, tx)?;
        self.wake.notify_one();
        Some((chan, rx))
    }

    pub fn command(&self, chan: u32, c: Command) {
        self.enqueue(Out::Command(chan, c));
    }

    /// The standby started streaming (from the spool): its own connection should too.
    pub fn start(&self, chan: u32, s: StartReplication) {
        lock(&self.channels).start(chan, s);
        self.wake.notify_one();
    }

    /// The standby's feedback: the latest of its kind waits for the window unless the
    /// standby is synchronous or `urgent`.
    pub fn feedback(&self, chan: u32, f: Feedback, urgent: bool) {
        let window = Duration::from_millis(self.link_cfg.batch_window_ms);
        let wake = lock(&self.channels).feedback(chan, f, urgent, window, Instant::now());
        if wake {
            self.wake.notify_one();
        }
    }

    /// The standby left: its latest feedback still goes, then the channel closes.
    pub fn close_channel(&self, chan: u32) {
        lock(&self.channels).close(chan, Instant::now());
        self.wake.notify_one();
    }

    fn enqueue(&self, o: Out) {
        lock(&self.channels).queue.push(o);
        self.wake.notify_one();
    }
}

fn read_params(dir: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(dir.join(PARAMS_FILE))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn write_params(dir: &Path, params: &[(String, String)]) -> Result<(), crate::spool::SpoolError> {
    let text: String = params
        .iter()
        .filter(|(k, v)| !k.contains(['\t', '\n']) && !v.contains(['\t', '\n']))
        .map(|(k, v)| format!("{k}\t{v}\n"))
        .collect();
    crate::spool::write_atomically(dir, PARAMS_FILE, text.as_bytes())
}
