//! The link codec: how the WAL bytes of each XLogData message travel between the halves.
//!
//! The sender (upstream) encodes every message of the primary as soon as it arrives and flushes
//! the encoder, so nothing waits for later bytes; the receiver (downstream) decodes and checks
//! the result against the original's length and xxh3-64 (carried in the link's `Wal` message)
//! before a byte reaches a standby.
//!
//! Codecs are per session and stateful: both ends feed every message through in order.
//! - `zstd`: one streaming zstd context per direction, `ZSTD_e_flush` after every message;
//!   the window (and so the memory per session) is bounded by `link.zstd_window_log`.
//! - `none`: the bytes as they are.

use crate::config::CodecKind;
use zstd::stream::raw::{CParameter, DParameter, Decoder, Encoder, InBuffer, Operation, OutBuffer};

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("zstd: {0}")]
    Zstd(#[from] std::io::Error),
    #[error("decoded {got} bytes where the sender announced {want}")]
    Length { got: usize, want: usize },
    #[error("announced length {0} exceeds the limit of {1} bytes (limits.max_message_bytes)")]
    TooLong(usize, usize),
    #[error("integrity check failed: restored bytes differ from the primary's (xxh3 {got:016x}, expected {want:016x})")]
    Checksum { got: u64, want: u64 },
}

/// Encoder side of a session.
pub enum WalEncoder {
    None,
    Zstd(Box<Encoder<'static>>),
}

/// Decoder side of a session.
pub enum WalDecoder {
    None {
        max_len: usize,
    },
    Zstd {
        dec: Box<Decoder<'static>>,
        max_len: usize,
    },
}

/// The checksum carried with every `Wal` message.
pub fn checksum(raw: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(raw)
}

impl WalEncoder {
    pub fn new(kind: CodecKind, level: i32, window_log: u32) -> Result<WalEncoder, CodecError> {
        Ok(match kind {
            CodecKind::None => WalEncoder::None,
            CodecKind::Zstd => {
                let mut e = Encoder::new(level)?;
                e.set_parameter(CParameter::WindowLog(window_log))?;
                WalEncoder::Zstd(Box::new(e))
            }
        })
    }

    /// Encodes one message's WAL bytes into `out` (cleared first), flushed.
    pub fn encode(&mut self, raw: &[u8], out: &mut Vec<u8>) -> Result<(), CodecError> {
        out.clear();
        match self {
            WalEncoder::None => out.extend_from_slice(raw),
            WalEncoder::Zstd(enc) => {
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
                    let remaining = enc.flush(&mut o)?;
                    if remaining == 0 {
                        break;
                    }
                }
            }
        }
        Ok(())
    }
}

impl WalDecoder {
    pub fn new(
        kind: CodecKind,
        window_log_max: u32,
        max_len: usize,
    ) -> Result<WalDecoder, CodecError> {
        Ok(match kind {
            CodecKind::None => WalDecoder::None { max_len },
            CodecKind::Zstd => {
                let mut d = Decoder::new()?;
                d.set_parameter(DParameter::WindowLogMax(window_log_max))?;
                WalDecoder::Zstd {
                    dec: Box::new(d),
                    max_len,
                }
            }
        })
    }

    /// Decodes one message into `out` (cleared first) and verifies length and checksum.
    pub fn decode(
        &mut self,
        payload: &[u8],
        raw_len: usize,
        xxh3: u64,
        out: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        out.clear();
        match self {
            WalDecoder::None { max_len } => {
                if raw_len > *max_len {
                    return Err(CodecError::TooLong(raw_len, *max_len));
                }
                out.extend_from_slice(payload)
            }
            WalDecoder::Zstd { dec, max_len } => {
                if raw_len > *max_len {
                    return Err(CodecError::TooLong(raw_len, *max_len));
                }
                // Room for exactly the announced length plus one byte to notice an overrun.
                out.reserve(raw_len + 1);
                let mut input = InBuffer::around(payload);
                loop {
                    let before = (input.pos(), out.len());
                    let mut o = OutBuffer::around_pos(out, out.len());
                    dec.run(&mut input, &mut o)?;
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
        let got = checksum(out);
        if got != xxh3 {
            return Err(CodecError::Checksum { got, want: xxh3 });
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

    fn round_trip(kind: CodecKind, msgs: &[Vec<u8>]) {
        let mut enc = WalEncoder::new(kind, 3, 20).unwrap();
        let mut dec = WalDecoder::new(kind, 20, 1 << 20).unwrap();
        let (mut e, mut d) = (Vec::new(), Vec::new());
        for m in msgs {
            enc.encode(m, &mut e).unwrap();
            dec.decode(&e, m.len(), checksum(m), &mut d).unwrap();
            assert_eq!(&d, m);
        }
    }

    #[test]
    fn zstd_compresses_repetitive_wal_across_messages() {
        let msg: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        let mut enc = WalEncoder::new(CodecKind::Zstd, 3, 20).unwrap();
        let mut out = Vec::new();
        enc.encode(&msg, &mut out).unwrap();
        enc.encode(&msg, &mut out).unwrap();
        // The second copy refers back to the first: a few bytes.
        assert!(out.len() < 64, "second message took {} bytes", out.len());
        round_trip(CodecKind::Zstd, &[msg.clone(), msg.clone(), vec![], msg]);
    }

    #[test]
    fn corruption_is_detected() {
        let msg = b"some WAL bytes that matter".repeat(10);
        let mut enc = WalEncoder::new(CodecKind::Zstd, 3, 20).unwrap();
        let mut dec = WalDecoder::new(CodecKind::Zstd, 20, 1 << 20).unwrap();
        let mut e = Vec::new();
        enc.encode(&msg, &mut e).unwrap();
        let mut d = Vec::new();
        assert!(dec
            .decode(&e, msg.len(), checksum(&msg) ^ 1, &mut d)
            .is_err());
        let mut dec = WalDecoder::new(CodecKind::None, 20, 1 << 20).unwrap();
        let mut bad = msg.clone();
        bad[3] ^= 0x40;
        assert!(matches!(
            dec.decode(&bad, msg.len(), checksum(&msg), &mut d),
            Err(CodecError::Checksum { .. })
        ));
    }

    #[test]
    fn announced_length_is_capped() {
        let mut dec = WalDecoder::new(CodecKind::Zstd, 20, 1000).unwrap();
        let mut d = Vec::new();
        assert!(matches!(
            dec.decode(&[], 1 << 30, 0, &mut d),
            Err(CodecError::TooLong(..))
        ));
    }

    proptest! {
        #[test]
        fn any_messages_round_trip(msgs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..3000), 1..8)) {
            round_trip(CodecKind::Zstd, &msgs);
            round_trip(CodecKind::None, &msgs);
        }

        #[test]
        fn garbage_payload_never_panics(payload in proptest::collection::vec(any::<u8>(), 0..500), len in 0usize..5000) {
            let mut dec = WalDecoder::new(CodecKind::Zstd, 20, 1 << 16).unwrap();
            let mut d = Vec::new();
            let _ = dec.decode(&payload, len, 0, &mut d);
        }
    }
}
