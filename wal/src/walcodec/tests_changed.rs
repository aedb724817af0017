//! The changed bytes of an update PostgreSQL cut against its old tuple, sent as their
//! difference from the old tuple's (format 14, [`tuples::HeapRec::changed_bytes`]), through
//! the whole codec.

use super::testgen::{block_key as key, GenBlock, GivenImage, Image, WalGen};
use super::tests::{heap_page, params};
use super::tuples::HeapRec;
use super::wal::{BlockRef, PAGE_SIZE, RM_HEAP_ID};
use super::*;
use crate::lsn::Lsn;
use crate::pg::PgMajor;

/// Tuples of 40 bytes (`tests::heap_page`): the 23-byte header, t_hoff 24, one byte of
/// bitmap, 16 of user data whose bytes 4..8 hold an int4.
const TUPLE: usize = 40;
const USER: usize = 16;

/// A tuple's user data holding `v`.
fn user(v: i32) -> [u8; USER] {
    let mut u = [0x11u8; USER];
    u[4..8].copy_from_slice(&v.to_le_bytes());
    u
}

/// Block 0's data of a HOT update PostgreSQL cut: prefix and suffix lengths, the
/// xl_heap_header (t_hoff 24), the bitmap byte, then `middle`.
fn cut_data(prefix: u16, suffix: u16, middle: &[u8]) -> Vec<u8> {
    let mut d = prefix.to_le_bytes().to_vec();
    d.extend_from_slice(&suffix.to_le_bytes());
    d.extend_from_slice(&[0x03, 0x80, 0x02, 0x28, 24, 0]);
    d.extend_from_slice(middle);
    d
}

/// xl_heap_update of a HOT update from `old` to `new` with both of PostgreSQL's cuts.
fn update_main(old: u16, new: u16) -> Vec<u8> {
    let mut m = 900u32.to_le_bytes().to_vec();
    m.extend_from_slice(&old.to_le_bytes());
    m.extend_from_slice(&[0, 0x60, 0, 0, 0, 0]);
    m.extend_from_slice(&new.to_le_bytes());
    m
}

fn hot_update(g: &mut WalGen, blkno: u32, offs: (u16, u16), data: Vec<u8>) {
    let blocks = [GenBlock {
        key: key(16800, blkno),
        image: Image::None,
        data,
    }];
    let rec = g.record(RM_HEAP_ID, 0x40, 900, &blocks, &update_main(offs.0, offs.1));
    g.write_record(&rec);
}

/// What both ends would take as the old bytes of a cut update of block 0 from `old`.
fn old_bytes_seen(
    enc: &Encoder,
    dec: &Decoder,
    old: u16,
    data: &[u8],
) -> [Option<(usize, Vec<u8>)>; 2] {
    let blocks = [BlockRef {
        id: 0,
        key: key(16800, 0),
        data_len: data.len() as u16,
        image: None,
    }];
    let main = update_main(old, 0);
    let h = HeapRec::parse(RM_HEAP_ID, 0x40, &blocks, &main).unwrap();
    let seen = |old: Option<&[u8]>| {
        let old = old?;
        h.changed_bytes(data, &blocks, old)
            .map(|(at, r)| (at, old[r].to_vec()))
    };
    [
        seen(h.cut_old(&enc.tuples, &enc.cache)),
        seen(h.cut_old(&dec.st.tuples, &dec.st.cache)),
    ]
}

