//! `walrelay demo`: a throw-away primary and standby in a temporary directory, the real
//! `walrelay` binary running both halves in one process (mutual TLS on the link) with the
//! standby streaming through it, a pgbench load, and a live table of what the link saves, read
//! from the process's `/metrics`; at the end, what `zstd -3` and `ssh -C` make of the load's
//! WAL, copied from the primary's `pg_wal` ([`bench::walrange`], [`bench::sshc`]).
//! Everything is removed on exit and on Ctrl-C.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::bench::{sshc, walrange};
use crate::certs::{toml_str, LinkCerts};
use crate::cluster::{
    free_port, wait_replayed, Cluster, PgInstall, PrimaryOpts, StandbyOpts, TempRoot,
};
use crate::out::StdoutError;
use crate::outln;
use crate::prom::{self, Sample};
use crate::relayproc::{RelayProcess, Session};

const STANDBY_PASSWORD: &str = "demo-standby";
const PRIMARY_PASSWORD: &str = "demo-primary";

/// What the live table and the summary show, from one scrape of `/metrics`.
#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    wal: f64,
    link: f64,
    payload: f64,
    messages: f64,
    integrity_failures: f64,
    lag: Option<f64>,
}

impl Totals {
    async fn read(port: u16) -> Result<Totals> {
        let s: Vec<Sample> = prom::scrape(port).await?;
        let up = [("half", "upstream")];
        let lag: Vec<f64> = s
            .iter()
            .filter(|x| {
                x.name == "walrelay_standby_lag_bytes"
                    && x.labels.get("half").map(String::as_str) == Some("downstream")
            })
            .map(|x| x.value)
            .collect();
        Ok(Totals {
            wal: prom::sum(&s, "walrelay_wal_received_bytes_total", &[]),
            link: prom::sum(&s, "walrelay_link_sent_bytes_total", &up)
                + prom::sum(&s, "walrelay_link_received_bytes_total", &up),
            payload: prom::sum(&s, "walrelay_link_payload_bytes_total", &up),
            messages: prom::sum(&s, "walrelay_link_messages_sent_total", &[]),
            integrity_failures: prom::sum(&s, "walrelay_integrity_failures_total", &[]),
            lag: lag.into_iter().reduce(f64::max),
        })
    }

    fn since(self, base: Totals) -> Totals {
        Totals {
            wal: self.wal - base.wal,
            link: self.link - base.link,
            payload: self.payload - base.payload,
            messages: self.messages - base.messages,
            ..self
        }
    }
}

/// Runs the demo with the `walrelay` binary `bin` for `seconds` of pgbench load.
pub async fn run(bin: &Path, seconds: u64) -> Result<()> {
    let install = PgInstall::discover().map_err(|e| anyhow::anyhow!("{e}\nThe demo needs PostgreSQL server binaries (initdb, postgres, pg_basebackup, pgbench): run scripts/install-deps.sh, or set PG_BIN to their bin directory."))?;
    outln!(
        "walrelay demo: PostgreSQL {} from {}",
        install.major,
        install.bindir.display()
    )?;
    let root = TempRoot::new().context("creating the demo directory")?;
    let primary_opts = PrimaryOpts {
        checkpoint_timeout: "30s".into(),
        // The load's WAL stays in pg_wal until the summary has compressed it offline.
        extra_conf: vec![("wal_keep_size".into(), keep_wal(seconds))],
        ..Default::default()
    };
    let primary = Cluster::init_primary(&install, &root, "primary", &primary_opts)
        .context("initdb of the primary")?;
    primary.start().await?;
    primary.create_replication_user(PRIMARY_PASSWORD).await?;

    let (up, down, metrics) = (free_port(), free_port(), free_port());
    let mut relay = start_relay(bin, &root, &primary, up, down, metrics)?;
    outln!("relay: standbys connect to 127.0.0.1:{down}, the link (mutual TLS) runs on 127.0.0.1:{up}, metrics on http://127.0.0.1:{metrics}/")?;
    let conninfo = format!("host=127.0.0.1 port={down} user=replicator password={STANDBY_PASSWORD} application_name=dc2_standby");
    let mut sopts = StandbyOpts::new(conninfo);
    sopts.application_name = Some("dc2_standby".into());
    let standby = primary
        .basebackup_standby(&root, "standby", &sopts)
        .context("pg_basebackup of the standby")?;
    standby.start().await?;
    outln!("standby started; initializing pgbench (scale 10) ...")?;
    let init =
        tokio::process::Command::from(primary.pgbench(&["-i", "-s", "10", "-q", "postgres"]))
            .kill_on_drop(true)
            .output();
    let init = tokio::time::timeout(Duration::from_secs(300), init)
        .await
        .context("pgbench -i took more than 5 minutes")??;
    anyhow::ensure!(
        init.status.success(),
        "pgbench -i failed: {}",
        String::from_utf8_lossy(&init.stderr)
    );
    crate::out::write("waiting for the standby to replay the initial load ... ")?;
    wait_replayed(&primary, &standby, Duration::from_secs(300), || None).await?;
    outln!("done")?;

    let r = live(&primary, &standby, &root, metrics, seconds).await;
    relay.terminate(Duration::from_secs(15));
    drop(standby);
    drop(primary);
    if r? {
        outln!("\ncleaned up {}", root.path().display())?;
    } else {
        outln!("interrupted: cleaned up {}", root.path().display())?;
    }
    Ok(())
}

