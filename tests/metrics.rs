//! The `[metrics]` endpoint of the real binary with a real primary and standby: the Prometheus
//! exposition (parsed strictly), `/healthz`, `walrelay status`, the status page rendered in
//! headless Chromium, and the Grafana dashboard's metric names against a real scrape. One
//! environment serves all of them.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::prom::parse_exposition;
use common::promql;
use common::*;
use walrelay_harness::cluster::{free_port, wait_until};
use walrelay_harness::prom::Sample;

fn find<'a>(samples: &'a [Sample], name: &str, labels: &[(&str, &str)]) -> Option<&'a Sample> {
    samples.iter().find(|s| {
        s.name == name
            && labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
    })
}

fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    find(samples, name, labels)
        .unwrap_or_else(|| panic!("no {name} {labels:?} in the scrape"))
        .value
}

/// A plain HTTP/1.0 GET; returns (status, body).
fn http_get(port: u16, path: &str) -> (u16, String) {
    http_request(
        port,
        &format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"),
    )
}

/// Sends `request` as it is; returns (status, body) of the answer.
fn http_request(port: u16, request: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    // Until EOF; a server refusing a request may reset the connection after its answer.
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if raw.is_empty() => panic!("no answer to {:?}: {e}", &request[..20]),
            Err(_) => break,
        }
    }
    let resp = String::from_utf8_lossy(&raw);
    let (head, body) = resp.split_once("\r\n\r\n").expect("HTTP response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

/// Runs a command with a deadline (Chromium can hang on a broken machine); kills it then.
fn run_bounded(cmd: &mut Command, within: Duration) -> std::process::Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run {cmd:?}: {e} (scripts/install-deps.sh installs chromium)")
        });
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if rx.recv_timeout(within).is_err() {
            // SAFETY: kill(2) takes plain integers; no memory is involved.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let out = child.wait_with_output().unwrap();
    let _ = tx.send(());
    out
}

fn chromium(profile: &Path, args: &[&str], url: &str) -> std::process::Output {
    let mut cmd = Command::new("chromium");
    cmd.args([
        "--headless",
        "--disable-gpu",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
    ]);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cmd.arg("--no-sandbox"); // Chromium refuses to run as root with its sandbox
    }
    cmd.arg(format!("--user-data-dir={}", profile.display()));
    cmd.args(args).arg(url);
    run_bounded(&mut cmd, Duration::from_secs(90))
}

/// The standby's row in the scrape's per-standby families.
const STANDBY1: [(&str, &str); 2] = [("half", "downstream"), ("application_name", "standby1")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_status_page_and_dashboard() {
    let mport = free_port();
    let env = env(EnvOpts {
        extra_toml: format!("[metrics]\nlisten = \"127.0.0.1:{mport}\"\n"),
        ..Default::default()
    })
    .await;
    http_requests_are_answered(mport);
    catch_up_progress_is_logged(&env).await;

    // Traffic with full-page images: a checkpoint first, so first touches log FPIs.
    env.primary.execute("checkpoint").await.unwrap();
    pgbench(&env.primary, &["-c", "2", "-T", "4", "postgres"]);
    env.wait_caught_up().await;
    wait_replay_lsn_scraped(&env.standby, mport).await;

    let (status, text) = http_get(mport, "/metrics");
    assert_eq!(status, 200);
    let samples = parse_exposition(&text);
    let wal_in = wal_counters_cover_the_stream(&env.standby, &samples).await;
    link_counters_agree(&samples, mport, wal_in);
    other_families_are_exported(&samples);
    status_command_prints_the_standby(mport);

    let relay = &env.relay;
    wait_until("the caught-up line", TIMEOUT, || async move {
        Ok(relay.log_text().contains("standby caught up"))
    })
    .await
    .unwrap();

    status_page_in_chromium(env.root.path(), mport);
    dashboard_uses_exported_metrics(&samples);
    env.relay.assert_no_panic();
}

/// `/healthz`, an unknown path, a POST and an oversized request head get their answers.
fn http_requests_are_answered(mport: u16) {
    let (status, body) = http_get(mport, "/healthz");
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    assert_eq!(http_get(mport, "/nonexistent").0, 404);
    let post = "POST /metrics HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc";
    assert_eq!(http_request(mport, post).0, 405);
    // Request heads are bounded (16 KiB).
    let big = format!("GET / HTTP/1.0\r\nX-Big: {}\r\n\r\n", "a".repeat(40_000));
    assert_eq!(http_request(mport, &big).0, 431);
}

/// With replay paused the standby falls more than 16 MB behind while still receiving and
/// reporting: the downstream logs progress lines until it has caught up.
async fn catch_up_progress_is_logged(env: &Env) {
    env.standby
        .execute("select pg_wal_replay_pause()")
        .await
        .unwrap();
    pgbench(&env.primary, &["-i", "-s", "3", "-q", "postgres"]);
    let relay = &env.relay;
    wait_until("a catch-up progress line", TIMEOUT, || async move {
        Ok(relay.log_text().contains("standby catching up"))
    })
    .await
    .unwrap();
    let log = env.relay.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("standby catching up"))
        .unwrap();
    eprintln!("progress line: {line}");
    for field in [
        "application_name=standby1",
        "remaining_mb=",
        "rate_mb_s=",
        "eta=",
    ] {
        assert!(line.contains(field), "{field} missing in {line:?}");
    }
    assert!(!log.contains("standby caught up"), "{log}");
    env.standby
        .execute("select pg_wal_replay_resume()")
        .await
        .unwrap();
}

