//! The upstream half (next to the primary): serves the link; per downstream, one stream that
//! reads the primary's WAL once and carries it once, whatever the number of standbys.
//!
//! Connections reach tonic through [`accept`]: a place in the pre-authentication budget and
//! `limits.startup_timeout_secs` for the TLS handshake, failures logged and counted.
//!
//! A stream opens with the link handshake ([`handshake`]: `Hello` → the feed's connection to
//! the primary on the downstream's slot, [`open`] → `Welcome`); then its directions run until either
//! ends, each a struct with a `run()`:
//! - [`feed::FeedToLink`]: the primary's WAL, encoded once, and the standbys' answers, batched
//!   into link frames; status updates to the primary where the spool is durable;
//! - [`from_link::LinkToUpstream`]: the downstream's frames: where the spool is durable, and
//!   per standby its channel, served by an [`identity::Identity`]: the standby's own
//!   replication connection to the primary (see there for why and how).
//!
//! Tunnels ([`tunnel`]): one `Tunnel` call per client session the downstream does not serve
//! itself (base backups, logical replication, slot synchronization's SQL), each with its own
//! connection to the primary; a `Cancel` call relays a tunnelled client's cancel request to
//! that connection's backend.
//!
//! Batching: a stream has no window while any of its standbys is one the primary's
//! `synchronous_standby_names` lists (read on the standby's own connection when it opens; an
//! unreadable setting counts as listed), so a commit never waits for a batch.

mod accept;
mod encode;
mod feed;
mod from_link;
mod handshake;
mod identity;
mod open;
mod primary;
mod tunnel;

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};
use tracing::{info, warn, Instrument};

use walrelay_pgwire::syncrep;
use walrelay_proto::frame::{tunnel_frame_max, Dir, TunnelRx, TunnelTx};
use walrelay_proto::link::link_server::{Link, LinkServer};
use walrelay_proto::link::{
    to_downstream, to_upstream, Hello, ToDownstream, ToUpstream, TunnelCancel, TunnelCancelled,
    TunnelFrame,
};
use walrelay_wal::linkcodec::{Setup, WalEncoder};
use walrelay_wal::lsn::TimeLineId;
use walrelay_wal::pg::PgMajor;
use walrelay_wal::walcodec;

use crate::cancelkeys::CancelKeys;
use crate::config::{Limits, LinkConfig, ResolvedUpstream};
use crate::conninfo::ConnInfo;
use crate::link;
use crate::live::{Live, SessionSlots, Slot};
use crate::logging::Repeats;
use crate::metrics::{GaugeGuard, Metrics};
use crate::pgclient::{self, PrimaryConn};
use crate::silence::Silence;
use crate::tlsfiles::Swap;
use feed::FeedToLink;
use feed::PRIMARY_TIMEOUT;
use from_link::{DurableReports, LinkToUpstream};
use handshake::Agreed;
use open::{open_feed, Feed};

/// Shared state of the upstream half.
pub struct Upstream {
    pub cfg: ResolvedUpstream,
    pub link: LinkConfig,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    pub shutdown: CancellationToken,
    sessions: Arc<SessionSlots>,
    /// The stream and identity tasks, waited for (bounded) at shutdown.
    tasks: TaskTracker,
    /// Live tunnels by their client's cancel key: the primary backend to cancel.
    cancels: Arc<CancelKeys<tunnel::CancelTarget>>,
    /// Calls refused before they started, logged once a minute when the reason repeats.
    refusals: Arc<Mutex<Repeats>>,
    /// The link listener's TLS (None: plaintext), set by [`serve`] and replaced by a reload
    /// whose TLS files changed ([`Upstream::reload_tls`]).
    link_tls: Swap<Option<tokio_rustls::TlsAcceptor>>,
    /// `upstream.primary` as last reloaded, shared by every [`Upstream::reconfigured`] copy:
    /// a stream keeps the `Upstream` it opened with, but the standbys' own connections it
    /// opens later take this one ([`Upstream::primary_now`]).
    primary_now: Swap<ConnInfo>,
}

