//! Malformed input on the standby-facing socket: every case gets an ErrorResponse or a clean
//! close, quickly; the relay never panics and keeps serving well-behaved standbys.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;
#[path = "malformed/pre_auth.rs"]
mod pre_auth;

use bytes::{BufMut, BytesMut};
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use walrelay_harness::cluster::wait_until;
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

    assert_bad_startups_are_refused(port);
    pre_auth::assert_encryption_requests_are_answered_once(port);
    pre_auth::assert_peer_text_stays_on_its_log_line(port, &env.relay);
    assert_sessions_that_are_not_physical_get_answers(port);
    assert_refused_and_empty_commands_are_answered(port);
    assert_overlong_names_and_commands_are_refused(port);
    assert_idle_clients_sockets_keep_alive(port, env.relay.pid().expect("running"));
    assert_bad_messages_after_auth_are_fatal(port);
    flood_with_bad_clients(port);
    assert_still_serves_a_standby(env).await;
}

/// Checks what comes before a startup is accepted: garbage, absurd lengths, truncated or
/// silent clients, protocol 2.
fn assert_bad_startups_are_refused(port: u16) {
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

    // Protocol 2: "feature not supported", as PostgreSQL answers it.
    let (msgs, _) = exchange(port, &[0, 0, 0, 8, 0, 2, 0, 0], false);
    assert!(
        error_of(&msgs).is_some_and(|e| e.code == "0A000"),
        "{msgs:?}"
    );
}

/// Checks the answers to an SQL session, a logical replication session to a missing database
/// and a startup without a user.
fn assert_sessions_that_are_not_physical_get_answers(port: u16) {
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
    // The extended protocol (refused without allow_sql) is answered as PostgreSQL answers an
    // error in it: one ErrorResponse, the messages up to Sync dropped, one ReadyForQuery at the
    // Sync; the next (refused) simple query is answered in step.
    let mut b = startup(&[("user", "replicator"), ("database", "postgres")]);
    for (tag, body) in [
        (b'P', &b"\0select 1\0\0\0"[..]),
        (b'B', &b"\0\0\0\0\0\0\0\0\0\0"[..]),
        (b'D', &b"P\0"[..]),
        (b'E', &b"\0\0\0\0\0"[..]),
        (b'S', &b""[..]),
    ] {
        encode::tagged(&mut b, tag, |o| o.put_slice(body));
    }
    encode::query(&mut b, "DELETE FROM pg_class");
    encode::terminate(&mut b);
    let (msgs, _) = exchange(port, &b, false);
    let tags: String = msgs.iter().map(|(t, _)| *t as char).collect();
    assert!(tags.ends_with("KZEZEZ"), "{tags} {msgs:?}");
    assert!(
        error_of(&msgs).is_some_and(|e| e.code == "0A000"),
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
}

/// Checks that refused and empty commands after authentication get answers and the session
/// goes on.
fn assert_refused_and_empty_commands_are_answered(port: u16) {
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
    // DROP_REPLICATION_SLOT (downstream.allow_slot_commands is off) → E Z; empty → E Z (SQL
    // to PostgreSQL 15+, refused on a physical connection); bad LSN → E Z; IDENTIFY_SYSTEM →
    // T D C Z.
    assert_eq!(after_ready, "EZEZEZTDCZ", "{tags}");
    let errors: Vec<ErrorFields> = msgs
        .iter()
        .filter(|(t, _)| *t == b'E')
        .map(|(_, b)| ErrorFields::parse(b).unwrap())
        .collect();
    assert_eq!(errors[0].code, "42501");
    assert!(errors[0].message.contains("allow_slot_commands"));
    assert_eq!(errors[1].code, "0A000");
    assert_eq!(errors[2].code, "42601");
}

/// Checks that what would not fit in a link item (an application_name or a relayed command
/// over `frame::MAX_CONTROL_ITEM`) is refused here, with its reason, before it could end the
/// link's stream that every standby shares.
fn assert_overlong_names_and_commands_are_refused(port: u16) {
    let long = "a".repeat(5000);
    let b = startup(&[
        ("user", "replicator"),
        ("replication", "true"),
        ("application_name", &long),
    ]);
    let (msgs, took) = exchange(port, &b, false);
    let e = error_of(&msgs).unwrap_or_else(|| panic!("{msgs:?}"));
    assert_eq!(
        (e.severity.as_str(), e.code.as_str()),
        ("FATAL", "54000"),
        "{e:?}"
    );
    assert!(
        e.message.contains("application_name of at most 1024 bytes"),
        "{e:?}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");

    // SHOW of a name of 2,101 one-letter parts: within the command parser's limits, longer
    // than a link item. Refused; the session goes on.
    let mut b = startup(REPL);
    encode::query(&mut b, &format!("SHOW {}a", "a.".repeat(2100)));
    encode::query(&mut b, "IDENTIFY_SYSTEM");
    encode::terminate(&mut b);
    let (msgs, _) = exchange(port, &b, false);
    let tags: String = msgs.iter().map(|(t, _)| *t as char).collect();
    let after_ready = &tags[tags.find('Z').unwrap_or_else(|| panic!("{tags} {msgs:?}")) + 1..];
    assert_eq!(after_ready, "EZTDCZ", "{tags} {msgs:?}");
    let e = error_of(&msgs).unwrap();
    assert_eq!(
        (e.severity.as_str(), e.code.as_str()),
        ("ERROR", "54000"),
        "{e:?}"
    );
    assert!(e.message.contains("was not sent to the primary"), "{e:?}");
}

/// Checks that an idle client's socket has TCP keepalive on (as PostgreSQL's have), so that a
/// client whose host vanished between commands is found gone: the kernel's view of the
/// downstream's end of the connection shows its keepalive timer running.
fn assert_idle_clients_sockets_keep_alive(port: u16, relay: u32) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&startup(REPL)).unwrap();
    let mut buf = BytesMut::new();
    read_until(&mut s, &mut buf, b'Z');
    let client = s.local_addr().unwrap().port();
    // 02: the keepalive timer of the relay's end of the connection (00 would be none).
    let timers = tcp_timers_toward(relay, client);
    assert_eq!(timers, ["02"], "timer of the downstream's socket");
}

