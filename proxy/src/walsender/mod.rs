//! The downstream half (next to the standbys): a walsender that unmodified PostgreSQL standbys
//! and pg_receivewal connect to, serving WAL from the spool.
//!
//! A connection goes through:
//! 0. the pre-authentication budget ([`crate::gate`]): a place among `limits.max_startups`
//!    (`limits.max_startups_per_address` per source) until it has authenticated, and
//!    `limits.startup_timeout_secs` to send its startup packet; its `limits.max_sessions` slot
//!    is taken only after authentication;
//! 1. startup ([`startup`]): SSLRequest answered 'S' (TLS) when `downstream.tls_cert` is set,
//!    else 'N'; GSSENCRequest 'N'; PG 17+ direct TLS (first byte 0x16, ALPN `postgresql`);
//!    physical replication connections (`replication=true`) are served from the spool, the
//!    others go to a tunnel; authentication:
//!    SCRAM-SHA-256 against `downstream.users`, or trust;
//! 2. the startup reply with the primary's parameters (walrelay speaks with the primary's
//!    voice; they are kept in the spool so standbys can connect while the link is down);
//! 3. a tunnel ([`tunnel`]) for logical replication and SQL sessions, and for a
//!    physical session from its BASE_BACKUP or slot command on; or
//! 4. a session ([`session`], [`commands`]): replication commands, answered from the spool
//!    (IDENTIFY_SYSTEM, TIMELINE_HISTORY) or by the standby's own connection to the primary
//!    through the stream (SHOW, READ_REPLICATION_SLOT); START_REPLICATION serves WAL from the
//!    spool ([`streamer`]) exactly as a walsender does (timelines, keepalives, errors), while
//!    the standby's own connection to the primary streams as it and carries its feedback.
//!
//! A link cut ends no session: standbys get what is spooled, then keepalives, and catch up
//! when the link is back.

mod commands;
mod session;
mod startup;
mod streamer;
pub(crate) mod tunnel;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn, Instrument};

use walrelay_pgwire::scram::MockParams;
use walrelay_pgwire::{encode, ErrorFields};

use crate::cancelkeys::{self, CancelKeys};
use crate::config::{Limits, LinkConfig, ResolvedDownstream};
use crate::gate::{Refused, StartupGate};
use crate::live::{Live, SessionSlots};
use crate::metrics::{GaugeGuard, Metrics};
use crate::pgclient::BoxIo;
use crate::pgio::MsgReader;
use crate::spooler::Spooler;
use crate::tlsfiles::Swap;

/// Shared state of the downstream half.
pub struct Downstream {
    pub cfg: ResolvedDownstream,
    pub link_cfg: LinkConfig,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    pub shutdown: CancellationToken,
    pub spooler: Arc<Spooler>,
    /// TLS toward standbys (None: not configured), replaced by a reload whose TLS files
    /// changed ([`Downstream::reload_tls`]).
    tls: Swap<Option<tokio_rustls::TlsAcceptor>>,
    sessions: Arc<SessionSlots>,
    /// Connections in startup and authentication (they hold no session slot yet).
    startups: Arc<StartupGate>,
    /// Cancel keys of the live tunnels (cancel requests for others are dropped).
    cancels: Arc<CancelKeys<()>>,
    /// What unknown users' SCRAM exchanges look like, from `cfg.users` (derived with them).
    mock: MockParams,
}

