//! `walrelay bench`: what a user's link carries, per workload, against offline `zstd -3`,
//! `zstd -19 --long=27` and `ssh -C` ([`sshc`]) of exactly the same WAL and against
//! `codec = "zstd"` in the same run.
//!
//! Per workload (and PostgreSQL major), once [`disk`] found room for it: a fresh primary
//! (`checkpoint_timeout = 30s`, `max_wal_size = 4GB`, `fsync = off`, the workload's
//! `wal_compression` and `wal_level`), its data, a segment switch and a checkpoint (so that the
//! relays' slots, and their streams, begin after the data: a cold relay has not seen it), then
//! two relay pairs of the real binary ([`pair`]: upstream and downstream processes, mutual TLS,
//! a counting forwarder on the link socket): W with `codec = "wal"`, Z with `codec = "zstd"`,
//! each serving one standby. t = 0 once both standbys stream through their pairs; the load
//! starts at once; no checkpoint is forced from then on. Every ~100 ms [`sample`] records the
//! primary's WAL position, what each standby received and replayed, each pair's socket bytes
//! and CPU, W's link counters, and every stage's position along each path ([`stages`]: where
//! the lag waits). The cold window is [0, cold], the steady one [cold + warm-up, cold +
//! warm-up + steady]. Each window's WAL is copied from the primary's pg_wal and byte-compared
//! with both standbys' ([`walrange`]); after the load the tables are compared and the
//! integrity counters must be 0 — any failure ends the bench with an error. Then the offline
//! baselines, the one-core replay ([`micro`]), and once per invocation the sync-commit latency
//! ([`synclat`]).
//!
//! A benchmark, not a test: nothing here asserts a timing.

mod background;
mod disk;
pub mod micro;
mod pair;
pub mod payloads;
mod plan;
mod proctree;
mod report;
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

use crate::certs::LinkCerts;
use crate::cluster::{majors, wait_replayed, Cluster, PgInstall, PrimaryOpts, TempRoot};
use pair::{RelayPair, PRIMARY_PASSWORD};
use sample::{Sample, Sampler};
use wincheck::WindowCheck;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOpts {
    /// The `walrelay` binary to run the halves with.
    pub binary: PathBuf,
    pub workloads: Vec<Workload>,
    /// PostgreSQL majors; empty = the discovered install.
    pub majors: Vec<u32>,
    pub cold_secs: u64,
    pub warmup_secs: u64,
    pub steady_secs: u64,
    /// Seconds of each sync-latency pgbench (0: not measured).
    pub sync_secs: u64,
    /// Where to write each run's samples as CSV (`<workload>-pg<major>.csv`,
    /// [`sample::timeline_csv`]).
    pub timeline_dir: Option<PathBuf>,
    /// Pair Z and its standby at the lowest priority ([`background`]).
    pub z_background: bool,
    /// Pair W's relay processes with a larger CPU share ([`background::favour`]).
    pub w_share: bool,
    /// Each site on CPUs of its own ([`sites`]).
    pub sites: Option<sites::Sites>,
    /// Each cluster and relay process in a CPU group of its own, on this cpu controller
    /// ([`services`]).
    pub services: Option<services::Hierarchy>,
    /// Each downstream's `downstream.spool_bytes` (None: the relay's default).
    pub spool_bytes: Option<u64>,
}

const CODECS: [&str; 2] = ["wal", "zstd"];
const APPS: [&str; 2] = ["bench_w", "bench_z"];
/// application_name of the standby connected to the primary without a relay, the reference
/// for replay lag (the sync-latency run makes its own, `synclat::DIRECT`).
const DIRECT_APP: &str = "bench_lag_ref";
/// Catching up, replaying, copying: every wait of a run is bounded by this.
const LONG_WAIT: Duration = Duration::from_secs(600);

