//! Attacks on the three listening ports (issue #14), each against the real binary with a real
//! primary: peers that never authenticate on the standby port, TLS handshakes that stall on
//! the link port, a saturated metrics port. Each checks that the legitimate client still gets
//! in and that the attacker's sockets are cut within the configured deadline.
//! `scripts/chaos.sh` runs these with the other failure tests (README, Security).
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use walrelay_harness::certs::{Ca, CertFiles};
use walrelay_harness::cluster::{free_port, wait_until, Cluster, PrimaryOpts, TempRoot};
use walrelay_pgwire::{parse_tagged, ErrorFields};

/// A TCP connection to 127.0.0.1:`port` from `source` (another loopback address stands for
/// another host).
async fn connect_from(source: &str, port: u16) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(format!("{source}:0").parse::<SocketAddr>().unwrap())
        .unwrap();
    s.connect(([127, 0, 0, 1], port).into()).await.unwrap()
}

/// Reads until the server closes (at most `within`); returns what arrived and whether it
/// closed.
async fn read_to_close(s: &mut TcpStream, within: Duration) -> (Vec<u8>, bool) {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (all, true),
            Ok(Ok(n)) => all.extend_from_slice(&buf[..n]),
            Err(_) => return (all, false),
        }
    }
}

fn first_error(bytes: &[u8]) -> Option<ErrorFields> {
    let mut b = bytes::BytesMut::from(bytes);
    while let Ok(Some(m)) = parse_tagged(&mut b, |_| 1 << 20) {
        if m.tag == b'E' {
            return ErrorFields::parse(&m.body).ok();
        }
    }
    None
}