impl Downstream {
    pub fn new(
        cfg: ResolvedDownstream,
        link_cfg: LinkConfig,
        limits: Limits,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Arc<Downstream>> {
        let spooler = Spooler::new(
            cfg.clone(),
            link_cfg.clone(),
            limits.clone(),
            metrics.clone(),
            shutdown.clone(),
        )?;
        tokio::spawn(spooler.clone().run());
        let tls = Swap::new(standby_tls(&cfg)?);
        Ok(Arc::new(Downstream {
            mock: MockParams::from_verifiers(cfg.users.values()),
            cfg,
            link_cfg,
            limits,
            metrics,
            shutdown,
            spooler,
            tls,
            sessions: SessionSlots::new(),
            startups: StartupGate::new(),
            cancels: CancelKeys::new(),
        }))
    }

    /// The same half with reloaded users, auth method and limits for the connections that
    /// arrive from now on. The listener, the spooler (link, spool) and TLS stay as they are
    /// (they need a restart), and so does the session count; the spooler's next link stream
    /// takes the new `limits.queue_messages`.
    pub fn reconfigured(&self, cfg: &ResolvedDownstream, limits: Limits) -> Arc<Downstream> {
        self.spooler.set_queue_messages(limits.queue_messages);
        Arc::new(Downstream {
            mock: MockParams::from_verifiers(cfg.users.values()),
            cfg: ResolvedDownstream {
                auth: cfg.auth,
                users: cfg.users.clone(),
                allow_slot_commands: cfg.allow_slot_commands,
                allow_sql: cfg.allow_sql,
                ..self.cfg.clone()
            },
            link_cfg: self.link_cfg.clone(),
            limits,
            metrics: self.metrics.clone(),
            shutdown: self.shutdown.clone(),
            spooler: self.spooler.clone(),
            tls: self.tls.clone(),
            sessions: self.sessions.clone(),
            startups: self.startups.clone(),
            cancels: self.cancels.clone(),
        })
    }
}

/// TLS toward standbys as `cfg` configures it now (None: not configured).
fn standby_tls(
    cfg: &ResolvedDownstream,
) -> Result<Option<tokio_rustls::TlsAcceptor>, crate::tls::TlsError> {
    cfg.tls
        .as_ref()
        .map(|(cert, key)| {
            crate::tls::standby_server_config(cert, key).map(tokio_rustls::TlsAcceptor::from)
        })
        .transpose()
}

impl Downstream {
    /// Reads the TLS files again, toward standbys and toward the upstream: connections made
    /// from now on use what they hold now.
    pub fn reload_tls(&self) -> anyhow::Result<()> {
        let standby = standby_tls(&self.cfg)?;
        let link = crate::link::client_tls_config(&self.link_cfg)?;
        self.tls.set(standby);
        self.spooler.link_tls.set(link);
        Ok(())
    }
}

/// Accepts standbys until shutdown, then waits (bounded by `limits.drain_timeout_secs`) for
/// their sessions to end; sessions themselves end at shutdown with a FATAL like PostgreSQL's.
/// Each connection uses the settings current in `live` when it arrives.
pub async fn serve(live: Arc<Live<Downstream>>, listener: TcpListener) {
    let tracker = TaskTracker::new();
    let shutdown = live.get().shutdown.clone();
    let mut accept_errors = crate::tcp::AcceptErrors::new("standby");
    loop {
        let (sock, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    accept_errors.failed(e).await;
                    continue;
                }
            },
        };
        let ds = live.get();
        let span = tracing::info_span!("standby", %peer);
        tracker.spawn(handle_connection(ds, sock, peer).instrument(span));
    }
    tracker.close();
    // Sessions cut themselves after drain_timeout_secs (logging which); this is the backstop.
    if tokio::time::timeout(
        Duration::from_secs(live.get().limits.drain_timeout_secs) + Duration::from_millis(500),
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
    pub(crate) fn fatal(code: &str, msg: impl Into<String>) -> End {
        End::Fatal(ErrorFields::fatal(code, msg))
    }
}

/// Why a connection was refused before its session, for [`pre_auth_log`].
#[derive(Clone, Copy)]
pub(super) enum PreAuth {
    Timeout = 0,
    /// `limits.max_startups` reached.
    Busy = 1,
    /// `limits.max_startups_per_address` reached.
    BusyHere = 2,
    Password = 3,
    /// A TLS handshake failed (or was refused).
    Tls = 4,
    /// Not a startup packet.
    Protocol = 5,
    /// A cancel request that names no live tunnel.
    Cancel = 6,
}

/// Whether a line about a connection refused before its session may be logged now (see
/// `LogBudget`, one per kind of refusal): many peers, or one in a loop, would otherwise log a
/// line each; the counters have them all. Some(what to append to the line).
pub(super) fn pre_auth_log(kind: PreAuth) -> Option<String> {
    use crate::logging::LogBudgets;
    static BUDGETS: LogBudgets<7> = LogBudgets::new();
    let counter = match kind {
        PreAuth::Password => "walrelay_auth_failures_total",
        PreAuth::Protocol => "walrelay_protocol_errors_total",
        PreAuth::Cancel => "walrelay_tunnel_cancels_total",
        PreAuth::Timeout | PreAuth::Busy | PreAuth::BusyHere | PreAuth::Tls => {
            "walrelay_connections_refused_total"
        }
    };
    BUDGETS.within(kind as usize, counter)
}

