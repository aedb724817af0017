//! Inputs that are not what the codec expects. Bytes that are not WAL, or WAL with bytes
//! changed, still round-trip (the encoder passes what it does not understand raw); payloads
//! damaged on the way, or made up, are errors or restore different bytes (which the caller's
//! checksum catches), and never panic the decoder.

use proptest::prelude::*;

use super::testgen::{Entropy, Rng, WalGen};
use super::tests::{every, params, round_trip, synthetic};
use super::*;
use crate::lsn::Lsn;
use crate::pg::PgMajor;

const SEG: u64 = 1 << 20;

/// Flips one bit of one payload: the decoder errors or restores bytes that differ (which the
/// caller's xxh3 catches), or, rarely, the very same bytes (a flip zstd does not depend on, e.g.
/// the last-block flag of the final block); it never panics.
#[test]
fn corrupted_payloads_are_errors_or_differ() {
    let g = synthetic(8, 200_000, 10);
    let p = params(64);
    let cuts = every(40_000, g.buf.len());
    let mut payloads = Vec::new();
    let mut enc = Encoder::new(&p).unwrap();
    let mut at = 0;
    for end in cuts.iter().copied().chain([g.buf.len()]) {
        let mut out = Vec::new();
        enc.encode(Lsn(g.start + at as u64), &g.buf[at..end], &mut out)
            .unwrap();
        payloads.push((at, end, out));
        at = end;
    }
    let mut rng = Rng::new(99);
    let (mut errors, mut differ, mut same) = (0, 0, 0);
    for trial in 0..300 {
        let victim = trial % payloads.len();
        let mut dec = Decoder::new(&p).unwrap();
        let mut out = Vec::new();
        for (i, (a, b, pl)) in payloads.iter().enumerate() {
            let lsn = Lsn(g.start + *a as u64);
            if i == victim {
                let mut bad = pl.clone();
                let k = rng.below(bad.len() as u64) as usize;
                bad[k] ^= 1 << rng.below(8);
                match dec.decode(lsn, &bad, b - a, &mut out) {
                    Err(_) => errors += 1,
                    Ok(()) if out != g.buf[*a..*b] => differ += 1,
                    Ok(()) => same += 1,
                }
                break;
            }
            dec.decode(lsn, pl, b - a, &mut out).unwrap();
        }
    }
    println!("bit flips: {errors} errors, {differ} different bytes, {same} harmless");
    // Streams at zstd level 1 leave a few more bits that change nothing (about 1 flip in 10
    // here); the caller's checksum is what guarantees the bytes.
    assert!(
        errors + differ >= 255,
        "{errors} errors, {differ} differ, {same} same"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_round_trip(
        msgs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..3000), 1..6),
        start in prop_oneof![Just(0u64), Just(3 * SEG), any::<u32>().prop_map(u64::from)],
    ) {
        let p = params(4);
        let mut enc = Encoder::new(&p).unwrap();
        let mut dec = Decoder::new(&p).unwrap();
        let (mut pl, mut out) = (Vec::new(), Vec::new());
        let mut at = start;
        for m in &msgs {
            enc.encode(Lsn(at), m, &mut pl).unwrap();
            dec.decode(Lsn(at), &pl, m.len(), &mut out).unwrap();
            prop_assert_eq!(&out, m);
            at += m.len() as u64;
        }
    }

    /// Arbitrary bytes that look like WAL: real page headers sprinkled over random bytes.
    #[test]
    fn wal_like_garbage_round_trips(seed in any::<u64>(), cuts in proptest::collection::vec(0usize..40_000, 0..8)) {
        let mut rng = Rng::new(seed);
        let g = synthetic(seed % 50, 40_000, 4);
        let mut wal = g.buf.clone();
        for _ in 0..(1 + rng.below(30)) {
            let k = rng.below(wal.len() as u64) as usize;
            wal[k] = rng.u8();
        }
        round_trip(&params(3), g.start, &wal, &cuts);
    }

    #[test]
    fn garbage_payloads_never_panic(payload in proptest::collection::vec(any::<u8>(), 0..600), len in 0usize..5000) {
        let mut dec = Decoder::new(&params(4)).unwrap();
        let mut out = Vec::new();
        let _ = dec.decode(Lsn(3 * SEG), &payload, len, &mut out);
        // Structurally valid headers with garbage after them.
        let mut pl = vec![FORMAT_VERSION, 0x7F, 40, 40, 40, 0, 0, 0, 40];
        pl.extend_from_slice(&payload);
        let mut dec = Decoder::new(&params(4)).unwrap();
        let _ = dec.decode(Lsn(3 * SEG), &pl, len, &mut out);
        let mut pl = vec![0x80 | FORMAT_VERSION, 80];
        pl.extend_from_slice(&payload);
        let mut dec = Decoder::new(&params(4)).unwrap();
        let _ = dec.decode(Lsn(3 * SEG), &pl, len, &mut out);
    }
}

