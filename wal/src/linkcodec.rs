//! The link codec: how the WAL bytes of each XLogData message travel between the halves.
//!
//! The sender (upstream) encodes every message of the primary as soon as it arrives and flushes
//! the encoder, so nothing waits for later bytes; the receiver (downstream) decodes and checks
//! the result against the original's length and xxh3-64 (carried in the link's `Wal` message)
//! before a byte reaches a standby.
//!
//! Codecs are per session and stateful: both ends feed every message through in order.
//! - `wal`: the WAL-aware codec of [`crate::walcodec`] (its payload format is documented there);
//! - `zstd`: one streaming zstd context per direction, `ZSTD_e_flush` after every message;
//!   the window (and so the memory per session) is bounded by `link.zstd_window_log`;
//! - `none`: the bytes as they are.

use crate::lsn::Lsn;
use crate::walcodec;
use zstd::stream::raw::{CParameter, DParameter, Decoder, Encoder, InBuffer, Operation, OutBuffer};

/// How WAL is encoded on the link.
#[derive(Debug, Clone, Copy, serde::Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CodecKind {
    /// WAL-aware: full-page images against earlier images of the same block, derivable
    /// bytes left out, the rest in per-kind zstd streams.
    #[default]
    Wal,
    /// Streaming zstd, flushed at every message of the primary.
    Zstd,
    /// No compression (for comparison and debugging).
    None,
}

