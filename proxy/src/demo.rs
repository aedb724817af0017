//! `walrelay demo`: a throw-away primary and standby in a temp directory, both halves in this
//! process with the standby streaming through them, a pgbench load, and a live table of what
//! the link saves. Everything is removed on exit and on Ctrl-C.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::config::{
    AuthMethod, Limits, LinkConfig, LogConfig, Resolved, ResolvedDownstream, ResolvedUpstream,
};
use crate::conninfo::{ConnInfo, SslMode};
use crate::metrics::Metrics;
use walrelay_harness::cluster::{
    free_port, wait_replayed, Cluster, PgInstall, PrimaryOpts, StandbyOpts, TempRoot,
};

const STANDBY_PASSWORD: &str = "demo-standby";
const PRIMARY_PASSWORD: &str = "demo-primary";

/// Runs the demo for `seconds` of pgbench load.
pub async fn run(seconds: u64) -> Result<()> {
    let install = match PgInstall::discover() {
        Ok(i) => i,
        Err(e) => {
            anyhow::bail!("{e}\nThe demo needs PostgreSQL server binaries (initdb, postgres, pg_basebackup, pgbench): run scripts/install-deps.sh, or set PG_BIN to their bin directory.")
        }
    };
    println!(
        "walrelay demo: PostgreSQL {} from {}",
        install.major,
        install.bindir.display()
    );
    let root = TempRoot::new().context("creating the demo directory")?;
    let primary_opts = PrimaryOpts {
        checkpoint_timeout: "30s".into(),
        ..Default::default()
    };
    let primary = Cluster::init_primary(&install, &root, "primary", &primary_opts)
        .context("initdb of the primary")?;
    primary.start().await?;
    primary.create_replication_user(PRIMARY_PASSWORD).await?;

    let (up_port, down_port) = (free_port(), free_port());
    let metrics = Metrics::new();
    let cfg = demo_config(&primary, up_port, down_port)?;
    let running = crate::relay::start(cfg, metrics.clone()).await?;
    println!("relay: standbys connect to 127.0.0.1:{down_port}, the link runs on 127.0.0.1:{up_port} (codec {})", crate::config::CodecKind::default().name());

    let conninfo = format!("host=127.0.0.1 port={down_port} user=replicator password={STANDBY_PASSWORD} application_name=dc2_standby");
    let mut sopts = StandbyOpts::new(conninfo);
    sopts.application_name = Some("dc2_standby".into());
    let standby = primary
        .basebackup_standby(&root, "standby", &sopts)
        .context("pg_basebackup of the standby")?;
    standby.start().await?;
    println!("standby started; initializing pgbench (scale 10) ...");
    let init =
        tokio::process::Command::from(primary.pgbench(&["-i", "-s", "10", "-q", "postgres"]))
            .output()
            .await?;
    anyhow::ensure!(
        init.status.success(),
        "pgbench -i failed: {}",
        String::from_utf8_lossy(&init.stderr)
    );

    print!("waiting for the standby to replay the initial load ... ");
    let _ = std::io::stdout().flush();
    wait_replayed(&primary, &standby, Duration::from_secs(300), || None).await?;
    println!("done");
    let base = metrics.snapshot();
    let base_lsn = primary
        .query_lsn("select pg_current_wal_lsn()::text")
        .await?;
    let mut load = tokio::process::Command::from(primary.pgbench(&[
        "-c",
        "4",
        "-j",
        "2",
        "-T",
        &seconds.to_string(),
        "postgres",
    ]));
    let load = load
        .kill_on_drop(true)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    println!("\npgbench: 4 clients for {seconds} s\n");
    println!(
        "{:>5}  {:>12}  {:>12}  {:>8}  {:>14}",
        "t (s)", "WAL (MB)", "link (MB)", "ratio", "replay lag"
    );
    let started = Instant::now();
    let output = load.wait_with_output();
    tokio::pin!(output);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tick.tick().await;
    let pgbench_out = loop {
        tokio::select! {
            out = &mut output => break out?,
            _ = tick.tick() => {
                let m = metrics.snapshot();
                let (wal, link) = (m.wal_bytes_in - base.wal_bytes_in, m.link_socket_bytes_out - base.link_socket_bytes_out);
                let lag = replay_lag(&primary, &standby).await.unwrap_or_else(|_| "?".into());
                println!("{:>5}  {:>12.1}  {:>12.2}  {:>8}  {:>14}", started.elapsed().as_secs(), mb(wal), mb(link), ratio(wal, link), lag);
                let _ = std::io::stdout().flush();
            }
            _ = tokio::signal::ctrl_c() => {
                println!("\ninterrupted: cleaning up");
                running.shutdown().await;
                return Ok(());
            }
        }
    };
    // Let the standby catch up, then summarize.
    let end_lsn = primary
        .query_lsn("select pg_current_wal_lsn()::text")
        .await?;
    wait_replayed(&primary, &standby, Duration::from_secs(60), || None).await?;
    let m = metrics.snapshot();
    let (wal, link) = (
        m.wal_bytes_in - base.wal_bytes_in,
        m.link_socket_bytes_out - base.link_socket_bytes_out,
    );
    let stats = pgbench_stats(&String::from_utf8_lossy(&pgbench_out.stdout));
    let tx: u64 = stats
        .get("transactions")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    println!("\nsummary");
    println!(
        "  pgbench:             {} transactions, {} tps",
        tx,
        stats.get("tps").map(String::as_str).unwrap_or("?")
    );
    println!(
        "  WAL from the primary {:>10.1} MB ({} bytes since the load began, LSN {} .. {})",
        mb(wal),
        wal,
        base_lsn,
        end_lsn
    );
    println!(
        "  on the link          {:>10.2} MB (TLS-less demo link: HTTP/2 framing included)",
        mb(link)
    );
    println!("  ratio                {:>10}", ratio(wal, link));
    println!(
        "  of which WAL payload {:>10.2} MB in {} link messages",
        mb(m.wal_payload_bytes_out - base.wal_payload_bytes_out),
        m.link_messages_out - base.link_messages_out
    );
    if tx > 0 {
        println!(
            "  per transaction      {:>10} WAL bytes -> {} link bytes",
            wal / tx,
            link / tx
        );
    }
    println!("  integrity failures   {:>10}", m.integrity_failures);
    println!(
        "  standby replay lag   {:>10}",
        replay_lag(&primary, &standby)
            .await
            .unwrap_or_else(|_| "?".into())
    );
    running.shutdown().await;
    drop(standby);
    drop(primary);
    println!("\ncleaned up {}", root.path().display());
    Ok(())
}

