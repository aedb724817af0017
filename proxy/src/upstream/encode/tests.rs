//! The encode stage under a primary that writes faster than it encodes: batches staged one
//! ahead still give the frames, in order, that restore the primary's bytes.

use std::time::Duration;

use super::*;
use crate::testwal::{raw_run, wal_setup};
use walrelay_wal::linkcodec::WalDecoder;

const RUN: usize = 96 * 1024;

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
    };
    (job, all)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_staged_ahead_restore_in_order() {
    let metrics = Arc::new(Metrics::default());
    let framer = Framer {
        encoder: WalEncoder::new(&wal_setup()).unwrap(),
        state: DownState::default(),
        codec_stats: metrics.ops.codec.session(),
        metrics: metrics.clone(),
    };
    let (tx, mut rx) = mpsc::channel(1);
    let (sent, sent_rx) = watch::channel(Lsn(0));
    let stage = EncodeStage::spawn(framer, tx, sent).unwrap();
    const JOBS: usize = 40;
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
    // Nobody reads the frames for a while: the batches queue up behind the thread.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut state = DownState::default();
    let mut dec = WalDecoder::new(&wal_setup()).unwrap();
    let (mut got, mut restored) = (Vec::new(), Vec::new());
    let mut next = 0x100_0000u64;
    let mut keepalives = 0;
    while got.len() < JOBS * RUN {
        let msg = rx.recv().await.expect("the stage ended early").unwrap();
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
