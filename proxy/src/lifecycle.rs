//! Signals of `walrelay run`: SIGHUP reloads the configuration file, SIGTERM and SIGINT drain
//! and stop.
//!
//! Also what `walrelay run` sets for its process first: no transparent huge pages
//! ([`huge_pages_off`]).
//!
//! Reload: the file is read and checked as at start (`walrelay check-config`), on a blocking
//! thread (a read that hangs holds up neither the halves nor SIGTERM); if that fails the
//! error is logged and the running configuration stays. Otherwise the keys declared `live`
//! in [`crate::config`] apply at once to connections that arrive from then on (sessions in
//! flight keep what they started with); those declared `restart` keep their running values.
//! Today:
//!
//! | key | live |
//! |---|---|
//! | `log.level` (unless RUST_LOG is set) | yes |
//! | `limits.*` except `limits.max_message_bytes` | yes |
//! | `downstream.users`, `downstream.auth`, `downstream.allow_slot_commands`, `downstream.allow_sql` | yes |
//! | `upstream.primary`, `upstream.primary_password`, `upstream.slot` | yes |
//! | `upstream.listen`, `downstream.listen`, `downstream.upstream`, `downstream.tls_*`, `downstream.spool_dir`, `downstream.spool_bytes`, `downstream.name`, `link.*`, `limits.max_message_bytes`, `log.format`, `metrics.listen`, adding or removing a half | restart |
//!
//! A changed restart-only key is logged as a warning naming it, and keeps its running value.
//! Files named by the configuration (TLS certificates and keys) are read at start only; secrets
//! given as `{ file = ... }` or `{ env = ... }` are read again on every reload.
//!
//! Stop: on SIGTERM or SIGINT the listeners stop accepting, sessions end with a FATAL to their
//! standby after delivering what already arrived, the upstream ends its primary connections
//! with Terminate, and the process exits 0 once they have ended or `limits.drain_timeout_secs`
//! (plus a second) has passed, whichever comes first. A second SIGTERM or SIGINT during the
//! drain stops at once. A half that stops by itself (e.g. its listener fails) stops the
//! process with exit status 1.

use std::path::Path;
use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};
use tracing::{error, info, warn};

use crate::config::{Config, ConfigError, Key, MetricsConfig, Reload, Resolved, DEFAULT_SLOT};
use crate::logging::LogHandle;
use crate::relay::Running;
use crate::tlsfiles::TlsFiles;

/// The signal handlers of the process, installed first, before the configuration is read, so
/// that a SIGHUP that comes early is not fatal: it is served as a reload once the halves run.
pub struct Signals {
    hup: Signal,
    term: Signal,
    int: Signal,
}

impl Signals {
    pub fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            hup: signal(SignalKind::hangup())?,
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Serves SIGHUP (reloading `path`) until SIGTERM or SIGINT (true), or a half stopping by
    /// itself (false: the process should exit with an error).
    ///
    /// The file, and the secrets and TLS files it names, are read on a blocking thread: a
    /// read that hangs (a secret on a network mount that stopped answering) holds up neither
    /// SIGTERM nor SIGINT, nor the halves. A SIGHUP while a reload still reads is served
    /// after it, once.
    pub async fn serve(&mut self, running: &mut Running, path: &Path, log: &LogHandle) -> bool {
        let mut loading: Option<Loading> = None;
        let mut again = false;
        loop {
            tokio::select! {
                _ = self.hup.recv() => match loading {
                    Some(_) => again = true,
                    None => loading = Some(load(path)),
                },
                r = async { loading.as_mut().expect("guarded by the condition").await },
                    if loading.is_some() =>
                {
                    loading = again.then(|| load(path));
                    again = false;
                    match r {
                        Ok(new) => reload(running, path, new, log),
                        Err(e) => error!("SIGHUP: configuration not reloaded: {e}"),
                    }
                }
                _ = self.term.recv() => return stopping("SIGTERM", loading.is_some()),
                _ = self.int.recv() => return stopping("SIGINT", loading.is_some()),
                _ = running.shutdown.cancelled() => {
                    error!("a half stopped (see above): shutting down");
                    return false;
                }
            }
        }
    }

