//! The real `walrelay` binary as a child process: `walrelay run --config FILE`, started with a
//! TOML config written to a file, waited for until its ports answer, stopped with a signal
//! (SIGTERM drains), killed on drop. The binary's path is the caller's: `walrelay bench` and
//! `walrelay demo` pass their own executable, the tests `env!("CARGO_BIN_EXE_walrelay")`.

use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a started process gets to listen on its ports.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Starting or signalling a `walrelay run` process failed.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("walrelay ({config}) {what}; its log ({log}) ends with:\n{tail}")]
    Start {
        config: PathBuf,
        log: PathBuf,
        what: String,
        tail: String,
    },
    #[error("walrelay ({0}) is not running")]
    NotRunning(PathBuf),
}

/// The session a [`RelayProcess`] runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Session {
    /// The caller's session and process group: an interrupt at the terminal reaches it too
    /// (the tests).
    Caller,
    /// A session of its own (`setsid`), as a service manager starts a daemon: where the
    /// kernel shares the CPU between sessions first (autogroup, on by default on Linux
    /// without a cgroup per service), the relay competes for a core as one of its own, like
    /// each PostgreSQL process (every one of them is a session leader), rather than with
    /// everything else in the caller's session (the bench). An interrupt at the terminal no
    /// longer reaches it: the caller must drop or stop it.
    Own,
}

/// A `walrelay run` child process. Dropping it kills the process (SIGKILL); call
/// [`RelayProcess::terminate`] for an orderly drain.
#[derive(Debug)]
pub struct RelayProcess {
    child: Option<Child>,
    bin: PathBuf,
    /// The config file it runs with (rewrite it and send SIGHUP to reload).
    pub config: PathBuf,
    /// Its standard output and error.
    pub log: PathBuf,
    ports: Vec<u16>,
    rust_log: Option<String>,
    session: Session,
}

impl RelayProcess {
    /// Writes `toml` to `<dir>/<name>.toml` and runs `bin run --config` on it, output appended
    /// to `<dir>/<name>.log`, then waits until every port of `ports` on 127.0.0.1 accepts
    /// connections. `rust_log` is set as `RUST_LOG`; `None` removes it, so `[log] level` of
    /// the config decides. `session`: whose session the process runs in ([`Session`]).
    pub fn start(
        bin: &Path,
        dir: &Path,
        name: &str,
        toml: &str,
        ports: &[u16],
        rust_log: Option<&str>,
        session: Session,
    ) -> Result<RelayProcess, RelayError> {
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(&config, toml).map_err(|source| RelayError::Io {
            context: format!("writing {}", config.display()),
            source,
        })?;
        let mut p = RelayProcess {
            child: None,
            bin: bin.to_path_buf(),
            config,
            log: dir.join(format!("{name}.log")),
            ports: ports.to_vec(),
            rust_log: rust_log.map(str::to_string),
            session,
        };
        p.spawn()?;
        Ok(p)
    }

    /// Starts the process again with the same config (after [`RelayProcess::kill`] or a stop).
    pub fn respawn(&mut self) -> Result<(), RelayError> {
        self.kill();
        self.spawn()
    }

