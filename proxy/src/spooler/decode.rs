//! The decode stage: the upstream's frames restored, verified and applied on a thread of the
//! stream's own, while the runtime receives the next frames and the spool writer writes the
//! last.
//!
//! The stream ([`super::client`]) hands each frame as it arrives to the `walrelay-decode`
//! thread, which owns the frame state and the WAL decoder: it parses the frame, restores
//! every WAL run, checks the frame's digest over the restored bytes, and only then applies
//! the frame's items, in arrival order, through the stream's [`Apply`] (WAL and timeline
//! switches to the spool's writer thread, answers to the standbys' channels). Applying here
//! rather than on the runtime saves a wake-up per frame: a wake-up across cores cost the waker
//! 85–120 µs on the bench's virtual machine (docs/keeping-up.md, thirty-sixth round). Nothing of a
//! frame that fails verification is applied: the thread reports the failure instead and
//! stops. The input holds [`QUEUE`] frames, so at most `QUEUE + 1` frames (each within
//! `limits.max_message_bytes`) are in the stage; when the spool writer is slow, `apply`
//! waits, the input fills and the stream stops reading from the link (HTTP/2 flow control
//! then holds the upstream back).
//!
//! While the queue behind the frame being restored is full, the codec may use more cores
//! (`WalDecoder::set_parallel`: images compressed again on a worker) and the thread works one
//! frame ahead: it stages the WAL payloads of the frame and of the next one in the queue
//! (`WalDecoder::stage`), so that the second's sections are decompressed on the codec's
//! thread while the first's records are restored here. Otherwise it restores one frame at a
//! time on one core, which costs the least CPU. So it does too while its own thread waits for
//! a CPU a quarter as long as it runs ([`crate::coreshare`]): a second thread would then only
//! share the same CPU time. What it applies is the same either way.
//!
//! A small frame (≤ [`INLINE_MAX`] bytes) that finds the thread idle and the writer ready is
//! restored, verified and applied by the stream itself, under the same lock: a synchronous
//! commit then waits for no thread to wake up. Order is kept: the thread counts a frame done
//! only once it is applied.
//!
//! When the stream ends, the thread applies the frames it still holds and stops; the stream
//! waits for that (the failure channel closing) before the next one states where the spool
//! ends.

use bytes::Bytes;
use tokio::sync::mpsc;

use walrelay_proto::frame::{Digest, Down, DownState};
use walrelay_wal::linkcodec::WalDecoder;
use walrelay_wal::lsn::Lsn;
use walrelay_wal::walcodec::STAGED_MAX;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::lock;
use crate::coreshare::CoreShare;
use crate::metrics::{timed, Metrics};

/// Frames waiting for the thread.
pub const QUEUE: usize = 2;

/// A verified frame's item, owning its bytes.
#[derive(Debug)]
pub enum Item {
    /// Restored WAL from `start`; `primary_end`: the primary's end of WAL when it was sent.
    Wal {
        start: Lsn,
        primary_end: u64,
        bytes: Vec<u8>,
    },
    Timeline {
        tli: u32,
        history: Vec<u8>,
    },
    Backend {
        chan: u32,
        bytes: Vec<u8>,
    },
    Started {
        chan: u32,
        synchronous: bool,
    },
    Keepalive {
        end: u64,
    },
}

/// Why the stage stopped.
#[derive(Debug)]
pub enum Failure {
    /// WAL failed to restore or the frame failed verification.
    Integrity(String),
    /// The frame could not be parsed.
    Malformed(String),
    /// A verified frame could not be applied (the spool's writer stopped).
    Stopped(String),
}

/// Where verified frames go, in order: on the decode thread, or on the stream's task for a
/// small frame that found the thread idle.
pub trait Apply: Send + 'static {
    /// Applies one verified frame's items in order, waiting while the spool's writer is
    /// full; `Err` (why) when they cannot be: the stage then stops.
    fn apply(&mut self, items: Vec<Item>) -> Result<(), String>;

    /// Whether `apply` would not wait now (the writer has nothing queued): the stream's
    /// task restores a small frame itself only then, so the runtime never waits on a disk.
    fn ready(&self) -> bool;
}

/// Limits of what a frame may hold (`limits.max_message_bytes` and the link's).
#[derive(Clone, Copy)]
pub struct Caps {
    pub max_raw: usize,
    pub max_frame: usize,
}

/// Largest frame the stream restores itself when the thread is idle (see
/// [`FrameInput::send`]).
pub const INLINE_MAX: usize = 8 * 1024;

