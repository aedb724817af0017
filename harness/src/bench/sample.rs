//! Sampling a run every ~100 ms (the primary's WAL position, what each standby received and
//! replayed, each pair's counters, every stage's position: [`super::stages`]) and cutting
//! windows out of the samples; the lags per stage and over the run, and the CSV timeline.
//!
//! A window's WAL range [L0, L1) is the primary's WAL position (`pg_current_wal_lsn()`) at the
//! window's first and last sample; a pair is charged what its counters moved between the first
//! samples at which its standby had received L0 and L1, so both pairs pay for exactly the same
//! WAL even when one lags.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;
use tokio_postgres::{Client, SimpleQueryMessage};

use super::apply::Startup;
use super::pair::{PairCounters, RelayPair};
use super::stages::{self, LagPart, PathLags, PrimaryPositions, RelayPositions, StageLags};
use crate::cluster::Cluster;

/// One moment of a run; index 0 is pair W (`wal` codec), 1 pair Z (`zstd`).
#[derive(Debug, Clone)]
pub struct Sample {
    /// Seconds since t = 0.
    pub t: f64,
    pub primary_lsn: u64,
    pub received: [u64; 2],
    pub replayed: [u64; 2],
    /// Receive and replay positions of the standby connected to the primary directly.
    pub direct_received: u64,
    pub direct_replayed: u64,
    /// The direct standby's startup process ([`super::apply`]): its pid and the CPU seconds
    /// it has used so far (None while it was not found).
    pub direct_apply: Option<(u32, f64)>,
    pub pairs: [PairCounters; 2],
    /// The primary's flush position and what its walsenders sent.
    pub primary: PrimaryPositions,
    /// Pair W's relay stages (None when its metrics were not read or had no standby yet).
    pub w_relay: Option<RelayPositions>,
    /// The machine's CPU pressure so far: seconds during which some runnable task waited for
    /// a core ([`crate::cpuwait`]; NaN where the kernel does not keep it).
    pub cpu_pressure: f64,
}

/// Persistent connections to the primary, both standbys behind relays and the direct one.
pub struct Sampler {
    primary: Client,
    standbys: [Client; 2],
    direct: Client,
    direct_startup: Startup,
    t0: Instant,
    /// The primary's query ([`stages::primary_sql`]).
    primary_sql: String,
}

async fn lsns(c: &Client, sql: &str) -> Result<Vec<u64>> {
    lsns_or_null(c, sql)
        .await?
        .into_iter()
        .map(|v| v.context("NULL position (not streaming?)"))
        .collect()
}

/// The first row's columns as positions; NULL as None.
async fn lsns_or_null(c: &Client, sql: &str) -> Result<Vec<Option<u64>>> {
    let rows = c.simple_query(sql).await?;
    let row = rows
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r),
            _ => None,
        })
        .context("no row")?;
    (0..row.len())
        .map(|i| {
            let Some(s) = row.get(i) else { return Ok(None) };
            Ok(Some(
                s.parse::<walrelay_wal::lsn::Lsn>()
                    .map_err(|e| anyhow::anyhow!("{s:?}: {e}"))?
                    .0,
            ))
        })
        .collect()
}

impl Sampler {
    /// `apps`: application_name of pair W's feed, pair Z's feed and the direct standby.
    pub async fn connect(
        primary: &Cluster,
        standbys: [&Cluster; 2],
        direct: &Cluster,
        apps: [&str; 3],
        t0: Instant,
    ) -> Result<Self> {
        Ok(Sampler {
            primary: primary.connect().await?,
            standbys: [standbys[0].connect().await?, standbys[1].connect().await?],
            direct: direct.connect().await?,
            direct_startup: Startup::under(direct.postmaster_pid()),
            t0,
            primary_sql: stages::primary_sql(apps),
        })
    }

