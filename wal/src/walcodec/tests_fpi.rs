//! Images the primary compressed: synthetic WAL whose compressed images are made with each
//! method as PostgreSQL calls it (they go the recompress path) or with other settings (they
//! must fall back to the original bytes), round-tripped at any chunking and cache size. Real
//! WAL of every major and method is in `tests/codec_majors.rs`.

use proptest::prelude::*;

use super::cache::SLOT_BYTES;
use super::encoder::MIN_STREAM_IMAGE;
use super::format::{IMG_IDENT, IMG_NEW, IMG_REF, IMG_SAME, IMG_STREAM};
use super::fpi::{compress_like_pg, lz4_compress_fast, Method};
use super::pglz::{Pglz, STRATEGY_ALWAYS};
use super::testgen::{Compressor, Entropy, GenBlock, GivenImage, Image, WalGen};
use super::tests::{chunks_from, every, round_trip, round_trip_checks};
use super::wal::{BlockKey, PAGE_SIZE, RM_XLOG_ID, XLOG_FPI, XLOG_FPI_FOR_HINT};
use super::*;
use crate::pg::PgMajor;

const SEG: u64 = 1 << 20;

/// Block `blkno` of relation `rel` (tablespace 1663, database 5, main fork) with `page` as
/// its image, `hole` (offset, length) left out, as the primary compressed it if `compressed`.
pub(super) fn given_block(
    rel: u32,
    blkno: u32,
    page: Box<[u8; PAGE_SIZE]>,
    hole: (u16, u16),
    compressed: Option<(Vec<u8>, u8)>,
) -> GenBlock {
    GenBlock {
        key: BlockKey {
            spc: 1663,
            db: 5,
            rel,
            fork: 0,
            blkno,
        },
        image: Image::Given(GivenImage {
            page,
            hole_offset: hole.0,
            hole_len: hole.1,
            apply: false,
            compressed,
        }),
        data: Vec::new(),
    }
}

pub(super) fn params(major: PgMajor, cache_slots: usize) -> CodecParams {
    CodecParams {
        pg_major: Some(major),
        block_cache_bytes: cache_slots * SLOT_BYTES,
        zstd_level: 3,
        max_message_bytes: 4 << 20,
    }
}

/// The bimg_info flag of a method in a major's layout.
fn flag(major: PgMajor, m: Method) -> u8 {
    let f = match m {
        Method::Pglz => Some(major.bimg_pglz()),
        Method::Lz4 => major.bimg_lz4(),
        Method::Zstd => major.bimg_zstd(),
    };
    f.unwrap_or_else(|| panic!("PostgreSQL {major} has no {m:?} images"))
}

fn methods(major: PgMajor) -> &'static [Method] {
    if major == PgMajor::V14 {
        &[Method::Pglz]
    } else {
        &[Method::Pglz, Method::Lz4, Method::Zstd]
    }
}

/// How the test primary compresses its images.
#[derive(Clone, Copy, Debug)]
enum Style {
    /// As PostgreSQL: recompression reproduces them.
    Pg,
    /// Valid data of the method made with other settings (lz4 acceleration 50, zstd level
    /// 19, pglz's "always" strategy): recompression does not reproduce them.
    Foreign,
    /// By the page's contents: as PostgreSQL, foreign, or bytes that do not decompress.
    Mixed,
}

fn compressor(major: PgMajor, m: Method, style: Style) -> Compressor {
    let f = flag(major, m);
    Box::new(move |src: &[u8]| {
        let style = match style {
            Style::Mixed => match src.iter().map(|&b| u32::from(b)).sum::<u32>() % 3 {
                0 => Style::Pg,
                1 => Style::Foreign,
                _ => {
                    let junk: Vec<u8> = src.iter().rev().take(200).map(|b| b ^ 0x5a).collect();
                    return (junk.len() + 2 < src.len()).then_some((junk, f));
                }
            },
            s => s,
        };
        let bytes = match (style, m) {
            (Style::Pg | Style::Mixed, _) => compress_like_pg(m, src)?,
            (Style::Foreign, Method::Lz4) => {
                let mut out = Vec::new();
                lz4_compress_fast(src, &mut out, 50)?;
                out
            }
            (Style::Foreign, Method::Zstd) => zstd::bulk::compress(src, 19).ok()?,
            (Style::Foreign, Method::Pglz) => {
                let mut out = Vec::new();
                Pglz::new().compress(src, &STRATEGY_ALWAYS, &mut out)?;
                out
            }
        };
        // XLogCompressBackupBlock keeps the result only if it saves more than the 2 bytes of
        // the hole length.
        (bytes.len() + 2 < src.len()).then_some((bytes, f))
    })
}

