//! PostgreSQL frontend/backend protocol (v3) as walrelay speaks it, sans-IO: no sockets, no
//! runtime. The relay runtime (`walrelay`) owns the sockets; the fuzz targets drive these
//! parsers directly.
//!
//! Map:
//!
//! - this module: message framing (startup packets, tagged messages), frontend messages,
//!   error fields;
//! - [`encode`]: encoders of backend messages (and of the frontend messages the relay sends);
//! - [`repl`]: replication stream messages inside CopyData (XLogData, keepalives, feedback);
//! - [`negotiate`]: protocol version negotiation at startup (NegotiateProtocolVersion);
//! - [`replcmd`]: the replication commands a standby may send, parsed, validated, re-rendered;
//! - [`results`]: result sets a walsender sends (IDENTIFY_SYSTEM, TIMELINE_HISTORY, ...);
//! - [`scan`]: message boundaries in a stream passed on unbuffered (a tunnel's backend side);
//! - [`scram`]: the server side of SCRAM-SHA-256;
//! - [`syncrep`]: which standbys `synchronous_standby_names` lets a commit wait for.
//!
//! Framing on the wire:
//!
//! ```text
//! startup packet:  int32 len (incl. itself) | int32 code | body        (no tag byte)
//!                  code 196608 = protocol 3.0 + "name\0value\0...\0"
//!                  code 80877103 = SSLRequest, 80877104 = GSSENCRequest,
//!                  80877102 = CancelRequest (pid, key)
//! other messages:  byte tag | int32 len (incl. itself, not the tag) | body
//! ```
//!
//! Every length read from the wire is checked against a cap *before* any body is buffered, so
//! a peer announcing an absurd length gets an error, never a large allocation. Parsers take a
//! `&mut BytesMut` and return `Ok(None)` until a whole message is buffered; they consume nothing
//! until they return a message, so they can be retried after more bytes arrive.
//!
//! The one cancellation-safe adapter that owns a socket is `walrelay::pgio`.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod encode;
pub mod negotiate;
pub mod repl;
pub mod replcmd;
pub mod replparam;
pub mod results;
pub mod scan;
pub mod scram;
pub mod syncrep;

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Largest startup packet accepted (PostgreSQL uses the same limit, MAX_STARTUP_PACKET_LENGTH).
pub const MAX_STARTUP_LEN: usize = 10_000;
/// Protocol 3.0 in a startup packet.
pub const PROTOCOL_3_0: u32 = 196_608;
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;
const CANCEL_REQUEST: u32 = 80_877_102;

/// Errors of the wire protocol: the peer sent something we will not accept.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("invalid startup packet length {0} (allowed 8..={MAX_STARTUP_LEN})")]
    StartupLength(u32),
    #[error("unsupported frontend protocol {major}.{minor}: walrelay speaks protocol 3")]
    UnsupportedProtocol { major: u16, minor: u16 },
    #[error("invalid startup packet: {0}")]
    BadStartup(&'static str),
    #[error("message '{tag}' announces {len} bytes, more than the {cap} allowed")]
    TooLong { tag: char, len: usize, cap: usize },
    #[error("message '{tag}' has invalid length {len}")]
    BadLength { tag: char, len: u32 },
    #[error("malformed '{tag}' message: {what}")]
    Malformed { tag: char, what: &'static str },
    #[error("connection closed by peer")]
    Closed,
    /// The cause is in the message and not also the error's `source()`, which a printed
    /// chain (`{:#}`) would repeat.
    #[error("I/O error: {0}")]
    Io(std::io::Error),
}

impl From<std::io::Error> for WireError {
    fn from(e: std::io::Error) -> Self {
        WireError::Io(e)
    }
}

/// The first packet of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupPacket {
    SslRequest,
    GssEncRequest,
    Cancel {
        pid: u32,
        key: u32,
    },
    Startup {
        minor: u16,
        params: Vec<(String, String)>,
    },
}

