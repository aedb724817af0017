//! Link frames (link protocol 4 and 5): what one gRPC message of the `Stream` carries after the
//! handshake, in both directions, sans-IO.
//!
//! One stream per downstream carries the primary's WAL once, whatever the number of standbys,
//! and one *channel* per standby connected to that downstream (its commands, its feedback, the
//! answers of its own connection to the primary). A link message costs about 40 bytes before
//! its content (TLS record, HTTP/2 DATA frame, gRPC prefix, protobuf field), so the halves put
//! everything ready, or becoming ready within a short window, into one frame, which carries
//! ONE checksum over everything it restores.
//!
//! ```text
//! frame    = item+ xxh3:u64le
//!
//! upstream → downstream ([`Down`])
//!   WAL       0x01 zz(start - expected) zz(end - (start + raw_len)) zz(send_time - previous)
//!                  raw_len payload_len payload        -- payload: the stream codec's output
//!   BACKEND   0x02 chan len bytes                     -- the primary's answers for one standby
//!   KEEPALIVE 0x03 end zz(send_time - previous)       -- the primary's WAL end while idle
//!   TIMELINE  0x04 tli len history                    -- the stream continues on timeline tli
//!   STARTED   0x05 chan synchronous:u8                -- the standby's own connection streams
//!
//! downstream → upstream ([`Up`])
//!   STATUS    0x11 chan reply:u8 zz(write - previous write) zz(write - flush)
//!                  zz(flush - apply) zz(time - previous time)
//!   HSFEED    0x12 chan zz(time - previous time) xmin xmin_epoch catalog_xmin catalog_epoch
//!   COMMAND   0x13 chan len bytes                     -- a protobuf `Command`
//!   OPEN      0x15 chan len bytes                     -- a protobuf `StandbyInfo`
//!   START     0x16 chan len bytes                     -- a protobuf `StartReplication`
//!   CLOSE     0x17 chan
//!   DURABLE   0x18 tli end                            -- the spool is durable up to end
//!   ALIVE     0x19                                    -- nothing else to say (protocol 9)
//! ```
//!
//! A down frame's WAL items restore at most `max_raw` bytes each (the downstream's
//! `limits.max_message_bytes`) and at most [`wal_frame_max`]`(max_raw)` = 2 × `max_raw`
//! together: [`DownState::parse`] sums the announced raw lengths and refuses a frame past that
//! ([`FrameError::TotalTooLong`]), and the receiver restores nothing of a frame before it
//! parsed, so a small frame of many compressible items cannot make it allocate more. A correct
//! upstream puts one batch of its feed in a frame, after at most `hold_max` bytes held back
//! from the batch before (`proxy/src/upstream/encode.rs` `Framer::take_carry`, `held`). A
//! batch's WAL is at most `batch_max` bytes, or a single XLogData that alone was larger
//! (`proxy/src/upstream/feed.rs` `Batch::fits`, `gather`), and `batch_max + hold_max` is at
//! most the downstream's limit (`proxy/src/upstream/handshake.rs` `batch_max`, `hold_max`;
//! `limits.max_message_bytes` ≥ 256 kB). So a frame carries at most `max_raw` (held bytes
//! join the larger XLogData they precede in one item), and at most 2 × `max_raw` from the
//! parts alone (held bytes ≤ `max_raw`, the batch ≤ `batch_max` or one item ≤ `max_raw`),
//! which is the bound checked: the sender checks no per-frame total itself, and a refused
//! frame would stop replication (the upstream sends the same WAL again).
//!
//! Each half sends a frame at least every [`ALIVE_EVERY`] (the downstream an ALIVE item, the
//! upstream a KEEPALIVE with the primary's last end, when nothing else is due), and ends a
//! stream it has heard nothing from for [`SILENT_LIMIT`]: HTTP/2 pings prove the connection,
//! not the stream. A corrupted gRPC length prefix on a plaintext link (TLS would end the
//! connection) makes the receiver wait for bytes that never come: the standbys' feedback
//! would stop reaching the primary, with synchronous commits waiting on it, or an idle
//! primary's next WAL would not reach the standbys, until megabytes more had crossed.
//!
//! A *tunnel* (a client session the downstream does not serve itself: a base backup, a
//! logical replication or SQL connection, a physical session on a temporary slot) has its own
//! `Tunnel` call on the link's connection (HTTP/2 flow control per call bounds what either
//! end buffers for it, and a slow client never holds up the WAL stream); its frames carry:
//!
//! ```text
//! downstream → upstream ([`TunnelTx`]/[`TunnelRx`] with [`Dir::Up`])
//!   T_OPEN    0x21 len bytes                  -- a protobuf `TunnelOpen`: first item, once
//!   T_DATA    0x22 raw_len zlen zbytes        -- the client's protocol messages
//!   T_END     0x23 len reason                 -- the client left (reason empty) or was cut
//!
//! upstream → downstream ([`Dir::Down`])
//!   T_DATA    0x06 raw_len zlen zbytes        -- the primary's protocol messages
//!   T_END     0x07 len reason                 -- the primary's connection ended, and why
//! ```
//!
//! T_DATA bytes are zstd-compressed in one streaming context per direction of a tunnel
//! (the window spans frames), flushed at the end of every item, so each frame restores whole;
//! raw_len ≤ [`TUNNEL_DATA_MAX`] and the restored length must equal it. The DATA items of one
//! frame restore at most the receiver's budget together ([`TunnelRx::new`]; past it,
//! [`FrameError::TotalTooLong`] before the item that would pass it is decompressed):
//! [`tunnel_frame_max`]`(m)` = `m` + [`TUNNEL_DATA_MAX`], `m` the downstream's
//! `limits.max_message_bytes` (the upstream reads it from the `TunnelOpen`, at most 1 GiB,
//! and takes its own for the first frame, which carries the OPEN and at most one replication
//! command of 64 kB).
//! A correct downstream sends each client message (at most `m` + 5 bytes) in a frame of its
//! own (`proxy/src/walsender/tunnel/mod.rs` `TunnelSession::forward`); a correct upstream
//! sends per frame at most `read_chunk` ≤ [`TUNNEL_DATA_MAX`] bytes read from the primary
//! (`proxy/src/upstream/tunnel.rs` `TunnelSession::relay`), or the primary's startup reply (a
//! few parameters and what followed its ReadyForQuery), or an error. A tunnel frame's
//! checksum covers, per item, its kind, channel 0 and its restored bytes (OPEN: the protobuf;
//! DATA: the uncompressed bytes; END: the reason).
//!
//! Numbers are unsigned LEB128 varints (at most 10 bytes), `zz` is zigzag. Differences are
//! taken modulo 2^64 (any value round-trips) against state both ends keep and update item by
//! item: "expected" is the end of the previous WAL item, "previous" the previous item of the
//! same kind (of the same channel for feedback). STATUS and HSFEED restore the standby's 'r'
//! and 'h' messages byte for byte; a WAL item restores an XLogData header and, through the
//! codec, its bytes.
//!
//! The checksum is xxh3-64 over the frame's *restored* content ([`Digest`]): per item its kind
//! byte, then for WAL the header fields and the restored WAL bytes, for the others the channel
//! (u32le), the length (u64le) and the item's restored bytes (feedback: the standby's message;
//! KEEPALIVE: end and send time; TIMELINE: tli and history; STARTED: the flag; DURABLE: tli
//! and end; ALIVE: nothing). The receiver restores every item (within the per-frame totals
//! above, checked first), then checks the sum before anything of the frame leaves it: a
//! corrupted position, length, WAL byte or feedback field never reaches a standby or the
//! primary.

