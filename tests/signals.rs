//! Signals that come while `walrelay run` reads its configuration, with the real binary: a
//! SIGHUP during start-up is a reload, not the end of the process; a SIGTERM during a read
//! that hangs, at start or in a reload, still ends it. A FIFO as the primary's password file
//! stands for a file whose read waits (a secret on a network mount that stopped answering).
#![deny(clippy::undocumented_unsafe_blocks)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The longest any step is waited for.
const TIMEOUT: Duration = Duration::from_secs(120);
/// `limits.drain_timeout_secs` (the default) and the margin allowed on top.
const GRACE: Duration = Duration::from_secs(10);
const MARGIN: Duration = Duration::from_secs(10);

/// A SIGHUP while `walrelay run` still reads its configuration (`systemctl reload` right
/// after `systemctl start`; a FIFO as the password file holds that moment open) does not end
/// the process: it starts, reloads, and drains on SIGTERM.
#[test]
fn a_sighup_while_the_configuration_is_read_is_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, fifo, log) = run_with_a_fifo_password(dir.path());
    let mut w = fifo_writer(&fifo, &mut child, &log);
    // SAFETY: kill(2) takes plain integers; no memory is involved.
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    std::io::Write::write_all(&mut w, b"pw\n").unwrap();
    drop(w);
    // Started: that read is over (a writer opened before it closed would feed it).
    wait_child_log(&mut child, &log, "upstream half serving the link");
    // Read again by the reload the SIGHUP asked for.
    std::io::Write::write_all(&mut fifo_writer(&fifo, &mut child, &log), b"pw\n").unwrap();
    wait_child_log(&mut child, &log, "configuration reloaded");
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}\n{}", read_log(&log));
}

/// SIGTERM while a reload still reads the configuration (a file it names hangs; here a FIFO
/// nobody writes to) drains and exits 0 as at any other time: the reload is abandoned.
#[test]
fn sigterm_while_a_reload_hangs_still_drains() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, fifo, log) = run_with_a_fifo_password(dir.path());
    std::io::Write::write_all(&mut fifo_writer(&fifo, &mut child, &log), b"pw\n").unwrap();
    wait_child_log(&mut child, &log, "upstream half serving the link");
    // SAFETY: kill(2) takes plain integers; no memory is involved.
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    // The reload now waits for a writer of the FIFO, which never comes.
    std::thread::sleep(Duration::from_secs(1));
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    wait_child_log(&mut child, &log, "SIGTERM: draining");
    let status = wait_exit(&mut child, &log, GRACE + MARGIN);
    assert!(status.success(), "{status:?}\n{}", read_log(&log));
    assert!(
        read_log(&log).contains("is abandoned"),
        "{}",
        read_log(&log)
    );
}

/// SIGTERM while `run` still reads its configuration at start (the read hangs) ends the
/// process at once, with status 0, as the signal's default action did before the handlers
/// were installed that early.
#[test]
fn sigterm_while_the_configuration_is_read_at_start_ends_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, fifo, log) = run_with_a_fifo_password(dir.path());
    // Opened and never written to: the read waits.
    let _writer = fifo_writer(&fifo, &mut child, &log);
    // SAFETY: kill(2) takes plain integers; no memory is involved.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = wait_exit(&mut child, &log, MARGIN);
    assert!(status.success(), "{status:?}\n{}", read_log(&log));
    assert!(
        read_log(&log).contains("SIGTERM while reading"),
        "{}",
        read_log(&log)
    );
}

/// `child`'s exit status, within `within` (else it is killed and the test fails).
fn wait_exit(
    child: &mut std::process::Child,
    log: &Path,
    within: Duration,
) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("no exit within {within:?}:\n{}", read_log(log));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `walrelay run` (its log in `<dir>/log`) of an upstream half whose primary's password file
/// `<dir>/password` is a FIFO: reading it waits for a writer, as a file on a mount that hangs.
fn run_with_a_fifo_password(dir: &Path) -> (std::process::Child, PathBuf, PathBuf) {
    let fifo = dir.join("password");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) reads the NUL-terminated path, which outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let toml = format!(
        "[upstream]\nprimary = \"host=127.0.0.1 port=1 user=u\"\n\
         primary_password = {{ file = \"{}\" }}\nlisten = \"127.0.0.1:{}\"\n\
         [link]\nplaintext = true\n",
        fifo.display(),
        walrelay_harness::cluster::free_port()
    );
    let (config, log) = (dir.join("up.toml"), dir.join("log"));
    std::fs::write(&config, toml).unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args(["run", "--config"])
        .arg(&config)
        .env_remove("RUST_LOG")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    (child, fifo, log)
}

fn read_log(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// Waits until `log` has a line with `needle`; panics if `child` ends first or after TIMEOUT.
fn wait_child_log(child: &mut std::process::Child, log: &Path, needle: &str) {
    let deadline = Instant::now() + TIMEOUT;
    while !read_log(log).contains(needle) {
        if let Some(s) = child.try_wait().unwrap() {
            panic!("walrelay ended ({s}):\n{}", read_log(log));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("no {needle:?} in the log:\n{}", read_log(log));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The FIFO `path` opened for writing once `child` holds it open for reading (a writer
/// cannot open it before); panics if `child` ends first or after TIMEOUT.
fn fifo_writer(path: &Path, child: &mut std::process::Child, log: &Path) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let mut o = std::fs::OpenOptions::new();
        if let Ok(w) = o.write(true).custom_flags(libc::O_NONBLOCK).open(path) {
            return w;
        }
        if let Some(s) = child.try_wait().unwrap() {
            panic!("walrelay ended ({s}):\n{}", read_log(log));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("walrelay never read {}:\n{}", path.display(), read_log(log));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