/// Synthetic WAL of `major` in which a third of the records carry compressed full-page
/// images of a working set of `blocks` blocks.
fn stream(major: PgMajor, c: Option<Compressor>, seed: u64, bytes: usize, blocks: u32) -> WalGen {
    let mut g = WalGen::new(major, SEG, 3 * SEG, seed);
    g.compressor = c;
    while g.buf.len() < bytes {
        if g.rng.below(3) > 0 {
            g.random_record(blocks);
            continue;
        }
        let n = 1 + g.rng.below(3) as u32;
        let first = g.rng.below(u64::from(blocks)) as u32;
        let bs: Vec<GenBlock> = (0..n)
            .map(|i| GenBlock {
                key: BlockKey {
                    spc: 1663,
                    db: 5,
                    rel: 16390,
                    fork: 0,
                    blkno: first + i,
                },
                image: Image::Evolved { compressed: true },
                data: Vec::new(),
            })
            .collect();
        g.xid += 1;
        let rec = g.record(10, 0x00, g.xid, &bs, b"main data");
        g.write_record(&rec);
    }
    g.switch();
    g
}

/// The image flags of [`PgMajor`] (what the generators write) are what the codec reads.
#[test]
fn pg_major_image_flags_are_the_codecs() {
    for major in PgMajor::ALL {
        for &m in methods(major) {
            let f = flag(major, m);
            assert_eq!(fpi::method(major, f), Some(m), "PG{major} {m:?}");
            assert_eq!(fpi::method(major, f | major.bimg_apply()), Some(m));
            assert_eq!(f & !major.bimg_compressed_mask(), 0, "PG{major} {m:?}");
        }
        assert_eq!(fpi::method(major, major.bimg_apply()), None, "PG{major}");
    }
}

#[test]
fn every_method_on_every_major_is_recompressed() {
    for major in PgMajor::ALL {
        for &m in methods(major) {
            let g = stream(major, Some(compressor(major, m, Style::Pg)), 1, 400_000, 30);
            for slots in [0, 1, 4096] {
                let (st, total) = round_trip(
                    &params(major, slots),
                    g.start,
                    &g.buf,
                    &every(64 * 1024, g.buf.len()),
                );
                let what = format!("PG{major} {m:?} cache {slots}: {st:?}");
                assert_eq!((st.records_raw, st.resyncs), (0, 0), "{what}");
                assert!(st.fpi_recompressed > 50, "{what}");
                assert_eq!(st.fpi_recompress_mismatch, 0, "{what}");
                // The random stand-ins of random_record's compressed images, if any.
                assert_eq!(st.fpi_opaque, st.fpi_undecodable, "{what}");
                if slots == 4096 {
                    assert!(st.fpi_cache_hits > 10, "{what}");
                    // Evolving pages against their previous version: far below the primary's
                    // one-by-one compression.
                    assert!(st.fpi_out * 3 < st.fpi_in, "{what}");
                }
                assert!(total < g.buf.len(), "{what}");
            }
        }
    }
}

