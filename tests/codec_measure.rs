//! Records WAL of realistic loads for the codec measurement (`wal/examples/walcodec_measure.rs`).
//!
//! Not part of the test suite (ignored): each recording runs a live primary for about three
//! minutes. Run
//!
//! ```sh
//! cargo test -p walrelay --test codec_measure -- --ignored --nocapture
//! MEASURE_RECORD=pg15-pgbench,pg15-updates cargo test ...   # only these
//! MEASURE_SECONDS=60 ...                                     # a shorter load
//! ```
//!
//! Each recording is a fresh primary (checkpoint_timeout 30 s, max_wal_size 4GB, fsync off):
//! the workload is prepared, a CHECKPOINT taken, then the load runs while a second connection
//! samples `pg_current_wal_flush_lsn()` every 20 ms (what a walsender may send, and when).
//! Stored under `<target>/walrec/measure/<name>.wal` (the WAL from the segment holding the
//! load's start up to the last sample) and `<name>.txt` (`key=value` lines, then `t_ms lsn`
//! per sample, t from the load's start). Existing recordings are kept unless
//! `WALRELAY_WALREC_REFRESH=1`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use walrelay_harness::cluster::majors::install_for_major;
use walrelay_harness::cluster::walrec::{cache_dir, WAL_SEGMENT_SIZE};
use walrelay_harness::cluster::{Cluster, PgInstall, PrimaryOpts, TempRoot};
use walrelay_wal::lsn::Lsn;

/// One recording: a workload on a major with primary settings.
struct Spec {
    name: &'static str,
    major: u32,
    wal_compression: &'static str,
    wal_level: &'static str,
    load: Load,
}

#[derive(Clone, Copy, PartialEq)]
enum Load {
    /// pgbench TPC-B, scale 10, 4 clients.
    Pgbench,
    /// 300,000 rows of md5 text, two random rows updated with new md5 text per transaction.
    Updates,
    /// The same with REPLICA IDENTITY FULL (for wal_level = logical).
    UpdatesFull,
    /// 20,000 documents of about 6.6 kB of hex (stored out of line, uncompressed), one random
    /// document per transaction gets 32 characters overwritten: TOAST writes the whole value
    /// again under a new chunk id.
    Toast,
}

const SPECS: &[Spec] = &[
    spec("pg15-pgbench", 15, "off", Load::Pgbench),
    spec("pg15-updates", 15, "off", Load::Updates),
    spec("pg15-pgbench-pglz", 15, "pglz", Load::Pgbench),
    spec("pg15-pgbench-lz4", 15, "lz4", Load::Pgbench),
    spec("pg14-pgbench", 14, "off", Load::Pgbench),
    spec("pg18-pgbench", 18, "off", Load::Pgbench),
    spec("pg14-pgbench-pglz", 14, "on", Load::Pgbench),
    spec("pg15-pgbench-zstd", 15, "zstd", Load::Pgbench),
    spec("pg15-toast", 15, "off", Load::Toast),
    Spec {
        name: "pg15-updates-logical-full",
        major: 15,
        wal_compression: "off",
        wal_level: "logical",
        load: Load::UpdatesFull,
    },
];

const fn spec(name: &'static str, major: u32, wal_compression: &'static str, load: Load) -> Spec {
    Spec {
        name,
        major,
        wal_compression,
        wal_level: "replica",
        load,
    }
}

