use super::super::hitparse::tests::apply as naive;
use super::super::hitparse::HitParse;
use super::*;

fn seq(offset: u32, lit: u32, ml: u32) -> Seq {
    Seq { offset, lit, ml }
}

fn pages(seed: u64) -> (Box<[u8; PAGE_SIZE]>, Box<[u8; PAGE_SIZE]>) {
    super::super::hitparse::tests::pages(seed)
}

/// Writes `seqs` for `page`, reads them back against `reference`; checks the length `put`
/// returned and `span`.
fn round_trip(reference: &[u8; PAGE_SIZE], page: &[u8; PAGE_SIZE], seqs: &[Seq]) -> Vec<u8> {
    let mut out = vec![0xEE];
    let n = put(seqs, page, &mut out).expect("in bounds");
    assert_eq!(out.len(), n + 1);
    assert_eq!(span(&out[1..]).unwrap(), n);
    out.push(0x77);
    let mut r = Reader::new(&out[1..], "HIT");
    let mut back = Box::new([0x55u8; PAGE_SIZE]);
    apply(&mut r, reference, &mut back).unwrap();
    assert_eq!(r.position(), n, "reads exactly the hit");
    back.to_vec()
}

#[test]
fn parsed_pages_come_back() {
    let mut hp = HitParse::new();
    let zeros = Box::new([0u8; PAGE_SIZE]);
    let mut cases = vec![(zeros.clone(), zeros.clone())];
    for seed in 1..30 {
        cases.push(pages(seed));
    }
    cases.push((pages(3).0, pages(4).0));
    cases.push((pages(5).0, pages(5).0));
    for (i, (r, p)) in cases.iter().enumerate() {
        let seqs = hp.parse(r, p).to_vec();
        assert_eq!(round_trip(r, p, &seqs), p.to_vec(), "case {i}");
    }
}

/// A match that crosses from the reference's end into the page (and so overlaps what it
/// writes), a run of a literal, a match that ends the page (an empty last piece), and a page
/// of literals alone.
#[test]
fn crossing_overlapping_and_edge_matches() {
    let (r, q) = pages(8);
    let seqs = [
        seq(6, 0, 10),
        seq(1, 1, 9),
        seq(PAGE_SIZE as u32, 3, (PAGE_SIZE - 23) as u32),
    ];
    let p: Box<[u8; PAGE_SIZE]> = naive(&r, &q, &seqs).try_into().unwrap();
    assert_eq!(p[..6], r[PAGE_SIZE - 6..]);
    assert_eq!(p[6..10], r[PAGE_SIZE - 6..PAGE_SIZE - 2]);
    assert!(p[11..20].iter().all(|&b| b == p[10]));
    assert_eq!(round_trip(&r, &p, &seqs), p.to_vec());
    assert_eq!(round_trip(&r, &q, &[]), q.to_vec(), "all literals");
}

/// Matches outside the page or before the reference are not written.
#[test]
fn put_refuses_what_breaks_the_bounds() {
    let (_, p) = pages(2);
    let bad = [
        seq(0, 0, 8),
        // After the first match the page is at 12: 4 literals more, 16.
        seq(PAGE_SIZE as u32 + 17, 4, 8),
        seq(PAGE_SIZE as u32 + 13, 0, 8),
        seq(8, 10, 0),
        seq(8, 10, PAGE_SIZE as u32 - 9),
        seq(8, PAGE_SIZE as u32, 4),
    ];
    for s in bad {
        let mut out = vec![1, 2, 3];
        let ok = seq(PAGE_SIZE as u32, 4, 8);
        assert_eq!(put(&[ok, s], &p, &mut out), None, "{s:?}");
        assert_eq!(out, [1, 2, 3], "{s:?}");
    }
    let edge = seq(PAGE_SIZE as u32 + 4, 4, 8);
    assert!(
        put(&[edge], &p, &mut Vec::new()).is_some(),
        "from the reference's first byte"
    );
}

/// Damaged hits are refused with an error, never a panic or a page from outside.
#[test]
fn damaged_hits_are_refused() {
    let r = Box::new([7u8; PAGE_SIZE]);
    let mut page = Box::new([0u8; PAGE_SIZE]);
    let cases: [(&[u8], &str); 6] = [
        (&[0x81, 0x40], "literals past the page"),
        (
            &[
                0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01, 4,
            ],
            "a source of −2⁶³",
        ),
        (
            &[0, 0x82, 0x80, 0x01, 4],
            "a match from before the reference",
        ),
        (&[0, 1, 0], "a match of no bytes"),
        (&[1, 9, 0, 0x80, 0x40], "a match past the page"),
        (&[2, 1], "cut short"),
    ];
    for (bytes, what) in cases {
        let mut rd = Reader::new(bytes, "HIT");
        assert!(apply(&mut rd, &r, &mut page).is_err(), "{what}");
        assert!(span(bytes).is_err(), "{what}");
    }
    // A match from the byte it writes (d = −8192 at pos 0: `reference ++ page` at 8192).
    let mut rd = Reader::new(&[0, 0xFF, 0x7F, 4], "HIT");
    assert!(apply(&mut rd, &r, &mut page).is_err());
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
    /// Any reference and any edits of it (bytes set, ranges moved, runs written): the parse's
    /// hit restores the page.
    #[test]
    fn edited_pages_round_trip(
        seed in proptest::prelude::any::<u64>(),
        edits in proptest::collection::vec(
            (0usize..PAGE_SIZE, 0usize..PAGE_SIZE, 0usize..600, proptest::prelude::any::<u8>(), 0u8..3),
            0..40,
        ),
    ) {
        let (r, _) = pages(seed);
        let mut p = r.clone();
        for (a, b, n, v, kind) in edits {
            let n = n.min(PAGE_SIZE - a.max(b));
            match kind {
                0 => p[a] = v,
                1 => p.copy_within(a..a + n, b),
                _ => p[a..a + n].fill(v),
            }
        }
        let seqs = HitParse::new().parse(&r, &p).to_vec();
        proptest::prop_assert_eq!(round_trip(&r, &p, &seqs), p.to_vec());
    }

    /// Any bytes: an error or a page, never a panic; what `span` measures is what `apply`
    /// reads.
    #[test]
    fn any_bytes_are_safe(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
        let r = Box::new([3u8; PAGE_SIZE]);
        let mut page = Box::new([0u8; PAGE_SIZE]);
        let mut rd = Reader::new(&bytes, "HIT");
        let applied = apply(&mut rd, &r, &mut page).map(|()| rd.position());
        proptest::prop_assert_eq!(applied.ok(), span(&bytes).ok());
    }
}
