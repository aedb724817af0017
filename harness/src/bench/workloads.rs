//! The bench workloads: schema and data prepared before the measurement, then the load that
//! runs on the primary while WAL streams through the relays.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::cluster::walrec::supported_wal_compressions;
use crate::cluster::Cluster;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(into = "&'static str")]
pub enum Workload {
    /// pgbench TPC-B, scale 10, 4 clients.
    Pgbench,
    /// The same with `wal_compression = lz4` on the primary (PostgreSQL 15+).
    PgbenchLz4,
    /// The same with `wal_compression = pglz` (`on` before 15).
    PgbenchPglz,
    /// The same with `wal_compression = zstd` (PostgreSQL 15+).
    PgbenchZstd,
    /// pgbench at a low commit rate (`-R 300`, 4 clients): per-message cost dominates.
    PgbenchR300,
    /// pgbench with 16 clients.
    PgbenchC16,
    /// Random-payload updates: 300k rows of md5 text, 2 updates per transaction, 4 clients.
    Updates,
    /// Bulk loading in cycles: INSERT ... SELECT and COPY batches, CREATE INDEX, DROP.
    Bulk,
    /// Updates of one small column of wide random rows on full pages (fillfactor 100): the
    /// new versions move to other pages, so PostgreSQL logs them whole.
    Moves,
    /// The same updates on pages with room (HOT), `wal_level = logical`: new tuples logged
    /// whole (no prefix/suffix cut), also when the page gets an image.
    Logical,
    /// As `Logical` with `REPLICA IDENTITY FULL`: the whole old tuple is logged too.
    LogicalFull,
    /// TOAST rewrites: 20,000 documents of about 6.6 kB of md5 hex stored out of line; each
    /// transaction overwrites 32 characters of a random one, which TOAST writes whole again
    /// under a new chunk id (4 clients).
    Toast,
}

impl From<Workload> for &'static str {
    fn from(w: Workload) -> &'static str {
        w.name()
    }
}

const PGBENCH_TABLES: &[&str] = &[
    "pgbench_accounts",
    "pgbench_branches",
    "pgbench_tellers",
    "pgbench_history",
];

