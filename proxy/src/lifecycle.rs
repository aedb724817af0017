//! Signals of `walrelay run`: SIGHUP reloads the configuration file, SIGTERM and SIGINT drain
//! and stop.
//!
//! Reload: the file is read and checked as at start (`walrelay check-config`); if that fails
//! the error is logged and the running configuration stays. Otherwise these apply at once to
//! connections that arrive from then on (sessions in flight keep what they started with):
//!
//! | key | live |
//! |---|---|
//! | `log.level` (unless RUST_LOG is set) | yes |
//! | `limits.*` except `limits.max_message_bytes` | yes |
//! | `downstream.users`, `downstream.auth` | yes |
//! | `upstream.primary`, `upstream.primary_password`, `upstream.slot` | yes |
//! | `upstream.listen`, `downstream.listen`, `downstream.upstream`, `downstream.tls_*`, `link.*`, `limits.max_message_bytes`, `log.format`, `metrics.listen`, adding or removing a half | restart |
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

use crate::config::{Config, Limits, Resolved};
use crate::logging::LogHandle;
use crate::relay::Running;

/// The signal handlers of the process, installed before the listeners open so that a SIGHUP
/// that comes early is not fatal.
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
    pub async fn serve(&mut self, running: &mut Running, path: &Path, log: &LogHandle) -> bool {
        loop {
            tokio::select! {
                _ = self.hup.recv() => reload(running, path, log),
                _ = self.term.recv() => {
                    info!("SIGTERM: draining");
                    return true;
                }
                _ = self.int.recv() => {
                    info!("SIGINT: draining");
                    return true;
                }
                _ = running.shutdown.cancelled() => {
                    error!("a half stopped (see above): shutting down");
                    return false;
                }
            }
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

/// Time the runtime gets to drop what is left after the drain (tasks stuck on a socket are
/// dropped at once; this only bounds blocking threads).
pub const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(1);

/// Reloads `path` into `running`; logs what changed, what needs a restart, or why nothing did.
pub fn reload(running: &mut Running, path: &Path, log: &LogHandle) {
    let new = match Config::load(path) {
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
    let changed = live_keys(&old, &eff);
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

/// `old` with the live settings of `new`: what the process runs with after a reload.
pub fn effective(old: &Resolved, new: &Resolved) -> Resolved {
    let mut eff = old.clone();
    eff.limits = Limits {
        max_message_bytes: old.limits.max_message_bytes,
        ..new.limits.clone()
    };
    eff.log.level = new.log.level.clone();
    if let (Some(e), Some(n)) = (&mut eff.upstream, &new.upstream) {
        e.primary = n.primary.clone();
        e.slot = n.slot.clone();
    }
    if let (Some(e), Some(n)) = (&mut eff.downstream, &new.downstream) {
        e.auth = n.auth;
        e.users = n.users.clone();
    }
    eff
}

/// Live keys whose value differs between `old` and `new`.
pub fn live_keys(old: &Resolved, new: &Resolved) -> Vec<&'static str> {
    let mut keys = Vec::new();
    if old.log.level != new.log.level {
        keys.push("log.level");
    }
    let (a, b) = (&old.limits, &new.limits);
    for (k, x, y) in [
        (
            "limits.queue_messages",
            a.queue_messages as u64,
            b.queue_messages as u64,
        ),
        (
            "limits.max_sessions",
            a.max_sessions as u64,
            b.max_sessions as u64,
        ),
        (
            "limits.auth_timeout_secs",
            a.auth_timeout_secs,
            b.auth_timeout_secs,
        ),
        (
            "limits.drain_timeout_secs",
            a.drain_timeout_secs,
            b.drain_timeout_secs,
        ),
    ] {
        if x != y {
            keys.push(k);
        }
    }
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
    }
    keys
}

/// Keys that differ between `old` and `new` but can change only with a restart.
pub fn restart_keys(old: &Resolved, new: &Resolved) -> Vec<&'static str> {
    let mut keys = Vec::new();
    let mut check = |k: &'static str, differs: bool| {
        if differs {
            keys.push(k);
        }
    };
    check("upstream", old.upstream.is_some() != new.upstream.is_some());
    check(
        "downstream",
        old.downstream.is_some() != new.downstream.is_some(),
    );
    if let (Some(a), Some(b)) = (&old.upstream, &new.upstream) {
        check("upstream.listen", a.listen != b.listen);
    }
    if let (Some(a), Some(b)) = (&old.downstream, &new.downstream) {
        check("downstream.listen", a.listen != b.listen);
        check("downstream.upstream", a.upstream != b.upstream);
        check(
            "downstream.tls_cert",
            a.tls.as_ref().map(|t| &t.0) != b.tls.as_ref().map(|t| &t.0),
        );
        check(
            "downstream.tls_key",
            a.tls.as_ref().map(|t| &t.1) != b.tls.as_ref().map(|t| &t.1),
        );
    }
    let (a, b) = (&old.link, &new.link);
    check("link.tls_cert", a.tls_cert != b.tls_cert);
    check("link.tls_key", a.tls_key != b.tls_key);
    check("link.tls_ca", a.tls_ca != b.tls_ca);
    check(
        "link.tls_server_name",
        a.tls_server_name != b.tls_server_name,
    );
    check("link.plaintext", a.plaintext != b.plaintext);
    check("link.codec", a.codec != b.codec);
    check("link.zstd_level", a.zstd_level != b.zstd_level);
    check(
        "link.zstd_window_log",
        a.zstd_window_log != b.zstd_window_log,
    );
    check(
        "link.block_cache_bytes",
        a.block_cache_bytes != b.block_cache_bytes,
    );
    check("link.keepalive_secs", a.keepalive_secs != b.keepalive_secs);
    check(
        "link.connect_timeout_secs",
        a.connect_timeout_secs != b.connect_timeout_secs,
    );
    check(
        "link.batch_window_ms",
        a.batch_window_ms != b.batch_window_ms,
    );
    check(
        "limits.max_message_bytes",
        old.limits.max_message_bytes != new.limits.max_message_bytes,
    );
    check("log.format", old.log.format != new.log.format);
    check("metrics.listen", old.metrics != new.metrics);
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn resolve(toml: &str) -> Resolved {
        Config::from_toml(toml, &PathBuf::from("t.toml"))
            .unwrap()
            .resolve()
            .unwrap()
    }

    fn both(users: &str, extra: &str) -> Resolved {
        resolve(&format!(
            "[upstream]\nprimary = \"host=h user=u\"\nlisten = \"127.0.0.1:7433\"\n\
             [downstream]\nlisten = \"127.0.0.1:5433\"\nupstream = \"h:7433\"\nusers = {{ {users} }}\n\
             [link]\nplaintext = true\n{extra}"
        ))
    }

    #[test]
    fn restart_keys_name_each_changed_setting() {
        let v = walrelay_pgwire::scram::new_verifier("a");
        let old = both(&format!("r = \"{v}\""), "");
        assert!(restart_keys(&old, &old).is_empty());
        let new = resolve(
            &format!(
                "[upstream]\nprimary = \"host=h user=u\"\nlisten = \"127.0.0.1:7434\"\n\
                 [downstream]\nlisten = \"127.0.0.1:5433\"\nupstream = \"h2:7433\"\nusers = {{ r = \"{v}\" }}\n\
                 [link]\nplaintext = true\ncodec = \"zstd\"\n[limits]\nmax_message_bytes = 300000\nmax_sessions = 3\n\
                 [log]\nformat = \"json\"\nlevel = \"debug\"\n"
            ),
        );
        assert_eq!(
            restart_keys(&old, &new),
            [
                "upstream.listen",
                "downstream.upstream",
                "link.codec",
                "limits.max_message_bytes",
                "log.format"
            ]
        );
        // The live part of the same change, as the process would run it.
        let eff = effective(&old, &new);
        assert_eq!(live_keys(&old, &eff), ["log.level", "limits.max_sessions"]);
        assert_eq!(eff.limits.max_message_bytes, old.limits.max_message_bytes);
        assert_eq!(eff.log.format, "text");
        assert_eq!(eff.downstream.as_ref().unwrap().upstream, "h:7433");
    }

    #[test]
    fn users_and_primary_are_live() {
        let old = both(
            &format!("r = \"{}\"", walrelay_pgwire::scram::new_verifier("a")),
            "",
        );
        let new = resolve(&format!(
            "[upstream]\nprimary = \"host=h user=u password=p2\"\nlisten = \"127.0.0.1:7433\"\nslot = \"s\"\n\
             [downstream]\nlisten = \"127.0.0.1:5433\"\nupstream = \"h:7433\"\nusers = {{ r = \"{}\", s = \"{}\" }}\n\
             [link]\nplaintext = true\n",
            walrelay_pgwire::scram::new_verifier("b"),
            walrelay_pgwire::scram::new_verifier("c")
        ));
        assert!(restart_keys(&old, &new).is_empty());
        let eff = effective(&old, &new);
        assert_eq!(
            live_keys(&old, &eff),
            ["upstream.primary", "upstream.slot", "downstream.users"]
        );
        assert_eq!(eff.downstream.unwrap().users.len(), 2);
    }
}
