//! The upstream half (next to the primary): serves the link and, per standby session, runs a
//! physical replication connection to the primary on the standby's behalf.
//!
//! Per session two loops run concurrently until either ends:
//! - primary → link: backend messages are read (capped at `limits.max_message_bytes`); XLogData
//!   payloads are encoded by the session's codec (flushed per message, nothing held back) and
//!   sent as `Wal`; every other message goes verbatim. The send waits when the session's queue
//!   (`limits.queue_messages`) is full, so a slow link pauses reading from the primary instead
//!   of buffering.
//! - link → primary: validated replication commands become queries; the standby's feedback
//!   (write/flush/apply positions, hot-standby feedback) becomes CopyData, so the primary's
//!   `pg_stat_replication` and synchronous replication reflect the real standby.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};
use tracing::{info, warn, Instrument};

use walrelay_proto::link::link_server::{Link, LinkServer};
use walrelay_proto::link::{
    to_downstream, to_upstream, Param, ToDownstream, ToUpstream, Wal, Welcome,
};
use walrelay_proto::PROTOCOL_VERSION;

use crate::bench::shadow::ShadowZstd;
use crate::config::{CodecKind, Limits, LinkConfig, ResolvedUpstream};
use crate::link::{self, CountingIo, WalHeader};
use crate::live::{Live, SessionSlots};
use crate::metrics::{GaugeGuard, Metrics};
use crate::monitor::{standbys::StandbyHandle, Half};
use crate::pgclient::{self, PrimaryConn};
use crate::pgio::MsgReader;
use walrelay_pgwire::repl::{check_feedback, keepalive_end, status_positions, XLogData};
use walrelay_pgwire::{encode, parse_tagged, RawMsg, WireError};
use walrelay_wal::linkcodec::{checksum, Setup, WalEncoder};
use walrelay_wal::walcodec;

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
        let setup = Setup {
            kind: codec,
            zstd_level: this.link.zstd_level,
            window_log,
            wal: walcodec::CodecParams {
                pg_major,
                block_cache_bytes: this.link.block_cache_bytes.min(hello.block_cache_bytes_max)
                    as usize,
                zstd_level: this.link.zstd_level,
                max_message_bytes: COALESCE_MAX,
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
            pg_major,
            block_cache_bytes: setup.wal.block_cache_bytes as u64,
        };
        tx.send(Ok(ToDownstream {
            msg: Some(to_downstream::Msg::Welcome(welcome)),
            ..Default::default()
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
                let end = run_session(&up, conn, inbound, tx.clone(), encoder, &standby).await;
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
    standby: &StandbyHandle,
) -> Result<(), Status> {
    let PrimaryConn {
        reader,
        mut writer,
        max_message_bytes,
        ..
    } = conn;
    let end = tokio::select! {
        r = primary_to_link(reader, tx, encoder, &up.metrics, max_message_bytes, up.link.bench_shadow_zstd, standby) => r,
        r = link_to_primary(inbound, &mut writer, up.cfg.slot.as_deref(), standby) => r,
        _ = up.shutdown.cancelled() => Err(Status::unavailable("the walrelay upstream is shutting down")),
    };
    // However the session ended, tell the primary we are done (bounded: a primary that
    // stopped reading does not hold the session).
    let mut out = BytesMut::new();
    encode::terminate(&mut out);
    let _ = tokio::time::timeout(Duration::from_secs(1), writer.write_all(&out)).await;
    end
}

fn primary_gone(e: WireError) -> Status {
    match e {
        WireError::Closed => Status::unavailable("the primary closed the replication connection"),
        e => Status::unavailable(format!("primary connection: {e}")),
    }
}

/// The major version in the primary's `server_version` ("15.18 (Debian ...)", "18beta1"); 0
/// when absent or unreadable, which makes the WAL codec pass everything through raw.
pub fn server_major(params: &[(String, String)]) -> u32 {
    let v = params
        .iter()
        .find(|(k, _)| k == "server_version")
        .map(|(_, v)| v.as_str())
        .unwrap_or("");
    v.chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or(0)
}

/// Most WAL bytes coalesced into one link message (within the smallest allowed
/// `limits.max_message_bytes`, so any downstream accepts it).
const COALESCE_MAX: usize = 256 * 1024;

async fn primary_to_link<R: AsyncRead + Unpin>(
    mut reader: MsgReader<R>,
    tx: mpsc::Sender<Result<ToDownstream, Status>>,
    mut encoder: WalEncoder,
    metrics: &Metrics,
    max: usize,
    shadow: bool,
    standby: &StandbyHandle,
) -> Result<(), Status> {
    let mut codec_stats = metrics.ops.codec.session();
    let mut shadow = match shadow {
        true => Some(ShadowZstd::new(COALESCE_MAX).map_err(|e| Status::internal(e.to_string()))?),
        false => None,
    };
    let mut encoded = Vec::new();
    let mut positions = link::WalPositions::default();
    let mut pending: Option<RawMsg> = None;
    loop {
        let m = match pending.take() {
            Some(m) => m,
            None => reader
                .read(|b| parse_tagged(b, |_| max))
                .await
                .map_err(primary_gone)?,
        };
        // (primary's WAL end, end of the WAL in this message) for the standby's entry.
        let mut seen = (None, None);
        let msg = match (m.tag, XLogData::parse(&m.body).map_err(primary_gone)?) {
            (b'd', Some(first)) => {
                // Coalesce contiguous XLogData messages that are already here; never wait.
                let mut header = WalHeader {
                    start: first.start,
                    end: first.end,
                    send_time: first.send_time,
                    raw_len: 0,
                };
                let mut data = BytesMut::from(&first.data[..]);
                while data.len() < COALESCE_MAX {
                    let Some(next) = reader
                        .try_read(|b| parse_tagged(b, |_| max))
                        .map_err(primary_gone)?
                    else {
                        break;
                    };
                    match XLogData::parse(&next.body).map_err(primary_gone)? {
                        Some(x)
                            if next.tag == b'd'
                                && x.start.0 == header.start.0 + data.len() as u64
                                && data.len() + x.data.len() <= COALESCE_MAX =>
                        {
                            data.extend_from_slice(&x.data);
                            header.end = x.end;
                            header.send_time = x.send_time;
                        }
                        _ => {
                            pending = Some(next);
                            break;
                        }
                    }
                }
                header.raw_len = data.len() as u32;
                Metrics::add(&metrics.wal_bytes_in, data.len() as u64);
                if let Some(sh) = shadow.as_mut() {
                    sh.observe(header.start, &data, metrics)
                        .map_err(|e| Status::internal(format!("bench shadow zstd: {e}")))?;
                }
                crate::metrics::timed(&metrics.encode_ns, || {
                    encoder.encode(header.start, &data, &mut encoded)
                })
                .map_err(|e| Status::internal(format!("encoding WAL at {}: {e}", header.start)))?;
                Metrics::add(&metrics.wal_payload_bytes_out, encoded.len() as u64);
                codec_stats.observe(&encoder, &metrics.ops.codec);
                seen = (
                    Some(header.end),
                    header.start.checked_add(data.len() as u64),
                );
                let mut wal = Wal {
                    payload: std::mem::take(&mut encoded).into(),
                    xxh3: checksum(&data),
                    ..Default::default()
                };
                positions.encode(&header, &mut wal);
                to_downstream::Msg::Wal(wal)
            }
            _ => {
                if m.tag == b'd' {
                    seen.0 = keepalive_end(&m.body);
                }
                let mut out = BytesMut::with_capacity(m.body.len() + 5);
                m.encode(&mut out);
                to_downstream::Msg::Backend(out.freeze())
            }
        };
        Metrics::add(&metrics.link_messages_out, 1);
        let backend_xxh3 = match &msg {
            to_downstream::Msg::Backend(b) => checksum(b),
            _ => 0,
        };
        tx.send(Ok(ToDownstream {
            msg: Some(msg),
            backend_xxh3,
        }))
        .await
        .map_err(|_| Status::cancelled("the downstream went away"))?;
        if let Some(end) = seen.0 {
            standby.primary_end(end);
        }
        if let Some(end) = seen.1 {
            standby.wal(end);
        }
    }
}

async fn link_to_primary<W: AsyncWrite + Unpin>(
    mut inbound: Streaming<ToUpstream>,
    mut writer: W,
    slot: Option<&str>,
    standby: &StandbyHandle,
) -> Result<(), Status> {
    let mut out = BytesMut::new();
    while let Some(msg) = inbound.next().await {
        let msg = msg.map_err(|s| Status::unavailable(format!("link: {}", s.message())))?;
        if msg
            .msg
            .as_ref()
            .is_some_and(|m| link::upstream_checksum(m) != msg.xxh3)
        {
            return Err(Status::data_loss(
                "a message from the standby failed verification on the link and was not passed to the primary",
            ));
        }
        out.clear();
        match msg.msg {
            Some(to_upstream::Msg::Command(c)) => {
                let cmd = link::command_from_proto(c, slot)?;
                if let walrelay_pgwire::replcmd::ReplCommand::StartReplication { slot, .. } = &cmd {
                    standby.set_slot(slot.as_deref());
                }
                encode::query(&mut out, &cmd.to_sql());
            }
            Some(to_upstream::Msg::Feedback(b)) => {
                check_feedback(&b).map_err(|e| Status::invalid_argument(e.to_string()))?;
                if let Some((w, f, r)) = status_positions(&b) {
                    standby.reply(w, f, r);
                }
                encode::copy_data(&mut out, &b);
            }
            Some(to_upstream::Msg::CopyDone(_)) => encode::copy_done(&mut out),
            Some(to_upstream::Msg::Hello(_)) | None => {
                return Err(Status::invalid_argument(
                    "unexpected message on the link session",
                ))
            }
        }
        writer
            .write_all(&out)
            .await
            .map_err(|e| Status::unavailable(format!("writing to the primary: {e}")))?;
    }
    // The downstream closed its side; run_session tells the primary.
    Ok(())
}
