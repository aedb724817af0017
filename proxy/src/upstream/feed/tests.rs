use super::*;
use crate::config::MAX_MESSAGE_BYTES_MIN;
use crate::upstream::handshake::{batch_max, BATCH_MAX};

/// The walsender's largest XLogData message (MAX_SEND_SIZE) at `start`.
fn largest(start: u64) -> (usize, XLogData) {
    let data = bytes::Bytes::from(vec![0u8; 128 * 1024]);
    let body_len = 1 + 24 + data.len();
    let x = XLogData {
        start: Lsn(start),
        end: Lsn(start + data.len() as u64),
        send_time: 0,
        data,
    };
    (body_len, x)
}

/// How many of the walsender's largest messages a batch of `max` bytes takes.
fn taken(max: usize) -> usize {
    let mut b = Batch::new(max);
    let mut n = 0;
    loop {
        let (len, x) = largest(n as u64 * 128 * 1024);
        if !b.fits(len) {
            return n;
        }
        b.push_wal(x).unwrap();
        n += 1;
    }
}

#[test]
fn a_batch_takes_two_of_the_largest_messages_or_what_the_downstream_does() {
    // Two (256 kB of WAL, one run): half the records cut by a link message's end.
    assert_eq!(taken(BATCH_MAX), 2);
    let mut b = Batch::new(BATCH_MAX);
    for i in 0..2 {
        b.push_wal(largest(i * 128 * 1024).1).unwrap();
    }
    assert_eq!(b.parts.len(), 1);
    // A downstream at the smallest limit gets one at a time, as before.
    assert_eq!(taken(batch_max(MAX_MESSAGE_BYTES_MIN as u64)), 1);
    assert_eq!(taken(batch_max(0)), 1);
}

/// The primary's CopyData carrying XLogData of `len` bytes at `start`.
fn xlogdata(start: u64, len: usize) -> RawMsg {
    let mut body = vec![b'w'];
    for v in [start, start + len as u64, 0] {
        body.extend_from_slice(&v.to_be_bytes());
    }
    body.resize(body.len() + len, 0);
    RawMsg {
        tag: b'd',
        body: body.into(),
    }
}

#[test]
fn a_batch_says_more_follows_only_when_its_wal_goes_on_in_the_next() {
    let full = |parts_after: bool| {
        let mut b = Batch::new(BATCH_MAX);
        b.push_wal(largest(0).1).unwrap();
        if parts_after {
            b.parts.push(Part::Keepalive {
                end: 0,
                send_time: 0,
            });
        }
        b
    };
    let mut b = full(false);
    b.close_before(&xlogdata(128 * 1024, 1000));
    assert!(b.more, "the next WAL follows on");
    // A gap, another message, or something after the WAL in the batch: nothing held.
    for (next, after) in [
        (xlogdata(256 * 1024, 1000), false),
        (
            RawMsg {
                tag: b'c',
                body: Default::default(),
            },
            false,
        ),
        (xlogdata(128 * 1024, 1000), true),
    ] {
        let mut b = full(after);
        b.close_before(&next);
        assert!(!b.more, "{:?} after a keepalive: {after}", next.tag);
    }
}

/// A feed whose primary is the other end of a pipe (`Rig::primary`: read what the feed tells
/// the primary there), whose frames go to `Rig::frames`, and whose spool's durable end is
/// `durable`.
struct Rig {
    primary: tokio::io::DuplexStream,
    _frames: mpsc::Receiver<Result<walrelay_proto::link::ToDownstream, Status>>,
    _events: mpsc::Sender<Event>,
}

fn feed<'a>(
    metrics: &'a std::sync::Arc<Metrics>,
    synchronous: &'a AtomicUsize,
    durable: watch::Receiver<Lsn>,
) -> (FeedToLink<'a>, Rig) {
    let (client, primary) = tokio::io::duplex(1 << 20);
    let conn = PrimaryConn::over(Box::new(client), 1 << 20);
    let (feed, rig) = feed_over(conn, metrics, synchronous, durable);
    (feed, Rig { primary, ..rig })
}

