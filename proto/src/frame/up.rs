//! Downstream → upstream items (see the module docs of `frame` for the format).

use std::collections::HashMap;

use super::{
    body, put_bytes, put_varint, unzz, zz, Cursor, Digest, FrameError, ITEM_ALIVE, ITEM_CLOSE,
    ITEM_COMMAND, ITEM_DURABLE, ITEM_HSFEED, ITEM_OPEN, ITEM_START, ITEM_STATUS, MAX_FRAME_ITEMS,
};

/// Length of a standby status update ('r'): write, flush, apply, time, reply flag.
pub const STATUS_LEN: usize = 1 + 8 + 8 + 8 + 8 + 1;
/// Length of a hot-standby feedback message ('h'): time, xmin, epoch, catalog xmin, epoch.
pub const HSFEED_LEN: usize = 1 + 8 + 4 + 4 + 4 + 4;
/// Most standby channels one stream may have open (bounds the per-channel state).
pub const MAX_CHANNELS: u32 = 4096;
/// Largest OPEN, COMMAND or START item (a standby's name and address, a replication command,
/// a slot name and a few numbers). The upstream ends a stream whose frame announces a longer
/// one; the downstream refuses a session or a command that would need one, before it sends.
pub const MAX_CONTROL_ITEM: usize = 4096;

/// A standby's feedback message ('r' or 'h'), as it sent it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Feedback {
    buf: [u8; STATUS_LEN],
    len: usize,
}

impl std::fmt::Debug for Feedback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Feedback({:?})", self.bytes())
    }
}

impl Feedback {
    /// A well-formed 'r' or 'h' message.
    pub fn new(msg: &[u8]) -> Result<Feedback, FrameError> {
        match (msg.first(), msg.len()) {
            (Some(b'r'), STATUS_LEN) | (Some(b'h'), HSFEED_LEN) => {
                let mut buf = [0u8; STATUS_LEN];
                buf[..msg.len()].copy_from_slice(msg);
                Ok(Feedback {
                    buf,
                    len: msg.len(),
                })
            }
            (Some(b'r'), _) => Err(FrameError::BadFeedback('r')),
            (Some(b'h'), _) => Err(FrameError::BadFeedback('h')),
            _ => Err(FrameError::BadFeedback('?')),
        }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    pub fn is_status(&self) -> bool {
        self.buf[0] == b'r'
    }

    fn u64_at(&self, at: usize) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&self.buf[at..at + 8]);
        u64::from_be_bytes(a)
    }
}