    /// One sample (5 s at most); `scrape` also reads pair W's metrics.
    pub async fn sample(&self, pairs: &[RelayPair; 2], scrape: bool) -> Result<Sample> {
        let standby_sql = "select pg_last_wal_receive_lsn()::text, pg_last_wal_replay_lsn()::text";
        let take = async {
            let (p, s0, s1, d, c0, c1) = tokio::try_join!(
                lsns_or_null(&self.primary, &self.primary_sql),
                lsns(&self.standbys[0], standby_sql),
                lsns(&self.standbys[1], standby_sql),
                lsns(&self.direct, standby_sql),
                pairs[0].counters(scrape),
                pairs[1].counters(false),
            )?;
            let written = p[0].context("no pg_current_wal_lsn()")?;
            Ok::<_, anyhow::Error>(Sample {
                t: self.t0.elapsed().as_secs_f64(),
                primary_lsn: written,
                primary: PrimaryPositions {
                    flushed: p[1].unwrap_or(written),
                    sent: [p[2], p[3], p[4]],
                },
                w_relay: c0.1,
                received: [s0[0], s1[0]],
                replayed: [s0[1], s1[1]],
                direct_received: d[0],
                direct_replayed: d[1],
                direct_apply: self.direct_startup.cpu_seconds(),
                pairs: [c0.0, c1.0],
                cpu_pressure: crate::cpuwait::machine_pressure_seconds().unwrap_or(f64::NAN),
            })
        };
        tokio::time::timeout(Duration::from_secs(5), take)
            .await
            .context("a sample took more than 5 s")?
    }
}

/// What one pair moved over a window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PairCut {
    /// Seconds (since t = 0) of the samples at which the standby had received L0 and L1.
    pub t0: f64,
    pub t1: f64,
    pub toward_standby: u64,
    pub toward_primary: u64,
    pub cpu_up_s: f64,
    pub cpu_down_s: f64,
    /// Of those, the seconds in the kernel.
    pub kernel_up_s: f64,
    pub kernel_down_s: f64,
    /// None when not scraped (pair Z).
    pub messages: Option<f64>,
    pub payload: Option<f64>,
    /// WAL runs the upstream and the downstream staged ahead while behind (None when not
    /// scraped).
    pub staged_up: Option<f64>,
    pub staged_down: Option<f64>,
    /// Batches the upstream encoded at the fast zstd level (None when not scraped).
    pub fast_up: Option<f64>,
    /// Times the upstream turned the fast level on (None when not scraped).
    pub fast_spells_up: Option<f64>,
    /// What the upstream's codec counted over the window (None when not scraped).
    pub codec: Option<CodecCut>,
    /// Seconds the upstream's and the downstream's threads waited for a core (None where the
    /// kernel does not keep it).
    pub wait_up_s: Option<f64>,
    pub wait_down_s: Option<f64>,
    /// The upstream's and the downstream's largest resident set up to the window's end,
    /// bytes (None when unknown).
    pub peak_rss_up: Option<f64>,
    pub peak_rss_down: Option<f64>,
    /// WAL the upstream had handed to the link (its payload counted) that the standby had not
    /// yet received, the larger at the two samples the pair is charged between: the bound on
    /// payload counted but not yet past the link's socket count there (pair W only; None
    /// without W's positions).
    pub inflight_wal: Option<u64>,
    /// Largest primary position − standby replay position over the window's samples.
    pub max_replay_lag: u64,
    /// Largest primary position − standby receive position: the part of the lag that is the
    /// relay path (the rest is the standby's own replay).
    pub max_receive_lag: u64,
}

/// The upstream's codec over a window (`pair::CODEC_COUNTERS`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CodecCut {
    /// Records a link message's end cut (passed raw), and records held back whole for the
    /// next message instead.
    pub records_cut: f64,
    pub records_held: f64,
    /// Images through the block cache, and of those, cache hits.
    pub fpis: f64,
    pub fpi_cache_hits: f64,
}

impl CodecCut {
    /// `b − a`, when both were scraped.
    fn between(a: &[f64; 4], b: &[f64; 4]) -> Option<CodecCut> {
        if a.iter().chain(b).any(|x| !x.is_finite()) {
            return None;
        }
        Some(CodecCut {
            records_cut: b[0] - a[0],
            records_held: b[1] - a[1],
            fpis: b[2] - a[2],
            fpi_cache_hits: b[3] - a[3],
        })
    }
}

