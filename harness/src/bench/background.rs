//! `--z-background`: pair Z (both relay processes) and the standby behind it run at the
//! lowest priority, so that they take a core only when W, the direct standby and the
//! primary leave one idle. A diagnostic for the replay-lag comparison on a small machine:
//! with both pairs competing, each relay half waits for a core longer than it runs, and a
//! run cannot tell how much of W's lag is W's own and how much is Z's CPU. Z's bytes are
//! the same at any priority (the link codec does not depend on timing); its lag and cores
//! are not comparable in such a run. The primary's walsenders feeding Z keep their priority.
//!
//! Linux keeps a nice value per thread, and a new thread or process inherits its creator's:
//! [`renice_tree`] sets every thread of a process and of its descendants, so what they
//! start later is niced as well. Where the kernel shares the CPU between sessions first
//! (autogroup), a thread's nice value only weighs against the threads of its own session,
//! and each relay process ([`super::pair`]) and each PostgreSQL process is a session of its
//! own: so it also sets the nice value of each process's session group.

use std::path::Path;

use anyhow::Context;

use super::pair::RelayPair;
use crate::cluster::Cluster;
use crate::relayproc::{session_of, stat_field};

/// The nice value given (the lowest priority).
pub const NICE: i32 = 19;

/// Lowers `pair`'s relay processes and `standby` (its postmaster and every process below
/// it) to [`NICE`].
pub fn lower(pair: &RelayPair, standby: &Cluster) -> anyhow::Result<()> {
    for (half, pid) in pair.pids() {
        let pid =
            pid.with_context(|| format!("the {} pair's {half} is not running", pair.codec))?;
        renice_tree(pid, NICE)
            .with_context(|| format!("renicing the {} pair's {half} (pid {pid})", pair.codec))?;
    }
    let pid = standby
        .postmaster_pid()
        .with_context(|| format!("standby {} has no postmaster.pid", standby.name()))?;
    renice_tree(pid, NICE)
        .with_context(|| format!("renicing standby {} (postmaster {pid})", standby.name()))?;
    Ok(())
}

/// Sets the nice value of every thread of `root` and of all its descendants to `nice`;
/// returns how many threads were set. Fails when `root` does not exist or a thread of it
/// cannot be set (threads of descendants that end meanwhile are skipped).
pub fn renice_tree(root: u32, nice: i32) -> std::io::Result<usize> {
    let procs = descendants(root)?;
    let mut set = 0;
    for (i, pid) in procs.iter().enumerate() {
        let tasks = match std::fs::read_dir(format!("/proc/{pid}/task")) {
            Ok(t) => t,
            Err(e) if i > 0 && e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for t in tasks {
            let Some(tid) = t?.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            // SAFETY: setpriority has no memory-safety preconditions; it only reads its
            // integer arguments.
            let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) };
            if rc == 0 {
                set += 1;
            } else if i == 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        if session_of(*pid) == Some(*pid) {
            if let Err(e) = renice_autogroup(*pid, nice) {
                if i == 0 {
                    return Err(e);
                }
            }
        }
    }
    Ok(set)
}

/// Sets the nice value of the session group (autogroup) of `pid`, a session leader (so that
/// the caller's own session is never touched); nothing when the kernel has none (built
/// without autogroup: then threads' nice values weigh machine-wide).
fn renice_autogroup(pid: u32, nice: i32) -> std::io::Result<()> {
    match std::fs::write(format!("/proc/{pid}/autogroup"), nice.to_string()) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// `root` and every process below it (by the parent pid in `/proc/<pid>/stat`), `root` first.
fn descendants(root: u32) -> std::io::Result<Vec<u32>> {
    if !Path::new(&format!("/proc/{root}")).exists() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no process {root} to renice"),
        ));
    }
    let mut parents: Vec<(u32, u32)> = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let Some(pid) = entry?.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        if let Some(ppid) = parent_of(pid) {
            parents.push((pid, ppid));
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(parents.iter().filter(|&&(_, pp)| pp == p).map(|&(c, _)| c));
        i += 1;
    }
    Ok(found)
}

/// The parent pid of `pid` (field 4 of `/proc/<pid>/stat`, the second after the command).
fn parent_of(pid: u32) -> Option<u32> {
    stat_field(pid, 1)
}

/// The nice value of the session group of `pid` (`/proc/<pid>/autogroup` reads
/// `/autogroup-<n> nice <v>`); None without autogroup.
#[cfg(test)]
fn autogroup_nice_of(pid: u32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/autogroup")).ok()?;
    s.split_whitespace().last()?.parse().ok()
}

/// The nice value of thread `tid` (field 19 of `/proc/<tid>/stat`).
#[cfg(test)]
fn nice_of(tid: u32) -> Option<i32> {
    stat_field(tid, 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_and_its_children_get_the_nice_value() {
        // A shell with a child of its own, both alive until killed.
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .unwrap();
        let pid = sh.id();
        let child = (0..200)
            .find_map(|_| {
                std::thread::sleep(std::time::Duration::from_millis(10));
                descendants(pid).ok().and_then(|d| d.get(1).copied())
            })
            .expect("the shell's child started");
        // Above the test's own nice value: raising it needs no privilege.
        let target = (nice_of(child).unwrap() + 3).min(NICE);
        let set = renice_tree(pid, target).unwrap();
        let (a, b) = (nice_of(pid), nice_of(child));
        let _ = std::process::Command::new("kill")
            .arg(child.to_string())
            .status();
        let _ = sh.kill();
        let _ = sh.wait();
        assert_eq!(set, 2);
        assert_eq!((a, b), (Some(target), Some(target)));
    }

    #[test]
    fn a_session_leader_gets_it_for_its_session_group_and_the_callers_group_keeps_its_own() {
        let me = std::process::id();
        let mine = autogroup_nice_of(me);
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("30");
        crate::relayproc::in_own_session(&mut cmd);
        let mut leader = cmd.spawn().unwrap();
        let pid = leader.id();
        let sid = session_of(pid);
        let before = autogroup_nice_of(pid);
        let result = renice_tree(pid, NICE);
        let after = autogroup_nice_of(pid);
        let _ = leader.kill();
        let _ = leader.wait();
        result.unwrap();
        assert_eq!(sid, Some(pid));
        if before.is_some() {
            assert_eq!(after, Some(NICE));
        }
        assert_eq!(autogroup_nice_of(me), mine);
    }

    #[test]
    fn a_missing_process_is_an_error_that_names_it() {
        let e = renice_tree(u32::MAX - 1, NICE).unwrap_err();
        assert!(e.to_string().contains("no process"), "{e}");
    }

    #[test]
    fn the_parent_pid_is_read_after_the_command() {
        let me = std::process::id();
        let parent = parent_of(me).unwrap();
        assert_eq!(parent, std::os::unix::process::parent_id());
    }
}
