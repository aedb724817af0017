//! Everything a far-datacenter client does over its connection (#13): protocol negotiation,
//! and the sessions the downstream carries to the primary through a tunnel on the link
//! (base backups, logical replication, slot synchronization), each checked end to end with
//! real PostgreSQL clients and clusters and the real binary as separate halves.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use bytes::BytesMut;
use common::split::{Split, SplitOpts};
use common::*;
use walrelay_pgwire::{encode, parse_tagged};

/// psql 18 asking for protocol 3.2 gets NegotiateProtocolVersion (3.0) and works; a startup
/// packet with an unknown `_pq_.` option gets the option listed back, and the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_3_2_and_unknown_options_are_negotiated() {
    let env = Split::new(SplitOpts::default()).await;
    let pg18 = walrelay_harness::cluster::majors::install_for_major(18)
        .expect("PostgreSQL 18 client programs (scripts/install-pg-majors.sh)");
    let conninfo = format!(
        "host=127.0.0.1 port={} user={STANDBY_USER} replication=true max_protocol_version=3.2 min_protocol_version=3.0",
        env.down_port
    );
    let out = std::process::Command::new(pg18.bin("psql"))
        .args([&conninfo, "-XAt", "-c", "IDENTIFY_SYSTEM"])
        .env("PGPASSWORD", STANDBY_PASSWORD)
        .env("PGCONNECT_TIMEOUT", "20")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "psql 18 failed: {stderr}");
    let sysid = env
        .primary
        .query_one_string("select system_identifier::text from pg_control_system()")
        .await
        .unwrap();
    assert!(stdout.starts_with(&format!("{sysid}|")), "{stdout}");

    // A 3.0 client whose startup carries `_pq_.` options: 'v' names them, then the
    // authentication request follows (the session goes on).
    let mut pkt = BytesMut::new();
    encode::startup(
        &mut pkt,
        &[
            ("user", STANDBY_USER),
            ("replication", "true"),
            ("_pq_.walrelay_test", "1"),
        ],
    );
    let mut s = std::net::TcpStream::connect(("127.0.0.1", env.down_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&pkt).unwrap();
    let mut got = BytesMut::new();
    let mut msgs = Vec::new();
    let mut buf = [0u8; 4096];
    while msgs.len() < 2 {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed after {msgs:?}");
        got.extend_from_slice(&buf[..n]);
        while let Some(m) = parse_tagged(&mut got, |_| 1 << 16).unwrap() {
            msgs.push(m);
        }
    }
    assert_eq!(msgs[0].tag, b'v');
    assert_eq!(
        &msgs[0].body[..],
        b"\0\x03\0\0\0\0\0\x01_pq_.walrelay_test\0"
    );
    assert_eq!(
        msgs[1].tag, b'R',
        "authentication request after negotiation"
    );
}
