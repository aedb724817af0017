//! The upstream's client connection to the primary: a physical replication connection
//! (`replication=true`), TLS per sslmode, SCRAM-SHA-256 / md5 / password / trust.
//!
//! [`connect`] tries the hosts of the conninfo in order (each within `connect_timeout`) and
//! returns the first that qualifies under `target_session_attrs`; [`PrimaryConn::server`]
//! says which one. On each host, `sslmode=allow` and `prefer` make a second try with the
//! other transport when the first is refused, as libpq does ([`sslfallback`]). Before
//! streaming, the queries in [`query`] run on it (`SHOW`, slot creation, `IDENTIFY_SYSTEM`,
//! `TIMELINE_HISTORY`, the server's role). Then the connection is split into a
//! [`MsgReader`] of backend messages (capped at `max_message_bytes`) and a write half; the
//! session forwards messages both ways. [`auth`] answers the primary's authentication requests.

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::TcpStream;

use crate::conninfo::{ConnInfo, HostSpec, SslMode, TargetSessionAttrs};
use crate::pgio::MsgReader;
use crate::tcp::RecvWake;
use sslfallback::{Failure, Tls};
use walrelay_pgwire::{encode, parse_tagged, ErrorFields, RawMsg, WireError};

mod auth;
pub mod query;
pub mod sslfallback;

pub use query::{Continuity, ServerRole, SystemIdentity, TimelineHistoryFile};

/// A socket, plain or TLS.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}
pub type BoxIo = Box<dyn Io>;

#[derive(Debug, thiserror::Error)]
pub enum PgClientError {
    /// The cause is in the message, so not also the `source()` (see `SpoolError::Io`);
    /// likewise for `Wire`.
    #[error("cannot connect to the primary at {addr}: {cause}")]
    Connect { addr: String, cause: std::io::Error },
    #[error("connecting to the primary at {0} timed out (connect_timeout)")]
    Timeout(String),
    #[error("the primary at {0} does not accept TLS, but sslmode requires it")]
    TlsRefused(String),
    #[error("the primary at {0} does not accept TLS (its ssl is off)")]
    TlsUnavailable(String),
    #[error("TLS to the primary: {0}")]
    Tls(String),
    #[error("the TLS handshake with the primary at {addr} failed: {why}")]
    TlsHandshake { addr: String, why: String },
    /// Both tries of `sslmode=allow` or `prefer` on one host failed, `first` with TLS when
    /// `tls_first` (prefer), else in the clear (allow).
    #[error("{}", fallback_text(*.tls_first, .first, .second))]
    Fallback {
        tls_first: bool,
        first: Box<PgClientError>,
        second: Box<PgClientError>,
    },
    #[error("the primary refused the connection: {0}")]
    Server(ErrorFields),
    #[error("the primary asks for a password but none is configured: add password=... to upstream.primary or set upstream.primary_password")]
    NoPassword,
    #[error("the primary asks for an unsupported authentication method (code {0}); use scram-sha-256, md5, password or trust in its pg_hba.conf")]
    UnsupportedAuth(u32),
    #[error("SCRAM authentication with the primary failed: {0}")]
    Scram(String),
    #[error("protocol error from the primary: {0}")]
    Wire(WireError),
    #[error("unexpected message '{0}' from the primary during {1}")]
    Unexpected(char, &'static str),
    #[error("the server at {addr} is {role}, but upstream.primary asks for target_session_attrs={}: list the current primary in upstream.primary", wanted.as_str())]
    NotQualified {
        addr: String,
        role: ServerRole,
        wanted: TargetSessionAttrs,
    },
    #[error("no host of upstream.primary is {}: {}; check which server is the primary now and that this upstream can reach and log in to it", wanted_words(*.wanted), failures_text(.failures))]
    NoHost {
        wanted: TargetSessionAttrs,
        /// Every host tried, in order, with why it was skipped.
        failures: Vec<HostFailure>,
    },
    #[error("the primary's answer to {command} is invalid: {why}")]
    BadReply { command: &'static str, why: String },
}

/// A host [`connect`] skipped, and why.
#[derive(Debug)]
pub struct HostFailure {
    pub host: HostSpec,
    pub error: PgClientError,
}

/// Both tries' errors in the order made, each with its transport: the first is often the
/// real cause (a wrong password), the second the other transport's pg_hba.conf refusal.
fn fallback_text(tls_first: bool, first: &PgClientError, second: &PgClientError) -> String {
    let (mode, a, b) = match tls_first {
        true => ("prefer", "with TLS", "in the clear"),
        false => ("allow", "in the clear", "with TLS"),
    };
    let (first, second) = (first.to_string(), second.to_string());
    match first == second {
        true => format!("both tries of sslmode={mode} ({a}, then {b}) failed alike: {first}"),
        false => format!("both tries of sslmode={mode} failed: {a}, {first}; then {b}, {second}"),
    }
}

fn wanted_words(w: TargetSessionAttrs) -> &'static str {
    match w {
        TargetSessionAttrs::Any => "reachable (target_session_attrs=any)",
        TargetSessionAttrs::ReadWrite => "a primary (read-write)",
        TargetSessionAttrs::Primary => "a primary (not in recovery)",
    }
}

fn failures_text(f: &[HostFailure]) -> String {
    let each: Vec<String> = f
        .iter()
        .map(|h| format!("{}: {}", h.host, h.error.reason()))
        .collect();
    each.join(", ")
}

impl From<WireError> for PgClientError {
    fn from(e: WireError) -> Self {
        PgClientError::Wire(e)
    }
}

impl PgClientError {
    /// Why one host was skipped, without repeating its address.
    pub fn reason(&self) -> String {
        match self {
            PgClientError::Connect { cause, .. } => cause.to_string(),
            PgClientError::Timeout(_) => "timed out (connect_timeout)".into(),
            PgClientError::NotQualified { role, .. } => role.to_string(),
            other => other.to_string(),
        }
    }
}

/// Which host of the conninfo a connection went to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// Position in `ConnInfo::hosts`.
    pub index: usize,
    pub host: HostSpec,
}

