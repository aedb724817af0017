//! A process and everything below it, thread by thread: what [`super::background`] renices
//! and [`super::sites`] pins to its CPUs. Linux keeps a nice value and a CPU affinity per
//! thread, and a new thread or process inherits its creator's, so setting every thread of a
//! tree also covers what it starts later.

use std::io;
use std::path::Path;

use crate::relayproc::stat_field;

/// Calls `on_thread` with every thread of `root` and of all its descendants, then
/// `on_process` with each process, `root` first; returns how many threads `on_thread`
/// succeeded on. An error on `root` (it does not exist, its threads cannot be listed, or a
/// call on it fails) is returned. A descendant that ends meanwhile, or that a call fails on,
/// is skipped; so is a thread that ended before its call (`ESRCH`).
pub fn each_thread(
    root: u32,
    on_thread: &mut dyn FnMut(u32) -> io::Result<()>,
    on_process: &mut dyn FnMut(u32) -> io::Result<()>,
) -> io::Result<usize> {
    let procs = descendants(root)?;
    let mut done = 0;
    for (i, pid) in procs.iter().enumerate() {
        let tasks = match std::fs::read_dir(format!("/proc/{pid}/task")) {
            Ok(t) => t,
            Err(e) if i > 0 && e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for t in tasks {
            let Some(tid) = t?.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            match on_thread(tid) {
                Ok(()) => done += 1,
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) if i == 0 => return Err(e),
                Err(_) => {}
            }
        }
        if let Err(e) = on_process(*pid) {
            if i == 0 {
                return Err(e);
            }
        }
    }
    Ok(done)
}

/// `root` and every process below it (by the parent pid in `/proc/<pid>/stat`), `root` first.
pub fn descendants(root: u32) -> io::Result<Vec<u32>> {
    if !Path::new(&format!("/proc/{root}")).exists() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no process {root}"),
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

/// A shell with a child of its own, both killed when dropped (for tests of a process tree).
#[cfg(test)]
pub struct ShellWithChild {
    sh: std::process::Child,
    pub pid: u32,
    pub child: u32,
}

#[cfg(test)]
impl ShellWithChild {
    pub fn start() -> ShellWithChild {
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .unwrap();
        let pid = sh.id();
        let child = (0..200).find_map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            descendants(pid).ok().and_then(|d| d.get(1).copied())
        });
        // Without a child there is nothing for `drop` to kill but the shell (kill(2) of pid 0
        // would signal this whole process group).
        let Some(child) = child else {
            let _ = sh.kill();
            let _ = sh.wait();
            panic!("the shell's child did not start");
        };
        ShellWithChild { sh, pid, child }
    }
}

#[cfg(test)]
impl Drop for ShellWithChild {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the shell's own child; no memory is involved.
        unsafe { libc::kill(self.child as i32, libc::SIGKILL) };
        let _ = self.sh.kill();
        let _ = self.sh.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_pid_is_read_after_the_command() {
        let me = std::process::id();
        let parent = parent_of(me).unwrap();
        assert_eq!(parent, std::os::unix::process::parent_id());
    }

    #[test]
    fn a_missing_process_is_an_error_that_names_it() {
        let e = each_thread(u32::MAX - 1, &mut |_| Ok(()), &mut |_| Ok(())).unwrap_err();
        assert!(e.to_string().contains("no process"), "{e}");
    }

    #[test]
    fn every_thread_of_a_tree_is_visited_and_a_failure_on_the_root_is_returned() {
        let tree = ShellWithChild::start();
        let (pid, child) = (tree.pid, tree.child);
        let mut seen = Vec::new();
        let mut record = |t| {
            seen.push(t);
            Ok(())
        };
        let visited = each_thread(pid, &mut record, &mut |_| Ok(()));
        let on_child = each_thread(
            pid,
            &mut |t| match t == pid {
                true => Ok(()),
                false => Err(io::Error::other("refused")),
            },
            &mut |_| Ok(()),
        );
        let on_root = each_thread(pid, &mut |_| Err(io::Error::other("refused")), &mut |_| {
            Ok(())
        });
        drop(tree);
        assert_eq!(visited.unwrap(), 2);
        assert_eq!(seen, [pid, child]);
        // A descendant that refuses is skipped; the root that refuses fails the call.
        assert_eq!(on_child.unwrap(), 1);
        assert_eq!(on_root.unwrap_err().to_string(), "refused");
    }
}
