//! Streamed pages of long items (format 9, `format::page_stream`): they go through LONG (DATA
//! before format 11), whose long window still holds the tuples records carried into them (TOAST chunks, wide
//! rows), so such a page costs little more than its layout; on every image path, also when
//! the primary compressed the image and the receiver's compression does not reproduce it.

use super::format::{data_stream, page_stream, IMG_STREAM, IMG_STREAM_NOCACHE};
use super::fpi::{compress_like_pg, Method};
use super::testgen::{Entropy, Image, Rng, WalGen};
use super::tests::{every, insert_row, round_trip, round_trip_checks};
use super::tests_fpi::{given_block, params};
use super::wal::{ImageRef, PAGE_HEADER, PAGE_SIZE, RM_XLOG_ID, XLOG_FPI};
use super::*;
use crate::pg::PgMajor;

const SEG: u64 = 1 << 20;

fn image(len: usize, hole_offset: usize, hole_len: usize, compressed: bool) -> ImageRef {
    ImageRef {
        len: len as u16,
        hole_offset: hole_offset as u16,
        hole_len: hole_len as u16,
        compressed,
        info: 0,
    }
}

/// The image of an uncompressed page whose line pointers end at `lower` and items start
/// at `upper`.
fn plain(lower: usize, upper: usize) -> ImageRef {
    image(PAGE_SIZE - (upper - lower), lower, upper - lower, false)
}

#[test]
fn the_stream_of_a_page_follows_its_hole() {
    // Four TOAST chunks of about 2 kB.
    assert_eq!(page_stream(&plain(40, PAGE_SIZE - 4 * 2032)), S_LONG);
    // Exactly 1 KiB per line pointer, and a byte less.
    assert_eq!(page_stream(&plain(32, PAGE_SIZE - 2 * 1024)), S_LONG);
    assert_eq!(page_stream(&plain(32, PAGE_SIZE - 2 * 1024 + 1)), S_PAGE);
    // pgbench's rows: 60 items of 120 bytes.
    assert_eq!(
        page_stream(&plain(24 + 4 * 60, PAGE_SIZE - 60 * 120)),
        S_PAGE
    );
    // No hole (a full page, or no standard layout): the line pointers are unknown.
    assert_eq!(page_stream(&image(PAGE_SIZE, 0, 0, false)), S_PAGE);
    // A compressed image: at least 2 KiB of WAL for a page in LONG (its cap).
    let hole = PAGE_SIZE - 28 - 3000;
    assert_eq!(page_stream(&image(2047, 28, hole, true)), S_PAGE);
    assert_eq!(page_stream(&image(2048, 28, hole, true)), S_LONG);
    // Holes that no page has: past its end, or starting inside the page header.
    assert_eq!(page_stream(&image(4000, 8000, 4000, true)), S_PAGE);
    assert_eq!(
        page_stream(&image(8092, PAGE_HEADER - 4, 100, false)),
        S_PAGE
    );
}

/// A block's data goes through LONG from 256 bytes on, unless a multi-insert's, else through
/// DATA (format 11, `format::data_stream`); both ends route alike at any message cut.
#[test]
fn block_data_goes_through_long_from_256_bytes() {
    use super::wal::{RM_HEAP2_ID as HEAP2, RM_HEAP_ID as HEAP};
    assert_eq!(data_stream(HEAP, 0x00, 255), S_DATA);
    assert_eq!(data_stream(HEAP, 0x00, 256), S_LONG);
    // An update with the init-page bit, an index page split.
    assert_eq!(data_stream(HEAP, 0x20 | 0x80, 3000), S_LONG);
    assert_eq!(data_stream(11, 0x30, 4000), S_LONG);
    // Multi-inserts (also with the init-page bit), and heap2's other records.
    assert_eq!(data_stream(HEAP2, 0x50, 8000), S_DATA);
    assert_eq!(data_stream(HEAP2, 0x50 | 0x80, 8000), S_DATA);
    assert_eq!(data_stream(HEAP2, 0x10, 8000), S_LONG);

    let mut g = WalGen::new(PgMajor::V15, SEG, 0, 7);
    let (mut short, mut long) = (0, 0);
    for blkno in 0..300u32 {
        let n = if blkno % 3 == 0 {
            1500
        } else {
            150 + blkno as usize % 100
        };
        let body = g.rng.bytes(n);
        insert_row(&mut g, REL, blkno, &body);
        // The record's data: the body after a 5-byte tuple header (`insert_row`).
        *(if n + 5 >= 256 { &mut long } else { &mut short }) += n + 5;
    }
    g.switch();
    for cut in [0, 20_000, 50_000] {
        let cuts = if cut == 0 {
            Vec::new()
        } else {
            every(cut, g.buf.len())
        };
        let (st, _) = round_trip(&params(PgMajor::V15, SLOTS), g.start, &g.buf, &cuts);
        let what = format!("cut {cut}: {st:?}");
        // (A record cut by a message boundary goes through RAW.)
        assert!(st.section_in[S_LONG] <= long as u64, "{what}");
        assert!(st.section_in[S_LONG] >= long as u64 * 8 / 10, "{what}");
        assert!(st.section_in[S_DATA] <= short as u64, "{what}");
        assert!(st.section_in[S_DATA] >= short as u64 * 8 / 10, "{what}");
    }
}

