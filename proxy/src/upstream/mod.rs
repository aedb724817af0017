//! The upstream half (next to the primary): serves the link and, per standby session, runs a
//! physical replication connection to the primary on the standby's behalf.
//!
//! A session opens with the link handshake (`Hello` → primary connection → `Welcome`); then two
//! directions run concurrently until either ends, each a struct with a `run()`:
//! - [`to_link::PrimaryToLink`]: the primary's messages batched into link frames, WAL encoded
//!   by the session's codec;
//! - [`to_primary::LinkToPrimary`]: commands, the standby's feedback and CopyDone from link
//!   frames, verified, to the primary.
//!
//! Whether a session may batch: the primary's `synchronous_standby_names` is read on the
//! session's own connection before anything else; a standby it lists (or a setting that cannot
//! be read) gets no window, so a commit never waits for a batch. The setting is read again
//! when the standby reconnects.

mod to_link;
mod to_primary;

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};
use tracing::{info, warn, Instrument};

use walrelay_pgwire::{encode, syncrep};
use walrelay_proto::link::link_server::{Link, LinkServer};
use walrelay_proto::link::{to_downstream, to_upstream, Param, ToDownstream, ToUpstream, Welcome};
use walrelay_proto::PROTOCOL_VERSION;
use walrelay_wal::linkcodec::{Setup, WalEncoder};
use walrelay_wal::pg::PgMajor;
use walrelay_wal::walcodec;

use crate::config::{CodecKind, Limits, LinkConfig, ResolvedUpstream};
use crate::link::{self, CountingIo};
use crate::live::{Live, SessionSlots};
use crate::metrics::{GaugeGuard, Metrics};
use crate::monitor::{standbys::StandbyHandle, Half};
use crate::pgclient::{self, PrimaryConn};
use to_link::{PrimaryToLink, BATCH_MAX};
use to_primary::LinkToPrimary;

/// Shared state of the upstream half.
pub struct Upstream {
    pub cfg: ResolvedUpstream,
    pub link: LinkConfig,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    pub shutdown: CancellationToken,
    sessions: Arc<SessionSlots>,
    /// The session tasks, waited for (bounded) at shutdown.
    tasks: TaskTracker,
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
            cfg,
            link,
            limits,
            metrics,
            shutdown,
            sessions: SessionSlots::new(),
            tasks: TaskTracker::new(),
        })
    }

    /// The same half with reloaded settings for the sessions that open from now on (the
    /// session count, metrics and shutdown are shared with `self`).
    pub fn reconfigured(&self, cfg: ResolvedUpstream, limits: Limits) -> Arc<Upstream> {
        Arc::new(Upstream {
            cfg,
            link: self.link.clone(),
            limits,
            metrics: self.metrics.clone(),
            shutdown: self.shutdown.clone(),
            sessions: self.sessions.clone(),
            tasks: self.tasks.clone(),
        })
    }
}

/// Serves the link on `listener` until the shutdown token fires and sessions have ended. Each
/// link session uses the settings current in `live` when it opens.
pub async fn serve(live: Arc<Live<Upstream>>, listener: TcpListener) -> anyhow::Result<()> {
    use anyhow::Context;
    let up = live.get();
    let metrics = up.metrics.clone();
    let incoming = TcpListenerStream::new(listener).map(move |s| {
        s.map(|s| {
            let _ = s.set_nodelay(true);
            CountingIo::new(s, metrics.clone())
        })
    });
    let max = link::max_link_message(&up.limits);
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(up.link.keepalive_secs)))
        .initial_stream_window_size(Some(link::STREAM_WINDOW))
        .initial_connection_window_size(Some(link::CONNECTION_WINDOW))
        .http2_keepalive_timeout(Some(Duration::from_secs(up.link.keepalive_secs)));
    if let Some(tls) = link::server_tls(&up.link)? {
        builder = builder.tls_config(tls).context("link TLS configuration")?;
    }
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

type SessionStream = ReceiverStream<Result<ToDownstream, Status>>;

/// The gRPC service: one link session per standby session.
struct LinkService(Arc<Live<Upstream>>);

#[tonic::async_trait]
impl Link for LinkService {
    type SessionStream = SessionStream;

