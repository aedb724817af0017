//! The `walrelay` command: run the halves, check a config, show a running process's status, run
//! the demo and the bench (from `walrelay-harness`, which runs this same executable as child
//! processes), make SCRAM verifiers.
#![deny(clippy::undocumented_unsafe_blocks)]

/// The process's allocator: mimalloc rather than glibc's malloc. The codec's block and tuple
/// caches fill with page-sized allocations and its stages allocate and free buffers of up to
/// a message per batch; glibc's malloc served many of them with fresh, zeroed memory from
/// the kernel (page faults and `clear_page` were 6 % of a live upstream's profile under the
/// `toast` workload). Measured on the one-core replay (`codec_profile … decode`, paired
/// runs, medians; `docs/keeping-up.md`, twenty-sixth round): 1.12–1.16 x faster on
/// `updates`, 1.22 x on `pgbench`, peak memory +3–6 %. Large OS pages
/// (`MIMALLOC_ALLOW_LARGE_OS_PAGES`) gained nothing more there. Built with `no_thp` (the
/// workspace's Cargo.toml): mimalloc 3 otherwise asks for transparent huge pages for all
/// its memory, whose first touch cost several times the codec's kernel time for no user
/// time saved (`walrelay::lifecycle::huge_pages_off`, which `run` also calls).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use walrelay::config::{Config, ConfigError, EXIT_CONFIG};
use walrelay_harness::out::{self, printed};
use walrelay_harness::{errln, outln};

#[path = "cli/bench.rs"]
mod bench_cmd;
use bench_cmd::{bench, BenchArgs};

#[derive(Parser)]
#[command(
    name = "walrelay",
    version,
    about = "Bandwidth-saving relay for PostgreSQL streaming replication between datacenters"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the halves configured in FILE until SIGTERM/SIGINT (drain, then exit 0); SIGHUP
    /// reloads FILE.
    Run {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Check FILE (keys, addresses, secrets, certificate files, the spool directory) and exit;
    /// nothing is changed on disk.
    CheckConfig {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Throw-away primary and standby streaming through both halves under pgbench load.
    Demo {
        /// Seconds of pgbench load (pgbench's -T: 1 to 2147483647).
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=i32::MAX as u64))]
        seconds: u64,
    },
    /// What the link carries per workload: both halves as processes with mutual TLS, `wal`
    /// and `zstd` codecs side by side, against offline zstd of the same WAL (README, Benchmark).
    Bench(BenchArgs),
    /// Show a running process's standbys and totals (read from its [metrics] listen address).
    Status {
        #[arg(long, default_value = "http://127.0.0.1:9187")]
        url: String,
    },
    /// Print a SCRAM-SHA-256 verifier (pg_authid format) for downstream.users.
    /// Reads the password from standard input.
    ScramVerifier,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(usage_status(&e));
        }
    };
    match cli.cmd {
        Cmd::CheckConfig { config } => check_config(&config),
        Cmd::Run { config } => run(config),
        Cmd::Demo { seconds } => {
            walrelay::logging::init("error", "text");
            let demo = async move {
                let bin = std::env::current_exe().context("locating the walrelay executable")?;
                walrelay_harness::demo::run(&bin, seconds).await
            };
            exit(run_tool(demo, Interrupt::Ends, |_| {}))
        }
        Cmd::Bench(args) => {
            walrelay::logging::init("error", "text");
            bench(args)
        }
        Cmd::Status { url } => status(&url),
        Cmd::ScramVerifier => scram_verifier(),
    }
}

/// The exit status of a command line clap did not take: 0 for `--help` and `--version`, 64
/// (as for a bad configuration) for a missing, unknown or malformed argument, so that a
/// systemd unit's `RestartPreventExitStatus=64` also stops a mistyped `ExecStart=` from
/// restarting in a loop (clap's own status for these is 2).
fn usage_status(e: &clap::Error) -> u8 {
    match e.use_stderr() {
        true => EXIT_CONFIG as u8,
        false => 0,
    }
}

