//! The streams' fast settings ([`Encoder::set_fast`]): switched on and off between any two
//! messages, in both section layouts and through the staged path, the payloads restore the
//! same WAL with a decoder that knows nothing of it; a switch starts new zstd frames, so the
//! long history is lost across it.

use proptest::prelude::*;

use super::testgen::{Entropy, WalGen};
use super::tests::{every, insert_row, params, synthetic, value_seen_long_ago};
use super::tests_stage::assert_same_payloads;
use super::*;
use crate::lsn::Lsn;
use crate::pg::PgMajor;

/// Encodes `wal` cut at `cuts` with the fast settings on for message `i` when `fast(i)`,
/// decodes every message with a fresh decoder and checks it; returns the payloads.
fn round_trip_switching(
    p: &CodecParams,
    start: u64,
    wal: &[u8],
    cuts: &[usize],
    fast: impl Fn(usize) -> bool,
) -> Vec<Vec<u8>> {
    let mut enc = Encoder::new(p).unwrap();
    let mut dec = Decoder::new(p).unwrap();
    let (mut payloads, mut restored) = (Vec::new(), Vec::new());
    let mut at = 0;
    for (i, end) in cuts.iter().copied().chain([wal.len()]).enumerate() {
        if end <= at {
            continue;
        }
        enc.set_fast(fast(i));
        let lsn = Lsn(start + at as u64);
        let mut out = Vec::new();
        enc.encode(lsn, &wal[at..end], &mut out).unwrap();
        dec.decode(lsn, &out, end - at, &mut restored)
            .unwrap_or_else(|e| panic!("message {i} at {lsn}: {e}"));
        assert!(
            restored == wal[at..end],
            "message {i} at {lsn} restored differently"
        );
        payloads.push(out);
        at = end;
    }
    payloads
}

/// Message sizes that mix the combined layout (small) and the separate one (large).
fn mixed_cuts(len: usize) -> Vec<usize> {
    let mut cuts = Vec::new();
    let mut at = 0;
    for i in 0.. {
        at += if i % 3 == 2 { 90_000 } else { 900 };
        if at >= len {
            break;
        }
        cuts.push(at);
    }
    cuts
}

#[test]
fn switching_between_any_messages_restores_the_same_wal() {
    let g = synthetic(21, 1_200_000, 30);
    let p = params(200);
    let cuts = mixed_cuts(g.buf.len());
    let normal = round_trip_switching(&p, g.start, &g.buf, &cuts, |_| false);
    for pattern in [|i: usize| i % 2 == 1, |i: usize| i % 7 >= 3, |_| true] {
        let fast = round_trip_switching(&p, g.start, &g.buf, &cuts, pattern);
        assert_eq!(fast.len(), normal.len());
        // The first message is normal in the first two patterns: the same bytes up to the
        // first switch. Every pattern changes some payload.
        let differ = fast.iter().zip(&normal).filter(|(a, b)| a != b).count();
        assert!(differ > 0, "the fast settings changed no payload");
        if !pattern(0) {
            assert_eq!(fast[0], normal[0]);
        }
    }
}

#[test]
fn staged_messages_keep_the_settings_they_were_staged_with() {
    let g = synthetic(22, 900_000, 30);
    let p = params(100);
    let cuts = every(96 * 1024, g.buf.len());
    let fast = |i: usize| (i / 2) % 2 == 1;
    let want = round_trip_switching(&p, g.start, &g.buf, &cuts, fast);

    let mut enc = Encoder::new(&p).unwrap();
    enc.threaded_checks(true);
    let (mut got, mut out) = (Vec::new(), Vec::new());
    let mut at = 0;
    for (i, end) in cuts.iter().copied().chain([g.buf.len()]).enumerate() {
        enc.set_fast(fast(i));
        enc.stage(Lsn(g.start + at as u64), &g.buf[at..end])
            .unwrap();
        // Switched again while the message waits: the staged one keeps its settings.
        enc.set_fast(!fast(i));
        if enc.staged() == 2 {
            assert!(enc.collect(&mut out).unwrap());
            got.push(out.clone());
        }
        at = end;
    }
    while enc.collect(&mut out).unwrap() {
        got.push(out.clone());
    }
    assert_same_payloads(&got, &want);
}

/// Text-like rows (hex digits, like a bulk load of md5 text): the fast settings still code
/// literals with Huffman tables, so they stay near half their size.
#[test]
fn fast_settings_keep_text_compressed() {
    let mut g = WalGen::new(PgMajor::V15, 64 << 20, 0, 23);
    for b in 0..600u32 {
        let row: Vec<u8> = g
            .rng
            .bytes(2000)
            .iter()
            .map(|x| b"0123456789abcdef"[(x & 15) as usize])
            .collect();
        insert_row(&mut g, 16600, b, &row);
    }
    let p = params(200);
    let cuts = every(128 * 1024, g.buf.len());
    let size = |fast: bool| -> usize {
        round_trip_switching(&p, g.start, &g.buf, &cuts, |_| fast)
            .iter()
            .map(Vec::len)
            .sum()
    };
    let (normal, fast) = (size(false), size(true));
    let rows = 600 * 2000;
    assert!(
        normal < rows * 6 / 10,
        "normal {normal} for {rows} bytes of hex"
    );
    assert!(
        fast < rows * 6 / 10,
        "fast {fast} for {rows} bytes of hex (normal {normal})"
    );
}

/// A value written again long after is found through DATA's long history at the normal
/// settings and at the fast ones (their long-distance matcher samples more sparsely, but
/// stays on); after a switch (new frames, the history gone) it costs its size again.
#[test]
fn the_fast_settings_keep_the_long_history_and_a_switch_loses_it() {
    let (g, mark) = value_seen_long_ago(24);
    let p = CodecParams {
        block_cache_bytes: 1 << 30,
        ..params(0)
    };
    let mut cuts = every(1 << 20, mark);
    cuts.push(mark);
    let last = cuts.len();
    let cost = |fast: &dyn Fn(usize) -> bool| -> usize {
        round_trip_switching(&p, g.start, &g.buf, &cuts, fast)
            .last()
            .unwrap()
            .len()
    };
    let kept = cost(&|_| false);
    let kept_fast = cost(&|_| true);
    let fast = cost(&|i| i == last);
    let back = cost(&|i| i == last - 1);
    assert!(kept < 300, "normal settings throughout: {kept}");
    assert!(kept_fast < 300, "fast settings throughout: {kept_fast}");
    assert!(fast > 5000, "fast settings from the repeat on: {fast}");
    assert!(back > 5000, "normal again after a switch: {back}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    /// Any pattern of switches over any cuts restores the WAL.
    #[test]
    fn any_switches_round_trip(seed in 0u64..1000, bits in any::<u64>(), step in 500usize..60_000) {
        let g = synthetic(seed, 400_000, 25);
        let cuts = every(step, g.buf.len());
        round_trip_switching(&params(100), g.start, &g.buf, &cuts, |i| bits >> (i % 64) & 1 == 1);
    }
}