/// The stream's handle on its decode thread.
pub struct DecodeStage {
    pub frames: FrameInput,
    /// The failure that stopped the stage; closes without one once the input is closed and
    /// the thread applied every frame it had.
    pub failed: mpsc::Receiver<Failure>,
}

/// Where the stream hands frames to the stage, in arrival order. Dropping it closes the
/// stage's input: the thread drains what it has, then the output closes.
pub struct FrameInput {
    frames: mpsc::Sender<Bytes>,
    decoding: Arc<Mutex<Decoding>>,
    /// Frames handed to the thread and not yet applied.
    in_flight: Arc<AtomicUsize>,
    failed: mpsc::Sender<Failure>,
}

impl FrameInput {
    /// Hands a frame on; `Err` when the stage stopped.
    ///
    /// A small frame that finds the thread idle and the writer ready is restored, verified
    /// and applied here instead: a synchronous commit then waits for no thread to wake up.
    /// Order is kept: with nothing in flight, every earlier frame is applied.
    pub async fn send(&self, frame: Bytes) -> Result<(), ()> {
        if self.in_flight.load(Ordering::Acquire) == 0 && frame.len() <= INLINE_MAX {
            let mut d = lock(&self.decoding);
            if d.sink.ready() {
                return d.frame(&frame, false).map_err(|f| {
                    // The only failure: the thread is idle and stops at none of its own.
                    let _ = self.failed.try_send(f);
                });
            }
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.frames.send(frame).await.map_err(|_| ())
    }
}

impl DecodeStage {
    pub fn spawn(
        decoder: WalDecoder,
        caps: Caps,
        metrics: Arc<Metrics>,
        sink: Box<dyn Apply>,
    ) -> std::io::Result<DecodeStage> {
        let (frames, frames_rx) = mpsc::channel(QUEUE);
        let (failed_tx, failed) = mpsc::channel(1);
        let thread_metrics = metrics.clone();
        let decoding = Arc::new(Mutex::new(Decoding {
            state: DownState::default(),
            ahead: None,
            stage_failed: false,
            decoder,
            caps,
            metrics,
            restored: Vec::new(),
            sink,
        }));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let thread = DecodeThread {
            decoding: decoding.clone(),
            in_flight: in_flight.clone(),
            metrics: thread_metrics,
        };
        let thread_failed = failed_tx.clone();
        std::thread::Builder::new()
            .name("walrelay-decode".into())
            .spawn(move || thread.run(frames_rx, thread_failed))?;
        let frames = FrameInput {
            frames,
            decoding,
            in_flight,
            failed: failed_tx,
        };
        Ok(DecodeStage { frames, failed })
    }
}

struct DecodeThread {
    decoding: Arc<Mutex<Decoding>>,
    in_flight: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
}

impl DecodeThread {
    fn run(&self, mut frames: mpsc::Receiver<Bytes>, failed: mpsc::Sender<Failure>) {
        // The next frame, taken from the queue early and maybe staged already.
        let mut ahead: Option<(Bytes, bool)> = None;
        let mut cores = CoreShare::for_this_thread();
        loop {
            let (frame, mut staged) = match ahead.take() {
                Some(a) => a,
                None => match frames.blocking_recv() {
                    Some(f) => (f, false),
                    None => return,
                },
            };
            // This frame and a full queue behind it: frames arrive faster than one core
            // restores them (a frame or two queued is a burst, which one core absorbs).
            let behind = self.in_flight.load(Ordering::Acquire) > QUEUE;
            // More cores only where another thread would get one (`crate::coreshare`).
            let spread = cores.spread(behind, &self.metrics.codec_short_of_cpu_messages[1]);
            if spread {
                if let Ok(next) = frames.try_recv() {
                    // Staged: this frame's sections decompress while the one before it is
                    // restored (see the module doc).
                    let mut d = lock(&self.decoding);
                    staged = staged || d.stage(&frame);
                    let next_staged = staged && d.stage(&next);
                    ahead = Some((next, next_staged));
                }
            }
            if let Err(f) = lock(&self.decoding).frame(&frame, spread) {
                // Nothing more is restored: `in_flight` stays above zero, so no frame is
                // restored inline either.
                let _ = failed.blocking_send(f);
                return;
            }
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The frame state, the WAL decoder and the sink of the stream, used by one of the thread and
/// the inline path at a time.
struct Decoding {
    state: DownState,
    /// The frame state after the last frame staged ahead of `state`, while one is staged
    /// (see [`Decoding::stage`]).
    ahead: Option<DownState>,
    /// A run failed to stage: nothing more is.
    stage_failed: bool,
    decoder: WalDecoder,
    caps: Caps,
    metrics: Arc<Metrics>,
    restored: Vec<u8>,
    sink: Box<dyn Apply>,
}

impl Decoding {
    /// Stages the WAL payloads of a frame that `frame` will restore later, after the frames
    /// staged before it (see `WalDecoder::stage`); false, and nothing staged, when they would
    /// not fit beside those staged already, or the codec does not stage, or the frame does
    /// not parse or stage (its turn in [`Decoding::frame`] reports why).
    fn stage(&mut self, frame: &[u8]) -> bool {
        if self.stage_failed {
            return false;
        }
        let mut state = match (self.decoder.staged(), &self.ahead) {
            (1.., Some(ahead)) => ahead.clone(),
            _ => self.state.clone(),
        };
        let Ok((items, _)) = state.parse(frame, self.caps.max_raw, self.caps.max_frame) else {
            return false;
        };
        let runs = items
            .iter()
            .filter(|i| matches!(i, Down::Wal { .. }))
            .count();
        if runs == 0 || self.decoder.staged() + runs > STAGED_MAX {
            return false;
        }
        self.decoder.set_parallel(true);
        for item in &items {
            if let Down::Wal { header: h, payload } = *item {
                let (start, n) = (Lsn(h.start), h.raw_len as usize);
                if !matches!(
                    self.decoder.stage(start, payload, n, self.caps.max_raw),
                    Ok(true)
                ) {
                    // Part of the frame may be staged: stage nothing more (the run that
                    // failed fails again when restored, which ends the stream; or the codec
                    // does not stage).
                    self.stage_failed = true;
                    return false;
                }
            }
        }
        self.ahead = Some(state);
        Metrics::add(&self.metrics.codec_staged_messages[1], runs as u64);
        true
    }

    /// One frame: restored, verified whole and applied, or a failure; `behind`: the queue
    /// behind it is full, so the codec may use more than one core
    /// (`WalDecoder::set_parallel`).
    fn frame(&mut self, frame: &[u8], behind: bool) -> Result<(), Failure> {
        let items = self.verified(frame, behind)?;
        self.sink.apply(items).map_err(Failure::Stopped)
    }

    /// One frame's items, restored and verified whole, or a failure.
    fn verified(&mut self, frame: &[u8], behind: bool) -> Result<Vec<Item>, Failure> {
        self.decoder.set_parallel(behind);
        if behind {
            Metrics::add(&self.metrics.codec_parallel_messages[1], 1);
        }
        let (items, sum) = self
            .state
            .parse(frame, self.caps.max_raw, self.caps.max_frame)
            .map_err(|e| Failure::Malformed(format!("malformed frame from the upstream: {e}")))?;

        let mut digest = Digest::default();
        let mut out = Vec::with_capacity(items.len());
        for item in &items {
            let owned = match *item {
                Down::Wal { header: h, payload } => {
                    let start = Lsn(h.start);
                    self.restore(start, payload, h.raw_len as usize)?;
                    item.digest(&mut digest, &self.restored);
                    out.push(Item::Wal {
                        start,
                        primary_end: h.end,
                        bytes: std::mem::take(&mut self.restored),
                    });
                    continue;
                }
                Down::Timeline { tli, history } => Item::Timeline {
                    tli,
                    history: history.to_vec(),
                },
                Down::Backend { chan, bytes } => Item::Backend {
                    chan,
                    bytes: bytes.to_vec(),
                },
                Down::Started { chan, synchronous } => Item::Started { chan, synchronous },
                Down::Keepalive { end, .. } => Item::Keepalive { end },
            };
            item.digest(&mut digest, &[]);
            out.push(owned);
        }
        if digest.finish() != sum {
            return Err(Failure::Integrity(
                "a link message failed verification".into(),
            ));
        }
        Ok(out)
    }

    fn restore(&mut self, start: Lsn, payload: &[u8], raw_len: usize) -> Result<(), Failure> {
        let metrics = &*self.metrics;
        Metrics::add(
            &metrics.ops.link_payload_bytes_received,
            payload.len() as u64,
        );
        let max = self.caps.max_raw;
        timed(&metrics.decode_ns, || {
            self.decoder
                .restore(start, payload, raw_len, max, &mut self.restored)
        })
        .map_err(|e| Failure::Integrity(format!("WAL from {start} failed to restore: {e}")))
    }
}

#[cfg(test)]
mod tests;
