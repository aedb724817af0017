//! The real binary confined as the systemd units of deploy/systemd confine it, where that can
//! be reproduced without systemd: `ProcSubset=pid` and `ProtectProc=invisible` (a /proc of
//! process directories only, in a private mount namespace). Needs root (and `unshare`, a
//! kernel with procfs `subset=pid`, 5.8+); otherwise the test says so and passes.
#![deny(clippy::undocumented_unsafe_blocks)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use walrelay_harness::cluster::{free_port, wait_until};
use walrelay_harness::prom::scrape;

/// The mount options of the units' /proc (`ProcSubset=pid`, `ProtectProc=invisible`).
const PROC_OPTIONS: &str = "subset=pid,hidepid=invisible";

/// Runs `argv` with /proc mounted as the units mount it, in a mount namespace of its own.
fn confined(argv: &[&Path]) -> Command {
    let mut c = Command::new("unshare");
    c.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(format!(
            "mount -t proc -o {PROC_OPTIONS} proc /proc && exec \"$@\""
        ))
        .arg("sh")
        .args(argv);
    c
}

/// Whether this machine can confine a process that way: /proc/stat must be hidden inside.
fn can_confine() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return false;
    }
    confined(&[
        Path::new("sh"),
        Path::new("-c"),
        Path::new("test ! -e /proc/stat"),
    ])
    .stderr(Stdio::null())
    .status()
    .is_ok_and(|s| s.success())
}

/// Kills the child when dropped (the test failed half-way, say).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn units() -> Vec<(PathBuf, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd");
    let mut v: Vec<(PathBuf, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "service"))
        .map(|p| {
            let t = std::fs::read_to_string(&p).unwrap();
            (p, t)
        })
        .collect();
    v.sort();
    v
}

/// `process_start_time_seconds` came from /proc/stat's `btime`, which `ProcSubset=pid` hides:
/// under the shipped units the metric was missing (process_cpu_seconds_total and
/// process_resident_memory_bytes, from /proc/self, were there).
#[tokio::test]
async fn process_metrics_are_exported_under_the_units_proc_subset() {
    let units = units();
    assert_eq!(units.len(), 2);
    for (p, text) in &units {
        for want in ["ProcSubset=pid", "ProtectProc=invisible"] {
            assert!(
                text.lines().any(|l| l == want),
                "{}: no {want}: change this test with the unit",
                p.display()
            );
        }
    }
    if !can_confine() {
        eprintln!("skipped: mounting a procfs with {PROC_OPTIONS} needs root and Linux 5.8+");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let metrics = free_port();
    let config = dir.path().join("downstream.toml");
    std::fs::write(
        &config,
        format!(
            "[downstream]\nlisten = \"127.0.0.1:{}\"\nupstream = \"127.0.0.1:{}\"\n\
             auth = \"trust\"\nspool_dir = \"{}\"\n\n[link]\nplaintext = true\n\n\
             [metrics]\nlisten = \"127.0.0.1:{metrics}\"\n",
            free_port(),
            free_port(),
            dir.path().join("spool").display(),
        ),
    )
    .unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_walrelay"));
    let child = confined(&[bin, Path::new("run"), Path::new("--config"), &config])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("stderr")).unwrap())
        .spawn()
        .expect("unshare");
    let _child = Killed(child);
    wait_until("the metrics endpoint", Duration::from_secs(30), || async {
        Ok(scrape(metrics).await.is_ok())
    })
    .await
    .unwrap_or_else(|e| {
        let log = std::fs::read_to_string(dir.path().join("stderr")).unwrap_or_default();
        panic!("{e}: {log}")
    });
    let samples = scrape(metrics).await.unwrap();
    // (A process this young may not have used a clock tick of CPU yet.)
    for (name, least) in [
        ("process_cpu_seconds_total", 0.0),
        ("process_resident_memory_bytes", 1.0),
        ("process_start_time_seconds", 1.0),
    ] {
        let s = samples.iter().find(|s| s.name == name);
        assert!(
            s.is_some_and(|s| s.value >= least),
            "{name} is not exported with /proc mounted {PROC_OPTIONS}: {s:?}"
        );
    }
    let start = samples
        .iter()
        .find(|s| s.name == "process_start_time_seconds")
        .unwrap()
        .value;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        (now - 60.0..=now + 2.0).contains(&start),
        "process_start_time_seconds {start} is not within the last minute (now {now})"
    );
}