/// A window cut out of the samples.
#[derive(Debug, Clone)]
pub struct Cut {
    pub t_start: f64,
    pub t_end: f64,
    pub lsn_start: u64,
    pub lsn_end: u64,
    pub pairs: [PairCut; 2],
    /// Largest primary position − direct standby's replay / receive position over the window.
    pub direct_max_replay_lag: u64,
    pub direct_max_receive_lag: u64,
    /// CPU seconds the direct standby's startup process used to apply the window's WAL:
    /// from the first sample at which the standby had replayed its start to the first at
    /// which it had replayed its end (None where it was not found at both, or they were
    /// not the same process).
    pub direct_apply_cpu_s: Option<f64>,
    /// Largest lag at each stage of each path ([`stages`]).
    pub stages: StageLags,
    /// Share of the window during which some runnable task on the machine waited for a core
    /// (None where the kernel does not keep it).
    pub cpu_pressure: Option<f64>,
}

/// Largest `primary position − pos(sample)` over `samples` (0 without samples).
fn max_lag(samples: &[Sample], pos: impl Fn(&Sample) -> u64) -> u64 {
    max_lag_of(samples, |s| Some(pos(s))).unwrap_or(0)
}

fn first(samples: &[Sample], pred: impl Fn(&Sample) -> bool) -> Option<usize> {
    samples.iter().position(pred)
}

/// The primary's position at the first sample at or after `t` (None before it was sampled).
pub fn lsn_at(samples: &[Sample], t: f64) -> Option<u64> {
    first(samples, |s| s.t >= t).map(|i| samples[i].primary_lsn)
}

/// Whether the direct standby had replayed, by the last sample, the WAL up to the end of
/// the window that ends at `t_end` (where [`cut`] ends it): then its apply CPU for the
/// window is known.
pub fn direct_replayed(samples: &[Sample], t_end: f64) -> bool {
    let end = lsn_at(samples, t_end);
    samples
        .last()
        .zip(end)
        .is_some_and(|(s, end)| s.direct_replayed >= end)
}

/// Cuts window [`t_start`, `t_end`] (seconds since t = 0). Errors if the samples do not reach
/// that far or a standby never received the window's end.
pub fn cut(samples: &[Sample], t_start: f64, t_end: f64) -> Result<Cut> {
    let i0 = first(samples, |s| s.t >= t_start).context("no sample at the window's start")?;
    let i1 = first(samples, |s| s.t >= t_end).context("no sample at the window's end")?;
    let (l0, l1) = (samples[i0].primary_lsn, samples[i1].primary_lsn);
    anyhow::ensure!(
        l1 > l0,
        "the primary wrote no WAL in the window, from t = {:.1} s to t = {:.1} s (its position \
         stayed at {}): there is nothing to measure (did the load stall? pgbench's output is \
         in load.out and load.err of the run's directory, kept with WALRELAY_KEEP_TMP=1)",
        samples[i0].t,
        samples[i1].t,
        walrelay_wal::lsn::Lsn(l0)
    );
    // A standby that stopped streaming keeps its last positions: the reference's lag would
    // grow with the primary's and make the relayed standbys' look small beside it.
    if let Some(s) = samples[i0..=i1]
        .iter()
        .find(|s| s.primary.sent[2].is_none())
    {
        anyhow::bail!(
            "the standby connected to the primary directly, the reference for replay lag, was \
             not streaming from it at t = {:.1} s (no walsender of it in pg_stat_replication): \
             the window's lags have no reference (its log, standby_lag_ref/postgres.log, is kept with \
             WALRELAY_KEEP_TMP=1)",
            s.t
        );
    }
    let stages = lags(&samples[i0..=i1]);
    let pair = |p: usize, lag: &PathLags| -> Result<PairCut> {
        let j0 = first(samples, |s| s.received[p] >= l0)
            .with_context(|| format!("standby {p} never received the window's start"))?;
        let j1 = first(samples, |s| s.received[p] >= l1)
            .with_context(|| format!("standby {p} never received the window's end"))?;
        let (a, b) = (&samples[j0].pairs[p], &samples[j1].pairs[p]);
        let num = |x: f64, y: f64| (x.is_finite() && y.is_finite()).then_some(y - x);
        let inflight = |j: usize| {
            let s = &samples[j];
            s.w_relay
                .filter(|_| p == 0)
                .map(|r| r.sent_down.saturating_sub(s.received[p]))
        };
        Ok(PairCut {
            t0: samples[j0].t,
            t1: samples[j1].t,
            toward_standby: b.toward_standby - a.toward_standby,
            toward_primary: b.toward_primary - a.toward_primary,
            cpu_up_s: b.cpu_up - a.cpu_up,
            cpu_down_s: b.cpu_down - a.cpu_down,
            kernel_up_s: b.kernel_up - a.kernel_up,
            kernel_down_s: b.kernel_down - a.kernel_down,
            messages: num(a.messages, b.messages),
            payload: num(a.payload, b.payload),
            staged_up: num(a.staged[0], b.staged[0]),
            staged_down: num(a.staged[1], b.staged[1]),
            fast_up: num(a.fast, b.fast),
            fast_spells_up: num(a.fast_spells, b.fast_spells),
            codec: CodecCut::between(&a.codec, &b.codec),
            wait_up_s: num(a.wait_up, b.wait_up),
            wait_down_s: num(a.wait_down, b.wait_down),
            peak_rss_up: b.peak_rss_up.is_finite().then_some(b.peak_rss_up),
            peak_rss_down: b.peak_rss_down.is_finite().then_some(b.peak_rss_down),
            inflight_wal: inflight(j0).zip(inflight(j1)).map(|(x, y)| x.max(y)),
            max_replay_lag: lag.replayed,
            max_receive_lag: lag.received,
        })
    };
    let (s0, s1) = (&samples[i0], &samples[i1]);
    let pressure = s1.cpu_pressure - s0.cpu_pressure;
    Ok(Cut {
        cpu_pressure: (pressure.is_finite() && s1.t > s0.t).then(|| pressure / (s1.t - s0.t)),
        t_start: s0.t,
        t_end: s1.t,
        lsn_start: l0,
        lsn_end: l1,
        pairs: [pair(0, &stages.w)?, pair(1, &stages.z)?],
        direct_max_replay_lag: stages.direct.replayed,
        direct_max_receive_lag: stages.direct.received,
        direct_apply_cpu_s: apply_cpu(samples, l0, l1),
        stages,
    })
}

