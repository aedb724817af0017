use proptest::prelude::*;

use super::cache::SLOT_BYTES;
use super::testgen::{Entropy, WalGen};
use super::*;
use crate::lsn::Lsn;
use crate::pg::PgMajor;

pub(super) const SEG: u64 = 1 << 20;

pub(super) fn params(cache_slots: usize) -> CodecParams {
    CodecParams {
        pg_major: Some(PgMajor::V15),
        block_cache_bytes: cache_slots * SLOT_BYTES,
        zstd_level: 3,
        max_message_bytes: 4 << 20,
    }
}

/// A heap page (pd_special at the end) with a tuple of 40 bytes per entry of `users`, at
/// offsets 1, 2, …: the 23-byte header with t_hoff 24, a zero byte, then the entry's 16 bytes
/// of user data.
pub(super) fn heap_page(users: &[[u8; 16]]) -> Box<[u8; wal::PAGE_SIZE]> {
    const TUPLE: usize = 40;
    let mut p = Box::new([0u8; wal::PAGE_SIZE]);
    let mut upper = wal::PAGE_SIZE;
    for (i, u) in users.iter().enumerate() {
        upper -= TUPLE;
        p[upper + 22] = 24;
        p[upper + 24..upper + TUPLE].copy_from_slice(u);
        let lp = (upper as u32) | (1 << 15) | ((TUPLE as u32) << 17);
        p[24 + 4 * i..28 + 4 * i].copy_from_slice(&lp.to_le_bytes());
    }
    let lower = 24 + 4 * users.len();
    p[12..14].copy_from_slice(&(lower as u16).to_le_bytes());
    p[14..16].copy_from_slice(&(upper as u16).to_le_bytes());
    p[16..18].copy_from_slice(&(wal::PAGE_SIZE as u16).to_le_bytes());
    p[18..20].copy_from_slice(&(wal::PAGE_SIZE as u16 | 4).to_le_bytes());
    p
}

/// Encodes and decodes `g.buf[from..to]` as one message, checking every byte (no record is
/// cut by a message boundary, which would send it raw and keep it from the tuple cache).
pub(super) fn relay(enc: &mut Encoder, dec: &mut Decoder, g: &WalGen, from: usize, to: usize) {
    let (mut pl, mut out) = (Vec::new(), Vec::new());
    let lsn = Lsn(g.start + from as u64);
    enc.encode(lsn, &g.buf[from..to], &mut pl).unwrap();
    dec.decode(lsn, &pl, to - from, &mut out).unwrap();
    assert!(
        out == g.buf[from..to],
        "message at {lsn} restored differently"
    );
}

/// A synthetic stream of about `bytes` bytes starting at a segment boundary, ending with an
/// XLOG_SWITCH and some records in the next segment.
pub(super) fn synthetic(seed: u64, bytes: usize, blocks: u32) -> WalGen {
    synthetic_major(PgMajor::V15, seed, bytes, blocks)
}

fn synthetic_major(major: PgMajor, seed: u64, bytes: usize, blocks: u32) -> WalGen {
    let mut g = WalGen::new(major, SEG, 3 * SEG, seed);
    while g.buf.len() < bytes {
        g.random_record(blocks);
    }
    g.switch();
    for _ in 0..20 {
        g.random_record(blocks);
    }
    g
}

/// Encodes `wal` (starting at `start`) cut into `chunks` and decodes it again, checking every
/// message; returns the encoder's stats and the total payload size.
pub(super) fn round_trip(
    p: &CodecParams,
    start: u64,
    wal: &[u8],
    cuts: &[usize],
) -> (CodecStats, usize) {
    round_trip_with(
        Encoder::new(p).unwrap(),
        Decoder::new(p).unwrap(),
        start,
        wal,
        cuts,
    )
}

/// [`round_trip`] with image checks (encoder) and compressions (decoder) on worker threads
/// (`threaded`) or in place, whatever the machine.
pub(super) fn round_trip_checks(
    p: &CodecParams,
    start: u64,
    wal: &[u8],
    cuts: &[usize],
    threaded: bool,
) -> (CodecStats, usize) {
    let mut enc = Encoder::new(p).unwrap();
    enc.threaded_checks(threaded);
    let mut dec = Decoder::new(p).unwrap();
    dec.threaded_restores(threaded);
    round_trip_with(enc, dec, start, wal, cuts)
}

