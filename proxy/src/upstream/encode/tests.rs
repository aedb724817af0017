//! The encode stage under a primary that writes faster than it encodes: batches staged one
//! ahead, and records held back from a batch's end for the next, still give the frames, in
//! order, that restore the primary's bytes.

use std::time::Duration;

use super::*;
use crate::testwal::{raw_run, wait_full, wal_setup};
use walrelay_wal::linkcodec::{CodecKind, Setup, WalDecoder};
use walrelay_wal::pg::PgMajor;
use walrelay_wal::walcodec::testgen::WalGen;

const RUN: usize = 96 * 1024;
/// A reader's pause after a frame while it is slow on purpose.
const PAUSE: Duration = Duration::from_millis(5);

fn run_bytes(i: usize) -> Vec<u8> {
    raw_run(i, RUN)
}

/// Batch `i`: one WAL run; every third batch two runs with a keepalive between them (a
/// batch of two codec messages).
fn job(i: usize, at: &mut u64) -> (Job, Vec<u8>) {
    let wal = |at: &mut u64, bytes: Vec<u8>| {
        let header = WalHeader {
            start: *at,
            end: *at + bytes.len() as u64,
            send_time: 0,
            raw_len: 0,
        };
        *at += bytes.len() as u64;
        Part::Wal {
            header,
            data: BytesMut::from(&bytes[..]),
        }
    };
    let bytes = run_bytes(i);
    let mut parts = Vec::new();
    let mut all = Vec::new();
    if i % 3 == 0 {
        let (a, b) = bytes.split_at(RUN / 3);
        parts.push(wal(at, a.to_vec()));
        parts.push(Part::Keepalive {
            end: *at,
            send_time: 0,
        });
        parts.push(wal(at, b.to_vec()));
    } else {
        parts.push(wal(at, bytes.clone()));
    }
    all.extend_from_slice(&bytes);
    let job = Job {
        parts,
        wal_end: Some(Lsn(*at)),
        more: false,
    };
    (job, all)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_staged_ahead_restore_in_order() {
    let metrics = Arc::new(Metrics::default());
    let framer = Framer::new(
        WalEncoder::new(&wal_setup()).unwrap(),
        metrics.ops.codec.session(),
        metrics.clone(),
        0,
    );
    let (tx, mut rx) = mpsc::channel(1);
    let (sent, sent_rx) = watch::channel(Lsn(0));
    let stage = EncodeStage::spawn(framer, tx, sent, true).unwrap();
    const JOBS: usize = 40;
    let probe = stage.jobs.clone();
    let feed = tokio::spawn(async move {
        let mut at = 0x100_0000u64;
        let mut want = Vec::new();
        for i in 0..JOBS {
            let (job, bytes) = job(i, &mut at);
            want.extend_from_slice(&bytes);
            stage.send(job).await.unwrap();
        }
        want
    });
    // Nothing is read until the batch queue is full (the thread holds a frame the link cannot
    // take, the feed waits with the next batch counted), so that the next batch the thread
    // takes finds it behind however busy the machine; then the frames are read slowly until
    // it encoded one in parallel.
    wait_full(&probe).await;
    let behind = || metrics.codec_parallel_messages[0].load(Ordering::Relaxed) > 0;
    let (got, keepalives) = restore_frames(&mut rx, 0x100_0000, JOBS * RUN, &behind, PAUSE).await;
    let next = 0x100_0000 + got.len() as u64;
    let want = feed.await.unwrap();
    assert!(got == want, "restored WAL differs from what was fed");
    assert_eq!(keepalives, JOBS.div_ceil(3));
    // The thread says how far the WAL sent down reaches just after sending the last frame.
    let mut sent_rx = sent_rx;
    let reached = sent_rx.wait_for(|l| *l == Lsn(next));
    tokio::time::timeout(Duration::from_secs(10), reached)
        .await
        .expect("the sent position never reached the end of the WAL")
        .unwrap();
    // The queue was full behind some batches: those were staged ahead.
    assert!(metrics.codec_parallel_messages[0].load(Ordering::Relaxed) > 0);
    assert!(metrics.codec_staged_messages[0].load(Ordering::Relaxed) > 0);
}

/// One WAL run of `bytes` at `start`, as a batch of its own.
fn wal_job(start: u64, bytes: &[u8], more: bool) -> Job {
    let end = start + bytes.len() as u64;
    Job {
        parts: vec![Part::Wal {
            header: WalHeader {
                start,
                end,
                send_time: 0,
                raw_len: 0,
            },
            data: BytesMut::from(bytes),
        }],
        wal_end: Some(Lsn(end)),
        more,
    }
}

/// Restores frames from `rx` until `len` bytes of WAL from `start` came; checks that every
/// run follows the one before, every keepalive is where the WAL sent ends, and every
/// frame's checksum. Pauses `pause` after each frame while `fast` says not yet. Returns the
/// WAL and the number of keepalives.
async fn restore_frames(
    rx: &mut mpsc::Receiver<Result<ToDownstream, Status>>,
    start: u64,
    len: usize,
    fast: &dyn Fn() -> bool,
    pause: Duration,
) -> (Vec<u8>, usize) {
    let mut state = DownState::default();
    let mut dec = WalDecoder::new(&wal_setup()).unwrap();
    let (mut got, mut restored) = (Vec::new(), Vec::new());
    let (mut next, mut keepalives) = (start, 0);
    while got.len() < len {
        let msg = rx.recv().await.expect("the stage ended early").unwrap();
        if !fast() {
            tokio::time::sleep(pause).await;
        }
        let Some(to_downstream::Msg::Frame(frame)) = msg.msg else {
            panic!("not a frame")
        };
        let (items, sum) = state.parse(&frame, 1 << 20, 4 << 20).unwrap();
        let mut digest = Digest::default();
        for item in &items {
            match *item {
                Down::Wal { header, payload } => {
                    assert_eq!(header.start, next, "runs out of order");
                    let n = header.raw_len as usize;
                    dec.restore(Lsn(header.start), payload, n, 1 << 20, &mut restored)
                        .unwrap();
                    item.digest(&mut digest, &restored);
                    got.extend_from_slice(&restored);
                    next += n as u64;
                }
                Down::Keepalive { end, .. } => {
                    assert_eq!(end, next, "a keepalive out of place");
                    keepalives += 1;
                    item.digest(&mut digest, &[]);
                }
                _ => panic!("unexpected item"),
            }
        }
        assert_eq!(digest.finish(), sum, "a frame's checksum");
    }
    (got, keepalives)
}

/// Batches of generated WAL whose ends cut records: a batch the primary's next WAL follows
/// (`more`) holds the cut record back, and it goes whole in the next frame, also when that
/// next batch is small enough for the feed to encode itself; the bytes restore in order and
/// the sent position never runs ahead of what was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_record_waits_for_the_next_batch() {
    let mut g = WalGen::new(PgMajor::V15, 1 << 24, 0x100_0000, 5);
    while g.buf.len() < 1_200_000 {
        g.random_record(40);
    }
    let (start, wal) = (g.start, g.buf.clone());
    let metrics = Arc::new(Metrics::default());
    let framer = Framer::new(
        WalEncoder::new(&wal_setup()).unwrap(),
        metrics.ops.codec.session(),
        metrics.clone(),
        32 * 1024,
    );
    let (tx, mut rx) = mpsc::channel(2);
    let (sent, mut sent_rx) = watch::channel(Lsn(start));
    let stage = EncodeStage::spawn(framer, tx, sent, true).unwrap();
    let (len, fed) = (wal.len(), wal.clone());
    let feed = tokio::spawn(async move {
        let (mut at, mut i, mut held) = (0usize, 0usize, 0u64);
        while at < fed.len() {
            // Large batches that the next follows, now and then a small one after them.
            let (n, more) = match i % 4 {
                3 => (3000, false),
                _ => (70_000, true),
            };
            let end = (at + n).min(fed.len());
            let more = more && end < fed.len();
            held += u64::from(more);
            stage
                .send(wal_job(start + at as u64, &fed[at..end], more))
                .await
                .unwrap();
            if i % 8 == 2 {
                // The thread goes idle holding a record back: the small batch after this one
                // is framed by the feed itself, after the record.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (at, i) = (end, i + 1);
        }
        (stage, held, i as u64 - held)
    });
    let watch_sent = tokio::spawn(async move {
        // What the stage says was sent never passes what the frames carried.
        let mut highest = Lsn(start);
        while sent_rx.changed().await.is_ok() {
            highest = highest.max(*sent_rx.borrow_and_update());
        }
        highest
    });
    // Nobody reads the frames at first: batches queue up and are staged ahead.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (got, keepalives) = restore_frames(&mut rx, start, len, &|| true, PAUSE).await;
    assert_eq!(keepalives, 0, "no batch had a keepalive");
    assert_eq!(got.len(), len, "more WAL restored than was fed");
    assert!(got == wal, "restored WAL differs from what was fed");
    let (stage, more, rest) = feed.await.unwrap();
    drop(stage);
    let highest = watch_sent.await.unwrap();
    assert_eq!(highest, Lsn(start + len as u64));
    let t = metrics.ops.codec.snapshot();
    // Only the ends of batches without `more` cut records; nearly every other end holds one.
    assert!(t.records_cut <= rest, "{rest} batches without more: {t:?}");
    assert!(
        t.records_held * 4 >= more * 3,
        "{more} batches with more: {t:?}"
    );
    assert!(metrics.codec_staged_messages[0].load(Ordering::Relaxed) > 0);
}

/// Batches waiting for the thread while the link takes every frame at once: the thread is
/// short of CPU and turns the codec's fast settings on (`link.catch_up`);
/// behind a link that cannot take the frames it never does. The frames restore the WAL
/// either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_on_cpu_goes_fast_behind_a_full_link_does_not() {
    for (link_open, jobs) in [(true, 60), (false, 30)] {
        let metrics = Arc::new(Metrics::default());
        let framer = Framer::new(
            WalEncoder::new(&wal_setup()).unwrap(),
            metrics.ops.codec.session(),
            metrics.clone(),
            0,
        );
        let (tx, mut rx) = mpsc::channel(if link_open { 4 * jobs } else { 1 });
        let (sent, _sent_rx) = watch::channel(Lsn(0));
        let stage = EncodeStage::spawn(framer, tx, sent, true).unwrap();
        let mut at = 0x100_0000u64;
        // Made before any is sent: the feed hands them over faster than the thread encodes.
        let batches: Vec<_> = (0..jobs).map(|i| job(i, &mut at)).collect();
        let feed = tokio::spawn(async move {
            let mut want = Vec::new();
            for (job, bytes) in batches {
                want.extend_from_slice(&bytes);
                stage.send(job).await.unwrap();
            }
            want
        });
        // A full link: the reader takes a frame every 50 ms, far longer than a batch takes.
        let (got, _) = restore_frames(
            &mut rx,
            0x100_0000,
            jobs * RUN,
            &|| link_open,
            Duration::from_millis(50),
        )
        .await;
        assert!(
            got == feed.await.unwrap(),
            "restored WAL differs from what was fed"
        );
        let fast = metrics.codec_fast_messages.load(Ordering::Relaxed);
        let spells = metrics.codec_fast_spells.load(Ordering::Relaxed);
        if link_open {
            // Most of them when the feed keeps the queue full; a busy machine that is slow to
            // wake the feed leaves gaps in the run (14 to 27 of 30 here with other tests).
            assert!(fast > 0, "no batch of {jobs} fast");
            // Counted each time they go on, not per batch; at most one spell per batch.
            assert!(
                (1..=fast).contains(&spells),
                "{spells} spells for {fast} batches"
            );
        } else {
            assert_eq!((fast, spells), (0, 0), "fast settings behind a full link");
        }
    }
}

