//! `walrelay bench`: what a user's link carries, per workload, against offline `zstd -3`,
//! `zstd -19 --long=27` and `ssh -C` ([`sshc`]) of exactly the same WAL and against
//! `codec = "zstd"` in the same run.
//!
//! Per workload (and PostgreSQL major), once [`disk`] found room for it: a fresh primary
//! (`checkpoint_timeout = 30s` unless `--checkpoint-timeout` says otherwise, `max_wal_size = 4GB`, `fsync = off`, the workload's
//! `wal_compression` and `wal_level`), its data, a segment switch and a checkpoint (so that the
//! relays' slots, and their streams, begin after the data: a cold relay has not seen it), then
//! two relay pairs of the real binary ([`pair`]: upstream and downstream processes, mutual TLS,
//! a counting forwarder on the link socket): W with `codec = "wal"`, Z with `codec = "zstd"`,
//! each serving one standby. t = 0 once both standbys stream through their pairs; the load
//! starts at once; no checkpoint is forced from then on. Every ~100 ms [`sample`] records the
//! primary's WAL position, what each standby received and replayed, each pair's socket bytes
//! and CPU, W's link counters, the direct standby's own apply CPU ([`apply`]: the reference
//! for what the halves spend), and every stage's position along each path ([`stages`]: where
//! the lag waits). The cold window is [0, cold], the steady one [cold + warm-up, cold +
//! warm-up + steady]. Each window's WAL is copied from the primary's pg_wal and byte-compared
//! with both standbys' ([`walrange`]); after the load the tables are compared and the
//! integrity counters must be 0 — any failure ends the bench with an error. Then the offline
//! baselines, the one-core replay ([`micro`]), and once per invocation the sync-commit latency
//! ([`synclat`]).
//!
//! A benchmark, not a test: nothing here asserts a timing.

mod apply;
mod background;
mod disk;
pub mod micro;
mod opts;
mod pair;
pub mod payloads;
mod plan;
mod proctree;
mod report;
mod rig;
mod sample;
pub mod services;
pub mod sites;
pub mod sshc;
mod stages;
mod standbys;
mod synclat;
pub mod walrange;
mod wincheck;
mod workloads;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

pub use report::{PairWindow, Report, RunResult, Verified, Window};
pub use workloads::Workload;

pub use opts::{checkpoint_timeout, BenchOpts};

use crate::cluster::{majors, wait_replayed, PgInstall, TempRoot};
use pair::{CODECS, LONG_WAIT};
use rig::{setup, Rig};
use sample::{Sample, Sampler};
use standbys::{APPS, DIRECT_APP};
use walrelay_wal::pg::PgMajor;
use wincheck::WindowCheck;

/// Runs every workload on every major; prints progress to stderr. After each workload that
/// finished, `finished` sees the report so far ([`plan`]: the CLI writes `--json` then).
/// Returns the report of what finished, and the error that stopped the run if one did; the
/// report then names the workloads that did not run and why.
pub async fn run(
    opts: &BenchOpts,
    finished: &mut dyn FnMut(&Report) -> Result<()>,
) -> (Report, Result<()>) {
    let mut report = Report {
        command: opts.command.clone(),
        cold_secs: opts.cold_secs,
        warmup_secs: opts.warmup_secs,
        steady_secs: opts.steady_secs,
        z_background: opts.z_background,
        w_share: opts.w_share,
        sites: opts.sites.clone(),
        services: opts.services.as_ref().map(services::Hierarchy::describe),
        spool_bytes: opts.spool_bytes,
        runs: Vec::new(),
        skipped: Vec::new(),
        not_run: Vec::new(),
        stopped: None,
        sync_latency: None,
    };
    let outcome = match preflight(opts).await {
        Ok(installs) => run_all(opts, &installs, &mut report, finished).await,
        Err(e) => Err(e),
    };
    (report, outcome)
}

