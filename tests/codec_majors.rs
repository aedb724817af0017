//! The WAL-aware codec on real WAL from every supported major (14–18), with and without
//! wal_compression: encode → decode gives identical bytes for random chunkings, with a tiny
//! and a large block cache; it beats generic streaming zstd-3 on uncompressed WAL; and the
//! images the primary compressed mostly go through the block cache, compressed again by the
//! receiver to the primary's bytes.
#![deny(clippy::undocumented_unsafe_blocks)]

use rand::{Rng, SeedableRng};
use walrelay::config::CodecKind;
use walrelay_harness::cluster::majors::installed_majors;
use walrelay_harness::cluster::walrec::{record_wal, supported_wal_compressions, RecordOpts};
use walrelay_wal::linkcodec::{checksum, Setup, WalDecoder, WalEncoder};
use walrelay_wal::lsn::Lsn;
use walrelay_wal::pg::PgMajor;
use walrelay_wal::walcodec::{CodecParams, CodecStats};

/// Encodes `wal` (starting at `start`) in messages cut at the given lengths, decodes them,
/// and checks every byte; returns the encoded size and the wal codec's counters.
fn round_trip(
    kind: CodecKind,
    major: u32,
    cache: usize,
    start: u64,
    wal: &[u8],
    cuts: &mut impl Iterator<Item = usize>,
) -> (usize, Option<CodecStats>) {
    let setup = Setup {
        kind,
        zstd_level: 3,
        window_log: 23,
        wal: CodecParams {
            pg_major: PgMajor::from_number(major),
            block_cache_bytes: cache,
            zstd_level: 3,
            max_message_bytes: 1 << 20,
        },
    };
    let (mut enc, mut dec) = (
        WalEncoder::new(&setup).unwrap(),
        WalDecoder::new(&setup).unwrap(),
    );
    let (mut payload, mut restored) = (Vec::new(), Vec::new());
    let (mut at, mut total) = (0usize, 0usize);
    while at < wal.len() {
        let n = cuts.next().unwrap().clamp(1, 1 << 20).min(wal.len() - at);
        let msg = &wal[at..at + n];
        let lsn = Lsn(start + at as u64);
        enc.encode(lsn, msg, &mut payload).unwrap();
        dec.decode(lsn, &payload, n, 1 << 20, checksum(msg), &mut restored)
            .unwrap_or_else(|e| panic!("PG {major} {kind:?} cache {cache}: message at {lsn} ({n} bytes) did not restore: {e}"));
        total += payload.len();
        at += n;
    }
    (total, enc.wal_stats().cloned())
}

/// One test per major, so that cargo runs two at a time (recording is mostly waiting on
/// PostgreSQL) and a failure names its major.
macro_rules! every_major {
    ($($name:ident => $major:literal),*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            recorded_wal_round_trips($major).await;
        }
    )*};
}

every_major!(
    recorded_wal_of_pg14_round_trips => 14,
    recorded_wal_of_pg15_round_trips => 15,
    recorded_wal_of_pg16_round_trips => 16,
    recorded_wal_of_pg17_round_trips => 17,
    recorded_wal_of_pg18_round_trips => 18
);

/// WAL recorded on PostgreSQL `major` with each of its `wal_compression` methods round-trips
/// (see the module doc).
async fn recorded_wal_round_trips(major: u32) {
    let majors = installed_majors();
    let found: Vec<u32> = majors.iter().map(|i| i.major).collect();
    let install = majors.iter().find(|i| i.major == major).unwrap_or_else(|| {
        panic!("PostgreSQL {major} needed, found {found:?}: run scripts/install-pg-majors.sh")
    });
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed ^ u64::from(major));
    for compression in supported_wal_compressions(install.major) {
        let opts = RecordOpts {
            wal_compression: compression.to_string(),
            wal_level: "replica".into(),
            seconds: 3,
            scale: 2,
            max_bytes: 1 << 30,
        };
        let rec = record_wal(install, &opts).await.unwrap();
        // Limit the work per recording to its last 24 MB (page-aligned): the load after the
        // checkpoints, full of full-page images, across a segment boundary. The codec locks
        // on at the first page header.
        let from = rec.bytes.len().saturating_sub(24 << 20) / 8192 * 8192;
        let wal = &rec.bytes[from..];
        let start = rec.start_lsn + from as u64;
        // Message lengths as the walsender cuts them (≤ 128 kB), at arbitrary byte positions.
        let mut walsender_like = std::iter::from_fn(|| Some(rng.random_range(1..=128 * 1024)));
        let (wal_size, stats) = round_trip(
            CodecKind::Wal,
            rec.major,
            1 << 30,
            start,
            wal,
            &mut walsender_like,
        );
        // Tiny messages and a one-block cache.
        let mut tiny = std::iter::from_fn(|| Some(rng.random_range(1..=700)));
        round_trip(
            CodecKind::Wal,
            rec.major,
            8192 + 64,
            start,
            &wal[..wal.len().min(2 << 20)],
            &mut tiny,
        );
        let mut fixed = std::iter::repeat(128 * 1024);
        let (zstd_size, _) = round_trip(CodecKind::Zstd, rec.major, 0, start, wal, &mut fixed);
        let stats = stats.expect("the wal codec's counters");
        eprintln!(
            "PG {} wal_compression={compression}: {} bytes -> wal codec {} / zstd-3 {}; \
             images: {} recompressed, {} recompression mismatches, {} undecodable, \
             {} opaque, {} in the cache; prunes {} predicted, {} exactly, {} their block data, \
             {} missed by the reason byte alone",
            rec.major,
            wal.len(),
            wal_size,
            zstd_size,
            stats.fpi_recompressed,
            stats.fpi_recompress_mismatch,
            stats.fpi_undecodable,
            stats.fpi_opaque,
            stats.fpis,
            stats.prunes_predicted,
            stats.prunes_exact,
            stats.prunes_data_exact,
            stats.prunes_missed_by_reason,
        );
        check_recompression(rec.major, compression, libzstd_of(install), &stats);
        if *compression == "off" {
            assert!(
                wal_size < zstd_size,
                "PG {}: the wal codec ({wal_size}) did not beat zstd-3 ({zstd_size})",
                rec.major
            );
            check_prunes(rec.major, &stats);
        }
    }
}

