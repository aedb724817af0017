use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::walcodec::testgen::block_key;
use crate::walcodec::wal::{page_bounds, BlockRef, PAGE_HEADER};

#[derive(Default)]
struct Pages(HashMap<BlockKey, Box<PageBuf>>);

impl PageStore for Pages {
    fn page_mut(&mut self, key: &BlockKey) -> Option<&mut [u8; PAGE_SIZE]> {
        self.0.get_mut(key).map(|p| &mut **p)
    }
}

fn key(blkno: u32) -> BlockKey {
    block_key(16384, blkno)
}

/// A record of `rmid`/`info` by `xid` with blocks (id, block number, data) and main data.
fn record(
    rmid: u8,
    info: u8,
    xid: u32,
    blocks: &[(u8, u32, Vec<u8>)],
    main: &[u8],
) -> (Vec<u8>, Area) {
    let mut bytes = vec![0u8; REC_HDR];
    bytes[4..8].copy_from_slice(&xid.to_le_bytes());
    bytes[16] = info;
    bytes[17] = rmid;
    let mut area = Area {
        len: 0,
        blocks: Vec::new(),
        main_len: main.len() as u32,
        data_total: 0,
    };
    for (id, blkno, data) in blocks {
        area.blocks.push(BlockRef {
            id: *id,
            key: key(*blkno),
            data_len: data.len() as u16,
            image: None,
        });
        bytes.extend_from_slice(data);
    }
    bytes.extend_from_slice(main);
    (bytes, area)
}

fn apply(
    pages: &mut Pages,
    rmid: u8,
    info: u8,
    xid: u32,
    blocks: &[(u8, u32, Vec<u8>)],
    main: &[u8],
) {
    let (bytes, area) = record(rmid, info, xid, blocks, main);
    let rec = Record {
        bytes: &bytes,
        area: &area,
        end_lsn: 0x1_0000_2000,
    };
    Redo::new(Some(PgMajor::V16)).apply(&rec, pages);
}

fn empty_page() -> Box<PageBuf> {
    let mut p = Box::new([0u8; PAGE_SIZE]);
    init(&mut p);
    p
}

/// xl_heap_header (infomask2 = 2 attributes, infomask = HEAP_XMAX_INVALID, t_hoff 24) and a
/// one-byte bitmap-free tuple body.
fn heap_data(body: &[u8]) -> Vec<u8> {
    let mut d = vec![0x02, 0x00, 0x00, 0x08, 24, 0];
    d.extend_from_slice(body);
    d
}

#[test]
fn insert_then_hot_update_then_prune() {
    let mut pages = Pages::default();
    pages.0.insert(key(7), empty_page());
    // INSERT at offset 1 by xid 100.
    apply(
        &mut pages,
        RM_HEAP_ID,
        0x00,
        100,
        &[(0, 7, heap_data(b"first row"))],
        &[1, 0, 0],
    );
    let p = &pages.0[&key(7)];
    let (at, flags, len) = lp(p, 1).unwrap();
    assert_eq!((flags, len), (LP_NORMAL, TUPLE_HEADER + 1 + 9));
    assert_eq!(at, PAGE_SIZE - 40);
    assert_eq!(u32_at(p, at), 100, "xmin");
    assert_eq!(&p[at + 12..at + 18], &[0, 0, 7, 0, 1, 0], "t_ctid = itself");
    assert_eq!(&p[at + 24..at + 33], b"first row");
    assert_eq!((u32_at(p, 0), u32_at(p, 4)), (1, 0x2000), "pd_lsn");

    // HOT_UPDATE (1 -> 2) by xid 101, sharing the prefix "first " with the old version.
    let mut upd = vec![6, 0];
    upd.extend_from_slice(&heap_data(b"tuple"));
    let mut main = 101u32.to_le_bytes().to_vec();
    main.extend_from_slice(&[1, 0, 0, 0x20]);
    main.extend_from_slice(&[0, 0, 0, 0, 2, 0]);
    apply(&mut pages, RM_HEAP_ID, 0x40, 101, &[(0, 7, upd)], &main);
    let p = &pages.0[&key(7)];
    let old = lp(p, 1).unwrap().0;
    assert_eq!(u32_at(p, old + 4), 101, "old xmax");
    assert_eq!(
        &p[old + 12..old + 18],
        &[0, 0, 7, 0, 2, 0],
        "old t_ctid -> new"
    );
    assert_ne!(u16_at(p, old + 18) & HEAP_HOT_UPDATED, 0);
    let new = tuple_range(p, 2).unwrap();
    assert_eq!(&p[new.start + 24..new.end], b"first tuple");
    assert_eq!(u32_at(p, 20), 101, "pd_prune_xid");

    // PRUNE (14-16 layout): 1 redirected to 2; the old tuple's space is given back.
    let mut main = 0u32.to_le_bytes().to_vec();
    main.extend_from_slice(&[1, 0, 0, 0, 0]);
    apply(
        &mut pages,
        RM_HEAP2_ID,
        0x10,
        0,
        &[(0, 7, vec![1, 0, 2, 0])],
        &main,
    );
    let p = &pages.0[&key(7)];
    assert_eq!(lp(p, 1), Some((2, LP_REDIRECT, 0)));
    let (at, _, len) = lp(p, 2).unwrap();
    assert_eq!(
        at,
        PAGE_SIZE - len.next_multiple_of(8),
        "compacted to the end"
    );
    assert_eq!(&p[at + 24..at + len], b"first tuple");
    assert_eq!(usize::from(u16_at(p, 14)), at, "pd_upper");
}

