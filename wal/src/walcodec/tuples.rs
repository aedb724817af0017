//! Heap tuples sent as deltas against a version the far side already holds (issue #4).
//!
//! PostgreSQL shortens an UPDATE's new tuple by the prefix and suffix it shares with the old one
//! only when both are on the same page, no full-page image is taken, and `wal_level` is below
//! logical. Everywhere else the whole tuple is in the record although the receiver has usually
//! seen the old version: in an earlier record or in a full-page image of its page. Both ends
//! therefore keep, fed deterministically from the records they encode/restore:
//!
//! - a **tuple cache**: the newest tuple written at (relation, fork, block, offset) by a heap
//!   INSERT or UPDATE/HOT_UPDATE record, kept as records in a ring of `block_cache_bytes / 8`
//!   bytes (both ends use the same `block_cache_bytes`, the link handshake sees to it), the
//!   oldest dropped first ([`ring`], format 10);
//!   INSERTs into a relation that has had 64 Ki of them since its last UPDATE or DELETE are
//!   left out ([`inserts`], format 6);
//! - the **block cache** of #3 (page images by block), read through the line pointers of the
//!   cached page (`PageLookup`).
//!
//! The tuple cache also helps full-page images: a page frame whose reference is not the
//! block's own previous image is compressed against the known tuples of its block (offset
//! order, at most 8 KiB, [`page_prefix`]) followed by its reference page, since an image holds
//! the tuples records wrote into the page since its last image (a frame against the block's
//! previous image does without: that page had the records replayed onto it).
//! Each known tuple goes with the 23-byte header PostgreSQL gives it on the page (xmin = the
//! record's xid, t_ctid = itself, the record's infomask with HEAP_XMIN_COMMITTED, [`Head`]):
//! steady pgbench image frames 214 → 182 bytes, random-payload updates 975 → 677.
//!
//! A *site* is a tuple inside a record that may be sent as a delta: the new tuple of an INSERT
//! or UPDATE (block 0's data, after the `xl_heap_header`, when PostgreSQL did not already cut a
//! prefix/suffix) and the old tuple or key that `wal_level=logical` adds to an UPDATE's or
//! DELETE's main data. For each site both ends list the same *candidates* (references):
//!
//! ```text
//! 1 the tuple cache at the old tuple's TID
//! 2 the old tuple's TID in the cached page of its block
//! 3 the new tuple's TID in the cached page of block 0 (after this record's image of block 0,
//!   if any: at wal_level=logical an image of block 0 contains the very tuple that follows it)
//! ```
//!
//! and the encoder writes to CTRL, at the site (block data: right after the block's image;
//! main data: after all blocks):
//!
//! ```text
//! site = 0                                  the tuple as it is (in DATA / MAIN)
//!      | c:u8 (1..=3) prefix:varint suffix:varint
//!                                           the tuple = ref[..prefix] ++ middle ++ ref[len-suffix..]
//! ```
//!
//! where `middle` replaces the tuple bytes in DATA / MAIN (the bytes before the tuple — the
//! `xl_heap_header`, the fixed part of main data — are sent as they are). References are the
//! tuple bytes from `t_bits` on, the form in which heap records carry them. Which records have
//! sites is decided from bytes both ends have at that point (the record header, the block
//! headers, the fixed part of main data), so the decoder asks the same question.
//!
//! An update PostgreSQL cut itself (no site) logs only the bytes between the prefix and suffix
//! it shares with the old tuple: on pgbench, the changed bytes of a balance. Where both ends
//! know the old tuple (tuple cache, else cached page) with the new one's length and at most
//! [`CHANGED_MAX`] bytes changed, those go as the little-endian difference from the old
//! tuple's bytes at the same place, wrapping in their width (format 14,
//! [`HeapRec::changed_bytes`]): a counter's or balance's increment, whatever bytes its carry
//! reached, instead of its new value. On recorded pgbench WAL (5 min checkpoints, warmed on
//! 300 MB) DATA fell 18.9 → 17.8 MB and the whole 44.2 → 43.1 MB.

use std::hash::{BuildHasherDefault, Hasher};

use super::wal::{
    item_id, le16, BlockKey, BlockRef, HEAP_XMIN_COMMITTED, LP_NORMAL, MAX_HEAP_TUPLES,
    PAGE_HEADER, PAGE_SIZE, TUPLE_HEADER,
};

mod inserts;
mod logged;
mod ring;
pub use inserts::COLD_AFTER;
pub(super) use logged::LoggedTuple;
pub use ring::TupleCache;

