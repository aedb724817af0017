//! walrelay's WAL-aware link codec (`walrelay_wal::walcodec`): whatever the WAL bytes, the decoder
//! must restore exactly what the encoder was given.
//!
//! Input: byte 0 picks the major (13 = unsupported, so everything passes raw; 14..=18), the
//! start and the mode; byte 1 the block cache size (low bits), whether both ends use worker
//! threads for images (bit 7) and whether the encoder may hold a message's last record back
//! for the next message (bit 6; bits 3–4 how much, `Encoder::encode_held`), the relay's
//! batches while the primary writes fast. Then either
//! - mode "raw": the rest of the input is the WAL, cut into messages at input-chosen places and
//!   fed from an arbitrary (page-aligned or not) start; or
//! - mode "shaped": well-formed WAL is generated from the input (`walcodec::testgen::shaped`,
//!   the generator of the codec's unit and property tests), optionally with
//!   some bytes flipped, and the stream is fed from its first page or from an unaligned place
//!   inside it, cut into messages at input-chosen places.
//! Every message goes through one encoder and one decoder session, in order; a gap (a message
//! not continuing the previous one) is also tried, and the streams' fast settings
//! (`Encoder::set_fast`, new zstd frames) go on for messages of an odd cut length.
//!
//! Properties: encode never fails on WAL contents; decode(encode(m)) == m for every message;
//! a message holds back at most what it may and never all of itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use walrelay_wal::lsn::Lsn;
use walrelay_wal::pg::PgMajor;
use walrelay_wal::walcodec::testgen::{self, Entropy, Src};
use walrelay_wal::walcodec::{CodecParams, Decoder, Encoder};

fuzz_target!(|data: &[u8]| {
    let mut src = Src::new(data);
    let sel = src.u8();
    let cache = src.u8();
    // 13: a major the codec does not know (its WAL is written as 17's).
    let pg_major = PgMajor::from_number(13 + u32::from(sel % 6));
    let params = CodecParams {
        pg_major,
        block_cache_bytes: usize::from(cache % 8) * (8192 + 64),
        zstd_level: 1,
        max_message_bytes: 1 << 20,
    };
    let shaped = sel & 0x40 != 0;
    let (start, wal): (u64, Vec<u8>) = if shaped {
        // A page-aligned (sometimes segment-aligned) start, then maybe skip into the stream.
        let page = if sel & 0x80 != 0 {
            0
        } else {
            1 + u64::from(src.u8())
        };
        let base = (3 << 24) + page * 8192;
        let mut wal = testgen::shaped(&mut src, pg_major.unwrap_or(PgMajor::V17), base);
        let flips = usize::from(src.u8() % 4);
        if sel & 0x08 != 0 {
            testgen::corrupt(&mut src, &mut wal, flips);
        }
        let skip = if sel & 0x10 != 0 {
            usize::from(src.u16()).min(wal.len())
        } else {
            0
        };
        (base + skip as u64, wal[skip..].to_vec())
    } else {
        let start = match sel >> 6 {
            0 => u64::from(src.u32()) << 13, // page-aligned
            _ => (u64::from(src.u32()) << 8) | u64::from(src.u8()), // anywhere
        };
        (start, src.b.to_vec())
    };
    let lens = testgen::split(
        &mut Src::new(&data[data.len().saturating_sub(16)..]),
        wal.len(),
        20000,
    );

    let mut enc = Encoder::new(&params).expect("encoder");
    let mut dec = Decoder::new(&params).expect("decoder");
    // Image checks and restores on worker threads, or in place (the payload may then
    // differ from run to run where an image does not reproduce; the round trip may not).
    let parallel = cache & 0x80 != 0;
    enc.set_parallel(parallel);
    dec.set_parallel(parallel);
    let hold = match cache & 0x40 {
        0 => 0,
        _ => 2048usize << ((cache >> 3) & 3),
    };
    let (mut payload, mut out) = (Vec::new(), Vec::new());
    let mut pos = start;
    // Where the next message starts (after what the last one held back), and where the
    // input's cut ends it.
    let (mut from, mut off) = (0, 0);
    for (i, n) in lens.iter().copied().enumerate() {
        off += n;
        let msg = &wal[from..off];
        let h = if off == wal.len() { 0 } else { hold };
        // Now and then leave a gap: the next message does not continue this one (a new
        // START_REPLICATION position); both sides must resynchronise the same way.
        let at = if sel & 0x20 != 0 && i == 1 {
            pos + 8192
        } else {
            pos
        };
        let at = Lsn(at);
        let n = msg.len();
        enc.set_fast(n % 2 == 1);
        let took = enc
            .encode_held(at, msg, h, &mut payload)
            .unwrap_or_else(|e| panic!("encode of {n} bytes at {at} failed: {e}"));
        assert!(
            (took > 0 || n == 0) && took <= n && took + h >= n,
            "took {took} of {n} bytes, holding at most {h}"
        );
        dec.decode(at, &payload, took, &mut out)
            .unwrap_or_else(|e| panic!("decode of message {i} ({took} bytes at {at}) failed: {e}"));
        assert!(
            out == msg[..took],
            "message {i} ({took} bytes at {at}) changed in the round trip"
        );
        pos = at.0 + took as u64;
        from += took;
    }
    // The last message is never held back: every byte went.
    assert_eq!(from, wal.len());
});
