use super::*;
use bytes::BufMut;

fn msg(tag: u8, body: BytesMut) -> RawMsg {
    RawMsg {
        tag,
        body: body.freeze(),
    }
}

/// A RowDescription announcing `n` text columns (only the count matters here).
fn row_description(n: u16) -> RawMsg {
    let mut b = BytesMut::new();
    b.put_u16(n);
    for i in 0..n {
        b.put_slice(format!("c{i}\0").as_bytes());
        b.put_slice(&[0u8; 18]);
    }
    msg(b'T', b)
}

fn data_row(cols: &[Option<&[u8]>]) -> RawMsg {
    let mut b = BytesMut::new();
    b.put_u16(cols.len() as u16);
    for c in cols {
        match c {
            None => b.put_i32(-1),
            Some(v) => {
                b.put_i32(v.len() as i32);
                b.put_slice(v);
            }
        }
    }
    msg(b'D', b)
}

fn complete() -> RawMsg {
    msg(b'C', BytesMut::from(&b"IDENTIFY_SYSTEM\0"[..]))
}

fn identify(cols: &[Option<&[u8]>]) -> Result<SystemIdentity, PgClientError> {
    parse_identify(&[
        row_description(cols.len() as u16),
        data_row(cols),
        complete(),
    ])
}

#[test]
fn identify_system_parses_what_postgresql_sends() {
    let id = identify(&[
        Some(b"7391234567890123456"),
        Some(b"3"),
        Some(b"0/3000148"),
        None,
    ])
    .unwrap();
    assert_eq!(id.system_id, 7391234567890123456);
    assert_eq!(id.timeline, TimeLineId(3));
    assert_eq!(id.xlogpos, Lsn(0x3000148));
    assert_eq!(id.dbname, None);
    let id = identify(&[Some(b"1"), Some(b"1"), Some(b"1/0"), Some(b"postgres")]).unwrap();
    assert_eq!(id.dbname.as_deref(), Some("postgres"));
}

#[test]
fn identify_system_rejects_anything_else() {
    let ok: [Option<&[u8]>; 4] = [Some(b"1"), Some(b"1"), Some(b"0/1"), None];
    let bad_rows: Vec<Vec<Option<&[u8]>>> = vec![
        ok[..3].to_vec(),                                  // too few columns
        [&ok[..], &[None]].concat(),                       // too many
        vec![None, Some(b"1"), Some(b"0/1"), None],        // NULL systemid
        vec![Some(b"-1"), Some(b"1"), Some(b"0/1"), None], // sign
        vec![
            Some(b"18446744073709551616"),
            Some(b"1"),
            Some(b"0/1"),
            None,
        ], // > u64
        vec![Some(b"1 "), Some(b"1"), Some(b"0/1"), None], // space
        vec![Some(b"1"), Some(b"0"), Some(b"0/1"), None],  // timeline 0
        vec![Some(b"1"), Some(b"4294967296"), Some(b"0/1"), None], // > u32
        vec![Some(b"1"), Some(b"+2"), Some(b"0/1"), None],
        vec![Some(b"1"), Some(b"1"), Some(b"01"), None], // not X/X
        vec![Some(b"1"), Some(b"1"), Some(b"0/1"), Some(b"\xff")], // dbname not UTF-8
    ];
    for cols in bad_rows {
        let e = identify(&cols).unwrap_err();
        assert!(
            matches!(
                e,
                PgClientError::BadReply {
                    command: "IDENTIFY_SYSTEM",
                    ..
                }
            ),
            "{cols:?}: {e}"
        );
    }
    // No row, two rows, a row description that disagrees.
    for msgs in [
        vec![row_description(4), complete()],
        vec![row_description(4), data_row(&ok), data_row(&ok), complete()],
        vec![row_description(3), data_row(&ok), complete()],
        vec![data_row(&ok), complete()],
    ] {
        assert!(parse_identify(&msgs).is_err());
    }
    // A truncated DataRow.
    let mut cut = data_row(&ok);
    cut.body = cut.body.slice(..cut.body.len() - 2);
    assert!(parse_identify(&[row_description(4), cut]).is_err());
}

