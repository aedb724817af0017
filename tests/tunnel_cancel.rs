//! Cancel requests for sessions tunnelled through the relay (#13): the BackendKeyData a
//! tunnelled client is given names its tunnel at the downstream; a CancelRequest with it goes
//! through the upstream, which cancels the tunnel's own backend on the primary.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::split::{Split, SplitOpts};
use common::*;
use walrelay_harness::cluster::wait_until;

const LONG_QUERY: &str = "select count(*) from (select generate_series(1, 100000000000)) s";

/// Sends a CancelRequest for (`pid`, `key`) to `port` and waits until the server closes the
/// connection, as libpq's PQcancel does.
fn send_cancel(port: u16, pid: u32, key: u32) {
    let mut b = BytesMut::new();
    walrelay_pgwire::encode::cancel_request(&mut b, pid, key);
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(&b).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "a cancel request gets no answer: {rest:?}");
}

/// Ctrl-C in psql on a logical replication session through the relay (a read-only query
/// running on the primary) cancels the query there; before that, a cancel request naming
/// no tunnel is dropped and the query runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_in_psql_cancels_a_tunnelled_query_on_the_primary() {
    let mport = walrelay_harness::cluster::free_port();
    let env = Split::new(SplitOpts {
        downstream_extra: format!("\n[metrics]\nlisten = \"127.0.0.1:{mport}\"\n"),
        ..Default::default()
    })
    .await;
    let child = psql_running_the_long_query(&env);
    let p = &env.primary;
    let running = format!(
        "select count(*)::text from pg_stat_activity where state = 'active' and query = '{LONG_QUERY}'"
    );
    let running = running.as_str();
    wait_until("the query to run on the primary", TIMEOUT, || async move {
        Ok(p.query_one_string(running).await? == "1")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", env.downstream.log_text()));

    assert_a_stray_cancel_is_dropped(&env, running).await;

    // Ctrl-C: psql sends a CancelRequest with the key its startup reply gave it.
    let t0 = Instant::now();
    let out = ctrl_c(child, &env).await;
    assert_psql_was_cancelled(&out, t0, &env).await;
    assert_eq!(p.query_one_string(running).await.unwrap(), "0");
    assert_cancels_are_counted(mport).await;
    env.downstream.assert_no_panic();
    env.upstream.assert_no_panic();
}

/// Starts psql running [`LONG_QUERY`] on a logical replication session through the
/// downstream.
fn psql_running_the_long_query(env: &Split) -> std::process::Child {
    let conninfo = format!(
        "host=127.0.0.1 port={} user={STANDBY_USER} dbname=postgres replication=database",
        env.down_port
    );
    env.primary
        .command("psql")
        .args([&conninfo, "-XAt", "-c", LONG_QUERY])
        .env("PGPASSWORD", STANDBY_PASSWORD)
        .env("PGCONNECT_TIMEOUT", "20")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Sends a cancel request with a key no tunnel has; checks that the downstream drops it and
/// the query (counted by the query `running`) runs on.
async fn assert_a_stray_cancel_is_dropped(env: &Split, running: &str) {
    // A key no tunnel has: dropped at the downstream; the query runs on.
    let port = env.down_port;
    tokio::task::spawn_blocking(move || send_cancel(port, 4242, 123_456))
        .await
        .unwrap();
    wait_until(
        "the downstream to drop the stray cancel",
        TIMEOUT,
        || async { Ok(env.downstream.log_text().contains("names no live tunnel")) },
    )
    .await
    .unwrap();
    assert_eq!(env.primary.query_one_string(running).await.unwrap(), "1");
}

/// Sends SIGINT to psql (`child`) and waits up to 60 s for it to exit; returns its output.
async fn ctrl_c(child: std::process::Child, env: &Split) -> std::process::Output {
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill has no memory-safety preconditions; the pid is our own child's.
    let rc = unsafe { libc::kill(pid, libc::SIGINT) };
    assert_eq!(rc, 0);
    let waited = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || child.wait_with_output()),
    )
    .await;
    let Ok(out) = waited else {
        // SAFETY: as above (the child has not been reaped: its wait is still running).
        unsafe { libc::kill(pid, libc::SIGKILL) };
        panic!(
            "the query was not cancelled within 60 s\n{}",
            env.downstream.log_text()
        );
    };
    out.unwrap().unwrap()
}

/// Checks that psql's query was cancelled (within 30 s of `t0`) by a cancel request the
/// upstream relayed. The halves say so (and count it) once the primary has closed the cancel
/// connection, which it may do after the cancelled backend's error has reached psql.
async fn assert_psql_was_cancelled(out: &std::process::Output, t0: Instant, env: &Split) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the query was not cancelled");
    assert!(
        stderr.contains("canceling statement due to user request"),
        "psql: {stderr}\n{}",
        env.upstream.log_text()
    );
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    wait_until(
        "both halves to report the relayed cancel request",
        Duration::from_secs(10),
        || async {
            Ok(env
                .upstream
                .log_text()
                .contains("relayed a tunnelled client's cancel request")
                && env
                    .downstream
                    .log_text()
                    .contains("relayed a cancel request to the primary through the upstream"))
        },
    )
    .await
    .unwrap();
}

/// Checks the downstream's cancel counters on the metrics port `mport`: one relayed, one
/// naming no tunnel, none failed.
async fn assert_cancels_are_counted(mport: u16) {
    let text = walrelay_harness::prom::http_get(mport, "/metrics", Duration::from_secs(10))
        .await
        .unwrap();
    let samples = common::prom::parse_exposition(&text);
    let cancels = |result: &str| {
        samples
            .iter()
            .find(|s| {
                s.name == "walrelay_tunnel_cancels_total"
                    && s.labels.get("result").map(String::as_str) == Some(result)
            })
            .map(|s| s.value)
            .unwrap_or_else(|| {
                panic!("no walrelay_tunnel_cancels_total{{result={result}}} in:\n{text}")
            })
    };
    assert_eq!(
        (cancels("relayed"), cancels("no_tunnel"), cancels("failed")),
        (1.0, 1.0, 0.0)
    );
}