/// Images that do not reproduce reach the receiver as the primary's bytes: opaque when
/// checked in place; with the checks on a worker, as the primary's bytes of an op whose
/// page enters the cache ([`format::IMG_PRIMARY`]). pglz's "always" strategy makes the
/// same choices as the default one on some pages: a mix, with several images of either
/// kind in a message.
#[test]
fn foreign_compression_falls_back_to_the_original_bytes() {
    for (major, m) in [
        (PgMajor::V14, Method::Pglz),
        (PgMajor::V15, Method::Lz4),
        (PgMajor::V16, Method::Zstd),
        (PgMajor::V17, Method::Pglz),
    ] {
        let g = stream(
            major,
            Some(compressor(major, m, Style::Foreign)),
            2,
            300_000,
            20,
        );
        for threaded in [false, true] {
            let (st, _) = round_trip_checks(
                &params(major, 64),
                g.start,
                &g.buf,
                &every(50_000, g.buf.len()),
                threaded,
            );
            let what = format!("PG{major} {m:?} threaded {threaded}: {st:?}");
            assert!(st.fpi_recompress_mismatch > 20, "{what}");
            assert_eq!(st.fpi_undecodable, 0, "{what}");
            if m != Method::Pglz {
                assert_eq!(st.fpi_recompressed, 0, "{what}");
            }
            if threaded {
                // Checked on the worker unless it was behind (then in place, opaque).
                assert!(st.fpi_primary_bytes > 0, "{what}");
                assert_eq!(
                    st.fpi_primary_bytes + st.fpi_opaque,
                    st.fpi_recompress_mismatch,
                    "{what}"
                );
            } else {
                assert_eq!(st.fpi_primary_bytes, 0, "{what}");
                assert_eq!(st.fpi_opaque, st.fpi_recompress_mismatch, "{what}");
            }
        }
    }
}

/// Images that reproduce, do not, and do not even decompress, several of each in a message:
/// with the checks on a worker the ops of the ones that did not reproduce are rewritten at
/// the message's end (frame or PAGE bytes out, the primary's bytes into IMG among the opaque
/// ones), each where the decoder reads it; cache sizes from a few slots (every op kind) up.
#[test]
fn deferred_checks_among_opaque_images() {
    for m in [Method::Pglz, Method::Lz4, Method::Zstd] {
        let g = stream(
            PgMajor::V16,
            Some(compressor(PgMajor::V16, m, Style::Mixed)),
            5,
            400_000,
            30,
        );
        for slots in [4, 64] {
            let (st, _) = round_trip_checks(
                &params(PgMajor::V16, slots),
                g.start,
                &g.buf,
                &every(40_000, g.buf.len()),
                true,
            );
            let what = format!("{m:?} {slots} slots: {st:?}");
            assert!(st.fpi_primary_bytes > 3, "{what}");
            assert!(st.fpi_undecodable > 3, "{what}");
            assert!(st.fpi_recompressed > 3, "{what}");
            assert_eq!(
                st.fpi_opaque + st.fpi_primary_bytes,
                st.fpi_undecodable + st.fpi_recompress_mismatch,
                "{what}"
            );
        }
    }
}

/// A page of 4-bit noise: zstd compresses it to between 1 KiB and a page.
fn noise_page() -> Box<[u8; PAGE_SIZE]> {
    let mut x = 7u32;
    let mut page = Box::new([0u8; PAGE_SIZE]);
    for b in page.iter_mut() {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        *b = (x >> 28) as u8;
    }
    page
}

/// Appends a record with one image of block `blkno` of relation 99,001: `page`, whole,
/// `bytes` in the WAL, flagged as zstd's.
fn zstd_image_record(g: &mut WalGen, blkno: u32, page: &[u8; PAGE_SIZE], bytes: Vec<u8>) {
    assert!(bytes.len() > 1024 && bytes.len() < PAGE_SIZE);
    let b = given_block(
        99_001,
        blkno,
        Box::new(*page),
        (0, 0),
        Some((bytes, flag(g.pg_major, Method::Zstd))),
    );
    g.xid += 1;
    let rec = g.record(10, 0x00, g.xid, &[b], b"main data");
    g.write_record(&rec);
}

