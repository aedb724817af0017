//! Operations telemetry (issue #5): what the Prometheus endpoint, the status page and
//! `walrelay status` show, beyond the plain counters of [`crate::metrics::Metrics`].
//!
//! - [`standbys`]: per-standby replication state (positions, lag) and the catch-up progress line;
//! - [`codec_totals`]: the WAL-aware codec's per-session statistics summed over the process;
//! - [`expo`]: the Prometheus text exposition (format 0.0.4) and the `/status.json` document;
//! - [`http`]: the HTTP server of `[metrics] listen` (`/metrics`, `/healthz`, `/`, `/status.json`)
//!   and the ring of bandwidth samples behind the status page's chart;
//! - [`client`]: `walrelay status`, which reads `/status.json` from a running process.
//!
//! Everything here is bounded: one registry entry per live session (sessions are capped by
//! `limits.max_sessions`), a fixed-size lag ring per entry, a fixed-size sample ring.

pub mod client;
pub mod codec_totals;
pub mod expo;
pub mod http;
pub mod standbys;

use std::sync::atomic::AtomicU64;

/// Which half of walrelay an observation comes from (the `half` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Half {
    /// Next to the primary: sees the primary's stream and the feedback it forwards.
    Upstream,
    /// Next to the standbys: sees what it delivered and the standbys' own feedback.
    Downstream,
}

impl Half {
    pub fn label(self) -> &'static str {
        match self {
            Half::Upstream => "upstream",
            Half::Downstream => "downstream",
        }
    }
}

/// The operations state held in [`crate::metrics::Metrics::ops`].
#[derive(Debug, Default)]
pub struct Ops {
    pub standbys: standbys::Standbys,
    pub codec: codec_totals::CodecTotals,
    /// Standby sessions that reached the link (the downstream's count of link sessions).
    pub sessions_started_downstream: AtomicU64,
    /// Bytes read from / written to the downstream's link sockets (framing included).
    pub link_socket_bytes_in_downstream: AtomicU64,
    pub link_socket_bytes_out_downstream: AtomicU64,
    /// Link messages (frames) the downstream sent to the upstream.
    pub link_messages_out_downstream: AtomicU64,
    /// Encoded WAL payload bytes the downstream received on the link (framing excluded).
    pub link_payload_bytes_received: AtomicU64,
    /// Sessions that ended with an error (link lost, primary gone, verification failed...);
    /// a standby reconnects after each one.
    pub sessions_failed_upstream: AtomicU64,
    pub sessions_failed_downstream: AtomicU64,
    /// The spool (downstream): where its WAL starts, ends and is durable, and its cap.
    pub spool: SpoolGauges,
    /// The streams' slots on the primary (upstream): WAL each holds back.
    pub slots: std::sync::Mutex<std::collections::BTreeMap<String, SlotState>>,
}

/// The spool's extent as byte positions (all zero until a spool exists).
#[derive(Debug, Default)]
pub struct SpoolGauges {
    pub start: AtomicU64,
    pub end: AtomicU64,
    pub durable: AtomicU64,
    pub capacity: AtomicU64,
    /// Time spent appending WAL (segment completions, with their fsync, included), and in
    /// the periodic fsyncs, nanoseconds; the number of those fsyncs.
    pub write_ns: AtomicU64,
    pub sync_ns: AtomicU64,
    pub syncs: AtomicU64,
    /// Segments written over a file kept from retention instead of a new file.
    pub reused: AtomicU64,
    /// Why the spool stopped taking WAL (a write or fsync failed), until it is opened again.
    pub failure: std::sync::Mutex<Option<String>>,
}

impl SpoolGauges {
    /// Why the spool failed, if it did.
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// A stream's slot: the primary's WAL end as last stated, and the durable end of the
/// downstream's spool (what the feed confirms, so where the slot holds WAL from).
#[derive(Debug, Default, Clone, Copy)]
pub struct SlotState {
    pub primary_end: u64,
    pub confirmed: u64,
}

/// CPU time (user + system) and resident memory of this process, from /proc/self.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessStats {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub start_time_seconds: Option<f64>,
}

/// Reads [`ProcessStats`]; fields it cannot read (not Linux) stay zero.
pub fn process_stats() -> ProcessStats {
    let mut p = ProcessStats::default();
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        // Fields after the command name, which is in parentheses and may contain spaces:
        // state(3) ... utime(14) stime(15) ... starttime(22), 1-based as in proc(5).
        if let Some((_, rest)) = stat.rsplit_once(')') {
            let f: Vec<&str> = rest.split_whitespace().collect();
            let num = |i: usize| f.get(i - 3).and_then(|s| s.parse::<f64>().ok());
            if let (Some(u), Some(s)) = (num(14), num(15)) {
                p.cpu_seconds = (u + s) / ticks;
            }
            if let (Some(st), Some(boot)) = (num(22), boot_time()) {
                p.start_time_seconds = Some(boot + st / ticks);
            }
        }
    }
    if let Ok(statm) = std::fs::read_to_string("/proc/self/statm") {
        if let Some(rss) = statm
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u64>().ok())
        {
            p.resident_bytes = rss * page;
        }
    }
    p
}

/// Boot time, seconds since the epoch: the wall clock minus the time since boot
/// (`CLOCK_BOOTTIME`, the clock `/proc/self/stat`'s start time counts in), as the kernel
/// computes `btime` of /proc/stat. Not read from /proc/stat, which a systemd unit with
/// `ProcSubset=pid` (deploy/systemd/) hides: `process_start_time_seconds` went missing there.
fn boot_time() -> Option<f64> {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime only writes into the timespec we own.
        if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
            return None;
        }
        let since_boot = ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9;
        Some(unix_now() - since_boot)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// Seconds since the epoch, now.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn process_stats_are_read() {
        let p = super::process_stats();
        assert!(p.resident_bytes > 0);
        assert!(p.start_time_seconds.is_some_and(|t| t > 1.0e9));
    }

    /// The boot time is the kernel's `btime` (whole seconds in /proc/stat), computed without
    /// reading /proc/stat.
    #[test]
    fn boot_time_is_the_kernels() {
        let btime: f64 = std::fs::read_to_string("/proc/stat")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("btime "))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let ours = super::boot_time().unwrap();
        assert!((ours - btime).abs() < 2.0, "{ours} against btime {btime}");
    }
}