mod down;
mod tunnel;
mod up;

pub use down::{wal_frame_max, Down, DownState};
pub use tunnel::{
    tunnel_frame_max, Dir, TunnelItem, TunnelRx, TunnelTx, TUNNEL_DATA_MAX, TUNNEL_META_MAX,
};
pub use up::{Feedback, Up, UpState, HSFEED_LEN, MAX_CHANNELS, MAX_CONTROL_ITEM, STATUS_LEN};

use std::hash::Hasher as _;
use twox_hash::XxHash3_64;

/// Item kinds (the first byte of an item, and the kind byte of its digest).
pub const ITEM_WAL: u8 = 0x01;
pub const ITEM_BACKEND: u8 = 0x02;
pub const ITEM_KEEPALIVE: u8 = 0x03;
pub const ITEM_TIMELINE: u8 = 0x04;
pub const ITEM_STARTED: u8 = 0x05;
pub const ITEM_STATUS: u8 = 0x11;
pub const ITEM_HSFEED: u8 = 0x12;
pub const ITEM_COMMAND: u8 = 0x13;
pub const ITEM_OPEN: u8 = 0x15;
pub const ITEM_START: u8 = 0x16;
pub const ITEM_CLOSE: u8 = 0x17;
pub const ITEM_DURABLE: u8 = 0x18;
pub const ITEM_ALIVE: u8 = 0x19;