fn round_trip_with(
    mut enc: Encoder,
    mut dec: Decoder,
    start: u64,
    wal: &[u8],
    cuts: &[usize],
) -> (CodecStats, usize) {
    let (mut payload, mut restored) = (Vec::new(), Vec::new());
    let mut total = 0;
    let mut at = 0usize;
    let mut bounds: Vec<usize> = cuts
        .iter()
        .copied()
        .filter(|&c| c > 0 && c < wal.len())
        .collect();
    bounds.sort_unstable();
    bounds.dedup();
    bounds.push(wal.len());
    for end in bounds {
        let msg = &wal[at..end];
        let lsn = Lsn(start + at as u64);
        enc.encode(lsn, msg, &mut payload).unwrap();
        total += payload.len();
        dec.decode(lsn, &payload, msg.len(), &mut restored)
            .unwrap_or_else(|e| panic!("decoding message at {lsn} ({} bytes): {e}", msg.len()));
        assert!(
            restored == msg,
            "message at {lsn} ({} bytes) restored differently",
            msg.len()
        );
        at = end;
    }
    (enc.stats().clone(), total)
}

/// Cuts every `n` bytes.
pub(super) fn every(n: usize, len: usize) -> Vec<usize> {
    (1..=len / n).map(|i| i * n).collect()
}

#[test]
fn synthetic_stream_round_trips_and_is_encoded() {
    let g = synthetic(1, 600_000, 40);
    assert!(
        g.split_headers > 0,
        "the generator should split some record headers"
    );
    for slots in [0, 1, 4096] {
        let (st, total) = round_trip(
            &params(slots),
            g.start,
            &g.buf,
            &every(128 * 1024, g.buf.len()),
        );
        assert_eq!(st.records_raw, 0, "{st:?}");
        assert!(
            st.records as usize + st.records_split as usize >= g.records - 1,
            "{st:?}"
        );
        assert!(st.fpis > 0 && st.fpi_opaque > 0, "{st:?}");
        assert_eq!(st.resyncs, 0, "{st:?}");
        if slots == 4096 {
            assert!(st.fpi_cache_hits > 0, "{st:?}");
            // Heap tuples that are edits of earlier ones travel as deltas.
            assert!(st.tuple_deltas > 30 && st.tuple_misses > 0, "{st:?}");
        }
        // Page headers cost about a byte each.
        assert!(st.page_header_out * 10 < st.page_header_in, "{st:?}");
        assert!(total < g.buf.len() / 2, "{total} of {}", g.buf.len());
    }
}

#[test]
fn whole_stream_in_one_message_encodes_every_record() {
    let g = synthetic(2, 300_000, 10);
    let (st, _) = round_trip(&params(64), g.start, &g.buf, &[]);
    assert_eq!(st.records as usize, g.records, "{st:?}");
    assert_eq!(st.raw_in, 0, "{st:?}");
}

#[test]
fn cache_beats_no_cache_on_repeated_blocks() {
    let g = synthetic(3, 800_000, 8);
    let cuts = every(100_000, g.buf.len());
    let (_, none) = round_trip(&params(0), g.start, &g.buf, &cuts);
    let (st, big) = round_trip(&params(1000), g.start, &g.buf, &cuts);
    assert!(st.fpi_cache_hits > 10, "{st:?}");
    assert!(big < none, "cache {big} vs none {none}");
}

#[test]
fn stream_starting_mid_record_locks_on() {
    let g = synthetic(4, 400_000, 20);
    // Start inside a record at a page boundary and at an odd offset.
    for skip in [5 * 8192, 3 * 8192 + 1234, 77] {
        let wal = &g.buf[skip..];
        let (st, _) = round_trip(
            &params(16),
            g.start + skip as u64,
            wal,
            &every(50_000, wal.len()),
        );
        assert!(st.records > 10, "skip {skip}: {st:?}");
    }
}