/// The downstream's replay position for standby1 reaches the standby's own (the standby
/// reports every second, wal_receiver_status_interval = 1s).
async fn wait_replay_lsn_scraped(standby: &walrelay_harness::cluster::Cluster, mport: u16) {
    wait_until(
        "replay LSN in /metrics = the standby's",
        TIMEOUT,
        || async move {
            let replay = parse_lsn(
                &standby
                    .query_one_string("select pg_last_wal_replay_lsn()::text")
                    .await?,
            );
            let samples = parse_exposition(&http_get(mport, "/metrics").1);
            Ok(
                find(&samples, "walrelay_standby_replay_lsn_bytes", &STANDBY1)
                    .is_some_and(|s| s.value == replay as f64),
            )
        },
    )
    .await
    .unwrap();
}

/// The scrape's replay position is the standby's, and the WAL the standby received through
/// the relay all came through the WAL-in and delivered counters and the codec's; returns the
/// WAL-in counter.
async fn wal_counters_cover_the_stream(
    standby: &walrelay_harness::cluster::Cluster,
    samples: &[Sample],
) -> f64 {
    let replay = parse_lsn(
        &standby
            .query_one_string("select pg_last_wal_replay_lsn()::text")
            .await
            .unwrap(),
    );
    let scraped = value(samples, "walrelay_standby_replay_lsn_bytes", &STANDBY1);
    assert!(
        scraped <= replay as f64 && scraped > 0.0,
        "scraped replay {scraped} vs standby {replay}"
    );
    let (start, received) = {
        let row = standby
            .query_one_string(
                "select receive_start_lsn::text || ' ' || flushed_lsn::text from pg_stat_wal_receiver",
            )
            .await
            .unwrap();
        let (a, b) = row.split_once(' ').unwrap();
        (parse_lsn(a), parse_lsn(b))
    };
    let streamed = (received - start) as f64;
    assert!(streamed > 1e6, "only {streamed} bytes streamed");
    let wal_in = value(samples, "walrelay_wal_received_bytes_total", &[]);
    let delivered = value(samples, "walrelay_wal_delivered_bytes_total", &[]);
    assert!(wal_in >= streamed, "WAL in {wal_in} < streamed {streamed}");
    assert!(
        delivered >= streamed,
        "delivered {delivered} < streamed {streamed}"
    );
    for (name, labels) in [
        ("walrelay_codec_rmgr_input_bytes_total", [("rmgr", "Heap")]),
        ("walrelay_codec_rmgr_output_bytes_total", [("rmgr", "Heap")]),
        ("walrelay_codec_input_bytes_total", [("kind", "fpi")]),
        ("walrelay_codec_output_bytes_total", [("kind", "fpi")]),
    ] {
        assert!(
            value(samples, name, &labels) > 0.0,
            "{name} {labels:?} is 0"
        );
    }
    wal_in
}