/// What must hold before the first workload starts: the options, the zstd command, every
/// major's install and the disk the largest workload needs.
async fn preflight(opts: &BenchOpts) -> Result<Vec<PgInstall>> {
    anyhow::ensure!(
        opts.cold_secs > 0 && opts.steady_secs > 0,
        "--cold-secs and --steady-secs must be at least 1"
    );
    anyhow::ensure!(
        opts.spool_bytes.is_none_or(|b| b >= 64 << 20),
        "--spool-bytes must be at least 64 MiB (67108864), downstream.spool_bytes's least"
    );
    for &m in &opts.majors {
        supported(m).with_context(|| format!("--pg {m}"))?;
    }
    let zstd = tokio::process::Command::new("zstd")
        .arg("--version")
        .output()
        .await;
    anyhow::ensure!(
        zstd.is_ok_and(|o| o.status.success()),
        "the bench needs the zstd command for its offline baselines: apt-get install zstd (or scripts/install-deps.sh)"
    );
    let installs = installs(&opts.majors)?;
    let secs = opts.cold_secs + opts.warmup_secs + opts.steady_secs;
    if let Some((w, gb)) = disk::most_needed(&opts.workloads, secs) {
        disk::check_free_space(&std::env::temp_dir(), gb, w.name())
            .context("checking free disk for every workload before the first one starts")?;
    }
    Ok(installs)
}

/// One workload on one install, with its `wal_compression`.
struct OneRun<'a> {
    install: &'a PgInstall,
    workload: Workload,
    compression: &'static str,
}

impl plan::Job for OneRun<'_> {
    fn label(&self) -> String {
        format!(
            "{} on PostgreSQL {}",
            self.workload.name(),
            self.install.major
        )
    }
}

/// Every workload on every install, in order ([`plan::run_jobs`]); those a major cannot run
/// go to `report.skipped`.
async fn run_all<'a>(
    opts: &BenchOpts,
    installs: &'a [PgInstall],
    report: &mut Report,
    finished: &mut dyn FnMut(&Report) -> Result<()>,
) -> Result<()> {
    let mut jobs = Vec::new();
    for install in installs {
        for &w in &opts.workloads {
            match w.wal_compression_setting(install.major) {
                Some(compression) => jobs.push(OneRun {
                    install,
                    workload: w,
                    compression,
                }),
                None => report.skipped.push(format!(
                    "{} on PostgreSQL {}: no wal_compression = {} before 15",
                    w.name(),
                    install.major,
                    w.wal_compression()
                )),
            }
        }
    }
    let one = |j: OneRun<'a>, no_latency_yet: bool| async move {
        let sync = opts.sync_secs > 0 && no_latency_yet && j.workload == Workload::Pgbench;
        crate::errln!("bench: {} ...", plan::Job::label(&j));
        let (r, lat) = run_one(opts, j.install, j.workload, j.compression, sync)
            .await
            .with_context(|| format!("workload {}", plan::Job::label(&j)))?;
        crate::errln!(
            "bench: {}: steady {:.1} MB WAL, W link {:.2} MB = {:.2} x zstd-3 (Z {:.2} x)",
            j.workload.name(),
            r.steady.wal_bytes as f64 / 1e6,
            r.steady.w.link_bytes as f64 / 1e6,
            r.steady.w.vs_zstd3,
            r.steady.z.vs_zstd3
        );
        Ok((r, lat))
    };
    plan::run_jobs(report, jobs, one, finished).await
}

/// A major the bench runs: one whose WAL format walrelay knows ([`PgMajor::ALL`]); for any
/// other an error that names those.
fn supported(major: u32) -> Result<PgMajor> {
    PgMajor::from_number(major).with_context(|| {
        let all: Vec<String> = PgMajor::ALL
            .iter()
            .map(|m| m.number().to_string())
            .collect();
        format!(
            "PostgreSQL {major} is not supported: the bench runs PostgreSQL {}",
            all.join(", ")
        )
    })
}