    /// Reads `path` for the start, on a blocking thread as a reload reads it: Err with the
    /// signal's name when SIGTERM or SIGINT comes first (the read hangs: a secret on a mount
    /// that stopped answering), which then ends the process as the signal's default action
    /// did before the handlers were installed. A SIGHUP meanwhile waits for the halves.
    pub async fn load_at_start(
        &mut self,
        path: &Path,
    ) -> Result<Result<Resolved, ConfigError>, &'static str> {
        tokio::select! {
            r = load(path) => Ok(r.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))),
            _ = self.term.recv() => Err("SIGTERM"),
            _ = self.int.recv() => Err("SIGINT"),
        }
    }

    /// Drains `running` (bounded by `limits.drain_timeout_secs`); a second SIGTERM or SIGINT
    /// cuts the drain short.
    pub async fn drain(&mut self, running: Running) {
        let grace = running.config.limits.drain_timeout_secs;
        tokio::select! {
            _ = running.shutdown() => info!("stopped"),
            _ = self.term.recv() => warn!("second SIGTERM: stopping without waiting for sessions (grace was {grace} s)"),
            _ = self.int.recv() => warn!("second SIGINT: stopping without waiting for sessions (grace was {grace} s)"),
        }
    }
}

/// A reload's reading of the configuration, on a blocking thread.
type Loading = tokio::task::JoinHandle<Result<Resolved, ConfigError>>;

fn load(path: &Path) -> Loading {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || Config::load(&path))
}

/// Logs the drain that `signal` starts; true.
fn stopping(signal: &str, reloading: bool) -> bool {
    match reloading {
        false => info!("{signal}: draining"),
        true => warn!(
            "{signal}: draining; the reload still reading the configuration (a file it names \
             does not answer?) is abandoned"
        ),
    }
    true
}

/// Time the runtime gets to drop what is left after the drain (tasks stuck on a socket are
/// dropped at once; this only bounds blocking threads).
pub const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(1);

/// Turns transparent huge pages off for this process (`prctl(PR_SET_THP_DISABLE)`, Linux
/// 3.15+), whatever the host's `/sys/kernel/mm/transparent_hugepage/enabled` says; returns
/// whether the kernel took it. `walrelay run` calls it first: the relay spawns no processes,
/// and a PostgreSQL host often has THP set to `always`.
///
/// Why: the codec's caches fill their memory as WAL arrives, and a fault that brings in a
/// huge page zeroes 2 MiB at once (after compacting memory to find one, where the host's
/// `defrag` setting allows it). On the one-core replay of recorded pgbench WAL, huge pages
/// (as the allocator asked for them until `docs/keeping-up.md`'s fifty-eighth round) cost
/// 2.3-7.5 s of kernel time against 0.6-0.7 s without, for the same user time; the allocator no
/// longer asks for them (mimalloc's `no_thp`), and this also covers hosts that give them
/// unasked. Failure (an older kernel, a seccomp filter) is harmless: the relay only runs
/// as before.
pub fn huge_pages_off() -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_SET_THP_DISABLE takes plain integer arguments and touches no memory of
        // ours; it sets a flag of the process that the kernel reads at page faults.
        unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// Ignores SIGXFSZ, as PostgreSQL's postmaster does: a write past the file size limit