#[test]
fn non_contiguous_messages_reset_both_sides() {
    let g = synthetic(5, 300_000, 10);
    let p = params(100);
    let mut enc = Encoder::new(&p).unwrap();
    let mut dec = Decoder::new(&p).unwrap();
    let (mut payload, mut out) = (Vec::new(), Vec::new());
    // First half, then a jump back (a reconnect replaying from an earlier point), then on.
    let cuts = [
        (0, 100_000),
        (100_000, 200_000),
        (50_000, 150_000),
        (150_000, 300_000),
    ];
    for (a, b) in cuts {
        let lsn = Lsn(g.start + a as u64);
        enc.encode(lsn, &g.buf[a..b], &mut payload).unwrap();
        dec.decode(lsn, &payload, b - a, &mut out).unwrap();
        assert!(out == g.buf[a..b]);
    }
    assert!(enc.stats().resyncs >= 1);
}

#[test]
fn every_supported_major_round_trips() {
    for major in PgMajor::ALL {
        let g = synthetic_major(major, 11, 150_000, 20);
        let p = CodecParams {
            pg_major: Some(major),
            ..params(100)
        };
        let (st, _) = round_trip(&p, g.start, &g.buf, &every(64 * 1024, g.buf.len()));
        assert_eq!((st.records_raw, st.resyncs), (0, 0), "PG{major}: {st:?}");
        assert!(st.fpis > 0 && st.fpi_opaque > 0, "PG{major}: {st:?}");
        // The other majors' magic is not locked on.
        let other = CodecParams {
            pg_major: Some(if major == PgMajor::V14 {
                PgMajor::V15
            } else {
                PgMajor::V14
            }),
            ..p
        };
        let (st, _) = round_trip(&other, g.start, &g.buf, &every(64 * 1024, g.buf.len()));
        assert_eq!(st.records, 0, "PG{major} read as another major: {st:?}");
    }
}

/// The fuzz targets' mix of records (every field from the entropy) is WAL the codec
/// understands record by record, and it reaches each way of handling an image the primary
/// compressed: recompressed, sent as is after a mismatch, undecodable.
#[test]
fn shaped_records_are_understood_and_reach_every_image_path() {
    for major in PgMajor::ALL {
        let mut g = WalGen::new(major, SEG, 3 * SEG, 21);
        while g.buf.len() < 250_000 {
            g.shaped_record();
        }
        let p = |slots| CodecParams {
            pg_major: Some(major),
            ..params(slots)
        };
        let (st, _) = round_trip(&p(64), g.start, &g.buf, &[]);
        assert_eq!((st.records_raw, st.resyncs), (0, 0), "PG{major}: {st:?}");
        assert_eq!(st.records as usize, g.records, "PG{major}: {st:?}");
        assert!(st.fpis > 20 && st.fpi_recompressed > 0, "PG{major}: {st:?}");
        assert!(
            st.fpi_recompress_mismatch > 0 && st.fpi_undecodable > 0,
            "PG{major}: {st:?}"
        );
        round_trip(&p(3), g.start, &g.buf, &every(7_000, g.buf.len()));
    }
}

#[test]
fn other_wal_block_sizes_pass_raw() {
    let mut g = synthetic(12, 100_000, 10);
    // The first long header announces XLOG_BLCKSZ 16384.
    g.buf[36..40].copy_from_slice(&16384u32.to_le_bytes());
    let (st, _) = round_trip(&params(10), g.start, &g.buf, &every(30_000, g.buf.len()));
    assert_eq!(st.records, 0, "{st:?}");
    // The long header itself went as a (raw) page header.
    assert_eq!(
        (st.raw_in + st.page_header_in) as usize,
        g.buf.len(),
        "{st:?}"
    );
    assert_eq!(st.page_header_in, 40, "{st:?}");
}

#[test]
fn unsupported_major_passes_raw() {
    let g = synthetic(6, 100_000, 10);
    let mut p = params(10);
    p.pg_major = None;
    let (st, _) = round_trip(&p, g.start, &g.buf, &every(30_000, g.buf.len()));
    assert_eq!(st.records, 0);
    assert_eq!(st.raw_in as usize, g.buf.len());
}

