//! The bench workloads: what runs on the primary while WAL streams through the relay.

use anyhow::Result;
use std::process::Stdio;

use walrelay_harness::cluster::Cluster;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// pgbench TPC-B, scale 10, 4 clients.
    Pgbench,
    /// The same with `wal_compression = lz4` on the primary.
    PgbenchLz4,
    /// The same with `wal_compression = pglz` on the primary.
    PgbenchPglz,
    /// The same with `wal_compression = zstd` on the primary.
    PgbenchZstd,
    /// Updates of wide rows with random (hex) payload.
    Updates,
    /// A bulk load: INSERT ... SELECT, then CREATE INDEX.
    Bulk,
    /// Updates of one small column of wide random rows on full pages (fillfactor 100): the
    /// new versions move to other pages, so PostgreSQL logs them whole.
    Moves,
    /// The same updates on pages with room (HOT), `wal_level = logical`: new tuples logged
    /// whole (no prefix/suffix cut), also when the page gets an image.
    Logical,
    /// As `Logical` with `REPLICA IDENTITY FULL`: the whole old tuple is logged too.
    LogicalFull,
}

impl Workload {
    pub const ALL: [Workload; 9] = [
        Workload::Pgbench,
        Workload::Updates,
        Workload::Bulk,
        Workload::PgbenchLz4,
        Workload::PgbenchPglz,
        Workload::PgbenchZstd,
        Workload::Moves,
        Workload::Logical,
        Workload::LogicalFull,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Pgbench => "pgbench",
            Workload::PgbenchLz4 => "pgbench-lz4",
            Workload::PgbenchPglz => "pgbench-pglz",
            Workload::PgbenchZstd => "pgbench-zstd",
            Workload::Updates => "updates",
            Workload::Bulk => "bulk",
            Workload::Moves => "moves",
            Workload::Logical => "logical",
            Workload::LogicalFull => "logical-full",
        }
    }

    pub fn wal_level(self) -> &'static str {
        match self {
            Workload::Logical | Workload::LogicalFull => "logical",
            _ => "replica",
        }
    }

    pub fn from_name(s: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name() == s)
    }

    pub fn wal_compression(self) -> &'static str {
        match self {
            Workload::PgbenchLz4 => "lz4",
            Workload::PgbenchPglz => "pglz",
            Workload::PgbenchZstd => "zstd",
            _ => "off",
        }
    }

    /// Schema and initial data (not measured).
    pub async fn prepare(self, p: &Cluster) -> Result<()> {
        match self {
            Workload::Pgbench
            | Workload::PgbenchLz4
            | Workload::PgbenchPglz
            | Workload::PgbenchZstd => {
                let out =
                    tokio::process::Command::from(p.pgbench(&["-i", "-s", "10", "-q", "postgres"]))
                        .output()
                        .await?;
                anyhow::ensure!(
                    out.status.success(),
                    "pgbench -i: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Workload::Updates => {
                p.execute(
                    "create table wide (id int primary key, payload text) with (fillfactor = 90);
                     insert into wide select g, (select string_agg(md5(random()::text || i), '') from generate_series(1, 12 + 0 * g) i) from generate_series(1, 40000) g",
                )
                .await?;
                p.execute("vacuum analyze wide").await?;
            }
            Workload::Bulk => {
                p.execute("create table bulk (id bigint, k text, v text)")
                    .await?
            }
            Workload::Moves | Workload::Logical | Workload::LogicalFull => {
                let ff = if self == Workload::Moves { 100 } else { 85 };
                p.execute(&format!(
                    "create table movers (id int primary key, n int not null default 0, payload text) with (fillfactor = {ff});
                     insert into movers select g, 0, (select string_agg(md5(random()::text || i), '') from generate_series(1, 12 + 0 * g) i) from generate_series(1, 40000) g"
                ))
                .await?;
                if self == Workload::LogicalFull {
                    p.execute("alter table movers replica identity full")
                        .await?;
                }
                p.execute("vacuum analyze movers").await?;
            }
        }
        Ok(())
    }

    /// The measured load, running for about `seconds`.
    pub async fn load(self, p: &Cluster, seconds: u64) -> Result<Load> {
        let secs = seconds.to_string();
        let cmd = match self {
            Workload::Pgbench
            | Workload::PgbenchLz4
            | Workload::PgbenchPglz
            | Workload::PgbenchZstd => p.pgbench(&["-c", "4", "-j", "2", "-T", &secs, "postgres"]),
            Workload::Updates => script_load(
                p,
                &secs,
                "updates.sql",
                "update wide set payload = (select string_agg(md5(random()::text), '') from generate_series(1, 12)) where id = :id;",
            )?,
            Workload::Moves | Workload::Logical | Workload::LogicalFull => script_load(
                p,
                &secs,
                "moves.sql",
                "update movers set n = n + 1 where id = :id;",
            )?,
            Workload::Bulk => {
                // Batches of INSERT ... SELECT for two thirds of the time, then CREATE INDEX.
                let client = p.connect().await?;
                let until = std::time::Instant::now()
                    + std::time::Duration::from_secs((seconds * 2 / 3).max(1));
                return Ok(Load::Task(tokio::spawn(async move {
                    let mut n: i64 = 0;
                    while std::time::Instant::now() < until {
                        client
                            .batch_execute(&format!(
                                "insert into bulk select g, md5(g::text), repeat(md5(random()::text), 4) from generate_series({}, {}) g",
                                n,
                                n + 19_999
                            ))
                            .await?;
                        n += 20_000;
                    }
                    client
                        .batch_execute("create index on bulk (k); create index on bulk (v)")
                        .await?;
                    Ok(())
                })));
            }
        };
        let mut cmd = tokio::process::Command::from(cmd);
        Ok(Load::Child(
            cmd.kill_on_drop(true)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()?,
        ))
    }
}

/// pgbench running `sql` for a random `:id` of 1..=40000, from a script file next to the
/// cluster's directory.
fn script_load(p: &Cluster, secs: &str, name: &str, sql: &str) -> Result<std::process::Command> {
    let script = p.dir().parent().unwrap_or(p.dir()).join(name);
    std::fs::write(&script, format!("\\set id random(1, 40000)\n{sql}\n"))?;
    let f = format!("--file={}", script.display());
    Ok(p.pgbench(&["-n", "-c", "4", "-j", "2", "-T", secs, &f, "postgres"]))
}

/// A running load.
pub enum Load {
    Child(tokio::process::Child),
    Task(tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>),
}

impl Load {
    /// Waits for the load to end; Err if it failed.
    pub async fn wait(&mut self) -> Result<()> {
        match self {
            Load::Child(c) => {
                let status = c.wait().await?;
                anyhow::ensure!(status.success(), "load exited with {status}");
            }
            Load::Task(t) => t.await??,
        }
        Ok(())
    }
}
