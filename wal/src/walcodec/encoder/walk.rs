//! The walk through a message's bytes: page headers predicted or passed, records handed to
//! `try_record` (when complete in the message and understood), padding sent as a count,
//! everything else passed raw; and a record the message's end cuts held back for the next
//! message when the caller allows (`Encoder::encode_held`).

use super::*;
use crate::walcodec::ahead;

impl Encoder {
    /// Encodes the message's bytes, up to a record held back (see [`Encoder::encode_held`]);
    /// returns how many it took.
    pub(super) fn encode_body(&mut self, raw: &[u8]) -> Result<usize, WalCodecError> {
        let mut i = 0;
        self.ahead.clear();
        while i < raw.len() {
            let rest = &raw[i..];
            let t = &self.tracker;
            if !t.enabled() {
                self.raw(OP_RAW, rest);
                break;
            }
            if t.at_page_header() {
                i += self.page_header(rest);
                continue;
            }
            let room = t.to_page_end();
            let n = match t.state {
                RecState::Between if t.at_record_start() => {
                    self.look_ahead(raw, i);
                    match self.try_record(rest)? {
                        Ok(n) => {
                            i += n;
                            continue;
                        }
                        Err(skip) => {
                            match skip {
                                Skip::Split if i > 0 && rest.len() <= self.hold => {
                                    self.stats.records_held += 1;
                                    return Ok(i);
                                }
                                Skip::Split => self.stats.records_split += 1,
                                Skip::Odd => self.stats.records_raw += 1,
                            }
                            REC_HDR.min(room)
                        }
                    }
                }
                RecState::Between => {
                    let pad = t.padding().max(1);
                    let n = pad.min(rest.len());
                    if rest[..n].iter().all(|&b| b == 0) {
                        self.zeros(&rest[..n]);
                        i += n;
                        continue;
                    }
                    n
                }
                RecState::Header { .. } => t.header_bytes_missing().unwrap_or(1).min(room),
                RecState::Body { remaining, .. } => (remaining as usize).min(room),
                RecState::SwitchTail { end } => {
                    let n = (end.wrapping_sub(t.pos)).min(rest.len() as u64) as usize;
                    if is_zero(&rest[..n]) {
                        self.zeros(&rest[..n]);
                        i += n;
                        continue;
                    }
                    n
                }
                RecState::Unknown => room,
            }
            .clamp(1, rest.len());
            self.raw(OP_RAW, &rest[..n]);
            i += n;
        }
        Ok(raw.len())
    }

    /// The walk is at a record start, offset `i`: asks for the memory of the records a few
    /// places ahead (see [`ahead`]).
    fn look_ahead(&mut self, raw: &[u8], i: usize) {
        let caches = ahead::Caches {
            pages: &self.cache,
            tuples: &self.tuples,
            compressed_mask: self.compressed_mask,
        };
        match self.ahead.at(raw, i, self.tracker.pos, caches) {
            ahead::Seen::Scanned => self.stats.records_ahead += 1,
            ahead::Seen::Paused => self.stats.records_ahead_paused += 1,
            ahead::Seen::Missed => {}
        }
    }

    /// The page header at the start of `rest` (or the rest of one a message cut): one op
    /// when predicted, else raw through HDR; returns the bytes taken.
    fn page_header(&mut self, rest: &[u8]) -> usize {
        let t = &self.tracker;
        if t.partial_header() == 0 {
            if let Some((h, hl)) = t.predict_header() {
                if rest.get(..hl) == Some(&h[..hl]) {
                    self.flush_pending();
                    self.bufs[S_CTRL].push(OP_PAGE_HDR);
                    self.tracker.feed(&rest[..hl]);
                    self.stats.page_header_in += hl as u64;
                    self.stats.page_header_out += 1;
                    return hl;
                }
            }
        }
        let n = if t.partial_header() == 0 {
            le16(rest, 2).map_or(SHORT_PHD, phd_len)
        } else {
            t.header_missing()
        }
        .min(rest.len());
        self.stats.page_header_in += n as u64;
        self.stats.page_header_out += n as u64;
        self.raw(OP_RAW_HDR, &rest[..n]);
        n
    }

    /// Passes `b` raw (RAW or HDR stream) and feeds it to the tracker.
    pub(super) fn raw(&mut self, op: u8, b: &[u8]) {
        let stream = if op == OP_RAW_HDR { S_HDR } else { S_RAW };
        self.bufs[stream].extend_from_slice(b);
        if op == OP_RAW {
            self.stats.raw_in += b.len() as u64;
        }
        self.run(op, b.len());
        self.tracker.feed(b);
    }

    pub(super) fn zeros(&mut self, b: &[u8]) {
        self.stats.zeros_in += b.len() as u64;
        self.run(OP_ZERO, b.len());
        self.tracker.feed(b);
    }

    /// Adds `n` bytes to the pending run of `op`, writing out a run of another kind first.
    pub(super) fn run(&mut self, op: u8, n: usize) {
        match &mut self.pending {
            Some((o, len)) if *o == op => *len += n,
            _ => {
                self.flush_pending();
                self.pending = Some((op, n));
            }
        }
    }

    pub(super) fn flush_pending(&mut self) {
        if let Some((op, n)) = self.pending.take() {
            let ctrl = &mut self.bufs[S_CTRL];
            ctrl.push(op);
            put_varint(ctrl, n as u64);
        }
    }

    /// Gathers the record starting at the tracker's position (a record start) into `self.rec`,
    /// following its page layout in `rest`; returns the physical bytes it spans.
    pub(super) fn gather(&mut self, rest: &[u8]) -> Result<usize, Skip> {
        let t = &self.tracker;
        self.rec.clear();
        let (mut j, mut cur) = (0usize, t.pos);
        let mut need: Option<usize> = None;
        loop {
            if need.is_none() && self.rec.len() >= 4 {
                let tot = le32(&self.rec, 0).ok_or(Skip::Odd)? as usize;
                if tot < REC_HDR {
                    return Err(Skip::Odd);
                }
                if tot > rest.len() {
                    return Err(Skip::Split);
                }
                need = Some(tot);
            }
            if need == Some(self.rec.len()) {
                return Ok(j);
            }
            if cur % WAL_PAGE == 0 {
                let have = rest.len() - j;
                let hl = match le16(rest, j + 2) {
                    Some(info) if have >= phd_len(info) => phd_len(info),
                    _ => return Err(Skip::Split),
                };
                let Some(tot) = need else {
                    return Err(Skip::Odd);
                };
                let rem = (tot - self.rec.len()) as u32;
                if !t.header_continues(&rest[j..j + hl], cur, rem) {
                    return Err(Skip::Odd);
                }
                j += hl;
                cur += hl as u64;
                continue;
            }
            let want = need.unwrap_or(REC_HDR) - self.rec.len();
            let take = want
                .min((WAL_PAGE - cur % WAL_PAGE) as usize)
                .min(rest.len() - j);
            if take == 0 {
                return Err(Skip::Split);
            }
            self.rec.extend_from_slice(&rest[j..j + take]);
            j += take;
            cur += take as u64;
        }
    }
}
