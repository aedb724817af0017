//! Heap records replayed onto the cached images of their pages, on both ends (format
//! version 3), so that the next image of a block is compressed against what the page most
//! likely holds by then rather than against its last image.
//!
//! Steady pgbench sends most images again for heap pages that had a handful of HOT updates
//! and prunings since their last image: new tuple versions, line pointers redirected, tuples
//! moved by compaction. All of that is in the records between the two images (except the
//! pruning of the record that carries the new image, whose data PostgreSQL leaves out). Both
//! ends apply, in record order, after a record is encoded or restored, to the cached page of
//! each of its blocks that has no image in the record:
//!
//! ```text
//! Heap INSERT (INIT_PAGE)        the tuple added at its offset (xmin, t_ctid, infomask)
//! Heap UPDATE, HOT_UPDATE         the old tuple's xmax, infomask, t_ctid; the new tuple added
//!                                 (its prefix and suffix from the old one as PostgreSQL cut)
//! Heap DELETE, LOCK               the tuple's xmax and infomask
//! Heap2 PRUNE (14-16), PRUNE_*    line pointers redirected, dead, unused; tuples compacted
//!   (17-18), VACUUM (14-16)
//! Heap2 VISIBLE                   PD_ALL_VISIBLE
//! ```
//!
//! and pd_lsn to the record's end. This follows PostgreSQL's redo routines
//! (`heap_xlog_*` in heapam.c / heapam_xlog.c, `heap_page_prune_execute`, bufpage.c) closely
//! but it only predicts: hint bits set by readers, the pruning done with an image and anything
//! not listed stay differences the page frame pays for. A page that does not look like what
//! the record expects is left alone. Nothing here can fail or read out of bounds; the decoder
//! applies the same function to the same bytes.

mod page;

#[cfg(test)]
mod tests;

use page::*;

pub(super) use page::next_item_offset;

use super::prunexf::{self, Candidates};
use super::tuples::LoggedTuple;
use super::wal::{
    le16, le32, max_offset, Area, BlockKey, HEAP_COMBOCID, HEAP_HOT_UPDATED, HEAP_KEYS_UPDATED,
    HEAP_XMAX_COMMITTED, HEAP_XMAX_EXCL_LOCK, HEAP_XMAX_INVALID, HEAP_XMAX_IS_MULTI,
    HEAP_XMAX_KEYSHR_LOCK, HEAP_XMAX_LOCK_ONLY, PAGE_SIZE, REC_HDR, RM_HEAP2_ID, RM_HEAP_ID,
    XLOG_HEAP_INIT_PAGE,
};
use crate::pg::PgMajor;

const HEAP_LOCK_MASK: u16 = HEAP_XMAX_EXCL_LOCK | HEAP_XMAX_KEYSHR_LOCK;
const HEAP_XMAX_BITS: u16 = HEAP_XMAX_COMMITTED
    | HEAP_XMAX_INVALID
    | HEAP_XMAX_IS_MULTI
    | HEAP_LOCK_MASK
    | HEAP_XMAX_LOCK_ONLY;
/// HEAP_MOVED_OFF | HEAP_MOVED_IN (t_infomask).
const HEAP_MOVED: u16 = 0x4000 | 0x8000;

/// Access to the block cache's pages by block, on either end.
pub trait PageStore {
    fn page_mut(&mut self, key: &BlockKey) -> Option<&mut [u8; PAGE_SIZE]>;
}

/// Scratch space and the major whose record layouts apply.
pub struct Redo {
    major: Option<PgMajor>,
    scratch: Box<PageBuf>,
    tuple: Vec<u8>,
    /// Where each block's next prune looks for dead tuples (`prunexf`).
    pub candidates: Candidates,
}

/// One record, as both ends have it after encoding / restoring it.
pub struct Record<'a> {
    /// The whole record (24-byte header, block headers, images, data, main data).
    pub bytes: &'a [u8],
    pub area: &'a Area,
    /// pd_lsn of the pages it changes: its end, MAXALIGNed.
    pub end_lsn: u64,
}