    async fn session(
        &self,
        request: Request<Streaming<ToUpstream>>,
    ) -> Result<Response<SessionStream>, Status> {
        let this = self.0.get();
        let peer = request
            .remote_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let permit = this
            .sessions
            .try_take(this.limits.max_sessions)
            .ok_or_else(|| {
                Status::resource_exhausted("the upstream has reached limits.max_sessions")
            })?;
        let mut inbound = request.into_inner();
        let hello = match tokio::time::timeout(Duration::from_secs(30), inbound.next()).await {
            Ok(Some(Ok(ToUpstream {
                msg: Some(to_upstream::Msg::Hello(h)),
                ..
            }))) => h,
            _ => {
                return Err(Status::invalid_argument(
                    "the first message of a link session must be Hello",
                ))
            }
        };
        if hello.protocol_version != PROTOCOL_VERSION {
            return Err(Status::failed_precondition(format!(
                "link protocol {} requested, this upstream speaks {PROTOCOL_VERSION}: run the same walrelay version on both halves",
                hello.protocol_version
            )));
        }
        let codec = CodecKind::from_name(&hello.codec)
            .ok_or_else(|| Status::invalid_argument(format!("unknown codec {:?}", hello.codec)))?;
        let window_log = this
            .link
            .zstd_window_log
            .min(hello.zstd_window_log_max.max(10));
        let app = if hello.application_name.is_empty() {
            "walrelay".to_string()
        } else {
            hello.application_name.clone()
        };
        info!(%peer, standby = %hello.standby_addr, application_name = %app, user = %hello.standby_user, "link session opened");
        let mut conn = pgclient::connect(&this.cfg.primary, &app, this.limits.max_message_bytes)
            .await
            .map_err(|e| {
                warn!(application_name = %app, "cannot open the primary connection: {e}");
                Status::unavailable(e.to_string())
            })?;
        if let Some(slot) = &this.cfg.slot {
            if conn.ensure_physical_slot(slot).await.map_err(|e| {
                Status::unavailable(format!("cannot create slot {slot:?} on the primary: {e}"))
            })? {
                info!(slot = %slot, "created physical replication slot on the primary");
            }
        }
        let pg_major = server_major(&conn.params);
        let synchronous = synchronous(&mut conn, &app).await;
        let window = match synchronous {
            true => Duration::ZERO,
            false => Duration::from_millis(this.link.batch_window_ms),
        };
        info!(application_name = %app, synchronous, batch_window_ms = window.as_millis() as u64, "standby's WAL batching decided from synchronous_standby_names");
        let setup = Setup {
            kind: codec,
            zstd_level: this.link.zstd_level,
            window_log,
            wal: walcodec::CodecParams {
                pg_major,
                block_cache_bytes: usize::try_from(
                    this.link.block_cache_bytes.min(hello.block_cache_bytes_max),
                )
                .map_err(|_| Status::invalid_argument("block_cache_bytes_max does not fit"))?,
                zstd_level: this.link.zstd_level,
                max_message_bytes: BATCH_MAX,
            },
        };
        let encoder = WalEncoder::new(&setup).map_err(|e| Status::internal(e.to_string()))?;
        let (tx, rx) = mpsc::channel(this.limits.queue_messages);
        let welcome = Welcome {
            protocol_version: PROTOCOL_VERSION,
            params: conn
                .params
                .iter()
                .map(|(name, value)| Param {
                    name: name.clone(),
                    value: value.clone(),
                })
                .collect(),
            codec: codec.name().into(),
            pg_major: PgMajor::to_wire(pg_major),
            block_cache_bytes: setup.wal.block_cache_bytes as u64,
            synchronous,
        };
        tx.send(Ok(ToDownstream {
            msg: Some(to_downstream::Msg::Welcome(welcome)),
        }))
        .await
        .map_err(|_| Status::cancelled("downstream went away"))?;
        let up = this.clone();
        let span = tracing::info_span!("link_session", application_name = %app, standby = %hello.standby_addr);
        this.tasks.spawn(
            async move {
                let _permit = permit;
                let _gauge = GaugeGuard::inc(&up.metrics.sessions_active_upstream);
                Metrics::add(&up.metrics.sessions_total, 1);
                let standby =
                    up.metrics
                        .ops
                        .standbys
                        .register(Half::Upstream, &app, &hello.standby_addr);
                standby.set_slot(up.cfg.slot.as_deref());
                let end =
                    run_session(&up, conn, inbound, tx.clone(), encoder, window, &standby).await;
                match &end {
                    Ok(()) => info!(application_name = %app, "link session ended"),
                    Err(status) => {
                        Metrics::add(&up.metrics.ops.sessions_failed_upstream, 1);
                        warn!(application_name = %app, "link session ended: {}", status.message());
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

async fn run_session(
    up: &Upstream,
    conn: PrimaryConn,
    inbound: Streaming<ToUpstream>,
    tx: mpsc::Sender<Result<ToDownstream, Status>>,
    encoder: WalEncoder,
    window: Duration,
    standby: &StandbyHandle,
) -> Result<(), Status> {
    let PrimaryConn {
        reader,
        mut writer,
        max_message_bytes,
        ..
    } = conn;
    let to_link = PrimaryToLink {
        reader,
        tx,
        encoder,
        metrics: &up.metrics,
        standby,
        max_message: max_message_bytes,
        window,
        codec_stats: up.metrics.ops.codec.session(),
        state: Default::default(),
        pending: None,
    };
    let to_primary = LinkToPrimary {
        inbound,
        writer: &mut writer,
        default_slot: up.cfg.slot.as_deref(),
        standby,
        state: Default::default(),
    };
    let end = tokio::select! {
        r = to_link.run() => r,
        r = to_primary.run() => r,
        _ = up.shutdown.cancelled() => Err(Status::unavailable("the walrelay upstream is shutting down")),
    };
    // However the session ended, tell the primary we are done (bounded: a primary that
    // stopped reading does not hold the session).
    let mut out = BytesMut::new();
    encode::terminate(&mut out);
    let _ = tokio::time::timeout(Duration::from_secs(1), writer.write_all(&out)).await;
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

/// The major version in the primary's `server_version` ("15.18 (Debian ...)", "18beta1");
/// `None` when absent, unreadable or unsupported, which makes the WAL codec pass everything
/// through raw.
pub fn server_major(params: &[(String, String)]) -> Option<PgMajor> {
    let v = params.iter().find(|(k, _)| k == "server_version")?;
    PgMajor::from_server_version(&v.1)
}
