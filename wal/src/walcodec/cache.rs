//! The block cache: the last page image of recently seen blocks, held on both ends.
//!
//! The encoder owns the policy: it maps block keys to slot numbers, evicts least recently used
//! slots and tells the decoder, per image, which slot to use as reference and which slot to
//! store the new page into. The decoder's cache is just an array of slots that obeys; it
//! refuses slot numbers at or beyond its own capacity. Each slot costs [`SLOT_BYTES`] of
//! `block_cache_bytes`.

use std::collections::HashMap;

use super::blockmap::BlockMap;
use super::tuples::FxBuild;
use super::wal::{BlockKey, PAGE_SIZE};

/// Memory accounted per cache slot: the page plus bookkeeping.
pub const SLOT_BYTES: usize = PAGE_SIZE + 64;
/// Upper bound on slots whatever the configuration (2^24 slots = 128 GiB of pages).
pub const MAX_SLOTS: usize = 1 << 24;

pub type Page = Box<[u8; PAGE_SIZE]>;

pub fn new_page() -> Page {
    Box::new([0u8; PAGE_SIZE])
}

/// Slots that `block_cache_bytes` pays for.
pub fn slots_for(bytes: usize) -> usize {
    (bytes / SLOT_BYTES).min(MAX_SLOTS)
}

const NIL: u32 = u32::MAX;

/// (spc, db, rel, fork): the relation fork of a block.
type RelKey = (u32, u32, u32, u8);

fn rel_of(k: &BlockKey) -> RelKey {
    (k.spc, k.db, k.rel, k.fork)
}

/// The encoder's cache: pages, keys, and an LRU list threaded through slot indices.
pub struct EncCache {
    cap: usize,
    pages: Vec<Page>,
    keys: Vec<BlockKey>,
    prev: Vec<u32>,
    next: Vec<u32>,
    /// Most recently used slot.
    head: u32,
    /// Least recently used slot.
    tail: u32,
    map: BlockMap,
    /// The slot most recently stored for each relation fork (a reference for new blocks).
    by_rel: HashMap<RelKey, u32, FxBuild>,
}

/// What the encoder does with one page image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Slot whose page is the reference, if any.
    pub reference: Option<u32>,
    /// Slot to store the page into (`None` with a zero-capacity cache).
    pub store: Option<u32>,
    /// The reference holds the same block (a cache hit).
    pub hit: bool,
}

impl EncCache {
    pub fn new(cap: usize) -> EncCache {
        EncCache {
            cap,
            pages: Vec::new(),
            keys: Vec::new(),
            prev: Vec::new(),
            next: Vec::new(),
            head: NIL,
            tail: NIL,
            map: BlockMap::default(),
            by_rel: HashMap::default(),
        }
    }

    pub fn clear(&mut self) {
        *self = EncCache::new(self.cap);
    }

    pub fn page(&self, slot: u32) -> &[u8; PAGE_SIZE] {
        &self.pages[slot as usize]
    }

    /// Where the block map's lookup of `key` starts, for [`super::ahead`] to ask for.
    pub(crate) fn map_addr(&self, key: &BlockKey) -> usize {
        self.map.home_addr(key)
    }

    /// Where the cached page of `key` is (0: not cached), for [`super::ahead`].
    pub(crate) fn page_addr(&self, key: &BlockKey) -> usize {
        self.map
            .get(key)
            .and_then(|s| self.pages.get(s as usize))
            .map_or(0, |p| p.as_ptr() as usize)
    }

    /// Chooses reference and destination slots for the image of `key`.
    pub fn plan(&mut self, key: &BlockKey) -> Plan {
        if self.cap == 0 {
            return Plan {
                reference: None,
                store: None,
                hit: false,
            };
        }
        if let Some(slot) = self.map.get(key) {
            return Plan {
                reference: Some(slot),
                store: Some(slot),
                hit: true,
            };
        }
        // A new block: the page of the previous block of the relation, else the latest page
        // stored for the relation, is a good reference (same layout, similar tuples; a second
        // reference page measured no better). It must be chosen before a slot is evicted.
        let mut prev = *key;
        prev.blkno = prev.blkno.wrapping_sub(1);
        let reference = self
            .map
            .get(&prev)
            .or_else(|| self.by_rel.get(&rel_of(key)).copied());
        let store = if self.pages.len() < self.cap {
            None
        } else {
            Some(self.tail)
        };
        let store = match store {
            Some(s) => s,
            None => self.pages.len() as u32,
        };
        Plan {
            reference,
            store: Some(store),
            hit: false,
        }
    }