/// A heap page holding `items` (line pointers in order, items from the page's end down)
/// and its hole (offset, length).
fn page_of(items: &[Vec<u8>]) -> (Box<[u8; PAGE_SIZE]>, (u16, u16)) {
    let mut p = Box::new([0u8; PAGE_SIZE]);
    let mut off = PAGE_SIZE;
    for (i, it) in items.iter().enumerate() {
        off -= it.len().next_multiple_of(8);
        let lp = off as u32 | 1 << 15 | (it.len() as u32) << 17;
        let at = PAGE_HEADER + 4 * i;
        p[at..at + 4].copy_from_slice(&lp.to_le_bytes());
        p[off..off + it.len()].copy_from_slice(it);
    }
    let lower = PAGE_HEADER + 4 * items.len();
    p[12..14].copy_from_slice(&(lower as u16).to_le_bytes());
    p[14..16].copy_from_slice(&(off as u16).to_le_bytes());
    p[16..18].copy_from_slice(&(PAGE_SIZE as u16).to_le_bytes());
    (p, (lower as u16, (off - lower) as u16))
}

const REL: u32 = 99_020;
/// A block cache of 64 MiB, whose LONG keeps 8 MiB of history (`streams::history_log`):
/// more than PAGE's 4 MiB, so with long-distance matching, as the default's 128 MiB.
const SLOTS: usize = 8192;

/// How a test primary writes a page's image.
#[derive(Clone, Copy, Debug)]
enum Imaged {
    /// By an index build or a rewrite (XLOG_FPI): STREAM_NOCACHE.
    Whole,
    /// By a heap record (a first change after a checkpoint): STREAM.
    Record,
    /// By a heap record, compressed with lz4 as PostgreSQL does.
    Lz4,
    /// By a heap record, compressed with zstd at level 19, not PostgreSQL's: recompression
    /// does not reproduce it.
    ForeignZstd,
}

/// A random item of 1,990 bytes; for images the primary compresses, each 10-byte piece
/// twice (lz4 finds no match in random bytes, and PostgreSQL would store the image as it is).
fn item(rng: &mut Rng, imaged: Imaged) -> Vec<u8> {
    let twice = matches!(imaged, Imaged::Lz4 | Imaged::ForeignZstd);
    let mut it = Vec::with_capacity(1990);
    while it.len() < 1990 {
        let piece: Vec<u8> = (0..10).map(|_| rng.below(256) as u8).collect();
        it.extend_from_slice(&piece);
        if twice {
            it.extend_from_slice(&piece);
        }
    }
    it.truncate(1990);
    it
}

