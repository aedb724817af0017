//! A prune predicted from the cached page (format 15: PostgreSQL 14–16; format 16: 17–18 too).
//!
//! A prune on access (`heap_page_prune` in 14–16, `heap_page_prune_and_freeze` in 17–18,
//! logged when a page is pruned as pgbench does before nearly every update of
//! `pgbench_accounts`) names what it removed: the HOT chains' roots redirected to their first
//! live member, roots that died, the members freed. Both ends hold the page as redo left it
//! before the record, with each chain's tuples, their xmax and `t_ctid`. From it they predict
//! the record as PostgreSQL would write it if every tuple with a valid updating or deleting
//! xmax were dead ([`predict`]), and the record goes as its difference from that prediction:
//!
//! ```text
//! A prune on access, no image in the record, block 0's page cached:
//!   PostgreSQL 14-16, Heap2 PRUNE (info & 0x70 = 0x10):
//!     main data bytes 0..8 (horizon u32le, nredirected u16le, ndead u16le) XOR the
//!     prediction's
//!     block 0's data (u16le offsets: redirected pairs, dead, unused) XOR the prediction's
//!     bytes at the same place (0 past their end)
//!   PostgreSQL 17-18, Heap2 PRUNE_ON_ACCESS (info & 0x70 = 0x10):
//!     main data bytes 0..6 (reason, flags, [horizon u32le when flags has
//!     XLHP_HAS_CONFLICT_HORIZON]) XOR the prediction's (reason 0; flags XLHP_CLEANUP_LOCK,
//!     the horizon's bit when it is valid, each array's bit when it has entries)
//!     block 0's data (for each array present: count u16le, then its u16le offsets) XOR the
//!     prediction's bytes at the same place (0 past their end)
//! ```
//!
//! Zeros where the prediction holds; a prediction that misses costs bytes, never a byte of
//! the result (XOR is its own inverse, and both ends predict from the same page). PostgreSQL
//! decides a tuple is dead against the oldest snapshot still running, which no WAL carries:
//! where a concurrent transaction still sees an old version, or its updater has not
//! committed, the prediction has removed too much. A VACUUM's prunes (17–18: with freeze
//! plans) are not predicted. PostgreSQL 17–18 never set xl_heap_prune's `reason` byte (the
//! record's info says why): it is whatever the stack held, 0 in 99.8 % of recorded pgbench
//! prunes of 17 and 67 % of 18's, so on 18 a third of the prunes miss by that byte alone.
//!
//! Recorded PostgreSQL 15 WAL (`codec_profile FILE LSN 15 decode`, warmed; the sixty-fifth
//! round of `docs/keeping-up.md`): 99.9 % of pgbench's prunes at 5 min checkpoints and 98.7 %
//! at 30 s predicted exactly; the codec's bytes −7.7 % and −10.2 %, `updates` −17.5 %, lz4
//! images −10.1 %, a bulk load the same, for 12–20 % less one-core encoding and decoding
//! speed on the first four (the page's line pointers and the touched tuples' headers read
//! once more, seldom in the CPU's caches).

use super::prefetch::prefetch;
use super::tuples::PageLookup;
use super::wal::{
    item_id, le16, le32, line_pointer, max_offset, BlockKey, BlockRef, HEAP_HOT_UPDATED,
    HEAP_ONLY_TUPLE, HEAP_XMAX_INVALID, HEAP_XMAX_IS_MULTI, HEAP_XMAX_LOCK_ONLY,
    HEAP_XMIN_COMMITTED, HEAP_XMIN_INVALID, LP_NORMAL, LP_REDIRECT, MAX_HEAP_TUPLES, PAGE_SIZE,
    RM_HEAP2_ID, TUPLE_HEADER,
};
use crate::pg::PgMajor;

/// Most bytes of main data the prediction covers.
pub const MAIN_LEN: usize = 8;