#[test]
fn delete_and_pages_not_cached_or_with_images() {
    let mut pages = Pages::default();
    pages.0.insert(key(1), empty_page());
    apply(
        &mut pages,
        RM_HEAP_ID,
        0x00,
        50,
        &[(0, 1, heap_data(b"x"))],
        &[1, 0, 0],
    );
    // DELETE of (1, 1) by 60.
    let mut main = 60u32.to_le_bytes().to_vec();
    main.extend_from_slice(&[1, 0, 0, 0]);
    apply(&mut pages, RM_HEAP_ID, 0x10, 60, &[(0, 1, vec![])], &main);
    let p = &pages.0[&key(1)];
    let at = lp(p, 1).unwrap().0;
    assert_eq!(u32_at(p, at + 4), 60);
    assert_eq!(u16_at(p, at + 20) & 0x0800, 0, "HEAP_XMAX_INVALID cleared");
    // A block not cached: nothing happens (and nothing is added).
    apply(
        &mut pages,
        RM_HEAP_ID,
        0x00,
        70,
        &[(0, 2, heap_data(b"y"))],
        &[1, 0, 0],
    );
    assert_eq!(pages.0.len(), 1);
}

#[test]
fn insert_refuses_a_used_slot_and_a_full_page() {
    let mut p = empty_page();
    assert!(add_item(&mut p, &[1; 40], 1));
    assert!(!add_item(&mut p, &[2; 40], 1), "slot 1 is used");
    assert!(!add_item(&mut p, &[2; 40], 3), "beyond the next slot");
    assert!(!add_item(&mut p, &[3; 8200], 2), "does not fit");
    assert_eq!(max_offset(&p), Some(1));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]
    /// Any page and any record bytes: no panic, and the page stays 8 KiB.
    #[test]
    fn garbage_never_panics(
        page in proptest::collection::vec(any::<u8>(), PAGE_SIZE),
        rmid in prop_oneof![Just(RM_HEAP_ID), Just(RM_HEAP2_ID)],
        info in any::<u8>(),
        data in proptest::collection::vec(any::<u8>(), 0..64),
        main in proptest::collection::vec(any::<u8>(), 0..20),
        lower in 24u16..400,
        major in 0usize..5,
    ) {
        let mut p: Box<PageBuf> = page.try_into().unwrap();
        p[12..14].copy_from_slice(&(lower & !3).to_le_bytes());
        let mut pages = Pages::default();
        pages.0.insert(key(3), p);
        let (bytes, area) = record(rmid, info, 77, &[(0, 3, data.clone()), (1, 3, data)], &main);
        let rec = Record { bytes: &bytes, area: &area, end_lsn: 8 };
        Redo::new(Some(PgMajor::ALL[major])).apply(&rec, &mut pages);
    }
}