/// An authenticated replication connection to the primary, before it is split.
pub struct PrimaryConn {
    pub reader: MsgReader<ReadHalf<BoxIo>>,
    pub writer: WriteHalf<BoxIo>,
    /// ParameterStatus values the primary reported (server_version, ...), in order.
    pub params: Vec<(String, String)>,
    pub max_message_bytes: usize,
    /// The host this connection went to.
    pub server: Server,
    /// The primary backend's BackendKeyData (pid, key), for [`cancel`].
    pub backend_key: Option<(u32, u32)>,
    /// When the runtime is told of the primary's bytes (TCP only; None on a Unix socket):
    /// a reader that batches defers it ([`crate::tcp::RecvWake`]).
    pub wake: Option<RecvWake>,
    /// Drops bytes waiting on the connection without reading them (plain TCP only: None
    /// with TLS or on a Unix socket; [`crate::tcp::Discard`]).
    pub discard: Option<crate::tcp::Discard>,
}

impl PrimaryConn {
    /// [`PrimaryConn::over`] a TCP connection, with its receive low-water mark and its
    /// [`crate::tcp::Discard`].
    #[cfg(test)]
    pub(crate) fn over_tcp(tcp: tokio::net::TcpStream, max_message_bytes: usize) -> PrimaryConn {
        let wake = RecvWake::of(&tcp);
        let discard = wake.as_ref().map(RecvWake::discard);
        PrimaryConn {
            wake,
            discard,
            ..PrimaryConn::over(Box::new(tcp), max_message_bytes)
        }
    }

    /// A connection over `io` to host "test" (unit tests: the other end is the primary).
    #[cfg(test)]
    pub(crate) fn over(io: BoxIo, max_message_bytes: usize) -> PrimaryConn {
        let (r, writer) = tokio::io::split(io);
        PrimaryConn {
            reader: MsgReader::new(r),
            writer,
            params: Vec::new(),
            max_message_bytes,
            server: Server {
                index: 0,
                host: HostSpec {
                    host: "test".into(),
                    hostaddr: None,
                    port: 5432,
                },
            },
            backend_key: None,
            wake: None,
            discard: None,
        }
    }
}