impl Workload {
    pub const ALL: [Workload; 12] = [
        Workload::Pgbench,
        Workload::PgbenchR300,
        Workload::PgbenchC16,
        Workload::Updates,
        Workload::Bulk,
        Workload::PgbenchLz4,
        Workload::PgbenchPglz,
        Workload::PgbenchZstd,
        Workload::Moves,
        Workload::Logical,
        Workload::LogicalFull,
        Workload::Toast,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Pgbench => "pgbench",
            Workload::PgbenchLz4 => "pgbench-lz4",
            Workload::PgbenchPglz => "pgbench-pglz",
            Workload::PgbenchZstd => "pgbench-zstd",
            Workload::PgbenchR300 => "pgbench-r300",
            Workload::PgbenchC16 => "pgbench-c16",
            Workload::Updates => "updates",
            Workload::Bulk => "bulk",
            Workload::Moves => "moves",
            Workload::Logical => "logical",
            Workload::LogicalFull => "logical-full",
            Workload::Toast => "toast",
        }
    }

    pub fn from_name(s: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name() == s)
    }

    /// Every workload name, comma-separated (for error messages).
    pub fn names() -> String {
        Workload::ALL.map(Workload::name).join(", ")
    }

    pub fn wal_level(self) -> &'static str {
        match self {
            Workload::Logical | Workload::LogicalFull => "logical",
            _ => "replica",
        }
    }

    /// The primary's `wal_compression` method (`pglz`, `lz4`, `zstd` or `off`).
    pub fn wal_compression(self) -> &'static str {
        match self {
            Workload::PgbenchLz4 => "lz4",
            Workload::PgbenchPglz => "pglz",
            Workload::PgbenchZstd => "zstd",
            _ => "off",
        }
    }

    /// The `wal_compression` setting for `major`, or None if that major lacks the method.
    pub fn wal_compression_setting(self, major: u32) -> Option<&'static str> {
        let m = self.wal_compression();
        if !supported_wal_compressions(major).contains(&m) {
            return None;
        }
        Some(if m == "pglz" && major < 15 { "on" } else { m })
    }

    /// Whether this is TPC-B on pgbench's tables (the sync-latency measurement needs them).
    pub fn is_pgbench(self) -> bool {
        PGBENCH_TABLES == self.tables()
    }

    /// Tables whose contents are compared between the primary and the standbys.
    pub fn tables(self) -> &'static [&'static str] {
        match self {
            Workload::Updates => &["updates"],
            Workload::Bulk => &["bulk"],
            Workload::Moves | Workload::Logical | Workload::LogicalFull => &["movers"],
            Workload::Toast => &["docs"],
            _ => PGBENCH_TABLES,
        }
    }

    /// Free disk a run of `secs` seconds of load needs where its temporary directory is, in
    /// GB: the primary's `pg_wal` (up to `max_wal_size` + `wal_keep_size`), the three standbys'
    /// and the two spools' copies of the WAL, the windows' WAL copied out. A 160 s `bulk` run's
    /// directory reached 34 GB on 2026-11-24 (PG 15); as the relays got faster the load wrote
    /// more WAL per second, and on 2026-11-26 a 130 s run's reached 47.4 GB (sampled every 2 s,
    /// ~0.36 GB per second of load, the peak while the windows' WAL was copied out) and a 160 s
    /// one failed with 54 GB free. A faster machine writes more: this asks 0.4 GB a second.
    /// TPC-B and the update workloads write about a tenth of bulk's WAL, `toast` about half
    /// (2.8 GB in a minute, recorded at full speed on 2026-11-27).
    pub fn disk_needed_gb(self, secs: u64) -> u64 {
        match self {
            Workload::Bulk => 1 + secs * 2 / 5,
            Workload::Toast => 1 + secs / 5,
            _ => 1 + secs / 20,
        }
    }

    /// Schema and initial data (before the standbys are copied; not measured).
    pub async fn prepare(self, p: &Cluster) -> Result<()> {
        let sql = match self {
            Workload::Updates => {
                "create table updates (id int primary key, payload text);
                 insert into updates select g, md5(random()::text) from generate_series(1, 300000) g"
                    .to_string()
            }
            Workload::Bulk => "create table bulk (id bigint, k text, v text)".to_string(),
            Workload::Toast => {
                "create table docs (id int primary key, n int not null default 0, body text);
                 alter table docs alter column body set storage external;
                 insert into docs select g, 0, (select string_agg(md5(random()::text || i), ' ') from generate_series(1, 200 + 0 * g) i) from generate_series(1, 20000) g"
                    .to_string()
            }
            Workload::Moves | Workload::Logical | Workload::LogicalFull => {
                let ff = if self == Workload::Moves { 100 } else { 85 };
                let identity = if self == Workload::LogicalFull {
                    "alter table movers replica identity full;"
                } else {
                    ""
                };
                format!(
                    "create table movers (id int primary key, n int not null default 0, payload text) with (fillfactor = {ff});
                     insert into movers select g, 0, (select string_agg(md5(random()::text || i), '') from generate_series(1, 12 + 0 * g) i) from generate_series(1, 40000) g;
                     {identity}"
                )
            }
            _ => {
                let out = tokio::process::Command::from(p.pgbench(&[
                    "-i", "-s", "10", "-q", "postgres",
                ]))
                .kill_on_drop(true)
                .output()
                .await
                .context("running pgbench -i")?;
                anyhow::ensure!(
                    out.status.success(),
                    "pgbench -i -s 10 failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                return Ok(());
            }
        };
        p.execute(&sql)
            .await
            .with_context(|| format!("preparing the {} tables", self.name()))?;
        // VACUUM cannot run in the implicit transaction of a multi-statement batch.
        for t in self.tables() {
            p.execute(&format!("vacuum analyze {t}")).await?;
        }
        Ok(())
    }

    /// Starts the measured load for `seconds`; pgbench's output goes to files in `dir`.
    pub async fn load(self, p: &Cluster, dir: &Path, seconds: u64) -> Result<Load> {
        let secs = seconds.to_string();
        let args: Vec<String> = match self {
            Workload::Bulk => return bulk(p, seconds).await,
            Workload::PgbenchR300 => pgbench_args(&["-c", "4", "-R", "300"], &secs),
            Workload::PgbenchC16 => pgbench_args(&["-c", "16"], &secs),
            Workload::Updates => {
                let script = write_script(
                    dir,
                    "updates.sql",
                    "\\set id1 random(1, 300000)\n\\set id2 random(1, 300000)\nbegin;\n\
                     update updates set payload = md5(random()::text) where id = :id1;\n\
                     update updates set payload = md5(random()::text) where id = :id2;\nend;\n",
                )?;
                pgbench_args(&["-n", "-c", "4", &script], &secs)
            }
            Workload::Moves | Workload::Logical | Workload::LogicalFull => {
                let script = write_script(
                    dir,
                    "moves.sql",
                    "\\set id random(1, 40000)\nupdate movers set n = n + 1 where id = :id;\n",
                )?;
                pgbench_args(&["-n", "-c", "4", &script], &secs)
            }
            Workload::Toast => {
                let script = write_script(
                    dir,
                    "toast.sql",
                    "\\set id random(1, 20000)\nupdate docs set n = n + 1, body = overlay(body \
                     placing md5(random()::text) from 1 + (random() * 6000)::int for 32) \
                     where id = :id;\n",
                )?;
                pgbench_args(&["-n", "-c", "4", &script], &secs)
            }
            _ => pgbench_args(&["-c", "4"], &secs),
        };
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (stdout, stderr) = (dir.join("load.out"), dir.join("load.err"));
        let file = |p: &Path| {
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))
        };
        let child = Box::new(
            tokio::process::Command::from(p.pgbench(&args))
                .kill_on_drop(true)
                .stdin(Stdio::null())
                .stdout(file(&stdout)?)
                .stderr(file(&stderr)?)
                .spawn()
                .context("starting pgbench")?,
        );
        Ok(Load::Pgbench {
            child,
            stdout,
            stderr,
        })
    }
}