/// `args` as one line a POSIX shell takes back as the same arguments: each argument bare when
/// it holds only characters no shell treats specially, else in single quotes.
pub fn command_line(args: impl IntoIterator<Item = String>) -> String {
    let quote = |a: String| {
        let plain = |c: char| c.is_ascii_alphanumeric() || "-_./,=:+@%".contains(c);
        if !a.is_empty() && a.chars().all(plain) {
            a
        } else {
            format!("'{}'", a.replace('\'', r"'\''"))
        }
    };
    args.into_iter().map(quote).collect::<Vec<_>>().join(" ")
}

/// The installs of `majors` (which [`preflight`] found [`supported`]), or without any the
/// discovered install, which must be supported too.
fn installs(majors: &[u32]) -> Result<Vec<PgInstall>> {
    if majors.is_empty() {
        let install = PgInstall::discover().context(
            "the bench needs PostgreSQL server binaries (scripts/install-deps.sh, or PG_BIN)",
        )?;
        supported(install.major).with_context(|| {
            format!(
                "the PostgreSQL found in {} (point PG_BIN at another, or give --pg)",
                install.bindir.display()
            )
        })?;
        return Ok(vec![install]);
    }
    majors
        .iter()
        .map(|&m| {
            majors::install_for_major(m).with_context(|| {
                format!("PostgreSQL {m} is not installed: run scripts/install-pg-majors.sh")
            })
        })
        .collect()
}

async fn run_one(
    opts: &BenchOpts,
    install: &PgInstall,
    w: Workload,
    compression: &str,
    sync: bool,
) -> Result<(RunResult, Option<synclat::SyncLatency>)> {
    let mut rig = setup(opts, install, w, compression).await?;
    let (samples, tps, compared) = measure(&mut rig, opts, w).await?;
    if let Some(dir) = &opts.timeline_dir {
        let file = dir.join(format!("{}-pg{}.csv", w.name(), install.major));
        std::fs::write(&file, sample::timeline_csv(&samples))
            .with_context(|| format!("writing the timeline {}", file.display()))?;
    }
    let tables = compare_tables(&rig, w).await?;
    let lat = match sync {
        true => Some({
            let sites = opts.sites.as_ref();
            synclat::measure(&rig.root, &rig.primary, APPS[0], opts.sync_secs, sites).await?
        }),
        false => None,
    };
    let integrity_failures = pair::check_integrity(&rig.pairs).await?;
    for s in &rig.standbys {
        s.stop().await?;
    }
    rig.direct.stop().await?;
    for p in &mut rig.pairs {
        p.stop();
    }
    rig.primary.stop().await?;
    let ends = opts.cold_secs + opts.warmup_secs;
    let steady_end = (ends + opts.steady_secs) as f64;
    let cuts = [
        sample::cut(&samples, 0.0, opts.cold_secs as f64)?,
        sample::cut(&samples, ends as f64, steady_end)?,
    ];
    let [cold, steady] = [("cold", &cuts[0]), ("steady", &cuts[1])];
    let (cold, steady) = (
        offline(&rig.root, w, cold.0, cold.1).await?,
        offline(&rig.root, w, steady.0, steady.1).await?,
    );
    let (start, file, major) = (
        cuts[0].lsn_start,
        window_file(&rig.root, "cold"),
        install.major,
    );
    let replayed = (cuts[0].lsn_end - start).min(micro::MAX_BYTES);
    progress(w, "one-core replays of the cold window", replayed);
    let replay = tokio::task::spawn_blocking(move || {
        micro::run(&file, walrelay_wal::lsn::Lsn(start), major)
    })
    .await?;
    let warm = warm_replay(&rig, &cuts, w).await;
    let result = RunResult {
        workload: w,
        pg_major: install.major,
        wal_compression: w.wal_compression().into(),
        tps,
        lag_over_run: sample::lag_over_run(&samples, steady_end, 3),
        cold,
        steady,
        replay_error: replay.as_ref().err().map(|e| format!("{e:#}")),
        replay: replay.ok(),
        warm_replay_error: warm.as_ref().err().map(|e| format!("{e:#}")),
        warm_replay: warm.ok(),
        verified: Verified {
            wal_bytes_compared: compared,
            tables,
            integrity_failures,
        },
    };
    Ok((result, lat))
}