/// What the direct standby's startup process spent applying [`l0`, `l1`) ([`Cut`]).
fn apply_cpu(samples: &[Sample], l0: u64, l1: u64) -> Option<f64> {
    let at = |l: u64| {
        samples
            .iter()
            .find(|s| s.direct_replayed >= l)?
            .direct_apply
    };
    let ((p0, c0), (p1, c1)) = (at(l0)?, at(l1)?);
    (p0 == p1).then_some(c1 - c0)
}

/// Largest `primary position − pos(sample)` over the samples that have `pos`.
fn max_lag_of(samples: &[Sample], pos: impl Fn(&Sample) -> Option<u64>) -> Option<u64> {
    samples
        .iter()
        .filter_map(|s| pos(s).map(|p| s.primary_lsn.saturating_sub(p)))
        .max()
}

/// Mean of `primary position − pos(sample)` over `samples` (0 without samples).
fn mean_lag(samples: &[Sample], pos: &dyn Fn(&Sample) -> u64) -> u64 {
    let sum: u128 = samples
        .iter()
        .map(|s| u128::from(s.primary_lsn.saturating_sub(pos(s))))
        .sum();
    u64::try_from(sum / samples.len().max(1) as u128).unwrap_or(u64::MAX)
}

/// The lags of every stage over `samples` (one window's).
pub fn lags(samples: &[Sample]) -> StageLags {
    let path =
        |sent: usize, recv: &dyn Fn(&Sample) -> u64, replay: &dyn Fn(&Sample) -> u64| PathLags {
            primary_sent: max_lag_of(samples, |s| s.primary.sent[sent]),
            received: max_lag(samples, recv),
            replayed: max_lag(samples, replay),
            mean_replayed: mean_lag(samples, replay),
        };
    let relay = |f: fn(&RelayPositions) -> u64| max_lag_of(samples, |s| s.w_relay.as_ref().map(f));
    StageLags {
        flushed: max_lag(samples, |s| s.primary.flushed),
        direct: path(2, &|s| s.direct_received, &|s| s.direct_replayed),
        z: path(1, &|s| s.received[1], &|s| s.replayed[1]),
        w: path(0, &|s| s.received[0], &|s| s.replayed[0]),
        w_sent_down: relay(|r| r.sent_down),
        w_spooled: relay(|r| r.spooled),
        w_sent_to_standby: relay(|r| r.sent_to_standby),
    }
}