impl StartupPacket {
    /// Value of a startup parameter: of its last occurrence, as PostgreSQL's
    /// `ProcessStartupPacket` reads a packet that names one twice (each overwrites the one
    /// before).
    pub fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
        params
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses a startup packet (no tag byte). See the module docs for the format.
pub fn parse_startup(buf: &mut BytesMut) -> Result<Option<StartupPacket>, WireError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if !(8..=MAX_STARTUP_LEN as u32).contains(&len) {
        return Err(WireError::StartupLength(len));
    }
    if buf.len() < len as usize {
        return Ok(None);
    }
    let mut pkt = buf.split_to(len as usize).freeze();
    pkt.advance(4);
    let code = pkt.get_u32(); // len >= 8 checked above
    match code {
        SSL_REQUEST | GSSENC_REQUEST if pkt.is_empty() => Ok(Some(if code == SSL_REQUEST {
            StartupPacket::SslRequest
        } else {
            StartupPacket::GssEncRequest
        })),
        CANCEL_REQUEST if pkt.len() >= 8 => {
            let pid = pkt.get_u32();
            let key = pkt.get_u32();
            Ok(Some(StartupPacket::Cancel { pid, key }))
        }
        SSL_REQUEST | GSSENC_REQUEST | CANCEL_REQUEST => {
            Err(WireError::BadStartup("wrong length for request code"))
        }
        _ => {
            let (major, minor) = ((code >> 16) as u16, code as u16);
            if major != 3 {
                return Err(WireError::UnsupportedProtocol { major, minor });
            }
            let mut params = Vec::new();
            loop {
                let name = take_cstr(&mut pkt)
                    .ok_or(WireError::BadStartup("unterminated parameter name"))?;
                if name.is_empty() {
                    break;
                }
                let value = take_cstr(&mut pkt)
                    .ok_or(WireError::BadStartup("unterminated parameter value"))?;
                params.push((name, value));
            }
            if !pkt.is_empty() {
                return Err(WireError::BadStartup("bytes after the parameter list"));
            }
            Ok(Some(StartupPacket::Startup { minor, params }))
        }
    }
}

/// `s` cut to at most `max` bytes (at a character boundary) with "..." when cut, for quoting
/// peer-supplied text in error messages.
pub fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", s.get(..end).unwrap_or_default())
}

/// `s` with its control characters (and the Unicode line and paragraph separators) escaped as
/// Rust escapes them (`\n`, `\u{85}`), for logging text a peer chose (a user name, a startup
/// parameter): the text log's formatter escapes only terminal sequences, so a newline there
/// would let the peer start a line of its own making. Other text is left as it is.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}');
    if !s.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match unsafe_char(c) {
            true => out.extend(c.escape_default()),
            false => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Takes a NUL-terminated string (lossy UTF-8). None when there is no NUL.
fn take_cstr(b: &mut Bytes) -> Option<String> {
    let nul = b.iter().position(|&c| c == 0)?;
    let s = String::from_utf8_lossy(&b[..nul]).into_owned();
    b.advance(nul + 1);
    Some(s)
}

/// A complete tagged message, body without tag and length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawMsg {
    pub tag: u8,
    pub body: Bytes,
}

impl RawMsg {
    /// The columns of a DataRow ('D') body: `None` for SQL NULL. Every length is checked
    /// against the body before it is used.
    pub fn data_row(&self) -> Result<Vec<Option<&[u8]>>, WireError> {
        let bad = |what| WireError::Malformed { tag: 'D', what };
        if self.tag != b'D' {
            return Err(bad("not a DataRow"));
        }
        let mut b: &[u8] = &self.body;
        let n = b.get(..2).ok_or(bad("short column count"))?;
        let n = u16::from_be_bytes([n[0], n[1]]) as usize;
        b = &b[2..];
        let mut cols = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            let l = b.get(..4).ok_or(bad("short column length"))?;
            let l = i32::from_be_bytes([l[0], l[1], l[2], l[3]]);
            b = &b[4..];
            if l < 0 {
                cols.push(None);
                continue;
            }
            let v = b
                .get(..l as usize)
                .ok_or(bad("column longer than the row"))?;
            cols.push(Some(v));
            b = &b[l as usize..];
        }
        if !b.is_empty() {
            return Err(bad("bytes after the last column"));
        }
        Ok(cols)
    }

    /// The message re-encoded as on the wire (tag, length, body).
    pub fn encode(&self, out: &mut BytesMut) {
        out.reserve(5 + self.body.len());
        out.put_u8(self.tag);
        out.put_u32(self.body.len() as u32 + 4);
        out.put_slice(&self.body);
    }
}

/// Parses one tagged message whose body is at most `cap(tag)` bytes.
pub fn parse_tagged(
    buf: &mut BytesMut,
    cap: impl Fn(u8) -> usize,
) -> Result<Option<RawMsg>, WireError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let tag = buf[0];
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    if len < 4 {
        return Err(WireError::BadLength {
            tag: tag as char,
            len,
        });
    }
    let bad_length = || WireError::BadLength {
        tag: tag as char,
        len,
    };
    let body_len = usize::try_from(len - 4).map_err(|_| bad_length())?;
    let max = cap(tag);
    if body_len > max {
        return Err(WireError::TooLong {
            tag: tag as char,
            len: body_len,
            cap: max,
        });
    }
    let whole = body_len.checked_add(5).ok_or_else(bad_length)?;
    if buf.len() < whole {
        buf.reserve(whole - buf.len());
        return Ok(None);
    }
    buf.advance(5);
    let body = buf.split_to(body_len).freeze();
    Ok(Some(RawMsg { tag, body }))
}