/// The steady window replayed with warm codecs ([`micro::run_warm`]): its WAL and up to
/// [`micro::WARM_MAX_BYTES`] before it (not before the cold window), copied from the stopped
/// primary's `pg_wal`.
async fn warm_replay(rig: &Rig, cuts: &[sample::Cut; 2], w: Workload) -> Result<micro::WarmReplay> {
    let (cold, steady, major) = (&cuts[0], &cuts[1], rig.primary.install().major);
    let from = steady
        .lsn_start
        .saturating_sub(micro::WARM_MAX_BYTES)
        .max(cold.lsn_start);
    let to = steady.lsn_end.min(steady.lsn_start + micro::MAX_BYTES);
    let (dir, file) = (
        rig.primary.wal_dir(),
        rig.root.path().join("warm-steady.wal"),
    );
    let warm = steady.lsn_start - from;
    let step = "one-core replays of the steady window, the WAL before it warming the codecs";
    progress(w, step, to - steady.lsn_start);
    tokio::task::spawn_blocking(move || {
        walrange::copy_range(&dir, from, to, &file)?;
        let replay = micro::run_warm(&file, walrelay_wal::lsn::Lsn(from), warm, major);
        std::fs::remove_file(&file)?;
        replay
    })
    .await?
}

/// The window with its offline baselines: the `zstd` command over its copied WAL, and what
/// `ssh -C` would send for it ([`sshc`]).
async fn offline(
    root: &TempRoot,
    w: Workload,
    name: &'static str,
    c: &sample::Cut,
) -> Result<Window> {
    let file = window_file(root, name);
    let step = format!("offline zstd -3, zstd -19 --long=27 and ssh -C of the {name} window");
    progress(w, &step, c.lsn_end - c.lsn_start);
    let z3 = walrange::zstd_size(&file, &["-3"]).await?;
    let z19 = walrange::zstd_size(&file, &["-19", "--long=27", "-T2"]).await?;
    let ssh_c = sshc::file_size(&file).await?;
    let base = report::Baselines {
        zstd3: z3,
        zstd19: z19,
        ssh_c,
    };
    Ok(Window::new(name, c, base, CODECS))
}

/// A line on stderr before a step that takes minutes on a large window.
fn progress(w: Workload, step: &str, bytes: u64) {
    crate::errln!(
        "bench: {}: {step} ({:.1} MB) ...",
        w.name(),
        bytes as f64 / 1e6
    );
}

fn window_file(root: &TempRoot, name: &str) -> PathBuf {
    root.path().join(format!("{name}-window.wal"))
}