    fn spawn(&mut self) -> Result<(), RelayError> {
        let io = |context: String| move |source| RelayError::Io { context, source };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(io(format!("opening {}", self.log.display())))?;
        let log2 = log
            .try_clone()
            .map_err(io(format!("opening {}", self.log.display())))?;
        let mut cmd = Command::new(&self.bin);
        cmd.args(["run", "--config"]).arg(&self.config);
        match &self.rust_log {
            Some(filter) => cmd.env("RUST_LOG", filter),
            None => cmd.env_remove("RUST_LOG"),
        };
        if self.session == Session::Own {
            in_own_session(&mut cmd);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(io(format!(
                "running {} (build it with cargo build -p walrelay)",
                self.bin.display()
            )))?;
        self.child = Some(child);
        self.wait_listening()
    }

    fn wait_listening(&mut self) -> Result<(), RelayError> {
        let deadline = Instant::now() + START_TIMEOUT;
        for port in self.ports.clone() {
            while TcpStream::connect(("127.0.0.1", port)).is_err() {
                let exited = match self.child.as_mut().map(Child::try_wait) {
                    Some(Ok(Some(status))) => Some(status),
                    _ => None,
                };
                if let Some(status) = exited {
                    self.child = None;
                    return Err(self.start_error(format!("exited with {status} during start-up")));
                }
                if Instant::now() > deadline {
                    self.kill();
                    return Err(self.start_error(format!(
                        "did not listen on {port} within {START_TIMEOUT:?}"
                    )));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    fn start_error(&self, what: String) -> RelayError {
        RelayError::Start {
            config: self.config.clone(),
            log: self.log.clone(),
            what,
            tail: self.log_tail(40),
        }
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `sig` (e.g. `libc::SIGHUP`) to the running process.
    pub fn signal(&self, sig: i32) -> Result<(), RelayError> {
        let pid = self
            .pid()
            .ok_or_else(|| RelayError::NotRunning(self.config.clone()))?;
        // SAFETY: kill has no memory-safety preconditions.
        if unsafe { libc::kill(pid as libc::pid_t, sig) } != 0 {
            return Err(RelayError::Io {
                context: format!("kill({pid}, {sig})"),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Sends `sig` (SIGTERM or SIGINT), then waits for exit (bounded); returns the exit
    /// status, or None (after SIGKILL) if the process was still running at `within`, or was
    /// not running at all.
    pub fn stop_with(&mut self, sig: i32, within: Duration) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        // SAFETY: as in `signal`.
        unsafe { libc::kill(c.id() as libc::pid_t, sig) };
        let deadline = Instant::now() + within;
        loop {
            match c.try_wait() {
                Ok(Some(s)) => return Some(s),
                Ok(None) if Instant::now() <= deadline => {}
                _ => {
                    let _ = c.kill();
                    let _ = c.wait();
                    return None;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM (drain), then wait for exit (bounded); returns the exit status.
    pub fn terminate(&mut self, within: Duration) -> Option<ExitStatus> {
        self.stop_with(libc::SIGTERM, within)
    }

    /// SIGKILL (a crash), no draining.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// CPU seconds the process has used so far, and of them the kernel's (None when not
    /// running).
    pub fn cpu_times(&self) -> Option<CpuTimes> {
        process_cpu_times(self.pid()?)
    }

    /// Seconds its threads have waited for a core so far ([`crate::cpuwait`]; None when not
    /// running or not kept by the kernel).
    pub fn cpu_wait_seconds(&self) -> Option<f64> {
        crate::cpuwait::process_wait_seconds(self.pid()?)
    }

    /// Its resident set now and the largest so far (None when not running).
    pub fn resident(&self) -> Option<Resident> {
        process_resident(self.pid()?)
    }

    pub fn log_text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = self.log_text();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The fields of `/proc/<pid>/stat` after the command, `state` first: the file is
/// `pid (comm) state ppid ...` and comm may hold spaces and parentheses, so the fields
/// start after the last `)`. None when there is no such process.
pub fn stat_after_comm(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat.rsplit_once(')')?.1.to_string())
}

/// Makes the process `cmd` starts lead a session of its own (`setsid` before exec).
pub fn in_own_session(cmd: &mut Command) {
    // SAFETY: the hook runs in the child between fork and exec, where only async-signal-safe
    // calls may be made: setsid is one, and the hook touches no memory of the parent's.
    unsafe {
        cmd.pre_exec(|| match libc::setsid() {
            -1 => Err(std::io::Error::last_os_error()),
            _ => Ok(()),
        })
    };
}

/// The session id of `pid` (field 6 of `/proc/<pid>/stat`).
pub fn session_of(pid: u32) -> Option<u32> {
    stat_field(pid, 3)
}

/// The nice value of thread `tid` (field 19 of `/proc/<tid>/stat`).
pub fn nice_of(tid: u32) -> Option<i32> {
    stat_field(tid, 16)
}

/// The nice value of the session group of `pid` (`/proc/<pid>/autogroup` reads
/// `/autogroup-<n> nice <v>`); None without autogroup.
pub fn autogroup_nice_of(pid: u32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/autogroup")).ok()?;
    s.split_whitespace().last()?.parse().ok()
}

/// Field `k` after the command in `/proc/<pid>/stat` (0: the state, 1: the parent, 3: the
/// session, 16: the nice value; `man 5 proc` numbers them from 3 on), parsed.
pub fn stat_field<T: std::str::FromStr>(pid: u32, k: usize) -> Option<T> {
    stat_after_comm(pid)?
        .split_whitespace()
        .nth(k)?
        .parse()
        .ok()
}

/// CPU time a process has used, seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuTimes {
    /// User and kernel time.
    pub total: f64,
    /// Kernel time alone: system calls, and page faults (memory touched for the first time
    /// is zeroed by the kernel, which on a virtual machine whose host backs guest memory
    /// lazily costs far more than the memory's speed).
    pub kernel: f64,
}

/// utime + stime and stime alone of process `pid` from `/proc/<pid>/stat`, in seconds.
pub fn process_cpu_times(pid: u32) -> Option<CpuTimes> {
    // utime and stime are fields 14 and 15, the 12th and 13th after the command.
    let rest = stat_after_comm(pid)?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as f64 } else { 100.0 };
    Some(CpuTimes {
        total: (utime + stime) as f64 / hz,
        kernel: stime as f64 / hz,
    })
}

/// A process's resident set, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resident {
    /// `VmRSS`: now.
    pub now: u64,
    /// `VmHWM`: the largest so far, as the kernel last recorded it (it may read below an
    /// earlier `now`).
    pub peak: u64,
}

/// [`Resident`] of process `pid`, from one read of `/proc/<pid>/status`.
pub fn process_resident(pid: u32) -> Option<Resident> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(Resident {
        now: status_kib(&status, "VmRSS:")? * 1024,
        peak: status_kib(&status, "VmHWM:")? * 1024,
    })
}

/// A `Name:   <n> kB` field (`name` with its colon, e.g. `VmRSS:`) of `/proc/<pid>/status`,
/// in bytes.
pub fn process_status_bytes(pid: u32, name: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status_kib(&status, name).map(|kib| kib * 1024)
}

/// The value of a `Name:   <n> kB` line of `/proc/<pid>/status`.
fn status_kib(status: &str, name: &str) -> Option<u64> {
    let rest = status.lines().find_map(|l| l.strip_prefix(name))?;
    let mut words = rest.split_whitespace();
    let n = words.next()?.parse().ok()?;
    (words.next() == Some("kB")).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command() {
        let me = std::process::id();
        assert_eq!(
            stat_field::<u32>(me, 1),
            Some(std::os::unix::process::parent_id())
        );
        // The state is a letter, not a number; a process that does not exist has no fields.
        assert_eq!(stat_field::<u32>(me, 0), None);
        assert!(stat_field::<String>(me, 0).is_some());
        assert_eq!(stat_field::<u32>(u32::MAX, 1), None);
    }

    /// A stand-in for the binary: `BIN run --config FILE` listens on `port` until killed.
    fn listener(dir: &Path, port: u16) -> PathBuf {
        let bin = dir.join("fake-walrelay");
        let py = format!(
            "import socket, time\ns = socket.socket()\ns.bind(('127.0.0.1', {port}))\ns.listen()\ntime.sleep(60)\n"
        );
        std::fs::write(&bin, format!("#!/bin/sh\nexec python3 -c \"{py}\"\n")).unwrap();
        std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        bin
    }

    #[test]
    fn a_process_started_in_its_own_session_leads_it_and_the_other_stays_in_ours() {
        let dir = tempfile::tempdir().unwrap();
        let ours = session_of(std::process::id()).unwrap();
        for own in [true, false] {
            let port = crate::cluster::free_port();
            let bin = listener(dir.path(), port);
            let session = if own { Session::Own } else { Session::Caller };
            let mut p =
                RelayProcess::start(&bin, dir.path(), "r", "", &[port], None, session).unwrap();
            let pid = p.pid().unwrap();
            let sid = session_of(pid);
            p.kill();
            assert_eq!(
                sid,
                Some(if own { pid } else { ours }),
                "own session: {own}"
            );
        }
    }

    #[test]
    fn reads_the_peak_resident_set() {
        let st = "Name:\twalrelay\nVmHWM:\t  123456 kB\nVmRSS:\t   1024 kB\n";
        assert_eq!(super::status_kib(st, "VmHWM:"), Some(123_456));
        assert_eq!(super::status_kib(st, "VmSwap:"), None);
        assert_eq!(super::status_kib("VmHWM:\t12 MB\n", "VmHWM:"), None);
        // Our own process has touched at least the vector below.
        let v = vec![1u8; 32 << 20];
        std::hint::black_box(&v);
        let r = super::process_resident(std::process::id()).unwrap();
        assert!(r.now >= 32 << 20 && r.peak >= 32 << 20, "{r:?}");
    }

    #[test]
    fn reads_own_cpu_time() {
        // Burn CPU until the kernel's clock-tick accounting shows some (a fixed loop can finish
        // within one tick in an optimised build), for at most 5 s of wall time: a reader that
        // never sees our own CPU time fails.
        let pid = std::process::id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut x = 0u64;
        let mut s = super::process_cpu_times(pid).unwrap();
        while s.total <= 0.0 && std::time::Instant::now() < deadline {
            for i in 0..1_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            s = super::process_cpu_times(pid).unwrap();
        }
        assert!(
            s.total > 0.0,
            "no CPU time read for our own process in 5 s: {s:?}"
        );
        assert!(
            (0.0..=s.total).contains(&s.kernel),
            "kernel time outside 0..=total: {s:?}"
        );
    }
}