#[test]
fn decoder_with_a_smaller_cache_refuses() {
    let g = synthetic(7, 200_000, 50);
    let mut enc = Encoder::new(&params(100)).unwrap();
    let mut dec = Decoder::new(&params(2)).unwrap();
    let mut payload = Vec::new();
    let mut out = Vec::new();
    enc.encode(Lsn(g.start), &g.buf, &mut payload).unwrap();
    let err = dec
        .decode(Lsn(g.start), &payload, g.buf.len(), &mut out)
        .unwrap_err();
    assert!(matches!(err, WalCodecError::CacheTooSmall { .. }), "{err}");
    assert!(err.to_string().contains("block_cache_bytes"));
    // And stays refused.
    assert!(matches!(
        dec.decode(Lsn(g.start), &payload, g.buf.len(), &mut out),
        Err(WalCodecError::Poisoned)
    ));
}

#[test]
fn limits_are_enforced() {
    let p = CodecParams {
        max_message_bytes: 1000,
        ..params(1)
    };
    let mut enc = Encoder::new(&p).unwrap();
    let mut dec = Decoder::new(&p).unwrap();
    let mut out = Vec::new();
    assert!(matches!(
        enc.encode(Lsn(0), &[0; 1001], &mut out),
        Err(WalCodecError::TooLong { .. })
    ));
    assert!(matches!(
        dec.decode(Lsn(0), &[1, 0, 0, 0, 0, 0, 0], 1 << 30, &mut out),
        Err(WalCodecError::TooLong { .. })
    ));
    let mut enc = Encoder::new(&params(1)).unwrap();
    assert!(matches!(
        enc.encode(Lsn(u64::MAX - 3), &[0; 10], &mut out),
        Err(WalCodecError::Overflow { .. })
    ));
    assert!(Encoder::new(&CodecParams {
        zstd_level: 1000,
        ..params(1)
    })
    .is_err());
}

#[test]
fn empty_messages_round_trip() {
    let p = params(1);
    let (st, _) = round_trip(&p, 0, &[], &[]);
    assert_eq!(st.messages, 1);
}

pub(super) fn chunks_from(sizes: &[usize], len: usize) -> Vec<usize> {
    let mut cuts = Vec::new();
    let mut at = 0;
    for s in sizes.iter().cycle().take(10_000) {
        at += s;
        if at >= len {
            break;
        }
        cuts.push(at);
    }
    cuts
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn synthetic_round_trips_at_any_chunking(
        seed in 0u64..1000,
        sizes in proptest::collection::vec(1usize..40_000, 1..12),
        slots in prop_oneof![Just(0usize), Just(1usize), Just(3usize), Just(10_000usize)],
        skip in 0usize..20_000,
    ) {
        let g = synthetic(seed, 120_000, 12);
        let skip = skip.min(g.buf.len());
        let wal = &g.buf[skip..];
        round_trip(&params(slots), g.start + skip as u64, wal, &chunks_from(&sizes, wal.len()));
    }

    #[test]
    fn tiny_chunks_round_trip(seed in 0u64..1000, size in 1usize..64) {
        let g = synthetic(seed, 30_000, 4);
        let cuts: Vec<usize> = (1..g.buf.len() / size).map(|i| i * size).collect();
        round_trip(&params(2), g.start, &g.buf, &cuts);
    }
}

/// A btree-like leaf page: `n` 16-byte items (TID, t_info, an int key counting up from
/// `first`), packed from the end, room for one more.
fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn leaf_page(first: u32, n: usize) -> Vec<u8> {
    let mut p = vec![0u8; wal::PAGE_SIZE];
    let mut off = wal::PAGE_SIZE - 16;
    for i in 0..n {
        off -= 16;
        let lp = off as u32 | 1 << 15 | 16 << 17;
        p[24 + 4 * i..28 + 4 * i].copy_from_slice(&lp.to_le_bytes());
        let key = first + i as u32;
        p[off..off + 4].copy_from_slice(&(key / 61).to_le_bytes());
        p[off + 4..off + 6].copy_from_slice(&((key % 61 + 1) as u16).to_le_bytes());
        p[off + 6..off + 8].copy_from_slice(&16u16.to_le_bytes());
        p[off + 8..off + 12].copy_from_slice(&key.to_le_bytes());
    }
    let lower = 24 + 4 * n;
    p[12..14].copy_from_slice(&(lower as u16).to_le_bytes());
    p[14..16].copy_from_slice(&((off - 200) as u16).to_le_bytes());
    p[16..18].copy_from_slice(&((wal::PAGE_SIZE - 16) as u16).to_le_bytes());
    p
}