fn start_relay(
    bin: &Path,
    root: &TempRoot,
    primary: &Cluster,
    up: u16,
    down: u16,
    metrics: u16,
) -> Result<RelayProcess> {
    let certs_dir = root.path().join("certs");
    std::fs::create_dir(&certs_dir)?;
    let certs = LinkCerts::generate(&certs_dir)?;
    // One process, both halves: the upstream's certificate serves the link and the
    // downstream presents it as its client certificate too (the same CA signed it).
    let toml = format!(
        "[upstream]\nprimary = {}\nlisten = \"127.0.0.1:{up}\"\n\n[downstream]\nlisten = \"127.0.0.1:{down}\"\nupstream = \"127.0.0.1:{up}\"\nauth = \"scram-sha-256\"\nusers = {{ replicator = {} }}\nspool_dir = {}\n\n[link]\n{}tls_server_name = \"localhost\"\n\n[log]\nlevel = \"warn\"\n\n[metrics]\nlisten = \"127.0.0.1:{metrics}\"\n",
        toml_str(&format!("host=127.0.0.1 port={} user=replicator password={PRIMARY_PASSWORD} sslmode=disable", primary.port())),
        toml_str(&walrelay_pgwire::scram::new_verifier(STANDBY_PASSWORD)),
        toml_str(&root.path().join("spool").display().to_string()),
        certs.upstream_toml(),
    );
    Ok(RelayProcess::start(
        bin,
        root.path(),
        "walrelay",
        &toml,
        &[up, down, metrics],
        None,
        Session::Caller,
    )?)
}

/// `wal_keep_size` for a load of `seconds`: pgbench here writes well under 20 MB a second.
fn keep_wal(seconds: u64) -> String {
    format!("{}MB", 1024u64.saturating_add(seconds.saturating_mul(20)))
}