impl Record<'_> {
    fn rmid(&self) -> u8 {
        self.bytes[17]
    }
    fn info(&self) -> u8 {
        self.bytes[16]
    }
    fn xid(&self) -> u32 {
        u32::from_le_bytes([self.bytes[4], self.bytes[5], self.bytes[6], self.bytes[7]])
    }
    fn main(&self) -> &[u8] {
        let n = self.area.main_len as usize;
        &self.bytes[self.bytes.len().saturating_sub(n)..]
    }
    /// Block `id`'s key and data, if it is in the record without an image.
    fn block(&self, id: u8) -> Option<(BlockKey, &[u8])> {
        let mut p = REC_HDR + self.area.len;
        for b in &self.area.blocks {
            let img = b.image.map_or(0, |i| usize::from(i.len));
            let d = usize::from(b.data_len);
            if b.id == id {
                return b
                    .image
                    .is_none()
                    .then(|| Some((b.key, self.bytes.get(p + img..p + img + d)?)))
                    .flatten();
            }
            p += img + d;
        }
        None
    }
    /// Whether block `id` is in the record (with or without an image).
    fn has_block(&self, id: u8) -> bool {
        self.area.blocks.iter().any(|b| b.id == id)
    }
}

impl Redo {
    pub fn new(major: Option<PgMajor>) -> Redo {
        Redo {
            major,
            scratch: Box::new([0; PAGE_SIZE]),
            tuple: Vec::new(),
            candidates: Candidates::default(),
        }
    }

    /// Applies `rec` to the cached pages of its blocks.
    pub fn apply(&mut self, rec: &Record<'_>, pages: &mut dyn PageStore) {
        if self.major.is_none() || rec.bytes.len() < REC_HDR {
            return;
        }
        match (rec.rmid(), rec.info() & 0x70) {
            (RM_HEAP_ID, 0x00) => self.insert(rec, pages),
            (RM_HEAP_ID, 0x20 | 0x40) => self.update(rec, pages),
            (RM_HEAP_ID, 0x10) => xmax_change(rec, pages, false),
            (RM_HEAP_ID, 0x60) => xmax_change(rec, pages, true),
            (RM_HEAP2_ID, op) => self.heap2(rec, op, pages),
            _ => {}
        }
        if prunexf::Layout::of(self.major).is_some() {
            self.track(rec, pages);
        }
    }

    /// Keeps [`Candidates`] in step with the record: blocks it images forgotten, the tuple an
    /// UPDATE, HOT_UPDATE or DELETE gave an xmax touched, a pruned block started again.
    fn track(&mut self, rec: &Record<'_>, pages: &mut dyn PageStore) {
        let blocks = &rec.area.blocks;
        for b in blocks.iter().filter(|b| b.image.is_some()) {
            self.candidates.forget(&b.key);
        }
        let key = |id: u8| blocks.iter().find(|b| b.id == id).map(|b| b.key);
        match (rec.rmid(), rec.info() & 0x70) {
            (RM_HEAP_ID, op @ (0x10 | 0x20 | 0x40)) => {
                // xl_heap_delete and xl_heap_update: the old tuple's offset at 4.
                let id = u8::from(op != 0x10 && rec.has_block(1));
                if let (Some(k), Some(off)) = (key(id), le16(rec.main(), 4)) {
                    self.candidates.touched(&k, off);
                }
            }
            (RM_HEAP2_ID, op) if prunexf::prunes_page(self.major, op) => {
                if let Some(k) = key(0) {
                    let page = pages.page_mut(&k).map(|p| &*p);
                    self.candidates.pruned(&k, page);
                }
            }
            _ => {}
        }
    }

    /// A tuple as heap redo builds it: header from the record, `body` from t_bits on.
    fn build_tuple(&mut self, xid: u32, xmax: u32, hdr: &[u8], body: &[u8], blk: u32, off: u16) {
        self.tuple_header(xid, xmax, hdr, blk, off);
        self.tuple.extend_from_slice(body);
    }

    /// The header of a tuple as heap redo builds it (up to t_bits), from the record's
    /// xl_heap_header `hdr`.
    fn tuple_header(&mut self, xid: u32, xmax: u32, hdr: &[u8], blk: u32, off: u16) {
        let t = &mut self.tuple;
        t.clear();
        t.extend_from_slice(&xid.to_le_bytes());
        t.extend_from_slice(&xmax.to_le_bytes());
        t.extend_from_slice(&[0; 4]);
        t.extend_from_slice(&((blk >> 16) as u16).to_le_bytes());
        t.extend_from_slice(&(blk as u16).to_le_bytes());
        t.extend_from_slice(&off.to_le_bytes());
        t.extend_from_slice(&hdr[..5]);
    }