/// `walrelay check-config`: loads the file as `run` would, checks the spool directory as
/// `run` would open it (changing nothing: [`walrelay::spool::Spool::check`]), and says which
/// halves it runs.
fn check_config(config: &Path) -> ExitCode {
    let checked = Config::load(config).and_then(|r| {
        let Some(d) = &r.downstream else {
            return Ok(r);
        };
        match walrelay::spool::Spool::check(&d.spool_dir) {
            Ok(()) => Ok(r),
            Err(e) => Err(ConfigError::Key {
                key: "downstream.spool_dir".into(),
                problem: e.to_string(),
            }),
        }
    });
    match checked {
        Ok(r) => {
            let halves: Vec<&str> = [
                r.upstream.as_ref().map(|_| "upstream"),
                r.downstream.as_ref().map(|_| "downstream"),
            ]
            .into_iter()
            .flatten()
            .collect();
            let said = outln!("{}: OK ({})", config.display(), halves.join(" + "));
            printed(said, ExitCode::SUCCESS)
        }
        Err(e) => config_error(&e),
    }
}

/// `walrelay run`: the configured halves until a signal stops them or one stops by itself.
fn run(config: PathBuf) -> ExitCode {
    use walrelay::lifecycle::Signals;
    let thp_off = walrelay::lifecycle::huge_pages_off();
    walrelay::lifecycle::ignore_file_size_signal();
    // The handlers before anything else: a SIGHUP that comes while the configuration is read
    // (`systemctl reload` right after `systemctl start`) is then a reload once the halves
    // run, not the default action that ends the process (which systemd counts as a clean
    // stop, so `Restart=on-failure` would not even restart it). SIGTERM and SIGINT still end
    // a read that hangs.
    let rt = runtime();
    let signals = {
        let _in_runtime = rt.enter();
        Signals::install()
    };
    let mut signals = match signals {
        Ok(s) => s,
        Err(e) => return exit(Err(e).context("installing signal handlers")),
    };
    let cfg = match rt.block_on(signals.load_at_start(&config)) {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return config_error(&e),
        Err(by) => {
            errln!("walrelay: {by} while reading {}: stopped", config.display());
            // The read that hangs is left behind.
            rt.shutdown_timeout(walrelay::lifecycle::RUNTIME_SHUTDOWN);
            return ExitCode::SUCCESS;
        }
    };
    let log = walrelay::logging::init(&cfg.log.level, &cfg.log.format);
    if !thp_off {
        tracing::debug!("transparent huge pages stay as the host sets them (prctl refused)");
    }
    let r = rt.block_on(async move {
        let mut running = walrelay::relay::start(cfg, walrelay::metrics::Metrics::new()).await?;
        let by_signal = signals.serve(&mut running, &config, &log).await;
        signals.drain(running).await;
        anyhow::ensure!(by_signal, "a half stopped by itself; see the log above");
        Ok(())
    });
    // Whatever is still stuck (a peer that stopped reading) is dropped, not waited for.
    rt.shutdown_timeout(walrelay::lifecycle::RUNTIME_SHUTDOWN);
    match r {
        Err(e) if is_config_error(&e) => {
            errln!("walrelay: bad configuration: {e:#}");
            ExitCode::from(EXIT_CONFIG as u8)
        }
        r => exit(r),
    }
}

/// `walrelay status`: a running relay's monitoring document, for people.
fn status(url: &str) -> ExitCode {
    match runtime().block_on(walrelay::monitor::client::fetch(url)) {
        Ok(doc) => printed(
            out::write(&walrelay::monitor::client::format(&doc)),
            ExitCode::SUCCESS,
        ),
        Err(e) => {
            errln!("walrelay status: {e}");
            ExitCode::from(1)
        }
    }
}

/// `walrelay scram-verifier`: a SCRAM-SHA-256 verifier for the password on standard input.
fn scram_verifier() -> ExitCode {
    let mut pw = String::new();
    if let Err(e) = std::io::stdin().read_line(&mut pw) {
        errln!("walrelay: cannot read the password from standard input: {e}");
        return ExitCode::from(1);
    }
    let pw = pw.trim_end_matches(['\n', '\r']);
    if pw.is_empty() {
        errln!("walrelay: empty password; pipe the password on standard input");
        return ExitCode::from(EXIT_CONFIG as u8);
    }
    let said = outln!("{}", walrelay_pgwire::scram::new_verifier(pw));
    printed(said, ExitCode::SUCCESS)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// What Ctrl-C means to a tool: the end of the demo (its live table stops), or a bench that
/// did not finish (it fails; its `--json` holds the workloads that finished). SIGTERM always fails.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Interrupt {
    Ends,
    Fails,
}

