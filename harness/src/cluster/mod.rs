//! Throw-away PostgreSQL clusters for `walrelay demo`, the bench and the integration tests.
//!
//! - [`PgInstall`] finds the server binaries.
//! - [`TempRoot`] is a temporary directory holding the clusters' data directories.
//! - [`Cluster`] is one instance: [`Cluster::init_primary`] or [`Cluster::basebackup_standby`],
//!   then `start().await`, SQL helpers, `stop().await`; dropping it stops it (immediate mode).
//!
//! PostgreSQL refuses to run as root, so when the euid is 0 the server programs (`initdb`,
//! `pg_ctl`, `pg_basebackup`) run as the `postgres` OS user, and everything they use is owned
//! by that user. Client tools ([`Cluster::command`], [`Cluster::pgbench`]) run as the caller.
//!
//! Set `WALRELAY_KEEP_TMP=1` to keep the temporary directories (and their logs) for inspection.

mod install;
mod instance;
pub mod majors;
#[cfg(test)]
mod tests;
pub mod walrec;

use std::collections::HashSet;
use std::ffi::CString;
use std::future::Future;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub use install::PgInstall;
pub use instance::{Cluster, PrimaryOpts, StandbyOpts};

/// Errors from setting up and driving throw-away clusters.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// PostgreSQL (or the `postgres` OS user) is missing; the message says what to install.
    #[error("{0}")]
    NotFound(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// An external command failed; `detail` has its exit status and output.
    #[error("`{cmd}` failed: {detail}")]
    Command { cmd: String, detail: String },
    #[error("{context}: {source}")]
    Postgres {
        context: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("timed out after {timeout:?} waiting for {what}{}", last_error.as_ref().map(|e| format!(" (last error: {e})")).unwrap_or_default())]
    Timeout {
        what: String,
        timeout: Duration,
        last_error: Option<String>,
    },
    #[error("{0}")]
    Other(String),
}

impl ClusterError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> ClusterError {
        ClusterError::Io {
            context: context.into(),
            source,
        }
    }
}

/// A temporary directory (`$TMPDIR/walrelay-XXXXXX`) for clusters, usable by the `postgres` user
/// when running as root. It is deleted when the `TempRoot` and every [`Cluster`] created in it
/// are dropped (clusters hold a reference and stop their server first).
#[derive(Debug, Clone)]
pub struct TempRoot {
    dir: Arc<tempfile::TempDir>,
}

impl TempRoot {
    pub fn new() -> Result<TempRoot, ClusterError> {
        let keep = std::env::var_os("WALRELAY_KEEP_TMP").is_some_and(|v| !v.is_empty() && v != "0");
        let dir = tempfile::Builder::new()
            .prefix("walrelay-")
            .disable_cleanup(keep)
            .tempdir()
            .map_err(|e| ClusterError::io("creating temporary directory", e))?;
        if keep {
            tracing::info!(path = %dir.path().display(), "WALRELAY_KEEP_TMP set: keeping directory");
        }
        chown_to_pg(dir.path())?;
        Ok(TempRoot { dir: Arc::new(dir) })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn handle(&self) -> Arc<tempfile::TempDir> {
        self.dir.clone()
    }
}

/// Where [`free_port`] looks first: below the kernel's default ephemeral range, which starts at
/// 32768.
const QUIET_PORTS: std::ops::Range<u16> = 20000..32768;

/// A free TCP port on 127.0.0.1 (bound then released). Never returns the same port twice in one
/// process.
///
/// The port comes from [`QUIET_PORTS`] less the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`), starting at a place chosen at random for each process.
/// Outgoing connections take their local ports from the ephemeral range, so a port from
/// outside it cannot become some connection's local end between this call and the server's
/// bind. A suite run failed that way once, when ports came from binding port 0. When no quiet
/// port is left, the kernel chooses, as before.
pub fn free_port() -> u16 {
    struct Picker {
        handed_out: HashSet<u16>,
        /// The quiet ports, each tried at most once, from `start` on, around the end.
        quiet: Vec<u16>,
        start: usize,
        tried: usize,
    }
    static PICKER: OnceLock<Mutex<Picker>> = OnceLock::new();
    let picker = PICKER.get_or_init(|| {
        let ephemeral = ephemeral_ports();
        let quiet: Vec<u16> = QUIET_PORTS.filter(|p| !ephemeral.contains(p)).collect();
        Mutex::new(Picker {
            handed_out: HashSet::new(),
            start: random_index(quiet.len()),
            quiet,
            tried: 0,
        })
    });
    let mut picker = picker.lock().unwrap_or_else(|e| e.into_inner());
    while picker.tried < picker.quiet.len() {
        let port = picker.quiet[(picker.start + picker.tried) % picker.quiet.len()];
        picker.tried += 1;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            picker.handed_out.insert(port);
            return port;
        }
    }
    loop {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
        let port = listener
            .local_addr()
            .expect("local_addr of bound socket")
            .port();
        if picker.handed_out.insert(port) {
            return port;
        }
    }
}

/// The kernel's ephemeral port range (32768..61000 when it cannot be read).
fn ephemeral_ports() -> std::ops::Range<u16> {
    let read = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok();
    let parsed = read.and_then(|t| {
        let mut it = t.split_whitespace().map(|v| v.parse::<u16>().ok());
        Some(it.next()??..it.next()??.saturating_add(1))
    });
    parsed.unwrap_or(32768..61000)
}

/// A number below `n` (0 when `n` is 0) that differs from process to process.
fn random_index(n: usize) -> usize {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    (h.finish() % n.max(1) as u64) as usize
}

