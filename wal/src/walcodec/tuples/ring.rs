//! The tuple cache's storage (walcodec format 10): every tuple put is a record appended to
//! one ring of bytes, found through an index of TIDs; both ends hold the same ring.
//!
//! ```text
//! ring   = record record ...                     -- `cap` bytes (rounded down to 8), in
//!                                                   the order the tuples were put
//! record = spc:u32 db:u32 rel:u32 blkno:u32 off:u16 fork:u8            -- the TID (19 bytes)
//!          hoff:u8 len:u16 infomask2:u16 infomask:u16 xmin:u32 0:u16      -- 32 bytes in all
//!          data[len] 0...                        -- to a multiple of 8, 64 bytes at least
//! ```
//!
//! Numbers little-endian. A record never wraps: when it does not fit before the ring's end,
//! the older lap ends there and the record goes to the start. Room for a record is made by
//! dropping the oldest records; a record is *live* while the index points at it, and dead
//! once its TID was put again (the newer record is live) or removed, until the oldest end of
//! the ring passes over it. So the cache holds the newest tuple per TID among the records of
//! the last `cap` bytes put, and both ends, fed the same calls, drop the same ones.
//!
//! Memory: the ring (at most `cap`, touched as it fills), the index (8 bytes a slot, at most
//! half of the slots used, so at most 32 bytes per live tuple and at most `cap / 2` in all:
//! a record takes 64 bytes at least; it doubles when over half full and shrinks to a quarter
//! full when under an eighth, so it follows the live tuples down too) and a filter of the
//! blocks that have live tuples (4 bytes per 8 slots). Format 9 kept one allocation per
//! tuple in a hash map, an order queue with stale entries, and accounted 64 bytes per tuple:
//! a 128 MiB cache of 100-byte tuples held about 270 MB.
//!
//! The index is open addressing with linear probing and backward-shift deletion (no
//! tombstones): a slot is 0 (empty) or `tag << 32 | (offset / 8 + 1)`, `tag` the high 32 bits
//! of the TID's hash, which also choose the slot. A lookup compares tags first and reads the
//! ring only for an equal tag.

use super::inserts::InsertCounts;
use super::{Head, Tid};
use crate::walcodec::blockmap::{block_hash, delete_at, home_in, mix, K};
use crate::walcodec::prefetch::prefetch;
use crate::walcodec::wal::{BlockKey, PAGE_SIZE};

/// Bytes of a record's header, and of the TID that opens it.
const HEADER: usize = 32;
const KEY: usize = 19;

/// A TID as a record's first bytes.
type Key = [u8; KEY];
/// The least a record takes in the ring (bounds the number of live tuples by `cap / 64`).
const MIN_RECORD: usize = 64;
/// The index's first size, in slots.
const MIN_SLOTS: usize = 1024;
/// The largest ring (record offsets / 8 fit in an index slot's 32 bits).
const MAX_SIZE: usize = 1 << 34;
/// How many records ahead of the oldest the index slots and block counts of the records
/// dropped next are asked for ([`TupleCache::ask_for_drops`]).
const DROP_AHEAD: usize = 8;

/// Bounded cache of the newest tuple per TID; identical on both ends when fed the same calls.
pub struct TupleCache {
    /// The ring's size: the capacity asked for, rounded down to 8.
    size: usize,
    /// The ring's bytes; grows to `size` on the first lap, then is written over.
    ring: Vec<u8>,
    /// Where the next record goes.
    head: usize,
    /// The oldest record (when `records > 0`).
    tail: usize,
    /// Where the older lap's records end, while the ring has wrapped (`head <= tail`).
    lap_end: usize,
    wrapped: bool,
    /// Records in the ring, live or dead.
    records: usize,
    /// The record `asked` records after the oldest (the oldest itself when `asked` is 0):
    /// the next whose index slot and block count [`TupleCache::ask_for_drops`] asks for.
    ask_at: usize,
    asked: usize,
    /// Live tuples (index entries).
    live: usize,
    slots: Vec<u64>,
    /// Live tuples per block hash bucket: 0 says no tuple of a block of that bucket is cached.
    blocks: Vec<u32>,
    /// Which relations' inserts are cached ([`super::inserts`]).
    pub(super) inserts: InsertCounts,
}

impl TupleCache {
    pub fn new(cap_bytes: usize) -> TupleCache {
        TupleCache {
            size: cap_bytes.min(MAX_SIZE) / 8 * 8,
            ring: Vec::new(),
            head: 0,
            tail: 0,
            lap_end: 0,
            wrapped: false,
            records: 0,
            ask_at: 0,
            asked: 0,
            live: 0,
            slots: vec![0; MIN_SLOTS],
            blocks: vec![0; MIN_SLOTS / 8],
            inserts: InsertCounts::default(),
        }
    }

