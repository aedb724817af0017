//! `walrelay bench` on the command line: its arguments checked, the run, its report printed
//! and written (the bench itself is `walrelay_harness::bench`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use walrelay::config::EXIT_CONFIG;
use walrelay_harness::{errln, outln};

use super::{exit, run_tool, Interrupt};

/// The arguments of `walrelay bench`.
#[derive(clap::Args)]
pub(super) struct BenchArgs {
    /// Comma-separated workloads, or all (see the README for the list).
    #[arg(long, default_value = "all")]
    pub(super) workload: String,
    /// Comma-separated PostgreSQL majors, e.g. 14,15,18 (default: the discovered install).
    #[arg(long, value_delimiter = ',')]
    pub(super) pg: Vec<u32>,
    /// Also write the results as JSON to this file (its directory is created if missing).
    #[arg(long)]
    pub(super) json: Option<PathBuf>,
    /// Length of the cold window, from the relays' start.
    #[arg(long, default_value_t = 30)]
    pub(super) cold_secs: u64,
    /// Load between the cold window's end and the steady window's start.
    #[arg(long, default_value_t = 90)]
    pub(super) warmup_secs: u64,
    /// Length of the steady window.
    #[arg(long, default_value_t = 40)]
    pub(super) steady_secs: u64,
    /// Length of each sync-commit latency run (with the pgbench workload; 0 = skip).
    #[arg(long, default_value_t = 15)]
    pub(super) sync_secs: u64,
    /// Also write each run's samples (every stage's position, ~10 per second) as CSV
    /// files `<workload>-pg<major>.csv` into this directory (created if missing).
    #[arg(long)]
    pub(super) timeline_dir: Option<PathBuf>,
    /// Run pair Z (codec = "zstd") and its standby at nice 19, so that they take a core
    /// only when W, the direct standby and the primary leave one idle: a diagnostic of
    /// W's replay lag on a small machine. Z's lags and cores are then not comparable.
    #[arg(long)]
    pub(super) z_background: bool,
    /// Give pair W's two relay processes a larger CPU share: their session groups (and
    /// threads) at nice -5, weight 3,121 against the 1,024 of each PostgreSQL process, as a
    /// CPU weight of their own (the systemd units' `CPUWeight=`) gives a service in
    /// production. The primary's load then gets less of a busy CPU. Needs root or
    /// CAP_SYS_NICE.
    #[arg(long)]
    pub(super) w_share: bool,
    /// Run each site on CPUs of its own, as in production: the primary and both upstreams
    /// on the first half of the CPUs, the three standbys and both downstreams on the
    /// rest. Without it every process shares every core.
    #[arg(long)]
    pub(super) sites: bool,
    /// Run each PostgreSQL cluster and each relay process in a CPU group (cgroup) of its
    /// own, all of one weight, as systemd services whose units set `CPUWeight=`: the
    /// primary as a whole then weighs what one upstream weighs. With --w-share W's groups
    /// weigh three times as much; with --z-background pair Z and its standby stay out of
    /// them, at nice 19. Needs root and the cgroup cpu controller (v2, or v1's cpu
    /// hierarchy)
    #[arg(long)]
    pub(super) services: bool,
    /// Each downstream's `downstream.spool_bytes` (default: the relay's, 8 GiB). Below the
    /// WAL a run writes, the windows after the spool fills measure a full spool, whose
    /// segments are written over: the steady state of a relay that has run for a while.
    #[arg(long)]
    pub(super) spool_bytes: Option<u64>,
    /// The primary's checkpoint_timeout, as postgresql.conf writes it (`30s`, `5min`, `1h`;
    /// 30 s to 1 day). The default, 30s, is that of the measured baselines; PostgreSQL's
    /// own is 5min, with which fewer full-page images are written.
    #[arg(long, default_value = "30s")]
    pub(super) checkpoint_timeout: String,
}

