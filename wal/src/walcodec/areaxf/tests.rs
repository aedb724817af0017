use super::super::testgen::{block_key, GenBlock, Image, WalGen};
use super::super::wal::{parse_area, Area, BlockKey, REC_HDR};
use super::*;
use crate::pg::PgMajor;
use proptest::prelude::*;

const MAJOR: PgMajor = PgMajor::V16;

/// The block-header areas of records naming `blocks` (each record's blocks in order; block
/// data where `data`, images where `image`, main data of `main` bytes).
fn areas(records: &[(Vec<BlockKey>, bool, bool, usize)]) -> Vec<Vec<u8>> {
    let mut g = WalGen::new(MAJOR, 1 << 20, 3 << 20, 5);
    let mut area = Area::default();
    records
        .iter()
        .map(|(keys, data, image, main)| {
            let blocks: Vec<GenBlock> = keys
                .iter()
                .map(|&key| GenBlock {
                    key,
                    image: if *image {
                        Image::Evolved { compressed: false }
                    } else {
                        Image::None
                    },
                    data: if *data { vec![7; 30] } else { Vec::new() },
                })
                .collect();
            g.xid += 1;
            let rec = g.record(10, 0x00, g.xid, &blocks, &vec![1u8; *main]);
            let body = &rec[REC_HDR..];
            parse_area(
                body,
                Some(body.len()),
                MAJOR.bimg_compressed_mask(),
                &mut area,
            )
            .unwrap();
            body[..area.len].to_vec()
        })
        .collect()
}

/// Every area through both ends in order: the decoder's list follows the encoder's, each
/// area comes back byte for byte; returns the transformed bytes.
fn round_trip(areas: &[Vec<u8>]) -> Vec<u8> {
    let mask = MAJOR.bimg_compressed_mask();
    let (mut enc, mut dec) = (AreaXf::new(), AreaXf::new());
    let mut hdr = Vec::new();
    for a in areas {
        enc.forward(a, mask, &mut hdr).unwrap();
    }
    let mut r = Reader::new(&hdr, "HDR");
    for a in areas {
        let mut back = vec![0xEE];
        dec.inverse(&mut r, a.len(), mask, &mut back).unwrap();
        assert_eq!(&back[1..], &a[..]);
    }
    assert!(r.done(), "every byte read");
    hdr
}

#[test]
fn repeated_relations_take_a_byte_and_steps() {
    let recs: Vec<_> = (0..100u32)
        .map(|i| {
            let keys = vec![block_key(16_384 + i % 3, 1000 + i), block_key(16_390, 5)];
            (keys, i % 2 == 0, i % 10 == 0, 40)
        })
        .collect();
    let areas = areas(&recs);
    let hdr = round_trip(&areas);
    let raw: usize = areas.iter().map(Vec::len).sum();
    // Of the 32 bytes of two locators and two block numbers per record, about 5 remain.
    assert!(hdr.len() + 100 * 25 < raw, "{} of {raw}", hdr.len());
}

/// More relations than the list holds, in turns: the oldest are named whole again; as many as
/// it holds, in turns: named whole once each.
#[test]
fn relations_past_the_list_come_back_whole() {
    let hdr = |n: u32| {
        let recs: Vec<_> = (0..200u32)
            .map(|i| (vec![block_key(20_000 + i % n, 7)], false, false, 0))
            .collect();
        round_trip(&areas(&recs)).len()
    };
    // The same areas but for the relations' codes: 13 bytes each time against 13 for the
    // first 16 and 1 after.
    assert_eq!(hdr(40) - hdr(16), (200 - 16) * 12);
}

/// Codes the list does not hold, a SAME_REL block before any relation, block ids PostgreSQL
/// does not write and an area cut short are refused.
#[test]
fn damaged_areas_are_refused() {
    let mask = MAJOR.bimg_compressed_mask();
    let cases: [(&[u8], usize, &str); 4] = [
        (&[0, 0, 0, 0, 3, 0], 20, "a relation code past the list"),
        (&[0, BKPBLOCK_SAME_REL, 0, 0, 0], 8, "SAME_REL first"),
        (&[200], 1, "block id 200"),
        (&[0, 0, 0, 0, NEW_REL, 1, 2, 3], 20, "cut short"),
    ];
    for (bytes, len, what) in cases {
        let mut r = Reader::new(bytes, "HDR");
        let mut out = Vec::new();
        assert!(
            AreaXf::new().inverse(&mut r, len, mask, &mut out).is_err(),
            "{what}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    /// Records of any few relations, forks and blocks, with and without data and images.
    #[test]
    fn any_records_round_trip(
        recs in proptest::collection::vec(
            (
                proptest::collection::vec((0u32..24, 0u8..4, any::<u32>()), 1..5),
                any::<bool>(),
                any::<bool>(),
                0usize..300,
            ),
            1..40,
        ),
    ) {
        let recs: Vec<_> = recs
            .into_iter()
            .map(|(blocks, data, image, main)| {
                let keys = blocks
                    .into_iter()
                    .map(|(rel, fork, blkno)| BlockKey { fork, ..block_key(16_384 + rel, blkno) })
                    .collect();
                (keys, data, image, main)
            })
            .collect();
        round_trip(&areas(&recs));
    }

    /// Any bytes: an error or an area of the length asked for, never a panic.
    #[test]
    fn any_bytes_are_safe(bytes in proptest::collection::vec(any::<u8>(), 0..80), len in 0usize..100) {
        let mut r = Reader::new(&bytes, "HDR");
        let mut out = Vec::new();
        if AreaXf::new().inverse(&mut r, len, 0x1C, &mut out).is_ok() {
            prop_assert_eq!(out.len(), len);
        }
    }
}