const UPDATE_ROWS: u32 = 300_000;
const DOCS: u32 = 20_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "records minutes of WAL from live primaries; see the module docs"]
async fn record_measure_wal() {
    let only = std::env::var("MEASURE_RECORD").unwrap_or_default();
    let seconds: u64 = std::env::var("MEASURE_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(170);
    let refresh =
        std::env::var_os("WALRELAY_WALREC_REFRESH").is_some_and(|v| !v.is_empty() && v != "0");
    let dir = cache_dir().join("measure");
    std::fs::create_dir_all(&dir).unwrap();
    for s in SPECS {
        if !only.is_empty() && !only.split(',').any(|n| n == s.name) {
            continue;
        }
        let txt = dir.join(format!("{}.txt", s.name));
        if txt.exists() && !refresh {
            eprintln!("{}: recorded already ({})", s.name, txt.display());
            continue;
        }
        let Some(install) = install_for_major(s.major) else {
            eprintln!(
                "{}: PostgreSQL {} is not installed, skipped",
                s.name, s.major
            );
            continue;
        };
        let t = Instant::now();
        record(&install, s, seconds, &dir).await;
        eprintln!("{}: recorded in {:.0?}", s.name, t.elapsed());
    }
}

async fn run(mut cmd: std::process::Command) {
    cmd.stdin(Stdio::null());
    let out = tokio::process::Command::from(cmd).output().await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn prepare(pg: &Cluster, load: Load) {
    match load {
        Load::Toast => {
            pg.execute(&format!(
                "create table docs (id int primary key, n int not null default 0, body text);
                 alter table docs alter column body set storage external;
                 insert into docs select g, 0, (select string_agg(md5(random()::text || i), ' ')
                   from generate_series(1, 200 + 0 * g) i) from generate_series(1, {DOCS}) g;"
            ))
            .await
            .unwrap();
            pg.execute("vacuum analyze docs").await.unwrap();
        }
        Load::Pgbench => run(pg.pgbench(&["-i", "-s", "10", "-q", "postgres"])).await,
        Load::Updates | Load::UpdatesFull => {
            pg.execute(&format!(
                "create table rnd (id int primary key, payload text);
                 insert into rnd select g, md5(random()::text) || md5(random()::text)
                   from generate_series(1, {UPDATE_ROWS}) g;"
            ))
            .await
            .unwrap();
            pg.execute("vacuum analyze rnd").await.unwrap();
            if load == Load::UpdatesFull {
                pg.execute("alter table rnd replica identity full")
                    .await
                    .unwrap();
            }
        }
    }
}

fn load_cmd(
    pg: &Cluster,
    load: Load,
    seconds: u64,
    dir: &std::path::Path,
) -> std::process::Command {
    let secs = seconds.to_string();
    match load {
        Load::Pgbench => pg.pgbench(&["-n", "-c", "4", "-j", "2", "-T", &secs, "postgres"]),
        Load::Toast => {
            let script = dir.join("toast.sql");
            std::fs::write(
                &script,
                format!(
                    "\\set id random(1, {DOCS})\nupdate docs set n = n + 1, body = \
                     overlay(body placing md5(random()::text) from 1 + (random() * 6000)::int \
                     for 32) where id = :id;\n"
                ),
            )
            .unwrap();
            let f = format!("--file={}", script.display());
            pg.pgbench(&["-n", "-c", "4", "-j", "2", "-T", &secs, &f, "postgres"])
        }
        Load::Updates | Load::UpdatesFull => {
            let script = dir.join("updates.sql");
            let set = "md5(random()::text) || md5(random()::text)";
            std::fs::write(
                &script,
                format!(
                    "\\set a random(1, {UPDATE_ROWS})\n\\set b random(1, {UPDATE_ROWS})\n\
                     BEGIN;\nupdate rnd set payload = {set} where id = :a;\n\
                     update rnd set payload = {set} where id = :b;\nEND;\n"
                ),
            )
            .unwrap();
            let f = format!("--file={}", script.display());
            pg.pgbench(&["-n", "-c", "4", "-j", "2", "-T", &secs, &f, "postgres"])
        }
    }
}

/// The primary's WAL from the start of `load_start`'s segment up to `end`: its start LSN and
/// bytes.
fn read_wal(pg: &Cluster, load_start: u64, end: u64) -> (u64, Vec<u8>) {
    let start = load_start / WAL_SEGMENT_SIZE * WAL_SEGMENT_SIZE;
    let bytes = walrelay_harness::bench::walrange::read_range(&pg.wal_dir(), start, end).unwrap();
    (start, bytes)
}

async fn record(install: &PgInstall, s: &Spec, seconds: u64, dir: &std::path::Path) {
    let root = TempRoot::new().unwrap();
    let opts = PrimaryOpts {
        wal_level: s.wal_level.into(),
        checkpoint_timeout: "30s".into(),
        wal_compression: s.wal_compression.into(),
        extra_conf: vec![("max_wal_size".into(), "4GB".into())],
        ..PrimaryOpts::default()
    };
    let pg = Cluster::init_primary(install, &root, "measure", &opts).unwrap();
    pg.start().await.unwrap();
    pg.create_physical_slot("measure").await.unwrap();
    prepare(&pg, s.load).await;
    pg.execute("CHECKPOINT").await.unwrap();
    let sampler = pg.connect().await.unwrap();
    let lsn = |row: tokio_postgres::Row| -> u64 {
        let text: String = row.get(0);
        text.parse::<Lsn>().unwrap().0
    };
    let q = "select pg_current_wal_flush_lsn()::text";
    let load_start = lsn(sampler.query_one(q, &[]).await.unwrap());
    let script_dir = root.path().to_path_buf();
    let mut child = tokio::process::Command::from(load_cmd(&pg, s.load, seconds, &script_dir))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let mut samples: Vec<(u64, u64)> = vec![(0, load_start)];
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    loop {
        tick.tick().await;
        let at = lsn(sampler.query_one(q, &[]).await.unwrap());
        samples.push((t0.elapsed().as_millis() as u64, at));
        if t0.elapsed() >= Duration::from_secs(seconds) || child.try_wait().unwrap().is_some() {
            break;
        }
    }
    let out = child.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "load: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let end = samples.last().unwrap().1;
    let (start, bytes) = read_wal(&pg, load_start, end);
    let tps = pg
        .query_one_string(
            "select xact_commit::text from pg_stat_database where datname = 'postgres'",
        )
        .await
        .unwrap();
    pg.stop().await.unwrap();
    let mut meta = format!(
        "name={}\nmajor={}\nwal_compression={}\nwal_level={}\nstart_lsn={start}\n\
         load_start_lsn={load_start}\nend_lsn={end}\nseconds={seconds}\nxact_commit={tps}\n\
         samples:\n",
        s.name, s.major, s.wal_compression, s.wal_level
    );
    for (t, l) in &samples {
        meta.push_str(&format!("{t} {l}\n"));
    }
    let wal: PathBuf = dir.join(format!("{}.wal", s.name));
    std::fs::write(&wal, &bytes).unwrap();
    std::fs::write(dir.join(format!("{}.txt", s.name)), meta).unwrap();
    eprintln!(
        "{}: {} MB of WAL from {} (load from {}), {} samples",
        s.name,
        bytes.len() >> 20,
        Lsn(start),
        Lsn(load_start),
        samples.len()
    );
}
