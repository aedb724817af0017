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
//! 4. relaying: replication commands are parsed and validated here and travel structured;
//!    the primary's answers come back verbatim, XLogData decoded and verified (xxh3) before any
//!    byte reaches the standby; the standby's feedback goes back to the primary.
//!
//! Any link failure ends the standby's session with a FATAL error; the standby reconnects by
//! itself and resumes from its own position.

use std::net::SocketAddr;
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
use tracing::{debug, info, warn, Instrument};

use walrelay_proto::link::link_client::LinkClient;
use walrelay_proto::link::{to_downstream, to_upstream, Hello, ToDownstream, ToUpstream};
use walrelay_proto::PROTOCOL_VERSION;

use crate::config::{CodecKind, Limits, LinkConfig, ResolvedDownstream};
use crate::link;
use crate::live::{Live, SessionSlots};
use crate::metrics::{GaugeGuard, Metrics};
use crate::monitor::{standbys::StandbyHandle, Half};
use crate::pgclient::BoxIo;
use crate::pgio::MsgReader;
use walrelay_pgwire::repl::{check_feedback, keepalive_end, status_positions, XLogData};
use walrelay_pgwire::replcmd;
use walrelay_pgwire::{encode, parse_tagged, ErrorFields, FrontendMsg};
use walrelay_wal::linkcodec::{checksum, Setup, WalDecoder};
use walrelay_wal::walcodec;

mod startup;

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
        ..Default::default()
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
    let deadline = Duration::from_secs(ds.link_cfg.connect_timeout_secs + 30);
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
            pg_major: welcome.pg_major,
            block_cache_bytes: welcome.block_cache_bytes as usize,
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
    let (local_tx, local_rx) = mpsc::channel::<Bytes>(4);
    // Commands are served strictly in turn, as PostgreSQL does: after forwarding a command the
    // reader waits for a permit, added when its answer's ReadyForQuery (or CopyBothResponse)
    // has been written to the standby.
    let turns = Semaphore::new(0);
    let to_standby = link_to_standby(
        &mut inbound,
        local_rx,
        writer,
        &mut decoder,
        ds,
        &turns,
        &entry,
    );
    let from_standby = standby_to_link(reader, ltx, local_tx, &turns, &entry);
    tokio::pin!(to_standby, from_standby);
    let end = tokio::select! {
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
    };
    if matches!(&end, End::Fatal(e) if e.code == "XX001") && codec == CodecKind::Wal {
        ds.start_fallback();
    }
    end
}

