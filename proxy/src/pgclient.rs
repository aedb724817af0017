//! The upstream's client connection to the primary: a physical replication connection
//! (`replication=true`), TLS per sslmode, SCRAM-SHA-256 / md5 / password / trust.
//!
//! After [`connect`] the connection is split into a [`MsgReader`] of backend messages (capped
//! at `max_message_bytes`) and a write half; the session forwards messages both ways.

use bytes::{Buf, Bytes, BytesMut};
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::TcpStream;

use crate::conninfo::{ConnInfo, SslMode};
use crate::pgio::MsgReader;
use walrelay_pgwire::{encode, parse_tagged, ErrorFields, RawMsg, WireError};

/// A socket, plain or TLS.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}
pub type BoxIo = Box<dyn Io>;

#[derive(Debug, thiserror::Error)]
pub enum PgClientError {
    #[error("cannot connect to the primary at {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("connecting to the primary at {0} timed out (connect_timeout)")]
    Timeout(String),
    #[error("the primary at {0} does not accept TLS, but sslmode requires it")]
    TlsRefused(String),
    #[error("TLS to the primary: {0}")]
    Tls(String),
    #[error("the primary refused the connection: {0}")]
    Server(ErrorFields),
    #[error("the primary asks for a password but none is configured: add password=... to upstream.primary or set upstream.primary_password")]
    NoPassword,
    #[error("the primary asks for an unsupported authentication method (code {0}); use scram-sha-256, md5, password or trust in its pg_hba.conf")]
    UnsupportedAuth(u32),
    #[error("SCRAM authentication with the primary failed: {0}")]
    Scram(String),
    #[error("protocol error from the primary: {0}")]
    Wire(#[from] WireError),
    #[error("unexpected message '{0}' from the primary during {1}")]
    Unexpected(char, &'static str),
}

/// An authenticated replication connection to the primary, before it is split.
pub struct PrimaryConn {
    pub reader: MsgReader<ReadHalf<BoxIo>>,
    pub writer: WriteHalf<BoxIo>,
    /// ParameterStatus values the primary reported (server_version, ...), in order.
    pub params: Vec<(String, String)>,
    pub max_message_bytes: usize,
}

/// Connects, negotiates TLS, authenticates and waits for ReadyForQuery.
pub async fn connect(
    ci: &ConnInfo,
    application_name: &str,
    max_message_bytes: usize,
) -> Result<PrimaryConn, PgClientError> {
    let addr = format!("{}:{}", ci.host, ci.port);
    let timeout = Duration::from_secs(ci.connect_timeout_secs.max(1));
    tokio::time::timeout(
        timeout,
        connect_inner(ci, &addr, application_name, max_message_bytes),
    )
    .await
    .map_err(|_| PgClientError::Timeout(addr.clone()))?
}

async fn connect_inner(
    ci: &ConnInfo,
    addr: &str,
    application_name: &str,
    max: usize,
) -> Result<PrimaryConn, PgClientError> {
    let io: BoxIo = if ci.host.starts_with('/') {
        let path = format!("{}/.s.PGSQL.{}", ci.host, ci.port);
        Box::new(
            tokio::net::UnixStream::connect(&path)
                .await
                .map_err(|source| PgClientError::Connect { addr: path, source })?,
        )
    } else {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|source| PgClientError::Connect {
                addr: addr.to_string(),
                source,
            })?;
        let _ = tcp.set_nodelay(true);
        negotiate_tls(tcp, ci, addr).await?
    };
    let (r, mut writer) = tokio::io::split(io);
    let mut reader = MsgReader::new(r);
    let mut out = BytesMut::new();
    let dbname = ci.dbname.clone().unwrap_or_else(|| "replication".into());
    encode::startup(
        &mut out,
        &[
            ("user", &ci.user),
            ("database", &dbname),
            ("replication", "true"),
            ("application_name", application_name),
        ],
    );
    writer.write_all(&out).await.map_err(WireError::Io)?;
    authenticate(&mut reader, &mut writer, ci, max).await?;
    let mut params = Vec::new();
    loop {
        let m = read_msg(&mut reader, max).await?;
        match m.tag {
            b'S' => {
                let mut b = m.body.clone();
                if let (Some(k), Some(v)) = (take_cstr(&mut b), take_cstr(&mut b)) {
                    params.push((k, v));
                }
            }
            b'K' | b'N' => {}
            b'Z' => break,
            b'E' => return Err(PgClientError::Server(ErrorFields::parse(&m.body)?)),
            t => return Err(PgClientError::Unexpected(t as char, "startup")),
        }
    }
    Ok(PrimaryConn {
        reader,
        writer,
        params,
        max_message_bytes: max,
    })
}

async fn negotiate_tls(
    mut tcp: TcpStream,
    ci: &ConnInfo,
    addr: &str,
) -> Result<BoxIo, PgClientError> {
    if ci.sslmode == SslMode::Disable || ci.sslmode == SslMode::Allow {
        return Ok(Box::new(tcp));
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
            let name = rustls::pki_types::ServerName::try_from(ci.host.clone())
                .map_err(|e| PgClientError::Tls(format!("invalid host name {:?}: {e}", ci.host)))?;
            let tls = tokio_rustls::TlsConnector::from(cfg)
                .connect(name, tcp)
                .await
                .map_err(|e| PgClientError::Tls(e.to_string()))?;
            Ok(Box::new(tls))
        }
        b'N' if ci.sslmode == SslMode::Prefer => Ok(Box::new(tcp)),
        b'N' => Err(PgClientError::TlsRefused(addr.to_string())),
        _ => Err(PgClientError::Unexpected(
            answer[0] as char,
            "TLS negotiation",
        )),
    }
}