/// Checks that an absurd length or an extended-protocol message after authentication each
/// end the session with a FATAL, quickly, and that COPY messages outside COPY are ignored, as
/// PostgreSQL ignores them.
fn assert_bad_messages_after_auth_are_fatal(port: u16) {
    let mut b = startup(REPL);
    encode::copy_data(&mut b, b"zzz");
    encode::copy_done(&mut b);
    encode::tagged(&mut b, b'f', |b| b.put_slice(b"gave up\0"));
    encode::query(&mut b, "IDENTIFY_SYSTEM");
    encode::terminate(&mut b);
    let (msgs, took) = exchange(port, &b, false);
    let tags: String = msgs.iter().map(|(t, _)| *t as char).collect();
    let after_ready = &tags[tags.find('Z').unwrap_or_else(|| panic!("{tags} {msgs:?}")) + 1..];
    assert_eq!(after_ready, "TDCZ", "{tags} {msgs:?}");
    assert!(took < Duration::from_secs(8), "took {took:?}");

    // An absurd message length, an extended-protocol message: each a FATAL and a close.
    for (what, tail) in [
        ("absurd length", vec![b'Q', 0x7f, 0xff, 0xff, 0xff]),
        ("Parse message", {
            let mut t = BytesMut::new();
            encode::tagged(&mut t, b'P', |b| b.put_slice(b"\0select 1\0\0\0"));
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
}

/// Sends garbage from 40 clients at once, half of them closing their write side.
fn flood_with_bad_clients(port: u16) {
    // Many bad clients at once.
    let handles: Vec<_> = (0..40u8)
        .map(|i| std::thread::spawn(move || exchange(port, &[i; 64], i % 2 == 0)))
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// Checks that the relay is alive, never panicked, and still replicates to the standby.
async fn assert_still_serves_a_standby(env: Env) {
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

/// Reads messages from `s` until one with `tag` arrives (at most 30 s); returns it and all
/// read before it.
fn read_until(s: &mut TcpStream, buf: &mut BytesMut, tag: u8) -> Vec<(u8, Vec<u8>)> {
    let started = Instant::now();
    let mut msgs = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        while let Ok(Some(m)) = parse_tagged(buf, |_| 1 << 20) {
            msgs.push((m.tag, m.body.to_vec()));
            if m.tag == tag {
                return msgs;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no {:?} in {msgs:?}",
            tag as char
        );
        match s.read(&mut chunk) {
            Ok(0) => panic!("closed before {:?}: {msgs:?}", tag as char),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}: {msgs:?}"),
        }
    }
}

/// As PostgreSQL's walsender: a command during COPY BOTH is not answered with an ERROR while
/// streaming goes on; the session ends with FATAL "invalid standby message type".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_during_copy_ends_the_session() {
    let env = env(EnvOpts {
        trust: true,
        ..Default::default()
    })
    .await;
    let lsn = env
        .primary
        .query_one_string("select pg_current_wal_lsn()::text")
        .await
        .unwrap();
    let mut s = TcpStream::connect(("127.0.0.1", env.down_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = startup(&[
        ("user", "replicator"),
        ("replication", "true"),
        ("application_name", "copy_probe"),
    ]);
    encode::query(&mut b, &format!("START_REPLICATION PHYSICAL {lsn}"));
    s.write_all(&b).unwrap();
    let mut buf = BytesMut::new();
    read_until(&mut s, &mut buf, b'W');
    let mut b = BytesMut::new();
    encode::query(&mut b, "IDENTIFY_SYSTEM");
    s.write_all(&b).unwrap();
    let msgs = read_until(&mut s, &mut buf, b'E');
    let e = error_of(&msgs).unwrap();
    assert_eq!(
        (e.severity.as_str(), e.code.as_str()),
        ("FATAL", "08P01"),
        "{e:?}"
    );
    assert!(e.message.contains("invalid standby message type"), "{e:?}");
    // And the connection is closed: nothing but WAL or keepalives may still be in flight.
    let mut rest = Vec::new();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let closed = s.read_to_end(&mut rest).is_ok();
    assert!(closed, "the session went on after the command");
    env.relay.assert_no_panic();
}

/// A standby that claims to have flushed WAL it was never sent: the primary hears at most
/// what walrelay sent it (a synchronous commit must not return on such a claim).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_updates_beyond_the_wal_sent_are_clamped() {
    let env = env(EnvOpts {
        trust: true,
        ..Default::default()
    })
    .await;
    let lsn = env
        .primary
        .query_one_string("select pg_current_wal_lsn()::text")
        .await
        .unwrap();
    let mut s = TcpStream::connect(("127.0.0.1", env.down_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = startup(&[
        ("user", "replicator"),
        ("replication", "true"),
        ("application_name", "clamp_probe"),
    ]);
    encode::query(&mut b, &format!("START_REPLICATION PHYSICAL {lsn}"));
    s.write_all(&b).unwrap();
    let mut buf = BytesMut::new();
    read_until(&mut s, &mut buf, b'W');
    // write, flush and apply far in the future.
    let far: u64 = 0xFFFF_FFFF_0000_0000;
    let mut update = vec![b'r'];
    for v in [far, far, far, 0] {
        update.extend_from_slice(&v.to_be_bytes());
    }
    update.push(0);
    let mut b = BytesMut::new();
    encode::copy_data(&mut b, &update);
    s.write_all(&b).unwrap();

    let p = &env.primary;
    wait_until(
        "the probe's status update on the primary",
        TIMEOUT,
        || async move {
            let f = p
                .query_one_string("select coalesce((select flush_lsn::text from pg_stat_replication where application_name = 'clamp_probe'), '')")
                .await?;
            Ok(!f.is_empty())
        },
    )
    .await
    .unwrap();
    let ok = env
        .primary
        .query_one_string("select (flush_lsn <= pg_current_wal_flush_lsn() and write_lsn <= pg_current_wal_flush_lsn() and replay_lsn <= pg_current_wal_flush_lsn())::text from pg_stat_replication where application_name = 'clamp_probe'")
        .await
        .unwrap();
    let seen = env
        .primary
        .query_one_string("select write_lsn || ' ' || flush_lsn || ' ' || replay_lsn from pg_stat_replication where application_name = 'clamp_probe'")
        .await
        .unwrap();
    assert_eq!(ok, "true", "the primary believes the probe has {seen}");
    drop(s);
    env.relay.assert_no_panic();
}

/// With `allow_sql`, a `COPY ... FROM STDIN` through the extended protocol, as libpq sends it
/// (Parse Bind Describe Execute Sync, the data, CopyDone or CopyFail, Sync): the primary
/// ignores the Sync it reads in copy-in and answers the two Syncs with one ReadyForQuery. A
/// query the downstream refuses afterwards is still answered, in step with the primary's
/// answers (without the count of the Syncs in copy-in, it waited for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_after_an_extended_copy_in_is_answered() {
    let env = env(EnvOpts {
        trust: true,
        downstream_extra: "allow_sql = true".into(),
        ..Default::default()
    })
    .await;
    let p = &env.primary;
    p.execute("create table copied(x int); grant insert, select on copied to replicator")
        .await
        .unwrap();
    let mut s = TcpStream::connect(("127.0.0.1", env.down_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = startup(&[("user", "replicator"), ("database", "postgres")]);
    encode::query(&mut b, "SET default_transaction_read_only = off");
    s.write_all(&b).unwrap();
    let mut buf = BytesMut::new();
    read_until(&mut s, &mut buf, b'Z');
    let msgs = read_until(&mut s, &mut buf, b'Z');
    assert!(error_of(&msgs).is_none(), "{msgs:?}");

    let extended_copy = |b: &mut BytesMut| {
        for (tag, body) in [
            (b'P', &b"\0COPY copied FROM STDIN\0\0\0"[..]),
            (b'B', &b"\0\0\0\0\0\0\0\0"[..]),
            (b'D', &b"P\0"[..]),
            (b'E', &b"\0\0\0\0\0"[..]),
            (b'S', &b""[..]),
        ] {
            encode::tagged(b, tag, |o| o.put_slice(body));
        }
    };
    // One copy ends with CopyDone, the next with CopyFail (the primary's error, then its
    // ReadyForQuery at the Sync after it).
    for (done, error) in [(true, None), (false, Some("57014"))] {
        let mut b = BytesMut::new();
        extended_copy(&mut b);
        s.write_all(&b).unwrap();
        let msgs = read_until(&mut s, &mut buf, b'G');
        assert!(error_of(&msgs).is_none(), "{msgs:?}");
        let mut b = BytesMut::new();
        encode::copy_data(&mut b, b"1\n2\n");
        match done {
            true => encode::copy_done(&mut b),
            false => encode::tagged(&mut b, b'f', |o| o.put_slice(b"changed my mind\0")),
        }
        encode::tagged(&mut b, b'S', |_| {});
        s.write_all(&b).unwrap();
        let msgs = read_until(&mut s, &mut buf, b'Z');
        assert_eq!(
            error_of(&msgs).map(|e| e.code),
            error.map(String::from),
            "{msgs:?}"
        );
    }

    // Refused by the downstream (not valid UTF-8), then a query the primary answers.
    let mut b = BytesMut::new();
    encode::tagged(&mut b, b'Q', |o| o.put_slice(b"SELECT '\xff'\0"));
    encode::query(&mut b, "SELECT count(*) FROM copied");
    s.write_all(&b).unwrap();
    let msgs = read_until(&mut s, &mut buf, b'Z');
    assert!(
        error_of(&msgs).is_some_and(|e| e.code == "22021"),
        "{msgs:?}"
    );
    let msgs = read_until(&mut s, &mut buf, b'Z');
    let tags: String = msgs.iter().map(|(t, _)| *t as char).collect();
    assert_eq!(tags, "TDCZ", "{msgs:?}");
    assert!(msgs[1].1.ends_with(b"2"), "{msgs:?}");
    env.relay.assert_no_panic();
}