/// The link carried less than the WAL, and both ends count its sockets consistently.
fn link_counters_agree(samples: &[Sample], mport: u16, wal_in: f64) {
    let link_out = value(
        samples,
        "walrelay_link_sent_bytes_total",
        &[("half", "upstream")],
    );
    assert!(
        link_out > 0.0 && link_out < wal_in,
        "link {link_out} vs WAL {wal_in}"
    );
    // Both ends of the link count its sockets. Counters only grow, so a later scrape's upstream
    // bytes sent cover the downstream's bytes received now, and those cover the WAL payload it
    // had received by now.
    let down = [("half", "downstream")];
    let link_in_down = value(samples, "walrelay_link_received_bytes_total", &down);
    let payload_down = value(samples, "walrelay_link_payload_bytes_total", &down);
    let later = parse_exposition(&http_get(mport, "/metrics").1);
    let later_out = value(
        &later,
        "walrelay_link_sent_bytes_total",
        &[("half", "upstream")],
    );
    let later_in_down = value(&later, "walrelay_link_received_bytes_total", &down);
    assert!(
        payload_down > 0.0,
        "no WAL payload counted at the downstream"
    );
    assert!(
        later_in_down >= payload_down && later_out >= link_in_down,
        "downstream received {link_in_down} then {later_in_down} with {payload_down} of payload; upstream sent {later_out}"
    );
    assert!(
        value(
            samples,
            "walrelay_compression_ratio",
            &[("half", "upstream")]
        ) > 1.0
    );
}

/// The codec's, the spool's, the sessions' and the process's families have plausible values.
fn other_families_are_exported(samples: &[Sample]) {
    assert!(value(samples, "walrelay_codec_fpis_total", &[]) > 0.0);
    // pgbench's heap inserts and updates are tuple sites: the tuple counters are wired up.
    assert!(
        value(samples, "walrelay_codec_tuple_deltas_total", &[])
            + value(samples, "walrelay_codec_tuple_misses_total", &[])
            > 0.0
    );
    assert!(value(samples, "walrelay_block_cache_bytes", &[]) > 0.0);
    // Exported for both halves (they move only when a stage falls behind).
    for half in ["upstream", "downstream"] {
        for name in [
            "walrelay_codec_parallel_messages_total",
            "walrelay_codec_staged_messages_total",
            "walrelay_codec_short_of_cpu_messages_total",
        ] {
            assert!(value(samples, name, &[("half", half)]) >= 0.0);
        }
    }
    // Only the upstream encodes: it alone has the catch-up counters.
    for name in [
        "walrelay_codec_fast_messages_total",
        "walrelay_codec_fast_spells_total",
    ] {
        assert!(value(samples, name, &[("half", "upstream")]) >= 0.0);
    }
    // The spool's disk time: appends happened, and the periodic fsync ran.
    assert!(value(samples, "walrelay_spool_write_seconds_total", &[]) > 0.0);
    assert!(value(samples, "walrelay_spool_syncs_total", &[]) > 0.0);
    assert!(value(samples, "walrelay_spool_sync_seconds_total", &[]) > 0.0);
    // Exported (the spool is far from full here, so nothing was written over yet).
    assert!(value(samples, "walrelay_spool_segments_reused_total", &[]) >= 0.0);
    assert_eq!(
        value(samples, "walrelay_integrity_failures_total", &[]),
        0.0
    );
    assert_eq!(
        value(samples, "walrelay_sessions", &[("half", "downstream")]),
        1.0
    );
    assert!(value(samples, "walrelay_standby_lag_seconds", &STANDBY1) >= 0.0);
    assert!(value(samples, "process_cpu_seconds_total", &[]) > 0.0);
    assert!(value(samples, "process_resident_memory_bytes", &[]) > 1e6);
}

