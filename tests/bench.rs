//! `walrelay bench` end to end, cheaply: the `updates` workload with windows of a few seconds.
//! Both relay pairs run as processes of the real binary; the bench itself fails on WAL or
//! tables that differ. Checks that the report is sane (WAL and link bytes counted, both
//! standbys compared, the JSON parses), never a timing.

use std::process::Command;

use serde_json::Value;
use walrelay_harness::bench::services::{cpu_group_of, group_name, Hierarchy, Share};
use walrelay_harness::relayproc::{autogroup_nice_of, nice_of};

fn num(v: &Value, path: &[&str]) -> f64 {
    let mut x = v;
    for p in path {
        x = &x[*p];
    }
    x.as_f64()
        .unwrap_or_else(|| panic!("{} is not a number in the report: {x}", path.join(".")))
}

/// `walrelay bench` of the `updates` workload with a cold window of `cold_secs` and a few
/// seconds after it, without the sync-latency runs.
fn tiny_bench(cold_secs: &str) -> Command {
    tiny_bench_of("updates", cold_secs)
}

/// [`tiny_bench`] of `workloads` ("updates,updates").
fn tiny_bench_of(workloads: &str, cold_secs: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_walrelay"));
    cmd.args(["bench", "--workload", workloads, "--cold-secs", cold_secs])
        .args([
            "--warmup-secs",
            "1",
            "--steady-secs",
            "3",
            "--sync-secs",
            "0",
        ]);
    cmd
}

#[test]
fn bench_reports_a_sane_run_of_one_tiny_workload() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    // Not there yet: the bench makes it.
    let timeline = dir.path().join("out").join("timeline");
    let stdout = run_tiny_bench(&timeline, &json);

    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let r = the_only_run(&report);
    // Nothing left out, no stop.
    assert_eq!(report["not_run"], serde_json::json!([]), "{report}");
    assert!(report["stopped"].is_null(), "{report}");
    // The command that made the figures is with them, in the JSON and above the tables.
    let command = report["command"].as_str().unwrap_or_default();
    assert!(
        command.contains(" bench --workload updates --cold-secs 3 "),
        "{report}"
    );
    assert!(
        stdout.contains(&format!("Command: `{command}`")),
        "{stdout}"
    );
    assert_wal_and_link_bytes_counted(r);
    assert_staged_counters_read(r);
    assert_waiting_for_a_core_read(r, &stdout);
    assert_codec_counters_read(r, &stdout);
    assert_windows_verified(r);
    assert_warm_replay_times_the_steady_window(r, &stdout);
    assert_every_stage_sampled(r, &stdout);
    assert_timeline_written(&timeline, r);
    assert_direct_apply_measured(r, &stdout);
}

/// Runs the tiny bench with a timeline and a JSON report, checks that it succeeded, and
/// returns its standard output.
fn run_tiny_bench(timeline: &std::path::Path, json: &std::path::Path) -> String {
    let out = tiny_bench("3")
        .arg("--timeline-dir")
        .arg(timeline)
        .arg("--json")
        .arg(json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "walrelay bench failed:\n{stderr}\n{stdout}"
    );
    assert!(stdout.contains("| updates |"), "{stdout}");
    // Progress: each step that takes long on a large window says so before it starts.
    for step in [
        "offline zstd -3",
        "one-core replays of the cold window",
        "one-core replays of the steady window",
    ] {
        assert!(
            stderr.contains(&format!("bench: updates: {step}")),
            "{stderr}"
        );
    }
    stdout.into_owned()
}

/// Checks that the report holds one run, of the `updates` workload, and returns it.
fn the_only_run(report: &Value) -> &Value {
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    let r = &runs[0];
    assert_eq!(r["workload"], "updates");
    r
}