    /// Capacity for a block cache of `block_cache_bytes`.
    pub fn bytes_for(block_cache_bytes: usize) -> usize {
        block_cache_bytes / 8
    }

    pub fn clear(&mut self) {
        *self = TupleCache::new(self.size);
    }

    /// Memory the cache holds: the ring as far as it was filled, the index and the filter.
    pub fn bytes(&self) -> usize {
        self.ring.len() + 8 * self.slots.len() + 4 * self.blocks.len()
    }

    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Live entries, oldest first: putting them in this order into an empty cache of the
    /// same capacity gives the same tuples (for `persist`).
    pub fn entries(&self) -> impl Iterator<Item = (Tid, Head, &[u8])> + '_ {
        let mut at = self.tail;
        let mut left = self.records;
        let mut wrapped = self.wrapped;
        std::iter::from_fn(move || loop {
            if left == 0 {
                return None;
            }
            if wrapped && at == self.lap_end {
                (at, wrapped) = (0, false);
            }
            let (tid, head, data) = self.record(at);
            let here = at;
            at += record_size(data.len());
            left -= 1;
            if self.live_slot(&tid, here).is_some() {
                return Some((tid, head, data));
            }
        })
    }

    pub fn get(&self, tid: &Tid) -> Option<&[u8]> {
        self.get_full(tid).map(|(_, d)| d)
    }

    pub(super) fn get_full(&self, tid: &Tid) -> Option<(u8, &[u8])> {
        self.get_with_head(tid).map(|(h, d)| (h.hoff, d))
    }

    pub(super) fn get_with_head(&self, tid: &Tid) -> Option<(Head, &[u8])> {
        let (_, pos) = self.find(tid)?;
        let (_, head, data) = self.record(pos);
        Some((head, data))
    }

    /// False when no tuple of `block` is cached (true may be a block sharing its bucket).
    pub(super) fn may_hold(&self, block: &BlockKey) -> bool {
        self.blocks[self.block_bucket(block)] > 0
    }

    pub fn remove(&mut self, tid: &Tid) {
        if let Some((slot, _)) = self.find(tid) {
            self.unindex(slot, &tid.block);
        }
    }

    /// Stores the tuple at `tid`, replacing an older one; drops the oldest records to make room.
    pub fn put(&mut self, tid: Tid, head: Head, data: &[u8]) {
        let need = record_size(data.len());
        if need > self.size / 4 || data.len() > PAGE_SIZE {
            self.remove(&tid);
            return;
        }
        let pos = self.make_room(need);
        let key = key_of(&tid);
        self.write_record(pos, &key, &head, data);
        self.records += 1;
        let h = hash(&tid);
        match self.probe(&key, h) {
            Ok(slot) => self.slots[slot] = entry(h, pos),
            Err(empty) => {
                self.live += 1;
                if 2 * self.live > self.slots.len() {
                    // (The new tables are built from the slots, which do not hold it yet.)
                    self.grow();
                    insert_slot(&mut self.slots, entry(h, pos));
                } else {
                    self.slots[empty] = entry(h, pos);
                }
                let b = self.block_bucket(&tid.block);
                self.blocks[b] += 1;
            }
        }
    }

    /// Where a record of `need` bytes goes (at most a quarter of the ring): room made there.
    fn make_room(&mut self, need: usize) -> usize {
        loop {
            if !self.wrapped {
                if self.size - self.head >= need {
                    break;
                }
                if self.records == 0 {
                    (self.head, self.tail) = (0, 0);
                } else {
                    (self.lap_end, self.head, self.wrapped) = (self.head, 0, true);
                }
            } else if self.tail - self.head >= need {
                break;
            } else {
                self.drop_oldest();
            }
        }
        let pos = self.head;
        self.head += need;
        pos
    }

    /// Drops the oldest record (the ring has wrapped, so there is one).
    fn drop_oldest(&mut self) {
        let (tid, _, data) = self.record(self.tail);
        let len = data.len();
        if let Some(slot) = self.live_slot(&tid, self.tail) {
            self.unindex(slot, &tid.block);
        }
        self.tail += record_size(len);
        self.records -= 1;
        if self.tail == self.lap_end {
            (self.tail, self.wrapped) = (0, false);
        }
        self.ask_for_drops();
    }

    /// Asks for the memory the next [`DROP_AHEAD`] drops will read at random: each record's
    /// index slot (the probe's start) and its block's live count. Dropping reads them one
    /// record after another, a miss each in a large cache; asked for ahead, the misses
    /// overlap. Hints only: what is dropped, and every byte either end holds, is the same.
    fn ask_for_drops(&mut self) {
        if self.asked == 0 {
            self.ask_at = self.tail;
        } else {
            self.asked -= 1;
        }
        while self.asked < DROP_AHEAD && self.asked < self.records {
            if self.wrapped && self.ask_at == self.lap_end {
                self.ask_at = 0;
            }
            let Some((tid, len)) = self.peek(self.ask_at) else {
                // (Not a record start: a bug, but a hint never fails; start again later.)
                self.asked = 0;
                return;
            };
            let bh = block_hash(&tid.block);
            let h = tid_hash(bh, tid.off);
            prefetch(std::ptr::from_ref(&self.slots[self.home(h)]) as usize);
            prefetch(std::ptr::from_ref(&self.blocks[self.bucket(bh)]) as usize);
            self.ask_at += record_size(len);
            self.asked += 1;
        }
    }

    /// The TID and data length of the record at `pos`, if it lies in the ring.
    fn peek(&self, pos: usize) -> Option<(Tid, usize)> {
        let h = self.ring.get(pos..pos.checked_add(HEADER)?)?;
        let len = usize::from(u16::from_le_bytes([h[20], h[21]]));
        self.ring.get(pos + HEADER..pos + HEADER + len)?;
        let (tid, _, data) = self.record(pos);
        Some((tid, data.len()))
    }

    fn write_record(&mut self, pos: usize, key: &Key, head: &Head, data: &[u8]) {
        let mut h = [0u8; HEADER];
        h[..KEY].copy_from_slice(key);
        h[19] = head.hoff;
        h[20..22].copy_from_slice(&(data.len() as u16).to_le_bytes());
        h[22..24].copy_from_slice(&head.infomask2.to_le_bytes());
        h[24..26].copy_from_slice(&head.infomask.to_le_bytes());
        h[26..30].copy_from_slice(&head.xmin.to_le_bytes());
        let end = pos + record_size(data.len());
        if self.ring.len() < end {
            // The first lap: the ring's memory is taken once (and touched as it fills).
            self.ring.reserve_exact(self.size - self.ring.len());
            self.ring.resize(end, 0);
        }
        let r = &mut self.ring[pos..end];
        r[..HEADER].copy_from_slice(&h);
        r[HEADER..HEADER + data.len()].copy_from_slice(data);
    }

    /// The record at `pos` (written by `write_record`).
    fn record(&self, pos: usize) -> (Tid, Head, &[u8]) {
        let h = &self.ring[pos..pos + HEADER];
        let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let u16_at = |i: usize| u16::from_le_bytes([h[i], h[i + 1]]);
        let tid = Tid {
            block: BlockKey {
                spc: u32_at(0),
                db: u32_at(4),
                rel: u32_at(8),
                fork: h[18],
                blkno: u32_at(12),
            },
            off: u16_at(16),
        };
        let head = Head {
            xmin: u32_at(26),
            infomask2: u16_at(22),
            infomask: u16_at(24),
            hoff: h[19],
        };
        let len = usize::from(u16_at(20));
        (tid, head, &self.ring[pos + HEADER..pos + HEADER + len])
    }

    /// The index slot of `tid` and its record's position.
    fn find(&self, tid: &Tid) -> Option<(usize, usize)> {
        let slot = self.probe(&key_of(tid), hash(tid)).ok()?;
        Some((slot, position(self.slots[slot])))
    }

    /// The index slot of the record of `tid` at `pos`, when that record is live (the index
    /// points at it rather than at a newer one).
    ///
    /// The index holds at most one entry per record position, so the entry to look for is
    /// known whole (tag and position): the probe compares slots only and never reads the
    /// ring, where a dead record's TID points at its newer record, a miss each.
    fn live_slot(&self, tid: &Tid, pos: usize) -> Option<usize> {
        let want = entry(hash(tid), pos);
        let mask = self.slots.len() - 1;
        let mut i = self.home(want);
        loop {
            match self.slots[i] {
                0 => return None,
                s if s == want => return Some(i),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Where the index slot a lookup of `tid` starts at is (0: no index yet), for `ahead`.
    pub(crate) fn slot_addr(&self, tid: &Tid) -> usize {
        self.slots
            .get(self.home(hash(tid)))
            .map_or(0, |s| std::ptr::from_ref(s) as usize)
    }

    /// Where the ring record the index slot of `tid` points at is, when the slot's tag is
    /// `tid`'s (0: none), for `ahead`.
    pub(crate) fn record_addr(&self, tid: &Tid) -> usize {
        let h = hash(tid);
        match self.slots.get(self.home(h)) {
            Some(&s) if s != 0 && s >> 32 == h >> 32 => self
                .ring
                .get(position(s))
                .map_or(0, |r| std::ptr::from_ref(r) as usize),
            _ => 0,
        }
    }

    /// The index slot where the probe of hash `h` starts (an entry's own home: `h` = the
    /// entry, whose high 32 bits are its tag).
    fn home(&self, h: u64) -> usize {
        home_in(self.slots.len(), h)
    }

    /// The slot of the TID `key` (hash `h`), or the empty slot that ends its probe.
    fn probe(&self, key: &Key, h: u64) -> Result<usize, usize> {
        let tag = h >> 32;
        let mask = self.slots.len() - 1;
        let mut i = self.home(h);
        loop {
            let s = self.slots[i];
            if s == 0 {
                return Err(i);
            }
            if s >> 32 == tag {
                let pos = position(s);
                if self.ring[pos..pos + KEY] == key[..] {
                    return Ok(i);
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// Takes index slot `slot` (a tuple of `block`) out, moving later entries of its run back;
    /// then shrinks the index if it became sparse.
    fn unindex(&mut self, slot: usize, block: &BlockKey) {
        let len = self.slots.len();
        delete_at(&mut self.slots, slot, |&s| s != 0, |&s| home_in(len, s), 0);
        self.live -= 1;
        let b = self.block_bucket(block);
        self.blocks[b] -= 1;
        self.shrink_if_sparse();
    }

    /// Doubles the index and the block filter.
    fn grow(&mut self) {
        self.resize(2 * self.slots.len());
    }

    /// Shrinks the index and the block filter to a quarter full once under an eighth is used
    /// (after a phase of small tuples gave way to larger ones, or many were removed), so that
    /// the index follows the live tuples down as well as up. Which tuples are held does not
    /// change: that is the ring's order.
    fn shrink_if_sparse(&mut self) {
        if self.slots.len() > MIN_SLOTS && 8 * self.live < self.slots.len() {
            self.resize((4 * self.live).next_power_of_two().max(MIN_SLOTS));
        }
    }

    /// Rebuilds the index with `len` slots (a power of two, more than twice the live tuples)
    /// and the block filter with `len / 8` buckets.
    fn resize(&mut self, len: usize) {
        let mut slots = vec![0u64; len];
        let mut blocks = vec![0u32; slots.len() / 8];
        let bmask = blocks.len() - 1;
        for &s in self.slots.iter().filter(|&&s| s != 0) {
            insert_slot(&mut slots, s);
            let block = self.record(position(s)).0.block;
            blocks[block_hash(&block) as usize & bmask] += 1;
        }
        (self.slots, self.blocks) = (slots, blocks);
    }

    fn block_bucket(&self, block: &BlockKey) -> usize {
        self.bucket(block_hash(block))
    }

    /// The filter bucket of the block whose [`block_hash`] is `bh`.
    fn bucket(&self, bh: u64) -> usize {
        bh as usize & (self.blocks.len() - 1)
    }
}

fn key_of(tid: &Tid) -> Key {
    let b = &tid.block;
    let mut k = [0u8; KEY];
    k[0..4].copy_from_slice(&b.spc.to_le_bytes());
    k[4..8].copy_from_slice(&b.db.to_le_bytes());
    k[8..12].copy_from_slice(&b.rel.to_le_bytes());
    k[12..16].copy_from_slice(&b.blkno.to_le_bytes());
    k[16..18].copy_from_slice(&tid.off.to_le_bytes());
    k[18] = b.fork;
    k
}

/// Bytes a record of `len` data bytes takes in the ring.
fn record_size(len: usize) -> usize {
    (HEADER + len).next_multiple_of(8).max(MIN_RECORD)
}

fn entry(hash: u64, pos: usize) -> u64 {
    (hash >> 32) << 32 | (pos / 8 + 1) as u64
}

fn position(slot: u64) -> usize {
    ((slot & 0xffff_ffff) as usize - 1) * 8
}

/// Puts `s` in the first empty slot from its home on (there is one: at most half are used).
fn insert_slot(slots: &mut [u64], s: u64) {
    let mask = slots.len() - 1;
    let mut i = home_in(slots.len(), s);
    while slots[i] != 0 {
        i = (i + 1) & mask;
    }
    slots[i] = s;
}

/// The TID's hash: its high 32 bits choose the index slot and are the slot's tag.
fn hash(tid: &Tid) -> u64 {
    tid_hash(block_hash(&tid.block), tid.off)
}

/// [`hash`] of the TID at offset `off` of the block whose [`block_hash`] is `bh`.
fn tid_hash(bh: u64, off: u16) -> u64 {
    mix(bh, u64::from(off)).wrapping_mul(K)
}

#[cfg(test)]
mod tests;
