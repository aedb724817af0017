//! The decoder of walrelay's WAL-aware link codec on payloads it did not produce: the downstream
//! half decodes whatever arrives on the link. It must never panic, never produce more than the
//! announced length, and after an error refuse everything (poisoned).
//!
//! Input: byte 0 picks the major, the cache size and the mode.
//! - mode "garbage": records `start: u64 LE | raw_len: u32 LE | payload_len: u16 LE | payload`,
//!   decoded in order by one decoder;
//! - mode "mutated": well-formed WAL is generated from the input (`walcodec::testgen::shaped`,
//!   the generator of the codec's unit and property tests) and encoded into
//!   real payloads, which are then damaged at input-chosen places (bytes flipped, truncated,
//!   lengths or starts changed) before decoding, so the fuzzer reaches deep into the format.
#![no_main]

use libfuzzer_sys::fuzz_target;
use walrelay_wal::lsn::Lsn;
use walrelay_wal::pg::PgMajor;
use walrelay_wal::walcodec::testgen::{self, Entropy, Src};
use walrelay_wal::walcodec::{CodecParams, Decoder, Encoder};

const MAX_MESSAGE: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let mut src = Src::new(data);
    let sel = src.u8();
    let params = CodecParams {
        // 13: a major the codec does not know (its WAL is written as 17's).
        pg_major: PgMajor::from_number(13 + u32::from(sel % 6)),
        block_cache_bytes: usize::from(sel >> 3 & 7) * (8192 + 64),
        zstd_level: 1,
        max_message_bytes: MAX_MESSAGE,
    };
    let mut dec = Decoder::new(&params).expect("decoder");
    let mut out = Vec::new();
    let mut failed = false;
    let mut check =
        |dec: &mut Decoder, start: Lsn, payload: &[u8], raw_len: usize, out: &mut Vec<u8>| {
            let res = dec.decode(start, payload, raw_len, out);
            assert!(
                out.len() <= raw_len.min(MAX_MESSAGE),
                "decoded {} bytes, announced {raw_len}",
                out.len()
            );
            assert!(
                out.capacity() <= 4 * MAX_MESSAGE,
                "output buffer grew to {} bytes",
                out.capacity()
            );
            match res {
                Ok(()) => {
                    assert!(!failed, "decoder accepted a message after an error");
                    assert_eq!(out.len(), raw_len);
                }
                Err(e) => {
                    let _ = e.to_string();
                    failed = true;
                }
            }
        };

    if sel & 0x40 == 0 {
        while !src.is_empty() {
            let start = Lsn(src.next_u64());
            let raw_len = src.u32() as usize % (2 * MAX_MESSAGE);
            let plen = usize::from(src.u16());
            let payload = src.take(plen).to_vec();
            check(&mut dec, start, &payload, raw_len, &mut out);
        }
        return;
    }

    // Mutated real payloads.
    let base: u64 = (5 << 24) + 8192 * u64::from(sel >> 7);
    let m = src.u8();
    let nmut = usize::from(m % 8);
    // The decoder restores images on a worker or in place (the same bytes or error either
    // way); the encoder checks in place, so that an input always makes the same payloads.
    dec.set_parallel(m & 0x80 != 0);
    let muts: Vec<(u16, u8, u8)> = (0..nmut).map(|_| (src.u16(), src.u8(), src.u8())).collect();
    let major = params.pg_major.unwrap_or(PgMajor::V17);
    let wal = testgen::shaped(&mut src, major, base);
    let mut enc = Encoder::new(&params).expect("encoder");
    enc.set_parallel(false);
    let mut payload = Vec::new();
    let mut pos = base;
    for (i, chunk) in wal.chunks(8192 + 100).enumerate() {
        enc.encode(Lsn(pos), chunk, &mut payload).expect("encode");
        let mut raw_len = chunk.len();
        let mut start = pos;
        for &(at, x, what) in &muts {
            if usize::from(what >> 4) != i % 16 {
                continue;
            }
            match what & 3 {
                0 | 1 => {
                    if !payload.is_empty() {
                        let at = usize::from(at) % payload.len();
                        payload[at] ^= x.max(1);
                    }
                }
                2 => payload.truncate(usize::from(at) % (payload.len() + 1)),
                _ => {
                    if x & 1 != 0 {
                        raw_len = usize::from(at);
                    } else {
                        start = start.wrapping_add(u64::from(at));
                    }
                }
            }
        }
        check(&mut dec, Lsn(start), &payload, raw_len, &mut out);
        pos += chunk.len() as u64;
    }
});
