//! The decoder's first half: a message's sections decompressed, here or on a thread while
//! the caller restores the message before.
//!
//! Decoding a message is two halves: decompressing its sections ([`DecSections::read`]), then
//! restoring its records from them (the rest of the decoder). On one core a bulk load spends
//! about two fifths of its decoding in the first half. [`Decoder::stage`] hands a message's
//! payload (copied) to a [`Handoff`] of the zstd contexts ([`DecSections`]): decompressed on the
//! `walcodec-unpack` thread when the caller allows more than one core and the payload holds
//! at least [`AWAY_MIN`] bytes, else when it is decoded. [`Decoder::decode`] then takes the
//! staged sections of the message it is given, which must be the oldest staged one (same
//! start, length and payload): the contexts see every message in stream order.
//!
//! Bounds: at most [`STAGED_MAX`] messages are staged and not decoded, each its payload
//! (within `max_message_bytes`' caps) and, once decompressed, its sections (capped by
//! [`payload::cap`]).
//!
//! [`Decoder::stage`]: super::Decoder::stage
//! [`Decoder::decode`]: super::Decoder::decode

use std::collections::VecDeque;

use super::super::handoff::{Handoff, Work};
use super::super::payload::DecSections;
use super::super::{WalCodecError, STAGED_MAX, STREAMS};
use crate::lsn::Lsn;

/// Least payload (bytes) of a message decompressed on the thread: below it the hand-over
/// costs about what it saves.
pub const AWAY_MIN: usize = 16 * 1024;

/// A message's sections, decompressed.
pub(crate) struct Unpacked {
    raw_len: usize,
    /// The payload, when staged (empty when decompressed from the caller's).
    payload: Vec<u8>,
    pub bufs: Vec<Vec<u8>>,
    /// Where the page frames start in the payload.
    pub fpi_at: usize,
}

impl Unpacked {
    /// Decompresses `payload`'s sections into `self.bufs` with `sections`; sets `fpi_at`.
    fn read(
        &mut self,
        sections: &mut DecSections,
        payload: &[u8],
        parallel: bool,
    ) -> Result<(), WalCodecError> {
        let rest = sections.read(payload, self.raw_len, &mut self.bufs, parallel)?;
        self.fpi_at = payload.len() - rest.len();
        Ok(())
    }
}

impl Work for DecSections {
    type Job = Unpacked;
    type Out = Unpacked;
    fn run(&mut self, mut u: Unpacked, away: bool) -> Result<Unpacked, WalCodecError> {
        let payload = std::mem::take(&mut u.payload);
        // On the thread the caller is busy restoring: no more threads for the sections.
        let r = u.read(self, &payload, !away);
        u.payload = payload;
        r.map(|()| u)
    }
}

/// The contexts' handoff, what is staged, and emptied buffers for the next messages.
pub(crate) struct Unpacker {
    handoff: Handoff<DecSections>,
    /// Start, raw length and payload length of each staged message, oldest first.
    keys: VecDeque<(Lsn, usize, usize)>,
    spare: Vec<Unpacked>,
}

impl Unpacker {
    pub fn new(sections: DecSections) -> Unpacker {
        Unpacker {
            handoff: Handoff::new(sections, "walcodec-unpack", STAGED_MAX),
            keys: VecDeque::with_capacity(STAGED_MAX),
            spare: Vec::new(),
        }
    }

    /// Messages staged and not decoded.
    pub fn staged(&self) -> usize {
        self.handoff.len()
    }

    fn fresh(&mut self, raw_len: usize) -> Unpacked {
        let mut u = self.spare.pop().unwrap_or_else(|| Unpacked {
            raw_len,
            payload: Vec::new(),
            bufs: vec![Vec::new(); STREAMS],
            fpi_at: 0,
        });
        (u.raw_len, u.fpi_at) = (raw_len, 0);
        u
    }

    /// Takes a message's payload (copied): decompressed on the thread when `away`, else
    /// when it is decoded.
    pub fn stage(
        &mut self,
        start: Lsn,
        payload: &[u8],
        raw_len: usize,
        away: bool,
    ) -> Result<(), WalCodecError> {
        let mut u = self.fresh(raw_len);
        u.payload.clear();
        u.payload.extend_from_slice(payload);
        self.handoff.push(u, away && payload.len() >= AWAY_MIN)?;
        self.keys.push_back((start, raw_len, payload.len()));
        Ok(())
    }

    /// The sections of the message at `start`: the oldest staged message's, which must be
    /// this one, or decompressed here now (`parallel`: on several threads when large).
    pub fn take(
        &mut self,
        start: Lsn,
        payload: &[u8],
        raw_len: usize,
        parallel: bool,
    ) -> Result<Unpacked, WalCodecError> {
        let Some(key) = self.keys.pop_front() else {
            let mut u = self.fresh(raw_len);
            u.payload.clear();
            let sections = self.handoff.home().ok_or_else(|| {
                WalCodecError::Zstd("the session's zstd contexts were lost with a thread".into())
            })?;
            u.read(sections, payload, parallel)?;
            return Ok(u);
        };
        let out_of_order = || {
            WalCodecError::Params(format!(
                "decode of the message at {start} ({raw_len} bytes) while the one staged first \
                 is at {} ({} bytes): decode staged messages in the order they were staged",
                key.0, key.1
            ))
        };
        if key != (start, raw_len, payload.len()) {
            return Err(out_of_order());
        }
        let u = self.handoff.pop().ok_or_else(|| {
            WalCodecError::Params("a staged message is missing from the queue".into())
        })??;
        if u.payload != payload {
            return Err(out_of_order());
        }
        Ok(u)
    }

    /// Takes back a decoded message's buffers.
    pub fn recycle(&mut self, u: Unpacked) {
        if self.spare.len() < STAGED_MAX {
            self.spare.push(u);
        }
    }
}