/// The two image ops the mixed stream does not reach, rewritten: a big image of a new
/// relation (no reference: STREAM) that does not reproduce, then the same page again (the
/// cache holds what the decoder decompressed from the primary's bytes: IDENT).
#[test]
fn deferred_checks_rewrite_stream_and_ident_ops() {
    let major = PgMajor::V16;
    let mut g = WalGen::new(major, SEG, 3 * SEG, 9);
    for _ in 0..50 {
        g.random_record(10);
    }
    let page = noise_page();
    let bytes = zstd::bulk::compress(&page[..], 19).unwrap();
    assert_ne!(compress_like_pg(Method::Zstd, &page[..]).unwrap(), bytes);
    for _ in 0..2 {
        zstd_image_record(&mut g, 3, &page, bytes.clone());
    }
    g.switch();
    let (st, _) = round_trip_checks(&params(major, 64), g.start, &g.buf, &[], true);
    let what = format!("{st:?}");
    assert_eq!(st.fpi_primary_bytes, 2, "{what}");
    assert_eq!(st.image_ops[usize::from(IMG_STREAM)], 1, "{what}");
    assert_eq!(st.image_ops[usize::from(IMG_IDENT)], 1, "{what}");
}

/// A cache hit whose image does not reproduce, rewritten (format 12): its matches taken out
/// of HIT again, between hits of images that do reproduce, each where the decoder reads it.
#[test]
fn deferred_checks_rewrite_hit_ops() {
    let major = PgMajor::V16;
    let mut g = WalGen::new(major, SEG, 3 * SEG, 9);
    let mut page = noise_page();
    // Blocks 3 and 4 imaged three times each, a few bytes changed each time: block 3's
    // images compressed as PostgreSQL does (they reproduce), block 4's at another level
    // (they do not).
    for round in 0..3u8 {
        for (blkno, foreign) in [(3, false), (4, true)] {
            page[100 + usize::from(round)] ^= 0x5A;
            page[4000] = round;
            let bytes = if foreign {
                zstd::bulk::compress(&page[..], 19).unwrap()
            } else {
                compress_like_pg(Method::Zstd, &page[..]).unwrap()
            };
            zstd_image_record(&mut g, blkno, &page, bytes);
        }
    }
    g.switch();
    let (st, _) = round_trip_checks(&params(major, 64), g.start, &g.buf, &[], true);
    let what = format!("{st:?}");
    assert_eq!(st.fpi_primary_bytes, 3, "{what}");
    assert_eq!(st.image_ops[usize::from(IMG_SAME)], 4, "{what}");
    assert!(st.fpi_hit_out > 0, "{what}");
}

/// Images the primary compressed to far less than 1 KiB, of full pages, go whole through
/// PAGE (format 7) until the message's PAGE input would pass its cap (8 × the message, which
/// the decoder enforces); the rest are framed. Each image is a few hundred bytes of WAL for
/// 8 KiB of PAGE, so one message holds both kinds.
#[test]
fn small_compressed_images_go_whole_through_page_within_its_cap() {
    let major = PgMajor::V16;
    let mut g = WalGen::new(major, SEG, 3 * SEG, 11);
    for blkno in 0..200u32 {
        let mut page = Box::new([0u8; PAGE_SIZE]);
        for (i, b) in page.iter_mut().enumerate().skip(24) {
            *b = ((i % 64) as u8) ^ (blkno as u8);
        }
        let bytes = compress_like_pg(Method::Lz4, &page[..]).unwrap();
        assert!(bytes.len() < MIN_STREAM_IMAGE, "{} bytes", bytes.len());
        let b = given_block(
            99_002,
            blkno,
            page,
            (0, 0),
            Some((bytes, flag(major, Method::Lz4))),
        );
        g.xid += 1;
        let rec = g.record(10, 0x00, g.xid, &[b], b"main data");
        g.write_record(&rec);
    }
    // One message: the whole stream (no switch: its zero tail would widen the cap).
    let (st, _) = round_trip(&params(major, 4096), g.start, &g.buf, &[]);
    let what = format!("{st:?}");
    assert_eq!(st.fpi_recompressed, 200, "{what}");
    let whole = st.image_ops[usize::from(IMG_STREAM)] as usize;
    let framed = (st.image_ops[usize::from(IMG_NEW)] + st.image_ops[usize::from(IMG_REF)]) as usize;
    assert!(whole > 0 && framed > 0, "{what}");
    assert_eq!(whole + framed, 200, "{what}");
    assert!(
        whole * PAGE_SIZE <= payload::cap(S_PAGE, g.buf.len()),
        "{what}"
    );
    // Message by message, the same.
    round_trip(
        &params(major, 4096),
        g.start,
        &g.buf,
        &every(8192, g.buf.len()),
    );
}

