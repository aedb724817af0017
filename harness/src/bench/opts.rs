//! What `walrelay bench` is asked to run: the command line's options, as the run reads them.

use std::path::PathBuf;

use super::workloads::Workload;
use super::{services, sites};

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOpts {
    /// The command line that ran the bench ([`super::command_line`]), for the report.
    pub command: Option<String>,
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
    /// [`super::sample::timeline_csv`]).
    pub timeline_dir: Option<PathBuf>,
    /// Pair Z and its standby at the lowest priority ([`super::background`]).
    pub z_background: bool,
    /// Pair W's relay processes with a larger CPU share ([`super::background::favour`]).
    pub w_share: bool,
    /// Each site on CPUs of its own ([`sites`]).
    pub sites: Option<sites::Sites>,
    /// Each cluster and relay process in a CPU group of its own, on this cpu controller
    /// ([`services`]).
    pub services: Option<services::Hierarchy>,
    /// Each downstream's `downstream.spool_bytes` (None: the relay's default).
    pub spool_bytes: Option<u64>,
    /// The primary's `checkpoint_timeout`, checked ([`checkpoint_timeout`]).
    pub checkpoint_timeout: String,
}

/// `--checkpoint-timeout` as the primary's `checkpoint_timeout`: a whole number of `s`,
/// `min` or `h` (seconds when bare), within PostgreSQL's range of 30 s to 1 day.
pub fn checkpoint_timeout(text: &str) -> anyhow::Result<String> {
    let t = text.trim();
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    let (n, unit) = t.split_at(digits);
    let scale = match unit.trim() {
        "" | "s" => Some(1),
        "min" => Some(60),
        "h" => Some(3600),
        _ => None,
    };
    let secs = n
        .parse::<u64>()
        .ok()
        .zip(scale)
        .and_then(|(n, s)| n.checked_mul(s))
        .filter(|s| (30..=86_400).contains(s));
    match secs {
        Some(s) => Ok(format!("{s}s")),
        None => anyhow::bail!(
            "--checkpoint-timeout {text:?}: give a number of s, min or h between 30s and 24h \
             (PostgreSQL's range), such as 5min"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::checkpoint_timeout;

    #[test]
    fn checkpoint_timeouts_in_postgresql_units_and_range() {
        for (given, set) in [
            ("30s", "30s"),
            ("5min", "300s"),
            ("1h", "3600s"),
            ("600", "600s"),
        ] {
            assert_eq!(checkpoint_timeout(given).unwrap(), set, "{given}");
        }
        for bad in [
            "29s",
            "25h",
            "5 mins",
            "",
            "min",
            "-1min",
            "99999999999999999999h",
        ] {
            let e = checkpoint_timeout(bad).unwrap_err().to_string();
            assert!(
                e.contains("--checkpoint-timeout") && e.contains("5min"),
                "{bad}: {e}"
            );
        }
    }
}