/// One message of synthetic WAL (without the zero tail of a switch), encoded: (start, length,
/// payload).
fn warm_payload() -> &'static (u64, usize, Vec<u8>) {
    static WARM: std::sync::OnceLock<(u64, usize, Vec<u8>)> = std::sync::OnceLock::new();
    WARM.get_or_init(|| {
        let mut g = WalGen::new(PgMajor::V15, SEG, 3 * SEG, 1);
        while g.buf.len() < 30_000 {
            g.random_record(4);
        }
        let mut enc = Encoder::new(&params(4)).unwrap();
        let mut pl = Vec::new();
        enc.encode(Lsn(g.start), &g.buf, &mut pl).unwrap();
        (g.start, g.buf.len(), pl)
    })
}

/// Builds a payload whose sections are valid zstd holding arbitrary bytes, so that the op
/// interpreter itself sees garbage: separate sections, or one combined chunk.
fn garbage_payload(sections: &[Vec<u8>; STREAMS], fpi: &[u8], combined: bool) -> Vec<u8> {
    use super::streams::{put_varint, CStream};
    let mut c = CStream::new(3, 20).unwrap();
    if combined {
        let mut joined = Vec::new();
        for s in sections {
            put_varint(&mut joined, s.len() as u64);
        }
        for s in sections {
            joined.extend_from_slice(s);
        }
        let mut chunk = Vec::new();
        c.compress(&joined, &mut chunk).unwrap();
        let mut out = vec![0x80 | FORMAT_VERSION];
        put_varint(&mut out, chunk.len() as u64);
        out.extend_from_slice(&chunk);
        out.extend_from_slice(fpi);
        return out;
    }
    let mut present = u64::from(!fpi.is_empty()) << STREAMS;
    let mut secs = Vec::new();
    for (i, s) in sections.iter().enumerate() {
        present |= u64::from(!s.is_empty()) << i;
        let mut c = CStream::new(3, 20).unwrap();
        let mut sec = Vec::new();
        c.compress(s, &mut sec).unwrap();
        secs.push(sec);
    }
    let mut out = vec![FORMAT_VERSION];
    put_varint(&mut out, present);
    for sec in secs.iter().filter(|s| !s.is_empty()) {
        put_varint(&mut out, sec.len() as u64);
    }
    for s in secs {
        out.extend_from_slice(&s);
    }
    out.extend_from_slice(fpi);
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn garbage_ops_never_panic(
        ctrl in proptest::collection::vec(prop_oneof![0u8..6, 0x40u8..0x50, any::<u8>()], 0..200),
        other in proptest::collection::vec(any::<u8>(), 0..400),
        fpi in proptest::collection::vec(any::<u8>(), 0..100),
        len in 0usize..20_000,
        warm in any::<bool>(),
        combined in any::<bool>(),
    ) {
        let p = params(4);
        let mut dec = Decoder::new(&p).unwrap();
        let mut out = Vec::new();
        let mut lsn = 3 * SEG;
        if warm {
            // Lock the decoder on first so that predictions are possible.
            let (start, len, pl) = warm_payload();
            dec.decode(Lsn(*start), pl, *len, &mut out).unwrap();
            lsn = start + *len as u64;
        }
        let h = other.len() / 2;
        let sections = [ctrl, other[..h].to_vec(), other[h..].to_vec(), other.clone(), other[..h / 2].to_vec(), other[h / 2..].to_vec(), other[h..].to_vec(), other[..h].to_vec(), other[h / 2..].to_vec()];
        let pl = garbage_payload(&sections, &fpi, combined);
        let _ = dec.decode(Lsn(lsn), &pl, len, &mut out);
    }
}

/// The garbage builder makes payloads the decoder reads (so the proptests above reach the op
/// interpreter): a ZERO op restores zeros in both framings, and a section left over is an
/// error.
#[test]
fn hand_built_payloads_reach_the_ops() {
    let mut sections: [Vec<u8>; STREAMS] = Default::default();
    sections[S_CTRL] = vec![format::OP_ZERO, 100];
    for combined in [false, true] {
        let pl = garbage_payload(&sections, &[], combined);
        let mut out = Vec::new();
        let mut dec = Decoder::new(&params(4)).unwrap();
        dec.decode(Lsn(3 * SEG + 24), &pl, 100, &mut out).unwrap();
        assert_eq!(out, vec![0u8; 100]);
        for s in [S_DATA, S_LONG] {
            let mut extra = sections.clone();
            extra[s] = vec![1, 2, 3];
            let pl = garbage_payload(&extra, &[], combined);
            let mut dec = Decoder::new(&params(4)).unwrap();
            let e = dec.decode(Lsn(3 * SEG + 24), &pl, 100, &mut out);
            assert!(matches!(e, Err(WalCodecError::Corrupt(_))), "{e:?}");
        }
    }
    // A separate payload naming a section beyond the eight streams and the page frames.
    let mut pl = vec![FORMAT_VERSION];
    super::streams::put_varint(&mut pl, 1 << (STREAMS + 1));
    let e = Decoder::new(&params(4))
        .unwrap()
        .decode(Lsn(3 * SEG + 24), &pl, 100, &mut Vec::new());
    assert!(
        matches!(&e, Err(WalCodecError::Corrupt(m)) if m.contains("names sections")),
        "{e:?}"
    );
}
