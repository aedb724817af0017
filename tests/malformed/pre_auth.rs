//! What a client gets before authentication: encryption requests answered once, and the
//! text it chose kept to its own log line, within the log budget.

use super::*;

/// Each encryption request is answered once, as PostgreSQL's ProcessStartupPacket answers
/// them (no TLS configured here): a GSSENCRequest, then an SSLRequest (libpq's order with
/// gssencmode=prefer) each get 'N' and the startup goes on; a second SSLRequest is, to
/// PostgreSQL, a startup packet of protocol 1234.5679, refused with 0A000, not answered 'N'
/// again and again until the deadline.
pub(crate) fn assert_encryption_requests_are_answered_once(port: u16) {
    let mut ssl = BytesMut::new();
    encode::ssl_request(&mut ssl);
    let gss = [0u8, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30];
    let connect = || {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    };
    let answer = |s: &mut TcpStream, request: &[u8]| {
        s.write_all(request).unwrap();
        let mut a = [0u8; 1];
        s.read_exact(&mut a).unwrap();
        a[0]
    };
    let mut s = connect();
    assert_eq!(answer(&mut s, &gss), b'N');
    assert_eq!(answer(&mut s, &ssl), b'N');
    s.write_all(&startup(REPL)).unwrap();
    let msgs = read_until(&mut s, &mut BytesMut::new(), b'Z');
    assert!(error_of(&msgs).is_none(), "{msgs:?}");

    for request in [&ssl[..], &gss[..]] {
        let mut s = connect();
        assert_eq!(answer(&mut s, request), b'N');
        let started = Instant::now();
        s.write_all(request).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        let mut b = BytesMut::from(&rest[..]);
        let e = parse_tagged(&mut b, |_| 1 << 20)
            .ok()
            .flatten()
            .filter(|m| m.tag == b'E')
            .map(|m| ErrorFields::parse(&m.body).unwrap());
        let e = e.unwrap_or_else(|| panic!("no ErrorResponse: {rest:?}"));
        assert_eq!(e.code, "0A000", "{e}");
        assert!(e.message.contains("1234.56"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}

/// A refused `replication` value is logged (before authentication) with its control
/// characters escaped: a newline in it cannot start a log line of the client's making.
pub(crate) fn assert_peer_text_stays_on_its_log_line(port: u16, relay: &Relay) {
    let b = startup(&[("user", "probe"), ("replication", "x\nFORGED-REPL")]);
    let (msgs, _) = exchange(port, &b, false);
    assert!(
        error_of(&msgs).is_some_and(|e| e.code == "22023"),
        "{msgs:?}"
    );
    let started = Instant::now();
    while !relay.log_text().contains("FORGED-REPL") {
        assert!(started.elapsed() < Duration::from_secs(5), "not logged");
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = relay.log_text();
    let forged: Vec<&str> = log.lines().filter(|l| l.starts_with("FORGED")).collect();
    assert!(forged.is_empty(), "{forged:?}");
    assert!(log.contains("\"x\\nFORGED-REPL\""), "{log}");

    // Refused values in a loop: logged within the budget of refusals before authentication
    // (20 a minute), each line short.
    // (20 a minute), each line short. Each refusal holds its startup place for
    // auth_failure_delay_ms: one refused for that (53300) is tried again.
    let long = format!("x{}", "y".repeat(9000));
    let b = startup(&[("user", "probe"), ("replication", &long)]);
    let mut refused = 0;
    while refused < 30 {
        let e = error_of(&exchange(port, &b, false).0).expect("an error");
        match e.code.as_str() {
            "22023" => refused += 1,
            "53300" => std::thread::sleep(Duration::from_millis(100)),
            _ => panic!("{e}"),
        }
    }
    // The places come back after the delay, for the checks after this one.
    std::thread::sleep(Duration::from_millis(1500));
    let log = relay.log_text();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("refused a startup packet"))
        .collect();
    assert!(lines.len() <= 20, "{} lines", lines.len());
    assert!(lines.iter().all(|l| l.len() < 1000), "{lines:?}");

    // So are cancel requests that name no session, which anyone can send in a loop.
    for pid in 1..=30 {
        let mut b = BytesMut::new();
        encode::cancel_request(&mut b, pid, 7);
        let (msgs, _) = exchange(port, &b, false);
        assert!(msgs.is_empty(), "{msgs:?}");
    }
    let log = relay.log_text();
    let lines = log.lines().filter(|l| l.contains("names no live tunnel"));
    assert!(lines.count() <= 20);
}
