//! The encoder's second half: a message's streams compressed into its payload, here or on a
//! thread while the caller transforms the next message.
//!
//! Encoding a message is two halves: turning its records into the streams (the rest of the
//! encoder), then compressing the streams into the payload ([`Sections::write`]). On one core
//! a bulk load spends about three quarters of its encoding in the second half, pgbench about
//! a quarter. [`Encoder::stage`](super::Encoder::stage) does the first half and hands the
//! message here; [`Encoder::collect`](super::Encoder::collect) takes the oldest payload.
//!
//! Where a message is compressed:
//! - **here**, at once, when the caller did not allow more than one core or the streams hold
//!   less than [`AWAY_MIN`] bytes;
//! - **on the thread** (`walcodec-sections`, started when first needed) otherwise: the zstd
//!   contexts ([`Sections`]) travel to it with the message and come back with the payload,
//!   so no context is ever used by two threads and each sees its messages in stream order;
//!   the payload bytes are the same wherever they were made;
//! - **later**, when the contexts are away with the message before: it waits here and goes
//!   to the thread as soon as the contexts come back ([`Sealer::pop`]).
//!
//! Bounds: at most [`STAGED_MAX`] messages are staged and not collected (one compressing, the
//! others transformed and waiting); [`Sealer::push`] refuses one more. Each holds its streams' input
//! (a few times the message's WAL at most, see [`payload::cap`]) and its page frames.
//!
//! [`payload::cap`]: super::super::payload::cap

use std::collections::VecDeque;
use std::sync::mpsc;
use std::thread::JoinHandle;

use super::super::payload::Sections;
use super::super::rmgr::MsgTally;
use super::super::{WalCodecError, STREAMS, S_CTRL, S_DATA, S_HDR, S_IMG, S_MAIN, S_PAGE, S_RAW};
use super::Encoder;

/// Most messages staged and not collected: a caller one batch ahead of the batch it frames,
/// with up to two messages in each batch.
pub const STAGED_MAX: usize = 4;
/// Least streams input (bytes) of a message compressed on the thread: below it the hand-over
/// costs about what it saves.
pub const AWAY_MIN: usize = 32 * 1024;

/// A transformed message, its streams not compressed yet.
pub(in crate::walcodec) struct Staged {
    pub bufs: [Vec<u8>; STREAMS],
    /// Its page frames (already compressed, go after the sections).
    pub fpi: Vec<u8>,
    /// Its records' bytes per resource manager, settled once the sections' sizes are known.
    pub tally: MsgTally,
    pub raw_len: usize,
}

/// A message's payload and what the counters need.
pub(in crate::walcodec) struct Sealed {
    /// The message (its streams' buffers emptied, to be used again).
    pub staged: Staged,
    pub payload: Vec<u8>,
    pub ulens: [usize; STREAMS],
    pub clens: [usize; STREAMS],
}

type Outcome = Result<Sealed, WalCodecError>;

enum Slot {
    /// Waiting for the contexts (away with the message before).
    Waiting(Staged),
    /// On the thread.
    Away,
    Done(Outcome),
}

pub(in crate::walcodec) struct Sealer {
    /// The contexts when on this thread (`None` while away with a message).
    home: Option<Box<Sections>>,
    /// Staged messages, oldest first; at most one `Away`, and `Waiting` ones only after it.
    slots: VecDeque<Slot>,
    thread: Option<SealThread>,
    /// Emptied buffers for the next messages.
    spare: Vec<Staged>,
    spare_payloads: Vec<Vec<u8>>,
}

struct SealThread {
    jobs: Option<mpsc::SyncSender<Job>>,
    done: mpsc::Receiver<(Box<Sections>, Outcome)>,
    handle: Option<JoinHandle<()>>,
}

struct Job {
    sections: Box<Sections>,
    staged: Staged,
    payload: Vec<u8>,
}

