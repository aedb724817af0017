use std::collections::HashMap;
use std::process::Command;

use super::*;
use crate::cluster::majors::installed_majors;
use walrelay_wal::pg::PgMajor;

const XLP_LONG_HEADER: u16 = 0x0002;
const XLP_ALL_FLAGS: u16 = 0x000F;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

#[test]
fn names_segments_like_postgres() {
    assert_eq!(segment_file_name(1, 1), "000000010000000000000001");
    assert_eq!(segment_file_name(1, 0x1FF), "0000000100000001000000FF");
    assert_eq!(segment_file_name(0xA, 0x300), "0000000A0000000300000000");
}

#[test]
fn pglz_is_on_before_15() {
    assert_eq!(server_wal_compression(14, "pglz").unwrap(), "on");
    assert_eq!(server_wal_compression(15, "pglz").unwrap(), "pglz");
    assert!(server_wal_compression(14, "lz4").is_err());
    assert!(server_wal_compression(16, "brotli").is_err());
}

#[test]
fn cache_dir_is_under_the_workspace_target() {
    let dir = cache_dir();
    assert!(dir.ends_with("walrec"), "{}", dir.display());
    if std::env::var_os("CARGO_TARGET_DIR").is_none() {
        let ws = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        assert_eq!(dir, ws.join("target").join("walrec"));
    }
}

/// Every page has a header of this major for its own address; each segment starts with a
/// long header. After an XLOG_SWITCH record the rest of a segment may be zeroed pages.
fn check_pages(rec: &RecordedWal) {
    let magic = PgMajor::try_from(rec.major)
        .expect("a supported major")
        .page_magic();
    let what = format!(
        "PostgreSQL {} wal_compression={}",
        rec.major, rec.wal_compression
    );
    let first = &rec.bytes[..WAL_PAGE_SIZE];
    assert_ne!(
        u16_at(first, 2) & XLP_LONG_HEADER,
        0,
        "{what}: no long header on first page"
    );
    assert_eq!(u16_at(first, 0), magic, "{what}: xlp_magic");
    let mut zero_tail = false;
    for (i, page) in rec.bytes.chunks(WAL_PAGE_SIZE).enumerate() {
        let addr = rec.start_lsn + (i * WAL_PAGE_SIZE) as u64;
        let at = format!("{what}: page at {}", Lsn(addr));
        let seg_start = WalSegSize::DEFAULT.offset_in_segment(Lsn(addr)) == 0;
        if seg_start {
            zero_tail = false;
        }
        if !seg_start && page.iter().all(|&b| b == 0) {
            zero_tail = true;
            continue;
        }
        assert!(!zero_tail, "{at}: header after a zeroed page");
        let info = u16_at(page, 2);
        assert_eq!(u16_at(page, 0), magic, "{at}: xlp_magic");
        assert_eq!(info & !XLP_ALL_FLAGS, 0, "{at}: xlp_info {info:#x}");
        assert_eq!(u32_at(page, 4), 1, "{at}: xlp_tli");
        assert_eq!(u64_at(page, 8), addr, "{at}: xlp_pageaddr");
        assert_eq!(
            info & XLP_LONG_HEADER != 0,
            seg_start,
            "{at}: long header flag"
        );
        if seg_start {
            assert_eq!(
                u32_at(page, 32) as u64,
                WAL_SEGMENT_SIZE,
                "{at}: xlp_seg_size"
            );
            assert_eq!(
                u32_at(page, 36) as usize,
                WAL_PAGE_SIZE,
                "{at}: xlp_xlog_blcksz"
            );
        }
    }
}