/// (`ulimit -f`, `LimitFSIZE=`) then fails with EFBIG, which fails the spool with that reason
/// and is recovered from once the limit is raised, instead of killing the process. `walrelay
/// run` calls it first; it cannot fail for this signal.
pub fn ignore_file_size_signal() {
    // SAFETY: installs SIG_IGN, no handler of ours, for a signal nothing in the process
    // handles; `signal` touches no memory of ours.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

/// Reloads `path` into `running` from `loaded`, what [`Config::load`] made of it; logs what
/// changed, what needs a restart, or why nothing did.
pub fn reload(
    running: &mut Running,
    path: &Path,
    loaded: Result<Resolved, ConfigError>,
    log: &LogHandle,
) {
    let new = match loaded {
        Ok(c) => c,
        Err(e) => {
            return error!(
                config = %path.display(),
                "SIGHUP: configuration not reloaded, the running one stays in force: {e}"
            )
        }
    };
    let restart = restart_keys(&running.config, &new);
    if !restart.is_empty() {
        warn!(
            keys = %restart.join(", "),
            "SIGHUP: these settings changed but take effect only after a restart (running values kept): {}",
            restart.join(", ")
        );
    }
    let old = running.config.clone();
    let eff = effective(&old, &new);
    reload_tls(running, &eff);
    let changed = live_keys(&old, &eff);
    if let Some(w) = slot_left_behind(&old, &eff) {
        warn!("SIGHUP: {w}");
    }
    if eff.log.level != old.log.level {
        match log.set_level(&eff.log.level) {
            Ok(true) => {}
            Ok(false) => warn!("SIGHUP: RUST_LOG is set and overrides log.level"),
            Err(e) => warn!("SIGHUP: log level unchanged: {e}"),
        }
    }
    if let (Some(live), Some(cfg)) = (&running.upstream, &eff.upstream) {
        live.set(live.get().reconfigured(cfg.clone(), eff.limits.clone()));
    }
    if let (Some(live), Some(cfg)) = (&running.downstream, &eff.downstream) {
        live.set(live.get().reconfigured(cfg, eff.limits.clone()));
    }
    running.config = eff;
    info!(
        config = %path.display(),
        changed = %changed.join(", "),
        "SIGHUP: configuration reloaded{}",
        if changed.is_empty() { " (no live setting changed)" } else { "" }
    );
}

/// What to tell the operator when a reload changes `upstream.slot`: link streams opened from
/// then on use the new slot (created if missing), and nothing drops the old one, which keeps
/// holding WAL on the primary (a full `pg_wal` in the end) until someone does.
fn slot_left_behind(old: &Resolved, new: &Resolved) -> Option<String> {
    let name = |c: &Resolved| {
        c.upstream
            .as_ref()
            .map(|u| u.slot.clone().unwrap_or_else(|| DEFAULT_SLOT.to_string()))
    };
    let (was, now) = (name(old)?, name(new)?);
    (was != now).then(|| {
        format!(
            "upstream.slot changed from {was:?} to {now:?}: link streams opened from now on use \
             {now:?} (created if missing); {was:?} (and \"{was}_<name>\" of downstreams with a \
             downstream.name) stays on the primary and keeps its WAL: once every downstream \
             streams on the new slot, drop the old one on the primary \
             (SELECT pg_drop_replication_slot('{was}'))"
        )
    })
}

/// Reads the TLS files again when their contents changed on disk (a certificate renewed in
/// place, a Kubernetes Secret updated), as PostgreSQL does on SIGHUP: connections made from
/// now on use them, those open keep theirs. Files that no longer load leave the running ones
/// in force (the reload's check has read them already, so that is rare).
///
/// `eff` is what the process runs with after the reload: its paths are the running ones (a
/// changed path needs a restart), so those are the files compared, read and checked for
/// expiry, not the ones the file names for the next start.
fn reload_tls(running: &mut Running, eff: &Resolved) {
    let files = TlsFiles::read(eff);
    let rewritten = running.tls_files.changed(&files);
    files.warn_validity(std::time::SystemTime::now());
    if rewritten.is_empty() {
        return;
    }
    let keys = rewritten.join(", ");
    let mut r = Ok(());
    if let Some(live) = &running.upstream {
        r = live.get().reload_tls().map_err(anyhow::Error::from);
    }
    if let (Ok(()), Some(live)) = (&r, &running.downstream) {
        r = live.get().reload_tls();
    }
    match r {
        Ok(()) => {
            info!(keys = %keys, "SIGHUP: the TLS files of {keys} changed on disk and were read again: connections made from now on use them");
            running.tls_files = files;
        }
        Err(e) => {
            error!(keys = %keys, "SIGHUP: the TLS files of {keys} changed on disk but do not load ({e:#}); the running ones stay in force")
        }
    }
}

/// `old` with the live settings of `new`: what the process runs with after a reload.
pub fn effective(old: &Resolved, new: &Resolved) -> Resolved {
    let mut eff = old.clone();
    // Keys used as written: each section takes its live keys.
    eff.link.take_live(&new.link);
    eff.limits.take_live(&new.limits);
    eff.log.take_live(&new.log);
    let (e, n) = (&mut eff.as_written, &new.as_written);
    if let (Some(e), Some(n)) = (&mut e.upstream, &n.upstream) {
        e.take_live(n);
    }
    if let (Some(e), Some(n)) = (&mut e.downstream, &n.downstream) {
        e.take_live(n);
    }
    if let (Some(e), Some(n)) = (&mut e.metrics, &n.metrics) {
        e.take_live(n);
    }
    // What live keys resolve into (secrets read, verifiers parsed).
    if let (Some(e), Some(n)) = (&mut eff.upstream, &new.upstream) {
        // upstream.primary and upstream.primary_password
        e.primary = n.primary.clone();
        e.slot = n.slot.clone();
    }
    if let (Some(e), Some(n)) = (&mut eff.downstream, &new.downstream) {
        e.auth = n.auth;
        e.users = n.users.clone();
        e.allow_slot_commands = n.allow_slot_commands;
        e.allow_sql = n.allow_sql;
    }
    eff
}

/// Live keys whose value differs between `old` and `new`.
pub fn live_keys(old: &Resolved, new: &Resolved) -> Vec<&'static str> {
    let changed = [
        old.log.changed(&new.log),
        old.limits.changed(&new.limits),
        old.link.changed(&new.link),
    ];
    let mut keys = of_class(changed.iter().flatten(), Reload::Live);
    // Keys that resolve into other values are compared resolved: a secret read from a file
    // or the environment may change while the key does not.
    if let (Some(a), Some(b)) = (&old.upstream, &new.upstream) {
        if a.primary != b.primary {
            keys.push("upstream.primary");
        }
        if a.slot != b.slot {
            keys.push("upstream.slot");
        }
    }
    if let (Some(a), Some(b)) = (&old.downstream, &new.downstream) {
        if a.auth != b.auth {
            keys.push("downstream.auth");
        }
        if a.users != b.users {
            keys.push("downstream.users");
        }
        if a.allow_slot_commands != b.allow_slot_commands {
            keys.push("downstream.allow_slot_commands");
        }
        if a.allow_sql != b.allow_sql {
            keys.push("downstream.allow_sql");
        }
    }
    keys
}

