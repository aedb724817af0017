//! PostgreSQL frontend/backend protocol (v3) as walrelay speaks it, sans-IO: no sockets, no
//! runtime. The relay runtime (`walrelay`) owns the sockets; the fuzz targets drive these
//! parsers directly.
//!
//! Map:
//!
//! - this module: message framing (startup packets, tagged messages), frontend messages,
//!   encoders of backend messages ([`encode`]), replication stream messages ([`repl`]);
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

pub mod negotiate;
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
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
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
    /// Value of a startup parameter.
    pub fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
        params
            .iter()
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

/// Encoders of backend messages (server → client) and frontend messages (client → server).
pub mod encode {
    use super::*;

    /// Appends a tagged message whose body is produced by `body`.
    pub fn tagged(out: &mut BytesMut, tag: u8, body: impl FnOnce(&mut BytesMut)) {
        out.put_u8(tag);
        let at = out.len();
        out.put_u32(0);
        body(out);
        let len = (out.len() - at) as u32;
        out[at..at + 4].copy_from_slice(&len.to_be_bytes());
    }

    fn cstr(out: &mut BytesMut, s: &str) {
        out.put_slice(s.as_bytes());
        out.put_u8(0);
    }

    pub fn auth_ok(out: &mut BytesMut) {
        tagged(out, b'R', |b| b.put_u32(0));
    }
    pub fn auth_sasl(out: &mut BytesMut, mechanisms: &[&str]) {
        tagged(out, b'R', |b| {
            b.put_u32(10);
            for m in mechanisms {
                cstr(b, m);
            }
            b.put_u8(0);
        });
    }
    pub fn auth_sasl_continue(out: &mut BytesMut, data: &[u8]) {
        tagged(out, b'R', |b| {
            b.put_u32(11);
            b.put_slice(data);
        });
    }
    pub fn auth_sasl_final(out: &mut BytesMut, data: &[u8]) {
        tagged(out, b'R', |b| {
            b.put_u32(12);
            b.put_slice(data);
        });
    }
    pub fn parameter_status(out: &mut BytesMut, name: &str, value: &str) {
        tagged(out, b'S', |b| {
            cstr(b, name);
            cstr(b, value);
        });
    }
    pub fn backend_key_data(out: &mut BytesMut, pid: u32, key: u32) {
        tagged(out, b'K', |b| {
            b.put_u32(pid);
            b.put_u32(key);
        });
    }
    pub fn ready_for_query(out: &mut BytesMut) {
        tagged(out, b'Z', |b| b.put_u8(b'I'));
    }
    /// NegotiateProtocolVersion ('v'): the whole version number the server will speak and
    /// the protocol options it did not recognize (see [`crate::negotiate`]).
    pub fn negotiate_protocol_version(out: &mut BytesMut, n: &crate::negotiate::Negotiation) {
        tagged(out, b'v', |b| {
            b.put_u32(n.version);
            b.put_u32(n.unrecognized.len() as u32);
            for o in &n.unrecognized {
                cstr(b, o);
            }
        });
    }
    pub fn error_response(out: &mut BytesMut, e: &ErrorFields) {
        tagged(out, b'E', |b| {
            for (code, v) in [
                (b'S', Some(&e.severity)),
                (b'V', Some(&e.severity)),
                (b'C', Some(&e.code)),
                (b'M', Some(&e.message)),
                (b'D', e.detail.as_ref()),
                (b'H', e.hint.as_ref()),
            ] {
                if let Some(v) = v {
                    b.put_u8(code);
                    cstr(b, v);
                }
            }
            b.put_u8(0);
        });
    }
    pub fn copy_data(out: &mut BytesMut, payload: &[u8]) {
        tagged(out, b'd', |b| b.put_slice(payload));
    }
    pub fn copy_done(out: &mut BytesMut) {
        tagged(out, b'c', |_| {});
    }
    pub fn query(out: &mut BytesMut, sql: &str) {
        tagged(out, b'Q', |b| cstr(b, sql));
    }
    pub fn terminate(out: &mut BytesMut) {
        tagged(out, b'X', |_| {});
    }
    pub fn password(out: &mut BytesMut, pw: &str) {
        tagged(out, b'p', |b| cstr(b, pw));
    }
    pub fn sasl_initial_response(out: &mut BytesMut, mechanism: &str, data: &[u8]) {
        tagged(out, b'p', |b| {
            cstr(b, mechanism);
            b.put_i32(data.len() as i32);
            b.put_slice(data);
        });
    }
    pub fn sasl_response(out: &mut BytesMut, data: &[u8]) {
        tagged(out, b'p', |b| b.put_slice(data));
    }
    /// A protocol-3.0 startup packet.
    pub fn startup(out: &mut BytesMut, params: &[(&str, &str)]) {
        let at = out.len();
        out.put_u32(0);
        out.put_u32(PROTOCOL_3_0);
        for (k, v) in params {
            cstr(out, k);
            cstr(out, v);
        }
        out.put_u8(0);
        let len = (out.len() - at) as u32;
        out[at..at + 4].copy_from_slice(&len.to_be_bytes());
    }
    pub fn ssl_request(out: &mut BytesMut) {
        out.put_u32(8);
        out.put_u32(SSL_REQUEST);
    }
    /// A CancelRequest for the backend whose BackendKeyData was (`pid`, `key`).
    pub fn cancel_request(out: &mut BytesMut, pid: u32, key: u32) {
        out.put_u32(16);
        out.put_u32(CANCEL_REQUEST);
        out.put_u32(pid);
        out.put_u32(key);
    }
}