/// Tries the hosts of `ci` in order: connects, negotiates TLS, authenticates, waits for
/// ReadyForQuery and checks `target_session_attrs`, all within `connect_timeout` per host.
/// Returns the first host that qualifies. With one host its own error is returned; with
/// several, [`PgClientError::NoHost`] names each host and why it was skipped. Tries each
/// host once: retrying is the caller's decision.
pub async fn connect(
    ci: &ConnInfo,
    application_name: &str,
    max_message_bytes: usize,
) -> Result<PrimaryConn, PgClientError> {
    let dbname = ci.dbname.clone().unwrap_or_else(|| "replication".into());
    let startup = [
        ("database", dbname.as_str()),
        ("replication", "true"),
        ("application_name", application_name),
    ];
    connect_with(ci, &startup, max_message_bytes).await
}

/// [`connect`] with other startup parameters than a physical replication connection's
/// (`user` is always `ci`'s): a tunnel's connection (`replication=database`, none, `options`).
pub async fn connect_with(
    ci: &ConnInfo,
    startup: &[(&str, &str)],
    max_message_bytes: usize,
) -> Result<PrimaryConn, PgClientError> {
    let mut failures = Vec::new();
    for (index, host) in ci.hosts.iter().enumerate() {
        match connect_host(ci, host, startup, max_message_bytes).await {
            Ok(mut conn) => {
                conn.server = Server {
                    index,
                    host: host.clone(),
                };
                if !failures.is_empty() {
                    tracing::info!(primary = %host, skipped = %failures_text(&failures), "connected to a later host of upstream.primary");
                }
                return Ok(conn);
            }
            Err(error) => {
                tracing::debug!(host = %host, "skipping a host of upstream.primary: {error}");
                failures.push(HostFailure {
                    host: host.clone(),
                    error,
                });
            }
        }
    }
    match failures.len() {
        1 => Err(failures.remove(0).error),
        _ => Err(PgClientError::NoHost {
            wanted: ci.target_session_attrs,
            failures,
        }),
    }
}

/// One host, bounded by `connect_timeout` (both tries of the sslmode fallback and the
/// `target_session_attrs` check share it, as libpq's timer runs per host address); a host that
/// does not qualify is told goodbye, without a second try.
async fn connect_host(
    ci: &ConnInfo,
    host: &HostSpec,
    startup: &[(&str, &str)],
    max: usize,
) -> Result<PrimaryConn, PgClientError> {
    let attempt = async {
        let mut conn = connect_tries(ci, host, startup, max).await?;
        if let Err(e) = check_target(&mut conn, ci.target_session_attrs).await {
            conn.terminate().await;
            return Err(e);
        }
        Ok(conn)
    };
    tokio::time::timeout(ci.connect_timeout(), attempt)
        .await
        .map_err(|_| PgClientError::Timeout(host.to_string()))?
}

/// Whether the server qualifies under `wanted` (libpq's check, as a replication connection
/// can run it: only `SHOW`).
async fn check_target(
    conn: &mut PrimaryConn,
    wanted: TargetSessionAttrs,
) -> Result<(), PgClientError> {
    let ok = match wanted {
        TargetSessionAttrs::Any => return Ok(()),
        TargetSessionAttrs::ReadWrite => |r: ServerRole| r == ServerRole::ReadWrite,
        TargetSessionAttrs::Primary => |r: ServerRole| r != ServerRole::HotStandby,
    };
    let role = conn.role().await?;
    match ok(role) {
        true => Ok(()),
        false => Err(PgClientError::NotQualified {
            addr: conn.server.host.to_string(),
            role,
            wanted,
        }),
    }
}

/// The first try on `host` per `ci.sslmode`, and a second with the other transport when
/// [`sslfallback::second_try`] says the first's failure earns one.
async fn connect_tries(
    ci: &ConnInfo,
    host: &HostSpec,
    startup: &[(&str, &str)],
    max: usize,
) -> Result<PrimaryConn, PgClientError> {
    let tls = sslfallback::first_try(ci.sslmode);
    let (first, failure) = match connect_inner(ci, host, startup, max, tls).await {
        Ok(conn) => return Ok(conn),
        Err(failed) => failed,
    };
    let Some(next) = sslfallback::second_try(ci.sslmode, &failure) else {
        return Err(first);
    };
    let how = match next {
        Tls::Off => "in the clear",
        Tls::IfOffered | Tls::Required => "with TLS",
    };
    tracing::debug!(primary = %host, "the first try failed ({first}); trying again {how}, as libpq's sslmode does");
    connect_inner(ci, host, startup, max, next)
        .await
        .map_err(|(second, _)| PgClientError::Fallback {
            tls_first: tls != Tls::Off,
            first: Box::new(first),
            second: Box::new(second),
        })
}