    /// Stores `page` as the image of `key` in `slot` (from [`EncCache::plan`]).
    pub fn store(&mut self, slot: u32, key: &BlockKey, page: &[u8; PAGE_SIZE]) {
        let s = slot as usize;
        if s == self.pages.len() {
            self.pages.push(Box::new(*page));
            self.keys.push(*key);
            self.prev.push(NIL);
            self.next.push(NIL);
        } else {
            self.unlink(slot);
            let old = self.keys[s];
            if old != *key {
                self.map.remove(&old);
                if self.by_rel.get(&rel_of(&old)) == Some(&slot) {
                    self.by_rel.remove(&rel_of(&old));
                }
            }
            self.pages[s].copy_from_slice(page);
            self.keys[s] = *key;
        }
        self.map.insert(*key, slot);
        self.by_rel.insert(rel_of(key), slot);
        self.push_front(slot);
    }

    /// The cached image of `key`, if any (no change to the eviction order).
    pub fn lookup(&self, key: &BlockKey) -> Option<&[u8; PAGE_SIZE]> {
        self.map.get(key).map(|s| &*self.pages[s as usize])
    }

    /// Marks `slot` most recently used without changing it.
    pub fn touch(&mut self, slot: u32) {
        self.unlink(slot);
        self.push_front(slot);
    }

    fn unlink(&mut self, slot: u32) {
        let s = slot as usize;
        let (p, n) = (self.prev[s], self.next[s]);
        if p != NIL {
            self.next[p as usize] = n;
        } else if self.head == slot {
            self.head = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        } else if self.tail == slot {
            self.tail = p;
        }
        self.prev[s] = NIL;
        self.next[s] = NIL;
    }

    fn push_front(&mut self, slot: u32) {
        let s = slot as usize;
        self.prev[s] = NIL;
        self.next[s] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = slot;
        }
        self.head = slot;
        if self.tail == NIL {
            self.tail = slot;
        }
    }

    /// Bytes of pages held.
    pub fn bytes(&self) -> usize {
        self.pages.len() * SLOT_BYTES
    }

    /// (key, page) of every slot, by slot number.
    pub fn slots(&self) -> impl ExactSizeIterator<Item = (&BlockKey, &[u8; PAGE_SIZE])> {
        self.keys.iter().zip(self.pages.iter().map(|p| &**p))
    }

    /// Slot numbers from the most to the least recently used.
    pub fn use_order(&self) -> Vec<u32> {
        let mut v = Vec::with_capacity(self.pages.len());
        let mut s = self.head;
        while s != NIL && v.len() < self.pages.len() {
            v.push(s);
            s = self.next[s as usize];
        }
        v
    }

    /// A cache of `cap` slots holding `slots` (by slot number), used in `order` (most
    /// recent first; every slot exactly once). `None` if they do not fit or disagree.
    pub fn restore(cap: usize, slots: Vec<(BlockKey, Page)>, order: &[u32]) -> Option<EncCache> {
        if slots.len() > cap || order.len() != slots.len() {
            return None;
        }
        let mut c = EncCache::new(cap);
        for (s, (key, page)) in slots.into_iter().enumerate() {
            if c.map.insert(key, s as u32).is_some() {
                return None;
            }
            c.pages.push(page);
            c.keys.push(key);
            c.prev.push(NIL);
            c.next.push(NIL);
        }
        let mut seen = vec![false; c.pages.len()];
        for &s in order.iter().rev() {
            let seen = seen.get_mut(s as usize)?;
            if std::mem::replace(seen, true) {
                return None;
            }
            c.push_front(s);
            let k = c.keys[s as usize];
            c.by_rel.insert(rel_of(&k), s);
        }
        Some(c)
    }
}