/// Checks that each window counted WAL and its zstd size, and each pair link bytes, feedback
/// and messages.
fn assert_wal_and_link_bytes_counted(r: &Value) {
    // The debug binary may fall behind the load, so a pair may be charged its bytes in one
    // window rather than the other (the report marks such figures): counts are checked over
    // both windows together.
    let both = |path: &[&str]| {
        ["cold", "steady"]
            .iter()
            .map(|w| num(&r[*w], path))
            .sum::<f64>()
    };
    for w in ["cold", "steady"] {
        assert!(num(r, &[w, "wal_bytes"]) > 0.0, "{w}: no WAL");
        assert!(num(r, &[w, "zstd3_bytes"]) > 0.0, "{w}: no zstd -3 size");
        // What ssh -C would send: compressed (the load's rows repeat), not nothing.
        let (ssh, wal) = (num(r, &[w, "ssh_c_bytes"]), num(r, &[w, "wal_bytes"]));
        assert!(ssh > 0.0 && ssh < wal, "{w}: ssh -C {ssh} bytes of {wal}");
        let vs = num(r, &[w, "w", "vs_ssh_c"]);
        let expect = num(r, &[w, "w", "link_bytes"]) / ssh;
        assert!(
            (vs - expect).abs() < 1e-9,
            "{w}: W / ssh -C {vs}, not {expect}"
        );
    }
    for pair in ["w", "z"] {
        assert!(
            both(&[pair, "link_bytes"]) > 0.0,
            "{pair}: nothing on the link"
        );
        assert!(
            both(&[pair, "raw", "toward_primary"]) > 0.0,
            "{pair}: no feedback on the link"
        );
    }
    assert!(
        both(&["w", "raw", "messages"]) > 0.0,
        "no link message counted"
    );
}

/// Checks that W's staged-ahead counters were read and Z's were not.
fn assert_staged_counters_read(r: &Value) {
    // W's staged-ahead counters are read from its /metrics (a tiny load seldom falls behind,
    // so only that they were read); Z is not scraped.
    for half in ["upstream_staged", "downstream_staged"] {
        let w = &r["steady"]["w"][half];
        assert!(w.as_f64().is_some_and(|n| n >= 0.0), "W {half}: {w}");
        assert!(r["steady"]["z"][half].is_null(), "Z {half} was not scraped");
    }
}

/// Checks the waiting-for-a-core figures and the kernel's share of the CPU per half, the
/// CPU pressure, where the kernel keeps them, and their table.
fn assert_waiting_for_a_core_read(r: &Value, stdout: &str) {
    // Waiting for a core is read per half from each process's threads and for the machine
    // from its CPU pressure, where the kernel keeps them (this one's do, when the files exist).
    let schedstat = std::path::Path::new("/proc/self/schedstat").exists();
    let psi = std::path::Path::new("/proc/pressure/cpu").exists();
    for w in ["cold", "steady"] {
        for pair in ["w", "z"] {
            for half in ["upstream_waiting_cores", "downstream_waiting_cores"] {
                let v = &r[w][pair][half];
                match schedstat {
                    true => assert!(
                        v.as_f64().is_some_and(|x| x >= 0.0),
                        "{w} {pair} {half}: {v}"
                    ),
                    false => assert!(v.is_null(), "{w} {pair} {half}: {v}"),
                }
            }
            // Every half ran in both windows, so its CPU time has a kernel share, 0 to 1.
            for half in ["upstream_kernel_share", "downstream_kernel_share"] {
                let v = &r[w][pair][half];
                assert!(
                    v.as_f64().is_some_and(|x| (0.0..=1.0).contains(&x)),
                    "{w} {pair} {half}: {v}"
                );
            }
        }
        let p = &r[w]["cpu_pressure"];
        match psi {
            // A share of the window (sampling may stretch it a little past 1).
            true => assert!(
                p.as_f64().is_some_and(|x| (0.0..1.5).contains(&x)),
                "{w}: {p}"
            ),
            false => assert!(p.is_null(), "{w}: {p}"),
        }
    }
    assert!(stdout.contains("Waiting for a core"), "{stdout}");
    assert!(stdout.contains("| kernel % W up / down |"), "{stdout}");
}

/// Checks that W's codec counters were read for each window, Z's were not, and their table.
fn assert_codec_counters_read(r: &Value, stdout: &str) {
    // W's codec counters per window come from its upstream's /metrics; Z's are not scraped.
    for w in ["cold", "steady"] {
        let c = &r[w]["w"]["raw"]["codec"];
        for k in ["records_cut", "records_held", "fpis", "fpi_cache_hits"] {
            assert!(
                c[k].as_f64().is_some_and(|x| x >= 0.0),
                "{w} W codec {k}: {c}"
            );
        }
        assert!(
            r[w]["z"]["raw"]["codec"].is_null(),
            "{w}: Z's codec was scraped"
        );
    }
    assert!(stdout.contains("W's codec over each window"), "{stdout}");
}