impl CodecKind {
    pub fn name(self) -> &'static str {
        match self {
            CodecKind::Wal => "wal",
            CodecKind::Zstd => "zstd",
            CodecKind::None => "none",
        }
    }
    pub fn from_name(s: &str) -> Option<CodecKind> {
        match s {
            "wal" => Some(CodecKind::Wal),
            "zstd" => Some(CodecKind::Zstd),
            "none" => Some(CodecKind::None),
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    // Causes are in the messages and not also `source()`, which a printed chain would repeat.
    #[error("zstd: {0}")]
    Zstd(std::io::Error),
    #[error("WAL codec: {0}")]
    Wal(walcodec::WalCodecError),
    #[error("decoded {got} bytes where the sender announced {want}")]
    Length { got: usize, want: usize },
    #[error("announced length {0} exceeds the limit of {1} bytes (limits.max_message_bytes)")]
    TooLong(usize, usize),
    #[error("integrity check failed: restored bytes differ from the primary's (xxh3 {got:016x}, expected {want:016x})")]
    Checksum { got: u64, want: u64 },
}

impl From<std::io::Error> for CodecError {
    fn from(e: std::io::Error) -> Self {
        CodecError::Zstd(e)
    }
}

impl From<walcodec::WalCodecError> for CodecError {
    fn from(e: walcodec::WalCodecError) -> Self {
        CodecError::Wal(e)
    }
}

/// What both ends of a session agreed on.
#[derive(Debug, Clone)]
pub struct Setup {
    pub kind: CodecKind,
    pub zstd_level: i32,
    /// zstd window (log2 bytes) of the `zstd` codec; the decoder accepts at most this.
    pub window_log: u32,
    /// Parameters of the `wal` codec; `max_message_bytes` caps every decoded message.
    pub wal: walcodec::CodecParams,
}

/// Encoder side of a session.
pub struct WalEncoder {
    codec: EncCodec,
    /// Payloads of messages staged with the `zstd` and `none` codecs, which encode at once.
    ready: std::collections::VecDeque<Vec<u8>>,
}

enum EncCodec {
    None,
    Zstd(Box<Encoder<'static>>),
    Wal(Box<walcodec::Encoder>),
}

/// Decoder side of a session.
pub enum WalDecoder {
    None,
    Zstd(Box<Decoder<'static>>),
    Wal(Box<walcodec::Decoder>),
}

/// The checksum carried with every `Wal` message.
pub fn checksum(raw: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(raw)
}

impl WalEncoder {
    pub fn new(setup: &Setup) -> Result<WalEncoder, CodecError> {
        let codec = match setup.kind {
            CodecKind::None => EncCodec::None,
            CodecKind::Zstd => {
                let mut e = Encoder::new(setup.zstd_level)?;
                e.set_parameter(CParameter::WindowLog(setup.window_log))?;
                EncCodec::Zstd(Box::new(e))
            }
            CodecKind::Wal => EncCodec::Wal(Box::new(walcodec::Encoder::new(&setup.wal)?)),
        };
        Ok(WalEncoder {
            codec,
            ready: Default::default(),
        })
    }

    /// Whether the `wal` codec may use more than one core for the next messages (see
    /// [`walcodec::Encoder::set_parallel`]); the other codecs use one.
    pub fn set_parallel(&mut self, on: bool) {
        if let EncCodec::Wal(e) = &mut self.codec {
            e.set_parallel(on);
        }
    }

    /// The `wal` codec's fast zstd settings on or off (`walcodec::Encoder::set_fast`); the
    /// other codecs keep theirs.
    pub fn set_fast(&mut self, on: bool) {
        if let EncCodec::Wal(e) = &mut self.codec {
            e.set_fast(on);
        }
    }

    /// Whether the next messages get the `wal` codec's fast settings (never for the others).
    pub fn fast(&self) -> bool {
        self.wal().is_some_and(walcodec::Encoder::fast)
    }

    /// The WAL-aware codec's encoder, if this is one.
    pub fn wal(&self) -> Option<&walcodec::Encoder> {
        match &self.codec {
            EncCodec::Wal(e) => Some(e),
            _ => None,
        }
    }

    /// Statistics of the WAL-aware codec, if this is one.
    pub fn wal_stats(&self) -> Option<&walcodec::CodecStats> {
        self.wal().map(|e| e.stats())
    }

    /// Encodes one message's WAL bytes (starting at `start`) into `out` (cleared first), flushed.
    /// Refused while messages are staged.
    pub fn encode(&mut self, start: Lsn, raw: &[u8], out: &mut Vec<u8>) -> Result<(), CodecError> {
        self.encode_held(start, raw, 0, out).map(|_| ())
    }

    /// [`WalEncoder::encode`] of the message's first bytes: the `wal` codec leaves out a
    /// record that starts in the last `hold` bytes and does not end in the message
    /// ([`walcodec::Encoder::encode_held`]); the others take everything. Returns how many
    /// bytes the payload restores: the caller sends the rest first in its next message.
    pub fn encode_held(
        &mut self,
        start: Lsn,
        raw: &[u8],
        hold: usize,
        out: &mut Vec<u8>,
    ) -> Result<usize, CodecError> {
        out.clear();
        match &mut self.codec {
            EncCodec::Wal(e) => return Ok(e.encode_held(start, raw, hold, out)?),
            _ if !self.ready.is_empty() => return Err(staged_already("encode")),
            EncCodec::None => out.extend_from_slice(raw),
            EncCodec::Zstd(enc) => zstd_flushed(enc, raw, out)?,
        }
        Ok(raw.len())
    }

    /// Starts encoding a message whose payload [`WalEncoder::collect`] returns, oldest first,
    /// so that the next message can be staged while this one is finished on another core (the
    /// `wal` codec's [`walcodec::Encoder::stage`]; the others encode it at once). At most
    /// [`walcodec::STAGED_MAX`] messages may wait to be collected.
    pub fn stage(&mut self, start: Lsn, raw: &[u8]) -> Result<(), CodecError> {
        self.stage_held(start, raw, 0).map(|_| ())
    }

    /// [`WalEncoder::stage`] of the message's first bytes, as [`WalEncoder::encode_held`]
    /// chooses them; returns how many.
    pub fn stage_held(&mut self, start: Lsn, raw: &[u8], hold: usize) -> Result<usize, CodecError> {
        if let EncCodec::Wal(e) = &mut self.codec {
            return Ok(e.stage_held(start, raw, hold)?);
        }
        if self.ready.len() >= walcodec::STAGED_MAX {
            return Err(staged_already("stage"));
        }
        let mut out = Vec::new();
        match &mut self.codec {
            EncCodec::Zstd(enc) => zstd_flushed(enc, raw, &mut out)?,
            _ => out.extend_from_slice(raw),
        }
        self.ready.push_back(out);
        Ok(raw.len())
    }

    /// Messages staged and not collected yet.
    pub fn staged(&self) -> usize {
        match &self.codec {
            EncCodec::Wal(e) => e.staged(),
            _ => self.ready.len(),
        }
    }

    /// The payload of the oldest staged message into `out` (cleared first); false when
    /// nothing is staged.
    pub fn collect(&mut self, out: &mut Vec<u8>) -> Result<bool, CodecError> {
        if let EncCodec::Wal(e) = &mut self.codec {
            return Ok(e.collect(out)?);
        }
        out.clear();
        match self.ready.pop_front() {
            Some(p) => {
                *out = p;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

fn staged_already(what: &str) -> CodecError {
    CodecError::Wal(walcodec::WalCodecError::Params(format!(
        "{what} called with messages staged: collect them first"
    )))
}

/// `raw` through the session's zstd context, flushed, appended to `out`.
fn zstd_flushed(
    enc: &mut Encoder<'static>,
    raw: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    out.reserve(raw.len() / 2 + 128);
    let mut input = InBuffer::around(raw);
    while input.pos() < raw.len() {
        reserve_spare(out, 64 * 1024);
        let mut o = OutBuffer::around_pos(out, out.len());
        enc.run(&mut input, &mut o)?;
    }
    loop {
        reserve_spare(out, 64 * 1024);
        let mut o = OutBuffer::around_pos(out, out.len());
        if enc.flush(&mut o)? == 0 {
            break;
        }
    }
    Ok(())
}

impl WalDecoder {
    pub fn new(setup: &Setup) -> Result<WalDecoder, CodecError> {
        Ok(match setup.kind {
            CodecKind::None => WalDecoder::None,
            CodecKind::Zstd => {
                let mut d = Decoder::new()?;
                d.set_parameter(DParameter::WindowLogMax(setup.window_log))?;
                WalDecoder::Zstd(Box::new(d))
            }
            CodecKind::Wal => WalDecoder::Wal(Box::new(walcodec::Decoder::new(&setup.wal)?)),
        })
    }

    /// Whether the `wal` codec may use more than one core for the next messages (see
    /// [`walcodec::Decoder::set_parallel`]); the other codecs use one.
    pub fn set_parallel(&mut self, on: bool) {
        if let WalDecoder::Wal(d) = self {
            d.set_parallel(on);
        }
    }

    /// Hands the payload of a message to be restored after those staged before, so that the
    /// `wal` codec decompresses its sections meanwhile (see [`walcodec::Decoder::stage`]);
    /// false, and nothing staged, for the other codecs. A staged message must be the next one
    /// given to [`WalDecoder::restore`] (or `decode`), with the same payload.
    pub fn stage(
        &mut self,
        start: Lsn,
        payload: &[u8],
        raw_len: usize,
        max_len: usize,
    ) -> Result<bool, CodecError> {
        if raw_len > max_len {
            return Err(CodecError::TooLong(raw_len, max_len));
        }
        match self {
            WalDecoder::Wal(d) => Ok(d.stage(start, payload, raw_len).map(|()| true)?),
            _ => Ok(false),
        }
    }

    /// Messages staged and not restored yet.
    pub fn staged(&self) -> usize {
        match self {
            WalDecoder::Wal(d) => d.staged(),
            _ => 0,
        }
    }

    /// Decodes one message (starting at `start`) into `out` (cleared first) and verifies its
    /// length (at most `max_len`) and checksum.
    pub fn decode(
        &mut self,
        start: Lsn,
        payload: &[u8],
        raw_len: usize,
        max_len: usize,
        xxh3: u64,
        out: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        self.restore(start, payload, raw_len, max_len, out)?;
        let got = checksum(out);
        if got != xxh3 {
            return Err(CodecError::Checksum { got, want: xxh3 });
        }
        Ok(())
    }

    /// [`decode`](Self::decode) without the checksum, for a caller that verifies what it
    /// restored as part of something larger (a link frame's checksum covers several messages).
    /// Nothing restored may be used before that check.
    pub fn restore(
        &mut self,
        start: Lsn,
        payload: &[u8],
        raw_len: usize,
        max_len: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        out.clear();
        if raw_len > max_len {
            return Err(CodecError::TooLong(raw_len, max_len));
        }
        match self {
            WalDecoder::None => out.extend_from_slice(payload),
            WalDecoder::Wal(d) => d.decode(start, payload, raw_len, out)?,
            WalDecoder::Zstd(dec) => {
                // Room for exactly the announced length plus one byte to notice an overrun.
                out.reserve(raw_len + 1);
                let mut input = InBuffer::around(payload);
                loop {
                    let before = (input.pos(), out.len());
                    {
                        let mut o = OutBuffer::around_pos(out, out.len());
                        dec.run(&mut input, &mut o)?;
                    }
                    if out.len() > raw_len {
                        return Err(CodecError::Length {
                            got: out.len(),
                            want: raw_len,
                        });
                    }
                    if (input.pos(), out.len()) == before
                        || (input.pos() == payload.len() && out.len() == raw_len)
                    {
                        break;
                    }
                }
            }
        }
        if out.len() != raw_len {
            return Err(CodecError::Length {
                got: out.len(),
                want: raw_len,
            });
        }
        Ok(())
    }
}

/// Makes sure `out` has at least `n` bytes of spare capacity.
fn reserve_spare(out: &mut Vec<u8>, n: usize) {
    if out.capacity() - out.len() < n {
        out.reserve(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAX: usize = 1 << 20;

    /// The checksum is XXH3-64 with seed 0, whatever library computes it: a peer of another
    /// release, a spool's tail and saved codec state were hashed by earlier ones (the values
    /// below by xxhash-rust 0.8, which walrelay used until 2026-12-03). Lengths reach each of
    /// XXH3's paths: empty, 1–3, 4–8, 9–16, 17–128, 129–240 and the long loop with its tail.
    #[test]
    fn checksum_is_xxh3_64() {
        let pat: Vec<u8> = (0..(1u32 << 20) + 7)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for (n, want) in [
            (0, 0x2d06_8005_38d3_94c2),
            (3, 0xa1c4_a825_9b82_7291),
            (8, 0x79d0_2238_b80e_37b1),
            (16, 0x222e_9aea_d6bd_dd51),
            (100, 0xad1e_77ff_670a_2548),
            (200, 0x20a8_7db9_07ce_74e4),
            (1000, 0xa067_b58e_6ea5_d2f2),
            (pat.len(), 0xa80b_ea05_3044_86e6u64),
        ] {
            assert_eq!(checksum(&pat[..n]), want, "{n} bytes");
        }
    }

    fn setup(kind: CodecKind) -> Setup {
        Setup {
            kind,
            zstd_level: 3,
            window_log: 20,
            wal: walcodec::CodecParams {
                pg_major: Some(crate::pg::PgMajor::V15),
                block_cache_bytes: 1 << 20,
                zstd_level: 3,
                max_message_bytes: MAX,
            },
        }
    }

    fn round_trip(kind: CodecKind, msgs: &[Vec<u8>]) {
        let mut enc = WalEncoder::new(&setup(kind)).unwrap();
        let mut dec = WalDecoder::new(&setup(kind)).unwrap();
        let (mut e, mut d) = (Vec::new(), Vec::new());
        let mut at = Lsn(0x1000000);
        for m in msgs {
            enc.encode(at, m, &mut e).unwrap();
            dec.decode(at, &e, m.len(), MAX, checksum(m), &mut d)
                .unwrap();
            assert_eq!(&d, m);
            at = Lsn(at.0 + m.len() as u64);
        }
    }

    #[test]
    fn zstd_compresses_repetitive_wal_across_messages() {
        let msg: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        let mut enc = WalEncoder::new(&setup(CodecKind::Zstd)).unwrap();
        let mut out = Vec::new();
        enc.encode(Lsn(0), &msg, &mut out).unwrap();
        enc.encode(Lsn(8192), &msg, &mut out).unwrap();
        // The second copy refers back to the first: a few bytes.
        assert!(out.len() < 64, "second message took {} bytes", out.len());
        for kind in [CodecKind::Zstd, CodecKind::None, CodecKind::Wal] {
            round_trip(kind, &[msg.clone(), msg.clone(), vec![], msg.clone()]);
        }
    }

    #[test]
    fn corruption_is_detected() {
        let msg = b"some WAL bytes that matter".repeat(10);
        let mut enc = WalEncoder::new(&setup(CodecKind::Zstd)).unwrap();
        let mut dec = WalDecoder::new(&setup(CodecKind::Zstd)).unwrap();
        let mut e = Vec::new();
        enc.encode(Lsn(0), &msg, &mut e).unwrap();
        let mut d = Vec::new();
        assert!(dec
            .decode(Lsn(0), &e, msg.len(), MAX, checksum(&msg) ^ 1, &mut d)
            .is_err());
        let mut dec = WalDecoder::new(&setup(CodecKind::None)).unwrap();
        let mut bad = msg.clone();
        bad[3] ^= 0x40;
        assert!(matches!(
            dec.decode(Lsn(0), &bad, msg.len(), MAX, checksum(&msg), &mut d),
            Err(CodecError::Checksum { .. })
        ));
    }

    #[test]
    fn announced_length_is_capped() {
        for kind in [CodecKind::Zstd, CodecKind::None, CodecKind::Wal] {
            let mut dec = WalDecoder::new(&setup(kind)).unwrap();
            let mut d = Vec::new();
            assert!(matches!(
                dec.decode(Lsn(0), &[], 1 << 30, 1000, 0, &mut d),
                Err(CodecError::TooLong(..))
            ));
        }
    }

    proptest! {
        #[test]
        fn any_messages_round_trip(msgs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..3000), 1..8)) {
            for kind in [CodecKind::Zstd, CodecKind::None, CodecKind::Wal] {
                round_trip(kind, &msgs);
            }
        }

        #[test]
        fn garbage_payload_never_panics(payload in proptest::collection::vec(any::<u8>(), 0..500), len in 0usize..5000) {
            for kind in [CodecKind::Zstd, CodecKind::Wal] {
                let mut dec = WalDecoder::new(&setup(kind)).unwrap();
                let mut d = Vec::new();
                let _ = dec.decode(Lsn(0x1000000), &payload, len, 1 << 16, 0, &mut d);
            }
        }
    }
}