/// `-j 2 -T secs`, then `extra`, then the database name.
fn pgbench_args(extra: &[&str], secs: &str) -> Vec<String> {
    let mut v: Vec<String> = vec!["-j".into(), "2".into(), "-T".into(), secs.into()];
    v.extend(extra.iter().map(|a| a.to_string()));
    v.push("postgres".into());
    v
}

/// Writes a pgbench script to `dir`; returns the `--file=PATH` argument.
fn write_script(dir: &Path, name: &str, text: &str) -> Result<String> {
    let path = dir.join(name);
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(format!("--file={}", path.display()))
}

/// Cycles of 20 s for `seconds`: for 13 s, batches of 20,000 rows loaded in turn by
/// `INSERT ... SELECT` (heap INSERT records) and by `COPY ... FROM STDIN` (MULTI_INSERT
/// records, as a data load writes them), then two CREATE INDEX (full-page images of new index
/// pages), then the table is emptied (indexes dropped, TRUNCATE) for the next cycle.
async fn bulk(p: &Cluster, seconds: u64) -> Result<Load> {
    let client = p.connect().await?;
    let until = Instant::now() + Duration::from_secs(seconds);
    Ok(Load::Task(tokio::spawn(async move {
        let mut n: i64 = 0;
        let mut rows = String::new();
        while Instant::now() < until {
            let cycle_end = (Instant::now() + Duration::from_secs(13)).min(until);
            while Instant::now() < cycle_end {
                if (n / BULK_BATCH) % 2 == 0 {
                    client
                        .batch_execute(&format!(
                            "insert into bulk select g, md5(g::text), repeat(md5(random()::text), 4) from generate_series({n}, {}) g",
                            n + BULK_BATCH - 1
                        ))
                        .await?;
                } else {
                    copy_rows(&client, n, &mut rows).await?;
                }
                n += BULK_BATCH;
            }
            if Instant::now() >= until {
                break;
            }
            client
                .batch_execute(
                    "create index bulk_k on bulk (k); create index bulk_v on bulk (v);
                     drop index bulk_k; drop index bulk_v; truncate bulk",
                )
                .await?;
        }
        Ok(())
    })))
}

/// Rows per `bulk` batch.
const BULK_BATCH: i64 = 20_000;

/// `COPY bulk FROM STDIN` of rows `from..from + BULK_BATCH` shaped like the `INSERT`
/// batches' (a 32-digit hex key, 4 × one random 32-digit hex value), made here from xxh3 of
/// the row number (the key) and of the row number with a random seed (the value); `buf` is
/// scratch.
async fn copy_rows(
    client: &tokio_postgres::Client,
    from: i64,
    buf: &mut String,
) -> Result<(), tokio_postgres::Error> {
    use futures::SinkExt;
    use std::fmt::Write;
    use twox_hash::XxHash3_128;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    buf.clear();
    for g in from..from + BULK_BATCH {
        let k = XxHash3_128::oneshot_with_seed(0, &g.to_le_bytes());
        let v = format!(
            "{:032x}",
            XxHash3_128::oneshot_with_seed(seed, &g.to_le_bytes())
        );
        // Writing to a String cannot fail.
        let _ = writeln!(buf, "{g}\t{k:032x}\t{v}{v}{v}{v}");
    }
    let sink = client.copy_in("copy bulk from stdin").await?;
    let mut sink = std::pin::pin!(sink);
    sink.send(bytes::Bytes::copy_from_slice(buf.as_bytes()))
        .await?;
    sink.as_mut().finish().await?;
    Ok(())
}