/// Checks that both windows' WAL and the table were compared without an integrity failure,
/// and that the replay encoded something, also through `ssh -C` (which it restored).
fn assert_windows_verified(r: &Value) {
    // Both windows' WAL compared on both standbys, the table compared, no integrity failure.
    let compared = num(r, &["verified", "wal_bytes_compared"]);
    assert_eq!(
        compared,
        num(r, &["cold", "wal_bytes"]) + num(r, &["steady", "wal_bytes"])
    );
    assert_eq!(r["verified"]["tables"], serde_json::json!(["updates"]));
    assert_eq!(num(r, &["verified", "integrity_failures"]), 0.0);
    assert!(r["replay"]["walrelay"]["encoded_bytes"].as_f64().unwrap() > 0.0);
    let ssh = num(r, &["replay", "ssh_c", "encoded_bytes"]);
    assert!(
        ssh > 0.0 && ssh < num(r, &["replay", "wal_bytes"]),
        "ssh -C replay {ssh} bytes"
    );
}

/// Checks that the warm replay timed the steady window (from a message boundary) after
/// warming the codecs, and its table.
fn assert_warm_replay_times_the_steady_window(r: &Value, stdout: &str) {
    // The warm replay times the steady window from the replay's message boundary at or before
    // its start, after the WAL before it went through the codecs.
    let warm = &r["warm_replay"];
    let (timed, steady) = (num(warm, &["wal_bytes"]), num(r, &["steady", "wal_bytes"]));
    let message = walrelay_harness::bench::micro::MESSAGE as f64;
    assert!(
        timed >= steady && timed <= steady + message,
        "warm replay timed {timed} bytes of a {steady}-byte window: {warm}"
    );
    assert!(num(warm, &["warm_bytes"]) > 0.0, "nothing warmed: {warm}");
    assert!(num(warm, &["walrelay", "encoded_bytes"]) > 0.0, "{warm}");
    assert!(stdout.contains("Replay of the steady window"), "{stdout}");
}

/// Checks that every stage along each path was sampled in both windows, and the lag table.
fn assert_every_stage_sampled(r: &Value, stdout: &str) {
    // Every stage was sampled: the primary's walsenders toward both feeds and the direct
    // standby (found by application_name), W's relay stages (read from its metrics).
    for w in ["cold", "steady"] {
        let st = &r[w]["stages"];
        for path in ["w", "z", "direct"] {
            assert!(
                st[path]["primary_sent"].is_u64(),
                "{w}: no walsender position for {path}: {st}"
            );
        }
        for stage in ["w_sent_down", "w_spooled", "w_sent_to_standby"] {
            assert!(st[stage].is_u64(), "{w}: {stage} never read: {st}");
        }
    }
    assert_eq!(r["lag_over_run"].as_array().map(Vec::len), Some(3));
    assert!(stdout.contains("Lag along each path"), "{stdout}");
}

/// Checks the timeline CSV: its header, samples throughout the windows, each half's kernel
/// seconds within its CPU seconds, each half's resident set, and W's images and cache hits
/// where scraped.
fn assert_timeline_written(timeline: &std::path::Path, r: &Value) {
    let csv =
        std::fs::read_to_string(timeline.join(format!("updates-pg{}.csv", r["pg_major"]))).unwrap();
    let mut lines = csv.lines();
    let head = lines.next().unwrap();
    assert!(head.starts_with("t,primary_written,"), "{head}");
    let lines: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    // Sampled throughout the 7 s of the windows. The bench asks for a sample every 100 ms
    // and waits for each one; with this binary's other bench test running beside it, a
    // debug build on two cores takes ~150 ms a sample (a release run's largest gap is
    // ~0.3 s), so the bound is on the gaps, not on a count that assumes the tick is met.
    let t: Vec<f64> = lines.iter().map(|l| l[0].parse().unwrap()).collect();
    assert!(
        t.len() >= 7 && t[0] <= 0.5 && t[t.len() - 1] >= 7.0,
        "{csv}"
    );
    let gap = t.windows(2).map(|p| p[1] - p[0]).fold(0.0, f64::max);
    assert!(gap <= 1.0, "a gap of {gap:.2} s between samples:\n{csv}");
    // Each half's kernel seconds are part of its CPU seconds, in every sample.
    let col = |name: &str| head.split(',').position(|c| c == name).expect(name);
    for (pair, dir) in [("w", "up"), ("w", "down"), ("z", "up"), ("z", "down")] {
        let cpu = col(&format!("{pair}_cpu_{dir}_s"));
        let kernel = col(&format!("{pair}_kernel_{dir}_s"));
        for l in &lines {
            let (c, k): (f64, f64) = (l[cpu].parse().unwrap(), l[kernel].parse().unwrap());
            assert!(
                (0.0..=c + 0.001).contains(&k),
                "{pair} {dir}: kernel {k} of cpu {c}"
            );
        }
        // Each half's resident set: known in every sample.
        let rss = col(&format!("{pair}_rss_{dir}_mb"));
        for l in &lines {
            let mb: f64 = l[rss].parse().unwrap();
            assert!(mb > 1.0, "{pair} {dir}: {mb} MB resident");
        }
    }
    // W's images and cache hits, where scraped (with every sample): hits ≤ images, both
    // counted from the upstream's start, so never falling.
    let (images, hits) = (col("w_images"), col("w_image_hits"));
    let scraped: Vec<(u64, u64)> = lines
        .iter()
        .filter(|l| !l[images].is_empty())
        .map(|l| (l[images].parse().unwrap(), l[hits].parse().unwrap()))
        .collect();
    assert!(scraped.len() >= 5, "{csv}");
    assert!(scraped.iter().all(|(i, h)| h <= i), "{scraped:?}");
    assert!(scraped.windows(2).all(|w| w[0].0 <= w[1].0), "{scraped:?}");
    // The direct standby's startup process is found from the first sample on (it runs
    // while the standby is in recovery, all along), and its CPU seconds never fall.
    let apply = col("direct_apply_cpu_s");
    let apply: Vec<f64> = lines.iter().map(|l| l[apply].parse().unwrap()).collect();
    assert!(apply.windows(2).all(|w| w[0] <= w[1]), "{apply:?}");
    assert!(apply.last() > apply.first(), "{apply:?}");
}