/// Messages a standby (or pg_receivewal) sends to a walsender after startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrontendMsg {
    /// 'Q': a simple query (replication command).
    Query(String),
    /// 'd': CopyData payload.
    CopyData(Bytes),
    /// 'c'
    CopyDone,
    /// 'f': CopyFail with the client's reason.
    CopyFail(String),
    /// 'X'
    Terminate,
    /// 'p': password, SASLInitialResponse or SASLResponse; the body is interpreted by the
    /// authentication step that expects it.
    Password(Bytes),
    /// Anything else (extended query protocol, function call...): not served by a walsender.
    Other(u8),
}

/// Body caps for frontend messages, by tag. A walsender needs little from its client.
pub fn frontend_cap(tag: u8) -> usize {
    match tag {
        b'Q' => 64 * 1024,
        b'd' => 64 * 1024,
        b'p' => 8 * 1024,
        b'f' => 8 * 1024,
        _ => 64 * 1024,
    }
}

/// Parses one frontend message (after the startup packet).
pub fn parse_frontend(buf: &mut BytesMut) -> Result<Option<FrontendMsg>, WireError> {
    let Some(RawMsg { tag, body }) = parse_tagged(buf, frontend_cap)? else {
        return Ok(None);
    };
    let msg = match tag {
        b'Q' => FrontendMsg::Query(cstr_body(tag, &body)?),
        b'd' => FrontendMsg::CopyData(body),
        b'c' => FrontendMsg::CopyDone,
        b'f' => FrontendMsg::CopyFail(cstr_body(tag, &body)?),
        b'X' => FrontendMsg::Terminate,
        b'p' => FrontendMsg::Password(body),
        other => FrontendMsg::Other(other),
    };
    Ok(Some(msg))
}

/// A body that is exactly one NUL-terminated string.
fn cstr_body(tag: u8, body: &[u8]) -> Result<String, WireError> {
    match body.split_last() {
        Some((0, s)) if !s.contains(&0) => {
            std::str::from_utf8(s)
                .map(str::to_owned)
                .map_err(|_| WireError::Malformed {
                    tag: tag as char,
                    what: "not UTF-8",
                })
        }
        _ => Err(WireError::Malformed {
            tag: tag as char,
            what: "string not NUL-terminated",
        }),
    }
}

/// Reads a SASLInitialResponse body: mechanism name, int32 length (-1 = none), data.
pub fn parse_sasl_initial(body: &[u8]) -> Result<(String, Bytes), WireError> {
    let bad = |what| WireError::Malformed { tag: 'p', what };
    let mut b = Bytes::copy_from_slice(body);
    let mech = take_cstr(&mut b).ok_or(bad("unterminated SASL mechanism"))?;
    if b.len() < 4 {
        return Err(bad("missing SASL data length"));
    }
    let n = b.get_i32();
    if n == -1 {
        return Ok((mech, Bytes::new()));
    }
    if n < 0 || n as usize != b.len() {
        return Err(bad("SASL data length does not match the message"));
    }
    Ok((mech, b))
}

/// Fields of an ErrorResponse / NoticeResponse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorFields {
    pub severity: String,
    pub code: String,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

impl ErrorFields {
    /// An ERROR (the session goes on).
    pub fn error(code: &str, message: impl Into<String>) -> Self {
        ErrorFields {
            severity: "ERROR".into(),
            code: code.into(),
            message: message.into(),
            detail: None,
            hint: None,
        }
    }
    /// A FATAL error (the connection closes after it).
    pub fn fatal(code: &str, message: impl Into<String>) -> Self {
        ErrorFields {
            severity: "FATAL".into(),
            ..Self::error(code, message)
        }
    }
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// Parses an ErrorResponse/NoticeResponse body (tolerant: unknown fields ignored).
    pub fn parse(body: &[u8]) -> Result<ErrorFields, WireError> {
        let mut b = Bytes::copy_from_slice(body);
        let mut f = ErrorFields::error("XX000", "");
        while let Some((&code, _)) = b.split_first() {
            b.advance(1);
            if code == 0 {
                break;
            }
            let v = take_cstr(&mut b).ok_or(WireError::Malformed {
                tag: 'E',
                what: "unterminated field",
            })?;
            match code {
                b'S' => f.severity = v,
                b'C' => f.code = v,
                b'M' => f.message = v,
                b'D' => f.detail = Some(v),
                b'H' => f.hint = Some(v),
                _ => {}
            }
        }
        Ok(f)
    }
}

impl std::fmt::Display for ErrorFields {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} (SQLSTATE {})",
            self.severity, self.message, self.code
        )?;
        if let Some(d) = &self.detail {
            write!(f, "; detail: {d}")?;
        }
        if let Some(h) = &self.hint {
            write!(f, "; hint: {h}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
