//! The encoder's zstd contexts: structural streams and their settings.

use super::*;

/// Record-like input: 24-byte headers whose counters and lengths change a little.
fn records(n: u32) -> Vec<u8> {
    let mut input = Vec::new();
    for i in 0..n {
        input.extend_from_slice(&(i * 80).to_le_bytes());
        input.extend_from_slice(&(i % 7 + 60).to_le_bytes());
        input.extend_from_slice(&[0x40, 10, 0, 0]);
        input.extend_from_slice(&(i.wrapping_mul(2_654_435_761) >> 20).to_le_bytes());
        input.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    }
    input
}

/// A structural stream's chunks decode with the usual decoder and differ from its level's
/// own (the settings took: what they gain is measured on recorded WAL, see `STRUCTURAL`);
/// asked for the fast settings, it compresses exactly as a new context at its level would
/// (its own match finding: `own_match_finding` holds what the linked zstd does), and back
/// again.
#[test]
fn structural_streams_decode_as_any_and_catch_up_at_their_level() {
    let input = records(30_000);
    let part = input.len() / 3;
    for level in 0..=STRUCTURAL_MAX_LEVEL {
        let mut tuned = CStream::structural(level, SMALL_WINDOW_LOG).unwrap();
        let mut d = DStream::new(SMALL_WINDOW_LOG).unwrap();
        let mut out = Vec::new();
        for (i, part) in input.chunks(part).enumerate() {
            let mut plain = CStream::new(level, SMALL_WINDOW_LOG).unwrap();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            tuned.set_fast(i == 1);
            tuned.compress(part, &mut b).unwrap();
            plain.compress(part, &mut a).unwrap();
            d.decode_capped(&b, part.len(), &mut out, "test").unwrap();
            assert!(out == part, "level {level}, part {i}");
            // After a switch, the end of the frame before (3 bytes) goes first.
            if i == 1 {
                assert_eq!(b[3..], a[..], "level {level}: its own settings");
            } else {
                let from = if i == 2 { 3 } else { 0 };
                assert!(b[from..] != a[..], "level {level}, part {i}: tuned");
            }
        }
    }
    // Above the levels it tunes, a structural stream is a plain one that keeps its level
    // when asked for the fast settings.
    let (mut a, mut b) = (Vec::new(), Vec::new());
    CStream::new(6, SMALL_WINDOW_LOG)
        .unwrap()
        .compress(&input, &mut a)
        .unwrap();
    let mut s = CStream::structural(6, SMALL_WINDOW_LOG).unwrap();
    s.set_fast(true);
    s.compress(&input, &mut b).unwrap();
    assert_eq!(a, b);
}
