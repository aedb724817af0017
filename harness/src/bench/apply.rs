//! The direct standby's startup process, which applies every WAL record the standby receives.
//! Its CPU per GB of a window is the bench's reference for what a standby itself spends on
//! the WAL the relays carry: each relay half does a standby's page work on its block cache,
//! and compresses or decompresses besides.
//!
//! The process is found under the standby's postmaster by its title, which PostgreSQL writes
//! over its command line (`/proc/<pid>/cmdline`): `postgres: startup recovering …`, or
//! `postgres: <cluster_name>: startup …` where `cluster_name` is set (the bench's standbys
//! set it). It is looked for again when the one found has gone.

use std::sync::atomic::{AtomicU32, Ordering};

use super::proctree::descendants;
use crate::relayproc::process_cpu_times;

/// Whether a process title (`/proc/<pid>/cmdline`) is a PostgreSQL startup process's.
pub fn is_startup_title(cmdline: &[u8]) -> bool {
    let title = String::from_utf8_lossy(cmdline);
    let mut parts = title.split(": ");
    parts.next() == Some("postgres") && parts.any(|p| p.starts_with("startup"))
}

fn is_startup(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| is_startup_title(&c))
}

/// A standby's startup process, by its postmaster.
#[derive(Debug)]
pub struct Startup {
    postmaster: Option<u32>,
    /// The pid found last (0: none yet).
    pid: AtomicU32,
}

impl Startup {
    /// The startup process under `postmaster` (None: never found).
    pub fn under(postmaster: Option<u32>) -> Startup {
        Startup {
            postmaster,
            pid: AtomicU32::new(0),
        }
    }

    /// The startup process's pid and the CPU seconds (user and kernel) it has used so far;
    /// None while there is none (the standby is not in recovery, or `/proc` cannot be read).
    pub fn cpu_seconds(&self) -> Option<(u32, f64)> {
        let known = self.pid.load(Ordering::Relaxed);
        let pid = if known != 0 && is_startup(known) {
            known
        } else {
            let found = descendants(self.postmaster?)
                .ok()?
                .into_iter()
                .skip(1)
                .find(|&p| is_startup(p))?;
            self.pid.store(found, Ordering::Relaxed);
            found
        };
        Some((pid, process_cpu_times(pid)?.total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn startup_titles_are_told_from_other_processes() {
        for t in [
            &b"postgres: startup recovering 000000010000000000000003\0\0"[..],
            b"postgres: standby_lag_ref: startup recovering 000000010000000000000003",
            b"postgres: w_standby: startup waiting for 000000010000000000000004",
        ] {
            assert!(is_startup_title(t), "{}", String::from_utf8_lossy(t));
        }
        for t in [
            &b"postgres: walreceiver streaming 0/3000148"[..],
            b"postgres: standby_lag_ref: walreceiver streaming 0/3000148",
            b"postgres: checkpointer",
            b"/usr/lib/postgresql/15/bin/postgres\0-D\0/tmp/x/startup",
            b"bash\0-c\0echo postgres: startup",
            b"",
        ] {
            assert!(!is_startup_title(t), "{}", String::from_utf8_lossy(t));
        }
    }

    #[test]
    fn no_postmaster_no_startup_process() {
        assert_eq!(Startup::under(None).cpu_seconds(), None);
        // A process with no startup process below it: this test's own.
        assert_eq!(Startup::under(Some(std::process::id())).cpu_seconds(), None);
    }
}
