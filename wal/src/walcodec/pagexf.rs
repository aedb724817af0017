//! A reversible transform of data pages that shows zstd their regularity, for page frames
//! whose reference is not an earlier image of the same block (format version 3).
//!
//! A standard PostgreSQL page (heap, btree, and the other access methods built on
//! `PageHeaderData`) is a header, an array of 4-byte line pointers, free space, items, and
//! special space. Neighbouring line pointers and neighbouring items differ by small amounts
//! (offsets step by the item size; btree keys and heap TIDs count up; tuple headers repeat
//! with another xmin or ctid), which zstd cannot see: it codes a 4-byte field that changed by
//! one as literals. Measured on the first 30 s of pgbench (scale 10) after a checkpoint, the
//! page frames of first images went from 7.15 MB to 1.24 MB with this transform (btree leaf
//! pages 12 ×, heap pages 4 ×); on random-payload rows 11 % smaller.
//!
//! ```text
//! if 24 <= pd_lower <= pd_upper <= pd_special <= 8192 and (pd_lower - 24) % 4 == 0:
//!   n = (pd_lower - 24) / 4 line pointers; lp[i] = u32le at 24 + 4i
//!   items: line pointers with flags != 0, length > 0, offset >= pd_lower and
//!          offset + length <= 8192; each item's head is its first min(32, length) bytes
//!   if the heads of all items are pairwise disjoint:
//!     for each item in line pointer order whose head length equals that of the last
//!     earlier item of the same length (`same`, remembered per length in 64 slots by
//!     length % 64, a slot overwritten by each item):
//!       head[k] -= same.head[k] (wrapping, bytewise, in the transformed copy; the original
//!       bytes on the right)
//!   lp[i] -= lp[i - 1] (wrapping u32) for i from n - 1 down to 1
//! anything else: unchanged
//! ```
//!
//! Header fields are not touched, so the inverse makes the same decision; it restores the
//! line pointers first (in order), then the heads in line pointer order: every head it reads
//! from is already restored, and no later step writes into it (disjoint heads, all after
//! the line pointer array). Any 8192 bytes map to 8192 bytes and back; nothing can fail.

use super::wal::{item_id, max_offset, PAGE_HEADER, PAGE_SIZE};

/// Bytes of an item taken as its head.
const HEAD: usize = 32;
/// Slots of the "last item of this length" table.
const SLOTS: usize = 64;

/// Scratch space for the transform (kept between pages to avoid allocations).
#[derive(Default)]
pub struct PageXf {
    /// (offset, head length) of every item, in line pointer order.
    items: Vec<(u16, u16)>,
    /// Of the head bytes the last [`PageXf::forward`] replaced by differences, how many
    /// came out zero, and how many there were.
    head_zeros: (usize, usize),
}

/// [`PageXf::helps`]: the transform is worth it when at least this share (percent) of the
/// head bytes it replaced by differences came out zero.
const HELPS_ZEROS_PCT: usize = 60;

fn lp(p: &[u8; PAGE_SIZE], i: usize) -> u32 {
    let at = PAGE_HEADER + 4 * i;
    u32::from_le_bytes([p[at], p[at + 1], p[at + 2], p[at + 3]])
}