/// An item of a downstream → upstream frame (`Alive`: nothing else was due for
/// [`super::ALIVE_EVERY`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Up<'a> {
    Feedback { chan: u32, msg: Feedback },
    Command { chan: u32, bytes: &'a [u8] },
    Open { chan: u32, info: &'a [u8] },
    Start { chan: u32, cmd: &'a [u8] },
    Close { chan: u32 },
    Durable { tli: u32, end: u64 },
    Alive,
}

impl Up<'_> {
    pub fn digest(&self, d: &mut Digest) {
        match *self {
            Up::Feedback { chan, ref msg } => {
                let kind = if msg.is_status() {
                    ITEM_STATUS
                } else {
                    ITEM_HSFEED
                };
                d.item(kind, chan, msg.bytes());
            }
            Up::Command { chan, bytes } => d.item(ITEM_COMMAND, chan, bytes),
            Up::Open { chan, info } => d.item(ITEM_OPEN, chan, info),
            Up::Start { chan, cmd } => d.item(ITEM_START, chan, cmd),
            Up::Close { chan } => d.item(ITEM_CLOSE, chan, &[]),
            Up::Durable { tli, end } => d.item(ITEM_DURABLE, tli, &end.to_le_bytes()),
            Up::Alive => d.item(ITEM_ALIVE, 0, &[]),
        }
    }
}

/// What the deltas of one channel's feedback are taken against.
#[derive(Debug, Default, Clone, Copy)]
struct Prev {
    write: u64,
    status_time: u64,
    hs_time: u64,
}

/// Per-stream state of the downstream → upstream direction (one on each end): the previous
/// feedback of every open channel. A channel's state goes with its CLOSE.
#[derive(Debug, Default)]
pub struct UpState {
    prev: HashMap<u32, Prev>,
}

impl UpState {
    /// Appends an item.
    pub fn put(&mut self, out: &mut Vec<u8>, item: &Up<'_>) {
        match *item {
            Up::Feedback { chan, ref msg } => self.put_feedback(out, chan, msg),
            Up::Command { chan, bytes } => put_chan_bytes(out, ITEM_COMMAND, chan, bytes),
            Up::Open { chan, info } => put_chan_bytes(out, ITEM_OPEN, chan, info),
            Up::Start { chan, cmd } => put_chan_bytes(out, ITEM_START, chan, cmd),
            Up::Close { chan } => {
                out.push(ITEM_CLOSE);
                put_varint(out, u64::from(chan));
                self.prev.remove(&chan);
            }
            Up::Durable { tli, end } => {
                out.push(ITEM_DURABLE);
                put_varint(out, u64::from(tli));
                put_varint(out, end);
            }
            Up::Alive => out.push(ITEM_ALIVE),
        }
    }

    fn put_feedback(&mut self, out: &mut Vec<u8>, chan: u32, msg: &Feedback) {
        let p = self.prev.entry(chan).or_default();
        if msg.is_status() {
            let (w, f, a, t) = (msg.u64_at(1), msg.u64_at(9), msg.u64_at(17), msg.u64_at(25));
            out.push(ITEM_STATUS);
            put_varint(out, u64::from(chan));
            out.push(msg.buf[33]);
            put_varint(out, zz(w.wrapping_sub(p.write)));
            put_varint(out, zz(w.wrapping_sub(f)));
            put_varint(out, zz(f.wrapping_sub(a)));
            put_varint(out, zz(t.wrapping_sub(p.status_time)));
            p.write = w;
            p.status_time = t;
        } else {
            let t = msg.u64_at(1);
            out.push(ITEM_HSFEED);
            put_varint(out, u64::from(chan));
            put_varint(out, zz(t.wrapping_sub(p.hs_time)));
            for at in [9, 13, 17, 21] {
                let mut a = [0u8; 4];
                a.copy_from_slice(&msg.buf[at..at + 4]);
                put_varint(out, u64::from(u32::from_be_bytes(a)));
            }
            p.hs_time = t;
        }
    }

    /// Parses a frame into items (byte strings capped at `max_bytes`) and its checksum.
    pub fn parse<'a>(
        &mut self,
        frame: &'a [u8],
        max_bytes: usize,
    ) -> Result<(Vec<Up<'a>>, u64), FrameError> {
        let (body, sum) = body(frame)?;
        let mut c = Cursor { buf: body };
        let mut items = Vec::new();
        while !c.buf.is_empty() {
            if items.len() == MAX_FRAME_ITEMS {
                return Err(FrameError::TooManyItems);
            }
            items.push(match c.u8("item")? {
                ITEM_STATUS => self.status(&mut c)?,
                ITEM_HSFEED => self.hsfeed(&mut c)?,
                ITEM_COMMAND => Up::Command {
                    chan: c.chan()?,
                    bytes: c.bytes("command", max_bytes)?,
                },
                ITEM_OPEN => Up::Open {
                    chan: c.chan()?,
                    info: c.bytes("standby info", max_bytes)?,
                },
                ITEM_START => Up::Start {
                    chan: c.chan()?,
                    cmd: c.bytes("start command", max_bytes)?,
                },
                ITEM_CLOSE => {
                    let chan = c.chan()?;
                    self.prev.remove(&chan);
                    Up::Close { chan }
                }
                ITEM_DURABLE => Up::Durable {
                    tli: c.bounded("timeline", u64::from(u32::MAX))? as u32,
                    end: c.varint("durable end")?,
                },
                ITEM_ALIVE => Up::Alive,
                other => return Err(FrameError::UnknownItem(other)),
            });
        }
        if items.is_empty() {
            return Err(FrameError::Empty);
        }
        Ok((items, sum))
    }

    fn status(&mut self, c: &mut Cursor<'_>) -> Result<Up<'static>, FrameError> {
        let chan = c.chan()?;
        let p = self.prev.entry(chan).or_default();
        let reply = c.u8("status")?;
        let w = p.write.wrapping_add(unzz(c.varint("status write")?));
        let f = w.wrapping_sub(unzz(c.varint("status flush")?));
        let a = f.wrapping_sub(unzz(c.varint("status apply")?));
        let t = p.status_time.wrapping_add(unzz(c.varint("status time")?));
        p.write = w;
        p.status_time = t;
        let mut buf = [0u8; STATUS_LEN];
        buf[0] = b'r';
        for (i, v) in [w, f, a, t].into_iter().enumerate() {
            buf[1 + 8 * i..9 + 8 * i].copy_from_slice(&v.to_be_bytes());
        }
        buf[33] = reply;
        Ok(Up::Feedback {
            chan,
            msg: Feedback {
                buf,
                len: STATUS_LEN,
            },
        })
    }

    fn hsfeed(&mut self, c: &mut Cursor<'_>) -> Result<Up<'static>, FrameError> {
        let chan = c.chan()?;
        let p = self.prev.entry(chan).or_default();
        let t = p.hs_time.wrapping_add(unzz(c.varint("feedback time")?));
        p.hs_time = t;
        let mut buf = [0u8; STATUS_LEN];
        buf[0] = b'h';
        buf[1..9].copy_from_slice(&t.to_be_bytes());
        for at in [9, 13, 17, 21] {
            let v = c.bounded("feedback xid", u64::from(u32::MAX))? as u32;
            buf[at..at + 4].copy_from_slice(&v.to_be_bytes());
        }
        Ok(Up::Feedback {
            chan,
            msg: Feedback {
                buf,
                len: HSFEED_LEN,
            },
        })
    }
}

fn put_chan_bytes(out: &mut Vec<u8>, kind: u8, chan: u32, bytes: &[u8]) {
    out.push(kind);
    put_varint(out, u64::from(chan));
    put_bytes(out, bytes);
}