impl Upstream {
    pub fn new(
        cfg: ResolvedUpstream,
        link: LinkConfig,
        limits: Limits,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> Arc<Upstream> {
        Arc::new(Upstream {
            link,
            limits,
            metrics,
            shutdown,
            sessions: SessionSlots::new(),
            tasks: TaskTracker::new(),
            cancels: CancelKeys::new(),
            refusals: Arc::default(),
            link_tls: Swap::new(None),
            primary_now: Swap::new(cfg.primary.clone()),
            cfg,
        })
    }

    /// The same half with reloaded settings for the sessions that open from now on (the
    /// session count, metrics and shutdown are shared with `self`). The reloaded
    /// `upstream.primary` also reaches the streams open now, for the standbys' connections
    /// they open from now on.
    pub fn reconfigured(&self, cfg: ResolvedUpstream, limits: Limits) -> Arc<Upstream> {
        self.primary_now.set(cfg.primary.clone());
        Arc::new(Upstream {
            cfg,
            link: self.link.clone(),
            limits,
            metrics: self.metrics.clone(),
            shutdown: self.shutdown.clone(),
            sessions: self.sessions.clone(),
            tasks: self.tasks.clone(),
            cancels: self.cancels.clone(),
            refusals: self.refusals.clone(),
            link_tls: self.link_tls.clone(),
            primary_now: self.primary_now.clone(),
        })
    }

    /// `upstream.primary` as the last reload left it (with `upstream.primary_password`):
    /// what a standby's own connection opened now connects with, whichever stream opens it.
    /// After a password rotated on the primary and in the file, the stream's older value
    /// would be refused on every connection until the stream ended.
    pub fn primary_now(&self) -> ConnInfo {
        self.primary_now.get()
    }

    /// The link listener's TLS as it is now (None: plaintext).
    fn link_tls_acceptor(&self) -> Option<tokio_rustls::TlsAcceptor> {
        self.link_tls.get()
    }

    /// Reads the link's TLS files again: connections accepted from now on present and trust
    /// what they hold now.
    pub fn reload_tls(&self) -> Result<(), link::LinkError> {
        let tls = link::server_tls(&self.link)?.map(tokio_rustls::TlsAcceptor::from);
        self.link_tls.set(tls);
        Ok(())
    }

    /// A link call from `peer` refused before it started (`limits.max_sessions`, a version,
    /// codec or Hello the upstream does not take): the downstream hears `status`; this
    /// half's log and `walrelay_sessions_failed_total` show it too.
    fn refused(&self, peer: &str, call: &str, status: &Status) {
        Metrics::add(&self.metrics.ops.sessions_failed_upstream, 1);
        let why = format!("refused a {call} from the downstream: {}", status.message());
        let repeats = self
            .refusals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .report(&why);
        if let Some(n) = repeats {
            warn!(%peer, "{why}{}", Repeats::since_text(n));
        }
    }
}

/// Serves the link on `listener` until the shutdown token fires and sessions have ended. Each
/// link session uses the settings current in `live` when it opens.
pub async fn serve(live: Arc<Live<Upstream>>, listener: TcpListener) -> anyhow::Result<()> {
    use anyhow::Context;
    let up = live.get();
    up.reload_tls().context("link TLS configuration")?;
    let incoming = accept::incoming(live.clone(), listener, up.shutdown.clone());
    let max = link::max_link_message(&up.limits);
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(up.link.keepalive_secs)))
        .initial_stream_window_size(Some(link::STREAM_WINDOW))
        .initial_connection_window_size(Some(link::TUNNEL_CONNECTION_WINDOW))
        .http2_max_local_error_reset_streams(Some(link::MAX_LOCAL_ERROR_RESETS))
        .http2_keepalive_timeout(Some(Duration::from_secs(up.link.keepalive_secs)));
    let shutdown = up.shutdown.clone();
    let tasks = up.tasks.clone();
    let svc = LinkServer::new(LinkService(live.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    builder
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await
        .context("link server")?;
    // The sessions say goodbye to the primary before the process goes.
    tasks.close();
    let drain = Duration::from_secs(live.get().limits.drain_timeout_secs);
    if tokio::time::timeout(drain, tasks.wait()).await.is_err() {
        warn!("link sessions did not end within limits.drain_timeout_secs; cutting them");
    }
    Ok(())
}

/// Longest wait for a link stream's first message, its Hello.
const HELLO_WAIT: Duration = Duration::from_secs(30);

type StreamOut = ReceiverStream<Result<ToDownstream, Status>>;
type TunnelOut = ReceiverStream<Result<TunnelFrame, Status>>;

/// The gRPC service: one stream per downstream.
struct LinkService(Arc<Live<Upstream>>);

/// A link call's peer (for logs) and its place among `limits.max_sessions`: a stream and a
/// tunnel each take one.
fn admit<T>(up: &Upstream, request: &Request<T>, call: &str) -> Result<(String, Slot), Status> {
    let peer = request
        .remote_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let permit = up
        .sessions
        .try_take(up.limits.max_sessions)
        .ok_or_else(|| {
            Status::resource_exhausted(format!(
                "the upstream has reached limits.max_sessions ({})",
                up.limits.max_sessions
            ))
        })
        .inspect_err(|s| up.refused(&peer, call, s))?;
    Ok((peer, permit))
}

#[tonic::async_trait]
impl Link for LinkService {
    type StreamStream = StreamOut;
    type TunnelStream = TunnelOut;

    async fn tunnel(
        &self,
        request: Request<Streaming<TunnelFrame>>,
    ) -> Result<Response<TunnelOut>, Status> {
        let this = self.0.get();
        let (peer, permit) = admit(&this, &request, "tunnel")?;
        let mut inbound = request.into_inner();
        // The first frame carries the OPEN and at most one replication command (64 kB);
        // after it, one client message of up to the downstream's limit per frame.
        let own_max = this.limits.max_message_bytes;
        let mut rx = TunnelRx::new(Dir::Up, tunnel_frame_max(own_max))
            .map_err(|e| Status::internal(e.to_string()))?;
        let (open, pending) = tunnel::first_frame(&mut inbound, &mut rx)
            .await
            .inspect_err(|s| this.refused(&peer, "tunnel", s))?;
        handshake::check_version(open.protocol_version)
            .inspect_err(|s| this.refused(&peer, "tunnel", s))?;
        rx.set_max_data(tunnel::data_budget(own_max, open.max_message_bytes));
        let level = open.zstd_level.clamp(1, 19);
        let tx = TunnelTx::new(Dir::Down, level, open.zstd_window_log.clamp(10, 27))
            .map_err(|e| Status::internal(e.to_string()))?;
        let (out, out_rx) = mpsc::channel(tunnel::QUEUE_FRAMES);
        let span = tracing::info_span!("tunnel", %peer, application_name = %open.application_name);
        let session = tunnel::TunnelSession {
            open,
            inbound,
            rx,
            tx,
            out,
            pending,
        };
        let up = this.clone();
        this.tasks.spawn(
            async move {
                let _permit = permit;
                session.run(&up).await;
            }
            .instrument(span),
        );
        Ok(Response::new(ReceiverStream::new(out_rx)))
    }

    /// A client's cancel request for a tunnel: sent to the primary with the key of the
    /// tunnel's own backend. Takes no session slot: it is one short connection to the primary,
    /// and only for a key of a live tunnel.
    async fn cancel(
        &self,
        request: Request<TunnelCancel>,
    ) -> Result<Response<TunnelCancelled>, Status> {
        let this = self.0.get();
        let c = request.into_inner();
        let Some(t) = this.cancels.get((c.pid, c.key)) else {
            return Ok(Response::new(TunnelCancelled { found: false }));
        };
        pgclient::cancel(&this.cfg.primary, &t.host, t.pid, t.key)
            .await
            .map_err(|e| {
                warn!(primary = %t.host, "cannot relay a cancel request to the primary: {e}");
                Status::unavailable(format!("cannot send the primary a cancel request: {e}"))
            })?;
        info!(primary = %t.host, backend_pid = t.pid, "relayed a tunnelled client's cancel request to the primary");
        Ok(Response::new(TunnelCancelled { found: true }))
    }

    async fn stream(
        &self,
        request: Request<Streaming<ToUpstream>>,
    ) -> Result<Response<StreamOut>, Status> {
        let this = self.0.get();
        let (peer, permit) = admit(&this, &request, "link stream")?;
        let mut inbound = request.into_inner();
        let refused = |s: &Status| this.refused(&peer, "link stream", s);
        let hello = read_hello(&mut inbound).await.inspect_err(refused)?;
        let agreed = handshake::agree(
            &hello,
            &this.link,
            this.limits.max_message_bytes,
            this.cfg.slot.as_deref(),
        )
        .inspect_err(refused)?;
        info!(%peer, downstream = %hello.downstream_name, slot = %agreed.slot, "link stream opened");
        // The stream is answered now and opened on the primary in its task: that can take
        // each host of `upstream.primary` its connect_timeout, longer than the downstream
        // would wait for an answer at all, and the downstream waits for the Welcome as long
        // as the connection lives. An opening the downstream gave up on ends with it.
        let (tx, rx) = mpsc::channel(this.limits.queue_messages);
        let up = this.clone();
        let span = tracing::info_span!("link_stream", downstream = %hello.downstream_name, %peer);
        this.tasks.spawn(
            async move {
                let _permit = permit;
                let Some(feed) = opened(&up, &hello, &agreed, &tx).await else {
                    return;
                };
                let _gauge = GaugeGuard::inc(&up.metrics.sessions_active_upstream);
                Metrics::add(&up.metrics.sessions_total, 1);
                let end = run_stream(&up, feed, inbound, tx.clone(), &agreed).await;
                match &end {
                    Ok(()) => info!("link stream ended"),
                    Err(status) => {
                        Metrics::add(&up.metrics.ops.sessions_failed_upstream, 1);
                        warn!("link stream ended: {}", status.message());
                        let send = tx.send(Err(status.clone()));
                        let _ = tokio::time::timeout(Duration::from_secs(1), send).await;
                    }
                }
            }
            .instrument(span),
        );
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// A link stream's first message, its Hello, within [`HELLO_WAIT`].
async fn read_hello(inbound: &mut Streaming<ToUpstream>) -> Result<Hello, Status> {
    match tokio::time::timeout(HELLO_WAIT, inbound.next()).await {
        Ok(Some(Ok(ToUpstream {
            msg: Some(to_upstream::Msg::Hello(h)),
        }))) => Ok(h),
        Ok(Some(Ok(_))) => Err(Status::invalid_argument(
            "the first message of a link stream must be Hello",
        )),
        Ok(Some(Err(s))) => Err(Status::unavailable(format!(
            "the link stream failed before its Hello: {}",
            s.message()
        ))),
        Ok(None) => Err(Status::cancelled(
            "the downstream ended the stream before its Hello",
        )),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "no Hello within {} s of the link stream's start",
            HELLO_WAIT.as_secs()
        ))),
    }
}

