//! deploy/systemd: the units pass `systemd-analyze verify` with the real binary, are
//! hardened, do not restart a bad configuration, leave a stop its whole time, and hand over
//! the credentials their example config reads; and the real binary confined as they confine
//! it, where that can be reproduced without systemd: `ProcSubset=pid` and
//! `ProtectProc=invisible` (a /proc of process directories only, in a private mount
//! namespace). That part needs root (and `unshare`, a kernel with procfs `subset=pid`, 5.8+);
//! without them the test fails, saying so (a skip would pass without checking anything).
#![deny(clippy::undocumented_unsafe_blocks)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use walrelay_harness::cluster::{free_port, wait_until};
use walrelay_harness::prom::scrape;

mod common;
use common::deploy::{deploy, files, longest_stop_secs};

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
    files(&deploy().join("systemd"), "service")
        .into_iter()
        .map(|p| {
            let t = std::fs::read_to_string(&p).unwrap();
            (p, t)
        })
        .collect()
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
    // Not skipped when it cannot run: a skipped test would pass without checking anything.
    assert!(
        can_confine(),
        "mounting a procfs with {PROC_OPTIONS} in a private mount namespace failed: this test \
         needs root (the suite's scripts/test.sh runs as root), util-linux's unshare and Linux 5.8+"
    );
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

#[test]
fn systemd_units_verify_and_are_hardened() {
    let units = files(&deploy().join("systemd"), "service");
    assert_eq!(units.len(), 2, "{units:?}");
    let dir = tempfile::tempdir().unwrap();
    for u in units {
        let text = std::fs::read_to_string(&u).unwrap();
        let name = u.file_name().unwrap().to_string_lossy().into_owned();
        let half = name
            .trim_start_matches("walrelay-")
            .trim_end_matches(".service");
        for want in [
            "ProtectSystem=strict",
            "NoNewPrivileges=yes",
            "PrivateTmp=yes",
            "DynamicUser=yes",
            "CapabilityBoundingSet=\n",
            "RestrictAddressFamilies=",
            "SystemCallFilter=@system-service",
            "ExecReload=/bin/kill -HUP $MAINPID",
            "KillSignal=SIGTERM",
            "LoadCredential=",
            &format!("--config /etc/walrelay/{half}.toml"),
        ] {
            assert!(text.contains(want), "{name}: no {want:?}");
        }
        assert_a_bad_config_is_not_restarted(&name, &text);
        // The stop timeout leaves room above the example config's drain timeout.
        let stop: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("TimeoutStopSec="))
            .unwrap()
            .parse()
            .unwrap();
        let cfg: toml::Table = toml::from_str(
            &std::fs::read_to_string(deploy().join(format!("{half}.toml"))).unwrap(),
        )
        .unwrap();
        let drain = cfg["limits"]["drain_timeout_secs"].as_integer().unwrap() as u64;
        assert!(
            stop > longest_stop_secs(drain),
            "{name}: TimeoutStopSec {stop} <= {} s, the longest a stop takes with drain_timeout_secs {drain}",
            longest_stop_secs(drain)
        );
        // Every credential the unit loads is a file the config reads from the credentials dir.
        let cfg_text = std::fs::read_to_string(deploy().join(format!("{half}.toml"))).unwrap();
        for cred in text
            .lines()
            .filter_map(|l| l.strip_prefix("LoadCredential="))
        {
            let id = cred.split(':').next().unwrap();
            let path = format!("/run/credentials/{name}/{id}");
            assert!(
                cfg_text.contains(&path),
                "{name}: {half}.toml does not use {path}"
            );
        }
        assert_the_spool_is_writable(&name, &text, &cfg);
        // systemd's own check, with the real binary where the unit expects it.
        let copy = dir.path().join(&name);
        std::fs::write(
            &copy,
            text.replace("/usr/local/bin/walrelay", env!("CARGO_BIN_EXE_walrelay")),
        )
        .unwrap();
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&copy)
            .output()
            .expect("systemd-analyze (scripts/install-deps.sh installs it)");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && err.trim().is_empty(),
            "{name}: systemd-analyze verify: {err}"
        );
    }
}

/// `run` exits 64 on a bad configuration, and the unit must not restart it for that.
/// `RestartPreventExitStatus=` looks only at the main process's status: a walrelay run as
/// `ExecStartPre=` (check-config) that exits 64 fails the start, and `Restart=on-failure`
/// tried it again every `RestartSec=` until the start limit.
fn assert_a_bad_config_is_not_restarted(name: &str, text: &str) {
    let values = |key: &str| -> Vec<&str> {
        text.lines()
            .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .collect()
    };
    let prevent: Vec<&str> = values("RestartPreventExitStatus")
        .iter()
        .flat_map(|v| v.split_whitespace())
        .collect();
    let exit = walrelay::config::EXIT_CONFIG.to_string();
    assert!(
        prevent.contains(&exit.as_str()),
        "{name}: RestartPreventExitStatus= lacks {exit}"
    );
    for key in ["ExecStartPre", "ExecStartPost", "ExecCondition"] {
        for v in values(key) {
            assert!(
                !v.contains("walrelay "),
                "{name}: {key}={v}: a walrelay that exits {exit} there is restarted \
                 (RestartPreventExitStatus= only looks at ExecStart=); `run` checks the config"
            );
        }
    }
}

/// Under `ProtectSystem=strict` everything but the unit's state directory (and any
/// `ReadWritePaths=`) is read-only: the example's `downstream.spool_dir` must lie in one of
/// them, else the downstream cannot create its spool and fails at start.
fn assert_the_spool_is_writable(name: &str, unit: &str, cfg: &toml::Table) {
    let Some(spool) = cfg
        .get("downstream")
        .and_then(|d| d.get("spool_dir"))
        .and_then(|d| d.as_str())
    else {
        return;
    };
    let values = |key: &str| -> Vec<String> {
        unit.lines()
            .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .flat_map(|v| v.split_whitespace().map(str::to_string))
            .collect()
    };
    let writable: Vec<String> = values("StateDirectory")
        .into_iter()
        .map(|d| format!("/var/lib/{d}"))
        .chain(values("ReadWritePaths"))
        .collect();
    assert!(
        writable
            .iter()
            .any(|w| Path::new(spool).starts_with(w.trim_start_matches('-'))),
        "{name}: downstream.spool_dir {spool} is in none of {writable:?}, read-only under \
         ProtectSystem=strict"
    );
}
