//! The block caches' index: which slot holds the page of each cached block, on both ends.
//!
//! Open addressing with linear probing and backward-shift deletion (no tombstones), at most
//! half full (it doubles past that; the caches never hold more blocks than their slots, so
//! it never needs to shrink). An entry holds its key whole, so a lookup reads the line of its
//! home entry and seldom another; a std `HashMap` reads its control bytes and then the
//! bucket they point at, two misses one after the other in a cache of a gigabyte, and
//! neither can be asked for before the lookup. [`BlockMap::home_addr`] says where a
//! lookup starts, so that [`super::ahead`] can ask for the lines of many lookups before it
//! makes them. Which slot a block is in is the caches' business, not the map's: the same
//! calls give the same answers whatever the map's layout, so it is free to change.

use super::wal::BlockKey;

/// One entry: a block and its slot ([`EMPTY`]'s slot marks a free entry). 24 bytes.
#[derive(Clone, Copy)]
struct Entry {
    key: BlockKey,
    slot: u32,
}

const FREE: u32 = u32::MAX;
const EMPTY: Entry = Entry {
    key: BlockKey {
        spc: 0,
        db: 0,
        rel: 0,
        fork: 0,
        blkno: 0,
    },
    slot: FREE,
};
/// The table's first size, in entries.
const MIN_ENTRIES: usize = 1024;

/// Block key → slot number (slot numbers below `u32::MAX`).
pub(super) struct BlockMap {
    entries: Vec<Entry>,
    len: usize,
}

impl Default for BlockMap {
    fn default() -> BlockMap {
        BlockMap {
            entries: vec![EMPTY; MIN_ENTRIES],
            len: 0,
        }
    }
}

impl BlockMap {
    pub(super) fn clear(&mut self) {
        *self = BlockMap::default();
    }

    pub(super) fn get(&self, key: &BlockKey) -> Option<u32> {
        self.find(key).ok().map(|i| self.entries[i].slot)
    }