pub use super::wal::RM_HEAP_ID;
use super::wal::XLOG_HEAP_OPMASK;
const XLOG_HEAP_INSERT: u8 = 0x00;
const XLOG_HEAP_DELETE: u8 = 0x10;
const XLOG_HEAP_UPDATE: u8 = 0x20;
const XLOG_HEAP_HOT_UPDATE: u8 = 0x40;
/// `SizeOfHeapInsert`, `SizeOfHeapDelete`, `SizeOfHeapUpdate`, `SizeOfHeapHeader`.
const SIZE_INSERT: usize = 3;
const SIZE_DELETE: usize = 8;
const SIZE_UPDATE: usize = 14;
const SIZE_HEAP_HEADER: usize = 5;
const XLH_UPDATE_CONTAINS_OLD: u8 = 0x04 | 0x08;
const XLH_UPDATE_PREFIX_FROM_OLD: u8 = 0x20;
const XLH_UPDATE_SUFFIX_FROM_OLD: u8 = 0x40;
const XLH_DELETE_CONTAINS_OLD: u8 = 0x02 | 0x04;
/// A delta must save at least this many bytes to be used.
pub const MIN_SAVING: usize = 8;

/// A tuple's identity: its block and line pointer offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tid {
    pub block: BlockKey,
    pub off: u16,
}

/// A fast multiplicative hash for the caches' small fixed-size keys (block and relation keys;
/// SipHash was a seventh of the encoder's time when the tuple cache used it too). Keys come
/// from the primary's WAL, not from an untrusted peer.
#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v));
    }
    fn write_u16(&mut self, v: u16) {
        self.write_u64(u64::from(v));
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

pub type FxBuild = BuildHasherDefault<FxHasher>;

/// The header fields of a tuple that its record gives: the record's xid (the tuple's xmin)
/// and `xl_heap_header` (t_infomask2, t_infomask, t_hoff).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Head {
    pub xmin: u32,
    pub infomask2: u16,
    pub infomask: u16,
    pub hoff: u8,
}

impl Head {
    /// The 23-byte tuple header PostgreSQL most likely has on the page for this tuple at
    /// `tid`: xmin, no xmax, command id 0, t_ctid pointing at itself, the record's infomask
    /// with HEAP_XMIN_COMMITTED (set by the first reader after the commit).
    fn on_page(&self, tid: &Tid, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.xmin.to_le_bytes());
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(&((tid.block.blkno >> 16) as u16).to_le_bytes());
        out.extend_from_slice(&(tid.block.blkno as u16).to_le_bytes());
        out.extend_from_slice(&tid.off.to_le_bytes());
        out.extend_from_slice(&self.infomask2.to_le_bytes());
        out.extend_from_slice(&(self.infomask | HEAP_XMIN_COMMITTED).to_le_bytes());
        out.push(self.hoff);
    }
}

/// The known tuples of block `key` (the tuple cache's, in offset order, at most a page of
/// bytes) into `out`: page frames of the block's image are compressed against them, since an
/// image holds the tuples that records wrote into the page since its previous image. The line
/// pointers to try follow from the image's hole offset (its `pd_lower`), which both ends know.
pub fn page_prefix(tuples: &TupleCache, key: &BlockKey, hole_offset: u16, out: &mut Vec<u8>) {
    out.clear();
    if key.fork != 0 || !tuples.may_hold(key) {
        return;
    }
    let n = (usize::from(hole_offset).saturating_sub(PAGE_HEADER) / 4).min(MAX_HEAP_TUPLES);
    for off in 1..=n as u16 {
        let tid = Tid { block: *key, off };
        if let Some((head, data)) = tuples.get_with_head(&tid) {
            if out.len() + TUPLE_HEADER + data.len() > PAGE_SIZE {
                break;
            }
            head.on_page(&tid, out);
            out.extend_from_slice(data);
        }
    }
}

/// Access to the block cache's page of a block, on either end.
pub trait PageLookup {
    fn page_of(&self, key: &BlockKey) -> Option<&[u8; PAGE_SIZE]>;
}