/// [`feed`] on `conn`; the rig's pipe to the primary is not connected to it.
fn feed_over<'a>(
    conn: PrimaryConn,
    metrics: &'a std::sync::Arc<Metrics>,
    synchronous: &'a AtomicUsize,
    durable: watch::Receiver<Lsn>,
) -> (FeedToLink<'a>, Rig) {
    use crate::upstream::encode::Framer;
    let encoder = walrelay_wal::linkcodec::WalEncoder::new(&crate::testwal::wal_setup()).unwrap();
    let framer = Framer::new(encoder, metrics.ops.codec.session(), metrics.clone(), 0);
    let (tx, frames) = mpsc::channel(4);
    let (sent, _) = watch::channel(Lsn(0));
    let (events_tx, events) = mpsc::channel(4);
    let now = tokio::time::Instant::now();
    let feed = FeedToLink {
        conn,
        stage: EncodeStage::spawn(framer, tx, sent, false).unwrap(),
        events,
        metrics,
        window: Duration::ZERO,
        batch_max: BATCH_MAX,
        synchronous,
        durable,
        slot: "walrelay".into(),
        tli: TimeLineId(1),
        pending: None,
        status_every: STATUS_EVERY,
        last_status: now,
        last_sent: now,
        primary_end: 0,
        silence: Silence::new(Some(PRIMARY_TIMEOUT), now),
    };
    let rig = Rig {
        primary: tokio::io::duplex(64).1,
        _frames: frames,
        _events: events_tx,
    };
    (feed, rig)
}

/// The primary's ErrorResponse, as the feed reads it.
fn error_response(e: &walrelay_pgwire::ErrorFields) -> RawMsg {
    let mut out = BytesMut::new();
    encode::error_response(&mut out, e);
    parse_tagged(&mut out, |_| 1 << 20).unwrap().unwrap()
}

#[tokio::test]
async fn wal_the_primary_removed_mid_stream_says_what_to_do() {
    use walrelay_pgwire::ErrorFields;
    let (metrics, synchronous) = (std::sync::Arc::new(Metrics::default()), AtomicUsize::new(0));
    let (_durable_tx, durable) = watch::channel(Lsn(0));
    let (mut feed, _rig) = feed(&metrics, &synchronous, durable);
    // PostgreSQL sends this after CopyBothResponse, once the walsender reads the WAL.
    let removed = ErrorFields::error(
        "58P01",
        "requested WAL segment 000000010000000000000003 has already been removed",
    );
    let e = feed
        .take(&mut Batch::new(BATCH_MAX), error_response(&removed))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    for what in [
        "000000010000000000000003",
        "empty downstream.spool_dir",
        "pg_drop_replication_slot('walrelay')",
    ] {
        assert!(e.message().contains(what), "{what}: {}", e.message());
    }
    // PostgreSQL 18 on an invalidated slot, before the copy: the same advice.
    let mut invalidated = ErrorFields::error(
        "55000",
        "can no longer access replication slot \"walrelay\"",
    );
    invalidated.detail =
        Some("This replication slot has been invalidated due to \"wal_removed\".".into());
    let e = crate::upstream::primary::wal_gone("walrelay", &invalidated).unwrap();
    assert!(
        e.message().contains("wal_removed") && e.message().contains("empty downstream.spool_dir"),
        "{}",
        e.message()
    );
    // Anything else is tried again, with the primary's whole error.
    let mut other = ErrorFields::fatal(
        "57P01",
        "terminating connection due to administrator command",
    );
    other.hint = Some("a hint".into());
    let e = feed
        .take(&mut Batch::new(BATCH_MAX), error_response(&other))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(
        e.message().contains("administrator command") && e.message().contains("a hint"),
        "{}",
        e.message()
    );
}

/// The next status update the feed wrote to the primary: (write, flush, apply).
async fn status_sent(primary: &mut tokio::io::DuplexStream) -> (Lsn, Lsn, Lsn) {
    use tokio::io::AsyncReadExt;
    let mut m = [0u8; 5 + walrelay_pgwire::repl::STATUS_UPDATE_LEN];
    primary.read_exact(&mut m).await.unwrap();
    assert_eq!(m[0], b'd');
    walrelay_pgwire::repl::status_positions(&m[5..]).unwrap()
}