    /// Maps `key` to `slot` (below `u32::MAX`); returns the slot it was mapped to before.
    pub(super) fn insert(&mut self, key: BlockKey, slot: u32) -> Option<u32> {
        debug_assert_ne!(slot, FREE);
        match self.find(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.entries[i].slot, slot)),
            Err(free) => {
                self.len += 1;
                let i = if 2 * self.len > self.entries.len() {
                    self.grow();
                    self.free_from(&key)
                } else {
                    free
                };
                self.entries[i] = Entry { key, slot };
                None
            }
        }
    }

    /// Takes `key` out; returns its slot.
    pub(super) fn remove(&mut self, key: &BlockKey) -> Option<u32> {
        let at = self.find(key).ok()?;
        let slot = self.entries[at].slot;
        let len = self.entries.len();
        let home = |e: &Entry| home_in(len, block_hash(&e.key));
        delete_at(&mut self.entries, at, |e| e.slot != FREE, home, EMPTY);
        self.len -= 1;
        Some(slot)
    }

    /// Where the entry a lookup of `key` starts at is, to be asked for ahead of the lookup.
    pub(super) fn home_addr(&self, key: &BlockKey) -> usize {
        std::ptr::from_ref(&self.entries[self.home(key)]) as usize
    }

    fn home(&self, key: &BlockKey) -> usize {
        home_in(self.entries.len(), block_hash(key))
    }

    /// The entry of `key`, or the free entry that ends its probe.
    fn find(&self, key: &BlockKey) -> Result<usize, usize> {
        let mask = self.entries.len() - 1;
        let mut i = self.home(key);
        loop {
            let e = &self.entries[i];
            if e.slot == FREE {
                return Err(i);
            }
            if e.key == *key {
                return Ok(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// The first free entry from `key`'s home on (there is one: at most half are used).
    fn free_from(&self, key: &BlockKey) -> usize {
        let mask = self.entries.len() - 1;
        let mut i = self.home(key);
        while self.entries[i].slot != FREE {
            i = (i + 1) & mask;
        }
        i
    }

    fn grow(&mut self) {
        let bigger = vec![EMPTY; 2 * self.entries.len()];
        let old = std::mem::replace(&mut self.entries, bigger);
        for e in old.into_iter().filter(|e| e.slot != FREE) {
            let i = self.free_from(&e.key);
            self.entries[i] = e;
        }
    }
}

/// The home entry of hash `h` in a table of `len` entries (a power of two): the hash's high
/// 32 bits, the well-mixed ones (the tuple ring's index also keeps them as an entry's tag).
pub(super) fn home_in(len: usize, h: u64) -> usize {
    (h >> 32) as usize & len.wrapping_sub(1)
}

/// Backward-shift deletion from a table of linear probing whose length is a power of two
/// (this map's, the tuple ring's index): empties the entry at `at` and moves each later
/// entry of its run back into the hole unless its `home` lies between the hole and it, so
/// that every probe still reaches its entry without tombstones.
pub(super) fn delete_at<T: Copy>(
    table: &mut [T],
    at: usize,
    used: impl Fn(&T) -> bool,
    home: impl Fn(&T) -> usize,
    free: T,
) {
    let mask = table.len() - 1;
    let (mut hole, mut j) = (at, at);
    loop {
        j = (j + 1) & mask;
        let e = table[j];
        if !used(&e) {
            break;
        }
        let h = home(&e);
        // The entry at j may move to the hole unless its home lies in (hole, j].
        let stays = if hole <= j {
            hole < h && h <= j
        } else {
            hole < h || h <= j
        };
        if !stays {
            table[hole] = e;
            hole = j;
        }
    }
    table[hole] = free;
}

/// The hashes' multiplier (2^64 / the golden ratio).
pub(super) const K: u64 = 0x9e37_79b9_7f4a_7c15;

/// One step of the index tables' hashes (the tuple ring's TID hash goes on from
/// [`block_hash`] with it).
pub(super) fn mix(h: u64, v: u64) -> u64 {
    (h ^ v).wrapping_mul(K).rotate_left(29)
}

/// A block's hash; its high 32 bits are well mixed (the index tables use those).
pub(super) fn block_hash(b: &BlockKey) -> u64 {
    let h = mix(
        u64::from(b.spc) << 32 | u64::from(b.db),
        u64::from(b.rel) << 8 | u64::from(b.fork),
    );
    mix(h, u64::from(b.blkno)).wrapping_mul(K)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;
    use crate::walcodec::testgen::block_key as key;

    #[test]
    fn it_grows_past_half_full_and_finds_every_block() {
        let mut m = BlockMap::default();
        for b in 0..5000 {
            assert_eq!(m.insert(key(1, b), b), None);
        }
        assert_eq!(m.entries.len(), 16384);
        assert_eq!(m.insert(key(1, 7), 70), Some(7));
        for b in 0..5000 {
            assert_eq!(m.get(&key(1, b)), Some(if b == 7 { 70 } else { b }));
        }
        assert_eq!(m.get(&key(2, 7)), None);
        for b in (0..5000).step_by(2) {
            assert!(m.remove(&key(1, b)).is_some());
        }
        assert_eq!(m.len, 2500);
        for b in 0..5000 {
            assert_eq!(m.get(&key(1, b)).is_some(), b % 2 == 1, "{b}");
        }
        let home = m.home_addr(&key(1, 3));
        let table = m.entries.as_ptr() as usize;
        assert!((table..table + 24 * m.entries.len()).contains(&home));
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u32, u32),
        Remove(u32),
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(100))]

        /// Whatever the calls (few relations and blocks, so that probes collide and
        /// deletions shift runs), the map answers as a std `HashMap` does.
        #[test]
        fn it_answers_as_a_hash_map_does(ops in proptest::collection::vec(
            prop_oneof![
                3 => (0..3000u32, 0..1000u32).prop_map(|(b, s)| Op::Insert(b, s)),
                2 => (0..3000u32).prop_map(Op::Remove),
            ],
            1..4000,
        )) {
            let mut m = BlockMap::default();
            let mut model = HashMap::new();
            for op in &ops {
                match *op {
                    Op::Insert(b, s) => {
                        let k = key(b % 3, b / 3);
                        prop_assert_eq!(m.insert(k, s), model.insert(k, s));
                    }
                    Op::Remove(b) => {
                        let k = key(b % 3, b / 3);
                        prop_assert_eq!(m.remove(&k), model.remove(&k));
                    }
                }
                prop_assert_eq!(m.len, model.len());
            }
            for b in 0..3000 {
                let k = key(b % 3, b / 3);
                prop_assert_eq!(m.get(&k), model.get(&k).copied());
            }
        }
    }
}
