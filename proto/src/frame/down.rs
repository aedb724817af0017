//! Upstream → downstream items (see the module docs of `frame` for the format).

use super::{
    body, put_bytes, put_varint, unzz, zz, Cursor, Digest, FrameError, WalHeader, ITEM_BACKEND,
    ITEM_KEEPALIVE, ITEM_STARTED, ITEM_TIMELINE, ITEM_WAL, MAX_FRAME_ITEMS,
};

/// An item of an upstream → downstream frame, borrowing from the frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Down<'a> {
    Wal {
        header: WalHeader,
        payload: &'a [u8],
    },
    Backend {
        chan: u32,
        bytes: &'a [u8],
    },
    Keepalive {
        end: u64,
        send_time: i64,
    },
    Timeline {
        tli: u32,
        history: &'a [u8],
    },
    Started {
        chan: u32,
        synchronous: bool,
    },
}

impl Down<'_> {
    /// Feeds this item to `d`; for WAL, `raw` is what the codec restored from the payload.
    pub fn digest(&self, d: &mut Digest, raw: &[u8]) {
        match *self {
            Down::Wal { ref header, .. } => d.wal(header, raw),
            Down::Backend { chan, bytes } => d.item(ITEM_BACKEND, chan, bytes),
            Down::Keepalive { end, send_time } => {
                let mut b = [0u8; 16];
                b[..8].copy_from_slice(&end.to_le_bytes());
                b[8..].copy_from_slice(&send_time.to_le_bytes());
                d.item(ITEM_KEEPALIVE, 0, &b);
            }
            Down::Timeline { tli, history } => {
                d.item(ITEM_TIMELINE, tli, history);
            }
            Down::Started { chan, synchronous } => {
                d.item(ITEM_STARTED, chan, &[u8::from(synchronous)]);
            }
        }
    }
}

/// Most WAL bytes the items of one down frame may restore together when each may restore up
/// to `max_raw`: twice `max_raw`. A correct upstream puts at most `max_raw` in a frame (one
/// batch of at most `batch_max` bytes, or a single larger XLogData, and at most `hold_max`
/// bytes held back before it, `batch_max + hold_max` within the downstream's limit); the
/// factor 2 is margin against a false refusal, which would stop replication (see the module
/// docs of `frame`).
pub fn wal_frame_max(max_raw: usize) -> u64 {
    (max_raw as u64).saturating_mul(2)
}

/// Per-stream state of the upstream → downstream direction (one on each end).
#[derive(Debug, Default, Clone)]
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
        put_bytes(out, payload);
        self.next_start = data_end;
        self.send_time = h.send_time;
    }

    /// Appends any other item.
    pub fn put(&mut self, out: &mut Vec<u8>, item: &Down<'_>) {
        match *item {
            Down::Wal {
                ref header,
                payload,
            } => self.put_wal(out, header, payload),
            Down::Backend { chan, bytes } => {
                out.push(ITEM_BACKEND);
                put_varint(out, u64::from(chan));
                put_bytes(out, bytes);
            }
            Down::Keepalive { end, send_time } => {
                out.push(ITEM_KEEPALIVE);
                put_varint(out, end);
                put_varint(out, zz(send_time.wrapping_sub(self.send_time) as u64));
                self.send_time = send_time;
            }
            Down::Timeline { tli, history } => {
                out.push(ITEM_TIMELINE);
                put_varint(out, u64::from(tli));
                put_bytes(out, history);
            }
            Down::Started { chan, synchronous } => {
                out.push(ITEM_STARTED);
                put_varint(out, u64::from(chan));
                out.push(u8::from(synchronous));
            }
        }
    }

    /// Parses a frame into items (WAL raw lengths capped at `max_raw` each and at
    /// [`wal_frame_max`]`(max_raw)` together, payloads and other byte strings at `max_bytes`)
    /// and its checksum. The state advances as items are parsed. Nothing is restored here:
    /// a frame whose WAL would restore to more than one frame may carry is refused before the
    /// caller restores any of it.
    pub fn parse<'a>(
        &mut self,
        frame: &'a [u8],
        max_raw: usize,
        max_bytes: usize,
    ) -> Result<(Vec<Down<'a>>, u64), FrameError> {
        let (body, sum) = body(frame)?;
        let mut c = Cursor { buf: body };
        let mut items = Vec::new();
        let max_total = wal_frame_max(max_raw);
        let mut total = 0u64;
        while !c.buf.is_empty() {
            if items.len() == MAX_FRAME_ITEMS {
                return Err(FrameError::TooManyItems);
            }
            items.push(match c.u8("item")? {
                ITEM_WAL => {
                    let item = self.wal(&mut c, max_raw, max_bytes)?;
                    if let Down::Wal { ref header, .. } = item {
                        total = total
                            .checked_add(u64::from(header.raw_len))
                            .filter(|&t| t <= max_total)
                            .ok_or(FrameError::TotalTooLong {
                                what: "WAL items",
                                total: total.saturating_add(u64::from(header.raw_len)),
                                max: max_total,
                            })?;
                    }
                    item
                }
                ITEM_BACKEND => Down::Backend {
                    chan: c.chan()?,
                    bytes: c.bytes("backend messages", max_bytes)?,
                },
                ITEM_KEEPALIVE => {
                    let end = c.varint("keepalive end")?;
                    let send_time = self
                        .send_time
                        .wrapping_add(unzz(c.varint("keepalive time")?) as i64);
                    self.send_time = send_time;
                    Down::Keepalive { end, send_time }
                }
                ITEM_TIMELINE => Down::Timeline {
                    tli: c.bounded("timeline", u64::from(u32::MAX))? as u32,
                    history: c.bytes("timeline history", max_bytes)?,
                },
                ITEM_STARTED => Down::Started {
                    chan: c.chan()?,
                    synchronous: c.bounded("started flag", 1)? == 1,
                },
                other => return Err(FrameError::UnknownItem(other)),
            });
        }
        if items.is_empty() {
            return Err(FrameError::Empty);
        }
        Ok((items, sum))
    }

    fn wal<'a>(
        &mut self,
        c: &mut Cursor<'a>,
        max_raw: usize,
        max_bytes: usize,
    ) -> Result<Down<'a>, FrameError> {
        let start = self.next_start.wrapping_add(unzz(c.varint("WAL start")?));
        let end_delta = unzz(c.varint("WAL end")?);
        let dt = unzz(c.varint("WAL send time")?) as i64;
        let raw_len = c.bounded("WAL", (max_raw as u64).min(u64::from(u32::MAX)))?;
        let payload = c.bytes("WAL payload", max_bytes)?;
        let data_end = start.wrapping_add(raw_len);
        let header = WalHeader {
            start,
            end: data_end.wrapping_add(end_delta),
            send_time: self.send_time.wrapping_add(dt),
            raw_len: raw_len as u32,
        };
        self.next_start = data_end;
        self.send_time = header.send_time;
        Ok(Down::Wal { header, payload })
    }
}