/// Runs `bench` or `demo` until done, Ctrl-C (SIGINT) or SIGTERM (`kill`, a CI job's timeout);
/// dropping the future on a signal stops the child processes and clusters it started and
/// removes its directory, so an interrupted run leaves nothing running and nothing in `TMPDIR`.
/// Then `stopped(signal)` says what the tool had finished (the bench's tables so far).
fn run_tool(
    f: impl std::future::Future<Output = anyhow::Result<()>>,
    interrupt: Interrupt,
    stopped: impl FnOnce(&str),
) -> anyhow::Result<()> {
    let rt = runtime();
    let r = rt.block_on(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
        let (by, fails) = tokio::select! {
            r = f => return r,
            _ = tokio::signal::ctrl_c() => ("SIGINT", interrupt == Interrupt::Fails),
            _ = term.recv() => ("SIGTERM", true),
        };
        // `f` is dropped by now: its processes and clusters are stopped, its directory gone.
        errln!("walrelay: {by}: stopped and removed what was started");
        stopped(by);
        anyhow::ensure!(!fails, "stopped by {by} before the end");
        Ok(())
    });
    // Copies of WAL still running on blocking threads are not waited for.
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    r
}

/// An error `run` met building what the configuration describes (TLS files that changed
/// after the check, say): exit 64 like any other configuration error.
fn is_config_error(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<ConfigError>()
            || c.is::<walrelay::tls::TlsError>()
            || c.is::<walrelay::link::LinkError>()
    })
}

fn config_error(e: &ConfigError) -> ExitCode {
    errln!("walrelay: {e}");
    ExitCode::from(EXIT_CONFIG as u8)
}

fn exit(r: anyhow::Result<()>) -> ExitCode {
    match r.context("walrelay") {
        Ok(()) => ExitCode::SUCCESS,
        // The demo stops when its reader leaves; it removed what it started.
        Err(e) if out::reader_left(&e) => ExitCode::SUCCESS,
        Err(e) => {
            errln!("{e:#}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{usage_status, Cli};
    use clap::Parser;

    #[test]
    fn command_line_errors_exit_64_and_help_exits_0() {
        let status = |args: &[&str]| {
            let e = match Cli::try_parse_from(args) {
                Ok(_) => panic!("{args:?} parsed"),
                Err(e) => e,
            };
            usage_status(&e)
        };
        for bad in [
            &["walrelay"][..],
            &["walrelay", "run"],
            &["walrelay", "check-config"],
            &["walrelay", "run", "--conifg", "x.toml"],
            &["walrelay", "bogus"],
            &["walrelay", "status", "--url"],
            &["walrelay", "demo", "--seconds", "x"],
            &["walrelay", "bench", "--pg", "fourteen"],
        ] {
            assert_eq!(status(bad), 64, "{bad:?}");
        }
        for fine in [
            &["walrelay", "--help"][..],
            &["walrelay", "--version"],
            &["walrelay", "help"],
            &["walrelay", "run", "--help"],
        ] {
            assert_eq!(status(fine), 0, "{fine:?}");
        }
        assert!(Cli::try_parse_from(["walrelay", "run", "-c", "x.toml"]).is_ok());
    }

    /// pgbench takes -T from 1 to 2^31-1: a demo outside that is refused before it spends
    /// half a minute creating a primary and a standby only to have pgbench refuse it.
    #[test]
    fn demo_seconds_are_what_pgbench_takes() {
        for bad in ["0", "2147483648", "18446744073709551615"] {
            let e = match Cli::try_parse_from(["walrelay", "demo", "--seconds", bad]) {
                Ok(_) => panic!("--seconds {bad} parsed"),
                Err(e) => e,
            };
            assert_eq!(usage_status(&e), 64, "{bad}");
        }
        for fine in [
            &["walrelay", "demo"][..],
            &["walrelay", "demo", "--seconds", "1"],
        ] {
            assert!(Cli::try_parse_from(fine).is_ok(), "{fine:?}");
        }
    }
}
