//! The compressor's history as first written: a line-by-line transcription of
//! `pglz_hist_add` and `pglz_find_match` with the C code's entries (positions stored, a
//! memcmp before extending a long match). Kept for the tests as the oracle the faster
//! [`super::Pglz`] must match byte for byte.

use super::{common_prefix, History, Limits, HISTORY_SIZE, MAX_HISTORY_LISTS, MAX_MATCH};

/// `prev` of a list head (NULL in the C code).
const NO_PREV: u16 = u16::MAX;

/// The compressor's work arrays (`hist_start` and `hist_entries` of the C code, entry 0 unused
/// and meaning "none"), reused across calls.
pub(super) struct Reference {
    hist_start: Box<[u16; MAX_HISTORY_LISTS]>,
    next: Box<[u16; HISTORY_SIZE + 1]>,
    prev: Box<[u16; HISTORY_SIZE + 1]>,
    hindex: Box<[u16; HISTORY_SIZE + 1]>,
    pos: Box<[usize; HISTORY_SIZE + 1]>,
    /// The next entry to use, and whether all are in use (the C code's `hist_next` and
    /// `hist_recycle`, locals of `pglz_compress`).
    hist_next: usize,
    recycle: bool,
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
    pub(super) fn new() -> Reference {
        Reference {
            hist_start: Box::new([0; MAX_HISTORY_LISTS]),
            next: Box::new([0; HISTORY_SIZE + 1]),
            prev: Box::new([0; HISTORY_SIZE + 1]),
            hindex: Box::new([0; HISTORY_SIZE + 1]),
            pos: Box::new([0; HISTORY_SIZE + 1]),
            hist_next: 1,
            recycle: false,
        }
    }
}

impl History for Reference {
    fn clear(&mut self, hashsz: usize) {
        self.hist_start[..hashsz].fill(0);
        self.hist_next = 1;
        self.recycle = false;
    }

    /// `pglz_hist_add`: enters position `p` as entry `*hn`, recycling the oldest entry once
    /// all are in use.
    #[inline]
    fn add(&mut self, s: &[u8], p: usize, hash: usize, mask: i32) {
        let (hn, recycle) = (&mut self.hist_next, &mut self.recycle);
        let hindex = hist_idx(s, p, mask);
        // The caller's hash (rolled on through a tag) is the transcription's.
        assert_eq!(hash, hindex, "list of position {p}");
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
    fn find_match(&self, s: &[u8], p: usize, _: usize, lim: &Limits) -> Option<(usize, usize)> {
        let (mut good_match, good_drop, mask) = (lim.good_match, lim.good_drop, lim.mask);
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
}