#[tokio::test]
async fn a_stream_tells_the_primary_only_what_the_downstream_reported_durable() {
    let (metrics, synchronous) = (std::sync::Arc::new(Metrics::default()), AtomicUsize::new(0));
    // The Hello said the spool ends at 0/5000000; its last fsync may be behind that.
    let (reports, durable, _sent) =
        crate::upstream::from_link::DurableReports::new(Lsn(0x500_0000), 1);
    let (mut feed, mut rig) = feed(&metrics, &synchronous, durable);
    feed.status(false).await.unwrap();
    assert_eq!(
        status_sent(&mut rig.primary).await,
        (Lsn(0), Lsn(0), Lsn(0))
    );
    reports.report(1, 0x4F0_0000);
    feed.status(false).await.unwrap();
    let at = Lsn(0x4F0_0000);
    assert_eq!(status_sent(&mut rig.primary).await, (at, at, Lsn(0)));
}

#[test]
fn status_updates_come_twice_within_the_primarys_wal_sender_timeout() {
    assert_eq!(status_every(Some("60s")), STATUS_EVERY);
    assert_eq!(status_every(Some("1min")), STATUS_EVERY);
    assert_eq!(status_every(Some("5s")), Duration::from_millis(2500));
    assert_eq!(status_every(Some("10s")), Duration::from_secs(5));
    // Off, unknown or unreadable: every STATUS_EVERY.
    for v in [Some("0"), None, Some("soon")] {
        assert_eq!(status_every(v), STATUS_EVERY, "{v:?}");
    }
    assert_eq!(status_every(Some("10ms")), Duration::from_millis(100));
}

#[tokio::test]
async fn a_stream_waiting_on_the_link_keeps_a_short_wal_sender_timeout_at_bay() {
    use futures::FutureExt;
    let (metrics, synchronous) = (std::sync::Arc::new(Metrics::default()), AtomicUsize::new(0));
    let (_durable_tx, durable) = watch::channel(Lsn(0x300_0000));
    let (mut feed, mut rig) = feed(&metrics, &synchronous, durable);
    // The primary's wal_sender_timeout = 1s (the stream learns it when it opens).
    feed.status_every = status_every(Some("1s"));
    let keepalive = || Job {
        parts: vec![Part::Keepalive {
            end: 0,
            send_time: 0,
        }],
        wal_end: None,
        more: false,
    };
    // The link takes nothing: its queue (4 frames) fills, then the feed waits on it.
    for _ in 0..4 {
        feed.send_down(keepalive()).await.unwrap();
    }
    let waiting = tokio::time::timeout(Duration::from_millis(1200), feed.send_down(keepalive()));
    assert!(waiting.await.is_err(), "the link took a frame");
    // Meanwhile the primary heard from the stream within its timeout.
    let sent = status_sent(&mut rig.primary).now_or_never();
    let at = Lsn(0x300_0000);
    assert_eq!(
        sent,
        Some((at, at, Lsn(0))),
        "no status update within 1.2 s"
    );
}

/// Writes the primary's CopyData of XLogData of `len` bytes at `start` into the feed's pipe.
async fn primary_sends(primary: &mut (impl tokio::io::AsyncWrite + Unpin), start: u64, len: usize) {
    use tokio::io::AsyncWriteExt;
    let m = xlogdata(start, len);
    let mut out = BytesMut::new();
    encode::copy_data(&mut out, &m.body);
    primary.write_all(&out).await.unwrap();
}

/// The WAL a batch carries: (start, bytes) of each run.
fn runs(b: &Batch) -> Vec<(u64, usize)> {
    b.parts
        .iter()
        .filter_map(|p| match p {
            Part::Wal { header, data } => Some((header.start, data.len())),
            _ => None,
        })
        .collect()
}

