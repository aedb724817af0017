//! Startup and authentication of a standby connection (see the parent module's steps 1–2).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

use super::{Downstream, End, Reader, Standby, Writer};
use crate::config::AuthMethod;
use crate::gate::StartupPass;
use crate::metrics::Metrics;
use crate::pgclient::BoxIo;
use crate::pgio::MsgReader;
use walrelay_pgwire::negotiate::{is_protocol_option, negotiate};
use walrelay_pgwire::replcmd::MAX_IDENT_LEN;
use walrelay_pgwire::scram::{ScramError, ScramServer};
use walrelay_pgwire::{
    encode, parse_frontend, parse_sasl_initial, parse_startup, printable, FrontendMsg,
    StartupPacket, WireError,
};

/// The first byte of a TLS ClientHello record: a PG 17+ client using `sslnegotiation=direct`.
const TLS_HANDSHAKE: u8 = 0x16;

/// Longest `application_name` of a session served from the spool, in bytes. It goes up the
/// link in the session's OPEN item (with the user name and the address), which is at most
/// `frame::MAX_CONTROL_ITEM`; PostgreSQL itself shows only the first 63 bytes in
/// `pg_stat_replication`.
pub(super) const MAX_APPLICATION_NAME: usize = 1024;

type Failed = (Option<Writer>, End);

/// What a connection's first packets asked for, read within `limits.startup_timeout_secs`.
enum First {
    Session(Started),
    /// A cancel request (pid, key): forwarded outside that deadline, which it does not need
    /// (the upstream's answer may take longer), while the connection keeps its startup place.
    Cancel((u32, u32)),
}

/// A connection's startup packet, read (after TLS, if any) within
/// `limits.startup_timeout_secs`: the reader, whether TLS is on, and the packet.
struct Started {
    reader: MsgReader<BoxIo>,
    encrypted: bool,
    minor: u16,
    params: Vec<(String, String)>,
}

/// Runs startup and authentication. On failure returns the write half (if the connection got
/// that far) and what to tell the standby.
pub(super) async fn accept(
    ds: &Downstream,
    sock: TcpStream,
    peer: SocketAddr,
    pass: &StartupPass,
) -> Result<(Reader, Writer, Standby), Failed> {
    let deadline = Duration::from_secs(ds.limits.startup_timeout_secs);
    let Started {
        reader,
        encrypted,
        minor,
        params,
    } = match tokio::time::timeout(deadline, read_startup(ds, sock, peer, pass)).await {
        Ok(Ok(First::Session(s))) => s,
        Ok(Ok(First::Cancel(key))) => {
            // As PostgreSQL: no answer, the connection closes.
            super::tunnel::cancel::forward(ds, peer, key).await;
            return Err((None, End::Quiet));
        }
        Ok(Err(failed)) => return Err(failed),
        Err(_) => {
            Metrics::add(&ds.metrics.refusals.startup_timeout, 1);
            if let Some(more) = super::pre_auth_log(super::PreAuth::Timeout) {
                warn!(%peer, "no startup packet within limits.startup_timeout_secs; closing{more}");
            }
            return Err((None, End::Quiet));
        }
    };
    let (io, buf) = reader.into_parts();
    let (r, mut writer) = tokio::io::split(io);
    let mut reader = MsgReader::with_buffer(r, buf);
    // The Err hands the writer back for the FATAL message: large, but once per connection.
    #[allow(clippy::result_large_err)]
    let fail = |w, code: &str, msg: String| Err((Some(w), End::fatal(code, msg)));

    // As PostgreSQL: a `replication` value it does not accept ends the connection before
    // protocol negotiation and authentication.
    let tunnel = match super::tunnel::mode_of(&params) {
        Ok(t) => t,
        Err(e) => {
            // A refusal before authentication like an invalid startup packet: counted, logged
            // within the budget (with the value cut short: it may be 10 kB), the place held.
            Metrics::add(&ds.metrics.protocol_errors, 1);
            pass.failed();
            if let Some(more) = super::pre_auth_log(super::PreAuth::Protocol) {
                let what = walrelay_pgwire::clip(&printable(&e.message), 256);
                warn!(%peer, "refused a startup packet: {what}{more}");
            }
            return Err((Some(writer), End::Fatal(e)));
        }
    };
    // Protocol 3.x with x > 0 or _pq_ options: answer with what we speak (3.0, no options).
    if let Some(n) = negotiate(minor, &params) {
        let mut out = BytesMut::new();
        encode::negotiate_protocol_version(&mut out, &n);
        if writer.write_all(&out).await.is_err() {
            return Err((None, End::Quiet));
        }
    }
    let params: Vec<(String, String)> = params
        .into_iter()
        .filter(|(k, _)| !is_protocol_option(k))
        .collect();
    let standby = match who(&params, peer, tunnel) {
        Ok(s) => s,
        Err((code, msg)) => return fail(writer, code, msg),
    };
    let user = standby.user.clone();

    if ds.cfg.auth == AuthMethod::ScramSha256 {
        if let Err(end) = scram(ds, &mut reader, &mut writer, &user).await {
            if matches!(end, End::Fatal(ref e) if e.code == "28P01") {
                Metrics::add(&ds.metrics.auth_failures, 1);
                if let Some(more) = super::pre_auth_log(super::PreAuth::Password) {
                    let user = printable(&user);
                    warn!(%peer, %user, "password authentication failed{more}");
                }
                // As PostgreSQL's auth_delay: each guess costs the guesser time, while the
                // connection holds a startup place (bounded per address), not a session.
                let delay = Duration::from_millis(ds.limits.auth_failure_delay_ms);
                tokio::time::sleep(delay).await;
            }
            return Err((Some(writer), end));
        }
    }
    // The names are the client's own, as written: one log line each all the same.
    let (user, application_name) = (printable(&user), printable(&standby.application_name));
    info!(%peer, %user, %application_name, tls = encrypted, "standby authenticated");
    Ok((reader, writer, standby))
}

