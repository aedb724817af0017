//! The compressor as first written: a line-by-line transcription of `pglz_compress` with the
//! C code's history entries (positions stored, lists of `u16` links). Kept for the tests as
//! the oracle the faster [`super::Pglz`] must match byte for byte.

use super::{common_prefix, Strategy, HISTORY_SIZE, MAX_HISTORY_LISTS, MAX_MATCH, NO_PREV};

/// The compressor's work arrays (`hist_start` and `hist_entries` of the C code, entry 0 unused
/// and meaning "none"), reused across calls.
pub struct Reference {
    hist_start: Box<[u16; MAX_HISTORY_LISTS]>,
    next: Box<[u16; HISTORY_SIZE + 1]>,
    prev: Box<[u16; HISTORY_SIZE + 1]>,
    hindex: Box<[u16; HISTORY_SIZE + 1]>,
    pos: Box<[usize; HISTORY_SIZE + 1]>,
}

/// `pglz_hist_idx`: the list of the position `p` (bytes read as signed chars).
#[inline]
fn hist_idx(s: &[u8], p: usize, mask: i32) -> usize {
    let c = |i: usize| i32::from(s[p + i] as i8);
    let h = if s.len() - p < 4 {
        c(0)
    } else {
        (c(0) << 6) ^ (c(1) << 4) ^ (c(2) << 2) ^ c(3)
    };
    (h & mask) as usize
}

impl Reference {
    pub fn new() -> Reference {
        Reference {
            hist_start: Box::new([0; MAX_HISTORY_LISTS]),
            next: Box::new([0; HISTORY_SIZE + 1]),
            prev: Box::new([0; HISTORY_SIZE + 1]),
            hindex: Box::new([0; HISTORY_SIZE + 1]),
            pos: Box::new([0; HISTORY_SIZE + 1]),
        }
    }

    /// `pglz_hist_add`: enters position `p` as entry `*hn`, recycling the oldest entry once
    /// all are in use.
    #[inline]
    fn hist_add(&mut self, s: &[u8], p: usize, mask: i32, hn: &mut usize, recycle: &mut bool) {
        let hindex = hist_idx(s, p, mask);
        let me = *hn;
        if *recycle {
            let (prev, next) = (self.prev[me], self.next[me]);
            if prev == NO_PREV {
                self.hist_start[usize::from(self.hindex[me])] = next;
            } else {
                self.next[usize::from(prev)] = next;
            }
            self.prev[usize::from(next)] = prev;
        }
        let head = self.hist_start[hindex];
        self.next[me] = head;
        self.prev[me] = NO_PREV;
        self.hindex[me] = hindex as u16;
        self.pos[me] = p;
        // Entry 0 is scribbled on when the list was empty, as in the C code (harmless).
        self.prev[usize::from(head)] = me as u16;
        self.hist_start[hindex] = me as u16;
        *hn += 1;
        if *hn > HISTORY_SIZE {
            *hn = 1;
            *recycle = true;
        }
    }

    /// `pglz_find_match`: the best (length, offset) for position `p`, if longer than 2.
    #[inline]
    fn find_match(
        &self,
        s: &[u8],
        p: usize,
        mut good_match: i32,
        good_drop: i32,
        mask: i32,
    ) -> Option<(usize, usize)> {
        let end = s.len();
        let (mut len, mut off) = (0usize, 0usize);
        let mut hent = self.hist_start[hist_idx(s, p, mask)];
        while hent != 0 {
            let hp = self.pos[usize::from(hent)];
            let thisoff = p - hp;
            if thisoff >= 0x0fff {
                break;
            }
            // With a match of 16+ bytes already, the candidate must repeat all of it (the C
            // code's memcmp) before it is extended; either way only a longer match counts.
            let mut thislen = 0;
            if len < 16 || s[p..p + len] == s[hp..hp + len] {
                if len >= 16 {
                    thislen = len;
                }
                let limit = MAX_MATCH.min(end - p);
                thislen += common_prefix(&s[p + thislen..p + limit], &s[hp + thislen..]);
            }
            if thislen > len {
                len = thislen;
                off = thisoff;
            }
            hent = self.next[usize::from(hent)];
            if hent != 0 {
                if len as i32 >= good_match {
                    break;
                }
                good_match -= (good_match * good_drop) / 100;
            }
        }
        (len > 2).then_some((len, off))
    }

    /// `pglz_compress(src, src.len(), dest, strategy)`: appends the compressed bytes to `out`
    /// and returns their number, or `None` where PostgreSQL returns -1 (too small, too large,
    /// not compressible enough). `out` may hold partial output after `None`.
    pub fn compress(
        &mut self,
        src: &[u8],
        strategy: &Strategy,
        out: &mut Vec<u8>,
    ) -> Option<usize> {
        let slen = i32::try_from(src.len()).ok()?;
        if strategy.match_size_good <= 0
            || slen < strategy.min_input_size
            || slen > strategy.max_input_size
        {
            return None;
        }
        let good_match = strategy.match_size_good.clamp(17, MAX_MATCH as i32);
        let good_drop = strategy.match_size_drop.clamp(0, 100);
        let need_rate = strategy.min_comp_rate.clamp(0, 99);
        let result_max = if slen > i32::MAX / 100 {
            (slen / 100) * (100 - need_rate)
        } else {
            (slen * (100 - need_rate)) / 100
        } as usize;
        let hashsz: usize = match slen {
            ..128 => 512,
            128..256 => 1024,
            256..512 => 2048,
            512..1024 => 4096,
            _ => 8192,
        };
        let mask = (hashsz - 1) as i32;
        self.hist_start[..hashsz].fill(0);

        let base = out.len();
        out.reserve(src.len() + 4);
        let mut hist_next = 1usize;
        let mut recycle = false;
        // Index of the current control byte in `out`; None: the C code's ctrl_dummy.
        let mut ctrlp: Option<usize> = None;
        let (mut ctrlb, mut ctrl) = (0u8, 0u8);
        let mut found_match = false;
        let mut dp = 0usize;
        let first_success_by = usize::try_from(strategy.first_success_by).unwrap_or(0);
        while dp < src.len() {
            let written = out.len() - base;
            if written >= result_max {
                return None;
            }
            if !found_match && written >= first_success_by {
                return None;
            }
            // pglz_out_ctrl
            if ctrl == 0 {
                if let Some(c) = ctrlp {
                    out[c] = ctrlb;
                }
                ctrlp = Some(out.len());
                out.push(0);
                ctrlb = 0;
                ctrl = 1;
            }
            if let Some((len, off)) = self.find_match(src, dp, good_match, good_drop, mask) {
                // pglz_out_tag
                ctrlb |= ctrl;
                ctrl <<= 1;
                if len > 17 {
                    out.push((((off & 0xf00) >> 4) | 0x0f) as u8);
                    out.push((off & 0xff) as u8);
                    out.push((len - 18) as u8);
                } else {
                    out.push((((off & 0xf00) >> 4) | (len - 3)) as u8);
                    out.push((off & 0xff) as u8);
                }
                for _ in 0..len {
                    self.hist_add(src, dp, mask, &mut hist_next, &mut recycle);
                    dp += 1;
                }
                found_match = true;
            } else {
                // pglz_out_literal
                out.push(src[dp]);
                ctrl <<= 1;
                self.hist_add(src, dp, mask, &mut hist_next, &mut recycle);
                dp += 1;
            }
        }
        if let Some(c) = ctrlp {
            out[c] = ctrlb;
        }
        let size = out.len() - base;
        (size < result_max).then_some(size)
    }
}
