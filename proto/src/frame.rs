//! Link frames (link protocol 3): what one gRPC message carries after the handshake, in both
//! directions, sans-IO.
//!
//! A link message costs about 40 bytes before its content (TLS record, HTTP/2 DATA frame,
//! gRPC prefix, protobuf field), so the halves put everything that is ready, or becomes ready
//! within a short window, into one frame: several WAL runs, the primary's other messages, or a
//! standby's latest feedback. Each frame carries ONE checksum over everything it restores.
//!
//! ```text
//! frame    = item+ xxh3:u64le
//!
//! upstream → downstream items
//!   WAL      0x01 zz(start - expected):varint zz(end - (start + raw_len)):varint
//!                 zz(send_time - previous send_time):varint raw_len:varint
//!                 payload_len:varint payload          -- payload: the session codec's output
//!   BACKEND  0x02 len:varint bytes                    -- whole backend messages, verbatim
//!
//! downstream → upstream items
//!   STATUS   0x11 reply:u8 zz(write - previous write):varint zz(write - flush):varint
//!                 zz(flush - apply):varint zz(time - previous time):varint
//!   HSFEED   0x12 zz(time - previous time):varint xmin:varint xmin_epoch:varint
//!                 catalog_xmin:varint catalog_xmin_epoch:varint
//!   COMMAND  0x13 len:varint bytes                    -- a protobuf `Command`
//!   COPYDONE 0x14
//! ```
//!
//! Varints are unsigned LEB128 (at most 10 bytes), `zz` is zigzag. Differences are taken
//! modulo 2^64 (so any value round-trips) against state both ends keep per session and update
//! item by item: "expected" is the end of the previous WAL item (0 at first), "previous" is
//! the previous item of the same kind. STATUS and HSFEED restore the standby's 'r' and 'h'
//! messages byte for byte; a WAL item restores an XLogData header (start, end, send time)
//! and, through the codec, its bytes.
//!
//! The checksum is xxh3-64 over the frame's *restored* content ([`Digest`]): per item a kind
//! byte, then for WAL the header fields (start, end, send_time as u64le, raw_len as u32le) and
//! the restored WAL bytes, for BACKEND its bytes, for STATUS and HSFEED the standby's original
//! message, for COMMAND its protobuf bytes. The receiver restores every item, then checks the
//! sum before anything of the frame leaves it: a corrupted position, length, WAL byte or
//! feedback field never reaches a standby or the primary.

use xxhash_rust::xxh3::Xxh3;

/// Item kinds (the first byte of an item, and the kind byte of its digest).
pub const ITEM_WAL: u8 = 0x01;
pub const ITEM_BACKEND: u8 = 0x02;
pub const ITEM_STATUS: u8 = 0x11;
pub const ITEM_HSFEED: u8 = 0x12;
pub const ITEM_COMMAND: u8 = 0x13;
pub const ITEM_COPYDONE: u8 = 0x14;

/// Length of a standby status update ('r'): write, flush, apply, time, reply flag.
pub const STATUS_LEN: usize = 1 + 8 + 8 + 8 + 8 + 1;
/// Length of a hot-standby feedback message ('h'): time, xmin, epoch, catalog xmin, epoch.
pub const HSFEED_LEN: usize = 1 + 8 + 4 + 4 + 4 + 4;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("link frame ends early ({0})")]
    Short(&'static str),
    #[error("link frame has an overlong varint")]
    Varint,
    #[error("link frame item 0x{0:02x} is unknown or not allowed in this direction")]
    UnknownItem(u8),
    #[error("link frame announces {len} bytes of {what}, more than the limit of {max}")]
    TooLong {
        what: &'static str,
        len: u64,
        max: usize,
    },
    #[error("link frame has no items")]
    Empty,
    #[error("feedback message is not a well-formed '{0}' message")]
    BadFeedback(char),
}

/// XLogData header fields in absolute form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WalHeader {
    pub start: u64,
    pub end: u64,
    pub send_time: i64,
    pub raw_len: u32,
}

