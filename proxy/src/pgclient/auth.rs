//! Authentication of the client connection to the primary: trust, password, md5 and
//! SCRAM-SHA-256 (without channel binding), as libpq answers each request.

use bytes::{Buf, BytesMut};
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::{read_msg, split_cstrs, PgClientError};
use crate::conninfo::ConnInfo;
use crate::pgio::MsgReader;
use walrelay_pgwire::{encode, ErrorFields, WireError};

pub(super) async fn authenticate<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
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
                let mut s = scram.take().ok_or(PgClientError::Unexpected(
                    'R',
                    "SASL continue without SASL start",
                ))?;
                // The salted password takes the primary's iteration count of HMACs (up to
                // 100,000, about 0.1 s): on a blocking thread, not on a worker the WAL
                // stream's tasks need, as a storm of standbys reconnecting would have it.
                let first = body.clone();
                let (s, r) = tokio::task::spawn_blocking(move || {
                    let r = s.update(&first);
                    (s, r)
                })
                .await
                .map_err(|e| PgClientError::Scram(format!("SCRAM computation failed: {e}")))?;
                r.map_err(|e| server_first_refused(&body, &ci.user, e))?;
                encode::sasl_response(&mut out, s.message());
                scram = Some(s);
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

/// Most PBKDF2 iterations postgres-protocol's SCRAM client computes (its
/// `MAX_ITERATION_COUNT`): a primary, or whoever answers in its place, could otherwise have
/// every connection attempt burn CPU. libpq takes any count; PostgreSQL's default is 4096.
pub(super) const MAX_SCRAM_ITERATIONS: u64 = 100_000;

/// Why the primary's server-first-message was refused: for an iteration count above
/// [`MAX_SCRAM_ITERATIONS`] (a `scram_iterations` raised on the primary), what to change.
fn server_first_refused(msg: &[u8], user: &str, e: std::io::Error) -> PgClientError {
    let iterations = std::str::from_utf8(msg)
        .ok()
        .and_then(|m| m.split(',').find_map(|a| a.strip_prefix("i=")))
        .and_then(|i| i.parse::<u64>().ok());
    match iterations {
        Some(i) if i > MAX_SCRAM_ITERATIONS => PgClientError::Scram(format!(
            "the primary's SCRAM secret of user {user:?} takes {i} iterations, more than the \
             {MAX_SCRAM_ITERATIONS} walrelay computes: set scram_iterations to at most \
             {MAX_SCRAM_ITERATIONS} on the primary (4096 is its default) and set that user's \
             password again"
        )),
        _ => PgClientError::Scram(format!("invalid server-first-message: {e}")),
    }
}