/// The recording's updates prune pages on access all the time: both ends predicted those
/// prunes from the cached page in the major's own record layout (`walcodec::prunexf`), and
/// most predictions had the record's block data (offsets, on 17-18 with their counts) and
/// some the whole record. A misread layout predicts neither. (17-18 leave the record's
/// `reason` byte unset, so whole records miss where the stack held something else there:
/// on one machine a third of 18's prunes on recorded pgbench WAL, on another every one of
/// 17's. Such a record counts as whole here: the rest of its main data, the flags and the
/// horizon, was predicted.)
fn check_prunes(major: u32, st: &CodecStats) {
    let what = format!(
        "PG {major}: {} prunes predicted, {} exactly, {} their block data, {} missed by the \
         reason byte alone",
        st.prunes_predicted, st.prunes_exact, st.prunes_data_exact, st.prunes_missed_by_reason
    );
    assert!(
        st.prunes_predicted >= 20,
        "too few prunes predicted: {what}"
    );
    assert!(
        st.prunes_data_exact * 4 >= st.prunes_predicted * 3,
        "fewer than 3 in 4 prunes' block data predicted: {what}"
    );
    assert!(
        st.prunes_exact + st.prunes_missed_by_reason > 0,
        "no prune predicted whole (but for 17-18's unset reason byte): {what}"
    );
    if major < 17 {
        assert_eq!(st.prunes_missed_by_reason, 0, "{what}");
    }
}

/// The compressed images of a recording went the recompress path: all for lz4 (liblz4 gives
/// PostgreSQL's bytes), all but a few for pglz (our pglz follows PostgreSQL's), and for zstd
/// all when the primary's libzstd is one of the releases whose level 3 the bundled 1.5.6
/// reproduces (1.5.1–1.5.6, `walcodec::fpi`), most otherwise; none were undecodable.
fn check_recompression(
    major: u32,
    compression: &str,
    libzstd: Option<(u32, u32, u32)>,
    st: &CodecStats,
) {
    let compressed = st.fpi_recompressed + st.fpi_recompress_mismatch + st.fpi_undecodable;
    let what = format!("PG {major} wal_compression={compression} (libzstd {libzstd:?}): {st:?}");
    if compression == "off" {
        assert_eq!(compressed, 0, "{what}");
        return;
    }
    assert!(compressed > 1000, "too few compressed images: {what}");
    assert_eq!(st.fpi_undecodable, 0, "{what}");
    if compression == "zstd" && libzstd.is_some_and(|v| ((1, 5, 1)..=(1, 5, 6)).contains(&v)) {
        assert_eq!(st.fpi_recompress_mismatch, 0, "{what}");
    }
    // Percent of the compressed images recompressed: lz4 and pglz all but a few, zstd most.
    let need = match compression {
        "zstd" => 60,
        _ => 98,
    };
    assert!(
        st.fpi_recompressed * 100 >= compressed * need,
        "fewer than {need}% recompressed: {what}"
    );
}

/// The release of the libzstd the install's `postgres` loads, from the file name `ldd`
/// resolves (`libzstd.so.1.5.4`); None when that cannot be told.
fn libzstd_of(install: &walrelay_harness::cluster::PgInstall) -> Option<(u32, u32, u32)> {
    let out = std::process::Command::new("ldd")
        .arg(install.bindir.join("postgres"))
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let path = text
        .lines()
        .find(|l| l.contains("libzstd.so"))?
        .split("=>")
        .nth(1)?
        .split_whitespace()
        .next()?;
    let real = std::fs::canonicalize(path).ok()?;
    let name = real.file_name()?.to_str()?;
    let mut v = name.strip_prefix("libzstd.so.")?.split('.').map(str::parse);
    match (v.next(), v.next(), v.next()) {
        (Some(Ok(a)), Some(Ok(b)), Some(Ok(c))) => Some((a, b, c)),
        _ => None,
    }
}