#[test]
fn timeline_history_checks_the_file_name() {
    let content = b"1\t0/3000148\tno recovery target specified\n";
    let msgs = [
        row_description(2),
        data_row(&[Some(b"00000002.history"), Some(content)]),
    ];
    let h = parse_history(&msgs, TimeLineId(2)).unwrap();
    assert_eq!(h.file_name, "00000002.history");
    assert_eq!(&h.content[..], content);
    assert_eq!(
        h.entries().unwrap(),
        [HistoryEntry {
            tli: TimeLineId(1),
            end: Lsn(0x3000148)
        }]
    );
    // Another timeline's file, NULL content, a third column.
    assert!(parse_history(&msgs, TimeLineId(3)).is_err());
    let null = [
        row_description(2),
        data_row(&[Some(b"00000002.history"), None]),
    ];
    assert!(parse_history(&null, TimeLineId(2)).is_err());
    let three = [
        row_description(3),
        data_row(&[Some(b"00000002.history"), Some(content), None]),
    ];
    assert!(parse_history(&three, TimeLineId(2)).is_err());
}

#[test]
fn continuity_after_a_reconnection() {
    let id = |system_id, t| SystemIdentity {
        system_id,
        timeline: TimeLineId(t),
        xlogpos: Lsn(0),
        dbname: None,
    };
    assert_eq!(
        id(1, 2).continuity_from(&id(1, 2)),
        Continuity::SameTimeline
    );
    assert_eq!(
        id(1, 3).continuity_from(&id(1, 2)),
        Continuity::Promoted {
            from: TimeLineId(2),
            to: TimeLineId(3)
        }
    );
    assert_eq!(
        id(1, 1).continuity_from(&id(1, 2)),
        Continuity::EarlierTimeline {
            before: TimeLineId(2),
            now: TimeLineId(1)
        }
    );
    assert_eq!(
        id(9, 2).continuity_from(&id(1, 2)),
        Continuity::OtherSystem { before: 1, now: 9 }
    );
}

#[test]
fn roles_read_as_messages_say() {
    assert_eq!(
        ServerRole::HotStandby.to_string(),
        "read-only (hot standby)"
    );
    assert!(on_off("x", "yes").is_err());
    assert!(on_off("x", "on").unwrap());
}

/// A connection whose server side is `server`, for reading replies.
fn conn_to(server_bytes: Vec<u8>, max: usize) -> PrimaryConn {
    let (client, mut server) = tokio::io::duplex(1 << 20);
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        server.write_all(&server_bytes).await.unwrap();
        // Keep the server side open until the client is done.
        let mut sink = [0u8; 64];
        let _ = tokio::io::AsyncReadExt::read(&mut server, &mut sink).await;
    });
    PrimaryConn::over(Box::new(client), max)
}

#[tokio::test]
async fn a_reply_is_read_whole_and_within_its_bounds() {
    let encoded = |msgs: &[RawMsg]| {
        let mut b = BytesMut::new();
        for m in msgs {
            m.encode(&mut b);
        }
        b.to_vec()
    };
    let ready = msg(b'Z', BytesMut::from(&b"I"[..]));
    // As sent, up to and including ReadyForQuery; what follows is the next reply's.
    let reply = [row_description(1), complete(), ready.clone()];
    let mut c = conn_to(
        [encoded(&reply), encoded(&[complete()])].concat(),
        256 << 10,
    );
    let got = c.read_reply("a test").await.unwrap();
    assert_eq!(encoded(&got), encoded(&reply));
    // More than MAX_REPLY_MESSAGES messages: refused, though a ReadyForQuery would follow.
    let many: Vec<RawMsg> = (0..MAX_REPLY_MESSAGES)
        .map(|_| complete())
        .chain([ready.clone()])
        .collect();
    let mut c = conn_to(encoded(&many), 256 << 10);
    let e = c.read_reply("a test").await.unwrap_err().to_string();
    assert!(e.contains("more than 256 messages"), "{e}");
    // More than max_message_bytes + 64 KiB in all: refused.
    let big = msg(b'N', BytesMut::from(&vec![b'x'; 200 << 10][..]));
    let mut c = conn_to(encoded(&[big.clone(), big, ready]), 256 << 10);
    let e = c.read_reply("a test").await.unwrap_err().to_string();
    assert!(e.contains("a test") && e.contains("bytes"), "{e}");
}
