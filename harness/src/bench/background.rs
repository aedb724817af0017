//! `--z-background`: pair Z (both relay processes) and the standby behind it run at the
//! lowest priority, so that they take a core only when W, the direct standby and the
//! primary leave one idle. A diagnostic for the replay-lag comparison on a small machine:
//! with both pairs competing, each relay half waits for a core longer than it runs, and a
//! run cannot tell how much of W's lag is W's own and how much is Z's CPU. Z's bytes are
//! the same at any priority (the link codec does not depend on timing); its lag and cores
//! are not comparable in such a run. The primary's walsenders feeding Z keep their priority.
//!
//! `--w-share` does the opposite for pair W's two relay processes ([`favour`]): their session
//! groups and threads at nice [`FAVOURED`], weight 3,121 against the 1,024 of each PostgreSQL
//! process (every one of them a session group of its own). In production a CPU weight of
//! the relay's own (the systemd units' `CPUWeight=`) gives its service a share as a whole;
//! here, without a cgroup per service, the session groups' weights stand in for that.
//!
//! [`renice_tree`] sets every thread of a process and of its descendants ([`proctree`]), so
//! what they start later is niced as well. Where the kernel shares the CPU between sessions first
//! (autogroup), a thread's nice value only weighs against the threads of its own session,
//! and each relay process ([`super::pair`]) and each PostgreSQL process is a session of its
//! own: so it also sets the nice value of each process's session group.

use anyhow::Context;

use super::pair::RelayPair;
use super::proctree;
use crate::cluster::Cluster;
use crate::relayproc::session_of;

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

/// The nice value `--w-share` gives pair W's relay processes.
pub const FAVOURED: i32 = -5;

/// Raises `pair`'s relay processes (every thread, and their session groups) to [`FAVOURED`].
pub fn favour(pair: &RelayPair) -> anyhow::Result<()> {
    for (half, pid) in pair.pids() {
        let pid =
            pid.with_context(|| format!("the {} pair's {half} is not running", pair.codec))?;
        renice_tree(pid, FAVOURED).with_context(|| {
            format!(
                "raising the {} pair's {half} (pid {pid}) to nice {FAVOURED} (--w-share needs \
                 root or CAP_SYS_NICE)",
                pair.codec
            )
        })?;
    }
    Ok(())
}

/// Sets the nice value of every thread of `root` and of all its descendants to `nice`;
/// returns how many threads were set. Fails when `root` does not exist or a thread of it
/// cannot be set (threads of descendants that end meanwhile are skipped).
pub fn renice_tree(root: u32, nice: i32) -> std::io::Result<usize> {
    proctree::each_thread(
        root,
        &mut |tid| {
            // SAFETY: setpriority has no memory-safety preconditions; it only reads its
            // integer arguments.
            match unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) } {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        },
        &mut |pid| match session_of(pid) == Some(pid) {
            true => renice_autogroup(pid, nice),
            false => Ok(()),
        },
    )
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relayproc::{autogroup_nice_of, nice_of};

    #[test]
    fn a_process_and_its_children_get_the_nice_value() {
        let tree = proctree::ShellWithChild::start();
        let (pid, child) = (tree.pid, tree.child);
        // Above the test's own nice value: raising it needs no privilege.
        let target = (nice_of(child).unwrap() + 3).min(NICE);
        let set = renice_tree(pid, target).unwrap();
        let (a, b) = (nice_of(pid), nice_of(child));
        drop(tree);
        assert_eq!(set, 2);
        assert_eq!((a, b), (Some(target), Some(target)));
    }

    /// What renicing a session leader did: its session group's nice value before and after,
    /// its thread's after, and the result.
    struct Reniced {
        before: Option<i32>,
        after: Option<i32>,
        thread: Option<i32>,
        result: std::io::Result<usize>,
    }

    impl Reniced {
        /// The leader's thread, and its session group where the kernel has them, got `nice`.
        fn assert_set_to(&self, nice: i32) {
            if self.before.is_some() {
                assert_eq!(self.after, Some(nice));
            }
            assert_eq!(self.thread, Some(nice));
        }
    }

    /// Renices a session leader (a `sleep` in a session of its own) to `nice`; the caller's
    /// own session group keeps its value.
    fn renice_a_session_leader(nice: i32) -> Reniced {
        let me = std::process::id();
        let mine = autogroup_nice_of(me);
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("30");
        crate::relayproc::in_own_session(&mut cmd);
        let mut leader = cmd.spawn().unwrap();
        let pid = leader.id();
        let sid = session_of(pid);
        let before = autogroup_nice_of(pid);
        let result = renice_tree(pid, nice);
        let (after, thread) = (autogroup_nice_of(pid), nice_of(pid));
        let _ = leader.kill();
        let _ = leader.wait();
        assert_eq!(sid, Some(pid));
        assert_eq!(autogroup_nice_of(me), mine);
        Reniced {
            before,
            after,
            thread,
            result,
        }
    }

    #[test]
    fn a_session_leader_gets_it_for_its_session_group_and_the_callers_group_keeps_its_own() {
        let r = renice_a_session_leader(NICE);
        r.result.as_ref().unwrap();
        r.assert_set_to(NICE);
    }

    /// `--w-share`'s raise, where the tests may raise priorities (as root, which CI is);
    /// elsewhere it fails rather than leaving the processes as they were unnoticed.
    #[test]
    fn a_session_leader_is_raised_with_its_session_group_or_the_raise_fails() {
        let r = renice_a_session_leader(FAVOURED);
        match &r.result {
            Ok(_) => r.assert_set_to(FAVOURED),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}"),
        }
    }
}
