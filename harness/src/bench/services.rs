//! `--services`: each PostgreSQL cluster and each relay process in a CPU group (cgroup) of its
//! own, all of one weight, as systemd runs `postgresql.service` and the relay's units once a
//! unit sets `CPUWeight=` (which turns the cpu controller on for the slice). The kernel then
//! shares a busy CPU between the groups first, and between a group's processes after: the
//! primary as a whole, with its backends, parallel workers and walsenders, weighs what one
//! upstream weighs. Without it every PostgreSQL process is a session group of its own
//! (autogroup) and the upstream one among them, the bench's default and a host's whose units
//! set no CPU weight.
//!
//! Layout (cgroup v2 at `/sys/fs/cgroup`, or the v1 `cpu` hierarchy at `/sys/fs/cgroup/cpu`):
//!
//! ```text
//! walrelay-bench-<bench pid>-primary/  -standby-w/  -standby-z/  -standby-direct/
//!                                    -- each a postmaster and all below it
//! walrelay-bench-<bench pid>-w-upstream/  -w-downstream/  -z-upstream/  -z-downstream/
//!                                    -- each one relay process
//! ```
//!
//! Each group sits at the root, beside the session groups of what is not placed. A first
//! layout nested them in one `walrelay-bench-<pid>` group: that group then weighed, as a
//! whole and split between the CPUs by where its load ran, what the bench's own session
//! weighed (which generates `bulk`'s COPY rows and copies each window's WAL), and W's lag
//! came out no better than without `--services` (the fifty-fourth round of
//! `docs/keeping-up.md`).
//!
//! Weights ([`Share`]): v2 `cpu.weight` 100 (systemd's default `CPUWeight=`), v1 `cpu.shares`
//! 1024. With `--w-share` W's two groups weigh three times that (as `CPUWeight=300`). With
//! `--z-background` Z's relay processes and its standby stay out of the groups, at nice 19 in
//! session groups of their own as without `--services`: in groups of the least weight (v1's 2)
//! they were starved past the bench's five-second sample. A process moves with all its
//! threads, and what a postmaster starts later starts in its group. Not placed: the bench
//! itself, the load's clients, the sync-latency run, the offline baselines and the
//! one-core replays. [`Services`] takes its groups away when dropped (the bench's end, a
//! failure, a signal), moving what still runs in them back to the hierarchy's root.

use std::io;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::pair::RelayPair;
use super::proctree;
use crate::cluster::Cluster;

/// Which cgroup hierarchy holds the cpu controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// The unified hierarchy, its root here (`cpu.weight`, 1–10000, default 100).
    V2(PathBuf),
    /// The v1 `cpu` hierarchy, its root here (`cpu.shares`, 2–262144, default 1024).
    V1(PathBuf),
}

/// A group's CPU weight against the others'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// The default weight, every service alike.
    Even,
    /// Three times the default (`--w-share`).
    Favoured,
}

impl Hierarchy {
    /// The cpu controller of this machine: cgroup v2 where `/sys/fs/cgroup` has it, else the
    /// v1 `cpu` hierarchy.
    pub fn of_this_machine() -> Result<Hierarchy> {
        Hierarchy::find(Path::new("/sys/fs/cgroup"))
    }

    /// The cpu controller under `fs` (a cgroup file system's mount point).
    pub fn find(fs: &Path) -> Result<Hierarchy> {
        let v2 = std::fs::read_to_string(fs.join("cgroup.controllers")).unwrap_or_default();
        if v2.split_whitespace().any(|c| c == "cpu") {
            return Ok(Hierarchy::V2(fs.to_path_buf()));
        }
        let v1 = fs.join("cpu");
        if v1.join("cpu.shares").exists() {
            return Ok(Hierarchy::V1(v1));
        }
        anyhow::bail!(
            "--services needs the cgroup cpu controller: neither {} lists cpu nor is {} a cgroup \
             v1 cpu hierarchy (mount one, or run without --services)",
            fs.join("cgroup.controllers").display(),
            v1.display()
        )
    }

    /// The hierarchy's root group's directory.
    pub fn root(&self) -> &Path {
        match self {
            Hierarchy::V2(p) | Hierarchy::V1(p) => p,
        }
    }

    /// The weight file and the value of `share` in it.
    pub fn weight(&self, share: Share) -> (&'static str, u32) {
        let (file, even) = match self {
            Hierarchy::V2(_) => ("cpu.weight", 100),
            Hierarchy::V1(_) => ("cpu.shares", 1024),
        };
        let v = match share {
            Share::Even => even,
            Share::Favoured => 3 * even,
        };
        (file, v)
    }