/// Runs the load and samples until both standbys received the steady window's end; checks
/// each window's WAL on both standbys. Returns the samples, pgbench's tps and the WAL bytes
/// compared per standby.
async fn measure(
    rig: &mut Rig,
    opts: &BenchOpts,
    w: Workload,
) -> Result<(Vec<Sample>, Option<f64>, u64)> {
    let cold_end = opts.cold_secs as f64;
    let steady_start = (opts.cold_secs + opts.warmup_secs) as f64;
    let steady_end = steady_start + opts.steady_secs as f64;
    let sampler = Sampler::connect(
        &rig.primary,
        [&rig.standbys[0], &rig.standbys[1]],
        &rig.direct,
        [
            &rig.pairs[0].feed_application_name(),
            &rig.pairs[1].feed_application_name(),
            DIRECT_APP,
        ],
        Instant::now(),
    )
    .await?;
    let mut load = w
        .load(&rig.primary, rig.root.path(), steady_end as u64 + 2)
        .await?;
    let mut samples: Vec<Sample> = Vec::new();
    let windows = [
        ("cold", 0.0, cold_end),
        ("steady", steady_start, steady_end),
    ];
    let dirs = windows.map(|(name, ..)| wincheck::Dirs {
        primary: rig.primary.wal_dir(),
        standbys: [rig.standbys[0].wal_dir(), rig.standbys[1].wal_dir()],
        file: window_file(&rig.root, name),
    });
    let mut checks = [WindowCheck::Waiting, WindowCheck::Waiting];
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut load_done = false;
    // When both relayed standbys had received the steady window's end.
    let mut compared_at: Option<f64> = None;
    loop {
        tokio::select! {
            r = load.wait(), if !load_done => {
                r.with_context(|| format!("the {} load failed", w.name()))?;
                load_done = true;
                let t = samples.last().map_or(0.0, |s| s.t);
                anyhow::ensure!(t >= steady_end - 1.0, "the load ended at t = {t:.1} s, before the steady window's end");
            }
            _ = tick.tick() => {
                let n = samples.len();
                samples.push(rig_sample(rig, &sampler, n).await?);
                for ((check, (name, t0, t1)), dirs) in checks.iter_mut().zip(windows).zip(&dirs) {
                    let (next, started) = std::mem::replace(check, WindowCheck::Waiting).advance(&samples, t0, t1, dirs);
                    *check = next;
                    if started {
                        crate::errln!("bench: {}: {name} window done", w.name());
                    }
                }
                let t = samples.last().map_or(0.0, |s| s.t);
                if checks.iter().all(WindowCheck::comparing) {
                    let since = *compared_at.get_or_insert(t);
                    if sample::direct_replayed(&samples, steady_end) || t >= since + DIRECT_REPLAY_WAIT {
                        break;
                    }
                }
                anyhow::ensure!(compared_at.is_some() || t < steady_end + LONG_WAIT.as_secs_f64(), "the standbys did not receive the steady window's WAL within {LONG_WAIT:?} of its end");
            }
        }
    }
    if !load_done {
        tokio::time::timeout(Duration::from_secs(60), load.wait())
            .await
            .context("the load did not end")?
            .with_context(|| format!("the {} load failed", w.name()))?;
    }
    let mut compared = 0;
    for check in checks {
        compared += check.finish().await?;
    }
    Ok((samples, load.tps(), compared))
}

/// Seconds the samples go on, once both relayed standbys received the steady window's end,
/// for the direct standby to replay it: its apply CPU is charged up to the first sample at
/// which it had (without one, a short run's steady window had no figure for it).
const DIRECT_REPLAY_WAIT: f64 = 30.0;

/// One sample; every 10th also checks the processes and the integrity counters.
async fn rig_sample(rig: &mut Rig, sampler: &Sampler, n: usize) -> Result<Sample> {
    if n % 10 == 0 {
        for p in &mut rig.pairs {
            p.check_running()?;
            let f = p.integrity_failures(pair::RUNNING_CHECK_WAIT).await?;
            anyhow::ensure!(
                f.is_none_or(|f| f == 0.0),
                "{} link messages of the {} pair failed verification",
                f.unwrap_or_default(),
                p.codec
            );
        }
    }
    sampler.sample(&rig.pairs, true).await
}

/// Waits until both standbys replayed everything, then compares the workload's tables.
async fn compare_tables(rig: &Rig, w: Workload) -> Result<Vec<String>> {
    for s in &rig.standbys {
        wait_replayed(&rig.primary, s, LONG_WAIT, || None).await?;
    }
    let mut done = Vec::new();
    for t in w.tables() {
        let sql = format!(
            "select count(*)::text || ':' || coalesce(sum(('x' || substr(md5(t::text), 1, 15))::bit(60)::bigint)::text, '') from {t} t"
        );
        let want = rig.primary.query_one_string(&sql).await?;
        for s in &rig.standbys {
            let got = s.query_one_string(&sql).await?;
            anyhow::ensure!(
                got == want,
                "table {t} differs on standby {}: {got} rows:digest, primary {want}",
                s.name()
            );
        }
        done.push(t.to_string());
    }
    Ok(done)
}