/// The stream opened on the primary and its Welcome sent; None (and the downstream told why,
/// if it still listens) when that failed or the downstream went away first.
async fn opened(
    up: &Arc<Upstream>,
    hello: &Hello,
    agreed: &Agreed,
    tx: &mpsc::Sender<Result<ToDownstream, Status>>,
) -> Option<Feed> {
    let feed = tokio::select! {
        f = open_feed(up, hello, agreed) => f,
        _ = tx.closed() => {
            warn!("the downstream went away while the stream was being opened on the primary");
            return None;
        }
    };
    let feed = match feed {
        Ok(feed) => feed,
        Err(status) => {
            warn!("cannot start the stream: {}", status.message());
            Metrics::add(&up.metrics.ops.sessions_failed_upstream, 1);
            let _ = tokio::time::timeout(Duration::from_secs(1), tx.send(Err(status))).await;
            return None;
        }
    };
    let welcome = ToDownstream {
        msg: Some(to_downstream::Msg::Welcome(feed.welcome.clone())),
    };
    tx.send(Ok(welcome)).await.ok()?;
    Some(feed)
}

/// Runs a stream's two directions until either ends, then says goodbye to the primary.
async fn run_stream(
    up: &Arc<Upstream>,
    feed: Feed,
    inbound: Streaming<ToUpstream>,
    tx: mpsc::Sender<Result<ToDownstream, Status>>,
    agreed: &Agreed,
) -> Result<(), Status> {
    let Feed {
        conn,
        welcome,
        from,
        status_every,
    } = feed;
    let welcome = &welcome;
    let setup = Setup {
        kind: agreed.codec,
        zstd_level: up.link.zstd_level,
        window_log: agreed.window_log,
        wal: walcodec::CodecParams {
            pg_major: PgMajor::from_wire(welcome.pg_major),
            block_cache_bytes: agreed.block_cache_bytes,
            zstd_level: up.link.zstd_level,
            max_message_bytes: agreed.batch_max + agreed.hold_max,
        },
    };
    let encoder = WalEncoder::new(&setup).map_err(|e| Status::internal(e.to_string()))?;
    let (events_tx, events) = mpsc::channel(up.limits.queue_messages);
    let synchronous = Arc::new(AtomicUsize::new(0));
    let tli = welcome
        .switches
        .last()
        .map(|s| TimeLineId(s.timeline))
        .unwrap_or(TimeLineId(welcome.timeline));
    // The primary is told of no WAL before the downstream reports it durable.
    let (reports, durable, sent) = DurableReports::new(from, tli.0);
    let from_link =
        LinkToUpstream::new(up.clone(), inbound, reports, events_tx, synchronous.clone());
    let framer = encode::Framer::new(
        encoder,
        up.metrics.ops.codec.session(),
        up.metrics.clone(),
        agreed.hold_max,
    );
    let mut to_link = FeedToLink {
        conn,
        stage: encode::EncodeStage::spawn(framer, tx, sent, up.link.catch_up)?,
        events,
        metrics: &up.metrics,
        window: Duration::from_millis(up.link.batch_window_ms),
        batch_max: agreed.batch_max,
        synchronous: &synchronous,
        durable,
        slot: agreed.slot.clone(),
        tli,
        pending: None,
        status_every,
        last_status: tokio::time::Instant::now(),
        last_sent: tokio::time::Instant::now(),
        primary_end: from.0,
        silence: Silence::new(Some(PRIMARY_TIMEOUT), tokio::time::Instant::now()),
    };
    let end = tokio::select! {
        r = to_link.run() => r,
        r = from_link.run() => r,
        _ = up.shutdown.cancelled() => Err(Status::unavailable("the walrelay upstream is shutting down")),
    };
    // However the stream ended, the feed says goodbye to the primary.
    identity::terminate(&mut to_link.conn).await;
    end
}

/// Whether `synchronous_standby_names` on the primary lets a commit wait for the standby
/// named `app`; unreadable counts as yes (no batching is the safe side).
async fn synchronous(conn: &mut PrimaryConn, app: &str) -> bool {
    match conn.show("synchronous_standby_names").await {
        Ok(setting) => match syncrep::role(&setting, app) {
            Ok(role) => role == syncrep::SyncRole::Candidate,
            Err(e) => {
                warn!(application_name = %app, "{e}; sending this standby's WAL unbatched");
                true
            }
        },
        Err(e) => {
            warn!(application_name = %app, "cannot read synchronous_standby_names on the primary ({e}); sending this standby's WAL unbatched");
            true
        }
    }
}
