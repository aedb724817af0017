//! Real WAL recorded from real clusters, for round-trip tests of WAL codecs.
//!
//! [`record_wal`] runs a throw-away primary through a pgbench workload with checkpoints (so
//! full-page images of the same blocks appear more than once) and random-payload updates, and
//! returns the WAL segment files it wrote, byte for byte. Recordings are cached under
//! `<target dir>/walrec/` (see [`cache_dir`]), so repeated test runs do not start PostgreSQL;
//! set `WALRELAY_WALREC_REFRESH=1` to record afresh.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{run_async, Cluster, ClusterError, PgInstall, PrimaryOpts, TempRoot};
use walrelay_wal::lsn::{Lsn, TimeLineId};
use walrelay_wal::segment::WalSegSize;
use walrelay_wal::walcodec::wal::WAL_PAGE;

/// WAL segment size of the recorded clusters (initdb's default).
pub const WAL_SEGMENT_SIZE: u64 = WalSegSize::DEFAULT.bytes();
/// WAL page size (XLOG_BLCKSZ) of standard builds.
pub const WAL_PAGE_SIZE: usize = WAL_PAGE as usize;

/// What to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordOpts {
    /// `off`, `pglz`, `lz4` or `zstd`; see [`supported_wal_compressions`]. On PostgreSQL 14,
    /// where the setting is a boolean, `pglz` is set as `on` (which is pglz).
    pub wal_compression: String,
    /// `replica` or `logical`.
    pub wal_level: String,
    /// How long `pgbench -T` runs.
    pub seconds: u64,
    /// `pgbench -i -s` scale; the random-payload table gets 10,000 rows per unit.
    pub scale: u32,
    /// Upper bound on [`RecordedWal::bytes`], rounded down to a whole WAL page.
    pub max_bytes: usize,
}

impl Default for RecordOpts {
    fn default() -> Self {
        RecordOpts {
            wal_compression: "off".into(),
            wal_level: "replica".into(),
            seconds: 5,
            scale: 5,
            max_bytes: 256 * 1024 * 1024,
        }
    }
}

/// Contiguous WAL of timeline 1 as it lies in the segment files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedWal {
    pub major: u32,
    /// LSN of `bytes[0]`: a segment boundary (so the first page has a long header).
    pub start_lsn: u64,
    /// Whole segments (unless cut short by `max_bytes`, then whole pages).
    pub bytes: Vec<u8>,
    pub wal_compression: String,
}

impl RecordedWal {
    /// LSN just past the last byte.
    pub fn end_lsn(&self) -> u64 {
        self.start_lsn + self.bytes.len() as u64
    }

    /// `(file name, contents)` of each segment, the last one partial if `max_bytes` cut it.
    pub fn segments(&self) -> Vec<(String, &[u8])> {
        self.bytes
            .chunks(WAL_SEGMENT_SIZE as usize)
            .enumerate()
            .map(|(i, chunk)| {
                let segno = self.start_lsn / WAL_SEGMENT_SIZE + i as u64;
                (segment_file_name(1, segno), chunk)
            })
            .collect()
    }
}

/// `wal_compression` methods a major accepts (`pglz` meaning `on` before 15).
pub fn supported_wal_compressions(major: u32) -> &'static [&'static str] {
    if major >= 15 {
        &["off", "pglz", "lz4", "zstd"]
    } else {
        &["off", "pglz"]
    }
}

/// WAL segment file name, e.g. `000000010000000000000003`, for 16 MiB segments.
pub fn segment_file_name(timeline: u32, segno: u64) -> String {
    WalSegSize::DEFAULT.file_name(TimeLineId(timeline), segno)
}

/// Records WAL with `opts` from a new cluster of `install`, or returns the cached recording.
pub async fn record_wal(
    install: &PgInstall,
    opts: &RecordOpts,
) -> Result<RecordedWal, ClusterError> {
    let server_compression = server_wal_compression(install.major, &opts.wal_compression)?;
    let cap = opts.max_bytes / WAL_PAGE_SIZE * WAL_PAGE_SIZE;
    if cap == 0 {
        return Err(ClusterError::Other(format!(
            "max_bytes {} is less than one WAL page",
            opts.max_bytes
        )));
    }
    let dir = cache_dir();
    let stem = cache_stem(install.major, opts);
    let refresh =
        std::env::var_os("WALRELAY_WALREC_REFRESH").is_some_and(|v| !v.is_empty() && v != "0");
    if !refresh {
        if let Some(mut cached) = load_cached(&dir, &stem, cap) {
            cached.bytes.truncate(cap);
            return Ok(RecordedWal {
                major: install.major,
                start_lsn: cached.start_lsn,
                bytes: cached.bytes,
                wal_compression: opts.wal_compression.clone(),
            });
        }
    }
    let rec = record_fresh(install, opts, &server_compression, cap).await?;
    if let Err(e) = store_cached(&dir, &stem, &rec) {
        tracing::warn!(dir = %dir.display(), "could not cache recorded WAL: {e}");
    }
    Ok(RecordedWal {
        major: install.major,
        start_lsn: rec.start_lsn,
        bytes: rec.bytes,
        wal_compression: opts.wal_compression.clone(),
    })
}

