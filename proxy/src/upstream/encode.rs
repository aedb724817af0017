//! The encode stage: the feed's batches become link frames on a thread of the stream's own.
//!
//! The feed ([`super::feed`]) reads the primary and gathers batches on the runtime; encoding a
//! batch's WAL is CPU work of up to milliseconds per 256 kB, which on the runtime would stop
//! the feed from reading the primary meanwhile and hold a worker thread other sessions need.
//! So each stream has one `walrelay-encode` thread that owns the WAL encoder and the frame
//! state: the feed hands it batches over a channel of [`QUEUE`] batches (bounded memory:
//! at most `QUEUE + 1` batches of [`super::handshake::BATCH_MAX`] bytes wait or are being encoded),
//! the thread frames them in the order they came and sends the frames to the link stream,
//! then tells the standbys' entries how far the WAL sent down reaches. Reading the primary,
//! TLS and HTTP/2 run on the runtime while the thread encodes: two cores at work per stream
//! when the primary writes faster than one encodes.
//!
//! While the queue behind the batch being encoded is full (the feed waits), the codec may use
//! more cores (`WalEncoder::set_parallel`: image checks on a worker) and the thread works one
//! batch ahead: it stages the batch and the next one (`WalEncoder::stage`), so that the
//! first's streams are compressed on the codec's section thread while the second's records
//! are transformed here, then frames the first. Otherwise it encodes one batch at a time on
//! one core, which costs the least CPU. So it does too while its own thread waits for a CPU
//! a quarter as long as it runs ([`crate::coreshare`]): a second thread would then only share
//! the same CPU time. The frames and their bytes are the same either way.
//!
//! While batches keep waiting for the thread and the link takes its frames at once, the
//! thread is short of CPU: it then has the codec compress its bulk streams at a fast zstd
//! level until it keeps up again (`link.catch_up`, [`catchup`]: more bytes, less lag).
//!
//! A batch that ended because the primary's next WAL did not fit ([`Job::more`]) may leave
//! the head of the record its end cuts (at most `hold_max` bytes,
//! [`super::handshake::hold_max`]) to the next batch: the framer keeps it and puts it first in
//! the next batch's WAL, so that the codec encodes the record whole instead of passing it raw
//! in two pieces (`WalEncoder::encode_held`). The record could not be replayed before its
//! end arrives anyway. The sent position ([`Job::wal_end`]) then ends where the frame's WAL
//! does.
//!
//! A small batch (≤ [`INLINE_MAX`] bytes of WAL) that finds the thread idle is framed by the
//! feed itself, under the same lock: a synchronous commit's few hundred bytes then wait for
//! no thread to wake up, which on a busy machine means waiting for a core.
//!
//! Order is the channel's: everything that goes down the stream (WAL, keepalives, command
//! results, timeline switches) passes through the stage, and the inline path runs only when
//! every earlier batch is already in the stream's queue. When the link cannot take frames,
//! the thread blocks on the stream's queue, the batch channel fills and the feed stops
//! reading from the primary, as before. The thread ends when the feed drops its side (the
//! stream ended), when the link stream is gone, or on an encoding error, which the feed
//! then reports as the stream's end.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::BytesMut;
use tokio::sync::{mpsc, watch};
use tonic::Status;

use walrelay_proto::frame::{self, Digest, Down, DownState, WalHeader};
use walrelay_proto::link::{to_downstream, ToDownstream};
use walrelay_wal::linkcodec::WalEncoder;
use walrelay_wal::lsn::Lsn;
use walrelay_wal::walcodec::STAGED_MAX;

use crate::coreshare::CoreShare;
use crate::metrics::{timed, Metrics};
use crate::monitor::codec_totals::SessionCodecStats;

mod catchup;
use catchup::{CatchUp, Seen};

/// What a standby's own connection sends down the stream (through the feed's batches).
#[derive(Debug)]
pub enum Event {
    /// The primary's answer to a command of the standby (whole backend messages).
    Backend { chan: u32, bytes: Vec<u8> },
    /// The standby's connection streams as it; `synchronous`: a commit may wait for it.
    Started { chan: u32, synchronous: bool },
}

