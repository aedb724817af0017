//! The encoder's own parse of a page against the previous image of the same block (a cache
//! hit): the matches found here are what [`super::hitcode`] writes into the HIT stream
//! (format 12; until 11 zstd entropy coded them into a frame of their own). Encoder only.
//!
//! Why: zstd's lazy2 parser (level 6), which finds the few changes of such a page well, must
//! first index all 8 KiB of the prefix, then search; that was ~16 µs a page, a fifth of the
//! encoder's time on WAL with many images. Between two images of one block most bytes stay
//! where they were or moved together (a tuple pruned and the rest compacted, a line pointer
//! added), and the changes are small (hint bits, a ctid, pd_lsn). So, over `reference ++ page`
//! with the page at [`PAGE_SIZE`]:
//!
//! - at each position, first the offsets of the last three matches (zstd's repeat offsets),
//!   the reference's same position (offset [`PAGE_SIZE`]) and the byte before (offset 1: a
//!   run, such as the zeroed space of a pruned tuple): the longest match of [`MIN_MATCH`]
//!   bytes or more there;
//! - unless that match is [`GOOD`] already, the position's next [`MIN_HASHED`] bytes are
//!   looked up in a hash table of the reference's positions (one in [`STEP`]) and of the
//!   page's positions passed over as literals, two per bucket (the newest two: with one, the
//!   page's literals pushed the reference's positions out, and the frames were 13 % larger);
//!   a candidate must match [`MIN_HASHED`] bytes and beat the repeat offsets' match by more
//!   than [`HASHED_GAIN`] bytes (a new offset costs more to code). Hashing 4 bytes rather
//!   than 8 finds the short matches between rows (a tuple header like its neighbour's):
//!   frames 2.6 % smaller on recorded WAL, as fast;
//! - a match shorter than [`LAZY`] gives way to a literal when the next position has one two
//!   bytes longer; a match taken is extended back over the literals before it and taken
//!   whole; a position without one becomes a literal.
//!
//! On 2,000 cache hits of recorded PG 15 pgbench WAL (pglz images) the frames were 10 %
//! smaller than lazy2's with an 8-byte hash, made in 6 µs a page against 17 (parse and
//! entropy coding); over whole recordings, with the 4-byte hash, 12 % smaller (814,630 →
//! 715,869 bytes of hit frames with pglz images, 738,218 → 649,308 without). Every match
//! length is counted by comparing the bytes; [`super::hitcode::put`] checks the offsets and
//! lengths against the bounds as it writes them.

use super::hitcode::Seq;
use super::pglz::common_prefix;
use super::wal::PAGE_SIZE;

/// Shortest match taken.
const MIN_MATCH: u32 = 4;
/// Positions of the reference indexed: one in this many.
const STEP: usize = 4;
/// Bits of the hash table.
const HASH_BITS: u32 = 12;
/// Shortest match taken from the hash table.
const MIN_HASHED: usize = 4;
/// A hashed match must be longer than the repeat offset's by more than this.
const HASHED_GAIN: usize = 3;
/// A repeat offset's match this long is taken without a look at the hash table.
const GOOD: usize = 32;
/// A match shorter than this is dropped for a literal when the next position has one
/// longer by two bytes or more.
const LAZY: usize = 32;
/// The bytes parsed: the reference, then the page.
const END: usize = 2 * PAGE_SIZE;
/// The bits of a table entry that hold the position + 1 (at most [`END`]).
const POS_MASK: u32 = 0xFFFF;
const _: () = assert!(END < POS_MASK as usize);

/// Scratch space, kept between pages.
pub struct HitParse {
    /// Positions + 1 by hash of their next [`MIN_HASHED`] bytes, two per bucket, newest
    /// first, each tagged in its upper 16 bits with the page it was made for (`tag`): an
    /// entry of another page is none, so the 32 KiB table is not cleared for every page.
    table: Box<[u32; 2 << HASH_BITS]>,
    /// This page's tag (in the upper 16 bits; never 0, which the table starts with).
    tag: u32,
    /// The reference followed by the page.
    both: Box<[u8; END]>,
    seqs: Vec<Seq>,
}

impl Default for HitParse {
    fn default() -> Self {
        HitParse::new()
    }
}

/// The hash of the [`MIN_HASHED`] = 4 bytes at `at`.
fn hash(b: &[u8; END], at: usize) -> usize {
    let w: [u8; 4] = b[at..at + 4].try_into().expect("four bytes");
    hash4(u32::from_le_bytes(w))
}