/// Checks the direct standby's apply CPU per GB, the reference for the halves' CPU per GB:
/// measured in both windows, within what any process can spend on a GB of WAL in its window
/// (more than nothing: every record is applied; less than the window's length on one core
/// per GB), and in the window table.
fn assert_direct_apply_measured(r: &Value, stdout: &str) {
    for w in ["cold", "steady"] {
        let gb = r[w]["wal_bytes"].as_f64().unwrap() / 1e9;
        let secs = r[w]["t_end"].as_f64().unwrap() - r[w]["t_start"].as_f64().unwrap();
        let v = &r[w]["direct_apply_cpu_s_per_gb"];
        assert!(
            v.as_f64().is_some_and(|x| x > 0.0 && x * gb <= secs + 5.0),
            "{w}: {v} s/GB over {gb} GB in {secs} s"
        );
    }
    assert!(
        stdout.contains("| CPU s/GB direct standby's apply |"),
        "{stdout}"
    );
}

/// Processes whose command line mentions `path` (the relays' config files, the clusters' data
/// directories).
fn processes_under(path: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(path) {
            found.push(format!("{}: {cmd}", entry.file_name().to_string_lossy()));
        }
    }
    found
}

/// Waits up to `secs` for `done`, checking twice a second.
fn wait_for(secs: u64, mut done: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        if done() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    done()
}

/// The CPUs a process may run on (`Cpus_allowed_list` of `/proc/<pid>/status`: "0-2,5").
fn cpus_allowed(pid: &str) -> Option<Vec<u64>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    let mut cpus = Vec::new();
    for part in list.trim().split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        cpus.extend(a.parse::<u64>().ok()?..=b.parse::<u64>().ok()?);
    }
    Some(cpus)
}

