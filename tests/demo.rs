//! `walrelay demo`, the README's first command, end to end with a short load: the real binary
//! (both halves in one process, mutual TLS on the link), a real primary and standby. Checks
//! what it prints (bytes counted, no integrity failure, the offline `zstd -3` and `ssh -C`
//! of the same WAL) and that it leaves nothing behind, never a timing.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

/// The line of `out` that starts (after spaces) with `label`.
fn line_of<'a>(out: &'a str, label: &str) -> &'a str {
    out.lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no line {label:?} in:\n{out}"))
}

/// The first number after `label` in `text`.
fn number_after(text: &str, label: &str) -> f64 {
    let at = text
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in {text:?}"));
    text[at + label.len()..]
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .find(|t| !t.is_empty())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no number after {label:?} in {text:?}"))
}

/// The first number on the line of `out` that starts with `label`.
fn value_after(out: &str, label: &str) -> f64 {
    number_after(line_of(out, label), label)
}

#[test]
fn the_demo_counts_the_link_against_zstd_and_ssh_and_cleans_up() {
    let tmp = tempfile::tempdir().unwrap();
    // The clusters run as the postgres user when the tests run as root: it must reach them.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args(["demo", "--seconds", "5"])
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed:\n{stderr}\n{stdout}");

    let wal = value_after(&stdout, "WAL from the primary");
    let link = value_after(&stdout, "on the link");
    assert!(wal > 1.0, "{wal} MB of WAL from 5 s of pgbench:\n{stdout}");
    assert!(
        link > 0.0 && link < wal,
        "link {link} MB for {wal} MB of WAL"
    );
    assert_eq!(value_after(&stdout, "integrity failures"), 0.0, "{stdout}");

    // The offline baselines compress the WAL the load wrote, copied from the primary: about
    // what the relay received (the LSNs are read a moment apart from its counter).
    let copied = value_after(&stdout, "the same WAL offline (");
    assert!(
        (copied - wal).abs() <= 2.0 + wal * 0.05,
        "copied {copied} MB, the relay received {wal} MB:\n{stdout}"
    );
    for label in ["zstd -3", "ssh -C"] {
        let bytes = value_after(&stdout, label);
        assert!(
            bytes > 0.0 && bytes < copied,
            "{label}: {bytes} MB of {copied}"
        );
        let vs = number_after(line_of(&stdout, label), "the link carried");
        assert!(
            (vs - link / bytes).abs() <= 0.01 + 0.02 * vs,
            "{label}: printed {vs} x, {link} / {bytes} MB"
        );
        // pgbench's WAL: its tuples as deltas, its headers without what can be derived, well
        // under what a generic stream of the same bytes sends (0.57 x in a run of this).
        assert!(
            vs < 1.0,
            "the link carried {vs} x {label}'s bytes:\n{stdout}"
        );
    }

    assert!(stdout.contains("cleaned up"), "{stdout}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