/// Compresses `st`'s streams into `payload` (cleared first).
fn seal(sections: &mut Sections, mut st: Staged, mut payload: Vec<u8>) -> Outcome {
    payload.clear();
    let ulens = std::array::from_fn(|s| st.bufs[s].len());
    let mut clens = [0; STREAMS];
    sections.write(&mut st.bufs, &st.fpi, &mut payload, &mut clens)?;
    Ok(Sealed {
        staged: st,
        payload,
        ulens,
        clens,
    })
}

impl Encoder {
    /// The payload of the oldest staged message into `out` (cleared first; waits for it if
    /// it is being compressed on the thread); false when nothing is staged.
    pub fn collect(&mut self, out: &mut Vec<u8>) -> Result<bool, WalCodecError> {
        out.clear();
        let sealed = match self.sealer.pop() {
            None => return Ok(false),
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                self.poisoned = true;
                return Err(e);
            }
        };
        let Sealed {
            mut staged,
            mut payload,
            ulens,
            clens,
        } = sealed;
        self.count(&mut staged, &payload, &ulens, &clens);
        std::mem::swap(out, &mut payload);
        self.sealer.recycle(staged, payload);
        Ok(true)
    }

    /// Ends the message's first half: pending runs written, image checks settled, its
    /// streams and page frames handed to the sealer (see the module doc).
    pub(super) fn end_message(&mut self, raw_len: usize, away: bool) -> Result<(), WalCodecError> {
        self.flush_pending();
        self.settle_checks()?;
        let mut st = self.sealer.fresh();
        std::mem::swap(&mut st.bufs, &mut self.bufs);
        std::mem::swap(&mut st.fpi, &mut self.fpi);
        self.rmgr.end(&mut st.tally);
        st.raw_len = raw_len;
        self.sealer.push(st, away)
    }

    /// Adds a compressed message to the counters.
    fn count(&mut self, st: &mut Staged, payload: &[u8], ulens: &[usize], clens: &[usize]) {
        let fpi = st.fpi.len();
        let sections: usize = clens.iter().sum::<usize>() + fpi;
        self.stats.header_out += payload.len().saturating_sub(sections) as u64;
        for s in 0..STREAMS {
            self.stats.section_in[s] += ulens[s] as u64;
            self.stats.section_out[s] += clens[s] as u64;
        }
        self.stats.section_out[STREAMS] += fpi as u64;
        st.tally.settle(&mut self.stats.by_rmgr, ulens, clens);
        let c = |s: usize| clens[s] as u64;
        self.stats.record_header_out += c(S_CTRL) + c(S_HDR);
        self.stats.data_out += c(S_DATA) + c(S_MAIN);
        self.stats.raw_out += c(S_RAW);
        self.stats.fpi_out += c(S_IMG) + c(S_PAGE) + fpi as u64;
        self.stats.messages += 1;
        self.stats.bytes_in += st.raw_len as u64;
        self.stats.bytes_out += payload.len() as u64;
    }
}

impl Sealer {
    pub fn new(sections: Sections) -> Sealer {
        Sealer {
            home: Some(Box::new(sections)),
            slots: VecDeque::with_capacity(STAGED_MAX),
            thread: None,
            spare: Vec::new(),
            spare_payloads: Vec::new(),
        }
    }

    /// Messages staged and not collected.
    pub fn staged(&self) -> usize {
        self.slots.len()
    }

    /// Empty buffers for the next message's streams and page frames.
    pub fn fresh(&mut self) -> Staged {
        self.spare.pop().unwrap_or_else(|| Staged {
            bufs: Default::default(),
            fpi: Vec::new(),
            tally: MsgTally::default(),
            raw_len: 0,
        })
    }

    /// Takes back a collected message's buffers (emptied) and the caller's old payload buffer.
    pub fn recycle(&mut self, mut st: Staged, payload: Vec<u8>) {
        if self.spare.len() < STAGED_MAX {
            st.bufs.iter_mut().for_each(Vec::clear);
            st.fpi.clear();
            self.spare.push(st);
        }
        if self.spare_payloads.len() < STAGED_MAX {
            self.spare_payloads.push(payload);
        }
    }