/// `walrelay bench`: prints the markdown tables, writes the JSON.
pub(super) fn bench(a: BenchArgs) -> ExitCode {
    use walrelay_harness::bench::{self, Workload};
    let workloads: Vec<Workload> = if a.workload == "all" {
        Workload::ALL.to_vec()
    } else {
        match a
            .workload
            .split(',')
            .map(Workload::from_name)
            .collect::<Option<Vec<_>>>()
        {
            Some(w) => w,
            None => {
                errln!(
                    "walrelay: unknown workload in {:?}: use all or some of {}",
                    a.workload,
                    Workload::names()
                );
                return ExitCode::from(EXIT_CONFIG as u8);
            }
        }
    };
    let checkpoint_timeout = match bench::checkpoint_timeout(&a.checkpoint_timeout) {
        Ok(t) => t,
        Err(e) => {
            errln!("walrelay: {e}");
            return ExitCode::from(EXIT_CONFIG as u8);
        }
    };
    // The report as of the last workload that finished, for the tables a signal prints.
    let so_far = std::sync::Arc::new(std::sync::Mutex::new(None::<bench::Report>));
    let (json_path, kept) = (a.json.clone(), so_far.clone());
    let run = async move {
        prepare_outputs(a.json.as_deref(), a.timeline_dir.as_deref())?;
        let opts = bench::BenchOpts {
            command: Some(bench::command_line(
                std::env::args_os().map(|a| a.to_string_lossy().into_owned()),
            )),
            binary: std::env::current_exe().context("locating the walrelay executable")?,
            workloads,
            majors: a.pg,
            cold_secs: a.cold_secs,
            warmup_secs: a.warmup_secs,
            steady_secs: a.steady_secs,
            sync_secs: a.sync_secs,
            timeline_dir: a.timeline_dir,
            z_background: a.z_background,
            w_share: a.w_share,
            sites: match a.sites {
                true => Some(bench::sites::Sites::of_this_machine()?),
                false => None,
            },
            services: match a.services {
                true => Some(bench::services::Hierarchy::of_this_machine()?),
                false => None,
            },
            spool_bytes: a.spool_bytes,
            checkpoint_timeout,
        };
        let json = a.json.as_deref();
        let (report, outcome) = bench::run(&opts, &mut |report| {
            *kept.lock().unwrap_or_else(|e| e.into_inner()) = Some(report.clone());
            write_report_json(json, report)
        })
        .await;
        if report.runs.is_empty() && outcome.is_err() {
            return outcome;
        }
        let said = outln!("{}", report.markdown());
        write_report_json(json, &report)?;
        match said {
            Err(e) if !e.reader_left() => return Err(e.into()),
            _ => {}
        }
        outcome.with_context(|| {
            format!(
                "the report above holds the {} workload(s) that finished",
                report.runs.len()
            )
        })
    };
    exit(run_tool(run, Interrupt::Fails, |by| {
        // The workloads still to come are in `not_run` already; `stopped` names the signal.
        let report = so_far.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut report) = report {
            report.stopped = Some(format!("stopped by {by}"));
            match outln!("{}", report.markdown()) {
                Err(e) if !e.reader_left() => errln!("walrelay: {e}"),
                _ => {}
            }
            if let Err(e) = write_report_json(json_path.as_deref(), &report) {
                errln!("walrelay: {e:#}");
            }
        }
    }))
}

/// Writes the bench's report so far to `--json`, whole or not at all
/// ([`walrelay::spool::write_atomically`]): a bench stopped at any point leaves the JSON of
/// every workload that finished.
fn write_report_json(
    path: Option<&Path>,
    report: &walrelay_harness::bench::Report,
) -> anyhow::Result<()> {
    let Some(path) = path else { return Ok(()) };
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("--json {}: not a file name in UTF-8", path.display()))?;
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    let json = serde_json::to_string_pretty(report)?;
    walrelay::spool::write_atomically(dir.unwrap_or(Path::new(".")), name, json.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// Makes sure the bench can write its outputs before it runs for minutes: creates the
/// timeline directory and the JSON file's directory, and refuses a JSON path that is a
/// directory.
fn prepare_outputs(json: Option<&Path>, timeline_dir: Option<&Path>) -> anyhow::Result<()> {
    if let Some(dir) = timeline_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the timeline directory {}", dir.display()))?;
    }
    if let Some(path) = json {
        anyhow::ensure!(
            !path.is_dir(),
            "--json {} is a directory: give a file name",
            path.display()
        );
        anyhow::ensure!(
            path.file_name().and_then(|n| n.to_str()).is_some(),
            "--json {}: give a file name in UTF-8",
            path.display()
        );
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).with_context(|| {
                format!("creating {}, the directory of --json", parent.display())
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::prepare_outputs;

    #[test]
    fn bench_outputs_are_prepared_before_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let timeline = dir.path().join("a/b/timeline");
        let json = dir.path().join("c/d/bench.json");
        prepare_outputs(Some(&json), Some(&timeline)).unwrap();
        assert!(timeline.is_dir());
        assert!(json.parent().unwrap().is_dir());
        assert!(!json.exists(), "only the directory is made");
        // Nothing to create: a bare file name, or no outputs.
        prepare_outputs(Some("bench.json".as_ref()), None).unwrap();
        prepare_outputs(None, None).unwrap();
        // Refused at once, naming the path: a directory as --json, a file in the way.
        let e = prepare_outputs(Some(dir.path()), None).unwrap_err();
        assert!(format!("{e:#}").contains("is a directory"), "{e:#}");
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let e = prepare_outputs(None, Some(&file.join("t"))).unwrap_err();
        assert!(
            format!("{e:#}").contains("creating the timeline directory"),
            "{e:#}"
        );
        let e = prepare_outputs(Some(&file.join("x.json")), None).unwrap_err();
        assert!(
            format!("{e:#}").contains("the directory of --json"),
            "{e:#}"
        );
    }
}