async fn read_msg<R: AsyncRead + Unpin>(
    reader: &mut MsgReader<R>,
    max: usize,
) -> Result<RawMsg, PgClientError> {
    Ok(reader.read(|b| parse_tagged(b, |_| max)).await?)
}

async fn authenticate<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    reader: &mut MsgReader<R>,
    writer: &mut W,
    ci: &ConnInfo,
    max: usize,
) -> Result<(), PgClientError> {
    let password = || ci.password.as_deref().ok_or(PgClientError::NoPassword);
    let mut scram: Option<ScramSha256> = None;
    loop {
        let m = read_msg(reader, max).await?;
        match m.tag {
            b'E' => return Err(PgClientError::Server(ErrorFields::parse(&m.body)?)),
            b'R' => {}
            t => return Err(PgClientError::Unexpected(t as char, "authentication")),
        }
        let mut body = m.body.clone();
        if body.len() < 4 {
            return Err(WireError::Malformed {
                tag: 'R',
                what: "authentication request too short",
            }
            .into());
        }
        let code = body.get_u32();
        let mut out = BytesMut::new();
        match code {
            0 => return Ok(()),
            3 => encode::password(&mut out, password()?),
            5 => {
                if body.len() < 4 {
                    return Err(WireError::Malformed {
                        tag: 'R',
                        what: "md5 salt missing",
                    }
                    .into());
                }
                let salt = [body[0], body[1], body[2], body[3]];
                let h = postgres_protocol::authentication::md5_hash(
                    ci.user.as_bytes(),
                    password()?.as_bytes(),
                    salt,
                );
                encode::password(&mut out, &h);
            }
            10 => {
                let mechs = split_cstrs(&body);
                if !mechs.iter().any(|m| m == "SCRAM-SHA-256") {
                    return Err(PgClientError::Scram(format!(
                        "the primary offers {mechs:?}, walrelay speaks SCRAM-SHA-256"
                    )));
                }
                let s = ScramSha256::new(password()?.as_bytes(), ChannelBinding::unsupported());
                encode::sasl_initial_response(&mut out, "SCRAM-SHA-256", s.message());
                scram = Some(s);
            }
            11 => {
                let s = scram.as_mut().ok_or(PgClientError::Unexpected(
                    'R',
                    "SASL continue without SASL start",
                ))?;
                s.update(&body)
                    .map_err(|e| PgClientError::Scram(e.to_string()))?;
                encode::sasl_response(&mut out, s.message());
            }
            12 => {
                let s = scram.as_mut().ok_or(PgClientError::Unexpected(
                    'R',
                    "SASL final without SASL start",
                ))?;
                s.finish(&body).map_err(|e| {
                    PgClientError::Scram(format!("the primary's SCRAM proof is invalid: {e}"))
                })?;
                continue;
            }
            other => return Err(PgClientError::UnsupportedAuth(other)),
        }
        writer.write_all(&out).await.map_err(WireError::Io)?;
    }
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

impl PrimaryConn {
    /// Runs one command before streaming starts and returns its messages up to ReadyForQuery.
    /// An ErrorResponse is returned as `Err(PgClientError::Server)` after ReadyForQuery.
    pub async fn simple_query(&mut self, sql: &str) -> Result<Vec<RawMsg>, PgClientError> {
        let mut out = BytesMut::new();
        encode::query(&mut out, sql);
        self.writer.write_all(&out).await.map_err(WireError::Io)?;
        let mut msgs = Vec::new();
        let mut err = None;
        loop {
            let m = read_msg(&mut self.reader, self.max_message_bytes).await?;
            match m.tag {
                b'Z' => break,
                b'E' => err = Some(ErrorFields::parse(&m.body)?),
                _ => msgs.push(m),
            }
        }
        match err {
            Some(e) => Err(PgClientError::Server(e)),
            None => Ok(msgs),
        }
    }

    /// The value of a setting of the primary (`SHOW name`), before streaming starts.
    pub async fn show(&mut self, name: &str) -> Result<String, PgClientError> {
        let msgs = self
            .simple_query(&format!("SHOW \"{}\"", name.replace('"', "\"\"")))
            .await?;
        let row = msgs
            .iter()
            .find(|m| m.tag == b'D')
            .ok_or(WireError::Malformed {
                tag: 'D',
                what: "SHOW returned no row",
            })?;
        match row.data_row()?.first() {
            Some(Some(v)) => Ok(String::from_utf8_lossy(v).into_owned()),
            _ => Err(WireError::Malformed {
                tag: 'D',
                what: "SHOW returned no value",
            }
            .into()),
        }
    }

    /// Makes sure a physical slot exists (creates it reserving WAL when missing).
    pub async fn ensure_physical_slot(&mut self, slot: &str) -> Result<bool, PgClientError> {
        match self
            .simple_query(&format!(
                "CREATE_REPLICATION_SLOT \"{}\" PHYSICAL RESERVE_WAL",
                slot.replace('"', "\"\"")
            ))
            .await
        {
            Ok(_) => Ok(true),
            Err(PgClientError::Server(e)) if e.code == "42710" => Ok(false),
            Err(e) => Err(e),
        }
    }
}