/// End to end: an image of a heap page, thirty inserts into it, and its next image as
/// PostgreSQL would write it (with one more tuple, the one its own record inserted): both
/// ends replay the inserts onto the cached page, so the second image costs little more than
/// that tuple (65 bytes; without the replay 344: the line pointers and a match per tuple),
/// and every cut restores exactly.
#[test]
fn replayed_inserts_make_the_next_image_nearly_free() {
    use crate::lsn::Lsn;
    use crate::walcodec::testgen::{GenBlock, GivenImage, Image, WalGen};
    use crate::walcodec::{CodecParams, Decoder, Encoder};

    let body = |i: u16| -> Vec<u8> { (0..40).map(|k| (i as u8).wrapping_mul(7) ^ k).collect() };
    let hdr = [0x03u8, 0x00, 0x00, 0x08, 24, 0];
    let tuple = |xid: u32, off: u16| -> Vec<u8> {
        let mut t = xid.to_le_bytes().to_vec();
        t.extend_from_slice(&[0; 8]);
        t.extend_from_slice(&[0, 0, 9, 0]);
        t.extend_from_slice(&off.to_le_bytes());
        t.extend_from_slice(&hdr);
        t.extend_from_slice(&body(off));
        t
    };
    let image = |p: &PageBuf| {
        let (lower, upper) = (u16_at(p, 12), u16_at(p, 14));
        Image::Given(GivenImage {
            page: Box::new(*p),
            hole_offset: lower,
            hole_len: upper - lower,
            apply: true,
            compressed: None,
        })
    };
    let mut page = empty_page();
    for off in 1..=5 {
        assert!(add_item(&mut page, &tuple(900, off), usize::from(off)));
    }
    let mut g = WalGen::new(PgMajor::V15, 1 << 20, 3 << 20, 1);
    let insert = |g: &mut WalGen, xid: u32, off: u16, image: Image, data: Vec<u8>| {
        let blocks = [GenBlock {
            key: key(9),
            image,
            data,
        }];
        let rec = g.record(RM_HEAP_ID, 0x00, xid, &blocks, &[off as u8, 0, 0]);
        g.write_record(&rec);
    };
    // The first image (with the insert of tuple 5, whose data PostgreSQL leaves out).
    insert(&mut g, 900, 5, image(&page), Vec::new());
    for off in 6..=35u16 {
        let xid = 1000 + u32::from(off);
        assert!(add_item(&mut page, &tuple(xid, off), usize::from(off)));
        let mut data = hdr.to_vec();
        data.extend_from_slice(&body(off));
        insert(&mut g, xid, off, Image::None, data);
    }
    assert!(add_item(&mut page, &tuple(2000, 36), 36));
    insert(&mut g, 2000, 36, image(&page), Vec::new());

    let p = CodecParams {
        pg_major: Some(PgMajor::V15),
        block_cache_bytes: 64 << 20,
        zstd_level: 3,
        max_message_bytes: 4 << 20,
    };
    for cut in [g.buf.len(), 4096, 777] {
        let (mut enc, mut dec) = (Encoder::new(&p).unwrap(), Decoder::new(&p).unwrap());
        let (mut pl, mut out) = (Vec::new(), Vec::new());
        for (i, msg) in g.buf.chunks(cut).enumerate() {
            let lsn = Lsn(g.start + (i * cut) as u64);
            enc.encode(lsn, msg, &mut pl).unwrap();
            dec.decode(lsn, &pl, msg.len(), &mut out).unwrap();
            assert!(out == msg);
        }
        if cut == g.buf.len() {
            let st = enc.stats();
            assert_eq!(st.image_ops[2], 1, "{st:?}");
            assert!(st.fpi_hit_out < 100, "a hit of {} bytes", st.fpi_hit_out);
        }
    }
}