/// The `zstd` codec has no fast settings: behind on CPU with the link open, the thread
/// neither claims nor counts any.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_leaves_the_zstd_codec_alone() {
    const JOBS: usize = 40;
    let metrics = Arc::new(Metrics::default());
    let setup = Setup {
        kind: CodecKind::Zstd,
        ..wal_setup()
    };
    let framer = Framer::new(
        WalEncoder::new(&setup).unwrap(),
        metrics.ops.codec.session(),
        metrics.clone(),
        0,
    );
    let (tx, mut rx) = mpsc::channel(4 * JOBS);
    let (sent, _sent_rx) = watch::channel(Lsn(0));
    let stage = EncodeStage::spawn(framer, tx, sent, true).unwrap();
    let mut at = 0x100_0000u64;
    let batches: Vec<_> = (0..JOBS).map(|i| job(i, &mut at)).collect();
    let feed = tokio::spawn(async move {
        for (job, _) in batches {
            stage.send(job).await.unwrap();
        }
    });
    for _ in 0..JOBS {
        rx.recv().await.expect("the stage ended early").unwrap();
    }
    feed.await.unwrap();
    // (With the settings claimed for every codec, this counted most batches here.)
    assert_eq!(metrics.codec_fast_messages.load(Ordering::Relaxed), 0);
}