/// Batches waiting for the encode thread.
pub const QUEUE: usize = 2;

/// One run of contiguous WAL, or another item, waiting to be framed.
pub enum Part {
    Wal {
        header: WalHeader,
        data: BytesMut,
    },
    Keepalive {
        end: u64,
        send_time: i64,
    },
    Event(Event),
    /// The primary moved to timeline `tli`, whose history file this is.
    Timeline {
        tli: u32,
        history: Vec<u8>,
    },
}

/// One frame's worth of items; `wal_end`: where its WAL ends, if it has any.
pub struct Job {
    pub parts: Vec<Part>,
    pub wal_end: Option<Lsn>,
    /// The batch ended because the primary's next WAL did not fit: the head of a record its
    /// end cut may wait for the next batch ([`Framer::hold_max`]).
    pub more: bool,
}

/// What the thread owns: the encoder and the frame state, in stream order.
pub struct Framer {
    encoder: WalEncoder,
    state: DownState,
    codec_stats: SessionCodecStats,
    metrics: Arc<Metrics>,
    /// Most bytes of a batch's end held back for the next batch
    /// ([`super::handshake::hold_max`]).
    hold_max: usize,
    /// WAL held back from the last batch: the head of a record its end cut, which goes
    /// first in the next batch, so that the codec sees the record whole
    /// (`WalEncoder::encode_held`; a cut record passes raw). Only a batch that the
    /// primary's next WAL follows at once holds anything ([`Job::more`]).
    carry: Option<(WalHeader, BytesMut)>,
}

/// Most WAL bytes in a batch the feed encodes itself when the thread is idle (see
/// [`EncodeStage::send`]): tens of microseconds of work.
pub const INLINE_MAX: usize = 16 * 1024;

/// The feed's handle on its encode thread.
pub struct EncodeStage {
    jobs: mpsc::Sender<Job>,
    /// Why the thread stopped, if it failed.
    failed: Arc<Mutex<Option<Status>>>,
    out: Output,
}

/// The framer and where its frames go, shared by the thread and the feed's inline path.
#[derive(Clone)]
struct Output {
    framer: Arc<Mutex<Framer>>,
    /// Batches handed to the thread and not yet sent down by it.
    in_flight: Arc<AtomicUsize>,
    tx: mpsc::Sender<Result<ToDownstream, Status>>,
    sent: Arc<watch::Sender<Lsn>>,
}

impl Output {
    fn framer(&self) -> std::sync::MutexGuard<'_, Framer> {
        self.framer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stages the batch's WAL runs with more than one core allowed ([`Framer::stage`]);
    /// false, and nothing staged, when they do not fit beside those staged already.
    fn stage(&self, job: &mut Job) -> Result<bool, Status> {
        let mut framer = self.framer();
        framer.encoder.set_parallel(true);
        framer.stage(job)
    }

    /// The batch's frame, encoded under the framer's lock (its WAL runs `staged` before, or
    /// encoded now); `spread`: the queue behind it is full and another thread would get a
    /// core, so the codec may use more than one (`WalEncoder::set_parallel`).
    fn frame(&self, job: &mut Job, spread: bool, staged: bool) -> Result<ToDownstream, Status> {
        let mut framer = self.framer();
        if !staged {
            framer.encoder.set_parallel(spread);
        }
        if spread {
            Metrics::add(&framer.metrics.codec_parallel_messages[0], 1);
        }
        if framer.encoder.fast() {
            Metrics::add(&framer.metrics.codec_fast_messages, 1);
        }
        let frame = framer.frame(job, staged)?;
        Metrics::add(&framer.metrics.link_messages_out, 1);
        Ok(ToDownstream {
            msg: Some(to_downstream::Msg::Frame(frame.into())),
        })
    }

    /// The codec's fast settings on or off from the next batch on ([`catchup`]).
    fn set_fast(&self, fast: bool) {
        let mut framer = self.framer();
        framer.encoder.set_fast(fast);
        if fast {
            Metrics::add(&framer.metrics.codec_fast_spells, 1);
            tracing::info!(
                "the relay is short of CPU and falls behind the primary: compressing the bulk of the WAL at a fast zstd level until it keeps up (more bytes on the link; link.catch_up = false turns this off)"
            );
        } else {
            tracing::info!("the relay keeps up again: back to the configured zstd level");
        }
    }

