//! The `walrelay` command line with the real binary: what it does when its output cannot be
//! written; what `check-config` checks of the spool directory.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::Relay;
use walrelay_harness::cluster::free_port;

/// The write end of a pipe whose read end is closed already: a write to it fails with EPIPE
/// (the binary ignores SIGPIPE, as every Rust program does), as when `head` has exited.
fn closed_pipe() -> Stdio {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) writes two descriptors into the array of two it is given.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened by pipe2 and nothing else owns them.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    Stdio::from(write)
}

fn walrelay(args: &[&str], stdout: Stdio, stderr: Stdio, stdin: &[u8]) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// Runs `args` with standard output a pipe nobody reads any more: no panic, no message, and
/// the status the command has when its output is read.
fn assert_quiet_with_closed_stdout(args: &[&str], stdin: &[u8]) {
    let out = walrelay(args, closed_pipe(), Stdio::piped(), stdin);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
    assert!(err.is_empty(), "{args:?} said something: {err}");
}

fn upstream_toml(dir: &Path) -> (std::path::PathBuf, u16, u16) {
    let (up, metrics) = (free_port(), free_port());
    let toml = format!(
        "[upstream]\nprimary = \"host=127.0.0.1 port=1 user=u\"\nlisten = \"127.0.0.1:{up}\"\n\
         [link]\nplaintext = true\n[metrics]\nlisten = \"127.0.0.1:{metrics}\"\n"
    );
    let path = dir.join("up.toml");
    std::fs::write(&path, toml).unwrap();
    (path, up, metrics)
}

/// `walrelay check-config … | head -0`, `walrelay status | head -0` and the like: every
/// subcommand that prints exits as it would have (0 here) without a word, where `println!`
/// panicked (exit 101, "failed printing to stdout: Broken pipe"). The demo stops at its first
/// line, before it starts anything.
#[test]
fn a_reader_that_left_is_no_error() {
    let dir = tempfile::tempdir().unwrap();
    let (config, up, metrics) = upstream_toml(dir.path());
    let config = config.to_str().unwrap();
    assert_quiet_with_closed_stdout(&["check-config", "--config", config], b"");
    assert_quiet_with_closed_stdout(&["scram-verifier"], b"secret\n");
    assert_quiet_with_closed_stdout(&["--help"], b"");
    assert_quiet_with_closed_stdout(&["demo", "--seconds", "1"], b"");
    let toml = std::fs::read_to_string(config).unwrap();
    let _relay = Relay::start(dir.path(), "status", &toml, None, Some(up));
    let url = format!("http://127.0.0.1:{metrics}");
    assert_quiet_with_closed_stdout(&["status", "--url", &url], b"");
}

/// Output lost otherwise is an error: said, exit 1. And a command whose standard error is a
/// closed pipe still exits with its own status (64 for a bad file), not a panic's 101.
#[test]
fn lost_output_is_an_error_and_a_closed_stderr_no_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (config, _, _) = upstream_toml(dir.path());
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let args = ["check-config", "--config", config.to_str().unwrap()];
    let out = walrelay(&args, Stdio::from(full), Stdio::piped(), b"");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot write to standard output: No space left on device"),
        "{err}"
    );

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[upstream]\nlisten = 5\n").unwrap();
    let args = ["check-config", "--config", bad.to_str().unwrap()];
    let out = walrelay(&args, Stdio::piped(), closed_pipe(), b"");
    assert_eq!(out.status.code(), Some(64));
    let out = walrelay(&["no-such-command"], Stdio::piped(), closed_pipe(), b"");
    assert_eq!(out.status.code(), Some(64));
}