/// pg_waldump of the same major reads the segments from the first to the last without
/// complaint (or with only the usual end-of-WAL message); returns its output.
fn waldump(install: &PgInstall, rec: &RecordedWal) -> String {
    let dir = tempfile::tempdir().unwrap();
    let segments = rec.segments();
    for (name, data) in &segments {
        std::fs::write(dir.path().join(name), data).unwrap();
    }
    let mut cmd = Command::new(install.bin("pg_waldump"));
    cmd.arg("-p").arg(dir.path());
    cmd.arg(&segments[0].0).arg(&segments[segments.len() - 1].0);
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let end_of_wal = stderr.trim().lines().count() == 1
        && stderr.contains("invalid record length at")
        && (stderr.contains("expected at least 24, got 0") || stderr.contains("wanted 24, got 0"));
    assert!(
        out.status.success() || end_of_wal,
        "pg_waldump {} ({}) on {} segments from {}: {}\n{stderr}",
        install.major,
        rec.wal_compression,
        segments.len(),
        Lsn(rec.start_lsn),
        out.status
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Number of blocks with two or more full-page images in pg_waldump's output.
fn blocks_with_repeated_fpi(dump: &str) -> usize {
    let mut fpis: HashMap<String, usize> = HashMap::new();
    for line in dump.lines().filter(|l| l.contains("FPW")) {
        for blkref in line.split("blkref #").skip(1) {
            let words: Vec<&str> = blkref
                .split(|c: char| c.is_whitespace() || c == ',' || c == ':')
                .filter(|w| !w.is_empty())
                .collect();
            let after = |key: &str| {
                words
                    .iter()
                    .position(|w| *w == key)
                    .map(|i| words.get(i + 1))
            };
            if let (Some(Some(rel)), Some(Some(blk))) = (after("rel"), after("blk")) {
                if words.contains(&"FPW") {
                    *fpis.entry(format!("{rel} {blk}")).or_default() += 1;
                }
            }
        }
    }
    fpis.values().filter(|&&n| n >= 2).count()
}

#[tokio::test]
async fn records_wal_from_every_installed_major() {
    let installs = installed_majors();
    let majors: Vec<u32> = installs.iter().map(|i| i.major).collect();
    let missing: Vec<u32> = (14..=18).filter(|m| !majors.contains(m)).collect();
    assert!(
        missing.is_empty() && majors.len() >= 5,
        "PostgreSQL majors {missing:?} are not installed (found {majors:?}): \
         run scripts/install-pg-majors.sh"
    );
    let started = Instant::now();
    for install in installs
        .iter()
        .filter(|i| PgMajor::from_number(i.major).is_some())
    {
        // One compressed variant per major, rotating through the methods.
        let compressed = match install.major {
            14 => "pglz",
            m if m % 2 == 1 => "lz4",
            _ => "zstd",
        };
        for compression in ["off", compressed] {
            let opts = RecordOpts {
                wal_compression: compression.into(),
                wal_level: "replica".into(),
                seconds: 3,
                scale: 2,
                max_bytes: 1 << 30,
            };
            let t = Instant::now();
            let rec = record_wal(install, &opts)
                .await
                .unwrap_or_else(|e| panic!("PostgreSQL {} {compression}: {e}", install.major));
            assert_eq!(rec.major, install.major);
            assert_eq!(rec.start_lsn % WAL_SEGMENT_SIZE, 0);
            assert_eq!(rec.bytes.len() as u64 % WAL_SEGMENT_SIZE, 0);
            assert!(
                rec.bytes.len() as u64 >= 2 * WAL_SEGMENT_SIZE,
                "{} bytes",
                rec.bytes.len()
            );
            check_pages(&rec);
            let dump = waldump(install, &rec);
            let repeated = blocks_with_repeated_fpi(&dump);
            assert!(
                repeated > 0,
                "PostgreSQL {} {compression}: no block has two full-page images",
                install.major
            );
            eprintln!(
                "PostgreSQL {} wal_compression={compression}: {} MiB from {}, {} blocks \
                 with repeated FPIs, {:.1?}",
                install.major,
                rec.bytes.len() >> 20,
                Lsn(rec.start_lsn),
                repeated,
                t.elapsed()
            );
            // A smaller cap is served from the same recording, cut at a page boundary.
            let small = record_wal(
                install,
                &RecordOpts {
                    max_bytes: 3 * WAL_PAGE_SIZE + 5,
                    ..opts
                },
            )
            .await
            .unwrap();
            assert_eq!(small.bytes[..], rec.bytes[..3 * WAL_PAGE_SIZE]);
        }
    }
    eprintln!("recorded/checked in {:.1?}", started.elapsed());
}