/// The value to put in postgresql.conf for a requested method.
fn server_wal_compression(major: u32, requested: &str) -> Result<String, ClusterError> {
    if !supported_wal_compressions(major).contains(&requested) {
        return Err(ClusterError::Other(format!(
            "wal_compression {requested:?} is not supported by PostgreSQL {major} (supported: {})",
            supported_wal_compressions(major).join(", ")
        )));
    }
    Ok(if major < 15 && requested == "pglz" {
        "on".to_string()
    } else {
        requested.to_string()
    })
}

/// A fresh recording and what the cache needs to know about it.
struct Recording {
    start_lsn: u64,
    bytes: Vec<u8>,
    /// Whether `max_bytes` cut it short (a larger request must then record again).
    capped: bool,
    version: String,
}

async fn record_fresh(
    install: &PgInstall,
    opts: &RecordOpts,
    server_compression: &str,
    cap: usize,
) -> Result<Recording, ClusterError> {
    let root = TempRoot::new()?;
    let popts = PrimaryOpts {
        wal_level: opts.wal_level.clone(),
        checkpoint_timeout: "30s".into(),
        wal_compression: server_compression.to_string(),
        ..PrimaryOpts::default()
    };
    let pg = Cluster::init_primary(install, &root, "walrec", &popts)?;
    pg.start().await?;
    let version = pg.query_one_string("SELECT version()").await?;
    let seg_size = pg
        .query_one_string("SELECT setting FROM pg_settings WHERE name = 'wal_segment_size'")
        .await?;
    let page_size = pg.query_one_string("SHOW wal_block_size").await?;
    if seg_size != WAL_SEGMENT_SIZE.to_string() || page_size != WAL_PAGE_SIZE.to_string() {
        return Err(ClusterError::Other(format!(
            "{version}: wal_segment_size {seg_size}, wal_block_size {page_size}; \
             expected {WAL_SEGMENT_SIZE} and {WAL_PAGE_SIZE}"
        )));
    }
    // The slot keeps every segment from here on, however much WAL the workload writes.
    pg.create_physical_slot("walrec").await?;
    let start = query_lsn(&pg, "SELECT pg_current_wal_insert_lsn()").await?;
    run_workload(&pg, opts).await?;
    pg.execute("SELECT pg_switch_wal()").await?;
    // Segments wholly before the flush position are complete on disk.
    let flushed = query_lsn(&pg, "SELECT pg_current_wal_flush_lsn()").await?;
    let (bytes, capped) = read_segments(&pg, start, flushed, cap)?;
    pg.stop().await?;
    Ok(Recording {
        start_lsn: start / WAL_SEGMENT_SIZE * WAL_SEGMENT_SIZE,
        bytes,
        capped,
        version,
    })
}

/// The recording's load: a table of md5 rows and pgbench's, then pgbench for
/// `opts.seconds` with two rounds of updates to a seventh of the rows, a checkpoint between.
async fn run_workload(pg: &Cluster, opts: &RecordOpts) -> Result<(), ClusterError> {
    let rows = 10_000 * u64::from(opts.scale.max(1));
    pg.execute(&format!(
        "CREATE TABLE r (id int PRIMARY KEY, v text); \
         INSERT INTO r SELECT g, md5(random()::text) || md5(random()::text) \
         FROM generate_series(1, {rows}) g"
    ))
    .await?;
    let scale = opts.scale.max(1).to_string();
    run_async(pg.pgbench(&["-i", "-q", "-s", &scale, "postgres"])).await?;
    // After a checkpoint the first change to each page logs a full-page image; the second
    // checkpoint mid-run makes the same blocks log one again.
    pg.execute("CHECKPOINT").await?;
    let seconds = opts.seconds.max(1);
    let bench_started = Instant::now();
    let bench = tokio::spawn(run_async(pg.pgbench(&[
        "-T",
        &seconds.to_string(),
        "-c",
        "2",
        "postgres",
    ])));
    const UPDATE: &str = "UPDATE r SET v = md5(random()::text) || md5(random()::text) \
                          WHERE id % 7 = 0";
    pg.execute(UPDATE).await?;
    let middle = bench_started + Duration::from_millis(seconds * 500);
    tokio::time::sleep_until(middle.into()).await;
    pg.execute("CHECKPOINT").await?;
    pg.execute(UPDATE).await?;
    bench
        .await
        .map_err(|e| ClusterError::Other(format!("pgbench task: {e}")))??;
    Ok(())
}

