//! PostgreSQL's pglz, step for step: the compressor produces the same bytes as
//! `pglz_compress` of `src/common/pg_lzcompress.c` (unchanged in PostgreSQL 14..=18), so that a
//! full-page image the primary compressed with `wal_compression = pglz` can be rebuilt exactly
//! from the page; the decompressor checks every length against its input and output.
//!
//! # Format
//!
//! A control byte announces the next 8 items, lowest bit first: 0 = one literal byte,
//! 1 = a tag copying `len` bytes from `off` bytes back in the output:
//!
//! ```text
//! tag = OOOO LLLL  OOOO OOOO  [len - 18 if LLLL = 1111]
//!       (off: 12 bits, 1..=4095; len: LLLL + 3 for 3..=17, else 18 + third byte: 18..=273)
//! ```
//!
//! # The compressor (what must match PostgreSQL)
//!
//! - history: a hash table of `hashsz` lists (512..8192 by input size) of the last 4096 input
//!   positions, newest first; the hash of a position is built from its next 4 bytes read as
//!   **signed** chars (x86 and most platforms PostgreSQL runs on; on platforms with unsigned
//!   `char`, such as ARM, the primary's output may differ and the relay falls back to
//!   sending the image as it is);
//! - match search: walk the list while the offset is below 0x0fff, keep the longest match
//!   (at most 273 bytes), stop once it reaches `good_match`, which starts at the strategy's
//!   value (clamped to 17..=273) and drops by `good_drop`% per entry visited;
//! - output: a tag if the match is longer than 2 bytes (all its positions enter the history),
//!   else a literal; give up when the output reaches `result_max` (the input less the
//!   strategy's minimum rate) or `first_success_by` bytes without any match.

/// Number of history lists at most (power of two).
const MAX_HISTORY_LISTS: usize = 8192;
/// Input positions remembered.
const HISTORY_SIZE: usize = 4096;
/// Longest match a tag can hold.
const MAX_MATCH: usize = 273;

/// `PGLZ_Strategy`.
#[derive(Debug, Clone, Copy)]
pub struct Strategy {
    pub min_input_size: i32,
    pub max_input_size: i32,
    pub min_comp_rate: i32,
    pub first_success_by: i32,
    pub match_size_good: i32,
    pub match_size_drop: i32,
}

/// `PGLZ_strategy_default`, which `XLogCompressBackupBlock` uses.
pub const STRATEGY_DEFAULT: Strategy = Strategy {
    min_input_size: 32,
    max_input_size: i32::MAX,
    min_comp_rate: 25,
    first_success_by: 1024,
    match_size_good: 128,
    match_size_drop: 10,
};

/// `PGLZ_strategy_always`.
pub const STRATEGY_ALWAYS: Strategy = Strategy {
    min_input_size: 0,
    max_input_size: i32::MAX,
    min_comp_rate: 0,
    first_success_by: i32::MAX,
    match_size_good: 128,
    match_size_drop: 6,
};

/// Why pglz data did not decompress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PglzError {
    #[error("pglz data ends inside a tag")]
    Truncated,
    #[error("pglz tag points before the start of the output (offset {off} at {at})")]
    BadOffset { off: usize, at: usize },
    #[error("pglz data decompressed to {got} bytes with {left} input bytes left; expected {want}")]
    Length {
        got: usize,
        want: usize,
        left: usize,
    },
}

/// History slots allocated: a power of two above the 4096 + 1 entries in use, so that an
/// entry number read back from the arrays needs no bounds check once masked ([`slot`]).
const SLOTS: usize = 8192;

/// One history entry's links: `PGLZ_HistEntry` without `pos`, which follows from the entry's
/// number (see [`Lists`]).
#[derive(Debug, Clone, Copy, Default)]
struct Links {
    next: u16,
    hindex: u16,
}

/// The compressor's work arrays, reused across calls: the history, and each input
/// position's list ([`hist_idx`]), computed for the whole input before it is compressed
/// (a list depends only on the position's next four bytes, so computing it in one pass
/// spares the per-position hash roll of the C code's tag loop).
pub struct Pglz {
    history: Lists,
    lists: Vec<u16>,
}