    fn insert(&mut self, rec: &Record<'_>, pages: &mut dyn PageStore) {
        let main = rec.main();
        let (Some((key, data)), Some(off), Some(&flags)) =
            (rec.block(0), le16(main, 0), main.get(2))
        else {
            return;
        };
        if data.len() < 5 {
            return;
        }
        self.build_tuple(rec.xid(), 0, &data[..5], &data[5..], key.blkno, off);
        let Some(p) = pages.page_mut(&key) else {
            return;
        };
        if rec.info() & XLOG_HEAP_INIT_PAGE != 0 {
            init(p);
        }
        if add_item(p, &self.tuple, usize::from(off)) {
            set_lsn(p, rec.end_lsn);
            if flags & 0x01 != 0 {
                set_flag(p, PD_ALL_VISIBLE, false);
            }
        }
    }

    fn update(&mut self, rec: &Record<'_>, pages: &mut dyn PageStore) {
        let main = rec.main();
        let (
            Some(old_xmax),
            Some(old_off),
            Some(&infobits),
            Some(&flags),
            Some(new_xmax),
            Some(new_off),
        ) = (
            le32(main, 0),
            le16(main, 4),
            main.get(6),
            main.get(7),
            le32(main, 8),
            le16(main, 12),
        )
        else {
            return;
        };
        let hot = rec.info() & 0x70 == 0x40;
        let new_block = rec.area.blocks.first().filter(|b| b.id == 0).map(|b| b.key);
        let old_id = if rec.has_block(1) { 1 } else { 0 };
        let Some(new_key) = new_block else {
            return;
        };
        let old_page = rec.block(old_id).and_then(|(k, _)| pages.page_mut(&k));
        let old_tuple = old_page
            .as_deref()
            .and_then(|p| tuple_range(p, usize::from(old_off)));
        // The new tuple first: its prefix and suffix come from the old tuple's user data,
        // before any change.
        let old_user = old_page
            .as_deref()
            .zip(old_tuple.clone())
            .and_then(|(p, r)| p.get(r.start + usize::from(p[r.start + 22])..r.end));
        let built = rec.block(0).and_then(|(_, data)| {
            let logged = LoggedTuple::parse(data, flags & 0x20 != 0, flags & 0x40 != 0)?;
            self.tuple_header(rec.xid(), new_xmax, logged.hdr, new_key.blkno, new_off);
            logged
                .expand_onto(old_user.unwrap_or_default(), &mut self.tuple)
                .then_some(())
        });
        if let (Some(p), Some(r)) = (old_page, old_tuple) {
            let h = &mut p[r.start..r.start + TUPLE_HEADER];
            set_xmax(h, old_xmax, infobits, Some(hot));
            set_ctid(h, new_key.blkno, new_off);
            set_prunable(p, rec.xid());
            if flags & 0x01 != 0 {
                set_flag(p, PD_ALL_VISIBLE, false);
            }
            set_lsn(p, rec.end_lsn);
        }
        if built.is_none() {
            return;
        }
        let Some(p) = pages.page_mut(&new_key) else {
            return;
        };
        if rec.info() & XLOG_HEAP_INIT_PAGE != 0 {
            init(p);
        }
        if add_item(p, &self.tuple, usize::from(new_off)) {
            if flags & 0x02 != 0 {
                set_flag(p, PD_ALL_VISIBLE, false);
            }
            set_lsn(p, rec.end_lsn);
        }
    }

    fn heap2(&mut self, rec: &Record<'_>, op: u8, pages: &mut dyn PageStore) {
        let Some(major) = self.major else {
            return;
        };
        let modern = major >= PgMajor::V17;
        match op {
            0x10 | 0x20 | 0x30 if modern => self.prune17(rec, pages),
            0x10 => self.prune14(rec, pages),
            0x20 => vacuum14(rec, pages),
            0x40 => {
                if let Some((key, _)) = rec.block(1) {
                    if let Some(p) = pages.page_mut(&key) {
                        set_flag(p, PD_ALL_VISIBLE, true);
                    }
                }
            }
            _ => {}
        }
    }

    /// PostgreSQL 14-16: xl_heap_prune {horizon u32, nredirected u16, ndead u16 [, catalog]};
    /// block 0: redirected pairs, dead, then unused offsets.
    fn prune14(&mut self, rec: &Record<'_>, pages: &mut dyn PageStore) {
        let main = rec.main();
        let (Some(nred), Some(ndead), Some((key, data))) =
            (le16(main, 4), le16(main, 6), rec.block(0))
        else {
            return;
        };
        let offs: Vec<u16> = data
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        let (nred, ndead) = (usize::from(nred), usize::from(ndead));
        let Some(rest) = offs.len().checked_sub(2 * nred + ndead) else {
            return;
        };
        let (red, tail) = offs.split_at(2 * nred);
        let (dead, unused) = tail.split_at(ndead);
        debug_assert_eq!(unused.len(), rest);
        if let Some(p) = pages.page_mut(&key) {
            prune_execute(
                p,
                [red, dead, unused],
                Compact::Repair { truncate: false },
                &mut self.scratch,
            );
            set_lsn(p, rec.end_lsn);
        }
    }