/// A connected socket to `host`, TLS per `tls` (none on a Unix socket, as libpq), whether
/// it is encrypted, its receive low-water mark (TCP) and its [`crate::tcp::Discard`] (plain
/// TCP).
async fn open_socket(
    ci: &ConnInfo,
    host: &HostSpec,
    tls: Tls,
) -> Result<(BoxIo, bool, Option<RecvWake>, Option<crate::tcp::Discard>), PgClientError> {
    let addr = host.to_string();
    if host.is_unix_socket() {
        let s = tokio::net::UnixStream::connect(&addr)
            .await
            .map_err(|cause| PgClientError::Connect { addr, cause })?;
        return Ok((Box::new(s), false, None, None));
    }
    let tcp = TcpStream::connect((host.dial_host().as_str(), host.port))
        .await
        .map_err(|cause| PgClientError::Connect {
            addr: addr.clone(),
            cause,
        })?;
    let _ = tcp.set_nodelay(true);
    // A primary whose host went away is found gone in about two minutes, also where nothing
    // else times the connection out (a tunnel's backup reading from it).
    if let Err(e) = crate::tcp::keep_alive(&tcp, true) {
        tracing::debug!(primary = %addr, "TCP keepalive not set on a connection to the primary: {e}");
    }
    let wake = RecvWake::of(&tcp);
    let (io, encrypted) = negotiate_tls(tcp, ci, host, tls).await?;
    let discard = wake.as_ref().filter(|_| !encrypted).map(RecvWake::discard);
    Ok((io, encrypted, wake, discard))
}

/// One try on `host`; a failure comes with what [`sslfallback`] needs to know of it.
async fn connect_inner(
    ci: &ConnInfo,
    host: &HostSpec,
    startup: &[(&str, &str)],
    max: usize,
    tls: Tls,
) -> Result<PrimaryConn, (PgClientError, Failure)> {
    let other = |e: PgClientError| (e, Failure::Other);
    let (io, encrypted, wake, discard) = open_socket(ci, host, tls).await.map_err(|e| match e {
        PgClientError::TlsHandshake { .. } => (e, Failure::Handshake),
        e => (e, Failure::Other),
    })?;
    let (r, mut writer) = tokio::io::split(io);
    let mut reader = MsgReader::new(r);
    let mut out = BytesMut::new();
    let mut params = vec![("user", ci.user.as_str())];
    params.extend_from_slice(startup);
    encode::startup(&mut out, &params);
    let sent = writer.write_all(&out).await;
    sent.map_err(|e| other(WireError::Io(e).into()))?;
    auth::authenticate(&mut reader, &mut writer, ci, max)
        .await
        .map_err(|e| match e {
            PgClientError::Server(f) => {
                let code = f.code.clone();
                let tls = encrypted;
                (PgClientError::Server(f), Failure::Refused { code, tls })
            }
            e => (e, Failure::Other),
        })?;
    let (params, backend_key) = read_until_ready(&mut reader, max).await.map_err(other)?;
    Ok(PrimaryConn {
        reader,
        writer,
        params,
        max_message_bytes: max,
        server: Server {
            index: 0,
            host: host.clone(),
        },
        backend_key,
        wake,
        discard,
    })
}

type Greeting = (Vec<(String, String)>, Option<(u32, u32)>);