/// `walrelay run --config config`, stopped if it still runs after 30 s: whether it
/// succeeded, and its standard error.
fn run_briefly(config: &str) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args(["run", "--config", config])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A downstream config with `spool_dir`, written to `dir`.
fn downstream_toml(dir: &Path, spool_dir: &Path) -> std::path::PathBuf {
    let verifier = walrelay_pgwire::scram::new_verifier("secret");
    let toml = format!(
        "[downstream]\nlisten = \"127.0.0.1:{}\"\nupstream = \"127.0.0.1:1\"\n\
         users = {{ r = {verifier:?} }}\nspool_dir = {:?}\n[link]\nplaintext = true\n",
        free_port(),
        spool_dir.to_str().unwrap()
    );
    let path = dir.join("down.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// `check-config` refuses a `downstream.spool_dir` that `run` cannot open (exit 64, naming
/// the key and the cause), and passes one that `run` creates without creating it.
#[test]
fn check_config_refuses_a_spool_dir_run_cannot_open() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let file = d.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let garbage = d.join("garbage-state");
    std::fs::create_dir(&garbage).unwrap();
    std::fs::write(garbage.join("spool.state"), b"not a state\n").unwrap();
    let mut bad = vec![
        (file.clone(), "is not a directory"),
        (file.join("spool"), "has a file as one of its parents"),
        (garbage, "unreadable state"),
    ];
    // Permissions bind everyone but root.
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        use std::os::unix::fs::PermissionsExt;
        let ro = d.join("read-only");
        std::fs::create_dir(&ro).unwrap();
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
        bad.push((ro.clone(), "cannot list, read and write in it"));
        bad.push((ro.join("spool"), "cannot create it in"));
    }
    for (spool_dir, why) in &bad {
        let config = downstream_toml(d, spool_dir);
        let config = config.to_str().unwrap();
        let out = walrelay(
            &["check-config", "--config", config],
            Stdio::piped(),
            Stdio::piped(),
            b"",
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{spool_dir:?}: {err}");
        assert!(err.contains("`downstream.spool_dir`"), "{err}");
        assert!(err.contains(why), "{spool_dir:?}: {err}");
        // What check-config refuses, run refuses, with the same cause.
        let (ok, err) = run_briefly(config);
        assert!(!ok, "run took {spool_dir:?}");
        assert!(err.contains(why), "run with {spool_dir:?}: {err}");
    }
    // A spool directory to be created (as run does) passes, and is not created.
    let new = d.join("new/spool");
    let config = downstream_toml(d, &new);
    let out = walrelay(
        &["check-config", "--config", config.to_str().unwrap()],
        Stdio::piped(),
        Stdio::piped(),
        b"",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        !d.join("new").exists(),
        "check-config created the spool's directory"
    );
}

/// `walrelay bench --pg 13` says that 13 is not supported and which majors are (those of
/// `PgMajor::ALL`), before it starts anything, where it said "PostgreSQL 13 is not
/// installed: run scripts/install-pg-majors.sh", which installs no 13.
#[test]
fn bench_names_the_supported_majors_for_another() {
    let all: Vec<String> = walrelay_wal::pg::PgMajor::ALL
        .iter()
        .map(|m| m.number().to_string())
        .collect();
    for (pg, bad) in [("13", "13"), ("15,13", "13"), ("99", "99")] {
        let out = walrelay(
            &["bench", "--pg", pg, "--workload", "updates"],
            Stdio::piped(),
            Stdio::piped(),
            b"",
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "--pg {pg}: {err}");
        assert!(
            err.contains(&format!(
                "--pg {bad}: PostgreSQL {bad} is not supported: the bench runs PostgreSQL {}",
                all.join(", ")
            )),
            "--pg {pg}: {err}"
        );
        assert!(!err.contains("not installed"), "--pg {pg}: {err}");
        assert!(!err.contains("bench: updates"), "--pg {pg} started: {err}");
    }
    // Without --pg, the install found (here PG_BIN's) must be one of them too.
    // Written by a shell of its own: a script this multi-threaded test process had open for
    // writing could be inherited by a concurrent test's fork, and its exec fail (ETXTBSY).
    let dir = tempfile::tempdir().unwrap();
    let made = Command::new("sh")
        .current_dir(dir.path())
        .args([
            "-c",
            "printf '#!/bin/sh\\necho \"postgres (PostgreSQL) 13.4\"\\n' > postgres && \
             chmod 755 postgres && : > initdb",
        ])
        .status()
        .unwrap();
    assert!(made.success());
    let out = Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args(["bench", "--workload", "updates"])
        .env("PG_BIN", dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("PostgreSQL 13 is not supported: the bench runs PostgreSQL"),
        "{err}"
    );
    assert!(err.contains("point PG_BIN at another"), "{err}");
}
