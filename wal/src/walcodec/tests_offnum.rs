//! A heap record's new offset as both ends predict it from the cached page (format 13,
//! [`mainxf::predicted_offnum`]), through the whole codec.

use super::mainxf::predicted_offnum;
use super::testgen::{block_key as key, GenBlock, GivenImage, Image, WalGen};
use super::tests::{heap_page, params};
use super::wal::{BlockRef, RM_HEAP_ID};
use super::*;
use crate::lsn::Lsn;
use crate::pg::PgMajor;

/// A heap INSERT into block `blkno` of relation 16700 at `off` (17 bytes of tuple after the
/// header), with `image` of block 0.
fn insert(g: &mut WalGen, blkno: u32, off: u16, image: Image) {
    let mut data = vec![0x02, 0x00, 0x02, 0x08, 24];
    data.extend_from_slice(&[7; 17]);
    let blocks = [GenBlock {
        key: key(16700, blkno),
        image,
        data,
    }];
    let mut main = off.to_le_bytes().to_vec();
    main.push(0);
    let rec = g.record(RM_HEAP_ID, 0x00, 900, &blocks, &main);
    g.write_record(&rec);
}

fn block0(blkno: u32) -> [BlockRef; 1] {
    [BlockRef {
        id: 0,
        key: key(16700, blkno),
        data_len: 22,
        image: None,
    }]
}

/// After an image of a page with three tuples, both ends predict 4, then each next offset as
/// the inserts replayed onto the cached page put them there; an insert at an offset the page
/// does not predict, a page never imaged and an initialised page come back byte for byte.
#[test]
fn both_ends_predict_the_offset_the_page_gives() {
    let mut g = WalGen::new(PgMajor::V15, 64 << 20, 0, 5);
    let page = heap_page(&[[0; 16]; 3]);
    let image = GivenImage {
        page: page.clone(),
        hole_offset: 36,
        hole_len: (wal::PAGE_SIZE - 3 * 40 - 36) as u16,
        apply: true,
        compressed: None,
    };
    insert(&mut g, 0, 3, Image::Given(image));
    let mut cuts = vec![g.buf.len()];
    for off in 4..=6 {
        insert(&mut g, 0, off, Image::None);
        cuts.push(g.buf.len());
    }
    // Not what the page predicts (7), an uncached block, a page the record initialises.
    insert(&mut g, 0, 9, Image::None);
    insert(&mut g, 1, 2, Image::None);
    let mut data = vec![0x02, 0x00, 0x02, 0x08, 24];
    data.extend_from_slice(&[8; 17]);
    let blocks = [GenBlock {
        key: key(16700, 2),
        image: Image::None,
        data,
    }];
    let rec = g.record(RM_HEAP_ID, 0x80, 900, &blocks, &[1, 0, 0]);
    g.write_record(&rec);
    cuts.push(g.buf.len());

    let p = params(64);
    let (mut enc, mut dec) = (Encoder::new(&p).unwrap(), Decoder::new(&p).unwrap());
    let mut from = 0;
    for (i, &to) in cuts.iter().enumerate() {
        let (mut pl, mut out) = (Vec::new(), Vec::new());
        let lsn = Lsn(g.start + from as u64);
        enc.encode(lsn, &g.buf[from..to], &mut pl).unwrap();
        dec.decode(lsn, &pl, to - from, &mut out).unwrap();
        assert!(out == g.buf[from..to], "message {i} restored differently");
        if let Some(want) = [4u16, 5, 6, 7].get(i) {
            assert_eq!(
                predicted_offnum(RM_HEAP_ID, 0, &block0(0), &enc.cache),
                *want
            );
            assert_eq!(
                predicted_offnum(RM_HEAP_ID, 0, &block0(0), &dec.st.cache),
                *want
            );
        }
        from = to;
    }
    assert_eq!(predicted_offnum(RM_HEAP_ID, 0, &block0(1), &enc.cache), 0);
    assert_eq!(
        predicted_offnum(RM_HEAP_ID, 0x80, &block0(1), &enc.cache),
        1
    );
    // (The insert at 9 was refused by the replay, as PageAddItem refuses an offset past the
    // line pointers plus one: the page still gives 7.) HOT_UPDATE predicts too, DELETE and
    // records with an image do not.
    assert_eq!(
        predicted_offnum(RM_HEAP_ID, 0x40, &block0(0), &enc.cache),
        7
    );
    assert_eq!(
        predicted_offnum(RM_HEAP_ID, 0x10, &block0(0), &enc.cache),
        0
    );
    let mut imaged = block0(0);
    imaged[0].image = Some(wal::ImageRef {
        len: 100,
        hole_offset: 0,
        hole_len: 8092,
        compressed: false,
        info: 0,
    });
    assert_eq!(predicted_offnum(RM_HEAP_ID, 0, &imaged, &enc.cache), 0);
}
