//! `walrelay bench`: side-by-side link bandwidth and CPU of walrelay's codec and generic
//! streaming zstd-3, on the same WAL in the same run.
//!
//! Per workload: a fresh primary and standby; the two halves each on their own thread (a
//! current-thread tokio runtime), so each half's CPU time is measured separately; the upstream
//! also feeds every message to a shadow zstd-3 encoder/decoder (flushed per message, as a
//! generic compressing tunnel would) and counts its bytes and time. Checkpoints run every
//! third of the load so full-page images appear as in production. Afterwards the codec
//! micro-benchmark replays the primary's WAL of the run through the codec on one core.
//!
//! This is a benchmark, not a test: nothing here asserts a timing.

mod micro;
pub mod shadow;
mod workloads;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

pub use workloads::Workload;

use crate::config::{
    AuthMethod, CodecKind, Limits, LinkConfig, LogConfig, Resolved, ResolvedDownstream,
    ResolvedUpstream,
};
use crate::conninfo::{ConnInfo, SslMode};
use crate::metrics::Metrics;
use walrelay_harness::cluster::{
    free_port, Cluster, PgInstall, PrimaryOpts, StandbyOpts, TempRoot,
};
use walrelay_wal::lsn::Lsn;

/// What one workload measured.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub workload: String,
    pub pg_major: u32,
    pub codec: String,
    pub seconds: u64,
    pub wal_bytes: u64,
    /// Bytes on the link socket, both directions, TLS-less link: HTTP/2 and gRPC framing included.
    pub link_bytes: u64,
    pub link_bytes_to_standby: u64,
    /// Generic streaming zstd-3 of the same messages (payload only, no framing).
    pub zstd3_bytes: u64,
    pub link_vs_zstd3: f64,
    pub ratio_walrelay: f64,
    pub ratio_zstd3: f64,
    /// CPU seconds per GB of WAL: whole halves, and the codecs alone.
    pub upstream_cpu_s_per_gb: f64,
    pub downstream_cpu_s_per_gb: f64,
    pub codec_encode_s_per_gb: f64,
    pub codec_decode_s_per_gb: f64,
    pub zstd3_encode_s_per_gb: f64,
    pub zstd3_decode_s_per_gb: f64,
    pub codec_cpu_vs_zstd3: f64,
    /// Standby replay lag sampled every second during the load (bytes).
    pub replay_lag_max_bytes: u64,
    pub replay_lag_mean_bytes: u64,
    pub integrity_failures: u64,
    pub micro: Option<micro::MicroResult>,
}

/// Runs the workloads and prints a markdown table; returns the rows.
pub async fn run(workloads: &[Workload], seconds: u64, codec: CodecKind) -> Result<Vec<Row>> {
    let install = PgInstall::discover().context(
        "the bench needs PostgreSQL server binaries (scripts/install-deps.sh, or PG_BIN)",
    )?;
    let mut rows = Vec::new();
    for w in workloads {
        eprintln!(
            "bench: {} for {seconds} s (PostgreSQL {}, codec {}) ...",
            w.name(),
            install.major,
            codec.name()
        );
        let row = run_one(&install, *w, seconds, codec)
            .await
            .with_context(|| format!("workload {}", w.name()))?;
        eprintln!(
            "bench: {}: {:.1} MB WAL -> {:.2} MB link ({:.2}x zstd-3)",
            w.name(),
            row.wal_bytes as f64 / 1e6,
            row.link_bytes as f64 / 1e6,
            row.link_vs_zstd3
        );
        rows.push(row);
    }
    Ok(rows)
}