/// The hash of 4 bytes read as a little-endian word `w`: [`hash`] without the read, for the
/// words of a reference.
fn hash4(w: u32) -> usize {
    const _: () = assert!(MIN_HASHED == 4);
    ((u64::from(w) << 32).wrapping_mul(0x9E37_79B1_85EB_CA87) >> (64 - HASH_BITS)) as usize
}

/// How many bytes from `at` equal those from `from` (`from < at`), up to [`END`].
fn common(b: &[u8; END], at: usize, from: usize) -> usize {
    common_prefix(&b[at..], &b[from..])
}

/// The best match at `pos`: the longest at a repeat offset, unless the hash table has a
/// longer one; (0, 0) for none (the position then enters the table).
fn best(
    b: &[u8; END],
    table: &mut [u32; 2 << HASH_BITS],
    tag: u32,
    pos: usize,
    reps: &[usize; 3],
) -> (usize, usize) {
    let (mut len, mut off) = (0, 0);
    for o in [reps[0], reps[1], reps[2], PAGE_SIZE, 1] {
        if o <= pos && o != off {
            let l = common(b, pos, pos - o);
            if l > len {
                (len, off) = (l, o);
            }
        }
    }
    if len < MIN_MATCH as usize {
        len = 0;
    }
    if len < GOOD && pos + 8 <= END {
        let h = 2 * hash(b, pos);
        let base = len;
        for c in [table[h], table[h + 1]] {
            let c = if c & !POS_MASK == tag {
                (c & POS_MASK) as usize
            } else {
                0
            };
            if c != 0 && c - 1 < pos {
                let l = common(b, pos, c - 1);
                if l >= MIN_HASHED && l > base + HASHED_GAIN && l > len {
                    (len, off) = (l, pos - (c - 1));
                }
            }
        }
        if len == 0 {
            table[h + 1] = table[h];
            table[h] = tag | (pos + 1) as u32;
        }
    }
    (len, off)
}

impl HitParse {
    pub fn new() -> HitParse {
        HitParse {
            table: Box::new([0; 2 << HASH_BITS]),
            tag: 0,
            both: Box::new([0; END]),
            seqs: Vec::new(),
        }
    }

