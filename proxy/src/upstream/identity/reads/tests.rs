use super::*;
use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use walrelay_pgwire::parse_tagged;
use walrelay_pgwire::repl::XLogData;

/// A primary's CopyData stream over real TCP: XLogData of 128 kB (a bulk load's), a few of
/// 200 bytes (commits), a keepalive.
fn stream() -> (Vec<u8>, Vec<Lsn>) {
    let mut out = BytesMut::new();
    let mut ends = Vec::new();
    let mut at = 0x1000000u64;
    for i in 0..40 {
        let len = if i % 10 == 9 { 200 } else { 128 * 1024 };
        let x = XLogData {
            start: Lsn(at),
            end: Lsn(at + len as u64),
            send_time: i,
            data: Bytes::from(vec![(i % 251) as u8; len]),
        };
        at += len as u64;
        ends.push(x.end);
        x.encode_copy_data(&mut out);
    }
    // A keepalive asking for a reply, last: it must come through whole.
    let mut k = vec![b'k'];
    k.extend_from_slice(&at.to_be_bytes());
    k.extend_from_slice(&0i64.to_be_bytes());
    k.push(1);
    out.extend_from_slice(b"d");
    out.extend_from_slice(&(4 + k.len() as u32).to_be_bytes());
    out.extend_from_slice(&k);
    (out.to_vec(), ends)
}

/// The identity's loop, as `drain_primary` and `paced_fill` run it: whole messages parsed,
/// then a message still arriving skipped and dropped in the kernel, reads of the room the
/// skipper gives. Every message's end is seen in order, the keepalive after them whole, and
/// most of the WAL never reaches the buffer.
#[tokio::test]
async fn large_messages_are_dropped_unread_and_every_end_is_seen() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (tcp, peer) = tokio::join!(
        tokio::net::TcpStream::connect(l.local_addr().unwrap()),
        l.accept()
    );
    let mut conn = PrimaryConn::over_tcp(tcp.unwrap(), 1 << 20);
    assert!(conn.discard.is_some());
    let (bytes, ends) = stream();
    let total = bytes.len();
    let mut primary = peer.unwrap().0;
    let writer = tokio::spawn(async move {
        primary.write_all(&bytes).await.unwrap();
        primary
    });
    let mut skipper = Skipper::default();
    let (mut seen, mut read, mut keepalive) = (Vec::new(), 0, false);
    while !keepalive {
        read += conn
            .reader
            .fill_at_most(skipper.room(256 * 1024))
            .await
            .unwrap();
        loop {
            while let Some(m) = conn
                .reader
                .try_read(|b| parse_tagged(b, |_| 1 << 20))
                .unwrap()
            {
                match XLogData::parse(&m.body).unwrap() {
                    Some(x) => seen.push(x.end),
                    None => keepalive = m.body.first() == Some(&b'k'),
                }
            }
            seen.extend(skipper.after_messages(&mut conn));
            if skipper.drop_waiting(&mut conn).unwrap() == 0 {
                break;
            }
        }
    }
    assert_eq!(seen, ends);
    assert_eq!(conn.reader.skipping(), 0);
    assert!(conn.reader.buffered().is_empty());
    // 36 messages of 128 kB: nearly all of them dropped unread.
    assert!(read < total / 4, "{read} of {total} bytes read");
    drop(writer.await.unwrap());
}

/// Without a way to drop bytes unread (TLS, a Unix socket), nothing is skipped: the
/// messages are read whole, as before.
#[tokio::test]
async fn without_a_discard_messages_are_read_whole() {
    let (bytes, ends) = stream();
    let (mut tx, rx) = tokio::io::duplex(1 << 16);
    let mut conn = PrimaryConn::over(Box::new(rx), 1 << 20);
    assert!(conn.discard.is_none());
    let writer = tokio::spawn(async move { tx.write_all(&bytes).await.unwrap() });
    let mut skipper = Skipper::default();
    let mut seen = Vec::new();
    while seen.len() < ends.len() {
        conn.reader.fill_at_most(skipper.room(8192)).await.unwrap();
        while let Some(m) = conn
            .reader
            .try_read(|b| parse_tagged(b, |_| 1 << 20))
            .unwrap()
        {
            seen.extend(XLogData::parse(&m.body).unwrap().map(|x| x.end));
        }
        assert_eq!(skipper.after_messages(&mut conn), None);
        assert_eq!(skipper.room(8192), 8192);
    }
    assert_eq!(seen, ends);
    writer.await.unwrap();
}