/// How a major logs a prune on access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// 14–16: xl_heap_prune {horizon, nredirected, ndead [, isCatalogRel (16)]}; block 0's
    /// data the three arrays without counts.
    V14,
    /// 17–18: xl_heap_prune {reason, flags [, horizon]}; block 0's data each array present
    /// as its count and offsets; heap-only tuples no chain reached looked at after every
    /// chain (`prune_freeze_plan`), not in line pointer order among them.
    V17,
}

impl Layout {
    pub fn of(major: Option<PgMajor>) -> Option<Layout> {
        match major? {
            PgMajor::V14 | PgMajor::V15 | PgMajor::V16 => Some(Layout::V14),
            PgMajor::V17 | PgMajor::V18 => Some(Layout::V17),
        }
    }
}

/// xl_heap_prune's flags (17–18).
const XLHP_CLEANUP_LOCK: u8 = 0x04;
const XLHP_HAS_CONFLICT_HORIZON: u8 = 0x08;
const XLHP_HAS_REDIRECTIONS: u8 = 0x20;
const XLHP_HAS_DEAD_ITEMS: u8 = 0x40;
const XLHP_HAS_NOW_UNUSED_ITEMS: u8 = 0x80;

/// A prune as both ends predict it; kept between records for its buffers.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Prediction {
    /// Main data's first bytes (zeros past `main_len`).
    pub main: [u8; MAIN_LEN],
    /// How many bytes of main data are predicted: 8 (14–16), 2 or 6 (17–18: without or with
    /// a conflict horizon).
    pub main_len: usize,
    /// Block 0's data.
    pub data: Vec<u8>,
    redirected: Vec<u16>,
    dead: Vec<u16>,
    unused: Vec<u16>,
}

/// Entries of [`Candidates`]' table, one block each: a block whose hash falls on another's
/// entry takes it (both ends at the same record). 36 bytes each: 1.2 MB a codec.
const ENTRIES: usize = 1 << 15;
/// Most line pointers an entry keeps; one more forgets the block.
const MAX_TOUCHED: usize = 6;