/// The complete segments from the one holding `start` up to the one holding `flushed`, at
/// most `cap` bytes of them (the bool: whether the cap cut them).
fn read_segments(
    pg: &Cluster,
    start: u64,
    flushed: u64,
    cap: usize,
) -> Result<(Vec<u8>, bool), ClusterError> {
    let first_seg = start / WAL_SEGMENT_SIZE;
    let end_seg = flushed / WAL_SEGMENT_SIZE;
    if end_seg <= first_seg {
        return Err(ClusterError::Other(format!(
            "no complete WAL segment between {} and {}",
            Lsn(start),
            Lsn(flushed)
        )));
    }
    let wal_dir = pg.wal_dir();
    let mut bytes = Vec::new();
    let mut capped = false;
    for segno in first_seg..end_seg {
        if bytes.len() >= cap {
            capped = true;
            break;
        }
        let path = wal_dir.join(segment_file_name(1, segno));
        let data = std::fs::read(&path)
            .map_err(|e| ClusterError::io(format!("reading {}", path.display()), e))?;
        if data.len() as u64 != WAL_SEGMENT_SIZE {
            return Err(ClusterError::Other(format!(
                "{} has {} bytes, expected {WAL_SEGMENT_SIZE}",
                path.display(),
                data.len()
            )));
        }
        bytes.extend_from_slice(&data);
    }
    if bytes.len() > cap {
        bytes.truncate(cap);
        capped = true;
    }
    Ok((bytes, capped))
}

async fn query_lsn(pg: &Cluster, sql: &str) -> Result<u64, ClusterError> {
    let text = pg.query_one_string(sql).await?;
    text.parse::<Lsn>()
        .map(|l| l.0)
        .map_err(|e| ClusterError::Other(format!("{sql:?} returned {text:?}: {e:?}")))
}

/// `<target dir>/walrec`: the target dir is `$CARGO_TARGET_DIR` (relative to the workspace
/// root if relative), else `target/` in the workspace root, found by walking up from
/// `CARGO_MANIFEST_DIR` to the directory whose Cargo.toml has `[workspace]`.
pub fn cache_dir() -> PathBuf {
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let workspace = manifest_dir
        .ancestors()
        .find(|d| {
            std::fs::read_to_string(d.join("Cargo.toml"))
                .is_ok_and(|t| t.lines().any(|l| l.trim() == "[workspace]"))
        })
        .unwrap_or(&manifest_dir)
        .to_path_buf();
    let target = match std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        Some(d) => workspace.join(d), // an absolute `d` replaces `workspace`
        None => workspace.join("target"),
    };
    target.join("walrec")
}

/// File stem keyed by everything that shapes a recording except `max_bytes` (a recording cut
/// short is re-made when more is asked for).
fn cache_stem(major: u32, opts: &RecordOpts) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect()
    };
    format!(
        "{major}-{}-{}-s{}-t{}",
        clean(&opts.wal_compression),
        clean(&opts.wal_level),
        opts.scale.max(1),
        opts.seconds.max(1)
    )
}

/// The cached recording `<stem>.wal` with its `<stem>.txt`, if both are there, agree (length
/// and hash) and hold at least `cap` bytes or all there was.
fn load_cached(dir: &Path, stem: &str, cap: usize) -> Option<Recording> {
    let meta = std::fs::read_to_string(dir.join(format!("{stem}.txt"))).ok()?;
    let field = |name: &str| {
        meta.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
            .map(str::trim)
    };
    let start_lsn: u64 = field("start_lsn_bytes")?.parse().ok()?;
    let len: usize = field("len")?.parse().ok()?;
    let hash = u64::from_str_radix(field("digest")?, 16).ok()?;
    let capped: bool = field("capped")?.parse().ok()?;
    let version = field("version").unwrap_or_default().to_string();
    if capped && len < cap {
        return None;
    }
    let bytes = std::fs::read(dir.join(format!("{stem}.wal"))).ok()?;
    if bytes.len() != len || page_header_digest(&bytes) != hash {
        return None;
    }
    (WalSegSize::DEFAULT.offset_in_segment(Lsn(start_lsn)) == 0).then_some(Recording {
        start_lsn,
        bytes,
        capped,
        version,
    })
}

/// Hash of the first 64 bytes of every page: it covers each segment's long header, whose
/// system identifier is unique to the cluster that wrote it, so a `.txt` never passes for
/// another run's `.wal`. (Hashing all of it costs seconds in unoptimised test builds.)
fn page_header_digest(bytes: &[u8]) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for page in bytes.chunks(WAL_PAGE_SIZE) {
        hasher.update(&page[..page.len().min(64)]);
    }
    hasher.digest()
}

/// Writes `<stem>.wal` and `<stem>.txt` (each via a temporary file and rename, so concurrent
/// runs never see a torn file; a mismatched pair fails the hash check in [`load_cached`]).
fn store_cached(dir: &Path, stem: &str, rec: &Recording) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let meta = format!(
        "start_lsn={}\nstart_lsn_bytes={}\nlen={}\ndigest={:016x}\ncapped={}\nversion={}\n",
        Lsn(rec.start_lsn),
        rec.start_lsn,
        rec.bytes.len(),
        page_header_digest(&rec.bytes),
        rec.capped,
        rec.version.replace('\n', " ")
    );
    for (ext, data) in [("wal", &rec.bytes[..]), ("txt", meta.as_bytes())] {
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        std::io::Write::write_all(&mut tmp, data)?;
        tmp.persist(dir.join(format!("{stem}.{ext}")))
            .map_err(|e| e.error)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
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
            && (stderr.contains("expected at least 24, got 0")
                || stderr.contains("wanted 24, got 0"));
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
}