/// The decoder's cache: slots filled as the encoder says.
pub struct DecCache {
    cap: usize,
    slots: Vec<Option<Page>>,
    /// Which block each slot holds, mirroring the encoder's map (for tuple references).
    keys: Vec<Option<BlockKey>>,
    map: BlockMap,
}

impl DecCache {
    pub fn new(cap: usize) -> DecCache {
        DecCache {
            cap,
            slots: Vec::new(),
            keys: Vec::new(),
            map: BlockMap::default(),
        }
    }

    pub fn clear(&mut self) {
        self.slots.clear();
        self.keys.clear();
        self.map.clear();
    }

    /// Records that `slot` (just filled by [`DecCache::put`]) holds the image of `key`, as
    /// [`EncCache::store`] does on the other end.
    pub fn set_key(&mut self, slot: usize, key: &BlockKey) {
        if slot >= self.keys.len() {
            self.keys.resize(slot + 1, None);
        }
        if let Some(old) = self.keys[slot].replace(*key) {
            if old != *key {
                self.map.remove(&old);
            }
        }
        // (Slots are below the capacity, at most MAX_SLOTS: they fit in 32 bits.)
        self.map.insert(*key, slot as u32);
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// (key, page) of every slot, by slot number; `None` where a slot holds nothing (the
    /// encoder fills slots in order, so only a decoder that disagrees has gaps).
    pub fn slots(&self) -> impl Iterator<Item = Option<(&BlockKey, &[u8; PAGE_SIZE])>> {
        self.slots.iter().enumerate().map(|(s, p)| {
            let key = self.keys.get(s)?.as_ref()?;
            Some((key, &**p.as_ref()?))
        })
    }

    /// A cache of `cap` slots holding `slots` (by slot number).
    pub fn restore(cap: usize, slots: Vec<(BlockKey, Page)>) -> Option<DecCache> {
        if slots.len() > cap {
            return None;
        }
        let mut c = DecCache::new(cap);
        for (s, (key, page)) in slots.into_iter().enumerate() {
            if c.map.insert(key, s as u32).is_some() {
                return None;
            }
            c.slots.push(Some(page));
            c.keys.push(Some(key));
        }
        Some(c)
    }

    pub fn get(&self, slot: usize) -> Option<&[u8; PAGE_SIZE]> {
        self.slots.get(slot)?.as_deref()
    }

    /// Stores `page` into `slot`; `false` if the slot is beyond the capacity.
    pub fn put(&mut self, slot: usize, page: &[u8; PAGE_SIZE]) -> bool {
        if slot >= self.cap {
            return false;
        }
        if slot >= self.slots.len() {
            self.slots.resize_with(slot + 1, || None);
        }
        match &mut self.slots[slot] {
            Some(p) => p.copy_from_slice(page),
            s @ None => *s = Some(Box::new(*page)),
        }
        true
    }
}

impl super::tuples::PageLookup for EncCache {
    fn page_of(&self, key: &BlockKey) -> Option<&[u8; PAGE_SIZE]> {
        self.lookup(key)
    }
}

impl super::tuples::PageLookup for DecCache {
    fn page_of(&self, key: &BlockKey) -> Option<&[u8; PAGE_SIZE]> {
        self.get(self.map.get(key)? as usize)
    }
}

impl super::redo::PageStore for EncCache {
    fn page_mut(&mut self, key: &BlockKey) -> Option<&mut [u8; PAGE_SIZE]> {
        let s = self.map.get(key)?;
        self.pages.get_mut(s as usize).map(|p| &mut **p)
    }
}

impl super::redo::PageStore for DecCache {
    fn page_mut(&mut self, key: &BlockKey) -> Option<&mut [u8; PAGE_SIZE]> {
        let s = self.map.get(key)? as usize;
        self.slots.get_mut(s)?.as_deref_mut()
    }
}