    /// PostgreSQL 17-18: xl_heap_prune {reason, flags [, horizon]}; block 0: freeze plans,
    /// then the redirected, dead and unused arrays each with its count.
    fn prune17(&mut self, rec: &Record<'_>, pages: &mut dyn PageStore) {
        let main = rec.main();
        let (Some(&flags), Some((key, data))) = (main.get(1), rec.block(0)) else {
            return;
        };
        let mut at = 0usize;
        if flags & 0x10 != 0 {
            // xlhp_freeze_plans: nplans u16, 2 bytes of padding, 12-byte plans.
            let Some(n) = le16(data, 0) else { return };
            at = 4 + 12 * usize::from(n);
        }
        let mut arrays: [Vec<u16>; 3] = Default::default();
        for (bit, arr) in [(0x20u8, 2usize), (0x40, 1), (0x80, 1)]
            .iter()
            .zip(arrays.iter_mut())
        {
            if flags & bit.0 == 0 {
                continue;
            }
            let Some(n) = le16(data, at) else { return };
            at += 2;
            let len = usize::from(n) * bit.1;
            for i in 0..len {
                let Some(v) = le16(data, at + 2 * i) else {
                    return;
                };
                arr.push(v);
            }
            at += 2 * len;
        }
        if arrays.iter().all(Vec::is_empty) {
            return;
        }
        // Without XLHP_CLEANUP_LOCK (VACUUM's second pass) only the array is cut.
        let compact = if flags & 0x04 != 0 {
            Compact::Repair { truncate: true }
        } else {
            Compact::TruncateOnly
        };
        if let Some(p) = pages.page_mut(&key) {
            let [a, b, c] = &arrays;
            prune_execute(p, [a, b, c], compact, &mut self.scratch);
            set_lsn(p, rec.end_lsn);
        }
    }
}

/// How heap_page_prune_execute ends.
#[derive(Clone, Copy)]
enum Compact {
    /// PageRepairFragmentation (17+: also cutting trailing unused line pointers).
    Repair { truncate: bool },
    /// PageTruncateLinePointerArray only.
    TruncateOnly,
}

/// heap_page_prune_execute: line pointers set (redirected pairs, dead, unused), then the page
/// compacted.
fn prune_execute(p: &mut PageBuf, lists: [&[u16]; 3], compact: Compact, scratch: &mut PageBuf) {
    let [redirected, dead, unused] = lists;
    let Some(n) = max_offset(p) else {
        return;
    };
    let ok = |o: u16| (1..=n).contains(&usize::from(o));
    for pair in redirected.chunks_exact(2) {
        if ok(pair[0]) {
            set_lp(
                p,
                usize::from(pair[0]),
                usize::from(pair[1]),
                LP_REDIRECT,
                0,
            );
        }
    }
    for &o in dead.iter().filter(|&&o| ok(o)) {
        set_lp(p, usize::from(o), 0, LP_DEAD, 0);
    }
    for &o in unused.iter().filter(|&&o| ok(o)) {
        set_lp(p, usize::from(o), 0, LP_UNUSED, 0);
    }
    match compact {
        Compact::TruncateOnly => truncate_line_pointers(p),
        Compact::Repair { truncate } => {
            repair_fragmentation(p, truncate, scratch);
            set_flag(p, PD_PAGE_FULL, false);
        }
    }
}

/// PostgreSQL 14-16 XLOG_HEAP2_VACUUM: block 0's offsets set unused, the array cut.
fn vacuum14(rec: &Record<'_>, pages: &mut dyn PageStore) {
    let Some((key, data)) = rec.block(0) else {
        return;
    };
    let offs: Vec<u16> = data
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    if let Some(p) = pages.page_mut(&key) {
        let Some(n) = max_offset(p) else { return };
        for &o in offs.iter().filter(|&&o| (1..=n).contains(&usize::from(o))) {
            set_lp(p, usize::from(o), 0, LP_UNUSED, 0);
        }
        truncate_line_pointers(p);
        set_lsn(p, rec.end_lsn);
    }
}