/// A running load.
pub enum Load {
    Pgbench {
        child: Box<tokio::process::Child>,
        stdout: PathBuf,
        stderr: PathBuf,
    },
    Task(tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>),
}

impl Load {
    /// Waits for the load to end; Err (with pgbench's messages) if it failed.
    pub async fn wait(&mut self) -> Result<()> {
        match self {
            Load::Pgbench { child, stderr, .. } => {
                let status = child.wait().await.context("waiting for pgbench")?;
                anyhow::ensure!(
                    status.success(),
                    "pgbench exited with {status}: {}",
                    std::fs::read_to_string(stderr).unwrap_or_default().trim()
                );
            }
            Load::Task(t) => t.await.context("the bulk load task")??,
        }
        Ok(())
    }

    /// Transactions per second pgbench reported (None for the bulk load).
    pub fn tps(&self) -> Option<f64> {
        let Load::Pgbench { stdout, .. } = self else {
            return None;
        };
        let out = std::fs::read_to_string(stdout).ok()?;
        out.lines()
            .find_map(|l| l.strip_prefix("tps = "))
            .and_then(|v| v.split(' ').next())
            .and_then(|v| v.parse().ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{PgInstall, PrimaryOpts, TempRoot};

    /// A primary (in the returned directory) that ran two seconds of `w` after its `prepare`.
    async fn loaded(w: Workload) -> (TempRoot, Cluster) {
        let install =
            PgInstall::discover().expect("PostgreSQL binaries (see scripts/install-deps.sh)");
        let root = TempRoot::new().unwrap();
        let p = Cluster::init_primary(&install, &root, w.name(), &PrimaryOpts::default()).unwrap();
        p.start().await.unwrap();
        w.prepare(&p).await.unwrap();
        let mut load = w.load(&p, root.path(), 2).await.unwrap();
        load.wait().await.unwrap();
        (root, p)
    }

    /// A few seconds of `bulk` on a real primary load rows both ways, shaped alike.
    #[tokio::test]
    async fn bulk_loads_rows_by_insert_and_by_copy() {
        let (_root, p) = loaded(Workload::Bulk).await;
        let count = |cond: &'static str| {
            let p = &p;
            async move {
                let sql = format!("select count(*) from bulk where {cond}");
                p.query_one_string(&sql)
                    .await
                    .unwrap()
                    .parse::<u64>()
                    .unwrap()
            }
        };
        let shaped = "length(k) = 32 and length(v) = 128 and v = repeat(left(v, 32), 4)";
        let inserted = count("k = md5(id::text)").await;
        let copied = count("k <> md5(id::text)").await;
        assert!(
            inserted >= 20_000 && copied >= 20_000,
            "{inserted} inserted, {copied} copied"
        );
        assert_eq!(
            count(shaped).await,
            inserted + copied,
            "every row has the same shape"
        );
        assert_eq!(count("true").await, inserted + copied);
    }

    /// A few seconds of `toast` on a real primary rewrite documents stored out of line: the
    /// TOAST table holds their chunks, and the documents keep their shape.
    #[tokio::test]
    async fn toast_rewrites_documents_stored_out_of_line() {
        let (_root, p) = loaded(Workload::Toast).await;
        let one = |sql: &'static str| {
            let p = &p;
            async move { p.query_one_string(sql).await.unwrap() }
        };
        let updates: u64 = one("select sum(n) from docs").await.parse().unwrap();
        assert!(updates > 0, "no document was rewritten");
        assert_eq!(
            one("select count(*) from docs where length(body) = 6599").await,
            "20000"
        );
        let toast: u64 =
            one("select pg_relation_size(reltoastrelid) from pg_class where relname = 'docs'")
                .await
                .parse()
                .unwrap();
        assert!(toast > 20_000 * 6_599, "TOAST table of {toast} bytes");
    }

    #[test]
    fn disk_needed_covers_the_measured_bulk_run_and_spares_short_ones() {
        // Default windows: 30 + 90 + 40 s, which failed with 54 GB free; 30 + 60 + 40 s
        // reached 47.4 GB.
        assert!(Workload::Bulk.disk_needed_gb(160) > 54);
        assert!(Workload::Bulk.disk_needed_gb(130) >= 50);
        assert!(Workload::Pgbench.disk_needed_gb(160) >= 4);
        // The test suite's few-second run must not ask a CI machine for gigabytes it never uses.
        for w in Workload::ALL {
            assert!(w.disk_needed_gb(9) <= 4, "{}", w.name());
        }
    }
}