/// `walrelay status` prints the standby's row, and names the cause when nothing listens.
fn status_command_prints_the_standby(mport: u16) {
    let out = Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args(["status", "--url", &format!("http://127.0.0.1:{mport}")])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "walrelay status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("standby1"), "{stdout}");
    assert!(stdout.contains("integrity failures"), "{stdout}");
    let out = Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args([
            "status",
            "--url",
            &format!("http://127.0.0.1:{}", free_port()),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("[metrics] listen"));
}

/// Loads `/` in headless Chromium: the rendered DOM has standby1's row and a chart with data
/// points, and a screenshot is a non-empty PNG.
fn status_page_in_chromium(dir: &Path, port: u16) {
    let url = format!("http://127.0.0.1:{port}/");
    let profile = dir.join("chromium-profile");
    let out = chromium(
        &profile,
        &["--virtual-time-budget=3000", "--dump-dom"],
        &url,
    );
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && dom.contains("</html>"),
        "chromium --dump-dom failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // The rows and the chart are built by the page's script, so they are only in the DOM if it ran.
    assert!(
        dom.contains("<tr class=\"standby\"><td class=\"l\">standby1</td>"),
        "no standby1 row in the rendered page:\n{dom}"
    );
    let points: usize = dom
        .split("data-points=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|n| n.parse().ok())
        .expect("chart element with data-points");
    assert!(points >= 2, "chart has {points} data points");
    let wal_line = dom
        .split("id=\"wal-line\"")
        .nth(1)
        .and_then(|r| r.split("points=\"").nth(1))
        .and_then(|r| r.split('"').next())
        .unwrap_or("");
    assert_eq!(wal_line.split(' ').count(), points, "{wal_line}");

    let png = dir.join("status-page.png");
    let out = chromium(
        &profile,
        &[
            "--virtual-time-budget=3000",
            "--window-size=1100,1000",
            &format!("--screenshot={}", png.display()),
        ],
        &url,
    );
    assert!(
        out.status.success(),
        "chromium --screenshot failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&png).expect("screenshot written");
    assert!(bytes.len() > 1000, "screenshot of {} bytes", bytes.len());
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "screenshot is not a PNG");
    // To look at it: WALRELAY_SCREENSHOT=/some/file.png cargo test -p walrelay --test metrics
    if let Ok(keep) = std::env::var("WALRELAY_SCREENSHOT") {
        std::fs::copy(&png, &keep).unwrap();
    }
}

/// Every metric name in the dashboard's PromQL expressions is in the scrape.
fn dashboard_uses_exported_metrics(samples: &[Sample]) {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/walrelay-dashboard.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let mut exprs = Vec::new();
    collect_exprs(&json, &mut exprs);
    assert!(
        exprs.len() >= 10,
        "only {} exprs in the dashboard",
        exprs.len()
    );
    let exported: BTreeSet<&str> = samples.iter().map(|s| s.name.as_str()).collect();
    let mut used = BTreeSet::new();
    for e in &exprs {
        let names: BTreeSet<String> = promql::parse(e).refs.into_iter().map(|r| r.name).collect();
        assert!(!names.is_empty(), "no metric in {e:?}");
        used.extend(names);
    }
    let missing: Vec<&String> = used
        .iter()
        .filter(|n| !exported.contains(n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard uses metrics walrelay does not export: {missing:?}"
    );
    for needed in [
        "walrelay_standby_lag_bytes",
        "walrelay_standby_lag_seconds",
        "walrelay_codec_rmgr_input_bytes_total",
        "walrelay_codec_input_bytes_total",
        "walrelay_integrity_failures_total",
        "process_cpu_seconds_total",
    ] {
        assert!(
            used.contains(needed),
            "the dashboard does not chart {needed}"
        );
    }
}

fn collect_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

#[test]
fn promql_names_are_extracted() {
    let n: BTreeSet<String> = promql::parse(
        r#"sum by (instance, half) (rate(walrelay_a_total{x="y}"}[$__rate_interval])) / on (i) group_left walrelay_b"#,
    )
    .refs
    .into_iter()
    .map(|r| r.name)
    .collect();
    assert_eq!(
        n.into_iter().collect::<Vec<_>>(),
        ["walrelay_a_total", "walrelay_b"]
    );
}