    /// The sequences of `page` against `reference` (offsets reach back into the reference,
    /// which comes right before the page); the bytes after the last one are literals.
    pub fn parse(&mut self, reference: &[u8; PAGE_SIZE], page: &[u8; PAGE_SIZE]) -> &[Seq] {
        let b = &mut *self.both;
        b[..PAGE_SIZE].copy_from_slice(reference);
        b[PAGE_SIZE..].copy_from_slice(page);
        let b = &*b;
        let table = &mut *self.table;
        self.tag = self.tag.wrapping_add(POS_MASK + 1);
        if self.tag == 0 {
            // Every tag used: the table's entries could be taken for this page's.
            table.fill(0);
            self.tag = POS_MASK + 1;
        }
        let tag = self.tag;
        // The reference's positions 0, STEP, … up to PAGE_SIZE - 8, hashed from its 4-byte
        // words, without a bounds check each.
        const _: () = assert!(STEP == MIN_HASHED);
        for (k, w) in reference
            .chunks_exact(4)
            .take((PAGE_SIZE - 8) / STEP + 1)
            .enumerate()
        {
            let h = 2 * hash4(u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
            table[h + 1] = table[h];
            table[h] = tag | (k * STEP + 1) as u32;
        }
        self.seqs.clear();
        let (mut pos, mut lit) = (PAGE_SIZE, PAGE_SIZE);
        let mut reps = [PAGE_SIZE, PAGE_SIZE, PAGE_SIZE];
        while pos + MIN_MATCH as usize <= END {
            let (mut len, off) = best(b, table, tag, pos, &reps);
            if len == 0 {
                pos += 1;
                continue;
            }
            if len < LAZY && pos + 1 + MIN_MATCH as usize <= END {
                let (l2, _) = best(b, table, tag, pos + 1, &reps);
                if l2 > len + 1 {
                    pos += 1;
                    continue;
                }
            }
            let mut start = pos;
            while start > lit && start > off && b[start - 1] == b[start - 1 - off] {
                start -= 1;
                len += 1;
            }
            self.seqs.push(Seq {
                offset: off as u32,
                lit: (start - lit) as u32,
                ml: len as u32,
            });
            if off != reps[0] {
                reps = if off == reps[1] {
                    [off, reps[0], reps[2]]
                } else {
                    [off, reps[0], reps[1]]
                };
            }
            pos = start + len;
            lit = pos;
        }
        &self.seqs
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// What the sequences say the page is, over the reference.
    pub(in crate::walcodec) fn apply(
        reference: &[u8; PAGE_SIZE],
        page: &[u8; PAGE_SIZE],
        seqs: &[Seq],
    ) -> Vec<u8> {
        let mut out = reference.to_vec();
        let mut src = 0;
        for s in seqs {
            let l = s.lit as usize;
            out.extend_from_slice(&page[src..src + l]);
            src += l;
            for _ in 0..s.ml {
                out.push(out[out.len() - s.offset as usize]);
            }
            src += s.ml as usize;
        }
        out.extend_from_slice(&page[src..]);
        out.split_off(PAGE_SIZE)
    }

    pub(in crate::walcodec) fn pages(seed: u64) -> (Box<[u8; PAGE_SIZE]>, Box<[u8; PAGE_SIZE]>) {
        let mut x = seed | 1;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut r = Box::new([0u8; PAGE_SIZE]);
        for c in r.chunks_mut(8) {
            c.copy_from_slice(&next().to_le_bytes());
        }
        let mut p = r.clone();
        // Moved: 128 bytes later by 128, the gap zeroed; a few single bytes changed.
        p.copy_within(1000..5000, 1128);
        p[1000..1128].fill(0);
        for k in 0..40 {
            let at = (next() as usize) % PAGE_SIZE;
            p[at] = p[at].wrapping_add(1 + k as u8);
        }
        (r, p)
    }

    #[test]
    fn sequences_rebuild_the_page_and_find_moved_bytes() {
        for seed in 1..20 {
            let (r, p) = pages(seed);
            let mut hp = HitParse::new();
            let seqs = hp.parse(&r, &p).to_vec();
            assert_eq!(apply(&r, &p, &seqs), p.to_vec(), "seed {seed}");
            let literals: usize = seqs.iter().map(|s| s.lit as usize).sum::<usize>() + PAGE_SIZE
                - seqs.iter().map(|s| (s.lit + s.ml) as usize).sum::<usize>();
            // 40 changed bytes and the zeroed gap (found as a match of zeros elsewhere or
            // literals): far fewer literals than the page.
            assert!(literals < 400, "seed {seed}: {literals} literals");
            assert!(seqs.iter().all(|s| s.ml >= MIN_MATCH));
        }
    }

    /// A parser that parsed other pages before parses as a new one: the entries of earlier
    /// pages are none; when the tags wrap around, the table is cleared.
    #[test]
    fn earlier_pages_leave_nothing_behind() {
        let (r1, p1) = pages(3);
        let (r2, p2) = pages(4);
        let fresh = HitParse::new().parse(&r2, &p2).to_vec();
        let mut hp = HitParse::new();
        hp.parse(&r1, &p1);
        assert_eq!(hp.parse(&r2, &p2), &fresh[..]);
        // The last tag for one page, then the wrap.
        hp.tag = !POS_MASK - (POS_MASK + 1);
        hp.parse(&r1, &p1);
        assert_eq!(hp.tag, !POS_MASK);
        assert_eq!(hp.parse(&r2, &p2), &fresh[..], "after the tags wrapped");
        assert_eq!(hp.tag, POS_MASK + 1);
        let tag = hp.tag;
        assert!(hp.table.iter().all(|&e| e == 0 || e & !POS_MASK == tag));
    }

    #[test]
    fn the_word_hash_is_the_position_hash() {
        let (reference, page) = pages(7);
        let mut b = Box::new([0u8; END]);
        b[..PAGE_SIZE].copy_from_slice(&reference[..]);
        b[PAGE_SIZE..].copy_from_slice(&page[..]);
        for at in (0..=PAGE_SIZE - 8).step_by(STEP) {
            let w = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
            assert_eq!(hash4(w), hash(&b, at), "at {at}");
        }
    }

    #[test]
    fn unrelated_and_identical_pages() {
        let (r, _) = pages(7);
        let (other, _) = pages(99);
        let mut hp = HitParse::new();
        let seqs = hp.parse(&r, &other).to_vec();
        assert_eq!(apply(&r, &other, &seqs), other.to_vec());
        let seqs = hp.parse(&r, &r).to_vec();
        assert_eq!(seqs.len(), 1);
        assert_eq!(
            (seqs[0].offset, seqs[0].ml),
            (PAGE_SIZE as u32, PAGE_SIZE as u32)
        );
        let zeros = Box::new([0u8; PAGE_SIZE]);
        let seqs = hp.parse(&zeros, &zeros).to_vec();
        assert_eq!(apply(&zeros, &zeros, &seqs), zeros.to_vec());
    }
}