/// The tuple at line pointer `off` of a heap `page`: (t_hoff, bytes from t_bits on).
pub fn tuple_in_page(page: &[u8; PAGE_SIZE], off: u16) -> Option<(u8, &[u8])> {
    let lower = usize::from(le16(page, 12)?);
    let i = PAGE_HEADER + (usize::from(off).checked_sub(1)?) * 4;
    if off == 0 || i + 4 > lower.min(PAGE_SIZE) {
        return None;
    }
    let v = u32::from_le_bytes(page[i..i + 4].try_into().ok()?);
    let (lp_off, lp_flags, lp_len) = item_id(v);
    if lp_flags != LP_NORMAL || lp_len <= TUPLE_HEADER || lp_off + lp_len > PAGE_SIZE {
        return None;
    }
    Some((
        page[lp_off + 22],
        &page[lp_off + TUPLE_HEADER..lp_off + lp_len],
    ))
}

/// Where a site's tuple is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// In the data of the record's first block (block 0), after `skip` bytes.
    Block0,
    /// In the main data, after `skip` bytes.
    Main,
}

#[derive(Clone, Copy, Debug)]
pub struct Site {
    pub place: Place,
    pub skip: usize,
    /// The TID whose older version is the best guess (candidates 1 and 2).
    pub old: Option<Tid>,
    /// The TID the tuple is written to (candidate 3).
    pub new: Option<Tid>,
}

/// The fixed facts of a heap record both ends can read before its tuples.
#[derive(Clone, Copy, Debug)]
pub struct HeapRec {
    op: u8,
    flags: u8,
    /// TID of the tuple written (INSERT, UPDATE) or of the old tuple (UPDATE, DELETE).
    new: Option<Tid>,
    old: Option<Tid>,
}

impl HeapRec {
    /// `main_head` must hold the first bytes of main data (at least the fixed struct). Records
    /// that are not heap INSERT/UPDATE/HOT_UPDATE/DELETE, or are malformed, give `None`.
    pub fn parse(rmid: u8, info: u8, blocks: &[BlockRef], main_head: &[u8]) -> Option<HeapRec> {
        if rmid != RM_HEAP_ID {
            return None;
        }
        let b0 = blocks.first().filter(|b| b.id == 0)?.key;
        let op = info & XLOG_HEAP_OPMASK;
        let tid = |block: BlockKey, off: u16| Some(Tid { block, off });
        match op {
            XLOG_HEAP_INSERT if main_head.len() >= SIZE_INSERT => Some(HeapRec {
                op,
                flags: main_head[2],
                new: tid(b0, le16(main_head, 0)?),
                old: None,
            }),
            XLOG_HEAP_DELETE if main_head.len() >= SIZE_DELETE => Some(HeapRec {
                op,
                flags: main_head[7],
                new: None,
                old: tid(b0, le16(main_head, 4)?),
            }),
            XLOG_HEAP_UPDATE | XLOG_HEAP_HOT_UPDATE if main_head.len() >= SIZE_UPDATE => {
                let old_block = match blocks.get(1) {
                    Some(b) if b.id == 1 => b.key,
                    _ => b0,
                };
                Some(HeapRec {
                    op,
                    flags: main_head[7],
                    new: tid(b0, le16(main_head, 12)?),
                    old: tid(old_block, le16(main_head, 4)?),
                })
            }
            _ => None,
        }
    }

    /// Bytes of main data both ends read before the sites (the fixed struct).
    pub fn main_fixed(rmid: u8, info: u8) -> usize {
        if rmid != RM_HEAP_ID {
            return 0;
        }
        match info & XLOG_HEAP_OPMASK {
            XLOG_HEAP_INSERT => SIZE_INSERT,
            XLOG_HEAP_DELETE => SIZE_DELETE,
            XLOG_HEAP_UPDATE | XLOG_HEAP_HOT_UPDATE => SIZE_UPDATE,
            _ => 0,
        }
    }

    /// The TIDs the record writes and reads tuples at: the new tuple's, the old one's.
    pub fn tids(&self) -> [Option<Tid>; 2] {
        [self.new, self.old]
    }

    fn is_update(&self) -> bool {
        matches!(self.op, XLOG_HEAP_UPDATE | XLOG_HEAP_HOT_UPDATE)
    }

    /// An update whose new tuple PostgreSQL cut against the old one.
    fn is_cut(&self) -> bool {
        self.is_update()
            && self.flags & (XLH_UPDATE_PREFIX_FROM_OLD | XLH_UPDATE_SUFFIX_FROM_OLD) != 0
    }

    /// The site in block 0's data of `data_len` bytes, if any.
    pub fn block0_site(&self, data_len: usize) -> Option<Site> {
        let ok = match self.op {
            XLOG_HEAP_INSERT => true,
            _ if self.is_update() => !self.is_cut(),
            _ => false,
        };
        (ok && data_len > SIZE_HEAP_HEADER + MIN_SAVING).then_some(Site {
            place: Place::Block0,
            skip: SIZE_HEAP_HEADER,
            old: self.old,
            new: self.new,
        })
    }