/// `--sites`: the report of the finished workload names two disjoint sets of CPUs, and within
/// a minute each relay half and each cluster's postmaster of the running one (their command
/// lines mention `under`) may run on its site's only: the upstreams and the primary on the
/// first set, the downstreams and the three standbys on the second.
fn assert_sites_pinned(json: &std::path::Path, under: &str) {
    let report: Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    let set = |k: &str| -> Vec<u64> {
        let v = report["sites"][k].as_array();
        let v = v.unwrap_or_else(|| panic!("no sites.{k} in the report: {report}"));
        v.iter().map(|c| c.as_u64().unwrap()).collect()
    };
    let (primary, standbys) = (set("primary_cpus"), set("standby_cpus"));
    assert!(!primary.is_empty() && !standbys.is_empty(), "{report}");
    assert!(primary.iter().all(|c| !standbys.contains(c)), "{report}");
    // The relay halves by their config files, the clusters by their postmasters (not the
    // pg_ctl that starts or stops one, which the bench runs unpinned).
    let site_of = |cmd: &str| {
        let relay = cmd.contains("walrelay run --config");
        let postmaster = cmd.contains("bin/postgres -D");
        let primary_site =
            relay && cmd.contains("-upstream.toml") || postmaster && cmd.contains("/primary ");
        let standby_site =
            relay && cmd.contains("-downstream.toml") || postmaster && cmd.contains("/standby_");
        match (primary_site, standby_site) {
            (true, false) => Some(&primary),
            (false, true) => Some(&standbys),
            _ => None,
        }
    };
    // What the last look that found the run's processes saw (the run may end meanwhile).
    let mut seen = Vec::new();
    let pinned = wait_for(60, || {
        let mut look = Vec::new();
        for p in processes_under(under) {
            let (pid, cmd) = p.split_once(':').unwrap();
            if let Some(want) = site_of(&format!("{cmd} ")) {
                look.push((p.clone(), cpus_allowed(pid), want.clone()));
            }
        }
        let ok = look.iter().all(|(_, has, want)| has.as_ref() == Some(want));
        // Four relay halves, the primary and three standbys.
        let done = look.len() == 8 && ok;
        if !look.is_empty() {
            seen = look;
        }
        done
    });
    assert!(
        pinned,
        "not each on its site's CPUs (process, allowed, wanted): {seen:#?}"
    );
}

/// The relay processes whose command lines mention `under`: pid, which half by its config
/// file (`w-upstream`, `w-downstream`, `z-upstream`, `z-downstream`), and the process's line.
fn relay_halves(under: &str) -> Vec<(u32, &'static str, String)> {
    let halves = ["w-upstream", "w-downstream", "z-upstream", "z-downstream"];
    let mut found = Vec::new();
    for p in processes_under(under) {
        let (pid, cmd) = p.split_once(':').unwrap();
        if !cmd.contains("walrelay run --config") {
            continue;
        }
        let half = halves
            .into_iter()
            .find(|h| cmd.contains(&format!("/{h}.toml")));
        let half = half.unwrap_or_else(|| panic!("a relay process of no known half: {p}"));
        found.push((pid.parse().unwrap(), half, p.clone()));
    }
    found
}

/// `--w-share`: the report says so, and pair W's two relay processes (their command lines
/// mention `under`) run at nice -5, threads and session groups (where the kernel has them),
/// while Z's keep 0.
fn assert_w_favoured(json: &std::path::Path, under: &str) {
    let report: Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    assert_eq!(report["w_share"], Value::Bool(true), "{report}");
    let mut seen = Vec::new();
    for (pid, half, p) in relay_halves(under) {
        let want = if half.starts_with('w') { -5 } else { 0 };
        let (group, thread) = (autogroup_nice_of(pid), nice_of(pid));
        seen.push((p.clone(), group, thread));
        assert!(
            group.is_none_or(|g| g == want) && thread == Some(want),
            "{p}: session group {group:?}, thread {thread:?}, want {want}"
        );
    }
    assert_eq!(seen.len(), 4, "{seen:#?}");
}

/// `--services` with `--w-share`: the report says so, and each relay process of the bench
/// `bench_pid` runs in its group (`w-upstream`, ...), W's at three times the weight of Z's.
fn assert_services_placed(json: &std::path::Path, under: &str, bench_pid: u32) -> Hierarchy {
    let report: Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    assert!(
        report["services"]
            .as_str()
            .is_some_and(|s| s.contains("--services")),
        "{report}"
    );
    let h = Hierarchy::of_this_machine().unwrap();
    // A relay half's CPU group, and whether it is the one the bench made for that half.
    let placed = |pid: u32, group: &str| {
        let path = cpu_group_of(pid).unwrap_or_default();
        let ours = path.ends_with(&format!("/{}", group_name(bench_pid, group)));
        (path, ours)
    };
    // The bench places the groups right after pinning the sites, which the caller waited
    // for: wait for the placing too.
    wait_for(60, || {
        let halves = relay_halves(under);
        halves.len() == 4 && halves.iter().all(|(pid, group, _)| placed(*pid, group).1)
    });
    let mut seen = Vec::new();
    for (pid, group, p) in relay_halves(under) {
        let (path, ours) = placed(pid, group);
        assert!(ours, "{p}: in {path}");
        let share = if group.starts_with('w') {
            Share::Favoured
        } else {
            Share::Even
        };
        let (file, want) = h.weight(share);
        let dir = h.root().join(path.trim_start_matches('/'));
        let weight = std::fs::read_to_string(dir.join(file)).unwrap();
        assert_eq!(weight.trim(), want.to_string(), "{p}: {file} of {path}");
        seen.push(path);
    }
    assert_eq!(seen.len(), 4, "{seen:#?}");
    h
}