/// Heap DELETE (`lock` false) and LOCK: xl_heap_delete / xl_heap_lock {xmax u32, offnum u16,
/// infobits u8, flags u8}.
fn xmax_change(rec: &Record<'_>, pages: &mut dyn PageStore, lock: bool) {
    let main = rec.main();
    let (Some(xmax), Some(off), Some(&infobits), Some(&flags), Some((key, _))) = (
        le32(main, 0),
        le16(main, 4),
        main.get(6),
        main.get(7),
        rec.block(0),
    ) else {
        return;
    };
    let Some(p) = pages.page_mut(&key) else {
        return;
    };
    let Some(r) = tuple_range(p, usize::from(off)) else {
        return;
    };
    let h = &mut p[r.start..r.start + TUPLE_HEADER];
    if lock {
        set_xmax(h, xmax, infobits, None);
        let infomask = u16::from_le_bytes([h[20], h[21]]);
        let locked_only = infomask & HEAP_XMAX_LOCK_ONLY != 0
            || infomask & (HEAP_XMAX_IS_MULTI | HEAP_LOCK_MASK) == HEAP_XMAX_EXCL_LOCK;
        if locked_only {
            let m2 = u16::from_le_bytes([h[18], h[19]]) & !HEAP_HOT_UPDATED;
            h[18..20].copy_from_slice(&m2.to_le_bytes());
            set_ctid(h, key.blkno, off);
        }
    } else {
        if flags & 0x08 != 0 {
            // XLH_DELETE_IS_SUPER: xmin cleared instead.
            set_xmax(h, 0, infobits, Some(false));
            h[0..4].copy_from_slice(&[0; 4]);
        } else {
            set_xmax(h, xmax, infobits, Some(false));
        }
        if flags & 0x10 == 0 {
            set_ctid(h, key.blkno, off);
        }
        set_prunable(p, rec.xid());
        if flags & 0x01 != 0 {
            set_flag(p, PD_ALL_VISIBLE, false);
        }
    }
    set_lsn(p, rec.end_lsn);
}

fn set_ctid(h: &mut [u8], blkno: u32, off: u16) {
    h[12..14].copy_from_slice(&((blkno >> 16) as u16).to_le_bytes());
    h[14..16].copy_from_slice(&(blkno as u16).to_le_bytes());
    h[16..18].copy_from_slice(&off.to_le_bytes());
}

/// The xmax part of heap redo: infomask bits from `infobits` (fix_infomask_from_infobits),
/// HEAP_HOT_UPDATED set/cleared when `hot` says, xmax, command id 0 (not combo).
fn set_xmax(h: &mut [u8], xmax: u32, infobits: u8, hot: Option<bool>) {
    let mut m = u16::from_le_bytes([h[20], h[21]]) & !(HEAP_XMAX_BITS | HEAP_MOVED);
    let mut m2 = u16::from_le_bytes([h[18], h[19]]) & !HEAP_KEYS_UPDATED;
    if let Some(hot) = hot {
        m2 = if hot {
            m2 | HEAP_HOT_UPDATED
        } else {
            m2 & !HEAP_HOT_UPDATED
        };
    }
    for (bit, flag) in [
        (0x01, HEAP_XMAX_IS_MULTI),
        (0x02, HEAP_XMAX_LOCK_ONLY),
        (0x04, HEAP_XMAX_EXCL_LOCK),
        (0x08, HEAP_XMAX_KEYSHR_LOCK),
    ] {
        if infobits & bit != 0 {
            m |= flag;
        }
    }
    if infobits & 0x10 != 0 {
        m2 |= HEAP_KEYS_UPDATED;
    }
    m &= !HEAP_COMBOCID;
    h[4..8].copy_from_slice(&xmax.to_le_bytes());
    h[8..12].copy_from_slice(&[0; 4]);
    h[18..20].copy_from_slice(&m2.to_le_bytes());
    h[20..22].copy_from_slice(&m.to_le_bytes());
}

/// PageSetPrunable: pd_prune_xid to `xid` if unset or newer.
fn set_prunable(p: &mut PageBuf, xid: u32) {
    if xid < 3 {
        return;
    }
    let cur = u32_at(p, 20);
    if cur == 0 || (xid.wrapping_sub(cur) as i32) < 0 {
        set_u32(p, 20, xid);
    }
}

fn set_lsn(p: &mut PageBuf, lsn: u64) {
    set_u32(p, 0, (lsn >> 32) as u32);
    set_u32(p, 4, lsn as u32);
}