    /// One line for the report.
    pub fn describe(&self) -> String {
        let (file, even) = self.weight(Share::Even);
        let kind = match self {
            Hierarchy::V2(_) => "cgroup v2",
            Hierarchy::V1(_) => "cgroup v1 cpu",
        };
        format!(
            "Each cluster and each relay process ran in a CPU group of its own (--services, {kind} \
             at {}, {file} {even} each), as systemd services whose units set CPUWeight=: the \
             primary as a whole weighed what one upstream weighed.",
            self.root().display()
        )
    }
}

/// The bench's groups while they exist.
pub struct Services {
    hierarchy: Hierarchy,
    groups: Vec<PathBuf>,
}

/// The name of the bench's group `name` (`walrelay-bench-<pid>-<name>`).
pub fn group_name(bench_pid: u32, name: &str) -> String {
    format!("walrelay-bench-{bench_pid}-{name}")
}

impl Services {
    /// No group yet; on cgroup v2 the cpu controller turned on for the root's children.
    pub fn create(hierarchy: &Hierarchy) -> Result<Services> {
        if let Hierarchy::V2(root) = hierarchy {
            enable_cpu(root)?;
        }
        Ok(Services {
            hierarchy: hierarchy.clone(),
            groups: Vec::new(),
        })
    }

    /// Makes group `name` with `share`'s weight and moves process `root` and everything below
    /// it there. Returns the group's directory.
    pub fn place(&mut self, name: &str, root: u32, share: Share) -> Result<PathBuf> {
        let dir = self
            .hierarchy
            .root()
            .join(group_name(std::process::id(), name));
        std::fs::create_dir(&dir).with_context(|| {
            format!(
                "making the cgroup {} (--services needs root, or write access to the cgroup \
                 file system)",
                dir.display()
            )
        })?;
        self.groups.push(dir.clone());
        let (file, weight) = self.hierarchy.weight(share);
        std::fs::write(dir.join(file), weight.to_string())
            .with_context(|| format!("setting {file} of {} to {weight}", dir.display()))?;
        move_tree(&dir, root).with_context(|| {
            format!(
                "moving process {root} and all below it into {}",
                dir.display()
            )
        })?;
        Ok(dir)
    }

    /// Moves what still runs in the groups to the hierarchy's root and removes them.
    fn remove(&mut self) -> Result<()> {
        let root_procs = self.hierarchy.root().join("cgroup.procs");
        for dir in self.groups.drain(..).rev() {
            // A process forking while it moves may leave a child behind: a few rounds.
            let mut last = Ok(());
            for _ in 0..5 {
                for pid in procs_of(&dir) {
                    let _ = std::fs::write(&root_procs, pid.to_string());
                }
                last = std::fs::remove_dir(&dir);
                if last.is_ok() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            last.with_context(|| format!("removing the cgroup {}", dir.display()))?;
        }
        Ok(())
    }
}

impl Drop for Services {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            crate::errln!("bench: {e:#}");
        }
    }
}

/// What runs in the rig's groups: the primary, the relayed standbys (W's, Z's), the direct
/// standby, and the two pairs (W, Z).
pub struct Rig<'a> {
    pub primary: &'a Cluster,
    pub standbys: [&'a Cluster; 3],
    pub pairs: &'a [RelayPair; 2],
}

/// Places each cluster and relay process of `rig` in a group of its own (the module's
/// layout), W's relay processes with `w` and Z's with its standby with `z` (None: left where
/// they are), the rest [`Share::Even`].
pub fn place(h: &Hierarchy, rig: &Rig<'_>, w: Share, z: Option<Share>) -> Result<Services> {
    let mut s = Services::create(h)?;
    let postmaster = |c: &Cluster| {
        c.postmaster_pid()
            .with_context(|| format!("cluster {} has no postmaster.pid", c.name()))
    };
    let [standby_w, standby_z, direct] = rig.standbys;
    let clusters = [
        ("primary", rig.primary, Some(Share::Even)),
        ("standby-w", standby_w, Some(Share::Even)),
        ("standby-z", standby_z, z),
        ("standby-direct", direct, Some(Share::Even)),
    ];
    for (name, c, share) in clusters {
        if let Some(share) = share {
            s.place(name, postmaster(c)?, share)?;
        }
    }
    for ((tag, share), pair) in [("w", Some(w)), ("z", z)].into_iter().zip(rig.pairs) {
        let Some(share) = share else { continue };
        for (half, pid) in pair.pids() {
            let pid = pid.with_context(|| format!("the {tag} pair's {half} is not running"))?;
            s.place(&format!("{tag}-{half}"), pid, share)?;
        }
    }
    Ok(s)
}

/// Turns the cpu controller on for the children of v2 group `dir`.
fn enable_cpu(dir: &Path) -> Result<()> {
    std::fs::write(dir.join("cgroup.subtree_control"), "+cpu").with_context(|| {
        format!(
            "turning the cpu controller on in {} (--services needs root)",
            dir.join("cgroup.subtree_control").display()
        )
    })
}

