//! The in-place input of the streams without long-distance matching (`streams::CStream`'s
//! ring): messages through several rings' worth, a message larger than the ring and a
//! switch of settings in between all restore through one streaming decoder; history holds
//! across messages within a frame and is lost where the ring starts over.

use super::streams::{CStream, DStream, SMALL_WINDOW_LOG};
use super::testgen::{Entropy, Rng};

/// `n` bytes of text-like data (a few hundred distinct words) from `seed`.
fn words(seed: u64, n: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(n + 16);
    while out.len() < n {
        out.extend_from_slice(format!("w{} ", rng.below(397)).as_bytes());
    }
    out.truncate(n);
    out
}

/// 100,000 incompressible bytes from `seed`.
fn noise(seed: u64) -> Vec<u8> {
    Rng::new(seed).bytes(100_000)
}

/// The two ends of one stream.
fn pair() -> (CStream, DStream) {
    (
        CStream::new(1, SMALL_WINDOW_LOG).unwrap(),
        DStream::new(SMALL_WINDOW_LOG).unwrap(),
    )
}

/// Compresses each message with `cs` (fast settings for message `i` when `fast(i)`),
/// decompresses each flushed section with `ds` and checks it; returns the sections.
fn round_trip(
    (cs, ds): &mut (CStream, DStream),
    msgs: &[Vec<u8>],
    fast: impl Fn(usize) -> bool,
) -> Vec<Vec<u8>> {
    let (mut sections, mut back) = (Vec::new(), Vec::new());
    for (i, m) in msgs.iter().enumerate() {
        cs.set_fast(fast(i));
        let mut section = Vec::new();
        cs.compress(m, &mut section).unwrap();
        ds.decode_capped(&section, m.len(), &mut back, "TEST")
            .unwrap_or_else(|e| panic!("message {i}: {e}"));
        assert!(back == *m, "message {i} restored differently");
        sections.push(section);
    }
    sections
}

#[test]
fn messages_through_several_rings_restore() {
    // A 1 MiB window: a ring of 2 MiB, filled about five times over.
    let mut msgs: Vec<Vec<u8>> = (0..40).map(|i| words(i, 256 * 1024)).collect();
    // Larger than the ring: it goes in pieces, the frame starting over between them.
    msgs.insert(20, words(99, 5 * 1024 * 1024 + 17));
    let sections = round_trip(&mut pair(), &msgs, |i| (25..30).contains(&i));
    let (raw, packed): (usize, usize) = (
        msgs.iter().map(Vec::len).sum(),
        sections.iter().map(Vec::len).sum(),
    );
    assert!(
        packed * 2 < raw,
        "{packed} of {raw}: the stream did not compress"
    );
}

#[test]
fn history_holds_within_a_frame_and_restarts_with_the_ring() {
    let a = noise(7);
    let mut ends = pair();
    // The same incompressible message twice: the second is a match into the first.
    let s = round_trip(&mut ends, &[a.clone(), a.clone()], |_| false);
    assert!(s[0].len() > 99_000, "noise compressed to {}", s[0].len());
    assert!(s[1].len() < 1_000, "a repeat took {} bytes", s[1].len());
    // 1.9 MB of other noise, then a fresh message twice: the first still fits the ring
    // (2 MiB for a 1 MiB window), the second starts a new frame, which does not see it.
    let fill: Vec<Vec<u8>> = (0..17).map(noise).collect();
    round_trip(&mut ends, &fill, |_| false);
    let b = noise(1000);
    let s = round_trip(&mut ends, &[b.clone(), b], |_| false);
    assert!(
        s[1].len() > 99_000,
        "a new frame matched old history: {}",
        s[1].len()
    );
}
