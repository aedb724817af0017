//! What a bench run found: the JSON's types (serde) and their arithmetic; `markdown` renders them as
//! the tables the bench prints.

use serde::Serialize;

use super::micro::{Pass, Replay, WarmReplay};
use super::sample::{Cut, PairCut};
use super::stages::{LagPart, PathLags, StageLags};
use super::synclat::SyncLatency;
use super::workloads::Workload;

#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// The command line that ran the bench, as a shell takes it ([`super::command_line`]):
    /// printed above the tables, so that published figures carry their command.
    #[serde(default)]
    pub command: Option<String>,
    pub cold_secs: u64,
    pub warmup_secs: u64,
    pub steady_secs: u64,
    /// Pair Z and its standby ran at nice 19 (`--z-background`, [`super::background`]): Z's
    /// lag and cores are not comparable; W's lag is measured with Z out of the way.
    pub z_background: bool,
    /// Pair W's relay processes ran with a larger CPU share (`--w-share`,
    /// [`super::background::favour`]).
    #[serde(default)]
    pub w_share: bool,
    /// Which CPUs each site ran on (`--sites`, [`super::sites`]); None: every process
    /// shared every core.
    #[serde(default)]
    pub sites: Option<super::sites::Sites>,
    /// How the clusters and relay processes ran in CPU groups of their own (`--services`,
    /// [`super::services`]); None: they did not.
    #[serde(default)]
    pub services: Option<String>,
    /// Each downstream's `downstream.spool_bytes` when `--spool-bytes` set it.
    #[serde(default)]
    pub spool_bytes: Option<u64>,
    pub runs: Vec<RunResult>,
    /// Workloads left out, with the reason (a `wal_compression` the major lacks).
    pub skipped: Vec<String>,
    /// Workloads that have not run ("bulk on PostgreSQL 15"): still to come in a report
    /// written while the bench runs, or left out by a failure ([`super::plan`]).
    pub not_run: Vec<String>,
    /// Why the bench stopped before its last workload (None: it did not, or has not yet).
    pub stopped: Option<String>,
    pub sync_latency: Option<SyncLatency>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub workload: Workload,
    pub pg_major: u32,
    pub wal_compression: String,
    /// pgbench's transactions per second over the whole load (None for `bulk`).
    pub tps: Option<f64>,
    pub cold: Window,
    pub steady: Window,
    pub replay: Option<Replay>,
    pub replay_error: Option<String>,
    /// The steady window's WAL replayed after the WAL before it warmed the codecs.
    pub warm_replay: Option<WarmReplay>,
    pub warm_replay_error: Option<String>,
    /// Mean replay lags over each third of the load, up to the steady window's end.
    pub lag_over_run: Vec<LagPart>,
    pub verified: Verified,
}

#[cfg(test)]
impl RunResult {
    /// A run of `workload` on PostgreSQL 15 with these (cold, steady) windows and nothing
    /// else measured.
    pub fn bare(workload: Workload, (cold, steady): (Window, Window)) -> RunResult {
        RunResult {
            workload,
            pg_major: 15,
            wal_compression: "off".into(),
            tps: None,
            cold,
            steady,
            replay: None,
            replay_error: None,
            warm_replay: None,
            warm_replay_error: None,
            lag_over_run: Vec::new(),
            verified: Verified::default(),
        }
    }
}