async fn run_one(install: &PgInstall, w: Workload, seconds: u64, codec: CodecKind) -> Result<Row> {
    let root = TempRoot::new()?;
    let popts = PrimaryOpts {
        checkpoint_timeout: "30s".into(),
        wal_compression: w.wal_compression().into(),
        wal_level: w.wal_level().into(),
        extra_conf: vec![("max_wal_size".into(), "4GB".into())],
        ..Default::default()
    };
    let primary = Cluster::init_primary(install, &root, "primary", &popts)?;
    primary.start().await?;
    primary.create_replication_user("bench-primary").await?;
    let (up_port, down_port) = (free_port(), free_port());
    let metrics = Metrics::new();
    let (up_cfg, down_cfg) = configs(&primary, up_port, down_port, codec)?;
    let up = HalfThread::spawn("upstream", up_cfg, metrics.clone())?;
    let down = HalfThread::spawn("downstream", down_cfg, metrics.clone())?;
    let mut sopts = StandbyOpts::new(format!("host=127.0.0.1 port={down_port} user=replicator password=bench-standby application_name=bench_standby"));
    sopts.application_name = Some("bench_standby".into());
    let standby = primary.basebackup_standby(&root, "standby", &sopts)?;
    standby.start().await?;

    w.prepare(&primary).await?;
    primary.execute("checkpoint").await?;
    wait_caught_up(&primary, &standby, &metrics).await?;
    let base = metrics.snapshot();
    let base_lsn = primary
        .query_lsn("select pg_current_wal_lsn()::text")
        .await?
        .0;
    let (up_cpu0, down_cpu0) = (up.cpu(), down.cpu());

    let mut load = w.load(&primary, seconds).await?;
    let started = Instant::now();
    let mut lags = Vec::new();
    let mut next_checkpoint = Duration::from_secs(seconds.div_ceil(3).max(1));
    loop {
        tokio::select! {
            r = load.wait() => break r.with_context(|| format!("the {} load failed", w.name()))?,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {
                if let (Ok(p), Ok(s)) = (primary.query_lsn("select pg_current_wal_lsn()::text").await, standby.query_lsn("select pg_last_wal_replay_lsn()::text").await) {
                    lags.push(p.0.saturating_sub(s.0));
                }
                if started.elapsed() >= next_checkpoint {
                    primary.execute("checkpoint").await?;
                    next_checkpoint += Duration::from_secs(seconds.div_ceil(3).max(1));
                }
            }
        }
    }
    wait_caught_up(&primary, &standby, &metrics).await?;
    let end_lsn = primary
        .query_lsn("select pg_current_wal_lsn()::text")
        .await?
        .0;
    let m = metrics.snapshot();
    let (up_cpu, down_cpu) = (up.cpu() - up_cpu0, down.cpu() - down_cpu0);
    up.stop();
    down.stop();

    let micro = micro::run(&primary, install.major, Lsn(base_lsn), Lsn(end_lsn)).ok();
    let wal = m.wal_bytes_in - base.wal_bytes_in;
    let link_out = m.link_socket_bytes_out - base.link_socket_bytes_out;
    let link = link_out + (m.link_socket_bytes_in - base.link_socket_bytes_in);
    let zstd3 = m.shadow_zstd_bytes - base.shadow_zstd_bytes;
    let gb = wal as f64 / 1e9;
    let per_gb = |ns: u64| if gb > 0.0 { ns as f64 / 1e9 / gb } else { 0.0 };
    let (enc, dec) = (
        per_gb(m.encode_ns - base.encode_ns),
        per_gb(m.decode_ns - base.decode_ns),
    );
    let (zenc, zdec) = (
        per_gb(m.shadow_encode_ns - base.shadow_encode_ns),
        per_gb(m.shadow_decode_ns - base.shadow_decode_ns),
    );
    // The upstream thread also ran the shadow zstd-3: that time is not walrelay's.
    let shadow_s = (m.shadow_encode_ns - base.shadow_encode_ns + m.shadow_decode_ns
        - base.shadow_decode_ns) as f64
        / 1e9;
    Ok(Row {
        workload: w.name().into(),
        pg_major: install.major,
        codec: codec.name().into(),
        seconds,
        wal_bytes: wal,
        link_bytes: link,
        link_bytes_to_standby: link_out,
        zstd3_bytes: zstd3,
        link_vs_zstd3: ratio(link, zstd3),
        ratio_walrelay: ratio(wal, link),
        ratio_zstd3: ratio(wal, zstd3),
        upstream_cpu_s_per_gb: if gb > 0.0 {
            (up_cpu - shadow_s).max(0.0) / gb
        } else {
            0.0
        },
        downstream_cpu_s_per_gb: if gb > 0.0 { down_cpu / gb } else { 0.0 },
        codec_encode_s_per_gb: enc,
        codec_decode_s_per_gb: dec,
        zstd3_encode_s_per_gb: zenc,
        zstd3_decode_s_per_gb: zdec,
        codec_cpu_vs_zstd3: if zenc + zdec > 0.0 {
            (enc + dec) / (zenc + zdec)
        } else {
            0.0
        },
        replay_lag_max_bytes: lags.iter().copied().max().unwrap_or(0),
        replay_lag_mean_bytes: if lags.is_empty() {
            0
        } else {
            lags.iter().sum::<u64>() / lags.len() as u64
        },
        integrity_failures: m.integrity_failures - base.integrity_failures,
        micro,
    })
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Upstream-only and downstream-only configs (plaintext loopback link, SCRAM for the standby).
fn configs(
    primary: &Cluster,
    up_port: u16,
    down_port: u16,
    codec: CodecKind,
) -> Result<(Resolved, Resolved)> {
    let mut primary_ci = ConnInfo::parse(&format!(
        "host=127.0.0.1 port={} user=replicator password=bench-primary",
        primary.port()
    ))?;
    primary_ci.sslmode = SslMode::Disable;
    let verifier = walrelay_pgwire::scram::new_verifier("bench-standby")
        .parse()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let link = LinkConfig {
        plaintext: true,
        codec,
        bench_shadow_zstd: true,
        ..Default::default()
    };
    let base = Resolved {
        upstream: None,
        downstream: None,
        link,
        limits: Limits::default(),
        log: LogConfig::default(),
        metrics: None,
        as_written: Default::default(),
    };
    let up = Resolved {
        upstream: Some(ResolvedUpstream {
            primary: primary_ci,
            slot: None,
            listen: ([127, 0, 0, 1], up_port).into(),
        }),
        ..base.clone()
    };
    let down = Resolved {
        downstream: Some(ResolvedDownstream {
            listen: ([127, 0, 0, 1], down_port).into(),
            upstream: format!("127.0.0.1:{up_port}").parse()?,
            auth: AuthMethod::ScramSha256,
            users: [("replicator".to_string(), verifier)].into(),
            tls: None,
        }),
        ..base
    };
    Ok((up, down))
}

/// One half on its own thread and current-thread runtime, so its CPU time can be read.
struct HalfThread {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    join: Option<std::thread::JoinHandle<()>>,
    cpu_ns: Arc<std::sync::atomic::AtomicU64>,
}

impl HalfThread {
    fn spawn(name: &str, cfg: Resolved, metrics: Arc<Metrics>) -> Result<HalfThread> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let cpu_ns = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let cpu = cpu_ns.clone();
        let join = std::thread::Builder::new()
            .name(format!("bench-{name}"))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => return drop(ready_tx.send(Err(e.to_string()))),
                };
                rt.block_on(async move {
                    let running = match crate::relay::start(cfg, metrics).await {
                        Ok(r) => r,
                        Err(e) => return drop(ready_tx.send(Err(format!("{e:#}")))),
                    };
                    let _ = ready_tx.send(Ok(()));
                    // Publish this thread's CPU time every 100 ms until told to stop.
                    let mut stop_rx = stop_rx;
                    loop {
                        cpu.store(
                            crate::metrics::thread_cpu_ns(),
                            std::sync::atomic::Ordering::Relaxed,
                        );
                        tokio::select! {
                            _ = &mut stop_rx => break,
                            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                        }
                    }
                    running.shutdown().await;
                });
            })?;
        ready_rx
            .recv()
            .context("half thread died")?
            .map_err(|e| anyhow::anyhow!(e))?;
        Ok(HalfThread {
            stop: Some(stop_tx),
            join: Some(join),
            cpu_ns,
        })
    }

    /// CPU seconds used by the half's thread so far (sampled every 100 ms).
    fn cpu(&self) -> f64 {
        self.cpu_ns.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e9
    }

    fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

