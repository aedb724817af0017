//! Images the primary compressed: synthetic WAL whose compressed images are made with each
//! method as PostgreSQL calls it (they go the recompress path) or with other settings (they
//! must fall back to the original bytes), round-tripped at any chunking and cache size. Real
//! WAL of every major and method is in `tests/codec_majors.rs`.

use proptest::prelude::*;

use super::cache::SLOT_BYTES;
use super::fpi::{compress_like_pg, lz4_compress_fast, Method};
use super::pglz::{Pglz, STRATEGY_ALWAYS};
use super::testgen::{Compressor, Entropy, GenBlock, Image, WalGen};
use super::tests::{chunks_from, every, round_trip};
use super::wal::BlockKey;
use super::*;
use crate::pg::PgMajor;

const SEG: u64 = 1 << 20;

fn params(major: PgMajor, cache_slots: usize) -> CodecParams {
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
}

fn compressor(major: PgMajor, m: Method, style: Style) -> Compressor {
    let f = flag(major, m);
    Box::new(move |src: &[u8]| {
        let bytes = match (style, m) {
            (Style::Pg, _) => compress_like_pg(m, src)?,
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
        let (st, _) = round_trip(
            &params(major, 64),
            g.start,
            &g.buf,
            &every(50_000, g.buf.len()),
        );
        let what = format!("PG{major} {m:?}: {st:?}");
        assert!(st.fpi_recompress_mismatch > 20, "{what}");
        assert_eq!(st.fpi_undecodable, 0, "{what}");
        // pglz's "always" strategy makes the same choices as the default one on some pages.
        if m != Method::Pglz {
            assert_eq!(st.fpi_recompressed, 0, "{what}");
        }
        assert_eq!(
            st.fpi_opaque,
            st.fpi_recompress_mismatch + st.fpi_undecodable,
            "{what}"
        );
    }
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