/// The history (`hist_start` and `hist_entries` of the C code, entry 0 unused and meaning
/// "none").
///
/// The C code stores each entry's input position; this one need not. Positions enter the
/// history one at a time and in order (`pglz_hist_add` runs once for every input byte: for a
/// literal, and for each byte a tag covers), and entry numbers cycle through 1..=4096 with
/// them. So position `q` is always entry `q % 4096 + 1`, an entry is recycled exactly when
/// the position is 4096 or more, and an entry `e` found in a list while position `p` is
/// looked up holds the one position of the previous 4096 that maps to it, at offset
/// `(p - e) % 4096 + 1`.
///
/// Nor does it take a recycled entry out of its list (the C code's `prev` links and three of
/// the five writes per input byte): a list is read from its head through `next` links that
/// were set when each entry was added, and ends where the C code's would, at the first link
/// to an entry that has been recycled since (see its `find_match`). Fewer and smaller
/// arrays (32 KiB in use instead of 72 KiB) keep the history in the L1 cache; [`reference`]
/// is the transcription it is tested against.
struct Lists {
    hist_start: Box<[u16; MAX_HISTORY_LISTS]>,
    links: Box<[Links; SLOTS]>,
}

impl Default for Pglz {
    fn default() -> Self {
        Pglz::new()
    }
}

#[cfg(test)]
mod reference;

/// The slot of entry `e` (every entry in use is below [`SLOTS`]; masking only spares the
/// bounds check).
#[inline(always)]
fn slot(e: u16) -> usize {
    usize::from(e) & (SLOTS - 1)
}

/// `pglz_hist_idx` of every position of `s` into `out` (bytes read as signed chars): from a
/// position's four bytes, or its one byte where fewer than four are left.
fn hist_idx(s: &[u8], mask: i32, out: &mut Vec<u16>) {
    // The C code computes in `int`; `mask` is below MAX_HISTORY_LISTS, so only the low 13
    // bits count, and those of a sign extension, a left shift and an exclusive or are the same
    // in 16 bits: lanes of u16, four shifted views of `s` zipped, which the compiler vectorises.
    let c = |x: u8| x as i8 as i16 as u16;
    let m = mask as u16;
    let four = s.len().saturating_sub(3);
    out.clear();
    out.resize(s.len(), 0);
    let (head, tail) = out.split_at_mut(four);
    // (An input of under three bytes has no four-byte positions, nor `s[3..]`.)
    if let Some(s3) = s.get(3..) {
        for ((((o, &a), &b), &d), &e) in head.iter_mut().zip(s).zip(&s[1..]).zip(&s[2..]).zip(s3) {
            *o = ((c(a) << 6) ^ (c(b) << 4) ^ (c(d) << 2) ^ c(e)) & m;
        }
    }
    for (o, &b) in tail.iter_mut().zip(&s[four..]) {
        *o = c(b) & m;
    }
}

