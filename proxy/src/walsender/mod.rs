//! The downstream half (next to the standbys): a walsender that unmodified PostgreSQL standbys
//! and pg_receivewal connect to.
//!
//! A connection goes through:
//! 1. startup: SSLRequest answered 'S' (TLS) when `downstream.tls_cert` is set, else 'N';
//!    GSSENCRequest 'N'; PG 17+ direct TLS (first byte 0x16, ALPN `postgresql`); only physical
//!    replication connections (`replication=true`) are served;
//! 2. authentication: SCRAM-SHA-256 against `downstream.users`, or trust;
//! 3. a link session to the upstream, which connects to the primary as this standby; the
//!    primary's ParameterStatus values go to the standby (walrelay speaks with the primary's
//!    voice);
//! 4. relaying, two directions each a struct with a `run()`: [`to_standby::LinkToStandby`]
//!    restores link frames (the primary's answers verbatim, WAL decoded) and verifies each
//!    frame's checksum before any of its bytes reaches the standby;
//!    [`to_link::StandbyToLink`] sends replication commands (parsed and validated here,
//!    structured on the link) and the standby's feedback (compact, the latest of each kind
//!    coalesced within `link.batch_window_ms` unless the session is synchronous).
//!
//! Any link failure ends the standby's session with a FATAL error; the standby reconnects by
//! itself and resumes from its own position.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::Channel;
use tracing::{info, warn, Instrument};

use walrelay_pgwire::{encode, ErrorFields};
use walrelay_proto::link::link_client::LinkClient;
use walrelay_proto::link::{to_downstream, to_upstream, Hello, ToDownstream, ToUpstream, Welcome};
use walrelay_proto::PROTOCOL_VERSION;
use walrelay_wal::linkcodec::{Setup, WalDecoder};
use walrelay_wal::walcodec;

use crate::config::{CodecKind, Limits, LinkConfig, ResolvedDownstream};
use crate::link;
use crate::live::{Live, SessionSlots};
use crate::metrics::{GaugeGuard, Metrics};
use crate::monitor::{standbys::StandbyHandle, Half};
use crate::pgclient::BoxIo;
use crate::pgio::MsgReader;
use to_link::StandbyToLink;
use to_standby::LinkToStandby;

mod startup;
mod to_link;
mod to_standby;

/// Shared state of the downstream half.
pub struct Downstream {
    pub cfg: ResolvedDownstream,
    pub link_cfg: LinkConfig,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    pub shutdown: CancellationToken,
    channel: Channel,
    tls: Option<tokio_rustls::TlsAcceptor>,
    sessions: Arc<SessionSlots>,
    /// After WAL failed verification with the `wal` codec, sessions use plain `zstd` until
    /// then, so a codec bug can never keep a standby from replicating.
    fallback_until: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
}

/// How long sessions use plain zstd after an integrity failure of the `wal` codec.
const CODEC_FALLBACK: Duration = Duration::from_secs(600);

impl Downstream {
    pub fn new(
        cfg: ResolvedDownstream,
        link_cfg: LinkConfig,
        limits: Limits,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Arc<Downstream>> {
        let channel = link::client_channel_counted(&link_cfg, &cfg.upstream, metrics.clone())?;
        let tls = match &cfg.tls {
            Some((cert, key)) => Some(tokio_rustls::TlsAcceptor::from(
                crate::tls::standby_server_config(cert, key)?,
            )),
            None => None,
        };
        Ok(Arc::new(Downstream {
            cfg,
            link_cfg,
            limits,
            metrics,
            shutdown,
            channel,
            tls,
            sessions: SessionSlots::new(),
            fallback_until: Arc::default(),
        }))
    }

    /// The same half with reloaded users, auth method and limits for the connections that
    /// arrive from now on. The listener, the link and TLS stay as they are (they need a
    /// restart), and so do the session count and the codec fallback.
    pub fn reconfigured(&self, cfg: &ResolvedDownstream, limits: Limits) -> Arc<Downstream> {
        Arc::new(Downstream {
            cfg: ResolvedDownstream {
                auth: cfg.auth,
                users: cfg.users.clone(),
                ..self.cfg.clone()
            },
            link_cfg: self.link_cfg.clone(),
            limits,
            metrics: self.metrics.clone(),
            shutdown: self.shutdown.clone(),
            channel: self.channel.clone(),
            tls: self.tls.clone(),
            sessions: self.sessions.clone(),
            fallback_until: self.fallback_until.clone(),
        })
    }
}

impl Downstream {
    /// The codec to ask for: the configured one, or `zstd` during a fallback.
    fn session_codec(&self) -> CodecKind {
        let until = *self
            .fallback_until
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match (self.link_cfg.codec, until) {
            (CodecKind::Wal, Some(t)) if std::time::Instant::now() < t => CodecKind::Zstd,
            (c, _) => c,
        }
    }