/// The mean replay lags over `parts` equal parts of [0, `t_end`]: a lag that grows over the
/// run shows as parts that rise (a part without samples is left out).
pub fn lag_over_run(samples: &[Sample], t_end: f64, parts: usize) -> Vec<LagPart> {
    let step = t_end / parts.max(1) as f64;
    (0..parts)
        .filter_map(|i| {
            let (a, b) = (step * i as f64, step * (i + 1) as f64);
            let lo = samples.partition_point(|s| s.t < a);
            let hi = samples.partition_point(|s| s.t < b);
            let part = samples.get(lo..hi).filter(|p| !p.is_empty())?;
            Some(LagPart {
                t_start: a,
                t_end: b,
                w: mean_lag(part, &|s| s.replayed[0]),
                z: mean_lag(part, &|s| s.replayed[1]),
                direct: mean_lag(part, &|s| s.direct_replayed),
            })
        })
        .collect()
}

/// Header of [`timeline_csv`].
const CSV_HEAD: &str = "t,primary_written,primary_flushed,w_primary_sent,w_sent_down,w_spooled,w_sent_to_standby,w_received,w_replayed,z_primary_sent,z_received,z_replayed,direct_primary_sent,direct_received,direct_replayed,w_cpu_up_s,w_cpu_down_s,z_cpu_up_s,z_cpu_down_s,w_kernel_up_s,w_kernel_down_s,z_kernel_up_s,z_kernel_down_s,w_wait_up_s,w_wait_down_s,z_wait_up_s,z_wait_down_s,cpu_pressure_s,w_rss_up_mb,w_rss_down_mb,z_rss_up_mb,z_rss_down_mb,w_images,w_image_hits,direct_apply_cpu_s\n";

/// Every sample as one CSV line: time (s), positions (bytes; empty when unknown), CPU seconds
/// and the kernel's part of them, seconds waited for a core, each half's resident set (MB),
/// the images W's upstream sent through its block cache and of those cache hits (read from
/// its `/metrics` with every sample), and the CPU seconds of the direct standby's startup
/// process; empty when unknown.
pub fn timeline_csv(samples: &[Sample]) -> String {
    let mut s = String::from(CSV_HEAD);
    let o = |v: Option<u64>| v.map(|x| x.to_string()).unwrap_or_default();
    // A number with `digits` decimals; empty when unknown (NaN).
    let num = |v: f64, digits: usize| {
        if v.is_finite() {
            format!("{v:.digits$}")
        } else {
            String::new()
        }
    };
    let f = |v: f64| num(v, 3);
    for x in samples {
        let r = x.w_relay;
        let _ = writeln!(
            s,
            "{:.3},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{},{},{},{},{},{},{},{},{},{},{},{}",
            x.t,
            x.primary_lsn,
            x.primary.flushed,
            o(x.primary.sent[0]),
            o(r.map(|r| r.sent_down)),
            o(r.map(|r| r.spooled)),
            o(r.map(|r| r.sent_to_standby)),
            x.received[0],
            x.replayed[0],
            o(x.primary.sent[1]),
            x.received[1],
            x.replayed[1],
            o(x.primary.sent[2]),
            x.direct_received,
            x.direct_replayed,
            x.pairs[0].cpu_up,
            x.pairs[0].cpu_down,
            x.pairs[1].cpu_up,
            x.pairs[1].cpu_down,
            x.pairs[0].kernel_up,
            x.pairs[0].kernel_down,
            x.pairs[1].kernel_up,
            x.pairs[1].kernel_down,
            f(x.pairs[0].wait_up),
            f(x.pairs[0].wait_down),
            f(x.pairs[1].wait_up),
            f(x.pairs[1].wait_down),
            f(x.cpu_pressure),
            f(x.pairs[0].rss_up / 1e6),
            f(x.pairs[0].rss_down / 1e6),
            f(x.pairs[1].rss_up / 1e6),
            f(x.pairs[1].rss_down / 1e6),
            // Images and cache hits (`pair::CODEC_COUNTERS` order).
            num(x.pairs[0].codec[2], 0),
            num(x.pairs[0].codec[3], 0),
            num(x.direct_apply.map_or(f64::NAN, |(_, c)| c), 3),
        );
    }
    s
}

#[cfg(test)]
mod tests;