/// After an image of a page with three tuples, two updates of an int4 (1000 → 1500 → 1400,
/// the second against the version the first wrote) go as differences on both ends; a middle
/// of 9 bytes, an update of a page never seen and one whose lengths do not fit the old tuple
/// go as they are; every message comes back byte for byte.
#[test]
fn a_changed_number_goes_as_its_increment() {
    let mut g = WalGen::new(PgMajor::V15, 64 << 20, 0, 5);
    let image = GivenImage {
        page: heap_page(&[user(7), user(1000), user(9)]),
        hole_offset: 36,
        hole_len: (PAGE_SIZE - 3 * TUPLE - 36) as u16,
        apply: true,
        compressed: None,
    };
    let blocks = [GenBlock {
        key: key(16800, 0),
        image: Image::Given(image),
        data: Vec::new(),
    }];
    let rec = g.record(RM_HEAP_ID, 0x40, 900, &blocks, &update_main(3, 3));
    g.write_record(&rec);
    let mut cuts = vec![g.buf.len()];
    // 1000 → 1500: bytes e8 03 → dc 05, the 2 changed bytes after a prefix of 4.
    let first = cut_data(4, 10, &1500i32.to_le_bytes()[..2]);
    hot_update(&mut g, 0, (2, 4), first.clone());
    cuts.push(g.buf.len());
    // 1500 → 1400: dc → 78, one byte, against the tuple the update before wrote at 4.
    let second = cut_data(4, 11, &1400i32.to_le_bytes()[..1]);
    hot_update(&mut g, 0, (4, 5), second.clone());
    cuts.push(g.buf.len());
    // Not transformed: 9 changed bytes, a block never seen, lengths that do not fit.
    hot_update(&mut g, 0, (1, 6), cut_data(4, 3, &[0x22; 9]));
    hot_update(&mut g, 1, (1, 2), cut_data(4, 10, &[1, 2]));
    let unfit = cut_data(4, 11, &[1, 2]);
    hot_update(&mut g, 0, (3, 7), unfit.clone());
    cuts.push(g.buf.len());

    let p = params(64);
    let (mut enc, mut dec) = (Encoder::new(&p).unwrap(), Decoder::new(&p).unwrap());
    let mut from = 0;
    for (i, &to) in cuts.iter().enumerate() {
        match i {
            1 => {
                let want = Some((first.len() - 2, 1000i32.to_le_bytes()[..2].to_vec()));
                assert_eq!(old_bytes_seen(&enc, &dec, 2, &first), [want.clone(), want]);
            }
            2 => {
                let want = Some((second.len() - 1, vec![0xdc]));
                assert_eq!(old_bytes_seen(&enc, &dec, 4, &second), [want.clone(), want]);
            }
            3 => assert_eq!(old_bytes_seen(&enc, &dec, 3, &unfit), [None, None]),
            _ => {}
        }
        let (mut pl, mut out) = (Vec::new(), Vec::new());
        let lsn = Lsn(g.start + from as u64);
        enc.encode(lsn, &g.buf[from..to], &mut pl).unwrap();
        dec.decode(lsn, &pl, to - from, &mut out).unwrap();
        assert!(out == g.buf[from..to], "message {i} restored differently");
        from = to;
    }
    assert_eq!(enc.stats().changed_diffs, 2);
}

#[test]
fn differences_wrap_in_their_width_and_come_back() {
    for (new, old) in [
        (vec![0xdcu8, 0x05], vec![0xe8u8, 0x03]),
        (vec![0x00], vec![0xff]),
        (vec![1, 2, 3, 4, 5, 6, 7, 8], vec![8, 7, 6, 5, 4, 3, 2, 1]),
        (vec![0; 3], vec![0xff; 3]),
    ] {
        let mut b = new.clone();
        tuples::changed_diff(&mut b, &old, true);
        tuples::changed_diff(&mut b, &old, false);
        assert_eq!(b, new);
    }
    // 1500 - 1000 = 500 in the two changed bytes; 1400 - 1500 = -100 in one.
    let mut b = [0xdc, 0x05];
    tuples::changed_diff(&mut b, &[0xe8, 0x03], true);
    assert_eq!(b, 500u16.to_le_bytes());
    let mut b = [0x78];
    tuples::changed_diff(&mut b, &[0xdc], true);
    assert_eq!(b, [(-100i8) as u8]);
}