/// Replication sub-protocol messages inside CopyData.
pub mod repl {
    use super::*;
    use walrelay_wal::lsn::Lsn;

    /// Size of the XLogData header after the 'w' byte: start, end, send time.
    pub const XLOGDATA_HEADER: usize = 24;

    /// An XLogData message ('w'): WAL bytes starting at `start`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct XLogData {
        pub start: Lsn,
        pub end: Lsn,
        pub send_time: i64,
        pub data: Bytes,
    }

    impl XLogData {
        /// Parses a CopyData payload that starts with 'w'; None if it is another kind. The WAL
        /// bytes must end inside the WAL address space (see [`XLogData::data_end`]).
        pub fn parse(payload: &Bytes) -> Result<Option<XLogData>, WireError> {
            if payload.first() != Some(&b'w') {
                return Ok(None);
            }
            if payload.len() < 1 + XLOGDATA_HEADER {
                return Err(WireError::Malformed {
                    tag: 'w',
                    what: "XLogData shorter than its header",
                });
            }
            let mut p = payload.slice(1..);
            let start = Lsn(p.get_u64());
            let end = Lsn(p.get_u64());
            let send_time = p.get_i64();
            let x = XLogData {
                start,
                end,
                send_time,
                data: p,
            };
            if x.data_end().is_none() {
                return Err(WireError::Malformed {
                    tag: 'w',
                    what: "XLogData runs past the end of the WAL address space",
                });
            }
            Ok(Some(x))
        }

        /// The position just after the WAL bytes (`start` + their length), `None` past the end
        /// of the WAL address space (never for a parsed message).
        pub fn data_end(&self) -> Option<Lsn> {
            self.start.checked_add(u64::try_from(self.data.len()).ok()?)
        }

        /// Appends the complete CopyData message carrying this XLogData.
        pub fn encode_copy_data(&self, out: &mut BytesMut) {
            tagged_copy(out, 1 + XLOGDATA_HEADER + self.data.len(), |b| {
                b.put_u8(b'w');
                b.put_u64(self.start.0);
                b.put_u64(self.end.0);
                b.put_i64(self.send_time);
                b.put_slice(&self.data);
            });
        }
    }

    fn tagged_copy(out: &mut BytesMut, body_len: usize, body: impl FnOnce(&mut BytesMut)) {
        out.reserve(5 + body_len);
        super::encode::tagged(out, b'd', body);
    }

    /// Length of a standby status update ('r'): write, flush, apply, time, reply flag.
    pub const STATUS_UPDATE_LEN: usize = 1 + 8 + 8 + 8 + 8 + 1;
    /// Length of a hot-standby feedback message ('h'): time, xmin, epoch, catalog xmin, epoch.
    pub const HS_FEEDBACK_LEN: usize = 1 + 8 + 4 + 4 + 4 + 4;

    /// Checks that a CopyData payload from a standby is a well-formed feedback message.
    pub fn check_feedback(payload: &[u8]) -> Result<(), WireError> {
        let ok = match payload.first() {
            Some(b'r') => payload.len() == STATUS_UPDATE_LEN,
            Some(b'h') => payload.len() == HS_FEEDBACK_LEN,
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(WireError::Malformed { tag: 'd', what: "CopyData from the standby is neither a status update ('r') nor hot-standby feedback ('h') of the right length" })
        }
    }

    /// Positions reported by a standby status update ('r'), for logs and metrics.
    pub fn status_positions(payload: &[u8]) -> Option<(Lsn, Lsn, Lsn)> {
        if payload.len() != STATUS_UPDATE_LEN || payload[0] != b'r' {
            return None;
        }
        let rd = |i: usize| {
            Lsn(u64::from_be_bytes(
                payload[i..i + 8].try_into().unwrap_or([0; 8]),
            ))
        };
        Some((rd(1), rd(9), rd(17)))
    }

    /// A status update ('r') whose write, flush and apply positions are each at most `max`:
    /// a standby cannot have WAL it was not sent, and the primary (synchronous replication,
    /// the slot) must not hear otherwise. Returns the update (clamped or as it was) and
    /// whether a position was lowered; any other message comes back as it is.
    pub fn clamp_status_update(payload: &[u8], max: Lsn) -> (std::borrow::Cow<'_, [u8]>, bool) {
        let Some((w, f, a)) = status_positions(payload) else {
            return (std::borrow::Cow::Borrowed(payload), false);
        };
        if w <= max && f <= max && a <= max {
            return (std::borrow::Cow::Borrowed(payload), false);
        }
        let mut out = payload.to_vec();
        for (i, v) in [(1, w), (9, f), (17, a)] {
            out[i..i + 8].copy_from_slice(&v.min(max).0.to_be_bytes());
        }
        (std::borrow::Cow::Owned(out), true)
    }

    /// Length of a primary keepalive ('k'): walEnd, sendTime, replyRequested.
    pub const KEEPALIVE_LEN: usize = 1 + 8 + 8 + 1;

    /// Microseconds since 2000-01-01 (PostgreSQL's epoch), now: the send time of replication
    /// messages.
    pub fn pg_now() -> i64 {
        const PG_EPOCH_UNIX_SECS: u64 = 946_684_800;
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let us = unix.as_micros() as i64;
        us - (PG_EPOCH_UNIX_SECS as i64) * 1_000_000
    }

    /// Whether a primary keepalive CopyData payload ('k') asks the standby to reply at once.
    pub fn keepalive_wants_reply(payload: &[u8]) -> bool {
        payload.len() == KEEPALIVE_LEN && payload[0] == b'k' && payload[17] != 0
    }

    /// The `walEnd` of a primary keepalive CopyData payload ('k'), for metrics.
    pub fn keepalive_end(payload: &[u8]) -> Option<Lsn> {
        if payload.len() != KEEPALIVE_LEN || payload[0] != b'k' {
            return None;
        }
        Some(Lsn(u64::from_be_bytes(payload[1..9].try_into().ok()?)))
    }
}

#[cfg(test)]
mod tests;
