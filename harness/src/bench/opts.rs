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
}