    fn start_fallback(&self) {
        warn!("WAL failed verification with the wal codec: sessions use plain zstd for the next {} s (please report this with the log)", CODEC_FALLBACK.as_secs());
        *self
            .fallback_until
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(std::time::Instant::now() + CODEC_FALLBACK);
    }
}

/// Accepts standbys until shutdown, then waits (bounded by `limits.drain_timeout_secs`) for
/// their sessions to end; sessions themselves end at shutdown with a FATAL like PostgreSQL's,
/// after the WAL already received from the link (at most [`DRAIN_MAX_MESSAGES`] messages).
/// Each connection uses the settings current in `live` when it arrives.
pub async fn serve(live: Arc<Live<Downstream>>, listener: TcpListener) {
    let tracker = TaskTracker::new();
    let shutdown = live.get().shutdown.clone();
    loop {
        let (sock, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    warn!("accept on the standby listener failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let ds = live.get();
        let span = tracing::info_span!("standby", %peer);
        tracker.spawn(handle_connection(ds, sock, peer).instrument(span));
    }
    tracker.close();
    if tokio::time::timeout(
        Duration::from_secs(live.get().limits.drain_timeout_secs),
        tracker.wait(),
    )
    .await
    .is_err()
    {
        warn!("standby sessions did not end within limits.drain_timeout_secs; cutting them");
    }
}

/// What a session tells the standby before closing, if anything.
#[derive(Debug)]
pub(crate) enum End {
    /// The standby left (Terminate or EOF) or asked to cancel.
    Quiet,
    /// Send this error, then close.
    Fatal(ErrorFields),
}

impl End {
    fn fatal(code: &str, msg: impl Into<String>) -> End {
        End::Fatal(ErrorFields::fatal(code, msg))
    }
}

async fn handle_connection(ds: Arc<Downstream>, sock: TcpStream, peer: SocketAddr) {
    let _ = sock.set_nodelay(true);
    let Some(_slot) = ds.sessions.try_take(ds.limits.max_sessions) else {
        warn!(%peer, "refusing standby connection: limits.max_sessions reached");
        let mut sock = sock;
        let mut out = BytesMut::new();
        encode::error_response(
            &mut out,
            &ErrorFields::fatal(
                "53300",
                "sorry, too many clients already (walrelay limits.max_sessions)",
            ),
        );
        let _ = sock.write_all(&out).await;
        return;
    };
    let _gauge = GaugeGuard::inc(&ds.metrics.sessions_active_downstream);
    let auth_timeout = Duration::from_secs(ds.limits.auth_timeout_secs);
    let started = tokio::time::timeout(auth_timeout, startup::accept(&ds, sock, peer)).await;
    let (mut reader, mut writer, standby) = match started {
        Ok(Ok(s)) => s,
        Ok(Err((writer, end))) => {
            if let (Some(mut w), End::Fatal(e)) = (writer, &end) {
                send_error(&mut w, e).await;
            }
            return;
        }
        Err(_) => {
            warn!(%peer, "standby did not complete startup within limits.auth_timeout_secs");
            return;
        }
    };
    let end = tokio::select! {
        end = relay(&ds, &mut reader, &mut writer, &standby) => end,
        // The session ends by itself at shutdown (see link_to_standby); this cuts one whose
        // standby stopped reading, mid-message, so nothing more is written to it.
        _ = async {
            ds.shutdown.cancelled().await;
            tokio::time::sleep(Duration::from_secs(ds.limits.drain_timeout_secs)).await;
        } => {
            warn!(%peer, application_name = %standby.application_name, "standby session cut: it did not end within limits.drain_timeout_secs");
            return;
        }
    };
    match &end {
        End::Quiet => {
            info!(%peer, application_name = %standby.application_name, "standby session ended")
        }
        End::Fatal(e) => {
            Metrics::add(&ds.metrics.ops.sessions_failed_downstream, 1);
            warn!(%peer, application_name = %standby.application_name, "standby session ended: {}", e.message);
            send_error(&mut writer, e).await;
        }
    }
}

async fn send_error<W: AsyncWrite + Unpin>(w: &mut W, e: &ErrorFields) {
    let mut out = BytesMut::new();
    encode::error_response(&mut out, e);
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let _ = w.write_all(&out).await;
        let _ = w.shutdown().await;
    })
    .await;
}

/// Who is connected, as established during startup.
pub(crate) struct Standby {
    pub peer: SocketAddr,
    pub user: String,
    pub application_name: String,
}

type Reader = MsgReader<tokio::io::ReadHalf<BoxIo>>;
type Writer = tokio::io::WriteHalf<BoxIo>;

/// Opens the link session, finishes the standby's startup with the primary's parameters, then
/// relays until either side ends.
async fn relay(
    ds: &Downstream,
    reader: &mut Reader,
    writer: &mut Writer,
    standby: &Standby,
) -> End {
    let (ltx, lrx) = mpsc::channel::<ToUpstream>(ds.limits.queue_messages);
    let hello = Hello {
        protocol_version: PROTOCOL_VERSION,
        application_name: standby.application_name.clone(),
        standby_user: standby.user.clone(),
        codec: ds.session_codec().name().into(),
        standby_addr: standby.peer.to_string(),
        zstd_window_log_max: ds.link_cfg.zstd_window_log,
        block_cache_bytes_max: ds.link_cfg.block_cache_bytes,
    };
    let _ = ltx.try_send(ToUpstream {
        msg: Some(to_upstream::Msg::Hello(hello)),
    });
    let max = link::max_link_message(&ds.limits);
    let mut client = LinkClient::new(ds.channel.clone())
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    let unreachable = |why: String| {
        End::Fatal(
            ErrorFields::fatal("08006", format!("walrelay cannot reach the primary through the upstream at {}: {why}", ds.cfg.upstream))
                .with_hint("check that the upstream half runs and can connect to the primary; the standby retries by itself"),
        )
    };
    let open = async {
        let mut inbound = client.session(ReceiverStream::new(lrx)).await?.into_inner();
        let first = inbound.next().await.transpose()?;
        Ok::<_, tonic::Status>((inbound, first))
    };
    let deadline = Duration::from_secs(ds.link_cfg.connect_timeout_secs.saturating_add(30));
    let open = tokio::select! {
        r = tokio::time::timeout(deadline, open) => r,
        _ = ds.shutdown.cancelled() => return shutting_down(),
    };
    let (mut inbound, welcome) = match open {
        Err(_) => return unreachable("timed out".into()),
        Ok(Err(status)) => return unreachable(status.message().to_string()),
        Ok(Ok((
            inbound,
            Some(ToDownstream {
                msg: Some(to_downstream::Msg::Welcome(w)),
                ..
            }),
        ))) => (inbound, w),
        Ok(Ok(_)) => return unreachable("the upstream did not answer with Welcome".into()),
    };
    let Some(codec) = CodecKind::from_name(&welcome.codec) else {
        return unreachable(format!(
            "the upstream chose unknown codec {:?}",
            welcome.codec
        ));
    };
    if welcome.block_cache_bytes > ds.link_cfg.block_cache_bytes {
        return unreachable(format!(
            "the upstream wants a {} byte block cache, more than link.block_cache_bytes",
            welcome.block_cache_bytes
        ));
    }
    let setup = Setup {
        kind: codec,
        zstd_level: ds.link_cfg.zstd_level,
        window_log: ds.link_cfg.zstd_window_log,
        wal: walcodec::CodecParams {
            pg_major: walrelay_wal::pg::PgMajor::from_wire(welcome.pg_major),
            block_cache_bytes: match usize::try_from(welcome.block_cache_bytes) {
                Ok(n) => n,
                Err(_) => {
                    return unreachable("the upstream's block_cache_bytes does not fit".into())
                }
            },
            zstd_level: ds.link_cfg.zstd_level,
            max_message_bytes: ds.limits.max_message_bytes,
        },
    };
    let mut decoder = match WalDecoder::new(&setup) {
        Ok(d) => d,
        Err(e) => {
            return End::fatal(
                "XX000",
                format!("walrelay: cannot set up the {} decoder: {e}", codec.name()),
            )
        }
    };
    let mut out = BytesMut::new();
    encode::auth_ok(&mut out);
    for p in &welcome.params {
        encode::parameter_status(&mut out, &p.name, &p.value);
    }
    encode::backend_key_data(&mut out, rand::random(), rand::random());
    encode::ready_for_query(&mut out);
    if writer.write_all(&out).await.is_err() {
        return End::Quiet;
    }
    info!(peer = %standby.peer, application_name = %standby.application_name, codec = codec.name(), "standby session relayed to the primary");
    Metrics::add(&ds.metrics.ops.sessions_started_downstream, 1);
    let entry = ds.metrics.ops.standbys.register(
        Half::Downstream,
        &standby.application_name,
        &standby.peer.to_string(),
    );
    let end = run_directions(
        ds,
        reader,
        writer,
        &mut inbound,
        ltx,
        &mut decoder,
        &welcome,
        &entry,
    )
    .await;
    if matches!(&end, End::Fatal(e) if e.code == "XX001") && codec == CodecKind::Wal {
        ds.start_fallback();
    }
    end
}

/// Runs both directions of a relayed session until either ends.
#[allow(clippy::too_many_arguments)]
async fn run_directions(
    ds: &Downstream,
    reader: &mut Reader,
    writer: &mut Writer,
    inbound: &mut tonic::Streaming<ToDownstream>,
    ltx: mpsc::Sender<ToUpstream>,
    decoder: &mut WalDecoder,
    welcome: &Welcome,
    entry: &StandbyHandle,
) -> End {
    let (local_tx, local_rx) = mpsc::channel::<Bytes>(4);
    // Commands are served strictly in turn, as PostgreSQL does: after forwarding a command the
    // reader waits for a permit, added when its answer's ReadyForQuery (or CopyBothResponse)
    // has been written to the standby.
    let turns = Semaphore::new(0);
    let reply_wanted = AtomicBool::new(false);
    let to_standby = LinkToStandby {
        inbound,
        local: local_rx,
        writer,
        decoder,
        ds,
        turns: &turns,
        entry,
        reply_wanted: &reply_wanted,
        state: Default::default(),
    }
    .run();
    let window = match welcome.synchronous {
        true => Duration::ZERO,
        false => Duration::from_millis(ds.link_cfg.batch_window_ms),
    };
    let from_standby = StandbyToLink {
        reader,
        ltx,
        local: local_tx,
        turns: &turns,
        entry,
        metrics: &ds.metrics,
        window,
        reply_wanted: &reply_wanted,
        state: Default::default(),
        status: None,
        hs: None,
        deadline: None,
    }
    .run();
    tokio::pin!(to_standby, from_standby);
    tokio::select! {
        end = &mut to_standby => end,
        // The standby left, or the link went away: in the latter case the other direction
        // knows why (e.g. the upstream shutting down), and the standby should hear it.
        end = &mut from_standby => match end {
            End::Quiet if ds.shutdown.is_cancelled() => {
                // Draining: the other direction is delivering what already arrived; give it
                // half the drain time, and say goodbye in any case.
                let wait = Duration::from_secs(ds.limits.drain_timeout_secs) / 2;
                tokio::time::timeout(wait, &mut to_standby)
                    .await
                    .unwrap_or_else(|_| shutting_down())
            }
            End::Quiet => tokio::time::timeout(Duration::from_secs(1), &mut to_standby)
                .await
                .unwrap_or(End::Quiet),
            end => end,
        },
    }
}

/// At shutdown, most link messages a session still delivers from what has already arrived
/// before it ends (a bound, so an upstream that keeps sending cannot hold the drain).
pub const DRAIN_MAX_MESSAGES: usize = 256;

fn shutting_down() -> End {
    End::fatal(
        "57P01",
        "terminating connection due to administrator command (walrelay is shutting down)",
    )
}