    fn sent_down(&self, job: &Job) {
        if let Some(end) = job.wal_end {
            self.sent.send_replace(end);
        }
    }
}

impl EncodeStage {
    /// Starts the thread. Frames go to `tx`; `sent` learns where the WAL sent down ends;
    /// `catch_up`: `link.catch_up` ([`catchup`]), which only the `wal` codec has settings for.
    pub fn spawn(
        framer: Framer,
        tx: mpsc::Sender<Result<ToDownstream, Status>>,
        sent: watch::Sender<Lsn>,
        catch_up: bool,
    ) -> Result<EncodeStage, Status> {
        let (jobs, rx) = mpsc::channel(QUEUE);
        let failed = Arc::new(Mutex::new(None));
        let catch_up = catch_up && framer.encoder.wal().is_some();
        let metrics = framer.metrics.clone();
        let out = Output {
            framer: Arc::new(Mutex::new(framer)),
            in_flight: Arc::new(AtomicUsize::new(0)),
            tx,
            sent: Arc::new(sent),
        };
        let thread = EncodeThread {
            out: out.clone(),
            jobs: rx,
            failed: failed.clone(),
            catch_up: CatchUp::new(catch_up),
            link_full: false,
            metrics,
        };
        std::thread::Builder::new()
            .name("walrelay-encode".into())
            .spawn(move || thread.run())
            .map_err(|e| {
                Status::internal(format!("cannot start the stream's encode thread: {e}"))
            })?;
        Ok(EncodeStage { jobs, failed, out })
    }

    /// Hands a batch to the thread, waiting while [`QUEUE`] batches wait already.
    ///
    /// A small batch while the thread has nothing to do is encoded here instead: a
    /// synchronous commit then waits for no thread to wake up. Order is kept: the feed is the
    /// only sender, and with nothing in flight every earlier frame is already in `tx`.
    pub async fn send(&self, mut job: Job) -> Result<(), Status> {
        if self.out.in_flight.load(Ordering::Acquire) == 0 && job.wal_bytes() <= INLINE_MAX {
            let msg = self.out.frame(&mut job, false, false)?;
            if self.out.tx.send(Ok(msg)).await.is_err() {
                return Err(Status::cancelled("the downstream went away"));
            }
            self.out.sent_down(&job);
            return Ok(());
        }
        self.out.in_flight.fetch_add(1, Ordering::AcqRel);
        if self.jobs.send(job).await.is_ok() {
            return Ok(());
        }
        let failed = self.failed.lock().unwrap_or_else(|e| e.into_inner()).take();
        Err(failed.unwrap_or_else(|| Status::cancelled("the downstream went away")))
    }
}

impl Job {
    fn wal_bytes(&self) -> usize {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Wal { data, .. } => data.len(),
                _ => 0,
            })
            .sum()
    }
}

/// WAL runs among `parts` (each a message of the codec).
fn wal_runs(parts: &[Part]) -> usize {
    parts
        .iter()
        .filter(|p| matches!(p, Part::Wal { .. }))
        .count()
}

struct EncodeThread {
    out: Output,
    jobs: mpsc::Receiver<Job>,
    failed: Arc<Mutex<Option<Status>>>,
    catch_up: CatchUp,
    /// The link's stream had no room for the last frame when the thread sent it.
    link_full: bool,
    metrics: Arc<Metrics>,
}

