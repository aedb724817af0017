//! What the tests of deploy/ share (`tests/deploy.rs`, `tests/deploy_systemd.rs`).

use std::path::{Path, PathBuf};

/// The deploy/ directory of the workspace.
pub fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// The files of `dir` whose name ends in `.ext`, sorted.
pub fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    v.sort();
    v
}

/// The longest SIGTERM to exit takes (README, Signals): the drain, 1 s more for a stuck peer
/// (`Running::shutdown`), the spool's last sync, the runtime's shutdown. A service manager
/// that kills the process sooner loses the last sync: a restart then fetches that WAL again.
pub fn longest_stop_secs(drain: u64) -> u64 {
    let after = walrelay::spooler::SHUTDOWN_SYNC_MAX + walrelay::lifecycle::RUNTIME_SHUTDOWN;
    drain + 1 + after.as_secs_f64().ceil() as u64
}