#[cfg(test)]
fn set_lp(p: &mut [u8; PAGE_SIZE], i: usize, v: u32) {
    let at = PAGE_HEADER + 4 * i;
    p[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn u32_of(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Marks the bytes `at..at + len` (`len` ≤ 32, within the page) in a bitmap of the page;
/// false if any of them was marked already.
fn mark(bits: &mut [u64; PAGE_SIZE / 64], at: usize, len: usize) -> bool {
    let (w, shift) = (at / 64, at % 64);
    let m = ((1u128 << len) - 1) << shift;
    let (lo, hi) = (m as u64, (m >> 64) as u64);
    if bits[w] & lo != 0 {
        return false;
    }
    bits[w] |= lo;
    if hi != 0 {
        // The range ends within the page, so a second word exists.
        if bits[w + 1] & hi != 0 {
            return false;
        }
        bits[w + 1] |= hi;
    }
    true
}

/// `dst` = `x` - `y`, bytewise (wrapping), over `dst`'s length; returns how many came out
/// zero. A whole head (most items are longer than [`HEAD`]) goes as fixed-size arrays, which
/// the compiler vectorizes: over slices of any length, this was half of `forward`'s
/// instructions.
fn head_difference(dst: &mut [u8], x: &[u8], y: &[u8]) -> usize {
    #[inline(always)]
    fn difference(dst: &mut [u8], x: &[u8], y: &[u8]) -> usize {
        let mut zeros = 0;
        for ((d, &a), &b) in dst.iter_mut().zip(x).zip(y) {
            *d = a.wrapping_sub(b);
            zeros += usize::from(*d == 0);
        }
        zeros
    }
    match (
        <&mut [u8; HEAD]>::try_from(&mut *dst),
        x.first_chunk::<HEAD>(),
        y.first_chunk::<HEAD>(),
    ) {
        (Ok(d), Some(x), Some(y)) => difference(d, x, y),
        _ => difference(dst, x, y),
    }
}

impl PageXf {
    pub fn new() -> PageXf {
        PageXf::default()
    }

    /// Fills `self.items` from the (original) line pointers of `p`; false if the heads are
    /// not pairwise disjoint (then no item is transformed).
    fn collect_items(&mut self, p: &[u8; PAGE_SIZE], n: usize) -> bool {
        let lower = PAGE_HEADER + 4 * n;
        self.items.clear();
        // One bit per byte of the page: heads overlap iff they mark a byte twice.
        let mut bits = [0u64; PAGE_SIZE / 64];
        for v in p[PAGE_HEADER..lower].chunks_exact(4).map(u32_of) {
            let (off, flags, len) = item_id(v);
            if flags != 0 && len > 0 && off >= lower && off + len <= PAGE_SIZE {
                let hl = len.min(HEAD);
                if !mark(&mut bits, off, hl) {
                    return false;
                }
                self.items.push((off as u16, hl as u16));
            }
        }
        true
    }

    /// Pairs (item, earlier item of the same head length) in line pointer order, as
    /// `f(offset, reference offset, head length)`.
    fn pairs(&self, mut f: impl FnMut(usize, usize, usize)) {
        let mut last = [(0u16, 0u16); SLOTS];
        for &(off, hl) in &self.items {
            let slot = &mut last[usize::from(hl) % SLOTS];
            if slot.1 == hl {
                f(usize::from(off), usize::from(slot.0), usize::from(hl));
            }
            *slot = (off, hl);
        }
    }

    /// `out` = the transform of `page`.
    pub fn forward(&mut self, page: &[u8; PAGE_SIZE], out: &mut [u8; PAGE_SIZE]) {
        out.copy_from_slice(page);
        self.head_zeros = (0, 0);
        let Some(n) = max_offset(page) else {
            return;
        };
        if self.collect_items(page, n) {
            let (mut zeros, mut total) = (0, 0);
            self.pairs(|off, r, hl| {
                zeros += head_difference(&mut out[off..off + hl], &page[off..], &page[r..]);
                total += hl;
            });
            self.head_zeros = (zeros, total);
        }
        if n > 1 {
            let lps = &page[PAGE_HEADER..PAGE_HEADER + 4 * n];
            let deltas = out[PAGE_HEADER + 4..PAGE_HEADER + 4 * n].chunks_exact_mut(4);
            for ((d, cur), prev) in deltas
                .zip(lps[4..].chunks_exact(4))
                .zip(lps.chunks_exact(4))
            {
                d.copy_from_slice(&u32_of(cur).wrapping_sub(u32_of(prev)).to_le_bytes());
            }
        }
    }

    /// Whether the page the last [`PageXf::forward`] transformed should go transformed (the
    /// encoder's choice; the decoder follows `IMG_PLAIN`). Differences help where items
    /// repeat their neighbours' fields (heap tuple headers, TIDs, integer keys: most head
    /// bytes come out zero) and hurt where the heads are text: the difference of two random
    /// hex digits is a byte of twice the entropy, and it breaks the repeats zstd finds inside
    /// an item. Recorded PG 15 bulk-load WAL: the pages of its text indexes' builds went 40 %
    /// smaller plain (below zstd -3 of the same WAL, where transformed they were 1.45 ×
    /// it), while pgbench's pages (transformed: half the bytes) kept every one of their
    /// transforms up to a threshold of 60 % zeros.
    pub fn helps(&self) -> bool {
        let (zeros, total) = self.head_zeros;
        total == 0 || zeros * 100 >= total * HELPS_ZEROS_PCT
    }

    /// Undoes [`PageXf::forward`] in place.
    pub fn inverse(&mut self, page: &mut [u8; PAGE_SIZE]) {
        let Some(n) = max_offset(page) else {
            return;
        };
        if n > 1 {
            let mut acc = lp(page, 0);
            for c in page[PAGE_HEADER + 4..PAGE_HEADER + 4 * n].chunks_exact_mut(4) {
                acc = acc.wrapping_add(u32_of(c));
                c.copy_from_slice(&acc.to_le_bytes());
            }
        }
        if self.collect_items(page, n) {
            // In line pointer order: each reference head is final before it is read.
            self.pairs(|off, r, hl| {
                // Heads are disjoint: the reference lies wholly before or after this one.
                let (dst, base) = if r < off {
                    let (lo, hi) = page.split_at_mut(off);
                    (&mut hi[..hl], &lo[r..r + hl])
                } else {
                    let (lo, hi) = page.split_at_mut(r);
                    (&mut lo[off..off + hl], &hi[..hl])
                };
                for (d, &y) in dst.iter_mut().zip(base) {
                    *d = d.wrapping_add(y);
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::walcodec::testgen::{Entropy, Rng};
    use proptest::prelude::*;

    /// A heap-like page: `n` items of `len` bytes packed from the end, each a header that
    /// repeats with a counter, then `fill`.
    fn packed(
        n: usize,
        len: usize,
        special: usize,
        fill: impl Fn(usize, usize) -> u8,
    ) -> Box<[u8; PAGE_SIZE]> {
        let mut p = Box::new([0u8; PAGE_SIZE]);
        let lower = PAGE_HEADER + 4 * n;
        let mut off = PAGE_SIZE - special;
        for i in 0..n {
            off -= len.next_multiple_of(8);
            set_lp(&mut p, i, off as u32 | 1 << 15 | (len as u32) << 17);
            for k in 0..len {
                p[off + k] = fill(i, k);
            }
        }
        p[12..14].copy_from_slice(&(lower as u16).to_le_bytes());
        p[14..16].copy_from_slice(&(off as u16).to_le_bytes());
        p[16..18].copy_from_slice(&((PAGE_SIZE - special) as u16).to_le_bytes());
        p
    }

    fn round_trip(p: &[u8; PAGE_SIZE]) -> Box<[u8; PAGE_SIZE]> {
        let mut xf = PageXf::new();
        let mut t = Box::new([0u8; PAGE_SIZE]);
        xf.forward(p, &mut t);
        let mut back = t.clone();
        xf.inverse(&mut back);
        assert!(back[..] == p[..], "the inverse did not restore the page");
        t
    }

    /// A text index's leaf page: each item a TID, its flags and a key of random hex digits.
    fn hex_keys(seed: u64) -> Box<[u8; PAGE_SIZE]> {
        let mut rng = Rng::new(seed);
        let hex: Vec<u8> = (0..64 * 40)
            .map(|_| b"0123456789abcdef"[rng.below(16) as usize])
            .collect();
        packed(60, 40, 16, |i, k| match k {
            0..=1 => 0,
            2 => 7,
            3..=5 => (i % 3) as u8,
            6 => 0x29,
            7 => 0x40,
            _ => hex[i * 40 + k],
        })
    }

    #[test]
    fn the_transform_is_kept_where_heads_repeat_and_dropped_for_text() {
        let mut xf = PageXf::new();
        let mut t = Box::new([0u8; PAGE_SIZE]);
        // Integer keys counting up, heap-like headers: most differences are zero.
        let ints = packed(50, 16, 16, |i, k| if k == 8 { i as u8 } else { k as u8 });
        xf.forward(&ints, &mut t);
        assert!(xf.helps());
        xf.forward(&hex_keys(3), &mut t);
        assert!(!xf.helps(), "{:?}", xf.head_zeros);
        // A page with nothing to difference: as before, transformed.
        xf.forward(&Box::new([0u8; PAGE_SIZE]), &mut t);
        assert!(xf.helps());
    }

    #[test]
    fn counters_become_constant_and_come_back() {
        // btree-like: 16-byte items whose key counts up.
        let p = packed(400, 16, 16, |i, k| if k == 8 { i as u8 } else { k as u8 });
        let t = round_trip(&p);
        // Line pointers after the first: all the same step.
        let steps: std::collections::HashSet<u32> = (1..400).map(|i| lp(&t, i)).collect();
        assert_eq!(steps.len(), 1, "{steps:?}");
        // Items after the first: the key differs by one, everything else by zero.
        let off = (lp(&p, 5) & 0x7fff) as usize;
        let mut want = [0u8; 16];
        want[8] = 1;
        assert_eq!(t[off..off + 16], want);
        // Compresses far better than the page itself.
        let z = |b: &[u8]| zstd::bulk::compress(b, 3).unwrap().len();
        assert!(z(&t[..]) * 4 < z(&p[..]), "{} vs {}", z(&t[..]), z(&p[..]));
    }

    #[test]
    fn only_heads_are_delta_coded() {
        let p = packed(60, 120, 0, |i, k| (i * 7 + k * 13) as u8);
        let t = round_trip(&p);
        let off = (lp(&p, 3) & 0x7fff) as usize;
        assert!(t[off..off + HEAD].iter().all(|&b| b == 7));
        assert_eq!(t[off + HEAD..off + 120], p[off + HEAD..off + 120]);
    }

    #[test]
    fn overlapping_items_leave_items_alone() {
        let mut p = packed(10, 40, 0, |i, k| (i + k) as u8);
        // Item 4 points into item 3.
        let off3 = lp(&p, 3) & 0x7fff;
        set_lp(&mut p, 4, (off3 + 8) | 1 << 15 | 40 << 17);
        let t = round_trip(&p);
        let off5 = (lp(&p, 5) & 0x7fff) as usize;
        assert_eq!(t[off5..off5 + 40], p[off5..off5 + 40]);
    }

    /// Heads that overlap only past a 64-byte boundary, or that just touch, are told apart.
    #[test]
    fn overlaps_across_bitmap_words_are_found() {
        for (second, overlapping) in [(6470, true), (6476, false), (6475, true)] {
            let mut p = Box::new([0u8; PAGE_SIZE]);
            p.iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b = (i * 31 % 251) as u8);
            p[12..14].copy_from_slice(&32u16.to_le_bytes());
            p[14..16].copy_from_slice(&6000u16.to_le_bytes());
            p[16..18].copy_from_slice(&(PAGE_SIZE as u16).to_le_bytes());
            // Two 16-byte items: 6460..6476 crosses from bitmap word 100 into word 101.
            set_lp(&mut p, 0, 6460 | 1 << 15 | 16 << 17);
            set_lp(&mut p, 1, second | 1 << 15 | 16 << 17);
            let t = round_trip(&p);
            assert!(t[..] == reference_forward(&p)[..], "item at {second}");
            let head = second as usize..second as usize + 16;
            assert_eq!(t[head.clone()] == p[head], overlapping, "item at {second}");
        }
    }

    #[test]
    fn odd_headers_pass_unchanged() {
        let mut rng = Rng::new(3);
        let mut p = Box::new([0u8; PAGE_SIZE]);
        p.iter_mut().for_each(|b| *b = rng.next_u64() as u8);
        // pd_lower beyond pd_upper.
        p[12..14].copy_from_slice(&900u16.to_le_bytes());
        p[14..16].copy_from_slice(&800u16.to_le_bytes());
        let t = round_trip(&p);
        assert!(t[..] == p[..]);
    }

    /// The transform as first written (sorting the heads to find overlaps, a byte at a
    /// time): the oracle the faster code must match byte for byte, since the transform is
    /// part of the payload format.
    fn reference_forward(page: &[u8; PAGE_SIZE]) -> Box<[u8; PAGE_SIZE]> {
        let mut out = Box::new(*page);
        let Some(n) = max_offset(page) else {
            return out;
        };
        let lower = PAGE_HEADER + 4 * n;
        let mut items = Vec::new();
        for i in 0..n {
            let v = lp(page, i);
            let (off, flags, len) = item_id(v);
            if flags != 0 && len > 0 && off >= lower && off + len <= PAGE_SIZE {
                items.push((off, len.min(HEAD)));
            }
        }
        let mut sorted = items.clone();
        sorted.sort_unstable();
        if sorted.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0) {
            let mut last = [(0usize, 0usize); SLOTS];
            for &(off, hl) in &items {
                let slot = &mut last[hl % SLOTS];
                if slot.1 == hl {
                    for k in 0..hl {
                        out[off + k] = page[off + k].wrapping_sub(page[slot.0 + k]);
                    }
                }
                *slot = (off, hl);
            }
        }
        for i in (1..n).rev() {
            set_lp(&mut out, i, lp(page, i).wrapping_sub(lp(page, i - 1)));
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]
        /// Any bytes at all, with headers steered towards the standard layout and line
        /// pointers towards items that overlap, touch or run off the page.
        #[test]
        fn any_page_round_trips(seed in any::<u64>(), lower in 0u16..9000, upper in 0u16..9000,
                                special in 0u16..9000, structured in any::<bool>()) {
            let mut rng = Rng::new(seed);
            let mut p = Box::new([0u8; PAGE_SIZE]);
            p.iter_mut().for_each(|b| *b = (rng.next_u64() % 7) as u8);
            let lower = if structured { PAGE_HEADER as u16 + (lower % 1000) / 4 * 4 } else { lower };
            p[12..14].copy_from_slice(&lower.to_le_bytes());
            p[14..16].copy_from_slice(&upper.max(lower).to_le_bytes());
            p[16..18].copy_from_slice(&special.max(upper).max(lower).to_le_bytes());
            if structured {
                for i in 0..(usize::from(lower).saturating_sub(PAGE_HEADER) / 4).min(2000) {
                    let off = usize::from(lower) + (rng.next_u64() % 8000) as usize;
                    let len = [16, 24, 40, 120][(rng.next_u64() % 4) as usize];
                    let v = (off as u32 & 0x7fff) | ((rng.next_u64() % 4) as u32) << 15 | (len as u32) << 17;
                    if PAGE_HEADER + 4 * i + 4 <= PAGE_SIZE {
                        set_lp(&mut p, i, v);
                    }
                }
            }
            let t = round_trip(&p);
            prop_assert!(t[..] == reference_forward(&p)[..], "differs from the reference");
        }
    }
}