/// First images of neighbouring index pages (a cold cache) go transformed (`pagexf`) through
/// PAGE, whose window holds the pages before them: a few dozen bytes each instead of over a
/// kilobyte, and they restore exactly at any chunking.
#[test]
fn first_images_of_regular_pages_are_small() {
    let mut g = WalGen::new(PgMajor::V15, SEG, 3 * SEG, 5);
    let key = |blkno| wal::BlockKey {
        spc: 1663,
        db: 5,
        rel: 16400,
        fork: 0,
        blkno,
    };
    for b in 0..60 {
        let page = leaf_page(b * 350, 340);
        let (lower, upper) = (le16(&page, 12), le16(&page, 14));
        let blocks = [testgen::GenBlock {
            key: key(b),
            image: testgen::Image::Given(testgen::GivenImage {
                page: page.try_into().unwrap(),
                hole_offset: lower,
                hole_len: upper - lower,
                apply: true,
                compressed: None,
            }),
            data: vec![1, 2, 3, 4],
        }];
        let rec = g.record(11, 0x00, 700 + b, &blocks, &[7; 6]);
        g.write_record(&rec);
    }
    // Records cut by messages pass raw: these cuts only check the restore.
    for cuts in [every(8192, g.buf.len()), every(100_000, g.buf.len())] {
        round_trip(&params(64), g.start, &g.buf, &cuts);
    }
    let (st, _) = round_trip(&params(64), g.start, &g.buf, &[]);
    assert_eq!(st.image_ops[usize::from(format::IMG_STREAM)], 60, "{st:?}");
    assert_eq!(st.image_ops[usize::from(format::IMG_REF)], 0, "{st:?}");
    let per_page = st.section_out[S_PAGE] / 60;
    assert!(per_page < 100, "{per_page} bytes of PAGE per image: {st:?}");
}

/// Small messages go combined (one zstd chunk), big ones as separate sections; both restore,
/// and a decoder refuses an unknown first byte and page frames its header does not announce.
#[test]
fn small_messages_go_combined_big_ones_separate() {
    let g = synthetic(12, 300_000, 20);
    let p = params(64);
    let mut enc = Encoder::new(&p).unwrap();
    let mut dec = Decoder::new(&p).unwrap();
    let (mut out, mut restored) = (Vec::new(), Vec::new());
    let mut at = 0;
    let mut modes = std::collections::HashSet::new();
    for (i, end) in every(700, g.buf.len()).into_iter().enumerate() {
        // Every tenth message 30 times bigger.
        let end = if i % 10 == 9 {
            (end + 20_000).min(g.buf.len())
        } else {
            end
        };
        if end <= at {
            continue;
        }
        let lsn = Lsn(g.start + at as u64);
        enc.encode(lsn, &g.buf[at..end], &mut out).unwrap();
        modes.insert(out[0]);
        dec.decode(lsn, &out, end - at, &mut restored).unwrap();
        assert!(restored == g.buf[at..end]);
        at = end;
    }
    assert_eq!(
        modes,
        [FORMAT_VERSION, 0x80 | FORMAT_VERSION]
            .into_iter()
            .collect()
    );

    let mut enc = Encoder::new(&p).unwrap();
    let msg = &g.buf[..60_000];
    enc.encode(Lsn(g.start), msg, &mut out).unwrap();
    assert_eq!(out[0], FORMAT_VERSION);
    let mut bad = out.clone();
    bad[0] = 0x02;
    let e = Decoder::new(&p)
        .unwrap()
        .decode(Lsn(g.start), &bad, msg.len(), &mut restored);
    assert!(matches!(e, Err(WalCodecError::Corrupt(_))), "{e:?}");
    // Page frames announced but cut off, or present but not announced: the header's
    // `present` varint with its page-frame bit (the one after the streams') flipped.
    let mut r = super::streams::Reader::new(&out[1..], "test");
    let present = r.varint().unwrap();
    let mut bad = vec![out[0]];
    super::streams::put_varint(&mut bad, present ^ (1 << STREAMS));
    bad.extend_from_slice(&out[1 + r.position()..]);
    let e = Decoder::new(&p)
        .unwrap()
        .decode(Lsn(g.start), &bad, msg.len(), &mut restored);
    assert!(matches!(e, Err(WalCodecError::Corrupt(_))), "{e:?}");
}