/// Moves `root` first, then what is below it: a process it starts meanwhile starts in the
/// group. A descendant that ended meanwhile is skipped.
fn move_tree(dir: &Path, root: u32) -> io::Result<()> {
    let procs = dir.join("cgroup.procs");
    std::fs::write(&procs, root.to_string())?;
    for pid in proctree::descendants(root)?.into_iter().skip(1) {
        match std::fs::write(&procs, pid.to_string()) {
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            other => other?,
        }
    }
    Ok(())
}

/// The processes in group `dir`.
fn procs_of(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// The path of the cpu controller's group in `/proc/<pid>/cgroup`'s text: the v1 line whose
/// controllers include `cpu`, else the v2 line (`0::`).
pub fn cpu_group_in(proc_cgroup: &str) -> Option<&str> {
    let mut v2 = None;
    for line in proc_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if controllers.split(',').any(|c| c == "cpu") {
            return Some(path);
        }
        if id == "0" && controllers.is_empty() {
            v2 = Some(path);
        }
    }
    v2
}

/// The cpu controller's group of process `pid`.
pub fn cpu_group_of(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    cpu_group_in(&text).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_group_is_read_from_v1_and_v2_lines() {
        let v1 = "9:name=systemd:/\n4:memory:/x\n1:cpu,cpuacct:/walrelay-bench-7/primary\n0::/\n";
        assert_eq!(cpu_group_in(v1), Some("/walrelay-bench-7/primary"));
        let v1b = "2:cpuacct:/\n1:cpu:/a\n0::/";
        assert_eq!(cpu_group_in(v1b), Some("/a"));
        assert_eq!(
            cpu_group_in("0::/system.slice/x.service\n"),
            Some("/system.slice/x.service")
        );
        assert_eq!(cpu_group_in("3:cpuset:/\n"), None);
        assert_eq!(cpu_group_in(""), None);
    }

    #[test]
    fn weights_are_the_default_or_three_times_it() {
        let v2 = Hierarchy::V2("/sys/fs/cgroup".into());
        let v1 = Hierarchy::V1("/sys/fs/cgroup/cpu".into());
        assert_eq!(v2.weight(Share::Even), ("cpu.weight", 100));
        assert_eq!(v2.weight(Share::Favoured), ("cpu.weight", 300));
        assert_eq!(v1.weight(Share::Even), ("cpu.shares", 1024));
        assert_eq!(v1.weight(Share::Favoured), ("cpu.shares", 3072));
    }

    #[test]
    fn a_file_system_without_the_cpu_controller_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup.controllers"), "memory pids\n").unwrap();
        let e = Hierarchy::find(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("--services needs the cgroup cpu controller"),
            "{e}"
        );
        std::fs::write(dir.path().join("cgroup.controllers"), "cpuset cpu io\n").unwrap();
        assert_eq!(
            Hierarchy::find(dir.path()).unwrap(),
            Hierarchy::V2(dir.path().to_path_buf())
        );
    }

    /// On this machine's cpu controller, where the tests may make groups (as root, which CI
    /// is): a tree placed with its weight, and after the drop no group left and the tree back
    /// at the root. Elsewhere (not root) making the group fails, naming what it needs.
    #[test]
    fn a_process_tree_is_placed_with_its_weight_and_the_groups_go_with_the_drop() {
        let h = Hierarchy::of_this_machine().unwrap();
        let tree = proctree::ShellWithChild::start();
        let mut s = Services::create(&h).unwrap();
        let dir = match s.place("primary", tree.pid, Share::Favoured) {
            Ok(dir) => dir,
            Err(e) => {
                // SAFETY: geteuid has no preconditions and cannot fail.
                assert_ne!(unsafe { libc::geteuid() }, 0, "as root: {e:#}");
                assert!(format!("{e:#}").contains("--services needs root"), "{e:#}");
                return;
            }
        };
        let (file, want) = h.weight(Share::Favoured);
        let weight = std::fs::read_to_string(dir.join(file)).unwrap();
        let name = format!("/{}", group_name(std::process::id(), "primary"));
        let placed = [tree.pid, tree.child].map(|p| cpu_group_of(p).unwrap_or_default());
        drop(s);
        let after = [tree.pid, tree.child].map(|p| cpu_group_of(p).unwrap_or_default());
        assert_eq!(weight.trim(), want.to_string());
        for g in &placed {
            assert!(g.ends_with(&name), "{g} is not {name}");
        }
        assert!(!dir.exists(), "{} left behind", dir.display());
        assert!(
            after.iter().all(|g| !g.contains("walrelay-bench-")),
            "{after:?}"
        );
    }
}