/// An item of an upstream → downstream frame, borrowing from the frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DownItem<'a> {
    Wal {
        header: WalHeader,
        payload: &'a [u8],
    },
    Backend(&'a [u8]),
}

/// An item of a downstream → upstream frame. Feedback is restored to the standby's original
/// CopyData payload ('r' or 'h' message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpItem<'a> {
    Feedback([u8; STATUS_LEN], usize),
    Command(&'a [u8]),
    CopyDone,
}

impl UpItem<'_> {
    /// The standby's feedback message, as it sent it.
    pub fn feedback(&self) -> Option<&[u8]> {
        match self {
            UpItem::Feedback(b, n) => Some(&b[..*n]),
            _ => None,
        }
    }
}

/// The checksum of a frame's restored content (see the module docs); both ends feed it the
/// same way.
pub struct Digest(Xxh3);

impl Default for Digest {
    fn default() -> Self {
        Digest(Xxh3::new())
    }
}

impl Digest {
    pub fn wal(&mut self, h: &WalHeader, raw: &[u8]) {
        let mut b = [0u8; 29];
        b[0] = ITEM_WAL;
        b[1..9].copy_from_slice(&h.start.to_le_bytes());
        b[9..17].copy_from_slice(&h.end.to_le_bytes());
        b[17..25].copy_from_slice(&h.send_time.to_le_bytes());
        b[25..].copy_from_slice(&h.raw_len.to_le_bytes());
        self.0.update(&b);
        self.0.update(raw);
    }