/// Polls `f` every 100 ms until it returns `Ok(true)`. Errors count as "not yet" (the last one
/// is reported on timeout), so this also works while a server is still coming up.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut f: F) -> Result<(), ClusterError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, ClusterError>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_error = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, f()).await {
            Ok(Ok(true)) => return Ok(()),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => last_error = Some(e.to_string()),
            Err(_) => {}
        }
        if Instant::now() >= deadline {
            return Err(ClusterError::Timeout {
                what: what.to_string(),
                timeout,
                last_error,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// uid/gid of the `postgres` OS user if we are root (and so must switch to it), else `None`.
pub(crate) fn pg_owner() -> Result<Option<(u32, u32)>, ClusterError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    static OWNER: OnceLock<Option<(u32, u32)>> = OnceLock::new();
    OWNER
        .get_or_init(|| lookup_user("postgres"))
        .map(Some)
        .ok_or_else(|| {
            ClusterError::NotFound(
                "running as root but there is no `postgres` OS user to run PostgreSQL as \
             (create one: useradd --system --user-group --home-dir /var/lib/postgresql postgres)"
                    .to_string(),
            )
        })
}

fn lookup_user(name: &str) -> Option<(u32, u32)> {
    let cname = CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: all-zero is a valid `passwd` (null pointers, zero ids); it is only read after
    // getpwnam_r fills it.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the duration of the call and buf.len() is its size.
    let rc = unsafe {
        libc::getpwnam_r(
            cname.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    (rc == 0 && !result.is_null()).then_some((pwd.pw_uid, pwd.pw_gid))
}

/// Makes `cmd` run as the `postgres` user when we are root.
pub(crate) fn as_pg_user(cmd: &mut Command) -> Result<(), ClusterError> {
    use std::os::unix::process::CommandExt;
    if let Some((uid, gid)) = pg_owner()? {
        cmd.uid(uid).gid(gid);
    }
    Ok(())
}

/// Gives `path` to the `postgres` user when we are root.
pub(crate) fn chown_to_pg(path: &Path) -> Result<(), ClusterError> {
    if let Some((uid, gid)) = pg_owner()? {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .map_err(|e| ClusterError::io(format!("chown postgres {}", path.display()), e))?;
    }
    Ok(())
}

/// [`chown_to_pg`] for `path` and everything under it (symbolic links themselves, not
/// what they point to).
pub(crate) fn chown_tree_to_pg(path: &Path) -> Result<(), ClusterError> {
    let Some((uid, gid)) = pg_owner()? else {
        return Ok(());
    };
    let mut todo = vec![path.to_path_buf()];
    while let Some(p) = todo.pop() {
        std::os::unix::fs::lchown(&p, Some(uid), Some(gid))
            .map_err(|e| ClusterError::io(format!("chown postgres {}", p.display()), e))?;
        let meta = std::fs::symlink_metadata(&p)
            .map_err(|e| ClusterError::io(format!("stat {}", p.display()), e))?;
        if meta.is_dir() {
            let entries = std::fs::read_dir(&p)
                .map_err(|e| ClusterError::io(format!("reading {}", p.display()), e))?;
            for e in entries {
                todo.push(
                    e.map_err(|e| ClusterError::io("reading directory entry", e))?
                        .path(),
                );
            }
        }
    }
    Ok(())
}

/// Short form of a command line for error messages: program file name and arguments.
pub(crate) fn describe(cmd: &Command) -> String {
    let prog = Path::new(cmd.get_program());
    let mut s = prog
        .file_name()
        .unwrap_or(prog.as_os_str())
        .to_string_lossy()
        .into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

fn check_output(desc: String, out: Output) -> Result<Output, ClusterError> {
    if out.status.success() {
        return Ok(out);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut detail = out.status.to_string();
    for text in [stderr.trim(), stdout.trim()] {
        if !text.is_empty() {
            detail.push_str(":\n");
            detail.push_str(text);
        }
    }
    Err(ClusterError::Command { cmd: desc, detail })
}

/// Runs `cmd` to completion (stdin closed, output captured); non-zero exit is an error.
pub(crate) fn run_sync(mut cmd: Command) -> Result<Output, ClusterError> {
    let desc = describe(&cmd);
    cmd.stdin(Stdio::null());
    let out = cmd
        .output()
        .map_err(|e| ClusterError::io(format!("running `{desc}`"), e))?;
    check_output(desc, out)
}

/// [`run_sync`] without blocking the async runtime.
pub(crate) async fn run_async(cmd: Command) -> Result<Output, ClusterError> {
    let desc = describe(&cmd);
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.stdin(Stdio::null());
    let out = cmd
        .output()
        .await
        .map_err(|e| ClusterError::io(format!("running `{desc}`"), e))?;
    check_output(desc, out)
}

/// Waits until `standby` has replayed what `primary` had written when called. `give_up` is
/// asked at every poll and ends the wait with its reason (the bench stops on integrity failures).
pub async fn wait_replayed(
    primary: &Cluster,
    standby: &Cluster,
    timeout: Duration,
    give_up: impl Fn() -> Option<String>,
) -> Result<(), ClusterError> {
    let target = primary
        .query_lsn("select pg_current_wal_lsn()::text")
        .await?;
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(why) = give_up() {
            return Err(ClusterError::Other(why));
        }
        let replayed = standby
            .query_lsn("select pg_last_wal_replay_lsn()::text")
            .await
            .ok();
        if replayed.is_some_and(|r| r >= target) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(ClusterError::Other(format!(
                "standby {:?} did not replay up to {target} within {timeout:?}",
                standby.name()
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
