//! `--sites`: each site on CPUs of its own, as the halves run in production. The primary
//! and both upstreams run on the first half of the CPUs the bench may use (the primary's
//! site); the three standbys and both downstreams on the rest (the standbys' site). Without
//! it every process of the run shares every core: the relays then compete with the primary
//! and all three standbys at once, which no deployment does (each half runs beside the
//! primary or beside the standbys, on hosts of their own).
//!
//! Pinned: every thread of each cluster's postmaster and of every process below it (the
//! primary's backends and walsenders, each standby's walreceiver and startup process), and
//! of each relay process; what they start later inherits it ([`proctree`]). Not pinned: the
//! bench itself, the load's clients (`pgbench`, `psql`), the offline baselines and the
//! one-core replays.

use anyhow::{Context, Result};
use serde::Serialize;

use super::pair::RelayPair;
use super::proctree;
use crate::cluster::Cluster;

/// Which CPUs each site runs on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sites {
    /// The primary and both upstreams.
    pub primary_cpus: Vec<usize>,
    /// The standbys (the direct one too) and both downstreams.
    pub standby_cpus: Vec<usize>,
}

impl Sites {
    /// The split of the CPUs this process may run on.
    pub fn of_this_machine() -> Result<Sites> {
        let allowed = allowed_cpus().context("reading the CPUs the bench may run on")?;
        Sites::split(&allowed)
    }

    /// The first half of `allowed` (the larger one when it is odd) for the primary's site,
    /// the rest for the standbys'.
    pub fn split(allowed: &[usize]) -> Result<Sites> {
        anyhow::ensure!(
            allowed.len() >= 2,
            "--sites needs at least two CPUs, one per site; this process may use {} ({allowed:?})",
            allowed.len()
        );
        let (a, b) = allowed.split_at(allowed.len().div_ceil(2));
        Ok(Sites {
            primary_cpus: a.to_vec(),
            standby_cpus: b.to_vec(),
        })
    }

    /// Pins the primary and the upstreams to the primary's site, the standbys and the
    /// downstreams to the standbys'.
    pub fn pin(&self, primary: &Cluster, pairs: &[RelayPair], standbys: &[&Cluster]) -> Result<()> {
        self.pin_cluster(primary, &self.primary_cpus)?;
        for pair in pairs {
            for ((half, pid), cpus) in pair
                .pids()
                .into_iter()
                .zip([&self.primary_cpus, &self.standby_cpus])
            {
                let pid = pid
                    .with_context(|| format!("the {} pair's {half} is not running", pair.codec))?;
                pin_tree(pid, cpus).with_context(|| {
                    format!("pinning the {} pair's {half} (pid {pid})", pair.codec)
                })?;
            }
        }
        for s in standbys {
            self.pin_cluster(s, &self.standby_cpus)?;
        }
        Ok(())
    }

    /// Pins a standby started later (the sync-latency run's direct one).
    pub fn pin_standby(&self, standby: &Cluster) -> Result<()> {
        self.pin_cluster(standby, &self.standby_cpus)
    }

    fn pin_cluster(&self, c: &Cluster, cpus: &[usize]) -> Result<()> {
        let pid = c
            .postmaster_pid()
            .with_context(|| format!("cluster {} has no postmaster.pid", c.name()))?;
        pin_tree(pid, cpus).with_context(|| {
            format!(
                "pinning cluster {} (postmaster {pid}) to CPUs {cpus:?}",
                c.name()
            )
        })?;
        Ok(())
    }

    /// One line for the report.
    pub fn describe(&self) -> String {
        format!(
            "Each site ran on CPUs of its own (--sites): the primary and both upstreams on {}, \
             the three standbys and both downstreams on {}, as the halves run in production \
             (beside the primary, beside the standbys). The bench, the load's clients and the \
             one-core replays were not pinned.",
            cpu_list(&self.primary_cpus),
            cpu_list(&self.standby_cpus)
        )
    }
}

/// "CPU 0", "CPUs 2, 3".
fn cpu_list(cpus: &[usize]) -> String {
    let list: Vec<String> = cpus.iter().map(usize::to_string).collect();
    match cpus.len() {
        1 => format!("CPU {}", list[0]),
        _ => format!("CPUs {}", list.join(", ")),
    }
}

/// The CPUs the calling thread may run on, in order.
pub fn allowed_cpus() -> std::io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is a plain bit array, valid when zeroed.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes at most `size_of::<cpu_set_t>()` bytes into `set`, which
    // lives until the call returns.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: CPU_ISSET reads one bit of `set` for an index below its size.
    Ok((0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Restricts every thread of `root` and of its descendants to `cpus`; how many threads were
/// set.
pub fn pin_tree(root: u32, cpus: &[usize]) -> std::io::Result<usize> {
    // SAFETY: cpu_set_t is a plain bit array, valid when zeroed.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: CPU_SET writes one bit of `set`; it ignores indexes past its size.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    proctree::each_thread(
        root,
        &mut |tid| {
            // SAFETY: the kernel reads `size_of::<cpu_set_t>()` bytes of `set`, which lives
            // until the call returns.
            let rc = unsafe {
                libc::sched_setaffinity(
                    tid as libc::pid_t,
                    std::mem::size_of::<libc::cpu_set_t>(),
                    &set,
                )
            };
            match rc {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        },
        &mut |_| Ok(()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_primary_site_takes_the_first_half_and_the_odd_cpu() {
        let s = Sites::split(&[0, 1]).unwrap();
        assert_eq!((s.primary_cpus, s.standby_cpus), (vec![0], vec![1]));
        let s = Sites::split(&[2, 3, 5]).unwrap();
        assert_eq!((s.primary_cpus, s.standby_cpus), (vec![2, 3], vec![5]));
        let e = Sites::split(&[4]).unwrap_err().to_string();
        assert!(e.contains("at least two CPUs") && e.contains("[4]"), "{e}");
        assert_eq!(cpu_list(&[0]), "CPU 0");
        assert_eq!(cpu_list(&[2, 3]), "CPUs 2, 3");
    }

    /// `Cpus_allowed_list` of a thread, as `/proc/<tid>/status` says it ("0-1", "1").
    fn allowed_list(tid: u32) -> String {
        let status = std::fs::read_to_string(format!("/proc/{tid}/status")).unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with("Cpus_allowed_list:"))
            .unwrap();
        line.split_whitespace().last().unwrap().to_string()
    }

    #[test]
    fn a_process_and_its_children_are_pinned() {
        let mine = allowed_cpus().unwrap();
        assert!(!mine.is_empty());
        let last = *mine.last().unwrap();
        let tree = proctree::ShellWithChild::start();
        let pid = tree.pid;
        let set = pin_tree(pid, &[last]);
        let lists = (allowed_list(pid), allowed_list(tree.child));
        drop(tree);
        assert_eq!(set.unwrap(), 2);
        let want = last.to_string();
        assert_eq!(lists, (want.clone(), want));
        // This process was not touched.
        assert_eq!(allowed_cpus().unwrap(), mine);
    }
}