    fn tagged(&mut self, kind: u8, bytes: &[u8]) {
        self.0.update(&[kind]);
        self.0.update(&(bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
    }

    pub fn backend(&mut self, bytes: &[u8]) {
        self.tagged(ITEM_BACKEND, bytes);
    }

    pub fn up(&mut self, item: &UpItem<'_>) {
        match item {
            UpItem::Feedback(b, n) => self.tagged(b[0], &b[..*n]),
            UpItem::Command(c) => self.tagged(ITEM_COMMAND, c),
            UpItem::CopyDone => self.tagged(ITEM_COPYDONE, &[]),
        }
    }

    pub fn finish(&self) -> u64 {
        self.0.digest()
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zz(v: u64) -> u64 {
    let v = v as i64;
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzz(v: u64) -> u64 {
    (((v >> 1) as i64) ^ -((v & 1) as i64)) as u64
}

/// A bounds-checked cursor over a frame.
struct Cursor<'a> {
    buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn u8(&mut self, what: &'static str) -> Result<u8, FrameError> {
        let (&b, rest) = self.buf.split_first().ok_or(FrameError::Short(what))?;
        self.buf = rest;
        Ok(b)
    }

    fn varint(&mut self, what: &'static str) -> Result<u64, FrameError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8(what)?;
            v |= u64::from(b & 0x7F) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(FrameError::Varint)
    }

    fn bytes(&mut self, what: &'static str, max: usize) -> Result<&'a [u8], FrameError> {
        let len = self.varint(what)?;
        if len > max as u64 {
            return Err(FrameError::TooLong { what, len, max });
        }
        if len > self.buf.len() as u64 {
            return Err(FrameError::Short(what));
        }
        let (b, rest) = self.buf.split_at(len as usize);
        self.buf = rest;
        Ok(b)
    }
}

/// Splits off the trailing checksum.
fn body(frame: &[u8]) -> Result<(&[u8], u64), FrameError> {
    if frame.len() < 9 {
        return Err(if frame.len() == 8 {
            FrameError::Empty
        } else {
            FrameError::Short("checksum")
        });
    }
    let (body, sum) = frame.split_at(frame.len() - 8);
    let mut s = [0u8; 8];
    s.copy_from_slice(sum);
    Ok((body, u64::from_le_bytes(s)))
}

/// Per-session state of the upstream → downstream direction (one on each end).
#[derive(Debug, Default)]
pub struct DownState {
    next_start: u64,
    send_time: i64,
}

impl DownState {
    /// Appends a WAL item (the codec's `payload` for `h.raw_len` WAL bytes).
    pub fn put_wal(&mut self, out: &mut Vec<u8>, h: &WalHeader, payload: &[u8]) {
        let data_end = h.start.wrapping_add(u64::from(h.raw_len));
        out.push(ITEM_WAL);
        put_varint(out, zz(h.start.wrapping_sub(self.next_start)));
        put_varint(out, zz(h.end.wrapping_sub(data_end)));
        put_varint(out, zz(h.send_time.wrapping_sub(self.send_time) as u64));
        put_varint(out, u64::from(h.raw_len));
        put_varint(out, payload.len() as u64);
        out.extend_from_slice(payload);
        self.next_start = data_end;
        self.send_time = h.send_time;
    }

    /// Parses a frame into items (WAL raw lengths capped at `max_raw`, payloads and backend
    /// messages at `max_bytes`) and its checksum. The positions advance as items are parsed.
    pub fn parse<'a>(
        &mut self,
        frame: &'a [u8],
        max_raw: usize,
        max_bytes: usize,
    ) -> Result<(Vec<DownItem<'a>>, u64), FrameError> {
        let (body, sum) = body(frame)?;
        let mut c = Cursor { buf: body };
        let mut items = Vec::new();
        while !c.buf.is_empty() {
            items.push(match c.u8("item")? {
                ITEM_WAL => {
                    let start = self.next_start.wrapping_add(unzz(c.varint("WAL start")?));
                    let end_delta = unzz(c.varint("WAL end")?);
                    let dt = unzz(c.varint("WAL send time")?) as i64;
                    let raw_len = c.varint("WAL length")?;
                    let too_long = FrameError::TooLong {
                        what: "WAL",
                        len: raw_len,
                        max: max_raw,
                    };
                    if raw_len > max_raw as u64 {
                        return Err(too_long);
                    }
                    let raw_len32 = u32::try_from(raw_len).map_err(|_| too_long)?;
                    let payload = c.bytes("WAL payload", max_bytes)?;
                    let data_end = start.wrapping_add(raw_len);
                    let header = WalHeader {
                        start,
                        end: data_end.wrapping_add(end_delta),
                        send_time: self.send_time.wrapping_add(dt),
                        raw_len: raw_len32,
                    };
                    self.next_start = data_end;
                    self.send_time = header.send_time;
                    DownItem::Wal { header, payload }
                }
                ITEM_BACKEND => DownItem::Backend(c.bytes("backend messages", max_bytes)?),
                other => return Err(FrameError::UnknownItem(other)),
            });
        }
        if items.is_empty() {
            return Err(FrameError::Empty);
        }
        Ok((items, sum))
    }
}

/// Appends a BACKEND item.
pub fn put_backend(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(ITEM_BACKEND);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Appends the checksum that ends a frame.
pub fn finish(out: &mut Vec<u8>, digest: &Digest) {
    out.extend_from_slice(&digest.finish().to_le_bytes());
}

/// Per-session state of the downstream → upstream direction (one on each end): the previous
/// status update's write position and time, and the previous hot-standby feedback's time.
#[derive(Debug, Default)]
pub struct UpState {
    write: u64,
    status_time: u64,
    hs_time: u64,
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

fn be32(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u64::from(u32::from_be_bytes(a))
}

impl UpState {
    /// Appends the standby's feedback message `msg` ('r' or 'h', as it sent it) compactly.
    pub fn put_feedback(&mut self, out: &mut Vec<u8>, msg: &[u8]) -> Result<(), FrameError> {
        match (msg.first(), msg.len()) {
            (Some(b'r'), STATUS_LEN) => {
                let (w, f, a, t) = (be64(msg, 1), be64(msg, 9), be64(msg, 17), be64(msg, 25));
                out.push(ITEM_STATUS);
                out.push(msg[33]);
                put_varint(out, zz(w.wrapping_sub(self.write)));
                put_varint(out, zz(w.wrapping_sub(f)));
                put_varint(out, zz(f.wrapping_sub(a)));
                put_varint(out, zz(t.wrapping_sub(self.status_time)));
                self.write = w;
                self.status_time = t;
                Ok(())
            }
            (Some(b'h'), HSFEED_LEN) => {
                let t = be64(msg, 1);
                out.push(ITEM_HSFEED);
                put_varint(out, zz(t.wrapping_sub(self.hs_time)));
                for at in [9, 13, 17, 21] {
                    put_varint(out, be32(msg, at));
                }
                self.hs_time = t;
                Ok(())
            }
            (Some(b'r'), _) => Err(FrameError::BadFeedback('r')),
            (Some(b'h'), _) => Err(FrameError::BadFeedback('h')),
            _ => Err(FrameError::BadFeedback('?')),
        }
    }

    /// Parses a frame into items (commands capped at `max_bytes`) and its checksum.
    pub fn parse<'a>(
        &mut self,
        frame: &'a [u8],
        max_bytes: usize,
    ) -> Result<(Vec<UpItem<'a>>, u64), FrameError> {
        let (body, sum) = body(frame)?;
        let mut c = Cursor { buf: body };
        let mut items = Vec::new();
        while !c.buf.is_empty() {
            items.push(match c.u8("item")? {
                ITEM_STATUS => self.status(&mut c)?,
                ITEM_HSFEED => self.hsfeed(&mut c)?,
                ITEM_COMMAND => UpItem::Command(c.bytes("command", max_bytes)?),
                ITEM_COPYDONE => UpItem::CopyDone,
                other => return Err(FrameError::UnknownItem(other)),
            });
        }
        if items.is_empty() {
            return Err(FrameError::Empty);
        }
        Ok((items, sum))
    }

    fn status(&mut self, c: &mut Cursor<'_>) -> Result<UpItem<'static>, FrameError> {
        let reply = c.u8("status")?;
        let w = self.write.wrapping_add(unzz(c.varint("status write")?));
        let f = w.wrapping_sub(unzz(c.varint("status flush")?));
        let a = f.wrapping_sub(unzz(c.varint("status apply")?));
        let t = self
            .status_time
            .wrapping_add(unzz(c.varint("status time")?));
        self.write = w;
        self.status_time = t;
        let mut b = [0u8; STATUS_LEN];
        b[0] = b'r';
        for (i, v) in [w, f, a, t].into_iter().enumerate() {
            b[1 + 8 * i..9 + 8 * i].copy_from_slice(&v.to_be_bytes());
        }
        b[33] = reply;
        Ok(UpItem::Feedback(b, STATUS_LEN))
    }

    fn hsfeed(&mut self, c: &mut Cursor<'_>) -> Result<UpItem<'static>, FrameError> {
        let t = self.hs_time.wrapping_add(unzz(c.varint("feedback time")?));
        self.hs_time = t;
        let mut b = [0u8; STATUS_LEN];
        b[0] = b'h';
        b[1..9].copy_from_slice(&t.to_be_bytes());
        for at in [9, 13, 17, 21] {
            let v = c.varint("feedback xid")?;
            let v = u32::try_from(v).map_err(|_| FrameError::TooLong {
                what: "feedback xid",
                len: v,
                max: u32::MAX as usize,
            })?;
            b[at..at + 4].copy_from_slice(&v.to_be_bytes());
        }
        Ok(UpItem::Feedback(b, HSFEED_LEN))
    }
}

/// Appends a COMMAND item (a protobuf `Command`).
pub fn put_command(out: &mut Vec<u8>, command: &[u8]) {
    out.push(ITEM_COMMAND);
    put_varint(out, command.len() as u64);
    out.extend_from_slice(command);
}

/// Appends a COPYDONE item.
pub fn put_copy_done(out: &mut Vec<u8>) {
    out.push(ITEM_COPYDONE);
}

#[cfg(test)]
mod tests;