/// Link → standby: the primary's messages verbatim, WAL decoded and verified, plus local
/// answers (errors for commands walrelay does not relay).
async fn link_to_standby(
    inbound: &mut tonic::Streaming<ToDownstream>,
    mut local: mpsc::Receiver<Bytes>,
    writer: &mut Writer,
    decoder: &mut WalDecoder,
    ds: &Downstream,
    turns: &Semaphore,
    entry: &StandbyHandle,
) -> End {
    let (metrics, max_len, shutdown) = (&*ds.metrics, ds.limits.max_message_bytes, &ds.shutdown);
    let mut out = BytesMut::new();
    let mut restored = Vec::new();
    let mut positions = link::WalPositions::default();
    // At shutdown: messages still delivered, from those already received.
    let mut drain: Option<usize> = None;
    loop {
        out.clear();
        let mut turns_done: usize = 0;
        // (primary's WAL end, end of the WAL delivered) for the standby's entry.
        let mut seen = (None, None);
        if let Some(left) = drain.as_mut() {
            if *left == 0 {
                return shutting_down();
            }
            *left -= 1;
        }
        tokio::select! {
            biased;
            _ = shutdown.cancelled(), if drain.is_none() => {
                drain = Some(DRAIN_MAX_MESSAGES);
                continue;
            }
            l = local.recv() => match l {
                Some(b) => {
                    out.extend_from_slice(&b);
                    turns_done = 1;
                }
                None => return End::Quiet,
            },
            m = inbound.next() => match m {
                // While this process shuts down, its own upstream half may end the link
                // first: the standby should hear the real reason.
                None if shutdown.is_cancelled() => return shutting_down(),
                Some(Err(_)) if shutdown.is_cancelled() => return shutting_down(),
                None => return End::fatal("08006", "walrelay: the upstream ended the session (the primary connection closed); the standby will reconnect"),
                Some(Err(status)) => return End::fatal("08006", format!("walrelay: link to the upstream lost: {}; the standby will reconnect and resume", status.message())),
                Some(Ok(ToDownstream { msg: Some(to_downstream::Msg::Backend(b)), backend_xxh3 })) => {
                    if checksum(&b) != backend_xxh3 {
                        Metrics::add(&metrics.integrity_failures, 1);
                        return End::fatal("XX001", "walrelay: a message from the primary failed verification on the link and was not delivered; the standby will reconnect and resume");
                    }
                    match check_framing(&b) {
                        Ok((n, keepalive)) => {
                            turns_done = n;
                            seen.0 = keepalive;
                        }
                        Err(e) => return End::fatal("08P01", format!("walrelay: malformed message from the upstream: {e}")),
                    }
                    out.extend_from_slice(&b);
                }
                Some(Ok(ToDownstream { msg: Some(to_downstream::Msg::Wal(w)), .. })) => {
                    let h = positions.decode(&w);
                    if h.checksum() != w.header_xxh3 {
                        Metrics::add(&metrics.integrity_failures, 1);
                        return End::fatal("XX001", format!("walrelay: the header of WAL near {} failed verification on the link, nothing of it was delivered; the standby will reconnect and resume", h.start));
                    }
                    Metrics::add(&metrics.ops.link_payload_bytes_received, w.payload.len() as u64);
                    if let Err(e) = crate::metrics::timed(&metrics.decode_ns, || decoder.decode(h.start, &w.payload, w.raw_len as usize, max_len, w.xxh3, &mut restored)) {
                        Metrics::add(&metrics.integrity_failures, 1);
                        return End::fatal("XX001", format!("walrelay: WAL from {} failed verification, nothing of it was delivered: {e}; the standby will reconnect and resume", h.start));
                    }
                    Metrics::add(&metrics.wal_bytes_delivered, restored.len() as u64);
                    seen = (Some(h.end), h.start.checked_add(restored.len() as u64));
                    XLogData { start: h.start, end: h.end, send_time: h.send_time, data: Bytes::copy_from_slice(&restored) }.encode_copy_data(&mut out);
                }
                Some(Ok(_)) => return End::fatal("08P01", "walrelay: unexpected message from the upstream"),
            },
            // Draining and nothing more has arrived: done.
            _ = std::future::ready(()), if drain.is_some() => return shutting_down(),
        }
        if writer.write_all(&out).await.is_err() {
            return End::Quiet;
        }
        turns.add_permits(turns_done);
        if let Some(end) = seen.0 {
            entry.primary_end(end);
        }
        if let Some(end) = seen.1 {
            entry.wal(end);
        }
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

/// Checks that `b` is a sequence of whole backend messages; returns how many of them end a
/// command's turn (ReadyForQuery, or CopyBothResponse which starts streaming), and the
/// primary's WAL end from a keepalive among them, if any.
fn check_framing(
    b: &Bytes,
) -> Result<(usize, Option<walrelay_wal::lsn::Lsn>), walrelay_pgwire::WireError> {
    let mut buf = BytesMut::from(&b[..]);
    let mut turns = 0;
    let mut keepalive = None;
    while !buf.is_empty() {
        match parse_tagged(&mut buf, |_| usize::MAX)? {
            Some(m) => {
                turns += usize::from(m.tag == b'Z' || m.tag == b'W');
                if m.tag == b'd' {
                    keepalive = keepalive.max(keepalive_end(&m.body));
                }
            }
            None => {
                return Err(walrelay_pgwire::WireError::Malformed {
                    tag: '?',
                    what: "truncated message",
                })
            }
        }
    }
    Ok((turns, keepalive))
}

/// Standby → link: commands validated and sent structured, feedback verbatim.
async fn standby_to_link(
    reader: &mut Reader,
    ltx: mpsc::Sender<ToUpstream>,
    local: mpsc::Sender<Bytes>,
    turns: &Semaphore,
    entry: &StandbyHandle,
) -> End {
    let link_gone = End::Quiet; // the other direction reports why
                                // Wait for the answer to the previous command before reading the next message.
    let mut awaiting = false;
    loop {
        if std::mem::take(&mut awaiting) {
            match turns.acquire().await {
                Ok(p) => p.forget(),
                Err(_) => return link_gone,
            }
        }
        let msg = match reader.read(walrelay_pgwire::parse_frontend).await {
            Ok(m) => m,
            Err(walrelay_pgwire::WireError::Closed) => return End::Quiet,
            Err(walrelay_pgwire::WireError::Io(e)) => {
                debug!("standby socket: {e}");
                return End::Quiet;
            }
            Err(e) => return End::fatal("08P01", format!("invalid message from the standby: {e}")),
        };
        let up = match msg {
            FrontendMsg::Query(q) => match replcmd::parse(&q) {
                Ok(cmd) => {
                    debug!(command = %q.trim(), "relaying replication command");
                    if let replcmd::ReplCommand::StartReplication { slot, .. } = &cmd {
                        entry.set_slot(slot.as_deref());
                    }
                    awaiting = true;
                    to_upstream::Msg::Command(link::command_to_proto(&cmd))
                }
                Err(e) => {
                    let mut out = BytesMut::new();
                    match e {
                        replcmd::ReplCmdError::Empty => encode::tagged(&mut out, b'I', |_| {}),
                        replcmd::ReplCmdError::Unsupported(_) => encode::error_response(&mut out, &ErrorFields::error("0A000", e.to_string())),
                        _ => encode::error_response(&mut out, &ErrorFields::error("42601", e.to_string())),
                    }
                    encode::ready_for_query(&mut out);
                    if local.send(out.freeze()).await.is_err() {
                        return link_gone;
                    }
                    awaiting = true;
                    continue;
                }
            },
            FrontendMsg::CopyData(d) => {
                if let Err(e) = check_feedback(&d) {
                    return End::fatal("08P01", format!("invalid message from the standby: {e}"));
                }
                if let Some((w, f, r)) = status_positions(&d) {
                    entry.reply(w, f, r);
                }
                to_upstream::Msg::Feedback(d)
            }
            FrontendMsg::CopyDone => {
                awaiting = true; // the primary ends the command with ReadyForQuery
                to_upstream::Msg::CopyDone(walrelay_proto::link::CopyDone {})
            }
            FrontendMsg::Terminate => return End::Quiet,
            FrontendMsg::CopyFail(why) => return End::fatal("57014", format!("COPY failed: {why}")),
            FrontendMsg::Password(_) => return End::fatal("08P01", "unexpected password message after authentication"),
            FrontendMsg::Other(tag) => {
                return End::fatal("08P01", format!("unexpected message type '{}' (walrelay serves the replication protocol's simple queries only)", tag.escape_ascii()))
            }
        };
        let xxh3 = link::upstream_checksum(&up);
        if ltx
            .send(ToUpstream {
                msg: Some(up),
                xxh3,
            })
            .await
            .is_err()
        {
            return link_gone;
        }
    }
}