/// What was checked after the run (the bench fails instead of reporting a failed check).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Verified {
    /// WAL bytes of each standby byte-compared with the primary's (both windows).
    pub wal_bytes_compared: u64,
    /// Tables whose contents were equal on the primary and both standbys.
    pub tables: Vec<String>,
    pub integrity_failures: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Window {
    /// "cold" or "steady".
    pub name: &'static str,
    /// Seconds since t = 0 of the window's first and last sample.
    pub t_start: f64,
    pub t_end: f64,
    pub lsn_start: String,
    pub lsn_end: String,
    pub wal_bytes: u64,
    /// Offline `zstd -3` and `zstd -19 --long=27 -T2` (the CLI) of exactly these WAL bytes.
    pub zstd3_bytes: u64,
    pub zstd19_long_bytes: u64,
    /// What `ssh -C` would put on the wire for these WAL bytes (zlib level 6 in full packets,
    /// framing included: `super::sshc`).
    pub ssh_c_bytes: u64,
    /// Pair W (`codec = "wal"`) and pair Z (`codec = "zstd"`).
    pub w: PairWindow,
    pub z: PairWindow,
    /// Largest replay lag of the standby streaming from the primary directly (no relay).
    pub direct_max_replay_lag_bytes: u64,
    pub direct_max_receive_lag_bytes: u64,
    /// CPU seconds per GB of the window's WAL that the direct standby's startup process
    /// spent applying it (`super::apply`; None where it was not measured): what a standby
    /// itself spends on this WAL, beside each relay half's CPU per GB.
    pub direct_apply_cpu_s_per_gb: Option<f64>,
    /// Largest lag behind the primary at each stage of each path, bytes.
    pub stages: StageLags,
    /// Share of the window during which some runnable task on the machine waited for a core
    /// (`/proc/pressure/cpu`; None where the kernel does not keep it).
    pub cpu_pressure: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct PairWindow {
    pub codec: &'static str,
    /// Bytes on the link socket, both directions.
    pub link_bytes: u64,
    pub toward_primary_share: f64,
    pub vs_zstd3: f64,
    pub vs_zstd19_long: f64,
    pub vs_ssh_c: f64,
    pub messages_per_s: Option<f64>,
    /// (socket bytes both ways − WAL payload bytes) / messages.
    pub framing_feedback_bytes_per_message: Option<f64>,
    /// (socket bytes both ways − WAL payload bytes) / socket bytes.
    pub framing_feedback_share: Option<f64>,
    /// The most payload that can have been in flight between the two counts at the window's
    /// ends ([`framing_overhead`]); the framing is not estimated where it could be more than
    /// [`FRAMING_TOLERANCE`] of the estimate (None when not known).
    pub framing_in_flight_bytes: Option<f64>,
    pub upstream_cpu_s_per_gb: f64,
    pub downstream_cpu_s_per_gb: f64,
    /// CPU seconds per second of the window: the cores each half kept busy.
    pub upstream_cores: f64,
    pub downstream_cores: f64,
    /// Of each half's CPU time, the share spent in the kernel (0 to 1): system calls, and
    /// the pages of memory touched for the first time (W's caches as they fill).
    pub upstream_kernel_share: f64,
    pub downstream_kernel_share: f64,
    /// WAL runs each half staged one batch ahead while behind, over the window
    /// (`walrelay_codec_staged_messages_total`; None when not scraped).
    pub upstream_staged: Option<f64>,
    pub downstream_staged: Option<f64>,
    /// Batches the upstream encoded at the fast zstd level while it fell behind on CPU
    /// (`walrelay_codec_fast_messages_total`, `link.catch_up`; None when not scraped).
    pub upstream_fast: Option<f64>,
    /// Times the upstream turned the fast level on over the window
    /// (`walrelay_codec_fast_spells_total`; None when not scraped).
    pub upstream_fast_spells: Option<f64>,
    /// Seconds each half's threads spent runnable but waiting for a core, per second of the
    /// window (schedstat; None where the kernel does not keep it).
    pub upstream_waiting_cores: Option<f64>,
    pub downstream_waiting_cores: Option<f64>,
    pub max_replay_lag_bytes: u64,
    /// The part of the replay lag that is WAL not yet received: the relay path's share.
    pub max_receive_lag_bytes: u64,
    /// How much later than the window's first and last sample the standby had received the
    /// window's start and end (the larger of both), seconds. Above [`LATE_SECS`] the figures
    /// are approximate: link bytes in flight toward the standby (the downstream's queue) are
    /// charged by the standby's receipt.
    pub receipt_delay_s: f64,
    pub raw: PairCut,
}

/// A window's offline baselines: bytes of `zstd -3`, of `zstd -19 --long=27 -T2` and of
/// `ssh -C` over its WAL.
#[derive(Debug, Clone, Copy)]
pub struct Baselines {
    pub zstd3: u64,
    pub zstd19: u64,
    pub ssh_c: u64,
}

/// Receipt delay above which a pair's window figures are marked approximate.
pub const LATE_SECS: f64 = 1.0;

fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        0.0
    } else {
        a / b
    }
}

/// Whether a pair's standby received the window's WAL so late ([`LATE_SECS`]) that its
/// figures are approximate (marked †).
fn is_late(receipt_delay_s: f64) -> bool {
    receipt_delay_s > LATE_SECS
}

/// Largest share of a framing estimate that the payload in flight at the window's ends may
/// make up for the estimate to be reported.
pub const FRAMING_TOLERANCE: f64 = 0.25;