/// Waits for the standby to replay what the primary wrote; fails at once on an integrity
/// failure (the bench measures the codec: a failure must be loud, not averaged away).
async fn wait_caught_up(primary: &Cluster, standby: &Cluster, metrics: &Metrics) -> Result<()> {
    let give_up = || {
        (metrics.snapshot().integrity_failures > 0).then(|| {
            "WAL failed verification on the link (see the log with RUST_LOG=walrelay=warn)"
                .to_string()
        })
    };
    Ok(walrelay_harness::cluster::wait_replayed(
        primary,
        standby,
        Duration::from_secs(600),
        give_up,
    )
    .await?)
}

/// The markdown table of a run.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| workload | WAL MB | walrelay link MB | zstd-3 MB | link / zstd-3 | ratio walrelay | ratio zstd-3 | codec CPU s/GB (enc+dec) | zstd-3 CPU s/GB (enc+dec) | upstream / downstream CPU s/GB | replay lag max | encode MB/s | decode MB/s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let (e, d) = r
            .micro
            .as_ref()
            .map(|m| {
                (
                    format!("{:.0}", m.encode_mb_s),
                    format!("{:.0}", m.decode_mb_s),
                )
            })
            .unwrap_or(("-".into(), "-".into()));
        s.push_str(&format!(
            "| {} | {:.1} | {:.2} | {:.2} | {:.2} | {:.1}x | {:.1}x | {:.2} + {:.2} | {:.2} + {:.2} | {:.1} / {:.1} | {:.1} MB | {e} | {d} |\n",
            r.workload,
            r.wal_bytes as f64 / 1e6,
            r.link_bytes as f64 / 1e6,
            r.zstd3_bytes as f64 / 1e6,
            r.link_vs_zstd3,
            r.ratio_walrelay,
            r.ratio_zstd3,
            r.codec_encode_s_per_gb,
            r.codec_decode_s_per_gb,
            r.zstd3_encode_s_per_gb,
            r.zstd3_decode_s_per_gb,
            r.upstream_cpu_s_per_gb,
            r.downstream_cpu_s_per_gb,
            r.replay_lag_max_bytes as f64 / 1e6,
        ));
    }
    s.push_str(&rmgr_markdown(rows));
    s
}

/// Per workload and resource manager: bytes in and out of the WAL-aware codec (from the
/// micro-benchmark's pass over the run's WAL), largest first.
fn rmgr_markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "\n| workload | resource manager | records | WAL MB in | codec MB out | out / in |\n|---|---|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let Some(m) = &r.micro else { continue };
        let mut by = m.by_rmgr.clone();
        by.sort_by_key(|x| std::cmp::Reverse(x.bytes_in));
        for x in by.iter().filter(|x| x.bytes_in >= 1 << 16) {
            s.push_str(&format!(
                "| {} | {} | {} | {:.2} | {:.3} | {:.3} |\n",
                r.workload,
                x.rmgr,
                x.records,
                x.bytes_in as f64 / 1e6,
                x.bytes_out as f64 / 1e6,
                ratio(x.bytes_out, x.bytes_in),
            ));
        }
        if m.tuple_deltas + m.tuple_misses > 0 {
            s.push_str(&format!(
                "| {} | (heap tuples as deltas) | {} of {} | | {:.2} MB saved | |\n",
                r.workload,
                m.tuple_deltas,
                m.tuple_deltas + m.tuple_misses,
                m.tuple_delta_saved as f64 / 1e6,
            ));
        }
    }
    s
}