impl EncodeThread {
    fn run(mut self) {
        // The next batch, taken from the queue early and maybe staged already.
        let mut ahead: Option<(Job, bool)> = None;
        let mut cores = CoreShare::for_this_thread();
        loop {
            let (mut job, mut staged) = match ahead.take() {
                Some(a) => a,
                None => match self.jobs.blocking_recv() {
                    Some(job) => (job, false),
                    None => return,
                },
            };
            // This batch and a full queue behind it: the feed waits, the primary writes
            // faster than one core encodes. (A batch or two queued is a burst, which one
            // core absorbs; threads for it cost CPU and bought no lag in the bench.)
            let behind = self.out.in_flight.load(Ordering::Acquire) > QUEUE;
            let seen = Seen {
                behind,
                link_full: self.link_full,
            };
            if let Some(fast) = self.catch_up.observe(Instant::now(), seen) {
                self.out.set_fast(fast);
            }
            // More cores only where another thread would get one (`crate::coreshare`).
            let spread = cores.spread(behind, &self.metrics.codec_short_of_cpu_messages[0]);
            let r = self.look_ahead(&mut job, &mut staged, spread, &mut ahead);
            let msg = match r.and_then(|()| self.out.frame(&mut job, spread, staged)) {
                Ok(m) => m,
                Err(status) => {
                    *self.failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(status);
                    return;
                }
            };
            self.link_full = self.out.tx.capacity() == 0;
            if self.out.tx.blocking_send(Ok(msg)).is_err() {
                return;
            }
            self.out.sent_down(&job);
            self.out.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// While behind with cores to spare (`spread`): stages `job` (unless it is already) and
    /// the next batch in the queue, so that compressing the first overlaps transforming the
    /// second. The next batch, staged or not, goes to `ahead`.
    fn look_ahead(
        &mut self,
        job: &mut Job,
        staged: &mut bool,
        spread: bool,
        ahead: &mut Option<(Job, bool)>,
    ) -> Result<(), Status> {
        if !spread || ahead.is_some() || wal_runs(&job.parts) == 0 {
            return Ok(());
        }
        let Ok(mut next) = self.jobs.try_recv() else {
            return Ok(());
        };
        if !*staged {
            *staged = self.out.stage(job)?;
        }
        let next_staged = *staged && wal_runs(&next.parts) > 0 && self.out.stage(&mut next)?;
        *ahead = Some((next, next_staged));
        Ok(())
    }
}

impl Framer {
    /// A stream's framer; `hold_max`: [`super::handshake::hold_max`].
    pub fn new(
        encoder: WalEncoder,
        codec_stats: SessionCodecStats,
        metrics: Arc<Metrics>,
        hold_max: usize,
    ) -> Framer {
        Framer {
            encoder,
            state: DownState::default(),
            codec_stats,
            metrics,
            hold_max,
            carry: None,
        }
    }

    /// Puts the WAL held back from the batch before first in `job`, joined to the job's
    /// first run when that follows on.
    fn take_carry(&mut self, job: &mut Job) {
        let Some((head, bytes)) = self.carry.take() else {
            return;
        };
        let end = head.start + bytes.len() as u64;
        match job.parts.first_mut() {
            Some(Part::Wal { header, data }) if header.start == end => {
                let mut joined = bytes;
                joined.extend_from_slice(data);
                *data = joined;
                header.start = head.start;
            }
            _ => job.parts.insert(
                0,
                Part::Wal {
                    header: head,
                    data: bytes,
                },
            ),
        }
        job.wal_end = job.wal_end.max(Some(Lsn(end)));
    }

    /// Bytes the encoder may hold back of part `i` of `job`: only of the last, a WAL run, of
    /// a batch the primary's next WAL follows.
    fn hold(&self, job: &Job, i: usize) -> usize {
        match job.more && i + 1 == job.parts.len() {
            true => self.hold_max,
            false => 0,
        }
    }

    /// The encoder took the first `n` bytes of the job's WAL run `i`: the rest waits for the
    /// next batch ([`Framer::carry`]) and the job's WAL ends there.
    fn held(&mut self, job: &mut Job, i: usize, n: usize) {
        let Some(Part::Wal { header, data }) = job.parts.get_mut(i) else {
            return;
        };
        if n >= data.len() {
            return;
        }
        let rest = data.split_off(n);
        let start = header.start + n as u64;
        self.carry = Some((WalHeader { start, ..*header }, rest));
        job.wal_end = Some(Lsn(start));
    }

    /// Stages the job's WAL runs (`WalEncoder::stage`) for [`Framer::frame`], the WAL held
    /// back from the batch before first; false, and nothing staged, when they would not fit
    /// beside the runs staged already.
    pub fn stage(&mut self, job: &mut Job) -> Result<bool, Status> {
        self.take_carry(job);
        let runs = wal_runs(&job.parts);
        if self.encoder.staged() + runs > STAGED_MAX {
            return Ok(false);
        }
        for i in 0..job.parts.len() {
            let hold = self.hold(job, i);
            if let Part::Wal { header, data } = &job.parts[i] {
                let start = Lsn(header.start);
                let encoder = &mut self.encoder;
                let n = timed(&self.metrics.encode_ns, || {
                    encoder.stage_held(start, data, hold)
                })
                .map_err(|e| Status::internal(format!("encoding WAL at {start}: {e}")))?;
                self.held(job, i, n);
            }
        }
        Metrics::add(&self.metrics.codec_staged_messages[0], runs as u64);
        Ok(true)
    }

    /// Builds the job's frame: its WAL runs `staged` by [`Framer::stage`] (their payloads
    /// collected in order), or encoded now after the WAL held back from the batch before.
    pub fn frame(&mut self, job: &mut Job, staged: bool) -> Result<Vec<u8>, Status> {
        if !staged {
            self.take_carry(job);
        }
        let (mut out, mut digest, mut encoded) = (Vec::new(), Digest::default(), Vec::new());
        for i in 0..job.parts.len() {
            let hold = if staged { 0 } else { self.hold(job, i) };
            let item = match &job.parts[i] {
                Part::Wal { header, data } => {
                    let n = self.encode_run(header, data, staged, hold, &mut encoded)?;
                    let sent = data.get(..n).unwrap_or(data);
                    self.put_run(header, sent, &encoded, &mut out, &mut digest)?;
                    self.held(job, i, n);
                    continue;
                }
                Part::Keepalive { end, send_time } => Down::Keepalive {
                    end: *end,
                    send_time: *send_time,
                },
                Part::Event(Event::Backend { chan, bytes }) => Down::Backend { chan: *chan, bytes },
                Part::Event(Event::Started { chan, synchronous }) => Down::Started {
                    chan: *chan,
                    synchronous: *synchronous,
                },
                Part::Timeline { tli, history } => Down::Timeline { tli: *tli, history },
            };
            self.state.put(&mut out, &item);
            item.digest(&mut digest, &[]);
        }
        frame::finish(&mut out, &digest);
        Ok(out)
    }

    /// One WAL run's payload into `encoded`: collected (`staged`), or encoded now with up
    /// to `hold` bytes of its end held back. Returns how many of its bytes the payload holds.
    fn encode_run(
        &mut self,
        header: &WalHeader,
        data: &[u8],
        staged: bool,
        hold: usize,
        encoded: &mut Vec<u8>,
    ) -> Result<usize, Status> {
        let start = Lsn(header.start);
        let encoder = &mut self.encoder;
        let got = timed(&self.metrics.encode_ns, || match staged {
            true => encoder
                .collect(encoded)
                .map(|got| got.then_some(data.len())),
            false => encoder.encode_held(start, data, hold, encoded).map(Some),
        })
        .map_err(|e| Status::internal(format!("encoding WAL at {start}: {e}")))?;
        got.ok_or_else(|| {
            Status::internal(format!(
                "encoding WAL at {start}: the run was staged but its payload is missing"
            ))
        })
    }

    /// One encoded WAL run: counted, put in the frame.
    fn put_run(
        &mut self,
        header: &WalHeader,
        data: &[u8],
        encoded: &[u8],
        out: &mut Vec<u8>,
        digest: &mut Digest,
    ) -> Result<(), Status> {
        let header = WalHeader {
            raw_len: u32::try_from(data.len())
                .map_err(|_| Status::internal("a WAL run longer than 4 GiB"))?,
            ..*header
        };
        let metrics = &*self.metrics;
        Metrics::add(&metrics.wal_payload_bytes_out, encoded.len() as u64);
        self.codec_stats.observe(&self.encoder, &metrics.ops.codec);
        self.state.put_wal(out, &header, encoded);
        digest.wal(&header, data);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