/// SIGTERM in the middle of a run (`kill`, a CI job's timeout): the bench stops the relays and
/// clusters it started, removes its directory and fails, naming the signal. Before, it died
/// at once and left four relay processes, its clusters and its WAL copies behind. Sent during
/// the second of two workloads: the `--json` written when the first finished stays, with the
/// second named as not run (before, a bench stopped anywhere reported nothing), and the
/// tables of the first are printed, naming the signal (before, only the JSON had them). It
/// runs with `--sites`, `--w-share` and `--services`, whose effects on the running processes
/// it checks; the groups of `--services` are gone after it.
#[test]
fn a_bench_stopped_by_sigterm_leaves_nothing_behind_but_what_finished() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    // The clusters run as the postgres user when the tests run as root: it must reach them.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let logs = tempfile::tempdir().unwrap();
    let (err_path, json) = (logs.path().join("stderr"), logs.path().join("bench.json"));
    let out_path = logs.path().join("stdout");
    let mut child = tiny_bench_of("updates,updates", "3")
        .arg("--json")
        .arg(&json)
        .arg("--sites")
        .arg("--w-share")
        .arg("--services")
        .env("TMPDIR", tmp.path())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let under = tmp.path().to_str().unwrap().to_string();
    let stderr = || std::fs::read_to_string(&err_path).unwrap_or_default();
    // The first workload finished, and the second's relays run (their config files are
    // under TMPDIR), as do its clusters.
    // A bench that ended early (a failure) is reported at once, with its output.
    let mut ended = None;
    let second_up = wait_for(400, || {
        ended = child.try_wait().unwrap();
        ended.is_some()
            || stderr().contains("x zstd-3 (Z")
                && processes_under(&under)
                    .iter()
                    .filter(|p| p.contains("walrelay run --config"))
                    .count()
                    == 4
    });
    assert!(
        second_up && ended.is_none(),
        "the second workload's relays not up ({ended:?}): {}",
        stderr()
    );
    assert_sites_pinned(&json, &under);
    assert_w_favoured(&json, &under);
    let bench_pid = child.id();
    let hierarchy = assert_services_placed(&json, &under, bench_pid);
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let mut status = None;
    assert!(
        wait_for(60, || {
            status = child.try_wait().unwrap();
            status.is_some()
        }),
        "the bench did not exit within 60 s of SIGTERM: {}",
        stderr()
    );
    assert_eq!(status.unwrap().code(), Some(1), "{}", stderr());
    assert!(stderr().contains("stopped by SIGTERM"), "{}", stderr());
    // Nothing left running (a backend may take a moment to notice its postmaster is gone)
    // and nothing left in TMPDIR.
    let mut left = Vec::new();
    assert!(
        wait_for(15, || {
            left = processes_under(&under);
            left.is_empty()
        }),
        "still running after the bench exited: {left:#?}"
    );
    let files: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().collect();
    assert!(files.is_empty(), "left in TMPDIR: {files:?}");
    let prefix = group_name(bench_pid, "");
    let groups: Vec<_> = std::fs::read_dir(hierarchy.root())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .collect();
    assert!(groups.is_empty(), "cgroups left behind: {groups:?}");
    // What finished is kept, and what did not is named.
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    the_only_run(&report);
    let not_run = report["not_run"].as_array().unwrap();
    assert_eq!(not_run.len(), 1, "{report}");
    assert!(
        not_run[0]
            .as_str()
            .unwrap()
            .starts_with("updates on PostgreSQL "),
        "{report}"
    );
    assert_eq!(report["stopped"], "stopped by SIGTERM", "{report}");
    // The first workload's tables on stdout, one row per window, and the second named.
    let stdout = std::fs::read_to_string(&out_path).unwrap();
    let rows = stdout.lines().filter(|l| l.starts_with("| updates |"));
    assert!(
        rows.count() >= 2,
        "no table rows for the finished workload:\n{stdout}"
    );
    let last = stdout.lines().rev().find(|l| !l.is_empty()).unwrap_or("");
    assert!(
        last.starts_with("not run: updates on PostgreSQL ")
            && last.ends_with("(the bench stopped: stopped by SIGTERM)"),
        "{stdout}"
    );
}