/// ParameterStatus messages and BackendKeyData up to ReadyForQuery after authentication.
async fn read_until_ready<R: AsyncRead + Unpin>(
    reader: &mut MsgReader<R>,
    max: usize,
) -> Result<Greeting, PgClientError> {
    let mut params = Vec::new();
    let mut key = None;
    loop {
        let m = read_msg(reader, max).await?;
        match m.tag {
            b'S' => {
                let mut b = m.body.clone();
                if let (Some(k), Some(v)) = (take_cstr(&mut b), take_cstr(&mut b)) {
                    params.push((k, v));
                }
            }
            // Protocol 3.0: a 4-byte key (this client asks for no newer protocol).
            b'K' if m.body.len() == 8 => {
                let mut b = m.body.clone();
                key = Some((b.get_u32(), b.get_u32()));
            }
            b'K' | b'N' => {}
            b'Z' => return Ok((params, key)),
            b'E' => return Err(PgClientError::Server(ErrorFields::parse(&m.body)?)),
            t => return Err(PgClientError::Unexpected(t as char, "startup")),
        }
    }
}

/// The SSLRequest and the TLS handshake per `tls`: the socket, and whether it is encrypted.
async fn negotiate_tls(
    mut tcp: TcpStream,
    ci: &ConnInfo,
    host: &HostSpec,
    tls: Tls,
) -> Result<(BoxIo, bool), PgClientError> {
    if tls == Tls::Off {
        return Ok((Box::new(tcp), false));
    }
    let mut req = BytesMut::new();
    encode::ssl_request(&mut req);
    tcp.write_all(&req).await.map_err(WireError::Io)?;
    let mut answer = [0u8; 1];
    tokio::io::AsyncReadExt::read_exact(&mut tcp, &mut answer)
        .await
        .map_err(WireError::Io)?;
    match answer[0] {
        b'S' => {
            let cfg = crate::tls::primary_client_config(ci)
                .map_err(|e| PgClientError::Tls(e.to_string()))?;
            let name = rustls::pki_types::ServerName::try_from(host.host.clone()).map_err(|e| {
                PgClientError::Tls(format!("invalid host name {:?}: {e}", host.host))
            })?;
            let s = tokio_rustls::TlsConnector::from(cfg)
                .connect(name, tcp)
                .await
                .map_err(|e| PgClientError::TlsHandshake {
                    addr: host.to_string(),
                    why: e.to_string(),
                })?;
            Ok((Box::new(s), true))
        }
        b'N' if tls == Tls::IfOffered => Ok((Box::new(tcp), false)),
        // allow's second try: the clear was refused, and there is no TLS either.
        b'N' if ci.sslmode == SslMode::Allow => {
            Err(PgClientError::TlsUnavailable(host.to_string()))
        }
        b'N' => Err(PgClientError::TlsRefused(host.to_string())),
        _ => Err(PgClientError::Unexpected(
            answer[0] as char,
            "TLS negotiation",
        )),
    }
}

/// Asks the primary at `host` to cancel what backend `pid` (BackendKeyData `pid`, `key`)
/// runs, as libpq's PQcancel does: a CancelRequest on a new connection (TLS as the first try
/// of `ci.sslmode`, without a second), which the server closes without an answer. Bounded by
/// `connect_timeout`.
pub async fn cancel(
    ci: &ConnInfo,
    host: &HostSpec,
    pid: u32,
    key: u32,
) -> Result<(), PgClientError> {
    let attempt = async {
        let (mut io, ..) = open_socket(ci, host, sslfallback::first_try(ci.sslmode)).await?;
        let mut out = BytesMut::new();
        encode::cancel_request(&mut out, pid, key);
        io.write_all(&out).await.map_err(WireError::Io)?;
        let mut sink = [0u8; 64];
        while matches!(tokio::io::AsyncReadExt::read(&mut io, &mut sink).await, Ok(n) if n > 0) {}
        Ok(())
    };
    tokio::time::timeout(ci.connect_timeout(), attempt)
        .await
        .map_err(|_| PgClientError::Timeout(host.to_string()))?
}

pub(crate) async fn read_msg<R: AsyncRead + Unpin>(
    reader: &mut MsgReader<R>,
    max: usize,
) -> Result<RawMsg, PgClientError> {
    Ok(reader.read(|b| parse_tagged(b, |_| max)).await?)
}

fn take_cstr(b: &mut Bytes) -> Option<String> {
    let nul = b.iter().position(|&c| c == 0)?;
    let s = String::from_utf8_lossy(&b[..nul]).into_owned();
    b.advance(nul + 1);
    Some(s)
}

fn split_cstrs(b: &[u8]) -> Vec<String> {
    b.split(|&c| c == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

#[cfg(test)]
mod tests;