/// A page written whole by an XLOG_FPI record (an index build, a table rewrite) or logged for
/// a hint bit (XLOG_FPI_FOR_HINT) does not enter the block cache, so the block's next image is
/// no cache hit; the same page imaged by a heap record does, and its next image is one. All
/// round-trip.
#[test]
fn pages_written_whole_stay_out_of_the_cache() {
    let cases = [
        (RM_XLOG_ID, XLOG_FPI, 0u64),
        (RM_XLOG_ID, XLOG_FPI_FOR_HINT, 0),
        (10, 0x00, 1),
    ];
    for (rmid, info, hits) in cases {
        let st = images_of_one_block(&[(rmid, info), (rmid, info)]);
        let what = format!("rmid {rmid} info {info:#x}: {st:?}");
        assert_eq!((st.fpis, st.records_raw), (2, 0), "{what}");
        assert_eq!(st.fpi_cache_hits, hits, "{what}");
    }
}

/// A hint bit's image of a block the cache holds is a hit like any other, and stays cached:
/// heap record, XLOG_FPI_FOR_HINT, heap record of one block give two hits.
#[test]
fn a_hint_image_of_a_cached_block_is_a_hit() {
    let st = images_of_one_block(&[(10, 0x00), (RM_XLOG_ID, XLOG_FPI_FOR_HINT), (10, 0x00)]);
    assert_eq!(
        (st.fpis, st.fpi_cache_hits, st.records_raw),
        (3, 2, 0),
        "{st:?}"
    );
}

/// Round-trips one record per (rmid, info) of `kinds`, in order, each imaging the same block
/// whole with the next [`versioned_page`]; the codec's stats.
fn images_of_one_block(kinds: &[(u8, u8)]) -> CodecStats {
    let major = PgMajor::V15;
    let mut g = WalGen::new(major, SEG, 3 * SEG, 12);
    for (version, &(rmid, info)) in kinds.iter().enumerate() {
        let b = given_block(99_003, 7, versioned_page(version as u8), (0, 0), None);
        g.xid += 1;
        let rec = g.record(rmid, info, g.xid, &[b], b"");
        g.write_record(&rec);
    }
    g.switch();
    round_trip(&params(major, 64), g.start, &g.buf, &[]).0
}

/// A full page (no hole; it goes through PAGE when it is no cache hit), one byte in a thousand
/// set by `version`.
fn versioned_page(version: u8) -> Box<[u8; PAGE_SIZE]> {
    let mut page = Box::new([0u8; PAGE_SIZE]);
    for (i, b) in page.iter_mut().enumerate() {
        *b = (i % 251) as u8 ^ if i % 1000 == 0 { version } else { 0 };
    }
    page
}

#[test]
fn garbage_in_compressed_images_passes_opaquely() {
    // No compressor: the generator's compressed images are random bytes.
    let g = stream(PgMajor::V15, None, 3, 200_000, 10);
    let (st, _) = round_trip(
        &params(PgMajor::V15, 16),
        g.start,
        &g.buf,
        &every(30_000, g.buf.len()),
    );
    assert!(st.fpi_undecodable > 20, "{st:?}");
    assert_eq!(
        st.fpi_recompressed + st.fpi_recompress_mismatch,
        0,
        "{st:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn compressed_images_round_trip_at_any_chunking(
        seed in 0u64..1000,
        major_number in 14u32..=18,
        method in 0usize..3,
        foreign in any::<bool>(),
        sizes in proptest::collection::vec(1usize..40_000, 1..12),
        slots in prop_oneof![Just(0usize), Just(1usize), Just(3usize), Just(10_000usize)],
        skip in 0usize..20_000,
    ) {
        let major = PgMajor::try_from(major_number).unwrap();
        let ms = methods(major);
        let m = ms[method % ms.len()];
        let style = if foreign { Style::Foreign } else { Style::Pg };
        let g = stream(major, Some(compressor(major, m, style)), seed, 100_000, 12);
        let skip = skip.min(g.buf.len());
        let wal = &g.buf[skip..];
        let (st, _) = round_trip(
            &params(major, slots),
            g.start + skip as u64,
            wal,
            &chunks_from(&sizes, wal.len()),
        );
        if !foreign {
            prop_assert_eq!(st.fpi_recompress_mismatch, 0);
        }
    }

    #[test]
    fn compressed_images_in_tiny_messages_round_trip(seed in 0u64..1000, size in 1usize..64) {
        let g = stream(PgMajor::V16, Some(compressor(PgMajor::V16, Method::Lz4, Style::Pg)), seed, 30_000, 4);
        let cuts: Vec<usize> = (1..g.buf.len() / size).map(|i| i * size).collect();
        round_trip(&params(PgMajor::V16, 1), g.start, &g.buf, &cuts);
    }
}