/// Keys that differ between `old` and `new` but can change only with a restart (as declared
/// in [`crate::config`]), and a half added or removed.
pub fn restart_keys(old: &Resolved, new: &Resolved) -> Vec<&'static str> {
    let mut keys = Vec::new();
    if old.upstream.is_some() != new.upstream.is_some() {
        keys.push("upstream");
    }
    if old.downstream.is_some() != new.downstream.is_some() {
        keys.push("downstream");
    }
    let (a, b) = (&old.as_written, &new.as_written);
    let mut changed = Vec::new();
    if let (Some(x), Some(y)) = (&a.upstream, &b.upstream) {
        changed.extend(x.changed(y));
    }
    if let (Some(x), Some(y)) = (&a.downstream, &b.downstream) {
        changed.extend(x.changed(y));
    }
    changed.extend(old.link.changed(&new.link));
    changed.extend(old.limits.changed(&new.limits));
    changed.extend(old.log.changed(&new.log));
    match (&a.metrics, &b.metrics) {
        (Some(x), Some(y)) => changed.extend(x.changed(y)),
        (None, None) => {}
        // [metrics] added or removed: its keys changed.
        _ => changed.extend_from_slice(MetricsConfig::KEYS),
    }
    keys.extend(of_class(&changed, Reload::Restart));
    keys
}

fn of_class<'a>(keys: impl IntoIterator<Item = &'a Key>, class: Reload) -> Vec<&'static str> {
    keys.into_iter()
        .filter(|k| k.reload == class)
        .map(|k| k.name)
        .collect()
}

#[cfg(test)]
mod tests;