/// The pgbench load with the live table, then the summary; false if interrupted (Ctrl-C).
async fn live(
    primary: &Cluster,
    standby: &Cluster,
    root: &TempRoot,
    metrics: u16,
    seconds: u64,
) -> Result<bool> {
    let from = primary
        .query_lsn("select pg_current_wal_lsn()::text")
        .await?;
    let base = Totals::read(metrics).await?;
    let load = tokio::process::Command::from(primary.pgbench(&[
        "-c",
        "4",
        "-j",
        "2",
        "-T",
        &seconds.to_string(),
        "postgres",
    ]))
    .kill_on_drop(true)
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()?;
    outln!("\npgbench: 4 clients for {seconds} s\n")?;
    outln!(
        "{:>5}  {:>12}  {:>12}  {:>8}  {:>14}",
        "t (s)",
        "WAL (MB)",
        "link (MB)",
        "ratio",
        "replay lag"
    )?;
    let started = Instant::now();
    let output = tokio::time::timeout(Duration::from_secs(seconds + 120), load.wait_with_output());
    tokio::pin!(output);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tick.tick().await;
    let out = loop {
        tokio::select! {
            out = &mut output => break out.context("pgbench did not end")??,
            _ = tick.tick() => {
                if let Ok(t) = Totals::read(metrics).await {
                    let d = t.since(base);
                    outln!("{:>5}  {:>12.1}  {:>12.2}  {:>8}  {:>14}", started.elapsed().as_secs(), d.wal / 1e6, d.link / 1e6, ratio(d.wal, d.link), lag(t.lag))?;
                }
            }
            _ = tokio::signal::ctrl_c() => return Ok(false),
        }
    };
    anyhow::ensure!(
        out.status.success(),
        "pgbench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_replayed(primary, standby, Duration::from_secs(120), || None).await?;
    let to = primary
        .query_lsn("select pg_current_wal_lsn()::text")
        .await?;
    // The downstream's lag gauge follows the standby's next status update (every second).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let now = Totals::read(metrics).await?;
    summary(&String::from_utf8_lossy(&out.stdout), now, base)?;
    match offline(primary, root, from.0, to.0).await {
        Ok(o) => o.print(now.since(base).link)?,
        Err(e) => outln!("  the same WAL offline: not measured ({e:#})")?,
    }
    Ok(true)
}

/// What `zstd -3` and `ssh -C` make of the load's WAL.
struct Offline {
    wal: u64,
    zstd3: u64,
    ssh_c: u64,
}

impl Offline {
    /// The summary's last lines: each baseline, and the link's bytes against it.
    fn print(&self, link: f64) -> Result<(), StdoutError> {
        outln!(
            "  the same WAL offline ({:.1} MB copied from the primary's pg_wal):",
            self.wal as f64 / 1e6
        )?;
        for (name, bytes) in [("zstd -3", self.zstd3), ("ssh -C", self.ssh_c)] {
            outln!(
                "    {name:<18} {:>10.2} MB (the link carried {:.2} x that)",
                bytes as f64 / 1e6,
                link / (bytes.max(1) as f64)
            )?;
        }
        Ok(())
    }
}

/// The primary's WAL [from, to) copied out of its `pg_wal`, then through the `zstd -3`
/// command and `ssh -C`'s compression ([`sshc`]).
async fn offline(primary: &Cluster, root: &TempRoot, from: u64, to: u64) -> Result<Offline> {
    let file = root.path().join("load.wal");
    let (dir, f) = (primary.wal_dir(), file.clone());
    tokio::task::spawn_blocking(move || walrange::copy_range(&dir, from, to, &f)).await??;
    let zstd3 = walrange::zstd_size(&file, &["-3"]).await?;
    let ssh_c = sshc::file_size(&file).await?;
    std::fs::remove_file(&file)?;
    Ok(Offline {
        wal: to - from,
        zstd3,
        ssh_c,
    })
}

fn summary(pgbench_out: &str, now: Totals, base: Totals) -> Result<(), StdoutError> {
    let d = now.since(base);
    let stats = pgbench_stats(pgbench_out);
    let tx: f64 = stats
        .get("transactions")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.0);
    outln!("\nsummary")?;
    outln!(
        "  pgbench:             {tx} transactions, {} tps",
        stats.get("tps").map(String::as_str).unwrap_or("?")
    )?;
    outln!("  WAL from the primary {:>10.1} MB", d.wal / 1e6)?;
    outln!(
        "  on the link          {:>10.2} MB (both directions, TLS and HTTP/2 framing included)",
        d.link / 1e6
    )?;
    outln!("  ratio                {:>10}", ratio(d.wal, d.link))?;
    outln!(
        "  of which WAL payload {:>10.2} MB in {} link messages",
        d.payload / 1e6,
        d.messages
    )?;
    if tx > 0.0 {
        outln!(
            "  per transaction      {:>10.0} WAL bytes -> {:.0} link bytes",
            d.wal / tx,
            d.link / tx
        )?;
    }
    outln!("  integrity failures   {:>10}", now.integrity_failures)?;
    outln!("  standby replay lag   {:>10}", lag(now.lag))
}

fn lag(bytes: Option<f64>) -> String {
    bytes
        .map(|b| format!("{:.1} kB", b / 1024.0))
        .unwrap_or_else(|| "?".into())
}

fn ratio(wal: f64, link: f64) -> String {
    if link <= 0.0 {
        "-".into()
    } else {
        format!("{:.1}x", wal / link)
    }
}

/// Picks "number of transactions actually processed" and "tps" out of pgbench's report.
fn pgbench_stats(out: &str) -> BTreeMap<&'static str, String> {
    let mut m = BTreeMap::new();
    for line in out.lines() {
        if let Some(v) = line.strip_prefix("number of transactions actually processed: ") {
            m.insert(
                "transactions",
                v.split(['/', ' ']).next().unwrap_or("").to_string(),
            );
        }
        if let Some(v) = line.strip_prefix("tps = ") {
            m.insert("tps", v.split(' ').next().unwrap_or("").to_string());
        }
    }
    m
}