    /// The site in main data of `main_len` bytes (the old tuple or key of wal_level=logical).
    pub fn main_site(&self, main_len: usize) -> Option<Site> {
        let skip = match self.op {
            _ if self.is_update() && self.flags & XLH_UPDATE_CONTAINS_OLD != 0 => SIZE_UPDATE,
            XLOG_HEAP_DELETE if self.flags & XLH_DELETE_CONTAINS_OLD != 0 => SIZE_DELETE,
            _ => return None,
        } + SIZE_HEAP_HEADER;
        (main_len > skip + MIN_SAVING).then_some(Site {
            place: Place::Main,
            skip,
            old: self.old,
            new: None,
        })
    }

    /// After the whole record (`block0` = block 0's data, restored): what it wrote into the
    /// tuple cache, unless it is an INSERT into a relation that only gets inserts
    /// ([`inserts`]). An update whose new tuple PostgreSQL cut against the old one goes in as
    /// `expanded` (its tuple from t_bits on, [`HeapRec::expand_cut`]); without it the TID is
    /// forgotten.
    pub fn feed(
        &self,
        block0: Option<&[u8]>,
        xid: u32,
        tuples: &mut TupleCache,
        expanded: Option<&[u8]>,
    ) {
        if self.op == XLOG_HEAP_INSERT {
            if self.new.is_some_and(|n| !tuples.inserts.insert(&n.block)) {
                return;
            }
        } else if let Some(old) = self.old {
            tuples.inserts.touched(&old.block);
        }
        let Some(new) = self.new else {
            if let Some(old) = self.old {
                tuples.remove(&old);
            }
            return;
        };
        let Some(d) = block0 else {
            // The tuple is in an image of the page: candidate 2/3 find it there.
            tuples.remove(&new);
            return;
        };
        let Some(logged) = self.logged(d) else {
            tuples.remove(&new);
            return;
        };
        let hdr = logged.hdr;
        let head = Head {
            xmin: xid,
            infomask2: u16::from_le_bytes([hdr[0], hdr[1]]),
            infomask: u16::from_le_bytes([hdr[2], hdr[3]]),
            hoff: hdr[4],
        };
        match expanded {
            _ if logged.prefix == 0 && logged.suffix == 0 => tuples.put(new, head, logged.body),
            Some(t) => tuples.put(new, head, t),
            None => tuples.remove(&new),
        }
    }

    /// The new tuple as block 0's data `d` carries it, with PostgreSQL's prefix and suffix
    /// lengths when this is an update that has them.
    fn logged<'d>(&self, d: &'d [u8]) -> Option<LoggedTuple<'d>> {
        let update = self.is_update();
        LoggedTuple::parse(
            d,
            update && self.flags & XLH_UPDATE_PREFIX_FROM_OLD != 0,
            update && self.flags & XLH_UPDATE_SUFFIX_FROM_OLD != 0,
        )
    }

    /// For an UPDATE whose new tuple PostgreSQL cut against the old one (a prefix or suffix
    /// from the old version): the user data (from t_hoff on) of the newest known version of
    /// the old tuple, which the prefix and suffix refer to (tuple cache, else cached page).
    /// Each end looks it up once per record, after the record's images and before its data
    /// is written ([`HeapRec::changed_bytes`], [`HeapRec::expand_cut`]).
    pub fn cut_old<'a>(
        &self,
        tuples: &'a TupleCache,
        pages: &'a dyn PageLookup,
    ) -> Option<&'a [u8]> {
        if !self.is_cut() {
            return None;
        }
        let (ohoff, odata) = lookup(tuples, pages, self.old.as_ref()?)?;
        odata.get(usize::from(ohoff).checked_sub(TUPLE_HEADER)?..)
    }

    /// A cut update's new tuple from t_bits on (block 0's data `d`, restored), its prefix and
    /// suffix taken from `old_user` ([`HeapRec::cut_old`]), appended to `out`; false when
    /// the lengths do not fit.
    pub fn expand_cut(&self, d: &[u8], old_user: &[u8], out: &mut Vec<u8>) -> bool {
        self.logged(d)
            .is_some_and(|logged| logged.expand_onto(old_user, out))
    }

    /// For a cut UPDATE (format 14) with the old tuple's user data `old_user`
    /// ([`HeapRec::cut_old`]): where in block 0's data `d` the changed bytes start, and where
    /// the old tuple's bytes at the same place are in `old_user`, when the old tuple has the
    /// new one's length and the changed bytes are at most [`CHANGED_MAX`]. The changed bytes
    /// then go as their difference from the old ones ([`changed_diff`]): a counter's or
    /// balance's increment instead of its value. None for a record with any image (the
    /// encoder has stored them by the time it writes block data, the decoder restores them
    /// after: they could evict or replace the page on one end only).
    pub fn changed_bytes(
        &self,
        d: &[u8],
        blocks: &[BlockRef],
        old_user: &[u8],
    ) -> Option<(usize, std::ops::Range<usize>)> {
        if !self.is_cut() || blocks.iter().any(|b| b.image.is_some()) {
            return None;
        }
        let logged = self.logged(d)?;
        let bitmap = usize::from(logged.hdr[4]).checked_sub(TUPLE_HEADER)?;
        let m = logged.body.len().checked_sub(bitmap)?;
        if m == 0 || m > CHANGED_MAX || old_user.len() != logged.prefix + m + logged.suffix {
            return None;
        }
        Some((d.len() - m, logged.prefix..logged.prefix + m))
    }
}