/// A text index's leaf page (items: a TID, flags, a key of random hex digits repeated, as
/// the bench's bulk load indexes `repeat(md5(..), 4)`), with a hole of `hole` bytes.
fn text_index_page(seed: u64, hole: usize) -> Box<[u8; PAGE_SIZE]> {
    let mut rng = super::testgen::Rng::new(seed);
    let mut p = Box::new([0u8; PAGE_SIZE]);
    let (len, special) = (8 + 4 * 32, 16);
    let n = (PAGE_SIZE - special - 24 - hole) / (len + 4);
    let mut off = PAGE_SIZE - special;
    for i in 0..n {
        off -= len;
        let lp = off as u32 | 1 << 15 | (len as u32) << 17;
        p[24 + 4 * i..28 + 4 * i].copy_from_slice(&lp.to_le_bytes());
        p[off + 2] = (i / 50) as u8;
        p[off + 4] = (i % 50) as u8;
        p[off + 6..off + 8].copy_from_slice(&(len as u16).to_le_bytes());
        let md5: Vec<u8> = (0..32)
            .map(|_| b"0123456789abcdef"[rng.below(16) as usize])
            .collect();
        for r in 0..4 {
            p[off + 8 + 32 * r..off + 40 + 32 * r].copy_from_slice(&md5);
        }
    }
    let lower = 24 + 4 * n;
    p[12..14].copy_from_slice(&(lower as u16).to_le_bytes());
    p[14..16].copy_from_slice(&(off as u16).to_le_bytes());
    p[16..18].copy_from_slice(&((PAGE_SIZE - special) as u16).to_le_bytes());
    p
}

/// Text keys go plain (format 8: `IMG_PLAIN` on STREAM pages too, `PageXf::helps`), written
/// whole by an index build (XLOG_FPI, STREAM_NOCACHE), imaged by a record (STREAM into the
/// cache), or framed (a big hole): every path round-trips, and the pages cost about what
/// their digits do.
#[test]
fn text_index_pages_go_plain_on_every_path() {
    let major = PgMajor::V15;
    for (rmid, info, hole) in [(RM_XLOG_ID, XLOG_FPI, 0), (11, 0x00, 0), (11, 0x00, 6000)] {
        let mut g = WalGen::new(major, SEG, 3 * SEG, 21);
        for blkno in 0..40u32 {
            let page = text_index_page(u64::from(blkno), hole);
            let lower = u16::from_le_bytes([page[12], page[13]]);
            let upper = u16::from_le_bytes([page[14], page[15]]);
            let b = given_block(99_010, blkno, page, (lower, upper - lower), None);
            g.xid += 1;
            let rec = g.record(rmid, info, g.xid, &[b], b"");
            g.write_record(&rec);
        }
        g.switch();
        let (st, total) = round_trip(&params(major, 64), g.start, &g.buf, &[]);
        let what = format!(
            "rmid {rmid} hole {hole}: {total} B of {}: {st:?}",
            g.buf.len()
        );
        assert_eq!((st.fpis, st.records_raw), (40, 0), "{what}");
        // Each item's 128 key bytes are 32 hex digits (16 bytes of entropy) repeated.
        let items = (PAGE_SIZE - 16 - 24 - hole) / 140;
        assert!(total < 40 * items * 30, "{what}");
    }
}