/// Within the window the feed takes everything the primary sends, in one batch at the
/// window's end, without reading each message as it comes; a batch that is full, or begins
/// with what the last had no room for, goes at once, and so does one with no window (a
/// synchronous standby's stream).
#[tokio::test(start_paused = true)]
async fn a_batch_takes_the_windows_wal_at_its_end_and_leftovers_go_at_once() {
    let (metrics, synchronous) = (std::sync::Arc::new(Metrics::default()), AtomicUsize::new(0));
    let (_durable_tx, durable) = watch::channel(Lsn(0));
    let (mut feed, mut rig) = feed(&metrics, &synchronous, durable);
    let window = Duration::from_millis(10);
    feed.window = window;
    feed.batch_max = 3000;
    // Three commits' WAL: at the start, 3 ms and 7 ms into the window.
    let t0 = tokio::time::Instant::now();
    let sender = async {
        primary_sends(&mut rig.primary, 0x100_0000, 500).await;
        tokio::time::sleep(Duration::from_millis(3)).await;
        primary_sends(&mut rig.primary, 0x100_0000 + 500, 500).await;
        tokio::time::sleep(Duration::from_millis(4)).await;
        primary_sends(&mut rig.primary, 0x100_0000 + 1000, 500).await;
        rig.primary
    };
    let (b, primary) = tokio::join!(feed.gather(), sender);
    rig.primary = primary;
    let b = b.unwrap();
    assert_eq!(runs(&b), vec![(0x100_0000, 1500)]);
    assert_eq!(
        t0.elapsed(),
        window,
        "the batch went before its window ended"
    );
    // More than a batch holds, there already: the batch goes at once with what fits, and the
    // rest in the next ones, with no window of their own.
    let t2 = tokio::time::Instant::now();
    for i in 0..5 {
        primary_sends(&mut rig.primary, 0x100_0000 + 1500 + i * 1000, 1000).await;
    }
    let b = feed.gather().await.unwrap();
    assert_eq!(runs(&b), vec![(0x100_0000 + 1500, 2000)]);
    assert_eq!(t2.elapsed(), Duration::ZERO, "a full batch waited");
    let b = feed.gather().await.unwrap();
    assert_eq!(runs(&b), vec![(0x100_0000 + 3500, 2000)]);
    assert_eq!(t2.elapsed(), Duration::ZERO, "a carried batch waited");
    let b = feed.gather().await.unwrap();
    assert_eq!(runs(&b), vec![(0x100_0000 + 5500, 1000)]);
    assert_eq!(t2.elapsed(), Duration::ZERO);
    // A synchronous standby's stream: no window, what has arrived goes at once.
    synchronous.store(1, Ordering::Relaxed);
    let t3 = tokio::time::Instant::now();
    primary_sends(&mut rig.primary, 0x100_0000 + 6500, 100).await;
    primary_sends(&mut rig.primary, 0x100_0000 + 6600, 100).await;
    let b = feed.gather().await.unwrap();
    assert_eq!(runs(&b), vec![(0x100_0000 + 6500, 200)]);
    assert_eq!(t3.elapsed(), Duration::ZERO);
}

/// A keepalive that asks for a reply, sent within a window, is answered by the window's end
/// at the latest (with the spool's durable position), and the batch goes on.
#[tokio::test(start_paused = true)]
async fn a_reply_asked_for_within_the_window_goes_by_its_end() {
    use tokio::io::AsyncWriteExt;
    let (metrics, synchronous) = (std::sync::Arc::new(Metrics::default()), AtomicUsize::new(0));
    let (_durable_tx, durable) = watch::channel(Lsn(0x200_0000));
    let (mut feed, mut rig) = feed(&metrics, &synchronous, durable);
    let window = Duration::from_millis(10);
    feed.window = window;
    let t0 = tokio::time::Instant::now();
    let primary = async {
        primary_sends(&mut rig.primary, 0x100_0000, 500).await;
        tokio::time::sleep(Duration::from_millis(3)).await;
        // 'k', the WAL's end, the send time, reply requested.
        let mut k = vec![b'k'];
        k.extend_from_slice(&0x100_0200u64.to_be_bytes());
        k.extend_from_slice(&0u64.to_be_bytes());
        k.push(1);
        let mut out = BytesMut::new();
        encode::copy_data(&mut out, &k);
        rig.primary.write_all(&out).await.unwrap();
        let reply = status_sent(&mut rig.primary).await;
        (reply, t0.elapsed())
    };
    let (b, (reply, at)) = tokio::join!(feed.gather(), primary);
    let at_ = Lsn(0x200_0000);
    assert_eq!(reply, (at_, at_, Lsn(0)));
    assert!(at <= window, "answered {at:?} after the first WAL");
    let b = b.unwrap();
    assert_eq!(runs(&b), vec![(0x100_0000, 500)]);
    assert!(matches!(
        b.parts.last(),
        Some(Part::Keepalive {
            end: 0x100_0200,
            ..
        })
    ));
}

