//! Replication sub-protocol messages inside CopyData.

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
/// A standby status update ('r') sent now, as the CopyData payload: positions written,
/// flushed and applied, and whether the server is asked to reply at once.
pub fn status_update(write: Lsn, flush: Lsn, apply: Lsn, reply: bool) -> Vec<u8> {
    let mut msg = Vec::with_capacity(STATUS_UPDATE_LEN);
    msg.push(b'r');
    for v in [write, flush, apply] {
        msg.extend_from_slice(&v.0.to_be_bytes());
    }
    msg.extend_from_slice(&pg_now().to_be_bytes());
    msg.push(u8::from(reply));
    msg
}

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

/// Bytes of a CopyData message carrying XLogData up to its WAL: tag, length, 'w', header.
pub const XLOGDATA_START: usize = 1 + 4 + 1 + XLOGDATA_HEADER;

/// The start of a CopyData message carrying XLogData, as far as it has arrived in `buf`
/// (which begins at the message's tag): the header's `walEnd` and the whole message's
/// length, tag included. None when `buf` holds less than [`XLOGDATA_START`], or another
/// message. For a reader that drops the WAL bytes unread (the message's length is the
/// caller's to cap, as for whole messages).
pub fn xlogdata_start(buf: &[u8]) -> Option<(Lsn, usize)> {
    if buf.len() < XLOGDATA_START || buf[0] != b'd' || buf[5] != b'w' {
        return None;
    }
    let len = u32::from_be_bytes(buf[1..5].try_into().ok()?) as usize;
    if len < XLOGDATA_START - 1 {
        return None;
    }
    let end = u64::from_be_bytes(buf[14..22].try_into().ok()?);
    Some((Lsn(end), len.checked_add(1)?))
}
