//! Which relations' inserted tuples are worth caching (walcodec format 6).
//!
//! A heap INSERT's tuple is cached for a later UPDATE or DELETE of it (candidate 1 of that
//! record's site) and for a later image of its page ([`page_prefix`](super::page_prefix)). A
//! relation that only receives inserts — a bulk load, an append-only table such as
//! `pgbench_history` — uses neither, and caching its rows was 40 % of the encoder's time on a
//! bulk load (a hash-map insert into a cache of a million rows, an allocation and a later
//! eviction per row, on both ends).
//!
//! Both ends therefore count, per relation (tablespace, database, relfilenode), the INSERT
//! records since the relation's last UPDATE or DELETE record. Past [`COLD_AFTER`], an INSERT
//! into it leaves the tuple cache alone — its tuple is not cached, and an older tuple cached at
//! the same TID (a line pointer reused after VACUUM) stays: a stale reference costs bytes,
//! never correctness, since both ends hold the same — until the relation's next UPDATE or
//! DELETE sets the count back to 0. A TRUNCATE gives the table a new relfilenode, which counts
//! afresh. At most [`MAX_RELS`] relations are counted; the counts are dropped all at once when
//! one more would exceed that. Everything follows from the record's heap fields, which both
//! ends parse before the record's tuples, in record order; the counts start empty with the
//! tuple cache (a new session, a restored one, a cleared one).

use std::collections::HashMap;

use super::super::wal::BlockKey;
use super::FxBuild;

/// INSERT records without an UPDATE or DELETE in between after which a relation's inserted
/// tuples are no longer cached. 64 Ki rows: a bulk load of a few megabytes still caches its
/// first rows, in case it is followed by updates, and then stops.
pub const COLD_AFTER: u32 = 1 << 16;
/// Relations counted at most.
pub const MAX_RELS: usize = 4096;

type RelKey = (u32, u32, u32);

fn rel_of(b: &BlockKey) -> RelKey {
    (b.spc, b.db, b.rel)
}

/// INSERT records per relation since its last UPDATE or DELETE, identical on both ends.
#[derive(Default)]
pub struct InsertCounts {
    counts: HashMap<RelKey, u32, FxBuild>,
}

impl InsertCounts {
    /// An INSERT record into the relation of `block`: whether its tuple is to be cached.
    pub fn insert(&mut self, block: &BlockKey) -> bool {
        let k = rel_of(block);
        if self.counts.len() >= MAX_RELS && !self.counts.contains_key(&k) {
            self.counts.clear();
        }
        let n = self.counts.entry(k).or_insert(0);
        *n = n.saturating_add(1);
        *n <= COLD_AFTER
    }

    /// An UPDATE or DELETE record of a tuple in the relation of `block`.
    pub fn touched(&mut self, block: &BlockKey) {
        if let Some(n) = self.counts.get_mut(&rel_of(block)) {
            *n = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(rel: u32) -> BlockKey {
        BlockKey {
            spc: 1663,
            db: 5,
            rel,
            fork: 0,
            blkno: rel * 7,
        }
    }

    #[test]
    fn a_relation_goes_cold_after_its_inserts_and_warm_on_an_update() {
        let mut c = InsertCounts::default();
        for _ in 0..COLD_AFTER {
            assert!(c.insert(&block(1)));
        }
        assert!(
            !c.insert(&block(1)),
            "insert number COLD_AFTER + 1 is not cached"
        );
        assert!(c.insert(&block(2)), "another relation counts on its own");
        c.touched(&block(2));
        assert!(!c.insert(&block(1)), "an update elsewhere changes nothing");
        c.touched(&block(1));
        assert!(c.insert(&block(1)), "an update of the relation warms it");
    }

    #[test]
    fn counts_are_bounded_and_restart_when_full() {
        let mut c = InsertCounts::default();
        for _ in 0..=COLD_AFTER {
            c.insert(&block(0));
        }
        assert!(!c.insert(&block(0)));
        for r in 1..MAX_RELS as u32 {
            c.insert(&block(r));
        }
        assert_eq!(c.counts.len(), MAX_RELS);
        assert!(
            !c.insert(&block(0)),
            "a counted relation does not empty the table"
        );
        assert!(
            c.insert(&block(MAX_RELS as u32)),
            "a new one does, and counts from 1"
        );
        assert_eq!(c.counts.len(), 1);
        assert!(c.insert(&block(0)), "relation 0 counts afresh");
    }
}