fn repl_conninfo(port: u16) -> String {
    format!("host=127.0.0.1 port={port} user={STANDBY_USER} replication=true sslmode=disable")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_peers_do_not_lock_standbys_out() {
    // The tester's setting, smaller: one session is the streaming standby, two are left.
    let env = env(EnvOpts {
        extra_toml: "max_sessions = 3\nmax_startups = 16\nmax_startups_per_address = 6\n\
                     startup_timeout_secs = 4\nauth_timeout_secs = 20"
            .into(),
        ..Default::default()
    })
    .await;
    let port = env.down_port;

    // 36 idle connections from one host: six wait in startup, the others are refused at once.
    let mut idle = Vec::new();
    for _ in 0..36 {
        idle.push(connect_from("127.0.0.2", port).await);
    }
    // While they are held, a standby-side client authenticates and is served: the idle
    // connections hold no session slot (before #14 they held every free one).
    let (ok, out, err) = psql_repl(
        &env.primary,
        &repl_conninfo(port),
        STANDBY_PASSWORD,
        "IDENTIFY_SYSTEM",
    );
    assert!(
        ok,
        "psql refused while idle peers held sockets: {out} {err}"
    );
    assert_idle_connections_are_refused_or_cut(&mut idle).await;

    let _flood = flood_the_startup_budget(port).await;
    assert_a_newcomer_gets_in_after_the_flood(&env).await;

    assert_password_guessing_is_slowed(&env).await;
    // The streaming standby never noticed.
    env.wait_streaming_through_relay().await;
    env.relay.assert_no_panic();
}

/// Checks that the relay closes every `idle` connection: some refused with 53300, some cut
/// at the startup deadline.
async fn assert_idle_connections_are_refused_or_cut(idle: &mut [TcpStream]) {
    // Every idle connection is closed by the relay: refused ones with 53300, the others
    // when limits.startup_timeout_secs (4 s) ends; none is held longer.
    let (mut refused, mut cut) = (0, 0);
    for s in idle {
        let (bytes, closed) = read_to_close(s, Duration::from_secs(30)).await;
        assert!(closed, "an unauthenticated connection was held for 30 s");
        match first_error(&bytes) {
            Some(e) => {
                assert_eq!(e.code, "53300", "{}", e.message);
                assert!(
                    e.message.contains("max_startups_per_address"),
                    "{}",
                    e.message
                );
                refused += 1;
            }
            None => cut += 1,
        }
    }
    assert!(refused >= 24 && cut >= 1, "refused {refused}, cut {cut}");
}

/// Opens six connections from each of three hosts to `port`, filling the whole
/// pre-authentication budget; returns them (to hold).
async fn flood_the_startup_budget(port: u16) -> Vec<TcpStream> {
    // Many hosts at once fill the whole pre-authentication budget (16): a newcomer is
    // refused while it is full, and gets in once the deadline has freed it.
    let mut flood = Vec::new();
    for host in ["127.0.0.3", "127.0.0.4", "127.0.0.5"] {
        for _ in 0..6 {
            flood.push(connect_from(host, port).await);
        }
    }
    flood
}

/// Waits until psql gets in (refused meanwhile only for max_startups), and checks the log.
async fn assert_a_newcomer_gets_in_after_the_flood(env: &Env) {
    let port = env.down_port;
    let pr = &env.primary;
    wait_until(
        "psql gets in after the flood's deadline",
        TIMEOUT,
        || async move {
            let (ok, _, err) = psql_repl(
                pr,
                &repl_conninfo(port),
                STANDBY_PASSWORD,
                "IDENTIFY_SYSTEM",
            );
            assert!(ok || err.contains("max_startups"), "{err}");
            Ok(ok)
        },
    )
    .await
    .unwrap();
    let log = env.relay.log_text();
    assert!(log.contains("limits.max_startups reached"), "{log}");
}

/// Checks that two wrong passwords each fail after the auth failure delay.
async fn assert_password_guessing_is_slowed(env: &Env) {
    let port = env.down_port;
    // Password guessing is slowed down: each failure comes after limits.auth_failure_delay_ms.
    for _ in 0..2 {
        let t = Instant::now();
        let (ok, _, err) = psql_repl(
            &env.primary,
            &repl_conninfo(port),
            "guess",
            "IDENTIFY_SYSTEM",
        );
        assert!(
            !ok && err.contains("password authentication failed"),
            "{err}"
        );
        assert!(
            t.elapsed() >= Duration::from_millis(900),
            "failure after {:?}",
            t.elapsed()
        );
    }
}

async fn primary(root: &TempRoot) -> Cluster {
    let p = Cluster::init_primary(&install(), root, "primary", &PrimaryOpts::default()).unwrap();
    p.start().await.unwrap();
    p.create_replication_user(REPL_PASSWORD).await.unwrap();
    p
}

fn tls_link(ca: &std::path::Path, cert: &CertFiles) -> String {
    format!(
        "tls_cert = \"{}\"\ntls_key = \"{}\"\ntls_ca = \"{}\"\n",
        cert.cert.display(),
        cert.key.display(),
        ca.display()
    )
}

/// The first bytes of a TLS ClientHello, and no more: a handshake that stalls.
const PARTIAL_CLIENT_HELLO: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_link_handshakes_are_cut_and_the_downstream_connects() {
    let root = TempRoot::new().unwrap();
    let dir = root.path();
    let p = primary(&root).await;
    let pki = issue_link_certificates(dir);
    let (up, mport) = (free_port(), free_port());
    let upstream = start_tls_upstream(dir, &p, &pki, up, mport);

    let mut stalled = stall_handshakes(up).await;
    let mut silent = silent_after_mutual_tls(&pki, up).await;
    // A real downstream connects and serves a standby-side client meanwhile.
    let down = free_port();
    let downstream = start_tls_downstream(dir, &pki, (up, down), "", "");
    let (ok, out, err) = psql_repl(
        &p,
        &repl_conninfo(down),
        STANDBY_PASSWORD,
        "IDENTIFY_SYSTEM",
    );
    assert!(ok, "{out} {err}\n{}", downstream.log_text());

    assert_stalled_and_silent_peers_are_cut(&mut stalled, &mut silent).await;
    assert_cuts_are_logged(&upstream).await;
    assert_handshake_failures_are_counted(mport);
    upstream.assert_no_panic();
    downstream.assert_no_panic();
}

/// The link's TLS material: the CA's certificate, the upstream's and the downstream's.
struct Pki {
    ca_pem: std::path::PathBuf,
    server: CertFiles,
    client: CertFiles,
}

/// Makes a CA in `dir` and issues the upstream's (server) and downstream's (client)
/// certificates.
fn issue_link_certificates(dir: &std::path::Path) -> Pki {
    let ca = Ca::new("walrelay test CA").unwrap();
    let ca_pem = ca.write_ca(dir, "ca").unwrap();
    let server = ca
        .issue(dir, "upstream", &["localhost", "127.0.0.1"])
        .unwrap();
    let client = ca.issue(dir, "downstream", &["downstream"]).unwrap();
    Pki {
        ca_pem,
        server,
        client,
    }
}

/// Starts an upstream on `up` for `p` with a TLS link, a 3 s startup deadline, 4 startups per
/// address, and metrics on `mport`.
fn start_tls_upstream(dir: &std::path::Path, p: &Cluster, pki: &Pki, up: u16, mport: u16) -> Relay {
    Relay::start(
        dir,
        "upstream",
        &format!(
            "[upstream]\nprimary = \"host=127.0.0.1 port={} user={STANDBY_USER} password={REPL_PASSWORD} sslmode=disable\"\nlisten = \"127.0.0.1:{up}\"\n\n[link]\n{}\n[limits]\nstartup_timeout_secs = 3\nmax_startups_per_address = 4\n\n[metrics]\nlisten = \"127.0.0.1:{mport}\"\n",
            p.port(),
            tls_link(&pki.ca_pem, &pki.server)
        ),
        None,
        Some(up),
    )
}

/// Opens ten connections to the link port `up` from another host, every other one stalled
/// inside a ClientHello.
async fn stall_handshakes(up: u16) -> Vec<TcpStream> {
    // Ten connections from another host: idle, or stalled inside a ClientHello.
    let mut stalled = Vec::new();
    for i in 0..10 {
        let mut s = connect_from("127.0.0.2", up).await;
        if i % 2 == 0 {
            s.write_all(PARTIAL_CLIENT_HELLO).await.unwrap();
        }
        stalled.push(s);
    }
    stalled
}

/// Completes mutual TLS with the link port `up` from a third host, with a valid client
/// certificate, and returns the connection (which then says nothing).
async fn silent_after_mutual_tls(pki: &Pki, up: u16) -> tokio_rustls::client::TlsStream<TcpStream> {
    // One from a third address with a valid client certificate: it completes mutual TLS,
    // then says nothing (no HTTP/2 preface). Before, it held its socket for good.
    walrelay::tls::install_default_provider();
    let tls = walrelay::link::tls::client_config(&walrelay::config::LinkConfig {
        tls_ca: Some(pki.ca_pem.clone()),
        tls_cert: Some(pki.client.cert.clone()),
        tls_key: Some(pki.client.key.clone()),
        ..Default::default()
    })
    .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost".to_string()).unwrap();
    tokio_rustls::TlsConnector::from(tls)
        .connect(name, connect_from("127.0.0.3", up).await)
        .await
        .expect("mutual TLS with a valid certificate")
}

/// Starts a downstream on `down` with a TLS link to the upstream on `up`; `extra` goes into
/// `[downstream]`, `tail` after `[link]` (more sections).
fn start_tls_downstream(
    dir: &std::path::Path,
    pki: &Pki,
    (up, down): (u16, u16),
    extra: &str,
    tail: &str,
) -> Relay {
    Relay::start(
        dir,
        "downstream",
        &format!(
            "[downstream]\nlisten = \"127.0.0.1:{down}\"\nupstream = \"localhost:{up}\"\nauth = \"scram-sha-256\"\nusers = {{ {STANDBY_USER} = \"{}\" }}\nspool_dir = \"{}\"\n{extra}\n[link]\n{}connect_timeout_secs = 3\n{tail}",
            walrelay_pgwire::scram::new_verifier(STANDBY_PASSWORD),
            dir.join("spool").display(),
            tls_link(&pki.ca_pem, &pki.client)
        ),
        Some(down),
        None,
    )
}

/// Checks that the upstream closes every stalled connection and the silent TLS peer.
async fn assert_stalled_and_silent_peers_are_cut(
    stalled: &mut [TcpStream],
    silent: &mut tokio_rustls::client::TlsStream<TcpStream>,
) {
    // Every stalled connection is closed by the upstream (3 s deadline; before #14: 300 s).
    for s in stalled {
        let (_, closed) = read_to_close(s, Duration::from_secs(30)).await;
        assert!(closed, "a stalled link handshake was held for 30 s");
    }
    let mut buf = [0u8; 64];
    let r = tokio::time::timeout(Duration::from_secs(30), silent.read(&mut buf)).await;
    assert!(
        matches!(r, Ok(Ok(0) | Err(_))),
        "a link peer silent after mutual TLS was held for 30 s (or sent to): {r:?}"
    );
}

/// Checks the upstream's log for the silent peer, the stalled handshakes and the per-address
/// limit.
async fn assert_cuts_are_logged(upstream: &Relay) {
    // Logged with the peer and the reason (the socket closes as the deadline ends, the line
    // follows), and counted.
    let silent_logged = || {
        let log = upstream.log_text();
        log.contains("127.0.0.3")
            && log.contains("no HTTP/2 preface within limits.startup_timeout_secs after the TLS")
    };
    let until = Instant::now() + Duration::from_secs(10);
    while !silent_logged() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = upstream.log_text();
    assert!(silent_logged(), "{log}");
    assert!(
        log.contains("127.0.0.2")
            && log.contains("no TLS handshake within limits.startup_timeout_secs"),
        "{log}"
    );
    assert!(
        log.contains("limits.max_startups_per_address reached"),
        "{log}"
    );
}

/// Checks that the metrics on `mport` count handshake failures for timeouts and for a busy
/// port.
fn assert_handshake_failures_are_counted(mport: u16) {
    let samples = prom::parse_exposition(&http_get(mport, "/metrics").1);
    let failures = |reason: &str| {
        samples
            .iter()
            .find(|s| {
                s.name == "walrelay_link_handshake_failures_total"
                    && s.labels.get("reason").map(String::as_str) == Some(reason)
            })
            .map(|s| s.value)
            .unwrap_or_else(|| {
                panic!("no walrelay_link_handshake_failures_total{{reason={reason:?}}}")
            })
    };
    assert!(failures("timeout") >= 1.0 && failures("busy") >= 1.0);
}

/// GET `path` on 127.0.0.1:`port` with a fresh connection: (status, body); status 0 when the
/// connection was closed without an answer.
fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes());
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let resp = String::from_utf8_lossy(&raw);
    let Some((head, body)) = resp.split_once("\r\n\r\n") else {
        return (0, String::new());
    };
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_and_livez_answer_while_the_metrics_port_is_saturated() {
    let root = TempRoot::new().unwrap();
    let p = primary(&root).await;
    let (up, mport) = (free_port(), free_port());
    let relay = Relay::start(
        root.path(),
        "relay",
        &format!(
            "[upstream]\nprimary = \"host=127.0.0.1 port={} user={STANDBY_USER} password={REPL_PASSWORD} sslmode=disable\"\nlisten = \"127.0.0.1:{up}\"\n[link]\nplaintext = true\n[metrics]\nlisten = \"127.0.0.1:{mport}\"\n",
            p.port()
        ),
        None,
        Some(up),
    );
    assert_eq!(http_get(mport, "/healthz").0, 200);
    assert_eq!(http_get(mport, "/livez"), (200, "ok\n".to_string()));

    // 48 clients that ask for /metrics a thousand times in one go and never read: each
    // connection the server takes stays blocked writing answers (up to its 60 s limit).
    let request = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(3000);
    let mut hogs = Vec::new();
    for _ in 0..48 {
        let mut s = TcpStream::connect(("127.0.0.1", mport)).await.unwrap();
        let request = request.clone();
        hogs.push(tokio::spawn(async move {
            let _ = s.write_all(request.as_bytes()).await;
            // Holds the connection, unread, until the test ends.
            std::future::pending::<()>().await;
            drop(s);
        }));
    }
    // The port's 32 connections are taken; /metrics gets no answer or 503...
    // ...and /healthz is answered all the same (the probe lane).
    wait_until(
        "/healthz answers 200 on a saturated metrics port",
        Duration::from_secs(15),
        || async move {
            let (status, body) = tokio::task::spawn_blocking(move || http_get(mport, "/healthz"))
                .await
                .unwrap();
            assert!(status == 200 || status == 0, "/healthz: {status} {body}");
            Ok(status == 200 && body == "ok\n")
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", relay.log_text()));
    // So is /livez, which the Kubernetes probes ask for (deploy/k8s).
    wait_until(
        "/livez answers 200 on a saturated metrics port",
        Duration::from_secs(15),
        || async move {
            let (status, body) = tokio::task::spawn_blocking(move || http_get(mport, "/livez"))
                .await
                .unwrap();
            assert!(status == 200 || status == 0, "/livez: {status} {body}");
            Ok(status == 200 && body == "ok\n")
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", relay.log_text()));
    let (status, _) = tokio::task::spawn_blocking(move || http_get(mport, "/metrics"))
        .await
        .unwrap();
    assert!(
        status == 503 || status == 0,
        "/metrics answered {status} on a saturated port"
    );
    for h in hogs {
        h.abort();
    }
    relay.assert_no_panic();
}

/// A peer that fails handshakes in a loop, on the link port and on the standby port, gets at
/// most `max_startups_per_address` failures per `limits.auth_failure_delay_ms` (here 4 per
/// second): each failed connection keeps its startup place that long after it is closed.
/// Before, a peer without a client certificate had the upstream sign handshake after
/// handshake, as fast as it could ask.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_failing_in_a_loop_are_held_to_the_per_address_budget() {
    let root = TempRoot::new().unwrap();
    let dir = root.path();
    let p = primary(&root).await;
    let pki = issue_link_certificates(dir);
    let (up, mport) = (free_port(), free_port());
    let upstream = start_tls_upstream(dir, &p, &pki, up, mport);
    let (down, dport) = (free_port(), free_port());
    // TLS toward standbys too, and metrics to count the refusals.
    let downstream = start_tls_downstream(
        dir,
        &pki,
        (up, down),
        &format!(
            "tls_cert = \"{}\"\ntls_key = \"{}\"\n",
            pki.server.cert.display(),
            pki.server.key.display()
        ),
        &format!("\n[limits]\nmax_startups_per_address = 4\n\n[metrics]\nlisten = \"127.0.0.1:{dport}\"\n"),
    );

    // The link port: TLS handshakes without a client certificate, for 2.5 s.
    walrelay::tls::install_default_provider();
    let tls = walrelay::link::tls::client_config(&walrelay::config::LinkConfig {
        tls_ca: Some(pki.ca_pem.clone()),
        ..Default::default()
    })
    .unwrap();
    let connector = tokio_rustls::TlsConnector::from(tls);
    let no_certificate = || async {
        let name = rustls::pki_types::ServerName::try_from("localhost".to_string()).unwrap();
        if let Ok(mut s) = connector
            .connect(name, connect_from("127.0.0.5", up).await)
            .await
        {
            // TLS 1.3: the server refuses the missing certificate after the client is done.
            let _ = tokio::time::timeout(Duration::from_secs(5), s.read(&mut [0u8; 64])).await;
        }
    };
    // (The harness's readiness probes count too: only what the loop adds is looked at.)
    let before = counter(mport, "walrelay_link_handshake_failures_total", "tls");
    let tries = for_a_while(Duration::from_millis(2500), no_certificate).await;
    let failed = counter(mport, "walrelay_link_handshake_failures_total", "tls") - before;
    let busy = counter(mport, "walrelay_link_handshake_failures_total", "busy");
    // At once, then after 1 s and after 2 s: four handshakes each time.
    assert!(
        failed <= 12.0 && busy >= 1.0,
        "{tries} tries: {failed} handshakes failed, {busy} refused"
    );
    // The places come back once the delay is over.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    no_certificate().await;
    let again = counter(mport, "walrelay_link_handshake_failures_total", "tls") - before;
    assert_eq!(again, failed + 1.0);

    // The standby port: SSLRequest, then application data where the ClientHello belongs.
    let bad_tls = || async {
        let mut s = connect_from("127.0.0.6", down).await;
        let _ = s.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]).await;
        let mut answer = [0u8; 1];
        if matches!(s.read(&mut answer).await, Ok(1)) && answer[0] == b'S' {
            let _ = s.write_all(&[0x17, 0x03, 0x03, 0x00, 0x01, 0x00]).await;
            read_to_close(&mut s, Duration::from_secs(5)).await;
        }
    };
    let before = counter(dport, "walrelay_connections_refused_total", "tls_handshake");
    let tries = for_a_while(Duration::from_millis(2500), bad_tls).await;
    let failed = counter(dport, "walrelay_connections_refused_total", "tls_handshake") - before;
    let busy = counter(
        dport,
        "walrelay_connections_refused_total",
        "max_startups_per_address",
    );
    assert!(
        failed <= 12.0 && busy >= 1.0,
        "{tries} tries: {failed} handshakes failed, {busy} refused"
    );
    assert!(failed >= 1.0);
    upstream.assert_no_panic();
    downstream.assert_no_panic();
}

/// Runs `attempt` again and again for `span`; returns how many times it ran.
async fn for_a_while<F, Fut>(span: Duration, attempt: F) -> usize
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let until = Instant::now() + span;
    let mut n = 0;
    while Instant::now() < until {
        attempt().await;
        n += 1;
    }
    n
}

/// The value of counter `name` with `reason` on the metrics port `port`.
fn counter(port: u16, name: &str, reason: &str) -> f64 {
    prom::parse_exposition(&http_get(port, "/metrics").1)
        .iter()
        .find(|s| s.name == name && s.labels.get("reason").map(String::as_str) == Some(reason))
        .map(|s| s.value)
        .unwrap_or_else(|| panic!("no {name}{{reason={reason:?}}}"))
}