/// Per block, the line pointers whose tuples an UPDATE or DELETE gave an xmax since the
/// block's last prune: where the next prune looks for dead tuples, instead of every line
/// pointer and tuple header of the page. Both ends keep it from the records alone, in step
/// (`redo`). A block without an entry (not pruned since its last image, more touched than an
/// entry holds, or its entry taken by another block) is predicted from every tuple; a prune
/// gives it an entry, kept in the line pointers that are still tuples (those the prune left:
/// whose xmax was too recent).
#[derive(Debug, Default)]
pub struct Candidates {
    /// Direct-mapped by the block key's hash; allocated at the first prune.
    table: Vec<Entry>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Entry {
    key: BlockKey,
    /// Line pointers touched; `len` 0xff: no entry.
    len: u8,
    offs: [u16; MAX_TOUCHED],
}

const NONE: u8 = 0xff;

fn slot(key: &BlockKey) -> usize {
    let mut h = 0u64;
    for v in [key.spc, key.db, key.rel, u32::from(key.fork), key.blkno] {
        h = (h.rotate_left(5) ^ u64::from(v)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    (h >> 40) as usize & (ENTRIES - 1)
}

impl Candidates {
    fn entry(&self, key: &BlockKey) -> Option<&Entry> {
        self.table
            .get(slot(key))
            .filter(|e| e.len != NONE && e.key == *key)
    }

    fn entry_mut(&mut self, key: &BlockKey) -> Option<&mut Entry> {
        self.table
            .get_mut(slot(key))
            .filter(|e| e.len != NONE && e.key == *key)
    }

    /// The block's line pointers to look at (None: all of them).
    pub fn get(&self, key: &BlockKey) -> Option<&[u16]> {
        self.entry(key).map(|e| &e.offs[..usize::from(e.len)])
    }

    /// The block's page was replaced (an image) or is no longer known.
    pub fn forget(&mut self, key: &BlockKey) {
        if let Some(e) = self.entry_mut(key) {
            e.len = NONE;
        }
    }

    /// An UPDATE or DELETE gave the tuple at `off` an xmax.
    pub fn touched(&mut self, key: &BlockKey, off: u16) {
        if let Some(e) = self.entry_mut(key) {
            if usize::from(e.len) == MAX_TOUCHED {
                e.len = NONE;
            } else {
                e.offs[usize::from(e.len)] = off;
                e.len += 1;
            }
        }
    }

    /// A prune of the block ran; `page` as it left it (None: not cached).
    pub fn pruned(&mut self, key: &BlockKey, page: Option<&[u8; PAGE_SIZE]>) {
        let Some(page) = page else {
            self.forget(key);
            return;
        };
        if self.table.is_empty() {
            self.table = vec![
                Entry {
                    len: NONE,
                    ..Entry::default()
                };
                ENTRIES
            ];
        }
        let e = &mut self.table[slot(key)];
        if e.len == NONE || e.key != *key {
            *e = Entry {
                key: *key,
                ..Entry::default()
            };
        }
        let mut kept = 0;
        for i in 0..usize::from(e.len) {
            let off = e.offs[i];
            if line_pointer(page, usize::from(off)).is_some_and(|(_, f, _)| f == LP_NORMAL) {
                e.offs[kept] = off;
                kept += 1;
            }
        }
        e.len = kept as u8;
    }
}

/// Whether `rmid`/`info` is a prune this module predicts for `major`: a prune on access.
pub fn applies(major: Option<PgMajor>, rmid: u8, info: u8) -> bool {
    rmid == RM_HEAP2_ID && info & 0x70 == 0x10 && Layout::of(major).is_some()
}

/// Whether a Heap2 record of `op` (info & 0x70) prunes its page for `major`: the prune on
/// access, and in 17–18 also VACUUM's (PRUNE_VACUUM_SCAN, PRUNE_VACUUM_CLEANUP).
pub fn prunes_page(major: Option<PgMajor>, op: u8) -> bool {
    match Layout::of(major) {
        Some(Layout::V14) => op == 0x10,
        Some(Layout::V17) => matches!(op, 0x10 | 0x20 | 0x30),
        None => false,
    }
}

/// Predicts the record (`rmid`, `info`, `blocks`) into `out` when it is a prune this module
/// predicts for `major`, of block 0's page as `pages` holds it before the record; false (no
/// prediction, the record goes as it is) otherwise, and for a record with any image (the
/// encoder stores a record's images before it writes its data, the decoder restores them
/// after). Both ends call it at the same point of the same record.
pub fn predict_record(
    major: Option<PgMajor>,
    (rmid, info): (u8, u8),
    blocks: &[BlockRef],
    pages: &dyn PageLookup,
    candidates: &Candidates,
    out: &mut Prediction,
) -> bool {
    let Some(layout) = Layout::of(major) else {
        return false;
    };
    if !applies(major, rmid, info) || blocks.iter().any(|b| b.image.is_some()) {
        return false;
    }
    let Some(b) = blocks.first().filter(|b| b.id == 0) else {
        return false;
    };
    pages
        .page_of(&b.key)
        .is_some_and(|page| predict(page, candidates.get(&b.key), layout, out))
}

/// One tuple's header fields the prediction reads.
#[derive(Clone, Copy)]
struct Tuple {
    xmin: u32,
    xmax: u32,
    infomask: u16,
    infomask2: u16,
    ctid_off: u16,
}

impl Tuple {
    fn at(page: &[u8; PAGE_SIZE], at: usize, len: usize) -> Option<Tuple> {
        if len < TUPLE_HEADER || at + len > PAGE_SIZE {
            return None;
        }
        Some(Tuple {
            xmin: le32(page, at)?,
            xmax: le32(page, at + 4)?,
            ctid_off: le16(page, at + 16)?,
            infomask2: le16(page, at + 18)?,
            infomask: le16(page, at + 20)?,
        })
    }

    /// HeapTupleHeaderGetXmin: FrozenTransactionId when frozen.
    fn xmin(&self) -> u32 {
        let frozen = HEAP_XMIN_COMMITTED | HEAP_XMIN_INVALID;
        if self.infomask & frozen == frozen {
            2
        } else {
            self.xmin
        }
    }

    /// What the prediction takes as HEAPTUPLE_DEAD: updated or deleted by a plain xid.
    fn dead(&self) -> bool {
        let not = HEAP_XMAX_INVALID | HEAP_XMAX_LOCK_ONLY | HEAP_XMAX_IS_MULTI;
        self.xmax != 0 && self.infomask & not == 0
    }

    fn hot_updated(&self) -> bool {
        self.infomask2 & HEAP_HOT_UPDATED != 0
    }

    fn heap_only(&self) -> bool {
        self.infomask2 & HEAP_ONLY_TUPLE != 0
    }
}

/// TransactionIdFollows.
fn follows(a: u32, b: u32) -> bool {
    if a < 3 || b < 3 {
        a > b
    } else {
        (a.wrapping_sub(b) as i32) > 0
    }
}

/// The page's prune state: its line pointers, which `heap_page_prune` has marked, and the
/// conflict horizon so far.
struct Pruner<'p> {
    page: &'p [u8; PAGE_SIZE],
    n: usize,
    /// The line pointers, 1-based (0 past `n`).
    lps: [u32; MAX_HEAP_TUPLES + 1],
    marked: [bool; MAX_HEAP_TUPLES + 1],
    horizon: u32,
    /// The chain being followed (chainitems).
    items: [u16; MAX_HEAP_TUPLES],
    /// 17–18: heap-only tuples no chain reached looked at after every chain.
    orphans_last: bool,
}

impl Pruner<'_> {
    /// Line pointer `off`: (lp_off, lp_flags, lp_len).
    fn lp(&self, off: usize) -> (usize, u32, usize) {
        item_id(self.lps.get(off).copied().unwrap_or(0))
    }

    fn tuple(&self, off: usize) -> Option<Tuple> {
        let (at, flags, len) = self.lp(off);
        (flags == LP_NORMAL).then(|| Tuple::at(self.page, at, len))?
    }

    /// HeapTupleHeaderAdvanceLatestRemovedXid, the inserter taken as committed.
    fn advance(&mut self, t: &Tuple) {
        let xmin_aborted =
            t.infomask & (HEAP_XMIN_COMMITTED | HEAP_XMIN_INVALID) == HEAP_XMIN_INVALID;
        if !xmin_aborted && t.xmax != t.xmin() && follows(t.xmax, self.horizon) {
            self.horizon = t.xmax;
        }
    }

    /// heap_prune_chain from `root`.
    fn chain(&mut self, root: usize, out: &mut Prediction) {
        let (root_at, root_flags, _) = self.lp(root);
        if let Some(t) = self.tuple(root).filter(Tuple::heap_only) {
            if t.dead() && !t.hot_updated() {
                self.mark(root);
                out.unused.push(root as u16);
                self.advance(&t);
            }
            return;
        }
        let (mut nchain, mut latest_dead) = (0usize, None);
        let (mut off, mut prior_xmax) = (root, None);
        loop {
            if off == 0 || off > self.n || self.marked[off] || nchain == MAX_HEAP_TUPLES {
                break;
            }
            let (_, flags, _) = self.lp(off);
            if flags == LP_REDIRECT {
                if nchain > 0 {
                    break;
                }
                self.items[nchain] = off as u16;
                nchain += 1;
                off = root_at;
                continue;
            }
            let Some(t) = self.tuple(off) else { break };
            if prior_xmax.is_some_and(|x| t.xmin() != x) {
                break;
            }
            self.items[nchain] = off as u16;
            nchain += 1;
            if !t.dead() {
                break;
            }
            latest_dead = Some(nchain - 1);
            self.advance(&t);
            if !t.hot_updated() {
                break;
            }
            off = usize::from(t.ctid_off);
            prior_xmax = Some(t.xmax);
        }
        if let Some(ld) = latest_dead {
            for k in 1..=ld {
                let i = self.items[k];
                self.mark(usize::from(i));
                out.unused.push(i);
            }
            self.mark(root);
            match (ld + 1 < nchain).then(|| self.items[ld + 1]) {
                Some(to) => {
                    self.mark(usize::from(to));
                    out.redirected.extend([root as u16, to]);
                }
                None => out.dead.push(root as u16),
            }
        } else if nchain < 2 && root_flags == LP_REDIRECT {
            self.mark(root);
            out.dead.push(root as u16);
        }
    }

    /// heap_page_prune's loop: every line pointer that may start a chain, in order.
    fn every_chain(&mut self, out: &mut Prediction) {
        // The tuple headers read are seldom in the CPU's caches: ask for them all first, so
        // that their misses overlap.
        let base = self.page.as_ptr() as usize;
        let mut starts = [0u16; MAX_HEAP_TUPLES];
        let mut k = 0;
        for off in 1..=self.n {
            let (at, flags, _) = self.lp(off);
            if flags == LP_NORMAL {
                // (A header that starts past byte 41 of a line ends in the next.)
                prefetch(base + at);
                if at % 64 > 41 {
                    prefetch(base + at + 22);
                }
            }
            // Unused and dead line pointers start no chain.
            if flags == LP_NORMAL || flags == LP_REDIRECT {
                starts[k] = off as u16;
                k += 1;
            }
        }
        self.chains(&starts[..k], out);
    }

    /// The same loop over the line pointers where a dead tuple may be, `touched` since the
    /// block's last prune ([`Candidates`]), and the redirects to them: every other chain
    /// holds no tuple with an xmax, which the loop passes over without a change.
    fn touched_chains(&mut self, touched: &[u16], out: &mut Prediction) {
        let mut starts = [0u16; 2 * MAX_TOUCHED];
        let mut k = 0;
        for off in 1..=self.n {
            let (at, flags, _) = self.lp(off);
            if flags == LP_REDIRECT && touched.contains(&(at as u16)) && k < starts.len() {
                starts[k] = off as u16;
                k += 1;
            }
        }
        for &off in touched {
            if self.lp(usize::from(off)).1 == LP_NORMAL && k < starts.len() {
                starts[k] = off;
                k += 1;
            }
        }
        let starts = &mut starts[..k];
        starts.sort_unstable();
        self.chains(starts, out);
    }

    /// heap_prune_chain from each of `starts` (in ascending order) not yet marked; in
    /// 17–18 (`orphans_last`) the heap-only ones after every other start.
    fn chains(&mut self, starts: &[u16], out: &mut Prediction) {
        let mut orphans = [0u16; MAX_HEAP_TUPLES];
        let mut k = 0;
        for (i, &off) in starts.iter().enumerate() {
            let off = usize::from(off);
            if (i > 0 && usize::from(starts[i - 1]) == off) || self.marked[off] {
                continue;
            }
            if self.orphans_last && self.tuple(off).is_some_and(|t| t.heap_only()) {
                orphans[k] = off as u16;
                k += 1;
                continue;
            }
            self.chain(off, out);
        }
        for &off in &orphans[..k] {
            if !self.marked[usize::from(off)] {
                self.chain(usize::from(off), out);
            }
        }
    }

    fn mark(&mut self, off: usize) {
        if let Some(m) = self.marked.get_mut(off) {
            *m = true;
        }
    }
}

/// What PostgreSQL (`layout`) would log for a prune of `page` on access if every tuple whose
/// xmax is a plain, updating or deleting xid were dead, looking for dead tuples only at line
/// pointers `touched` and the chains that reach them when given ([`Candidates`]); false (no
/// prediction) for a page that is not a heap page this module can read.
pub fn predict(
    page: &[u8; PAGE_SIZE],
    touched: Option<&[u16]>,
    layout: Layout,
    out: &mut Prediction,
) -> bool {
    out.data.clear();
    out.redirected.clear();
    out.dead.clear();
    out.unused.clear();
    let Some(n) = max_offset(page).filter(|&n| n <= MAX_HEAP_TUPLES) else {
        return false;
    };
    let mut lps = [0u32; MAX_HEAP_TUPLES + 1];
    for (v, c) in lps[1..=n]
        .iter_mut()
        .zip(page[24..24 + 4 * n].chunks_exact(4))
    {
        *v = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    let mut p = Pruner {
        page,
        n,
        lps,
        marked: [false; MAX_HEAP_TUPLES + 1],
        horizon: 0,
        items: [0; MAX_HEAP_TUPLES],
        orphans_last: layout == Layout::V17,
    };
    match touched {
        None => p.every_chain(out),
        Some(touched) => p.touched_chains(touched, out),
    }
    write_record(layout, p.horizon, out);
    true
}

/// The prediction's main data and block 0's data as `layout` logs them.
fn write_record(layout: Layout, horizon: u32, out: &mut Prediction) {
    let Prediction {
        main,
        main_len,
        data,
        redirected,
        dead,
        unused,
    } = out;
    let put = |data: &mut Vec<u8>, offs: &[u16]| {
        data.extend(offs.iter().flat_map(|o| o.to_le_bytes()));
    };
    let nred = (redirected.len() / 2) as u16;
    *main = [0; MAIN_LEN];
    match layout {
        Layout::V14 => {
            main[..4].copy_from_slice(&horizon.to_le_bytes());
            main[4..6].copy_from_slice(&nred.to_le_bytes());
            main[6..8].copy_from_slice(&(dead.len() as u16).to_le_bytes());
            *main_len = 8;
            for offs in [&*redirected, &*dead, &*unused] {
                put(data, offs);
            }
        }
        Layout::V17 => {
            let mut flags = XLHP_CLEANUP_LOCK;
            for (offs, count, bit) in [
                (&*redirected, nred, XLHP_HAS_REDIRECTIONS),
                (&*dead, dead.len() as u16, XLHP_HAS_DEAD_ITEMS),
                (&*unused, unused.len() as u16, XLHP_HAS_NOW_UNUSED_ITEMS),
            ] {
                if count > 0 {
                    flags |= bit;
                    data.extend_from_slice(&count.to_le_bytes());
                    put(data, offs);
                }
            }
            // main[0]: the reason byte, never set by PostgreSQL; most often 0.
            *main_len = 2;
            if horizon != 0 {
                flags |= XLHP_HAS_CONFLICT_HORIZON;
                main[2..6].copy_from_slice(&horizon.to_le_bytes());
                *main_len = 6;
            }
            main[1] = flags;
        }
    }
}

/// XORs main data's first bytes with the prediction's (its own inverse).
pub fn apply_main(head: &mut [u8], p: &Prediction) {
    for (b, m) in head.iter_mut().zip(&p.main) {
        *b ^= m;
    }
}

/// XORs block 0's data with the prediction's (its own inverse); bytes past the shorter
/// stay.
pub fn apply_data(data: &mut [u8], p: &Prediction) {
    for (b, m) in data.iter_mut().zip(&p.data) {
        *b ^= m;
    }
}

/// Whether main data after [`apply_main`] (`main`, the whole of it) is the prediction's:
/// zeros, at least as long (bytes past [`MAIN_LEN`], 16's isCatalogRel, are not predicted).
pub fn main_exact(main: &[u8], p: &Prediction) -> bool {
    let pl = main.len().min(MAIN_LEN);
    pl >= p.main_len && main[..pl].iter().all(|&x| x == 0)
}

/// Whether main data after [`apply_main`] missed the prediction by 17–18's `reason` byte
/// alone (the byte PostgreSQL leaves unset; [`main_exact`] is false then).
pub fn main_missed_by_reason(main: &[u8], major: Option<PgMajor>, p: &Prediction) -> bool {
    let pl = main.len().min(MAIN_LEN);
    Layout::of(major) == Some(Layout::V17)
        && pl >= p.main_len
        && main.first().is_some_and(|&r| r != 0)
        && main[1..pl].iter().all(|&x| x == 0)
}

/// Whether block 0's data after [`apply_data`] is the prediction's: zeros, as long.
pub fn data_exact(data: &[u8], p: &Prediction) -> bool {
    data.len() == p.data.len() && data.iter().all(|&x| x == 0)
}

#[cfg(test)]
mod tests;