/// Over TCP the commits within a window do not wake the feed (the socket's low-water mark is
/// the batch's room): they wait in the socket and join the batch at the window's end; the
/// room filling within the window sends the batch at once; after each batch the socket tells
/// of every arrival again.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn over_tcp_a_window_defers_its_wake_ups_to_its_end_or_its_room() {
    use tokio::io::AsyncWriteExt;
    let (metrics, synchronous) = (std::sync::Arc::new(Metrics::default()), AtomicUsize::new(0));
    let (_durable_tx, durable) = watch::channel(Lsn(0));
    let (tcp, mut primary) = crate::tcp::recv_wake_tests::pair().await;
    let watch_socket = crate::tcp::RecvWake::of(&tcp).unwrap();
    let conn = PrimaryConn::over_tcp(tcp, 1 << 20);
    let (mut feed, _rig) = feed_over(conn, &metrics, &synchronous, durable);
    let window = Duration::from_millis(300);
    feed.window = window;
    feed.batch_max = 8000;
    let t0 = std::time::Instant::now();
    let sender = async {
        primary_sends(&mut primary, 0x100_0000, 500).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        primary_sends(&mut primary, 0x100_0000 + 500, 500).await;
        primary_sends(&mut primary, 0x100_0000 + 1000, 500).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Both commits wait in the socket, unread.
        let unread = watch_socket.unread().unwrap();
        primary.flush().await.unwrap();
        unread
    };
    let (b, unread) = tokio::join!(feed.gather(), sender);
    assert_eq!(
        unread,
        2 * (5 + 25 + 500),
        "the feed read within its window"
    );
    assert_eq!(runs(&b.unwrap()), vec![(0x100_0000, 1500)]);
    assert!(
        t0.elapsed() >= window,
        "the batch went before its window ended"
    );
    assert!(!feed.conn.wake.as_ref().unwrap().deferred());
    // The batch's room comes within the window: it goes then, not at the window's end.
    feed.window = Duration::from_secs(30);
    let t1 = std::time::Instant::now();
    let sender = async {
        primary_sends(&mut primary, 0x100_0000 + 1500, 500).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        for i in 0..8 {
            primary_sends(&mut primary, 0x100_0000 + 2000 + i * 1000, 1000).await;
        }
    };
    let (b, ()) = tokio::join!(feed.gather(), sender);
    let b = b.unwrap();
    assert!(
        t1.elapsed() < Duration::from_secs(20),
        "a batch whose room came waited for its window's end"
    );
    let taken: usize = runs(&b).iter().map(|r| r.1).sum();
    assert!(taken >= 6500, "{:?}", runs(&b));
    assert!(!feed.conn.wake.as_ref().unwrap().deferred());
}

/// On a new loopback connection the kernel wakes a reader at every arrival whatever its mark
/// (the receive window is one 64 kB segment): the feed reads each commit as it comes, but the
/// window still ends at its time, with all of them in one batch.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn woken_short_of_its_room_a_window_goes_on() {
    let (metrics, synchronous) = (std::sync::Arc::new(Metrics::default()), AtomicUsize::new(0));
    let (_durable_tx, durable) = watch::channel(Lsn(0));
    let (tcp, mut primary) = crate::tcp::recv_wake_tests::new_pair().await;
    let conn = PrimaryConn::over_tcp(tcp, 1 << 20);
    let (mut feed, _rig) = feed_over(conn, &metrics, &synchronous, durable);
    let window = Duration::from_millis(300);
    feed.window = window;
    let t0 = std::time::Instant::now();
    let sender = async {
        for i in 0..3 {
            primary_sends(&mut primary, 0x100_0000 + i * 500, 500).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let (b, ()) = tokio::join!(feed.gather(), sender);
    assert_eq!(runs(&b.unwrap()), vec![(0x100_0000, 1500)]);
    assert!(
        t0.elapsed() >= window,
        "the batch went before its window ended"
    );
    assert!(!feed.conn.wake.as_ref().unwrap().deferred());
}