/// Runs every workload on every major; prints progress to stderr. After each workload that
/// finished, `finished` sees the report so far ([`plan`]: the CLI writes `--json` then).
/// Returns the report of what finished, and the error that stopped the run if one did; the
/// report then names the workloads that did not run and why.
pub async fn run(
    opts: &BenchOpts,
    finished: &mut dyn FnMut(&Report) -> Result<()>,
) -> (Report, Result<()>) {
    let mut report = Report {
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
        eprintln!("bench: {} ...", plan::Job::label(&j));
        let (r, lat) = run_one(opts, j.install, j.workload, j.compression, sync)
            .await
            .with_context(|| format!("workload {}", plan::Job::label(&j)))?;
        eprintln!(
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

fn installs(majors: &[u32]) -> Result<Vec<PgInstall>> {
    if majors.is_empty() {
        return Ok(vec![PgInstall::discover().context(
            "the bench needs PostgreSQL server binaries (scripts/install-deps.sh, or PG_BIN)",
        )?]);
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

/// Everything of one run. Fields drop in this order: relays, standbys, primary, directory.
struct Rig {
    pairs: [RelayPair; 2],
    standbys: [Cluster; 2],
    /// A standby streaming from the primary itself, for the replay lag without a relay.
    direct: Cluster,
    primary: Cluster,
    root: TempRoot,
    /// `--services`' groups, held for their drop, which comes after the clusters and relays
    /// stopped (fields drop in order).
    _services: Option<services::Services>,
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
    eprintln!(
        "bench: {}: {step} ({:.1} MB) ...",
        w.name(),
        bytes as f64 / 1e6
    );
}

fn window_file(root: &TempRoot, name: &str) -> PathBuf {
    root.path().join(format!("{name}-window.wal"))
}

/// Primary with data, two standbys copied from it, both relay pairs, standbys streaming.
async fn setup(
    opts: &BenchOpts,
    install: &PgInstall,
    w: Workload,
    compression: &str,
) -> Result<Rig> {
    let root = TempRoot::new()?;
    let secs = opts.cold_secs + opts.warmup_secs + opts.steady_secs;
    disk::check_free_space(root.path(), w.disk_needed_gb(secs), w.name())?;
    let certs_dir = root.path().join("certs");
    std::fs::create_dir(&certs_dir)?;
    let certs = LinkCerts::generate(&certs_dir)?;
    let primary = start_primary(install, &root, w, compression).await?;
    let load_end = begin_after_load(&primary).await?;
    // The pairs first: a downstream's spool starts at the segment the primary is writing when
    // its stream opens, so standbys backed up after that find all they need in it.
    let site = pair::Site {
        bin: &opts.binary,
        dir: root.path(),
        primary: &primary,
        certs: &certs,
        spool_bytes: opts.spool_bytes,
    };
    let mut pairs = Vec::new();
    for (i, codec) in CODECS.into_iter().enumerate() {
        let tag = ["w", "z"][i];
        pairs.push(RelayPair::start_on_free_ports(&site, tag, codec)?);
    }
    let pairs: [RelayPair; 2] = pairs.try_into().map_err(|_| anyhow::anyhow!("two pairs"))?;
    for p in &pairs {
        p.wait_stream_open().await?;
    }
    let oldest = primary
        .query_lsn("select min(restart_lsn) from pg_replication_slots")
        .await?;
    anyhow::ensure!(
        oldest > load_end,
        "the relays' slots hold WAL from {oldest}, before the end of the workload's data ({load_end}): \
         their upstreams would encode the load before the cold window"
    );
    let down_ports = [pairs[0].down_port, pairs[1].down_port];
    let standbys = standbys::start_relayed_standbys(&primary, &root, down_ports).await?;
    if opts.z_background {
        background::lower(&pairs[1], &standbys[1])?;
    }
    if opts.w_share {
        background::favour(&pairs[0])?;
    }
    let direct = standbys::start_direct_standby(&primary, &root).await?;
    if let Some(s) = &opts.sites {
        let [a, b] = &standbys;
        s.pin(&primary, &pairs, &[a, b, &direct])?;
    }
    let services = match &opts.services {
        Some(h) => Some(place_services(
            opts, h, &primary, &pairs, &standbys, &direct,
        )?),
        None => None,
    };
    Ok(Rig {
        pairs,
        standbys,
        direct,
        primary,
        root,
        _services: services,
    })
}

/// `--services`: each cluster and relay process in a CPU group of its own.
fn place_services(
    opts: &BenchOpts,
    h: &services::Hierarchy,
    primary: &Cluster,
    pairs: &[RelayPair; 2],
    standbys: &[Cluster; 2],
    direct: &Cluster,
) -> Result<services::Services> {
    use services::Share;
    let [a, b] = standbys;
    let rig = services::Rig {
        primary,
        standbys: [a, b, direct],
        pairs,
    };
    let w = if opts.w_share {
        Share::Favoured
    } else {
        Share::Even
    };
    // Z in the background keeps its nice 19 outside the groups (`services`' module says why).
    let z = (!opts.z_background).then_some(Share::Even);
    services::place(h, &rig, w, z)
}

/// The workload's primary, started, with the replication user and the workload's data.
async fn start_primary(
    install: &PgInstall,
    root: &TempRoot,
    w: Workload,
    compression: &str,
) -> Result<Cluster> {
    let popts = PrimaryOpts {
        checkpoint_timeout: "30s".into(),
        wal_compression: compression.into(),
        wal_level: w.wal_level().into(),
        extra_conf: vec![
            ("max_wal_size".into(), "4GB".into()),
            // Each window's WAL is copied out of pg_wal once the window is sampled.
            ("wal_keep_size".into(), "6GB".into()),
        ],
        ..Default::default()
    };
    let primary = Cluster::init_primary(install, root, "primary", &popts)?;
    primary.start().await?;
    primary.create_replication_user(PRIMARY_PASSWORD).await?;
    tokio::time::timeout(LONG_WAIT, w.prepare(&primary))
        .await
        .with_context(|| format!("preparing {} took more than {LONG_WAIT:?}", w.name()))??;
    Ok(primary)
}

/// Makes the relays start after the workload's data: returns where the load's WAL ends.
///
/// An upstream's new slot reserves WAL from the last checkpoint's redo pointer, and the stream
/// starts at the segment holding it. After the data load that pointer is still the primary's
/// first checkpoint (`max_wal_size` is large), so the upstreams encoded the whole load before
/// t = 0: W's DATA history (128 MiB) and tuple cache then held the rows the workload rewrites,
/// which neither a relay started on a loaded database, nor the cold replay, nor the offline
/// baselines of the window have. `toast`'s cold window (2026-11-27) gave W / zstd-3 0.32 live
/// against 0.62 replayed on the same WAL; with this, 0.58 and 0.57. A segment switch and a
/// checkpoint, before any relay exists, move that pointer past the load; the base backups
/// checkpoint again anyway, so the block cache gains nothing.
async fn begin_after_load(primary: &Cluster) -> Result<walrelay_wal::lsn::Lsn> {
    let load_end = primary
        .query_lsn("select pg_current_wal_insert_lsn()")
        .await?;
    primary
        .execute("select pg_switch_wal(); checkpoint")
        .await?;
    Ok(load_end)
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
                        eprintln!("bench: {}: {name} window done", w.name());
                    }
                }
                let t = samples.last().map_or(0.0, |s| s.t);
                if checks.iter().all(WindowCheck::comparing) {
                    break;
                }
                anyhow::ensure!(t < steady_end + LONG_WAIT.as_secs_f64(), "the standbys did not receive the steady window's WAL within {LONG_WAIT:?} of its end");
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