/// Writes a heap insert of `body` (after a tuple header's fields) into block `blkno` of
/// relation `rel` to `g`, one record per call.
pub(super) fn insert_row(g: &mut WalGen, rel: u32, blkno: u32, body: &[u8]) {
    let mut data = vec![0x02, 0x00, 0x02, 0x08, 24];
    data.extend_from_slice(body);
    let blocks = [testgen::GenBlock {
        key: wal::BlockKey {
            spc: 1663,
            db: 5,
            rel,
            fork: 0,
            blkno,
        },
        image: testgen::Image::None,
        data,
    }];
    let rec = g.record(10, 0x00, 900 + blkno, &blocks, &[1, 0, 0]);
    g.write_record(&rec);
}

/// A row of 6,000 random bytes, 6 MiB of other (incompressible) rows, then the first row
/// again, from `mark` on.
pub(super) fn value_seen_long_ago(seed: u64) -> (WalGen, usize) {
    let mut g = WalGen::new(PgMajor::V15, 64 << 20, 0, seed);
    let value = g.rng.bytes(6000);
    insert_row(&mut g, 16500, 0, &value);
    for b in 1..1000 {
        let other = g.rng.bytes(6000);
        insert_row(&mut g, 16500, b, &other);
    }
    let mark = g.buf.len();
    insert_row(&mut g, 16500, 1000, &value);
    (g, mark)
}

/// A value written again long after (a TOAST value rewritten under new chunk ids) is found in
/// LONG's long history when `block_cache_bytes` pays for it (an eighth of it), and not with
/// the 4 MiB window of a small cache.
#[test]
fn content_seen_long_ago_is_a_reference() {
    let (g, mark) = value_seen_long_ago(9);
    let cost_of_last = |cache: usize| {
        let p = CodecParams {
            block_cache_bytes: cache,
            ..params(0)
        };
        let (mut enc, mut dec) = (Encoder::new(&p).unwrap(), Decoder::new(&p).unwrap());
        let (mut pl, mut out) = (Vec::new(), Vec::new());
        let mut at = 0;
        for end in every(1 << 20, mark).into_iter().chain([mark, g.buf.len()]) {
            if end <= at {
                continue;
            }
            enc.encode(Lsn(g.start + at as u64), &g.buf[at..end], &mut pl)
                .unwrap();
            dec.decode(Lsn(g.start + at as u64), &pl, end - at, &mut out)
                .unwrap();
            assert!(out == g.buf[at..end]);
            at = end;
        }
        pl.len()
    };
    let (small, big) = (cost_of_last(64 * SLOT_BYTES), cost_of_last(1 << 30));
    assert!(small > 5000, "{small}");
    assert!(big < 300, "{big} (small cache: {small})");
}

#[test]
fn the_configured_level_maps_to_cheap_streams_and_strong_hit_frames() {
    use super::encoder::levels;
    assert_eq!(levels(3), (1, 6), "the default");
    assert_eq!(levels(1), (1, 4));
    assert_eq!(levels(5), (3, 8));
    let max = zstd_safe::max_c_level();
    assert_eq!(levels(19), (17, max.min(22)));
    // Every configurable level gives levels zstd accepts, rising with the configured one.
    let mut prev = (0, 0);
    for l in 1..=19 {
        let (s, h) = levels(l);
        assert!(
            (1..=max).contains(&s) && (1..=max).contains(&h) && s < h,
            "{l}: {s}, {h}"
        );
        assert!(s >= prev.0 && h >= prev.1, "{l}");
        prev = (s, h);
    }
}