/// PageRepairFragmentation as PostgreSQL 14+ does it, spelled out: every item with storage,
/// in line pointer order, copied from the original page to the next place down from
/// pd_special, with its padding up to the next MAXALIGN (compactify_tuples copies
/// `alignedlen`).
fn reference_repair(p: &PageBuf) -> Box<PageBuf> {
    let mut out = Box::new(*p);
    let (lower, _, special) = page_bounds(p).unwrap();
    let mut top = special;
    for off in 1..=(lower - PAGE_HEADER) / 4 {
        let (at, flags, len) = lp(p, off).unwrap();
        if flags == LP_UNUSED {
            set_lp(&mut out, off, 0, LP_UNUSED, 0);
        } else if len > 0 {
            let aligned = len.next_multiple_of(8);
            top -= aligned;
            let copied = (at + aligned).min(PAGE_SIZE) - at;
            out[top..top + copied].copy_from_slice(&p[at..at + copied]);
            set_lp(&mut out, off, top, flags, len);
        }
    }
    set_u16(&mut out, 14, top as u16);
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]
    /// Pages laid out in line pointer order (compacted in place, in runs) and shuffled ones
    /// (through scratch, item by item) come out as the plain algorithm makes them, every
    /// byte between pd_upper and pd_special included.
    #[test]
    fn compaction_matches_postgres(lens in proptest::collection::vec(24usize..200, 1..60),
                                   kill in proptest::collection::vec(0u8..4, 60), shuffle in any::<bool>(),
                                   swaps in proptest::collection::vec((1usize..60, 1usize..60), 0..4)) {
        let mut p = empty_page();
        for (i, &len) in lens.iter().enumerate() {
            let item: Vec<u8> = (0..len).map(|k| (i * 31 + k) as u8).collect();
            if !add_item(&mut p, &item, i + 1) {
                break;
            }
        }
        let n = max_offset(&p).unwrap();
        if shuffle && n > 2 {
            // Swap the first and last items' line pointers (and so their order on the page).
            let (a, b) = (lp(&p, 1).unwrap(), lp(&p, n).unwrap());
            set_lp(&mut p, 1, b.0, b.1, b.2);
            set_lp(&mut p, n, a.0, a.1, a.2);
            // And a few more pairs, so that runs in order lie between items out of it.
            for (x, y) in swaps.into_iter().filter(|&(x, y)| x <= n && y <= n) {
                let (a, b) = (lp(&p, x).unwrap(), lp(&p, y).unwrap());
                set_lp(&mut p, x, b.0, b.1, b.2);
                set_lp(&mut p, y, a.0, a.1, a.2);
            }
        }
        for off in 1..=n {
            match kill[off - 1] {
                1 => set_lp(&mut p, off, 0, LP_DEAD, 0),
                2 => set_lp(&mut p, off, 0, LP_UNUSED, 0),
                3 if off < n => set_lp(&mut p, off, off + 1, LP_REDIRECT, 0),
                _ => {}
            }
        }
        let want = reference_repair(&p);
        let mut scratch = Box::new([0u8; PAGE_SIZE]);
        repair_fragmentation(&mut p, false, &mut scratch);
        let upper = usize::from(u16_at(&p, 14));
        // (pd_flags aside: the reference leaves PD_HAS_FREE_LINES alone.)
        prop_assert_eq!(&p[12..PAGE_HEADER + 4 * n], &want[12..PAGE_HEADER + 4 * n]);
        prop_assert_eq!(upper, usize::from(u16_at(&want, 14)));
        prop_assert_eq!(&p[upper..], &want[upper..]);
    }
}

/// PageAddItem's choice without an offset (bufpage.c): the first unused line pointer without
/// storage while PD_HAS_FREE_LINES says there is one, else the one after the last; nothing
/// past MaxHeapTuplesPerPage or on a page whose bounds are off.
#[test]
fn the_next_item_offset_is_the_one_page_add_item_takes() {
    let mut p = empty_page();
    assert_eq!(next_item_offset(&p), Some(1));
    for off in 1..=4 {
        assert!(add_item(&mut p, &[off as u8; 30], off));
    }
    assert_eq!(next_item_offset(&p), Some(5));
    // Unused line pointers count only with the flag, and only without storage.
    set_lp(&mut p, 2, 0, LP_UNUSED, 0);
    set_lp(&mut p, 3, 0, LP_UNUSED, 0);
    assert_eq!(next_item_offset(&p), Some(5));
    set_flag(&mut p, PD_HAS_FREE_LINES, true);
    assert_eq!(next_item_offset(&p), Some(2));
    set_lp(&mut p, 2, 100, LP_UNUSED, 8);
    assert_eq!(next_item_offset(&p), Some(3));
    // A full line pointer array, and garbage.
    let mut full = empty_page();
    set_u16(&mut full, 12, (PAGE_HEADER + 4 * MAX_HEAP_TUPLES) as u16);
    assert_eq!(next_item_offset(&full), None);
    assert_eq!(next_item_offset(&[0xff; PAGE_SIZE]), None);
}