/// `s` cut to PostgreSQL's longest name (NAMEDATALEN - 1 bytes), at a character boundary.
fn name(s: &str) -> String {
    let mut end = s.len().min(MAX_IDENT_LEN);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// Who connects and for what (`tunnel` None: physical replication, served from the spool;
/// else a tunnel for logical replication or SQL), or the error (SQLSTATE, message) for a
/// startup packet walrelay does not serve.
fn who(
    params: &[(String, String)],
    peer: SocketAddr,
    tunnel: Option<super::tunnel::Mode>,
) -> Result<Standby, (&'static str, String)> {
    let get = |k| StartupPacket::param(params, k);
    // As PostgreSQL's ProcessStartupPacket: a parameter named twice counts as last given, and
    // longer user and database names are cut to a name's length.
    let user = name(get("user").unwrap_or_default());
    if user.is_empty() {
        return Err((
            "28000",
            "no PostgreSQL user name specified in startup packet".into(),
        ));
    }
    let database = name(get("database").filter(|d| !d.is_empty()).unwrap_or(&user));
    let application_name = get("application_name")
        .filter(|s| !s.is_empty())
        .or(get("fallback_application_name"))
        .unwrap_or("")
        .to_string();
    if tunnel.is_none() && application_name.len() > MAX_APPLICATION_NAME {
        return Err((
            "54000",
            format!(
                "walrelay passes on an application_name of at most {MAX_APPLICATION_NAME} bytes, \
                 and this one has {}: set a shorter one in primary_conninfo",
                application_name.len()
            ),
        ));
    }
    Ok(Standby {
        peer,
        user,
        application_name,
        tunnel,
        database,
        cancel_key: crate::cancelkeys::new_key(),
    })
}

/// TLS (direct, or after SSLRequest) and the startup packet; SSLRequest/GSSENCRequest
/// answered as PostgreSQL does.
async fn read_startup(
    ds: &Downstream,
    sock: TcpStream,
    peer: SocketAddr,
    pass: &StartupPass,
) -> Result<First, Failed> {
    let (io, mut encrypted) = direct_tls(ds, sock, peer, pass).await?;
    let mut reader = MsgReader::new(io);
    let mut asked = Asked::default();
    loop {
        let read = reader.read(parse_startup).await;
        let pkt = match read.and_then(|p| asked.record(&p).map(|()| p)) {
            Ok(p) => p,
            Err(e) => {
                Metrics::add(&ds.metrics.protocol_errors, 1);
                if !matches!(e, WireError::Closed) {
                    pass.failed();
                    if let Some(more) = super::pre_auth_log(super::PreAuth::Protocol) {
                        warn!(%peer, "invalid startup packet: {e}{more}");
                    }
                }
                // As PostgreSQL: an unsupported protocol is "feature not supported".
                let code = match e {
                    WireError::UnsupportedProtocol { .. } => "0A000",
                    _ => "08P01",
                };
                return Err(split_fail(
                    reader,
                    End::fatal(code, format!("invalid startup packet: {e}")),
                ));
            }
        };
        // The TLS current now (a reload may have replaced the files).
        let tls = ds.tls.get();
        match pkt {
            // Not on a connection that is encrypted already (direct TLS): 'N', as PostgreSQL.
            StartupPacket::SslRequest if tls.is_some() && !encrypted => {
                if !reader.buffered().is_empty() {
                    return Err(split_fail(
                        reader,
                        End::fatal("08P01", "received unencrypted data after SSL request"),
                    ));
                }
                let (mut io, _) = reader.into_parts();
                if io.write_all(b"S").await.is_err() {
                    return Err((None, End::Quiet));
                }
                let tls = tls.as_ref().expect("checked above");
                reader = MsgReader::new(Box::new(accept_tls(ds, tls, io, peer, pass).await?));
                encrypted = true;
                // Encrypted: no GSSENCRequest either.
                asked.gss = true;
            }
            StartupPacket::SslRequest | StartupPacket::GssEncRequest => {
                if reader.get_mut().write_all(b"N").await.is_err() {
                    return Err((None, End::Quiet));
                }
            }
            StartupPacket::Cancel { pid, key } => return Ok(First::Cancel((pid, key))),
            StartupPacket::Startup { minor, params } => {
                return Ok(First::Session(Started {
                    reader,
                    encrypted,
                    minor,
                    params,
                }))
            }
        }
    }
}

/// The encryption requests a connection has had answered (PostgreSQL's `ssl_done` and
/// `gss_done` in `ProcessStartupPacket`): each may come once, before the startup packet (the
/// client may try one after the other was refused), and a GSSENCRequest not after TLS.
#[derive(Debug, Default)]
struct Asked {
    ssl: bool,
    gss: bool,
}

impl Asked {
    /// Notes an encryption request. One already answered is, to PostgreSQL, a startup packet
    /// of protocol 1234.5679 (SSL) or 1234.5680 (GSS), refused as unsupported: so it is here,
    /// and a client cannot keep the server answering requests until its deadline.
    fn record(&mut self, pkt: &StartupPacket) -> Result<(), WireError> {
        let (seen, minor) = match pkt {
            StartupPacket::SslRequest => (&mut self.ssl, 5679),
            StartupPacket::GssEncRequest => (&mut self.gss, 5680),
            _ => return Ok(()),
        };
        if std::mem::replace(seen, true) {
            return Err(WireError::UnsupportedProtocol { major: 1234, minor });
        }
        Ok(())
    }
}

/// The connection as it starts: TLS at once (PostgreSQL 17's `sslnegotiation=direct`, ALPN
/// "postgresql") when its first byte is a TLS handshake, else plain until an SSLRequest. The
/// bool says whether it is encrypted.
async fn direct_tls(
    ds: &Downstream,
    sock: TcpStream,
    peer: SocketAddr,
    pass: &StartupPass,
) -> Result<(BoxIo, bool), Failed> {
    let mut first = [0u8; 1];
    if !matches!(sock.peek(&mut first).await, Ok(1) if first[0] == TLS_HANDSHAKE) {
        return Ok((Box::new(sock), false));
    }
    let Some(tls) = &ds.tls.get() else {
        let why = "direct TLS connection refused: downstream.tls_cert is not configured";
        return Err(tls_failed(ds, peer, pass, why));
    };
    let stream = accept_tls(ds, tls, Box::new(sock), peer, pass).await?;
    if stream.get_ref().1.alpn_protocol() != Some(b"postgresql") {
        let why = "direct TLS connection without ALPN \"postgresql\" refused";
        return Err(tls_failed(ds, peer, pass, why));
    }
    Ok((Box::new(stream), true))
}

/// The server side of a TLS handshake; a failed one ends the connection ([`tls_failed`]).
async fn accept_tls(
    ds: &Downstream,
    tls: &TlsAcceptor,
    io: BoxIo,
    peer: SocketAddr,
    pass: &StartupPass,
) -> Result<TlsStream<BoxIo>, Failed> {
    tls.accept(io)
        .await
        .map_err(|e| tls_failed(ds, peer, pass, &format!("TLS handshake failed: {e}")))
}

/// A connection refused for its TLS: counted, logged (within the log budget), and its
/// startup place kept for `limits.auth_failure_delay_ms` once it is closed (see
/// [`crate::gate`]: each handshake costs a signature).
fn tls_failed(ds: &Downstream, peer: SocketAddr, pass: &StartupPass, why: &str) -> Failed {
    Metrics::add(&ds.metrics.refusals.tls_handshake, 1);
    pass.failed();
    if let Some(more) = super::pre_auth_log(super::PreAuth::Tls) {
        warn!(%peer, "{why}{more}");
    }
    (None, End::Quiet)
}

fn split_fail(reader: MsgReader<BoxIo>, end: End) -> Failed {
    let (io, _) = reader.into_parts();
    let (_, w) = tokio::io::split(io);
    (Some(w), end)
}

async fn scram(
    ds: &Downstream,
    reader: &mut Reader,
    writer: &mut Writer,
    user: &str,
) -> Result<(), End> {
    let failed = || {
        End::fatal(
            "28P01",
            format!("password authentication failed for user \"{user}\""),
        )
    };
    let protocol = |e: String| End::fatal("08P01", e);
    let mut server = ScramServer::with_mock(ds.cfg.users.get(user).cloned(), user, &ds.mock);
    let mut out = BytesMut::new();
    encode::auth_sasl(&mut out, ScramServer::MECHANISMS);
    writer.write_all(&out).await.map_err(|_| End::Quiet)?;
    let body = read_password(reader).await?;
    let (mech, data) = parse_sasl_initial(&body).map_err(|e| protocol(e.to_string()))?;
    let server_first = server.client_first(&mech, &data).map_err(|e| match e {
        ScramError::AuthenticationFailed => failed(),
        e => protocol(e.to_string()),
    })?;
    out.clear();
    encode::auth_sasl_continue(&mut out, &server_first);
    writer.write_all(&out).await.map_err(|_| End::Quiet)?;
    let body = read_password(reader).await?;
    let server_final = server.client_final(&body).map_err(|e| match e {
        ScramError::AuthenticationFailed => failed(),
        e => protocol(e.to_string()),
    })?;
    out.clear();
    encode::auth_sasl_final(&mut out, &server_final);
    writer.write_all(&out).await.map_err(|_| End::Quiet)?;
    Ok(())
}

async fn read_password(reader: &mut Reader) -> Result<bytes::Bytes, End> {
    match reader.read(parse_frontend).await {
        Ok(FrontendMsg::Password(b)) => Ok(b),
        Ok(FrontendMsg::Terminate) | Err(WireError::Closed) | Err(WireError::Io(_)) => {
            Err(End::Quiet)
        }
        Ok(_) => Err(End::fatal("08P01", "expected SASL response")),
        Err(e) => Err(End::fatal(
            "08P01",
            format!("invalid authentication message: {e}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use std::net::{Ipv6Addr, SocketAddrV6};

    /// As PostgreSQL's `ssl_done`/`gss_done`: one request of each kind, in either order; a
    /// repeated one is the startup packet of an unsupported protocol.
    #[test]
    fn each_encryption_request_is_answered_once() {
        let mut asked = Asked::default();
        let startup = StartupPacket::Startup {
            minor: 0,
            params: Vec::new(),
        };
        assert!(asked.record(&StartupPacket::GssEncRequest).is_ok());
        assert!(asked.record(&StartupPacket::SslRequest).is_ok());
        assert!(asked.record(&startup).is_ok());
        for (again, minor) in [
            (StartupPacket::SslRequest, 5679),
            (StartupPacket::GssEncRequest, 5680),
        ] {
            let e = asked.record(&again).unwrap_err();
            assert!(
                matches!(e, WireError::UnsupportedProtocol { major: 1234, minor: m } if m == minor),
                "{e}"
            );
        }
    }

    /// A parameter named twice counts as last given, as in PostgreSQL.
    #[test]
    fn a_repeated_parameter_counts_as_last_given() {
        let peer = SocketAddr::from(([127, 0, 0, 1], 5432));
        let kv = |k: &str, v: &str| (k.to_string(), v.to_string());
        let params = vec![
            kv("user", "first"),
            kv("application_name", "a"),
            kv("user", "second"),
            kv("application_name", "b"),
        ];
        let s = who(&params, peer, None).unwrap();
        assert_eq!(
            (s.user.as_str(), s.application_name.as_str()),
            ("second", "b")
        );
    }

    /// The largest OPEN item a physical session can make (the longest application_name taken,
    /// a user name cut to 63 bytes, the longest address) fits in a link item, and a longer
    /// application_name is refused before it could be made.
    #[test]
    fn a_physical_sessions_open_item_always_fits_in_a_link_item() {
        let peer = SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::from([0xffff; 8]),
            65535,
            0,
            u32::MAX,
        ));
        let (app, user) = ("é".repeat(MAX_APPLICATION_NAME / 2), "ü".repeat(100));
        let params = vec![
            ("user".to_string(), user),
            ("replication".to_string(), "true".to_string()),
            ("application_name".to_string(), app.clone()),
        ];
        let standby = who(&params, peer, None).unwrap();
        assert_eq!(
            standby.user.len(),
            62,
            "cut at a character boundary within 63 bytes"
        );
        let len = crate::walsender::commands::open_info(&standby).encoded_len();
        assert!(len <= walrelay_proto::frame::MAX_CONTROL_ITEM, "{len}");
        let mut longer = params.clone();
        longer[2].1 = format!("{app}x");
        let (code, msg) = who(&longer, peer, None).err().unwrap();
        assert_eq!(code, "54000", "{msg}");
    }
}
