//! Malformed input on the standby-facing socket: every case gets an ErrorResponse or a clean
//! close, quickly; the relay never panics and keeps serving well-behaved standbys.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use bytes::{BufMut, BytesMut};
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use walrelay_pgwire::{encode, parse_tagged, ErrorFields};

/// Sends `bytes` and collects every message until the server closes (at most 10 s).
fn exchange(port: u16, bytes: &[u8], close_write: bool) -> (Vec<(u8, Vec<u8>)>, Duration) {
    let started = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(bytes);
    if close_write {
        let _ = s.shutdown(std::net::Shutdown::Write);
    }
    let mut all = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => all.extend_from_slice(&buf[..n]),
        }
        if started.elapsed() > Duration::from_secs(10) {
            break;
        }
    }
    let mut b = BytesMut::from(&all[..]);
    let mut msgs = Vec::new();
    while let Ok(Some(m)) = parse_tagged(&mut b, |_| 1 << 20) {
        msgs.push((m.tag, m.body.to_vec()));
    }
    (msgs, started.elapsed())
}

fn error_of(msgs: &[(u8, Vec<u8>)]) -> Option<ErrorFields> {
    msgs.iter()
        .find(|(t, _)| *t == b'E')
        .map(|(_, b)| ErrorFields::parse(b).unwrap())
}

fn startup(params: &[(&str, &str)]) -> BytesMut {
    let mut b = BytesMut::new();
    encode::startup(&mut b, params);
    b
}