/// How many bytes `a` and `b` have in common from their starts, at most `a.len()` (`b` is at
/// least as long): the C code's byte loop, eight bytes at a time (also [`super::hitparse`]'s
/// match lengths).
#[inline]
pub(super) fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let mut n = 0;
    for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        let d = u64::from_le_bytes(x.try_into().unwrap_or_default())
            ^ u64::from_le_bytes(y.try_into().unwrap_or_default());
        if d != 0 {
            return n + (d.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    n + a[n..]
        .iter()
        .zip(&b[n..])
        .take_while(|(x, y)| x == y)
        .count()
}

impl Pglz {
    pub fn new() -> Pglz {
        Pglz {
            history: Lists {
                hist_start: Box::new([0; MAX_HISTORY_LISTS]),
                links: Box::new([Links::default(); SLOTS]),
            },
            lists: Vec::new(),
        }
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
        compress_with(&mut self.history, &mut self.lists, src, strategy, out)
    }
}

/// The history the compressor searches: [`Lists`], and in the tests the transcription's.
trait History {
    /// Empties the first `hashsz` lists (a new input).
    fn clear(&mut self, hashsz: usize);
    /// `pglz_hist_add` of the next position, `p`, whose list is `hash` ([`hist_idx`]).
    fn add(&mut self, s: &[u8], p: usize, hash: usize, mask: i32);
    /// `pglz_find_match`: the best (length, offset) for position `p`, whose list is `hash`,
    /// if longer than 2.
    fn find_match(&self, s: &[u8], p: usize, hash: usize, lim: &Limits) -> Option<(usize, usize)>;
}

impl History for Lists {
    fn clear(&mut self, hashsz: usize) {
        self.hist_start[..hashsz].fill(0);
    }

    /// `pglz_hist_add` for position `p`: entry `p % 4096 + 1` becomes the head of its list.
    /// The C code first takes a recycled entry out of its old list; that is left undone
    /// here, and `find_match` stops where the C code's list would end (see [`Lists`]).
    #[inline(always)]
    fn add(&mut self, _: &[u8], p: usize, hindex: usize, _: i32) {
        let me = (p % HISTORY_SIZE + 1) as u16;
        self.links[slot(me)] = Links {
            next: self.hist_start[hindex],
            hindex: hindex as u16,
        };
        self.hist_start[hindex] = me;
    }

    /// `pglz_find_match`: the best (length, offset) for position `p`, if longer than 2.
    #[inline(always)]
    fn find_match(&self, s: &[u8], p: usize, h: usize, lim: &Limits) -> Option<(usize, usize)> {
        let limit = MAX_MATCH.min(s.len() - p);
        let (mut len, mut off) = (0usize, 0usize);
        // How many entries have been visited after the first: the index of `good_match` in
        // `lim.good`, which the C code recomputes at every step.
        let mut visited = 0usize;
        let mut hent = self.hist_start[h];
        // The head names the entry of the list's newest position. If that entry was recycled
        // since, it now holds a position of another list, and the C code's list is empty.
        if hent != 0 && usize::from(self.links[slot(hent)].hindex) != h {
            hent = 0;
        }
        // The position entry `hent` holds (see [`Lists`]); 4096 divides 2^64, so the wrapping
        // difference has the right remainder.
        let offset = |e: u16| p.wrapping_sub(usize::from(e)) % HISTORY_SIZE + 1;
        let mut thisoff = offset(hent);
        while hent != 0 {
            if thisoff >= 0x0fff {
                break;
            }
            // The C code, with a match of 16+ bytes already, first memcmps that many bytes
            // and counts the candidate as 0 if they differ: either way it is taken only if
            // its common prefix is longer than the match, which is all this compares.
            let cand = p - thisoff;
            // A candidate is taken only if it matches more than `len` bytes, so one that
            // differs at byte `len` is passed over without comparing the rest.
            if len == 0 || s[p + len] == s[cand + len] {
                let thislen = common_prefix(&s[p..p + limit], &s[cand..]);
                if thislen > len {
                    len = thislen;
                    off = thisoff;
                    if len == limit {
                        break;
                    }
                }
            }
            hent = self.links[slot(hent)].next;
            // The link names the entry of the previous position of this list. If that entry
            // was recycled since, the position is gone and so is every older one: the C code's
            // list ends here. A recycled entry holds a newer position than this one, or an
            // older one that is not in this list (else it would have been linked instead).
            let nextoff = offset(hent);
            if nextoff <= thisoff || usize::from(self.links[slot(hent)].hindex) != h {
                hent = 0;
            }
            thisoff = nextoff;
            if hent != 0 {
                if len >= usize::from(lim.good[visited]) {
                    break;
                }
                visited = (visited + 1).min(GOOD_STEPS - 1);
            }
        }
        (len > 2).then_some((len, off))
    }
}

/// Length of [`Limits::good`]: `good_match` settles before that many drops for every
/// strategy (it drops by at least 1 while 100 or more, and is at most 273).
const GOOD_STEPS: usize = 256;

/// What `pglz_compress` derives from the strategy and the input's length.
struct Limits {
    /// The strategy's `good_match` and `good_drop`, clamped (the transcription's inputs).
    #[cfg(test)]
    good_match: i32,
    #[cfg(test)]
    good_drop: i32,
    /// `good_match` after `i` drops (`good_match -= good_match * good_drop / 100`), settled
    /// from the last element on. Looking it up keeps the division off the search's critical
    /// path; the sequence is the C code's.
    good: [u16; GOOD_STEPS],
    /// Give up once the output reaches this many bytes.
    result_max: usize,
    /// Give up at this many bytes of output without a match.
    first_success_by: usize,
    /// Number of history lists, less one.
    mask: i32,
}

impl Limits {
    /// None where the input is too small or too large for the strategy.
    fn new(strategy: &Strategy, len: usize) -> Option<Limits> {
        let slen = i32::try_from(len).ok()?;
        if strategy.match_size_good <= 0
            || slen < strategy.min_input_size
            || slen > strategy.max_input_size
        {
            return None;
        }
        let need_rate = strategy.min_comp_rate.clamp(0, 99);
        let result_max = if slen > i32::MAX / 100 {
            (slen / 100) * (100 - need_rate)
        } else {
            (slen * (100 - need_rate)) / 100
        } as usize;
        let hashsz: i32 = match slen {
            ..128 => 512,
            128..256 => 1024,
            256..512 => 2048,
            512..1024 => 4096,
            _ => 8192,
        };
        let good_match = strategy.match_size_good.clamp(17, MAX_MATCH as i32);
        let good_drop = strategy.match_size_drop.clamp(0, 100);
        let mut good = [0u16; GOOD_STEPS];
        let mut g = good_match;
        for slot in &mut good {
            // 0..=273: fits.
            *slot = g as u16;
            g -= (g * good_drop) / 100;
        }
        Some(Limits {
            #[cfg(test)]
            good_match,
            #[cfg(test)]
            good_drop,
            good,
            result_max,
            first_success_by: usize::try_from(strategy.first_success_by).unwrap_or(0),
            mask: hashsz - 1,
        })
    }
}

/// `pglz_compress` with history `h` (see [`Pglz::compress`]); `lists` is work space.
fn compress_with<H: History>(
    h: &mut H,
    lists: &mut Vec<u16>,
    src: &[u8],
    strategy: &Strategy,
    out: &mut Vec<u8>,
) -> Option<usize> {
    let lim = Limits::new(strategy, src.len())?;
    let mask = lim.mask;
    h.clear(mask as usize + 1);
    hist_idx(src, mask, lists);
    let base = out.len();
    out.reserve(src.len() + 4);
    // Index of the current control byte in `out`; None: the C code's ctrl_dummy.
    let mut ctrlp: Option<usize> = None;
    let (mut ctrlb, mut ctrl) = (0u8, 0u8);
    let mut found_match = false;
    let mut dp = 0usize;
    while dp < src.len() {
        let written = out.len() - base;
        if written >= lim.result_max || (!found_match && written >= lim.first_success_by) {
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
        let hash = usize::from(lists[dp]);
        if let Some((len, off)) = h.find_match(src, dp, hash, &lim) {
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
            // Every position the tag covers enters the history.
            for (q, &hq) in (dp..).zip(&lists[dp..dp + len]) {
                h.add(src, q, usize::from(hq), mask);
            }
            dp += len;
            found_match = true;
        } else {
            // pglz_out_literal
            out.push(src[dp]);
            ctrl <<= 1;
            h.add(src, dp, hash, mask);
            dp += 1;
        }
    }
    if let Some(c) = ctrlp {
        out[c] = ctrlb;
    }
    let size = out.len() - base;
    (size < lim.result_max).then_some(size)
}

/// `pglz_decompress(src, .., out, out.len(), check_complete = true)`: `out` must be filled
/// exactly and `src` used up exactly. Never reads or writes outside the two slices.
pub fn decompress(src: &[u8], out: &mut [u8]) -> Result<(), PglzError> {
    let (mut sp, mut dp) = (0usize, 0usize);
    while sp < src.len() && dp < out.len() {
        let mut ctrl = src[sp];
        sp += 1;
        let mut n = 0;
        while n < 8 && sp < src.len() && dp < out.len() {
            if ctrl & 1 != 0 {
                let t = src.get(sp..sp + 2).ok_or(PglzError::Truncated)?;
                let mut len = usize::from(t[0] & 0x0f) + 3;
                let off = (usize::from(t[0] & 0xf0) << 4) | usize::from(t[1]);
                sp += 2;
                if len == 18 {
                    len += usize::from(*src.get(sp).ok_or(PglzError::Truncated)?);
                    sp += 1;
                }
                if off == 0 || off > dp {
                    return Err(PglzError::BadOffset { off, at: dp });
                }
                let len = len.min(out.len() - dp);
                copy_back(out, dp, off, len);
                dp += len;
            } else {
                out[dp] = src[sp];
                dp += 1;
                sp += 1;
            }
            ctrl >>= 1;
            n += 1;
        }
    }
    if dp != out.len() || sp != src.len() {
        return Err(PglzError::Length {
            got: dp,
            want: out.len(),
            left: src.len() - sp,
        });
    }
    Ok(())
}

/// `out[dp + i] = out[dp + i - off]` for `i` in `0..len`, in order, as the C code's byte
/// loop does (`1 <= off <= dp`, `dp + len <= out.len()`). Where the two ranges overlap
/// (`off < len`) the bytes repeat with period `off`: each copy takes the whole pattern written
/// so far, so the copies double in length.
#[inline]
fn copy_back(out: &mut [u8], dp: usize, off: usize, len: usize) {
    let from = dp - off;
    let mut done = 0;
    while done < len {
        // out[from..dp + done] is the pattern repeated: its first n bytes continue it at
        // dp + done (done is a multiple of off), and do not overlap it.
        let n = (len - done).min(off + done);
        out.copy_within(from..from + n, dp + done);
        done += n;
    }
}

#[cfg(test)]
mod tests;