/// Longest either half stays silent on a stream (see the module docs).
/// Most items one stream frame may carry, in either direction. A parsed item takes up to 56
/// bytes and the smallest on the wire one, so without this a frame of one-byte items would
/// make the receiver hold about 100 times the frame. The senders stay far below it: an
/// upstream's batch ends at its first event (WAL runs that continue each other are one item),
/// and a downstream's frame holds at most a few items per channel, of at most
/// [`MAX_CHANNELS`].
pub const MAX_FRAME_ITEMS: usize = 1 << 16;
pub const ALIVE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
/// Silence after which either half ends a stream: six missed [`ALIVE_EVERY`]s.
pub const SILENT_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);
pub const ITEM_TUNNEL_DATA_DOWN: u8 = 0x06;
pub const ITEM_TUNNEL_END_DOWN: u8 = 0x07;
pub const ITEM_TUNNEL_OPEN: u8 = 0x21;
pub const ITEM_TUNNEL_DATA_UP: u8 = 0x22;
pub const ITEM_TUNNEL_END_UP: u8 = 0x23;

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
        max: u64,
    },
    #[error(
        "link frame's {what} restore to more than {max} bytes together (at least {total}), \
         more than one frame may carry"
    )]
    TotalTooLong {
        what: &'static str,
        total: u64,
        max: u64,
    },
    #[error("link frame has no items")]
    Empty,
    #[error("link frame has more than {MAX_FRAME_ITEMS} items")]
    TooManyItems,
    #[error("feedback message is not a well-formed '{0}' message")]
    BadFeedback(char),
    #[error("link frame names channel {0}, beyond the {MAX_CHANNELS} a stream may have")]
    Channel(u64),
    #[error("link frame failed verification (checksum of its restored content)")]
    Checksum,
    #[error("link frame is corrupt: {0}")]
    Corrupt(&'static str),
}

/// XLogData header fields in absolute form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WalHeader {
    pub start: u64,
    pub end: u64,
    pub send_time: i64,
    pub raw_len: u32,
}

/// The checksum of a frame's restored content (see the module docs); both ends feed it the
/// same way, item by item.
pub struct Digest(XxHash3_64);

impl Default for Digest {
    fn default() -> Self {
        Digest(XxHash3_64::new())
    }
}

impl Digest {
    /// A WAL item: its header and the restored WAL bytes.
    pub fn wal(&mut self, h: &WalHeader, raw: &[u8]) {
        let mut b = [0u8; 29];
        b[0] = ITEM_WAL;
        b[1..9].copy_from_slice(&h.start.to_le_bytes());
        b[9..17].copy_from_slice(&h.end.to_le_bytes());
        b[17..25].copy_from_slice(&h.send_time.to_le_bytes());
        b[25..].copy_from_slice(&h.raw_len.to_le_bytes());
        self.0.write(&b);
        self.0.write(raw);
    }

    /// Any other item: kind, channel, restored bytes.
    pub fn item(&mut self, kind: u8, chan: u32, bytes: &[u8]) {
        self.0.write(&[kind]);
        self.0.write(&chan.to_le_bytes());
        self.0.write(&(bytes.len() as u64).to_le_bytes());
        self.0.write(bytes);
    }

    pub fn finish(&self) -> u64 {
        self.0.finish()
    }
}

/// Appends the checksum that ends a frame.
pub fn finish(out: &mut Vec<u8>, digest: &Digest) {
    out.extend_from_slice(&digest.finish().to_le_bytes());
}

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

pub(crate) fn zz(v: u64) -> u64 {
    let v = v as i64;
    ((v << 1) ^ (v >> 63)) as u64
}

pub(crate) fn unzz(v: u64) -> u64 {
    (((v >> 1) as i64) ^ -((v & 1) as i64)) as u64
}

/// A bounds-checked cursor over a frame.
pub(crate) struct Cursor<'a> {
    pub buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub fn u8(&mut self, what: &'static str) -> Result<u8, FrameError> {
        let (&b, rest) = self.buf.split_first().ok_or(FrameError::Short(what))?;
        self.buf = rest;
        Ok(b)
    }

    pub fn varint(&mut self, what: &'static str) -> Result<u64, FrameError> {
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

    /// A varint that must fit `max` (e.g. a timeline id, an xid).
    pub fn bounded(&mut self, what: &'static str, max: u64) -> Result<u64, FrameError> {
        let v = self.varint(what)?;
        if v > max {
            return Err(FrameError::TooLong { what, len: v, max });
        }
        Ok(v)
    }

    pub fn chan(&mut self) -> Result<u32, FrameError> {
        let c = self.varint("channel")?;
        if c >= MAX_CHANNELS as u64 {
            return Err(FrameError::Channel(c));
        }
        Ok(c as u32)
    }

    pub fn bytes(&mut self, what: &'static str, max: usize) -> Result<&'a [u8], FrameError> {
        let len = self.bounded(what, max as u64)?;
        if len > self.buf.len() as u64 {
            return Err(FrameError::Short(what));
        }
        let (b, rest) = self.buf.split_at(len as usize);
        self.buf = rest;
        Ok(b)
    }
}

/// Splits off the trailing checksum.
pub(crate) fn body(frame: &[u8]) -> Result<(&[u8], u64), FrameError> {
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

#[cfg(test)]
mod tests;