const REPL: &[(&str, &str)] = &[
    ("user", "replicator"),
    ("replication", "true"),
    ("application_name", "probe"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_gets_an_error_or_a_clean_close() {
    let env = env(EnvOpts {
        trust: true,
        extra_toml: "auth_timeout_secs = 2".into(),
        ..Default::default()
    })
    .await;
    let port = env.down_port;

    // Garbage before startup.
    let (msgs, took) = exchange(port, b"GET / HTTP/1.1\r\nHost: relay\r\n\r\n", false);
    assert!(
        error_of(&msgs).is_some_and(|e| e.code == "08P01"),
        "{msgs:?}"
    );
    assert!(took < Duration::from_secs(5));

    // An absurd startup length is refused without waiting for the bytes.
    let (msgs, _) = exchange(port, &[0x7f, 0xff, 0xff, 0xff, 0, 3, 0, 0], false);
    assert!(
        error_of(&msgs).is_some_and(|e| e.message.contains("invalid startup packet length")),
        "{msgs:?}"
    );

    // Truncated startup, then the client closes: a clean close.
    let (msgs, took) = exchange(port, &startup(REPL)[..7], true);
    assert!(msgs.iter().all(|(t, _)| *t == b'E'), "{msgs:?}");
    assert!(took < Duration::from_secs(5));

    // A silent client is dropped after limits.auth_timeout_secs.
    let (_, took) = exchange(port, b"", false);
    assert!(
        took < Duration::from_secs(8),
        "silent client held for {took:?}"
    );

    // Protocol 2.
    let (msgs, _) = exchange(port, &[0, 0, 0, 8, 0, 2, 0, 0], false);
    assert!(error_of(&msgs).is_some(), "{msgs:?}");
    // An SQL session goes through a tunnel (#13): the allowlist refuses a write before it
    // reaches the primary, with a reason; the session goes on.
    let mut b = startup(&[("user", "replicator"), ("database", "postgres")]);
    encode::query(&mut b, "DELETE FROM pg_class");
    encode::terminate(&mut b);
    let (msgs, _) = exchange(port, &b, false);
    let tags: String = msgs.iter().map(|(t, _)| *t as char).collect();
    assert!(tags.ends_with("KZEZ"), "{tags} {msgs:?}");
    assert!(
        error_of(&msgs).is_some_and(|e| e.code == "42501" && e.message.contains("allow_sql")),
        "{msgs:?}"
    );
    // A logical replication connection to a database that does not exist: the primary's own
    // error comes back.
    let (msgs, _) = exchange(
        port,
        &startup(&[("user", "replicator"), ("replication", "database")]),
        false,
    );
    assert!(
        error_of(&msgs)
            .is_some_and(|e| e.message.contains("database \"replicator\" does not exist")),
        "{msgs:?}"
    );
    let (msgs, _) = exchange(port, &startup(&[("replication", "true")]), false);
    assert!(
        error_of(&msgs).is_some_and(|e| e.code == "28000"),
        "{msgs:?}"
    );

    // After authentication: refused and empty commands get answers, the session goes on.
    let mut b = startup(REPL);
    encode::query(&mut b, "DROP_REPLICATION_SLOT some_slot");
    encode::query(&mut b, " ; ");
    encode::query(&mut b, "START_REPLICATION 0/XYZ");
    encode::query(&mut b, "IDENTIFY_SYSTEM");
    encode::terminate(&mut b);
    let (msgs, _) = exchange(port, &b, false);
    let tags: String = msgs.iter().map(|(t, _)| *t as char).collect();
    assert!(tags.starts_with('R'), "{tags} {msgs:?}");
    let after_ready = &tags[tags.find('Z').unwrap_or_else(|| panic!("{tags} {msgs:?}")) + 1..];
    // DROP_REPLICATION_SLOT (downstream.allow_slot_commands is off) → E Z; empty → I Z;
    // bad LSN → E Z; IDENTIFY_SYSTEM → T D C Z.
    assert_eq!(after_ready, "EZIZEZTDCZ", "{tags}");
    let errors: Vec<ErrorFields> = msgs
        .iter()
        .filter(|(t, _)| *t == b'E')
        .map(|(_, b)| ErrorFields::parse(b).unwrap())
        .collect();
    assert_eq!(errors[0].code, "42501");
    assert!(errors[0].message.contains("allow_slot_commands"));
    assert_eq!(errors[1].code, "42601");

    // After authentication: an absurd message length, an extended-protocol message, CopyData
    // outside COPY with a bad shape: each a FATAL and a close.
    for (what, tail) in [
        ("absurd length", vec![b'Q', 0x7f, 0xff, 0xff, 0xff]),
        ("Parse message", {
            let mut t = BytesMut::new();
            encode::tagged(&mut t, b'P', |b| b.put_slice(b"\0select 1\0\0\0"));
            t.to_vec()
        }),
        ("bad CopyData", {
            let mut t = BytesMut::new();
            encode::copy_data(&mut t, b"zzz");
            t.to_vec()
        }),
    ] {
        let mut b = startup(REPL);
        b.extend_from_slice(&tail);
        let (msgs, took) = exchange(port, &b, false);
        let e = msgs
            .iter()
            .filter(|(t, _)| *t == b'E')
            .map(|(_, b)| ErrorFields::parse(b).unwrap())
            .next_back();
        assert!(
            e.as_ref()
                .is_some_and(|e| e.severity == "FATAL" && e.code == "08P01"),
            "{what}: {msgs:?}"
        );
        assert!(took < Duration::from_secs(8), "{what}: took {took:?}");
    }

    // Many bad clients at once.
    let handles: Vec<_> = (0..40u8)
        .map(|i| std::thread::spawn(move || exchange(port, &[i; 64], i % 2 == 0)))
        .collect();
    for h in handles {
        h.join().unwrap();
    }

    // The relay is alive, never panicked, and still serves a real standby.
    env.primary
        .execute("create table still_ok as select 1 as x")
        .await
        .unwrap();
    env.wait_caught_up().await;
    assert_eq!(
        env.standby
            .query_one_string("select x::text from still_ok")
            .await
            .unwrap(),
        "1"
    );
    let mut relay = env.relay;
    assert!(relay.is_running());
    relay.assert_no_panic();
}
