//! Real WAL recorded from real clusters, for round-trip tests of WAL codecs.
//!
//! [`record_wal`] runs a throw-away primary through a pgbench workload with checkpoints (so
//! full-page images of the same blocks appear more than once) and random-payload updates, and
//! returns the WAL segment files it wrote, byte for byte. Recordings are cached under
//! `<target dir>/walrec/` (see [`cache_dir`]), so repeated test runs do not start PostgreSQL;
//! set `WALRELAY_WALREC_REFRESH=1` to record afresh.

use std::hash::Hasher as _;
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
    let mut hasher = twox_hash::XxHash3_64::new();
    for page in bytes.chunks(WAL_PAGE_SIZE) {
        hasher.write(&page[..page.len().min(64)]);
    }
    hasher.finish()
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
mod tests;
