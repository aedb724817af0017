//! What a standby (or any client) can send to walrelay's walsender: the startup packet, then
//! tagged frontend messages, and the bodies interpreted inside them (SASL, CopyData feedback,
//! XLogData), plus ErrorResponse bodies as walrelay reads them from a primary.
//!
//! Properties: no panic; a parser that returns `Ok(None)` consumes nothing; a parsed message
//! consumed exactly tag + length + body with body <= `frontend_cap(tag)`; buffers never grow
//! beyond what the caps allow; re-encoding parsed values parses back to the same value.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use walrelay_pgwire::{self as pgwire, encode, repl, ErrorFields, FrontendMsg, RawMsg, StartupPacket};

/// Largest body any frontend tag may have.
fn max_cap() -> usize {
    (0..=255u8).map(pgwire::frontend_cap).max().unwrap()
}

/// Capacity a buffer of `input_len` bytes may reach after the parser reserved room for one
/// capped message (generous: BytesMut may double).
fn capacity_bound(input_len: usize) -> usize {
    2 * (input_len + 5 + max_cap()) + 64
}

fuzz_target!(|data: &[u8]| {
    // A connection: startup packet first, then frontend messages on what follows.
    let mut buf = BytesMut::from(data);
    match pgwire::parse_startup(&mut buf) {
        Ok(Some(pkt)) => {
            assert!(buf.len() + 8 <= data.len(), "startup consumed too little");
            if let StartupPacket::Startup { params, .. } = &pkt {
                // Re-encoding a parsed startup packet must parse back to the same packet
                // (names and values are lossy UTF-8 without NUL, so this holds when no name is
                // empty: an empty name ends the list).
                if params.iter().all(|(k, _)| !k.is_empty()) {
                    let pairs: Vec<(&str, &str)> = params
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    let mut enc = BytesMut::new();
                    encode::startup(&mut enc, &pairs);
                    if enc.len() <= pgwire::MAX_STARTUP_LEN {
                        let back = pgwire::parse_startup(&mut enc).expect("re-encoded startup");
                        if let Some(StartupPacket::Startup { params: p2, .. }) = back {
                            assert_eq!(&p2, params);
                        } else {
                            panic!("re-encoded startup packet did not parse back: {back:?}");
                        }
                    }
                }
            }
            frontend_loop(buf, data.len());
        }
        Ok(None) => assert_eq!(buf.len(), data.len(), "Ok(None) consumed input"),
        Err(_) => {}
    }

    // The same bytes as a stream of frontend messages (connection past startup).
    frontend_loop(BytesMut::from(data), data.len());

    // Body-level parsers straight on the input.
    bodies(data);
});

fn frontend_loop(mut buf: BytesMut, input_len: usize) {
    loop {
        let before = buf.len();
        let tag = buf.first().copied();
        match pgwire::parse_frontend(&mut buf) {
            Ok(Some(msg)) => {
                let tag = tag.expect("a message from an empty buffer");
                let consumed = before - buf.len();
                assert!(consumed >= 5, "message consumed {consumed} bytes");
                let body = consumed - 5;
                let cap = pgwire::frontend_cap(tag);
                assert!(
                    body <= cap,
                    "'{}' body of {body} bytes exceeds cap {cap}",
                    tag as char
                );
                check_msg(tag, body, &msg);
            }
            Ok(None) => {
                assert_eq!(buf.len(), before, "Ok(None) consumed input");
                break;
            }
            Err(_) => break,
        }
        assert!(
            buf.capacity() <= capacity_bound(input_len),
            "buffer grew to {} bytes for {input_len} bytes of input",
            buf.capacity()
        );
    }
    assert!(
        buf.capacity() <= capacity_bound(input_len),
        "buffer grew to {} bytes for {input_len} bytes of input",
        buf.capacity()
    );
}

fn check_msg(tag: u8, body: usize, msg: &FrontendMsg) {
    match msg {
        FrontendMsg::Query(s) => {
            assert_eq!(tag, b'Q');
            assert_eq!(s.len() + 1, body);
            let _ = walrelay_pgwire::replcmd::parse(s);
        }
        FrontendMsg::CopyFail(s) => {
            assert_eq!(tag, b'f');
            assert_eq!(s.len() + 1, body);
        }
        FrontendMsg::CopyData(b) => {
            assert_eq!(tag, b'd');
            assert_eq!(b.len(), body);
            bodies(b);
        }
        FrontendMsg::Password(b) => {
            assert_eq!(tag, b'p');
            assert_eq!(b.len(), body);
            bodies(b);
        }
        FrontendMsg::CopyDone => assert_eq!(tag, b'c'),
        FrontendMsg::Terminate => assert_eq!(tag, b'X'),
        FrontendMsg::Other(t) => assert_eq!(*t, tag),
    }
}

fn bodies(data: &[u8]) {
    // SASLInitialResponse.
    if let Ok((mech, sasl)) = pgwire::parse_sasl_initial(data) {
        assert!(!mech.contains('\0'));
        assert!(sasl.len() <= data.len());
    }

    // ErrorResponse / NoticeResponse: parse, re-encode, parse again gives the same fields.
    if let Ok(fields) = ErrorFields::parse(data) {
        let _ = fields.to_string();
        let mut enc = BytesMut::new();
        encode::error_response(&mut enc, &fields);
        let RawMsg { tag, body } = pgwire::parse_tagged(&mut enc, |_| usize::MAX)
            .expect("re-encoded ErrorResponse")
            .expect("whole ErrorResponse");
        assert_eq!(tag, b'E');
        assert!(enc.is_empty());
        assert_eq!(
            ErrorFields::parse(&body).expect("re-parse ErrorResponse"),
            fields
        );
    }

    // XLogData inside CopyData: parse, re-encode, the CopyData body is the input again.
    let payload = Bytes::copy_from_slice(data);
    if let Ok(Some(x)) = repl::XLogData::parse(&payload) {
        assert_eq!(x.data.len() + 1 + repl::XLOGDATA_HEADER, data.len());
        let mut enc = BytesMut::new();
        x.encode_copy_data(&mut enc);
        let RawMsg { tag, body } = pgwire::parse_tagged(&mut enc, |_| usize::MAX)
            .expect("re-encoded CopyData")
            .expect("whole CopyData");
        assert_eq!(tag, b'd');
        assert_eq!(&body[..], data);
    }

    // Standby feedback.
    let ok = repl::check_feedback(data).is_ok();
    let positions = repl::status_positions(data);
    if positions.is_some() {
        assert!(
            ok,
            "status positions read from a message check_feedback refuses"
        );
    }
}