/// WAL of `pages` pages of four 1,990-byte items each ([`item`]): first every item in a
/// record of its own (btree: no tuple cache), then an image of each page; and the items'
/// bytes.
fn long_items(major: PgMajor, pages: u32, imaged: Imaged) -> (WalGen, usize) {
    let mut g = WalGen::new(major, SEG, 3 * SEG, 31);
    let mut rng = Rng::new(5);
    let all: Vec<Vec<Vec<u8>>> = (0..pages)
        .map(|_| (0..4).map(|_| item(&mut rng, imaged)).collect())
        .collect();
    for (blkno, items) in (0u32..).zip(&all) {
        for it in items {
            let mut b = given_block(REL, blkno, Box::new([0; PAGE_SIZE]), (0, 0), None);
            (b.image, b.data) = (Image::None, it.clone());
            g.xid += 1;
            let rec = g.record(11, 0x00, g.xid, &[b], b"");
            g.write_record(&rec);
        }
    }
    for (blkno, items) in (0u32..).zip(&all) {
        let (page, hole) = page_of(items);
        let content = [
            &page[..usize::from(hole.0)],
            &page[usize::from(hole.0 + hole.1)..],
        ];
        let compressed = match imaged {
            Imaged::Whole | Imaged::Record => None,
            Imaged::Lz4 => compress_like_pg(Method::Lz4, &content.concat()),
            Imaged::ForeignZstd => zstd::bulk::compress(&content.concat(), 19).ok(),
        };
        let flag = match imaged {
            Imaged::ForeignZstd => major.bimg_zstd(),
            _ => major.bimg_lz4(),
        };
        let compressed = compressed.map(|c| (c, flag.unwrap()));
        let b = given_block(REL, blkno, page, hole, compressed);
        let (rmid, info) = match imaged {
            Imaged::Whole => (RM_XLOG_ID, XLOG_FPI),
            _ => (10, 0x00),
        };
        g.xid += 1;
        let rec = g.record(rmid, info, g.xid, &[b], b"");
        g.write_record(&rec);
    }
    g.switch();
    (g, pages as usize * 4 * 1990)
}

/// Each page goes whole through LONG and costs a small part of its items, which records
/// sent before (PAGE's window, which never saw them, would cost them again), whether it
/// stays out of the cache, enters it, or was compressed by the primary; in one message and
/// in many.
#[test]
fn pages_of_long_items_go_through_long_and_match_their_tuples() {
    let major = PgMajor::V16;
    for imaged in [Imaged::Whole, Imaged::Record, Imaged::Lz4] {
        let (g, items) = long_items(major, 30, imaged);
        for cut in [0, 64 * 1024] {
            let cuts = if cut == 0 {
                Vec::new()
            } else {
                every(cut, g.buf.len())
            };
            let (st, total) = round_trip(&params(major, SLOTS), g.start, &g.buf, &cuts);
            let what = format!("{imaged:?}, cut {cut}: {total} B for {items} B of items: {st:?}");
            let streamed = st.image_ops[usize::from(IMG_STREAM)]
                + st.image_ops[usize::from(IMG_STREAM_NOCACHE)];
            // (Records cut by a message boundary go as they are.)
            assert_eq!(streamed, st.fpis, "{what}");
            assert!(st.fpis >= 24, "{what}");
            assert_eq!(st.section_in[S_PAGE], 0, "{what}");
            assert!(st.section_in[S_LONG] >= 30 * PAGE_SIZE as u64, "{what}");
            if let Imaged::Lz4 = imaged {
                assert_eq!(st.fpi_recompressed, st.fpis, "{what}");
            } else {
                // The items are random: sent once they cost their size; the pages add little.
                assert!(total < items + items / 4, "{what}");
            }
        }
    }
}

/// With the checks on a worker, an image that recompression does not reproduce has its
/// page taken out of LONG again at the message's end (`encoder/verify.rs`), and the
/// decoder reads the primary's bytes: the stream round-trips at any message size.
#[test]
fn pages_of_long_items_leave_long_when_their_check_fails() {
    let major = PgMajor::V16;
    let (g, items) = long_items(major, 12, Imaged::ForeignZstd);
    for cut in [0, 16 * 1024, 100_000] {
        let cuts = if cut == 0 {
            Vec::new()
        } else {
            every(cut, g.buf.len())
        };
        let (st, _) = round_trip_checks(&params(major, SLOTS), g.start, &g.buf, &cuts, true);
        let what = format!("cut {cut}: {st:?}");
        // (Records cut by a message boundary go as they are.)
        assert!(st.fpis >= 6, "{what}");
        assert!(st.fpi_primary_bytes > 0, "{what}");
        // The pages that went as the primary's bytes left LONG: it holds the items alone.
        let left = st.fpis - st.fpi_primary_bytes;
        assert!(
            st.section_in[S_LONG] <= (items + left as usize * PAGE_SIZE) as u64,
            "{what}"
        );
        assert_eq!(
            st.fpi_primary_bytes + st.fpi_opaque,
            st.fpi_recompress_mismatch,
            "{what}"
        );
    }
}
