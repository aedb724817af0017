//! Tunnel items (see the module docs of `frame` for the format): one tunnelled session per
//! `Tunnel` call, its protocol bytes zstd-compressed in one streaming context per direction,
//! flushed at every frame, checksummed over the restored bytes.

use zstd::stream::raw::{CParameter, Decoder, Encoder, InBuffer, Operation, OutBuffer};

use super::{
    body, put_bytes, put_varint, Cursor, Digest, FrameError, ITEM_TUNNEL_DATA_DOWN,
    ITEM_TUNNEL_DATA_UP, ITEM_TUNNEL_END_DOWN, ITEM_TUNNEL_END_UP, ITEM_TUNNEL_OPEN,
};

/// Most bytes one DATA item restores to (a sender splits larger runs).
pub const TUNNEL_DATA_MAX: usize = 1024 * 1024;
/// Longest OPEN or END content.
pub const TUNNEL_META_MAX: usize = 64 * 1024;

/// Most bytes the DATA items of one tunnel frame restore together, in either direction, for a
/// downstream whose `limits.max_message_bytes` is `max_message`: `max_message` +
/// [`TUNNEL_DATA_MAX`] (the budget a [`TunnelRx`] is made with). A correct downstream sends
/// one client message (at most `max_message` + 5 bytes) per frame, a correct upstream at most
/// [`TUNNEL_DATA_MAX`] bytes of the primary's (see the module docs of `frame`).
pub fn tunnel_frame_max(max_message: usize) -> usize {
    max_message.saturating_add(TUNNEL_DATA_MAX)
}

/// Which way a tunnel frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Downstream → upstream: OPEN, DATA, END.
    Up,
    /// Upstream → downstream: DATA, END.
    Down,
}

impl Dir {
    fn data(self) -> u8 {
        match self {
            Dir::Up => ITEM_TUNNEL_DATA_UP,
            Dir::Down => ITEM_TUNNEL_DATA_DOWN,
        }
    }
    fn end(self) -> u8 {
        match self {
            Dir::Up => ITEM_TUNNEL_END_UP,
            Dir::Down => ITEM_TUNNEL_END_DOWN,
        }
    }
}

/// A restored tunnel item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TunnelItem {
    /// The protobuf `TunnelOpen` (downstream → upstream, first item only).
    Open(Vec<u8>),
    /// Protocol bytes of the session, restored.
    Data(Vec<u8>),
    /// The sender's side of the session ended; the text says why (empty: cleanly).
    End(String),
}

/// The sending end of one direction: builds frames, compressing DATA in one zstd context.
pub struct TunnelTx {
    dir: Dir,
    enc: Encoder<'static>,
    out: Vec<u8>,
    digest: Digest,
}

impl TunnelTx {
    /// A sender compressing at `level` with a window of 2^`window_log` bytes (the receiver
    /// accepts up to 2^27, zstd's default limit).
    pub fn new(dir: Dir, level: i32, window_log: u32) -> std::io::Result<TunnelTx> {
        let mut enc = Encoder::new(level)?;
        enc.set_parameter(CParameter::WindowLog(window_log.clamp(10, 27)))?;
        Ok(TunnelTx {
            dir,
            enc,
            out: Vec::new(),
            digest: Digest::default(),
        })
    }

    /// Adds an OPEN item (downstream → upstream only).
    pub fn open(&mut self, info: &[u8]) {
        self.out.push(ITEM_TUNNEL_OPEN);
        put_bytes(&mut self.out, info);
        self.digest.item(ITEM_TUNNEL_OPEN, 0, info);
    }

    /// Adds DATA items for `raw` (split at [`TUNNEL_DATA_MAX`]), compressed and flushed so
    /// that the receiver restores all of it from this frame.
    pub fn data(&mut self, raw: &[u8]) -> std::io::Result<()> {
        for chunk in raw.chunks(TUNNEL_DATA_MAX) {
            let z = self.compress(chunk)?;
            let kind = self.dir.data();
            self.out.push(kind);
            put_varint(&mut self.out, chunk.len() as u64);
            put_bytes(&mut self.out, &z);
            self.digest.item(kind, 0, chunk);
        }
        Ok(())
    }

    /// Adds an END item.
    pub fn end(&mut self, reason: &str) {
        let reason = &reason.as_bytes()[..reason.len().min(TUNNEL_META_MAX)];
        let kind = self.dir.end();
        self.out.push(kind);
        put_bytes(&mut self.out, reason);
        self.digest.item(kind, 0, reason);
    }

    pub fn is_empty(&self) -> bool {
        self.out.is_empty()
    }

    /// The frame built so far, with its checksum; the builder starts a new one.
    pub fn finish(&mut self) -> Vec<u8> {
        let mut f = std::mem::take(&mut self.out);
        super::finish(&mut f, &std::mem::take(&mut self.digest));
        f
    }