/// Most changed bytes of a cut update sent as a difference ([`HeapRec::changed_bytes`]).
pub const CHANGED_MAX: usize = 8;

/// `bytes` (little-endian, at most 8) minus `old` (encoder) or plus it (decoder), wrapping in
/// their width: where only a number changed, its increment, whatever bytes it spans.
pub fn changed_diff(bytes: &mut [u8], old: &[u8], forward: bool) {
    let mut a = [0u8; 8];
    let mut b = [0u8; 8];
    let n = bytes.len().min(old.len()).min(8);
    a[..n].copy_from_slice(&bytes[..n]);
    b[..n].copy_from_slice(&old[..n]);
    let (x, y) = (u64::from_le_bytes(a), u64::from_le_bytes(b));
    let v = if forward {
        x.wrapping_sub(y)
    } else {
        x.wrapping_add(y)
    };
    bytes[..n].copy_from_slice(&v.to_le_bytes()[..n]);
}

/// The newest known version of `tid`: the tuple cache, else the cached page of its block.
fn lookup<'a>(
    tuples: &'a TupleCache,
    pages: &'a dyn PageLookup,
    tid: &Tid,
) -> Option<(u8, &'a [u8])> {
    tuples.get_full(tid).or_else(|| in_cached_page(pages, tid))
}

/// The tuple at `tid` in the cached page image of its block: (t_hoff, bytes from t_bits on).
fn in_cached_page<'a>(pages: &'a dyn PageLookup, tid: &Tid) -> Option<(u8, &'a [u8])> {
    tuple_in_page(pages.page_of(&tid.block)?, tid.off)
}

/// Candidate `c` (1..=3) of `site`.
pub fn candidate<'a>(
    c: u8,
    site: &Site,
    tuples: &'a TupleCache,
    pages: &'a dyn PageLookup,
) -> Option<&'a [u8]> {
    match c {
        1 => tuples.get(site.old.as_ref()?),
        2 => Some(in_cached_page(pages, site.old.as_ref()?)?.1),
        3 => Some(in_cached_page(pages, site.new.as_ref()?)?.1),
        _ => None,
    }
}

pub const CANDIDATES: u8 = 3;

/// Shared prefix and (non-overlapping) suffix of `t` and `r`.
pub fn prefix_suffix(t: &[u8], r: &[u8]) -> (usize, usize) {
    let p = t.iter().zip(r).take_while(|(a, b)| a == b).count();
    let s = t[p..]
        .iter()
        .rev()
        .zip(r[p..].iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    (p, s)
}

/// The encoder's choice for `tuple` at `site`: `(candidate, prefix, suffix)` saving the most,
/// if it saves at least [`MIN_SAVING`] bytes.
pub fn choose(
    tuple: &[u8],
    site: &Site,
    tuples: &TupleCache,
    pages: &dyn PageLookup,
) -> Option<(u8, usize, usize)> {
    let mut best: Option<(u8, usize, usize)> = None;
    for c in 1..=CANDIDATES {
        if let Some(r) = candidate(c, site, tuples, pages) {
            let (p, s) = prefix_suffix(tuple, r);
            if best.is_none_or(|(_, bp, bs)| p + s > bp + bs) {
                best = Some((c, p, s));
            }
        }
    }
    best.filter(|&(_, p, s)| p + s >= MIN_SAVING)
}

#[cfg(test)]
mod tests;
