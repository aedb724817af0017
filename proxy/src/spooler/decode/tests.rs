//! The decode stage while frames arrive faster than it restores them: frames staged one
//! ahead still pass on, in order, exactly the WAL that was sent.

use std::time::Duration;

use super::*;
use crate::testwal::{raw_run, wait_full, wal_setup};
use walrelay_proto::frame::{self, WalHeader};
use walrelay_wal::linkcodec::WalEncoder;

const RUN: usize = 96 * 1024;

fn run_bytes(i: usize) -> Vec<u8> {
    raw_run(i, RUN)
}

/// The frames the upstream would send: frame `i` holds one WAL run, every third one two runs
/// with a keepalive between them.
fn frames(n: usize) -> (Vec<Bytes>, Vec<u8>) {
    let mut enc = WalEncoder::new(&wal_setup()).unwrap();
    let mut state = DownState::default();
    let (mut out, mut all, mut payload) = (Vec::new(), Vec::new(), Vec::new());
    let mut at = 0x100_0000u64;
    for i in 0..n {
        let bytes = run_bytes(i);
        let runs: Vec<&[u8]> = match i % 3 {
            0 => vec![&bytes[..RUN / 3], &bytes[RUN / 3..]],
            _ => vec![&bytes[..]],
        };
        let (mut f, mut digest) = (Vec::new(), Digest::default());
        for (k, run) in runs.iter().enumerate() {
            if k > 0 {
                let item = Down::Keepalive {
                    end: at,
                    send_time: 0,
                };
                state.put(&mut f, &item);
                item.digest(&mut digest, &[]);
            }
            let header = WalHeader {
                start: at,
                end: at + run.len() as u64,
                send_time: 0,
                raw_len: run.len() as u32,
            };
            enc.encode(Lsn(at), run, &mut payload).unwrap();
            state.put_wal(&mut f, &header, &payload);
            digest.wal(&header, run);
            at += run.len() as u64;
        }
        frame::finish(&mut f, &digest);
        out.push(Bytes::from(f));
        all.extend_from_slice(&bytes);
    }
    (out, all)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_staged_ahead_pass_on_in_order() {
    const FRAMES: usize = 40;
    let (frames, want) = frames(FRAMES);
    let metrics = Arc::new(Metrics::default());
    let decoder = WalDecoder::new(&wal_setup()).unwrap();
    let caps = Caps {
        max_raw: 1 << 20,
        max_frame: 4 << 20,
    };
    let DecodeStage {
        frames: input,
        mut verified,
    } = DecodeStage::spawn(decoder, caps, metrics.clone()).unwrap();
    let probe = input.frames.clone();
    let feed = tokio::spawn(async move {
        for f in frames {
            input.send(f).await.unwrap();
        }
    });
    // Nothing is taken until the queue in front of the thread is full (the thread holds a
    // frame it cannot pass on, the feed waits with the next one counted): the next frame the
    // thread takes finds it behind however busy the machine, where a reader merely slower
    // than the thread depends on the thread's speed.
    wait_full(&probe).await;
    drop(probe);
    // Then the verified frames are taken slowly until the thread staged one ahead.
    let staged = || metrics.codec_parallel_messages[1].load(Ordering::Relaxed) > 0;

    let (mut got, mut next, mut keepalives) = (Vec::new(), 0x100_0000u64, 0);
    while got.len() < want.len() {
        let items = verified
            .recv()
            .await
            .expect("the stage ended early")
            .unwrap_or_else(|f| panic!("{f:?}"));
        for item in items {
            match item {
                Item::Wal { start, bytes, .. } => {
                    assert_eq!(start, Lsn(next), "runs out of order");
                    next += bytes.len() as u64;
                    got.extend_from_slice(&bytes);
                }
                Item::Keepalive { end } => {
                    assert_eq!(end, next, "a keepalive out of place");
                    keepalives += 1;
                }
                other => panic!("unexpected item {other:?}"),
            }
        }
        if !staged() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    feed.await.unwrap();
    assert!(got == want, "restored WAL differs from what was sent");
    assert_eq!(keepalives, FRAMES.div_ceil(3));
    // The queue was full behind some frames: those were staged ahead.
    assert!(metrics.codec_parallel_messages[1].load(Ordering::Relaxed) > 0);
    assert!(metrics.codec_staged_messages[1].load(Ordering::Relaxed) > 0);
}