fn demo_config(primary: &Cluster, up_port: u16, down_port: u16) -> Result<Resolved> {
    let verifier = walrelay_pgwire::scram::new_verifier(STANDBY_PASSWORD)
        .parse()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut primary_ci = ConnInfo::parse(&format!(
        "host=127.0.0.1 port={} user=replicator password={PRIMARY_PASSWORD}",
        primary.port()
    ))?;
    primary_ci.sslmode = SslMode::Disable;
    Ok(Resolved {
        metrics: None,
        upstream: Some(ResolvedUpstream {
            primary: primary_ci,
            slot: None,
            listen: ([127, 0, 0, 1], up_port).into(),
        }),
        downstream: Some(ResolvedDownstream {
            listen: ([127, 0, 0, 1], down_port).into(),
            upstream: format!("127.0.0.1:{up_port}").parse()?,
            auth: AuthMethod::ScramSha256,
            users: BTreeMap::from([("replicator".to_string(), verifier)]),
            tls: None,
        }),
        link: LinkConfig {
            plaintext: true,
            ..Default::default()
        },
        limits: Limits::default(),
        log: LogConfig::default(),
        as_written: Default::default(),
    })
}

async fn replay_lag(primary: &Cluster, standby: &Cluster) -> Result<String> {
    let p = primary
        .query_lsn("select pg_current_wal_lsn()::text")
        .await?;
    let s = standby
        .query_lsn("select pg_last_wal_replay_lsn()::text")
        .await?;
    Ok(format!("{:.1} kB", p.0.saturating_sub(s.0) as f64 / 1024.0))
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

fn ratio(wal: u64, link: u64) -> String {
    if link == 0 {
        "-".into()
    } else {
        format!("{:.1}x", wal as f64 / link as f64)
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