    /// Takes a transformed message: compressed here now, or on the thread when `away` is
    /// allowed and the streams hold [`AWAY_MIN`] bytes, or later (see the module doc).
    pub fn push(&mut self, st: Staged, away: bool) -> Result<(), WalCodecError> {
        if self.slots.len() >= STAGED_MAX {
            return Err(WalCodecError::Params(format!(
                "{STAGED_MAX} messages are staged already: collect one before staging another"
            )));
        }
        let Some(mut sections) = self.home.take() else {
            self.slots.push_back(Slot::Waiting(st));
            return Ok(());
        };
        let input: usize = st.bufs.iter().map(Vec::len).sum();
        if away && input >= AWAY_MIN {
            self.ship(sections, st)?;
            self.slots.push_back(Slot::Away);
        } else {
            let payload = self.spare_payloads.pop().unwrap_or_default();
            let r = seal(&mut sections, st, payload);
            self.home = Some(sections);
            self.slots.push_back(Slot::Done(r));
        }
        Ok(())
    }

    /// The oldest staged message's payload (waits for the thread if it is there); `None`
    /// when nothing is staged.
    pub fn pop(&mut self) -> Option<Outcome> {
        let r = match self.slots.pop_front()? {
            Slot::Done(r) => r,
            Slot::Away => self.receive(),
            Slot::Waiting(st) => match self.home.as_mut() {
                Some(sections) => {
                    let payload = self.spare_payloads.pop().unwrap_or_default();
                    seal(sections, st, payload)
                }
                None => Err(stopped()),
            },
        };
        // The next message waited for the contexts, which are back now (else the thread is
        // gone and it waits on, to fail when collected).
        if matches!(self.slots.front(), Some(Slot::Waiting(_))) {
            if let Some(sections) = self.home.take() {
                if let Some(Slot::Waiting(st)) = self.slots.pop_front() {
                    let slot = match self.ship(sections, st) {
                        Ok(()) => Slot::Away,
                        Err(e) => Slot::Done(Err(e)),
                    };
                    self.slots.push_front(slot);
                }
            }
        }
        Some(r)
    }

    /// Sends the contexts and `st` to the thread (started if need be).
    fn ship(&mut self, sections: Box<Sections>, st: Staged) -> Result<(), WalCodecError> {
        let payload = self.spare_payloads.pop().unwrap_or_default();
        let thread = match &mut self.thread {
            Some(t) => t,
            None => self.thread.insert(SealThread::start()?),
        };
        let job = Job {
            sections,
            staged: st,
            payload,
        };
        thread
            .jobs
            .as_ref()
            .and_then(|j| j.send(job).ok())
            .ok_or_else(stopped)
    }

    /// The thread's outcome; the contexts come home with it.
    fn receive(&mut self) -> Outcome {
        let thread = self.thread.as_mut().ok_or_else(stopped)?;
        let (sections, r) = thread.done.recv().map_err(|_| stopped())?;
        self.home = Some(sections);
        r
    }
}

impl SealThread {
    fn start() -> Result<SealThread, WalCodecError> {
        // One job at a time: the sealer never ships a second before the first came back.
        let (jobs, queue) = mpsc::sync_channel::<Job>(1);
        let (done_tx, done) = mpsc::sync_channel(1);
        let handle = std::thread::Builder::new()
            .name("walcodec-sections".into())
            .spawn(move || {
                for mut job in queue {
                    let r = seal(&mut job.sections, job.staged, job.payload);
                    if done_tx.send((job.sections, r)).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| WalCodecError::Zstd(format!("cannot start the section thread: {e}")))?;
        Ok(SealThread {
            jobs: Some(jobs),
            done,
            handle: Some(handle),
        })
    }
}

impl Drop for SealThread {
    fn drop(&mut self) {
        // Closing the queue ends the thread once its job (at most one) is done.
        self.jobs = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn stopped() -> WalCodecError {
    WalCodecError::Zstd("the section thread stopped (its zstd contexts are lost)".into())
}
