//! Tests of the pglz port: known encodings, limits, corrupt input, and the compressor
//! against the transcription in [`super::reference`].

use super::{
    common_prefix, decompress, Limits, Pglz, PglzError, Strategy, GOOD_STEPS, MAX_MATCH,
    STRATEGY_ALWAYS, STRATEGY_DEFAULT,
};
use proptest::prelude::{any, prop_assert, prop_assert_eq, prop_oneof, proptest, ProptestConfig};
use proptest::strategy::Strategy as _;

fn compress(src: &[u8], s: &Strategy) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    Pglz::new().compress(src, s, &mut out).map(|n| {
        assert_eq!(n, out.len());
        out
    })
}

fn round_trip(src: &[u8], s: &Strategy) -> Option<usize> {
    let c = compress(src, s)?;
    let mut back = vec![0u8; src.len()];
    decompress(&c, &mut back).unwrap();
    assert_eq!(back, src);
    Some(c.len())
}

#[test]
fn known_encodings() {
    // 200 spaces: one literal, then a tag of 199 at offset 1 (the "Whow" of the C
    // comment): control 0b10, ' ', 0x0f 0x01 (199 - 18 = 181).
    let c = compress(&[b' '; 200], &STRATEGY_DEFAULT).unwrap();
    assert_eq!(c, [0b10, b' ', 0x0f, 0x01, 181]);
    // "112341234123412341234": 5 literals then a 16-byte tag at offset 4.
    let c = compress(b"112341234123412341234", &STRATEGY_ALWAYS).unwrap();
    assert_eq!(c, [0b10_0000, b'1', b'1', b'2', b'3', b'4', 0x0d, 0x04]);
    let mut back = [0u8; 21];
    decompress(&c, &mut back).unwrap();
    assert_eq!(&back, b"112341234123412341234");
}

#[test]
fn inputs_of_a_few_bytes_are_the_transcription() {
    // STRATEGY_ALWAYS has no minimum size: every length from empty on reaches the lists.
    let mut fast = Pglz::new();
    let mut slow = super::reference::Reference::new();
    for n in 0..12 {
        for data in [
            vec![0x80u8; n],
            (0..n as u8).map(|i| i.wrapping_mul(97)).collect(),
        ] {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let got = fast.compress(&data, &STRATEGY_ALWAYS, &mut a);
            let want =
                super::compress_with(&mut slow, &mut Vec::new(), &data, &STRATEGY_ALWAYS, &mut b);
            assert_eq!((got, &a), (want, &b), "{data:?}");
        }
    }
}

#[test]
fn good_match_settles_within_the_table() {
    for good in 17..=MAX_MATCH as i32 {
        for drop in 0..=100 {
            let s = Strategy {
                match_size_good: good,
                match_size_drop: drop,
                ..STRATEGY_ALWAYS
            };
            let lim = Limits::new(&s, 100).expect("limits");
            let last = i32::from(lim.good[GOOD_STEPS - 1]);
            assert_eq!(last - last * drop / 100, last, "good {good} drop {drop}");
        }
    }
}

#[test]
fn strategy_limits() {
    // Below min_input_size, incompressible, not compressible enough: -1 as in PostgreSQL.
    assert!(compress(&[0; 31], &STRATEGY_DEFAULT).is_none());
    assert!(compress(&[0; 32], &STRATEGY_DEFAULT).is_some());
    let mut x = 1u32;
    let noise: Vec<u8> = (0..4000)
        .map(|_| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            (x >> 16) as u8
        })
        .collect();
    assert!(compress(&noise, &STRATEGY_DEFAULT).is_none());
    // first_success_by: 1100 bytes of noise then zeros fail by default, not with "always".
    let mut late = noise[..1100].to_vec();
    late.extend_from_slice(&[0; 8000]);
    assert!(compress(&late, &STRATEGY_DEFAULT).is_none());
    assert!(round_trip(&late, &STRATEGY_ALWAYS).is_some());
}

#[test]
fn corrupt_input_is_an_error() {
    let mut out = [0u8; 16];
    // A tag before any output.
    assert!(matches!(
        decompress(&[1, 0x10, 0x01], &mut out),
        Err(PglzError::BadOffset { .. })
    ));
    // Cut inside a tag.
    assert_eq!(
        decompress(&[2, b'a', 0x0f], &mut out),
        Err(PglzError::Truncated)
    );
    // Too short, too long.
    assert!(matches!(
        decompress(&[0, b'a'], &mut out),
        Err(PglzError::Length { .. })
    ));
    let mut one = [0u8; 1];
    assert!(matches!(
        decompress(&[0, b'a', b'b'], &mut one),
        Err(PglzError::Length { .. })
    ));
}

