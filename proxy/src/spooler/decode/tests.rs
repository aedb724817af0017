//! The decode stage while frames arrive faster than it restores them: frames staged one
//! ahead are still applied, in order, with exactly the WAL that was sent; and a frame that
//! fails verification or cannot be applied stops the stage with nothing of it applied.

use std::sync::mpsc as std_mpsc;
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

/// A sink that hands each applied frame's items to the test through a channel of `room`
/// frames (so that a test reading slowly holds the thread back), and fails from frame
/// `fail_at` on.
struct Collect {
    applied: std_mpsc::SyncSender<Vec<Item>>,
    fail_at: usize,
    seen: usize,
}

impl Apply for Collect {
    fn apply(&mut self, items: Vec<Item>) -> Result<(), String> {
        self.seen += 1;
        if self.seen >= self.fail_at {
            return Err(format!("frame {} not taken", self.seen));
        }
        self.applied.send(items).map_err(|e| e.to_string())
    }

    fn ready(&self) -> bool {
        true
    }
}

fn stage(
    room: usize,
    fail_at: usize,
) -> (DecodeStage, std_mpsc::Receiver<Vec<Item>>, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let decoder = WalDecoder::new(&wal_setup()).unwrap();
    let caps = Caps {
        max_raw: 1 << 20,
        max_frame: 4 << 20,
    };
    let (applied, rx) = std_mpsc::sync_channel(room);
    let sink = Box::new(Collect {
        applied,
        fail_at,
        seen: 0,
    });
    let stage = DecodeStage::spawn(decoder, caps, metrics.clone(), sink).unwrap();
    (stage, rx, metrics)
}

/// The next applied frame's items, waiting up to 30 s (off the runtime's scheduling).
fn next_applied(rx: &std_mpsc::Receiver<Vec<Item>>) -> Option<Vec<Item>> {
    tokio::task::block_in_place(|| rx.recv_timeout(Duration::from_secs(30)).ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_staged_ahead_pass_on_in_order() {
    const FRAMES: usize = 40;
    let (frames, want) = frames(FRAMES);
    let (
        DecodeStage {
            frames: input,
            failed,
        },
        applied,
        metrics,
    ) = stage(QUEUE, usize::MAX);
    let probe = input.frames.clone();
    let feed = tokio::spawn(async move {
        for f in frames {
            input.send(f).await.unwrap();
        }
    });
    // Nothing is taken until the queue in front of the thread is full (the thread holds a
    // frame it cannot apply, the feed waits with the next one counted): the next frame the
    // thread takes finds it behind however busy the machine, where a reader merely slower
    // than the thread depends on the thread's speed.
    wait_full(&probe).await;
    drop(probe);
    // Then the applied frames are taken slowly until the thread staged one ahead.
    let staged = || metrics.codec_parallel_messages[1].load(Ordering::Relaxed) > 0;

    let (mut got, mut next, mut keepalives) = (Vec::new(), 0x100_0000u64, 0);
    while got.len() < want.len() {
        let items = next_applied(&applied).expect("the stage ended early");
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
    // The feed dropped the input: the stage ends without a failure.
    assert!(
        tokio::time::timeout(Duration::from_secs(30), failed_end(failed))
            .await
            .expect("the stage ends once its input closes")
            .is_none()
    );
}

async fn failed_end(mut failed: mpsc::Receiver<Failure>) -> Option<Failure> {
    failed.recv().await
}

/// A frame whose digest does not match its restored WAL is not applied, nor is any after it;
/// the stage reports an integrity failure. A frame the sink refuses stops the stage too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_failing_verification_or_refused_stops_the_stage() {
    let (mut frames, _) = frames(6);
    // Frame 2's digest (its last bytes) altered.
    let mut bad = frames[2].to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 0x55;
    frames[2] = Bytes::from(bad);
    let (
        DecodeStage {
            frames: input,
            failed,
        },
        applied,
        _,
    ) = stage(16, usize::MAX);
    for f in frames.clone() {
        if input.send(f).await.is_err() {
            break;
        }
    }
    drop(input);
    let f = failed_end(failed).await;
    assert!(matches!(f, Some(Failure::Integrity(_))), "{f:?}");
    let n = std::iter::from_fn(|| applied.try_recv().ok()).count();
    assert_eq!(n, 2, "only the frames before the bad one are applied");

    // The sink refuses the fourth frame: three applied, then the stage stops with its reason.
    let (frames, _) = self::frames(6);
    let (
        DecodeStage {
            frames: input,
            failed,
        },
        applied,
        _,
    ) = stage(16, 4);
    for f in frames {
        if input.send(f).await.is_err() {
            break;
        }
    }
    drop(input);
    let f = failed_end(failed).await;
    assert!(
        matches!(&f, Some(Failure::Stopped(why)) if why == "frame 4 not taken"),
        "{f:?}"
    );
    assert_eq!(std::iter::from_fn(|| applied.try_recv().ok()).count(), 3);
}
