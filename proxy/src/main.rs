//! The `walrelay` command: run the halves, check a config, show a running process's status, run
//! the demo, make SCRAM verifiers.
#![deny(clippy::undocumented_unsafe_blocks)]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use walrelay::config::{Config, ConfigError, EXIT_CONFIG};

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
    /// Check FILE (keys, addresses, secrets, certificate files) and exit.
    CheckConfig {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Throw-away primary and standby streaming through both halves under pgbench load.
    Demo {
        #[arg(long, default_value_t = 30)]
        seconds: u64,
    },
    /// Side-by-side bench: walrelay's codec vs generic streaming zstd-3 on the same WAL.
    Bench {
        /// pgbench, pgbench-lz4, pgbench-pglz, pgbench-zstd, updates, bulk, or all.
        #[arg(long, default_value = "all")]
        workload: String,
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        /// Link codec under test: wal, zstd or none.
        #[arg(long, default_value = "wal")]
        codec: String,
        /// Also write the results as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
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
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::CheckConfig { config } => match Config::load(&config) {
            Ok(r) => {
                let halves: Vec<&str> = [
                    r.upstream.as_ref().map(|_| "upstream"),
                    r.downstream.as_ref().map(|_| "downstream"),
                ]
                .into_iter()
                .flatten()
                .collect();
                println!("{}: OK ({})", config.display(), halves.join(" + "));
                ExitCode::SUCCESS
            }
            Err(e) => config_error(&e),
        },
        Cmd::Run { config } => {
            let cfg = match Config::load(&config) {
                Ok(c) => c,
                Err(e) => return config_error(&e),
            };
            let log = walrelay::logging::init(&cfg.log.level, &cfg.log.format);
            let rt = runtime();
            let r = rt.block_on(async move {
                use walrelay::lifecycle::Signals;
                let mut signals = Signals::install().context("installing signal handlers")?;
                let mut running =
                    walrelay::relay::start(cfg, walrelay::metrics::Metrics::new()).await?;
                let by_signal = signals.serve(&mut running, &config, &log).await;
                signals.drain(running).await;
                anyhow::ensure!(by_signal, "a half stopped by itself; see the log above");
                Ok(())
            });
            // Whatever is still stuck (a peer that stopped reading) is dropped, not waited for.
            rt.shutdown_timeout(walrelay::lifecycle::RUNTIME_SHUTDOWN);
            exit(r)
        }
        Cmd::Demo { seconds } => {
            walrelay::logging::init("error", "text");
            exit(runtime().block_on(walrelay::demo::run(seconds)))
        }
        Cmd::Bench {
            workload,
            seconds,
            codec,
            json,
        } => {
            walrelay::logging::init("error", "text");
            let workloads: Vec<walrelay::bench::Workload> = if workload == "all" {
                walrelay::bench::Workload::ALL.to_vec()
            } else {
                match workload
                    .split(',')
                    .map(walrelay::bench::Workload::from_name)
                    .collect::<Option<Vec<_>>>()
                {
                    Some(w) => w,
                    None => {
                        eprintln!("walrelay: unknown workload {workload:?}: use pgbench, pgbench-lz4, pgbench-pglz, pgbench-zstd, updates, bulk or all");
                        return ExitCode::from(EXIT_CONFIG as u8);
                    }
                }
            };
            let Some(codec) = walrelay::config::CodecKind::from_name(&codec) else {
                eprintln!("walrelay: unknown codec {codec:?}: use wal, zstd or none");
                return ExitCode::from(EXIT_CONFIG as u8);
            };
            exit(runtime().block_on(async move {
                let rows = walrelay::bench::run(&workloads, seconds, codec).await?;
                println!("{}", walrelay::bench::markdown(&rows));
                if let Some(path) = json {
                    std::fs::write(&path, serde_json::to_string_pretty(&rows)?)
                        .with_context(|| format!("writing {}", path.display()))?;
                }
                Ok(())
            }))
        }
        Cmd::Status { url } => match runtime().block_on(walrelay::monitor::client::fetch(&url)) {
            Ok(doc) => {
                print!("{}", walrelay::monitor::client::format(&doc));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("walrelay status: {e}");
                ExitCode::from(1)
            }
        },
        Cmd::ScramVerifier => {
            let mut pw = String::new();
            if let Err(e) = std::io::stdin().read_line(&mut pw) {
                eprintln!("walrelay: cannot read the password from standard input: {e}");
                return ExitCode::from(1);
            }
            let pw = pw.trim_end_matches(['\n', '\r']);
            if pw.is_empty() {
                eprintln!("walrelay: empty password; pipe the password on standard input");
                return ExitCode::from(EXIT_CONFIG as u8);
            }
            println!("{}", walrelay_pgwire::scram::new_verifier(pw));
            ExitCode::SUCCESS
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn config_error(e: &ConfigError) -> ExitCode {
    eprintln!("walrelay: {e}");
    ExitCode::from(EXIT_CONFIG as u8)
}

fn exit(r: anyhow::Result<()>) -> ExitCode {
    match r.context("walrelay") {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e:#}");
            ExitCode::from(1)
        }
    }
}
