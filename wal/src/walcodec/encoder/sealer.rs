//! The encoder's second half: a message's streams compressed into its payload, here or on a
//! thread while the caller transforms the next message.
//!
//! Encoding a message is two halves: turning its records into the streams (the rest of the
//! encoder), then compressing the streams into the payload ([`Sections::write`]). On one core
//! a bulk load spends about three quarters of its encoding in the second half, pgbench about
//! a quarter. [`Encoder::stage`] does the first half and hands the message to a
//! [`Handoff`] of the zstd contexts ([`Sections`]): compressed here at once when the caller
//! did not allow more than one core or the streams hold less than [`AWAY_MIN`] bytes (and the
//! contexts are here), else on the `walcodec-sections` thread, where the contexts go and stay
//! while messages follow, so that each sees its messages in order and the payload bytes are
//! those made here.
//! [`Encoder::collect`] takes the oldest payload.
//!
//! Bounds: at most [`STAGED_MAX`] messages are staged and not collected (one compressing, the
//! others transformed and waiting); [`Encoder::stage`] refuses one more. Each holds its
//! streams' input (a few times the message's WAL at most, see [`payload::cap`]) and its page
//! frames.
//!
//! [`payload::cap`]: super::super::payload::cap

use super::super::handoff::{Handoff, Work};
use super::super::payload::Sections;
use super::super::rmgr::MsgTally;
use super::super::{
    WalCodecError, STREAMS, S_CTRL, S_DATA, S_HDR, S_HIT, S_IMG, S_LONG, S_MAIN, S_PAGE, S_RAW,
};
use super::Encoder;

/// Most messages staged and not collected: a caller one batch ahead of the batch it frames,
/// with up to two messages in each batch.
pub const STAGED_MAX: usize = 4;
/// Least streams input (bytes) of a message compressed on the thread: below it the hand-over
/// costs about what it saves.
pub const AWAY_MIN: usize = 32 * 1024;

/// A transformed message, its streams not compressed yet.
pub(crate) struct Staged {
    pub bufs: [Vec<u8>; STREAMS],
    /// Its page frames (already compressed, go after the sections).
    pub fpi: Vec<u8>,
    /// Its records' bytes per resource manager, settled once the sections' sizes are known.
    pub tally: MsgTally,
    pub raw_len: usize,
    /// Compressed with the streams' fast settings ([`Encoder::set_fast`]).
    pub fast: bool,
}

/// A message's payload and what the counters need.
pub(crate) struct Sealed {
    /// The message (its streams' buffers emptied, to be used again).
    pub staged: Staged,
    pub payload: Vec<u8>,
    pub ulens: [usize; STREAMS],
    pub clens: [usize; STREAMS],
}

/// The payload of a message: the streams of `staged` compressed into `payload`.
pub(crate) struct SealJob {
    staged: Staged,
    payload: Vec<u8>,
}

impl Work for Sections {
    type Job = SealJob;
    type Out = Sealed;
    fn run(&mut self, job: SealJob, _away: bool) -> Result<Sealed, WalCodecError> {
        let SealJob {
            mut staged,
            mut payload,
        } = job;
        payload.clear();
        let ulens = std::array::from_fn(|s| staged.bufs[s].len());
        let mut clens = [0; STREAMS];
        self.set_fast(staged.fast);
        self.write(&mut staged.bufs, &staged.fpi, &mut payload, &mut clens)?;
        Ok(Sealed {
            staged,
            payload,
            ulens,
            clens,
        })
    }
}

/// The contexts' handoff and emptied buffers for the next messages.
pub(crate) struct Sealer {
    handoff: Handoff<Sections>,
    spare: Vec<Staged>,
    spare_payloads: Vec<Vec<u8>>,
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
        st.fast = self.fast;
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
        self.stats.data_out += c(S_DATA) + c(S_LONG) + c(S_MAIN);
        self.stats.raw_out += c(S_RAW);
        self.stats.fpi_out += c(S_IMG) + c(S_PAGE) + c(S_HIT) + fpi as u64;
        self.stats.messages += 1;
        self.stats.bytes_in += st.raw_len as u64;
        self.stats.bytes_out += payload.len() as u64;
    }
}

impl Sealer {
    pub fn new(sections: Sections) -> Sealer {
        Sealer {
            handoff: Handoff::new(sections, "walcodec-sections", STAGED_MAX),
            spare: Vec::new(),
            spare_payloads: Vec::new(),
        }
    }

    /// Messages staged and not collected.
    pub fn staged(&self) -> usize {
        self.handoff.len()
    }

    /// Empty buffers for the next message's streams and page frames.
    pub fn fresh(&mut self) -> Staged {
        self.spare.pop().unwrap_or_else(|| Staged {
            bufs: Default::default(),
            fpi: Vec::new(),
            tally: MsgTally::default(),
            raw_len: 0,
            fast: false,
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

    /// Takes a transformed message: compressed on the thread when `away` is allowed and the
    /// streams hold [`AWAY_MIN`] bytes, else here (see the module doc).
    pub fn push(&mut self, staged: Staged, away: bool) -> Result<(), WalCodecError> {
        let input: usize = staged.bufs.iter().map(Vec::len).sum();
        let payload = self.spare_payloads.pop().unwrap_or_default();
        let job = SealJob { staged, payload };
        self.handoff.push(job, away && input >= AWAY_MIN)
    }

    /// The oldest staged message's payload; `None` when nothing is staged.
    pub fn pop(&mut self) -> Option<Result<Sealed, WalCodecError>> {
        self.handoff.pop()
    }
}