/// `link` (socket bytes both ways) less the WAL `payload` the upstream counted: the framing
/// and the feedback, estimated. The payload is counted as the upstream hands it to the link
/// and the link bytes as they pass the socket, so the payload between the two (the link's
/// queues, the sockets' buffers) at one end of the window and not at the other is charged
/// as framing, or taken from it. `in_flight`: the most that can be (the payload of the WAL
/// the upstream had sent and the standby not yet received, at either end).
///
/// None when not scraped; when the pair is [`is_late`]; and when `in_flight` could be more
/// than [`FRAMING_TOLERANCE`] of the estimate. On a bulk load the framing is about 0.5 % of
/// the link and megabytes are in flight: the difference then came out negative (−76.6 bytes
/// a message in a cold window of `bulk`, and on a run of `toast`), no estimate at all.
fn framing_overhead(
    link: u64,
    payload: Option<f64>,
    receipt_delay_s: f64,
    in_flight: Option<f64>,
) -> Option<f64> {
    if is_late(receipt_delay_s) {
        return None;
    }
    let overhead = link as f64 - payload?;
    (in_flight? <= overhead * FRAMING_TOLERANCE).then_some(overhead)
}

impl Window {
    pub fn new(
        name: &'static str,
        cut: &Cut,
        base: Baselines,
        codecs: [&'static str; 2],
    ) -> Window {
        let Baselines {
            zstd3,
            zstd19,
            ssh_c,
        } = base;
        let wal = cut.lsn_end - cut.lsn_start;
        let gb = wal as f64 / 1e9;
        let pair = |p: &PairCut, codec: &'static str| {
            let link = p.toward_standby + p.toward_primary;
            let receipt_delay_s = (p.t0 - cut.t_start).max(p.t1 - cut.t_end);
            // The in-flight WAL's payload at the window's own payload per WAL byte.
            let in_flight = p
                .inflight_wal
                .zip(p.payload)
                .map(|(w, pl)| w as f64 * ratio(pl, wal as f64));
            let overhead = framing_overhead(link, p.payload, receipt_delay_s, in_flight);
            PairWindow {
                codec,
                link_bytes: link,
                toward_primary_share: ratio(p.toward_primary as f64, link as f64),
                vs_zstd3: ratio(link as f64, zstd3 as f64),
                vs_zstd19_long: ratio(link as f64, zstd19 as f64),
                vs_ssh_c: ratio(link as f64, ssh_c as f64),
                messages_per_s: p.messages.map(|m| ratio(m, p.t1 - p.t0)),
                framing_feedback_bytes_per_message: overhead
                    .zip(p.messages)
                    .map(|(o, m)| ratio(o, m)),
                framing_feedback_share: overhead.map(|o| ratio(o, link as f64)),
                framing_in_flight_bytes: in_flight,
                upstream_cpu_s_per_gb: ratio(p.cpu_up_s, gb),
                downstream_cpu_s_per_gb: ratio(p.cpu_down_s, gb),
                upstream_cores: ratio(p.cpu_up_s, p.t1 - p.t0),
                downstream_cores: ratio(p.cpu_down_s, p.t1 - p.t0),
                upstream_kernel_share: ratio(p.kernel_up_s, p.cpu_up_s),
                downstream_kernel_share: ratio(p.kernel_down_s, p.cpu_down_s),
                upstream_staged: p.staged_up,
                downstream_staged: p.staged_down,
                upstream_fast: p.fast_up,
                upstream_fast_spells: p.fast_spells_up,
                upstream_waiting_cores: p.wait_up_s.map(|w| ratio(w, p.t1 - p.t0)),
                downstream_waiting_cores: p.wait_down_s.map(|w| ratio(w, p.t1 - p.t0)),
                max_replay_lag_bytes: p.max_replay_lag,
                max_receive_lag_bytes: p.max_receive_lag,
                receipt_delay_s,
                raw: p.clone(),
            }
        };
        Window {
            name,
            t_start: cut.t_start,
            t_end: cut.t_end,
            lsn_start: walrelay_wal::lsn::Lsn(cut.lsn_start).to_string(),
            lsn_end: walrelay_wal::lsn::Lsn(cut.lsn_end).to_string(),
            wal_bytes: wal,
            zstd3_bytes: zstd3,
            zstd19_long_bytes: zstd19,
            ssh_c_bytes: ssh_c,
            w: pair(&cut.pairs[0], codecs[0]),
            z: pair(&cut.pairs[1], codecs[1]),
            direct_max_replay_lag_bytes: cut.direct_max_replay_lag,
            direct_max_receive_lag_bytes: cut.direct_max_receive_lag,
            direct_apply_cpu_s_per_gb: cut.direct_apply_cpu_s.map(|c| ratio(c, gb)),
            stages: cut.stages.clone(),
            cpu_pressure: cut.cpu_pressure,
        }
    }
}

mod markdown;
#[cfg(test)]
mod tests;