    fn compress(&mut self, raw: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut z: Vec<u8> = Vec::with_capacity(zstd::zstd_safe::compress_bound(raw.len()) + 64);
        let mut input = InBuffer::around(raw);
        while input.pos() < raw.len() {
            reserve(&mut z);
            let len = z.len();
            let mut out = OutBuffer::around_pos(&mut z, len);
            self.enc.run(&mut input, &mut out)?;
        }
        loop {
            reserve(&mut z);
            let len = z.len();
            let mut out = OutBuffer::around_pos(&mut z, len);
            if self.enc.flush(&mut out)? == 0 {
                break;
            }
        }
        Ok(z)
    }
}

fn reserve(z: &mut Vec<u8>) {
    if z.capacity() - z.len() < 1024 {
        z.reserve(64 * 1024);
    }
}

/// The receiving end of one direction: parses frames, restores DATA in one zstd context and
/// verifies the checksum before anything of a frame is handed on.
pub struct TunnelRx {
    dir: Dir,
    dec: Decoder<'static>,
    /// Most bytes the DATA items of one frame may restore together.
    max_data: usize,
}

impl TunnelRx {
    /// A receiver whose frames' DATA items may restore at most `max_data` bytes together
    /// ([`tunnel_frame_max`] of the downstream's `limits.max_message_bytes`).
    pub fn new(dir: Dir, max_data: usize) -> std::io::Result<TunnelRx> {
        Ok(TunnelRx {
            dir,
            dec: Decoder::new()?,
            max_data,
        })
    }

    /// Changes the per-frame budget of [`TunnelRx::new`] for the frames that follow (the
    /// upstream learns the downstream's limit from the first frame's OPEN).
    pub fn set_max_data(&mut self, max_data: usize) {
        self.max_data = max_data;
    }

    /// A frame's items, restored and verified. DATA items that would restore to more than the
    /// budget together are refused before the one that passes it is decompressed.
    pub fn parse(&mut self, frame: &[u8]) -> Result<Vec<TunnelItem>, FrameError> {
        let (body, sum) = body(frame)?;
        let mut c = Cursor { buf: body };
        let mut items = Vec::new();
        let mut digest = Digest::default();
        let mut total = 0usize;
        while !c.buf.is_empty() {
            let kind = c.u8("item")?;
            let item = match kind {
                ITEM_TUNNEL_OPEN if self.dir == Dir::Up => {
                    let b = c.bytes("tunnel open", TUNNEL_META_MAX)?;
                    digest.item(kind, 0, b);
                    TunnelItem::Open(b.to_vec())
                }
                k if k == self.dir.data() => {
                    let raw_len = c.bounded("tunnel data", TUNNEL_DATA_MAX as u64)? as usize;
                    let z = c.bytes(
                        "tunnel payload",
                        zstd::zstd_safe::compress_bound(TUNNEL_DATA_MAX) + 1024,
                    )?;
                    total = total
                        .checked_add(raw_len)
                        .filter(|&t| t <= self.max_data)
                        .ok_or(FrameError::TotalTooLong {
                            what: "tunnel data items",
                            total: (total as u64).saturating_add(raw_len as u64),
                            max: self.max_data as u64,
                        })?;
                    let raw = self.restore(z, raw_len)?;
                    digest.item(kind, 0, &raw);
                    TunnelItem::Data(raw)
                }
                k if k == self.dir.end() => {
                    let b = c.bytes("tunnel end", TUNNEL_META_MAX)?;
                    digest.item(kind, 0, b);
                    TunnelItem::End(String::from_utf8_lossy(b).into_owned())
                }
                other => return Err(FrameError::UnknownItem(other)),
            };
            items.push(item);
        }
        if items.is_empty() {
            return Err(FrameError::Empty);
        }
        if digest.finish() != sum {
            return Err(FrameError::Checksum);
        }
        Ok(items)
    }

    /// Decompresses `z`, which must restore exactly `raw_len` bytes.
    fn restore(&mut self, z: &[u8], raw_len: usize) -> Result<Vec<u8>, FrameError> {
        let mut raw: Vec<u8> = Vec::with_capacity(raw_len + 1);
        let mut input = InBuffer::around(z);
        loop {
            let (in_before, out_before) = (input.pos(), raw.len());
            let len = raw.len();
            let mut out = OutBuffer::around_pos(&mut raw, len);
            self.dec
                .run(&mut input, &mut out)
                .map_err(|_| FrameError::Corrupt("tunnel data does not decompress"))?;
            if raw.len() > raw_len {
                return Err(FrameError::Corrupt(
                    "tunnel data restores to more than announced",
                ));
            }
            let done = input.pos() == z.len();
            if done && raw.len() == raw_len {
                return Ok(raw);
            }
            if input.pos() == in_before && raw.len() == out_before {
                return Err(FrameError::Corrupt(
                    "tunnel data restores to less than announced",
                ));
            }
        }
    }
}