/// Bytes like heap tuples: a shared header, a counter, a few random bytes each.
fn pagelike(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(n + 64);
    let mut k = 0u32;
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&[0xE2, 0x04, 0, 0, 0, 0, 0, 0, 0x02, 0x00, 0x18, 0x09, 0x02]);
        out.extend_from_slice(&k.to_le_bytes());
        out.extend_from_slice(&x.to_le_bytes()[..(x % 9) as usize]);
        out.extend_from_slice(&[b' '; 12][..(x >> 8) as usize % 12]);
        k += 1;
    }
    out.truncate(n);
    out
}

#[test]
fn page_like_data_round_trips() {
    for seed in 0..20 {
        let p = pagelike(seed, 8192 - (seed as usize * 300));
        let always = round_trip(&p, &STRATEGY_ALWAYS).expect("compressible");
        if let Some(default) = round_trip(&p, &STRATEGY_DEFAULT) {
            assert!(default * 4 <= p.len() * 3, "{default} of {}", p.len());
        }
        assert!(always < p.len());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn common_prefix_is_the_byte_loop(
        a in proptest::collection::vec(0u8..3, 0..300),
        b in proptest::collection::vec(0u8..3, 0..40),
    ) {
        // b = a's start, maybe changed, then more: as a candidate earlier in the input.
        let mut b2 = a.clone();
        for (i, x) in b.iter().enumerate().take(a.len()) {
            if *x == 0 { b2[i * 7 % a.len()] ^= 1; }
        }
        b2.extend_from_slice(&b);
        let naive = a.iter().zip(&b2).take_while(|(x, y)| x == y).count();
        prop_assert_eq!(common_prefix(&a, &b2), naive);
    }

    #[test]
    fn decompress_inverts_compress(
        data in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..9000),
            proptest::collection::vec(0u8..4, 0..9000),
            (any::<u64>(), 0usize..9000).prop_map(|(s, n)| pagelike(s, n)),
        ],
    ) {
        for s in [STRATEGY_DEFAULT, STRATEGY_ALWAYS] {
            let mut out = Vec::new();
            if let Some(n) = Pglz::new().compress(&data, &s, &mut out) {
                prop_assert_eq!(n, out.len());
                prop_assert!(out.len() < data.len().max(1));
                let mut back = vec![0u8; data.len()];
                prop_assert_eq!(decompress(&out, &mut back), Ok(()));
                prop_assert_eq!(&back, &data);
            }
        }
    }

    /// The compressor gives the transcription's bytes (and its refusals) on inputs that
    /// recycle history entries (over 4096 bytes), hit the 0x0fff offset limit, fill
    /// long lists (few distinct bytes) and switch strategies between calls on one value,
    /// one of them with any `good_match` and `good_drop` (clamped or not).
    #[test]
    fn compress_is_the_transcription(
        data in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..12000),
            proptest::collection::vec(0u8..3, 0..12000),
            (any::<u64>(), 0usize..12000).prop_map(|(s, n)| pagelike(s, n)),
            (any::<u64>(), 4000usize..9000, 0usize..600).prop_map(|(s, n, z)| {
                let mut p = pagelike(s, n);
                p.splice(n / 3..n / 3, std::iter::repeat_n(0, z));
                p
            }),
        ],
        good in 1i32..300,
        drop in -5i32..110,
    ) {
        let mut fast = Pglz::new();
        let mut slow = super::reference::Reference::new();
        let odd = Strategy { match_size_good: good, match_size_drop: drop, ..STRATEGY_ALWAYS };
        for s in [STRATEGY_DEFAULT, STRATEGY_ALWAYS, odd, STRATEGY_DEFAULT] {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let got = fast.compress(&data, &s, &mut a);
            let want = super::compress_with(&mut slow, &mut Vec::new(), &data, &s, &mut b);
            prop_assert_eq!(got, want);
            if want.is_some() {
                prop_assert_eq!(&a, &b);
            }
        }
    }

    /// A tag's copy gives the C code's byte loop, overlapping or not.
    #[test]
    fn copy_back_is_the_byte_loop(
        start in proptest::collection::vec(any::<u8>(), 1..40),
        off in 1usize..40,
        len in 0usize..300,
    ) {
        let off = off.min(start.len());
        let dp = start.len();
        let mut want = start.clone();
        want.resize(dp + len, 0);
        let mut got = want.clone();
        for i in dp..dp + len {
            want[i] = want[i - off];
        }
        super::copy_back(&mut got, dp, off, len);
        prop_assert_eq!(got, want);
    }

    #[test]
    fn garbage_never_panics(src in proptest::collection::vec(any::<u8>(), 0..600), n in 0usize..9000) {
        let mut out = vec![0u8; n];
        let _ = decompress(&src, &mut out);
    }
}