/// A connection's way to a session: a place in the pre-authentication budget
/// (`limits.max_startups`, per address too), startup and authentication within their
/// deadlines, and only then a session slot (`limits.max_sessions`).
async fn handle_connection(ds: Arc<Downstream>, sock: TcpStream, peer: SocketAddr) {
    let _ = sock.set_nodelay(true);
    // As PostgreSQL turns SO_KEEPALIVE on for its clients: a client whose host went away
    // while its session waits for it (between commands, say) is found gone and its session
    // slot freed, in about two minutes.
    if let Err(e) = crate::tcp::keep_alive(&sock, false) {
        debug!(%peer, "TCP keepalive not set on a client's socket: {e}");
    }
    let l = &ds.limits;
    let pass = match ds
        .startups
        .try_enter(peer.ip(), l.max_startups, l.max_startups_per_address)
    {
        Ok(p) => p,
        Err(why) => return refuse_startup(&ds, sock, peer, why).await,
    };
    let auth_timeout = Duration::from_secs(l.auth_timeout_secs);
    let started = tokio::time::timeout(auth_timeout, startup::accept(&ds, sock, peer, &pass)).await;
    let (mut reader, mut writer, standby) = match started {
        Ok(Ok(s)) => s,
        Ok(Err((writer, end))) => {
            if let (Some(mut w), End::Fatal(e)) = (writer, &end) {
                send_error(&mut w, e).await;
            }
            // A failed handshake keeps its place a while, the socket closed (see `gate`).
            pass.release(Duration::from_millis(l.auth_failure_delay_ms))
                .await;
            return;
        }
        Err(_) => {
            Metrics::add(&ds.metrics.refusals.startup_timeout, 1);
            if let Some(more) = pre_auth_log(PreAuth::Timeout) {
                warn!(%peer, "standby did not complete startup within limits.auth_timeout_secs{more}");
            }
            return;
        }
    };
    drop(pass);
    let Some(_slot) = ds.sessions.try_take(l.max_sessions) else {
        Metrics::add(&ds.metrics.refusals.max_sessions, 1);
        warn!(%peer, "refusing standby session: limits.max_sessions reached");
        let e = ErrorFields::fatal(
            "53300",
            "sorry, too many clients already (walrelay limits.max_sessions)",
        );
        send_error(&mut writer, &e).await;
        return;
    };
    let _gauge = GaugeGuard::inc(&ds.metrics.sessions_active_downstream);
    let end = tokio::select! {
        end = async {
            match standby.tunnel {
                Some(mode) => tunnel::whole(&ds, &mut reader, &mut writer, &standby, mode).await,
                None => commands::run(&ds, &mut reader, &mut writer, &standby).await,
            }
        } => end,
        // The session ends by itself at shutdown (see the streamer); this cuts one whose
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

/// Refuses a connection the pre-authentication budget has no room for: the FATAL
/// PostgreSQL sends for too many connections, written without waiting on the peer.
async fn refuse_startup(ds: &Downstream, mut sock: TcpStream, peer: SocketAddr, why: Refused) {
    let (counter, key, kind) = match why {
        Refused::Total => (
            &ds.metrics.refusals.max_startups,
            "limits.max_startups",
            PreAuth::Busy,
        ),
        Refused::PerAddress => (
            &ds.metrics.refusals.max_startups_per_address,
            "limits.max_startups_per_address",
            PreAuth::BusyHere,
        ),
    };
    Metrics::add(counter, 1);
    if let Some(more) = pre_auth_log(kind) {
        warn!(%peer, "refusing connection: {key} reached (connections in startup and authentication){more}");
    }
    let mut out = BytesMut::new();
    let msg = format!("sorry, too many clients already (walrelay {key}: too many connections are in startup or authentication)");
    encode::error_response(&mut out, &ErrorFields::fatal("53300", msg));
    let _ = tokio::time::timeout(Duration::from_secs(1), sock.write_all(&out)).await;
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
    /// Not physical replication: the session goes through a tunnel ([`tunnel`]).
    pub tunnel: Option<tunnel::Mode>,
    /// The `database` of the startup packet (its user's name when absent).
    pub database: String,
    /// The BackendKeyData the client is given (by the downstream's startup reply, or for a
    /// session tunnelled whole by the upstream's), which its cancel requests name.
    pub cancel_key: cancelkeys::Key,
}

pub(crate) type Reader = MsgReader<tokio::io::ReadHalf<BoxIo>>;
pub(crate) type Writer = tokio::io::WriteHalf<BoxIo>;

pub(crate) fn shutting_down() -> End {
    End::fatal(
        "57P01",
        "terminating connection due to administrator command (walrelay is shutting down)",
    )
}
