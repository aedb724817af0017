use super::*;
use proptest::prelude::*;

fn startup_bytes(params: &[(&str, &str)]) -> BytesMut {
    let mut b = BytesMut::new();
    encode::startup(&mut b, params);
    b
}

#[test]
fn startup_round_trip_and_partial_input() {
    let full = startup_bytes(&[
        ("user", "replicator"),
        ("replication", "true"),
        ("application_name", "s1"),
    ]);
    // Every prefix is incomplete and consumes nothing.
    for n in 0..full.len() {
        let mut part = BytesMut::from(&full[..n]);
        assert!(parse_startup(&mut part).unwrap().is_none());
        assert_eq!(part.len(), n);
    }
    let mut b = full.clone();
    match parse_startup(&mut b).unwrap().unwrap() {
        StartupPacket::Startup { minor, params } => {
            assert_eq!(minor, 0);
            assert_eq!(
                StartupPacket::param(&params, "application_name"),
                Some("s1")
            );
            assert_eq!(params.len(), 3);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(b.is_empty());
}

#[test]
fn ssl_and_cancel_requests() {
    let mut b = BytesMut::new();
    encode::ssl_request(&mut b);
    assert_eq!(
        parse_startup(&mut b).unwrap(),
        Some(StartupPacket::SslRequest)
    );
    let mut b = BytesMut::from(
        &[
            0u8, 0, 0, 16, 0x04, 0xd2, 0x16, 0x2e, 0, 0, 0, 7, 0, 0, 0, 9,
        ][..],
    );
    assert_eq!(
        parse_startup(&mut b).unwrap(),
        Some(StartupPacket::Cancel { pid: 7, key: 9 })
    );
}

#[test]
fn absurd_lengths_are_refused_without_allocation() {
    let mut b = BytesMut::from(&[0x7f, 0xff, 0xff, 0xff, 0, 3, 0, 0][..]);
    assert!(matches!(
        parse_startup(&mut b),
        Err(WireError::StartupLength(_))
    ));
    let mut b = BytesMut::from(&[b'Q', 0x7f, 0xff, 0xff, 0xff][..]);
    assert!(matches!(
        parse_frontend(&mut b),
        Err(WireError::TooLong { .. })
    ));
    assert!(b.capacity() < 1 << 20);
    let mut b = BytesMut::from(&[b'Q', 0, 0, 0, 2][..]);
    assert!(matches!(
        parse_frontend(&mut b),
        Err(WireError::BadLength { .. })
    ));
}

#[test]
fn http_and_protocol_2_are_refused() {
    let mut b = BytesMut::from(&b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..]);
    assert!(parse_startup(&mut b).is_err());
    let mut b = BytesMut::from(&[0, 0, 0, 8, 0, 2, 0, 0][..]);
    assert!(matches!(
        parse_startup(&mut b),
        Err(WireError::UnsupportedProtocol { major: 2, .. })
    ));
}

#[test]
fn frontend_messages() {
    let mut b = BytesMut::new();
    encode::query(&mut b, "IDENTIFY_SYSTEM");
    encode::copy_data(&mut b, b"r12345");
    encode::copy_done(&mut b);
    encode::terminate(&mut b);
    assert_eq!(
        parse_frontend(&mut b).unwrap(),
        Some(FrontendMsg::Query("IDENTIFY_SYSTEM".into()))
    );
    assert_eq!(
        parse_frontend(&mut b).unwrap(),
        Some(FrontendMsg::CopyData(Bytes::from_static(b"r12345")))
    );
    assert_eq!(parse_frontend(&mut b).unwrap(), Some(FrontendMsg::CopyDone));
    assert_eq!(
        parse_frontend(&mut b).unwrap(),
        Some(FrontendMsg::Terminate)
    );
    assert_eq!(parse_frontend(&mut b).unwrap(), None);
    // A query without its NUL terminator is malformed.
    let mut b = BytesMut::from(&[b'Q', 0, 0, 0, 6, b'h', b'i'][..]);
    assert!(matches!(
        parse_frontend(&mut b),
        Err(WireError::Malformed { .. })
    ));
}

#[test]
fn sasl_initial_response() {
    let mut b = BytesMut::new();
    encode::sasl_initial_response(&mut b, "SCRAM-SHA-256", b"n,,n=,r=abc");
    let msg = parse_frontend(&mut b).unwrap().unwrap();
    let FrontendMsg::Password(body) = msg else {
        panic!()
    };
    let (mech, data) = parse_sasl_initial(&body).unwrap();
    assert_eq!(mech, "SCRAM-SHA-256");
    assert_eq!(&data[..], b"n,,n=,r=abc");
    assert!(parse_sasl_initial(b"SCRAM\0\0\0\0\x09ab").is_err());
}

#[test]
fn error_response_round_trip() {
    let e = ErrorFields::fatal("28P01", "password authentication failed for user \"x\"")
        .with_hint("check it");
    let mut b = BytesMut::new();
    encode::error_response(&mut b, &e);
    let raw = parse_tagged(&mut b, |_| 1 << 16).unwrap().unwrap();
    assert_eq!(raw.tag, b'E');
    assert_eq!(ErrorFields::parse(&raw.body).unwrap(), e);
}

#[test]
fn xlogdata_round_trip() {
    let x = repl::XLogData {
        start: walrelay_wal::lsn::Lsn(0x1000000),
        end: walrelay_wal::lsn::Lsn(0x1000010),
        send_time: 42,
        data: Bytes::from_static(b"walbytes"),
    };
    let mut b = BytesMut::new();
    x.encode_copy_data(&mut b);
    let raw = parse_tagged(&mut b, |_| 1 << 20).unwrap().unwrap();
    assert_eq!(repl::XLogData::parse(&raw.body).unwrap(), Some(x));
    assert!(repl::XLogData::parse(&Bytes::from_static(b"w123")).is_err());
    assert_eq!(
        repl::XLogData::parse(&Bytes::from_static(b"k123")).unwrap(),
        None
    );
}

/// The primary states where WAL bytes start; their end must be a position too.
#[test]
fn xlogdata_ending_past_the_wal_address_space_is_malformed() {
    let at = |start: u64| {
        let mut b = vec![b'w'];
        b.extend_from_slice(&start.to_be_bytes());
        b.extend_from_slice(&[0; 16]);
        b.extend_from_slice(b"8 bytes!");
        repl::XLogData::parse(&Bytes::from(b))
    };
    let last = at(u64::MAX - 8).unwrap().unwrap();
    assert_eq!(last.data_end(), Some(walrelay_wal::lsn::Lsn(u64::MAX)));
    for start in [u64::MAX - 7, u64::MAX] {
        let e = at(start).unwrap_err();
        assert!(e.to_string().contains("past the end"), "{e}");
    }
}

#[test]
fn feedback_checks() {
    let mut r = vec![b'r'];
    r.extend_from_slice(&[0u8; 33]);
    assert!(repl::check_feedback(&r).is_ok());
    assert!(repl::check_feedback(&r[..20]).is_err());
    assert!(repl::check_feedback(b"x").is_err());
    assert!(repl::check_feedback(b"").is_err());
}

proptest! {
    #[test]
    fn parsers_never_panic(data in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut b = BytesMut::from(&data[..]);
        let _ = parse_startup(&mut b);
        let mut b = BytesMut::from(&data[..]);
        while let Ok(Some(_)) = parse_frontend(&mut b) {}
        let _ = ErrorFields::parse(&data);
        let _ = parse_sasl_initial(&data);
        let _ = repl::XLogData::parse(&Bytes::from(data.clone()));
    }

    #[test]
    fn frontend_any_chunking(split in 0usize..64) {
        let mut all = BytesMut::new();
        encode::query(&mut all, "START_REPLICATION 0/3000000 TIMELINE 1");
        encode::copy_data(&mut all, &[b'r'; 34]);
        let split = split.min(all.len());
        let mut b = BytesMut::from(&all[..split]);
        let mut got = Vec::new();
        while let Some(m) = parse_frontend(&mut b).unwrap() { got.push(m); }
        b.extend_from_slice(&all[split..]);
        while let Some(m) = parse_frontend(&mut b).unwrap() { got.push(m); }
        prop_assert_eq!(got.len(), 2);
    }
}

#[test]
fn data_rows_are_read_within_their_body() {
    let row = |body: &[u8]| RawMsg {
        tag: b'D',
        body: Bytes::copy_from_slice(body),
    };
    let ok = row(b"\0\x02\0\0\0\x03abc\xff\xff\xff\xff");
    assert_eq!(ok.data_row().unwrap(), vec![Some(&b"abc"[..]), None]);
    for bad in [&b"\0"[..], b"\0\x01\0\0\0\x05abc", b"\0\x01\0\0", b"\0\0x"] {
        assert!(row(bad).data_row().is_err(), "{bad:?}");
    }
    assert!(RawMsg {
        tag: b'T',
        body: Bytes::new()
    }
    .data_row()
    .is_err());
}

#[test]
fn status_updates_are_clamped_to_what_was_sent() {
    use crate::repl::{clamp_status_update, status_positions, STATUS_UPDATE_LEN};
    use walrelay_wal::lsn::Lsn;
    let update = |w: u64, f: u64, a: u64| {
        let mut m = vec![b'r'];
        for v in [w, f, a, 12345] {
            m.extend_from_slice(&v.to_be_bytes());
        }
        m.push(1);
        assert_eq!(m.len(), STATUS_UPDATE_LEN);
        m
    };
    let honest = update(0x500, 0x400, 0x300);
    let (out, clamped) = clamp_status_update(&honest, Lsn(0x500));
    assert!(!clamped);
    assert_eq!(&out[..], &honest[..]);
    let liar = update(u64::MAX, 0x900, 0x200);
    let (out, clamped) = clamp_status_update(&liar, Lsn(0x500));
    assert!(clamped);
    assert_eq!(
        status_positions(&out),
        Some((Lsn(0x500), Lsn(0x500), Lsn(0x200)))
    );
    // The time and the reply flag stay.
    assert_eq!(&out[25..], &liar[25..]);
    // Hot-standby feedback and anything else pass as they are.
    let hs = [b'h'; 25];
    assert!(!clamp_status_update(&hs, Lsn(0)).1);
}

#[test]
fn a_status_update_built_here_reads_back_as_sent() {
    use crate::repl::{check_feedback, status_positions, status_update};
    use walrelay_wal::lsn::Lsn;
    let m = status_update(Lsn(0x500), Lsn(0x400), Lsn(0), true);
    assert!(check_feedback(&m).is_ok());
    assert_eq!(status_positions(&m), Some((Lsn(0x500), Lsn(0x400), Lsn(0))));
    assert_eq!(m.last(), Some(&1), "reply asked");
    assert_eq!(
        status_update(Lsn(0), Lsn(0), Lsn(0), false).last(),
        Some(&0)
    );
}

#[test]
fn printable_escapes_what_would_break_a_log_line() {
    assert!(matches!(
        printable("replicator é"),
        std::borrow::Cow::Borrowed("replicator é")
    ));
    assert_eq!(
        printable("a\nINFO forged\r\t\u{1b}[31m\u{85}\u{2028}z"),
        "a\\nINFO forged\\r\\t\\u{1b}[31m\\u{85}\\u{2028}z"
    );
}

/// An XLogData's start is recognized from its first 30 bytes on, with the `walEnd` and the
/// whole message's length of the encoded message; fewer bytes, another message or a length
/// shorter than the header are not.
#[test]
fn xlogdata_start_of_a_message_that_has_not_all_arrived() {
    let x = repl::XLogData {
        start: walrelay_wal::lsn::Lsn(0x1000000),
        end: walrelay_wal::lsn::Lsn(0x2000010),
        send_time: 42,
        data: Bytes::from(vec![7u8; 100_000]),
    };
    let mut b = BytesMut::new();
    x.encode_copy_data(&mut b);
    let whole = b.len();
    for have in [30, 31, 4096, whole] {
        assert_eq!(
            repl::xlogdata_start(&b[..have]),
            Some((x.end, whole)),
            "{have}"
        );
    }
    assert_eq!(repl::xlogdata_start(&b[..29]), None);
    let mut other = b[..64].to_vec();
    other[5] = b'k';
    assert_eq!(repl::xlogdata_start(&other), None);
    other[0] = b'D';
    other[5] = b'w';
    assert_eq!(repl::xlogdata_start(&other), None);
    let mut short = b[..64].to_vec();
    short[1..5].copy_from_slice(&28u32.to_be_bytes());
    assert_eq!(repl::xlogdata_start(&short), None);
    short[1..5].copy_from_slice(&29u32.to_be_bytes());
    assert_eq!(repl::xlogdata_start(&short), Some((x.end, 30)));
}
