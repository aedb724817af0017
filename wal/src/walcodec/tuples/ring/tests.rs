use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

fn tid(blkno: u32, off: u16) -> Tid {
    Tid {
        block: BlockKey {
            spc: 1663,
            db: 5,
            rel: 16384,
            fork: 0,
            blkno,
        },
        off,
    }
}

fn head(n: u32) -> Head {
    Head {
        xmin: n,
        infomask2: n as u16 ^ 0x55,
        infomask: 0x0802,
        hoff: 24,
    }
}

#[test]
fn the_oldest_records_go_first_and_the_ring_holds_its_size() {
    // Records of 100 data bytes take 136 bytes: ten fit in 1,360.
    let mut c = TupleCache::new(1360);
    for i in 0..25u16 {
        c.put(tid(1, i + 1), head(u32::from(i)), &[i as u8; 100]);
        assert!(c.ring.len() <= 1360);
    }
    assert_eq!(c.len(), 10);
    assert!(c.get(&tid(1, 15)).is_none());
    assert_eq!(c.get(&tid(1, 16)), Some(&[15u8; 100][..]));
    assert_eq!(
        c.get_with_head(&tid(1, 25)),
        Some((head(24), &[24u8; 100][..]))
    );
    // A tuple put again is found with its new bytes; its old record is dead, not found.
    c.put(tid(1, 25), head(99), &[7; 50]);
    assert_eq!(
        c.get_with_head(&tid(1, 25)),
        Some((head(99), &[7u8; 50][..]))
    );
    // Its new record made room by dropping the oldest (tid 16); the old one of 25 is dead.
    assert_eq!(c.len(), 9, "one record per TID is live");
    assert!(c.get(&tid(1, 16)).is_none() && c.get(&tid(1, 17)).is_some());
    // Puts of one TID over and over keep one live tuple and a bounded ring.
    for i in 0..10_000u32 {
        c.put(tid(2, 1), head(i), &[1; 10]);
    }
    assert_eq!(c.get(&tid(2, 1)), Some(&[1u8; 10][..]));
    assert_eq!(c.len(), 1, "its own dead records pushed the others out");
    assert!(c.bytes() <= 1360 + 8 * MIN_SLOTS + MIN_SLOTS / 2);
    // Removed tuples are gone; a removed TID's record stays dead when the ring passes it.
    c.remove(&tid(2, 1));
    assert!(c.is_empty() && c.get(&tid(2, 1)).is_none());
    assert!(!c.may_hold(&tid(2, 1).block));
    // Too large for a quarter of the ring: not cached, and an older version is dropped.
    c.put(tid(3, 1), head(1), &[3; 40]);
    c.put(tid(3, 1), head(2), &[3; 400]);
    assert!(c.get(&tid(3, 1)).is_none());
    // A zero-capacity cache holds nothing.
    let mut z = TupleCache::new(0);
    z.put(tid(1, 1), head(1), &[1; 10]);
    assert!(z.is_empty());
}

/// The block filter counts exactly the live tuples of each bucket.
fn assert_filter_counts(c: &TupleCache) {
    let mut want = vec![0u32; c.blocks.len()];
    for (t, _, _) in c.entries() {
        want[c.block_bucket(&t.block)] += 1;
    }
    let wrong = (0..want.len()).find(|&i| c.blocks[i] != want[i]);
    assert!(
        wrong.is_none(),
        "bucket {wrong:?}: counted {:?}, live {:?}",
        wrong.map(|i| c.blocks[i]),
        wrong.map(|i| want[i])
    );
}

#[test]
fn the_index_grows_and_finds_every_live_tuple() {
    let mut c = TupleCache::new(8 << 20);
    let n = 20_000u32;
    for i in 0..n {
        c.put(tid(i / 50, (i % 50) as u16 + 1), head(i), &i.to_le_bytes());
    }
    assert_eq!(c.len(), n as usize);
    assert!(c.slots.len() >= 2 * c.len() && c.slots.len() <= 4 * c.len().max(MIN_SLOTS));
    assert_filter_counts(&c);
    for i in (0..n).step_by(3) {
        c.remove(&tid(i / 50, (i % 50) as u16 + 1));
    }
    for i in 0..n {
        let t = tid(i / 50, (i % 50) as u16 + 1);
        let want = (i % 3 != 0).then(|| i.to_le_bytes());
        assert_eq!(c.get(&t), want.as_ref().map(|w| &w[..]), "tuple {i}");
    }
    assert_eq!(c.entries().count(), c.len());
    assert_filter_counts(&c);
    // Removing every tuple leaves every count at zero (none went below).
    for i in 0..n {
        c.remove(&tid(i / 50, (i % 50) as u16 + 1));
    }
    assert!(c.is_empty() && c.blocks.iter().all(|&b| b == 0));
}

#[test]
fn the_index_shrinks_when_larger_tuples_push_the_small_ones_out() {
    // 100,000 tuples of 4 bytes (64-byte records) in an 8 MiB ring: an index of 256K slots.
    let mut c = TupleCache::new(8 << 20);
    let small = |i: u32| tid(i / 50, (i % 50) as u16 + 1);
    for i in 0..100_000u32 {
        c.put(small(i), head(i), &i.to_le_bytes());
    }
    let grown = c.slots.len();
    assert!(grown >= 200_000, "{grown} slots");
    let index = |c: &TupleCache| c.bytes() - c.ring.len();
    let before = index(&c);
    // Then tuples of 2,000 bytes (2,032-byte records) take the ring over: at most 4,128 fit.
    for i in 0..6_000u32 {
        c.put(
            tid(1_000_000 + i / 3, (i % 3) as u16 + 1),
            head(i),
            &[i as u8; 2000],
        );
    }
    assert!(c.len() <= 4_128 && c.len() > 4_000, "{} live", c.len());
    assert!(
        c.slots.len() <= 4 * c.len().next_power_of_two() && c.slots.len() >= 2 * c.len(),
        "{} slots for {} live tuples",
        c.slots.len(),
        c.len()
    );
    // The index and filter, reported in bytes(), follow them down: 2 MiB + 128 kB to ~300 kB.
    assert!(
        index(&c) < before / 4,
        "{} bytes, {before} before",
        index(&c)
    );
    // Every live tuple is still found, and the filter still counts them.
    assert_eq!(c.entries().count(), c.len());
    for i in 6_000 - c.len() as u32..6_000 {
        let t = tid(1_000_000 + i / 3, (i % 3) as u16 + 1);
        assert_eq!(c.get(&t), Some(&[i as u8; 2000][..]), "tuple {i}");
    }
    assert!((0..100_000).all(|i| c.get(&small(i)).is_none()));
    assert_filter_counts(&c);
    // Removing all but a few shrinks it to its first size, not below.
    let left: Vec<Tid> = c.entries().map(|(t, _, _)| t).collect();
    for t in &left[3..] {
        c.remove(t);
    }
    assert_eq!((c.len(), c.slots.len()), (3, MIN_SLOTS));
    assert!(left[..3].iter().all(|t| c.get(t).is_some()));
    assert_filter_counts(&c);
}

/// What the cache must hold after a sequence of calls, whatever it dropped: the newest
/// version of a TID, if any; and every TID put (and not removed since) within the last half
/// of the ring's bytes.
#[derive(Default)]
struct Model {
    /// TID → (seq of its newest put, data, head).
    newest: HashMap<Tid, (usize, Vec<u8>, Head)>,
    /// Record sizes of the puts, in order.
    sizes: Vec<usize>,
}

#[derive(Clone, Debug)]
enum Op {
    Put(u32, u16, usize, u8),
    Remove(u32, u16),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        8 => (0..60u32, 1..12u16, 0..300usize, any::<u8>()).prop_map(|(b, o, l, v)| Op::Put(b, o, l, v)),
        1 => (0..60u32, 1..12u16).prop_map(|(b, o)| Op::Remove(b, o)),
    ];
    proptest::collection::vec(op, 1..1500)
}

/// The record starts of the ring, oldest first.
fn record_starts(c: &TupleCache) -> Vec<usize> {
    let (mut at, mut wrapped) = (c.tail, c.wrapped);
    let mut starts = Vec::new();
    for _ in 0..c.records {
        if wrapped && at == c.lap_end {
            (at, wrapped) = (0, false);
        }
        starts.push(at);
        at += record_size(c.record(at).2.len());
    }
    starts
}

/// The drops' hints keep step with the ring: at most DROP_AHEAD records asked for, and the
/// next to ask for is the record that many after the oldest.
fn asks_in_step(c: &TupleCache) -> Result<(), TestCaseError> {
    prop_assert!(
        c.asked <= DROP_AHEAD.min(c.records),
        "{} of {}",
        c.asked,
        c.records
    );
    if c.asked > 0 && c.asked < c.records {
        let at = if c.wrapped && c.ask_at == c.lap_end {
            0
        } else {
            c.ask_at
        };
        prop_assert_eq!(at, record_starts(c)[c.asked]);
    }
    Ok(())
}

#[test]
fn the_drops_are_asked_for_ahead() {
    // Records of 100 data bytes take 136 bytes: ten fit in 1,360.
    let mut c = TupleCache::new(1360);
    for i in 0..10u16 {
        c.put(tid(1, i + 1), head(u32::from(i)), &[i as u8; 100]);
    }
    assert_eq!(c.asked, 0, "nothing dropped yet");
    c.put(tid(1, 11), head(10), &[10; 100]);
    // One dropped to make room; the next DROP_AHEAD records from the new oldest were asked
    // for, and the next to ask for is the ninth record.
    assert_eq!((c.records, c.asked), (10, DROP_AHEAD));
    assert_eq!(c.ask_at, record_starts(&c)[DROP_AHEAD]);
    assert_eq!(c.record(c.ask_at).0, tid(1, 10));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn it_holds_the_newest_version_and_all_recent_ones(cap in 256usize..80_000, ops in ops()) {
        let mut c = TupleCache::new(cap);
        let size = cap / 8 * 8;
        let mut m = Model::default();
        for (seq, op) in ops.iter().enumerate() {
            match *op {
                Op::Put(b, o, len, v) => {
                    let data = vec![v; len];
                    c.put(tid(b, o), head(seq as u32), &data);
                    if record_size(len) > size / 4 {
                        m.newest.remove(&tid(b, o));
                        m.sizes.push(0);
                    } else {
                        m.newest.insert(tid(b, o), (seq, data, head(seq as u32)));
                        m.sizes.push(record_size(len));
                    }
                }
                Op::Remove(b, o) => {
                    c.remove(&tid(b, o));
                    m.newest.remove(&tid(b, o));
                    m.sizes.push(0);
                }
            }
            prop_assert!(c.ring.len() <= size);
            asks_in_step(&c)?;
        }
        // Sequence numbers from which on everything put must still be there.
        let mut recent = m.sizes.len();
        let mut bytes = 0;
        while recent > 0 && bytes + m.sizes[recent - 1] <= size / 2 {
            recent -= 1;
            bytes += m.sizes[recent];
        }
        let mut live = 0;
        for (t, (seq, data, h)) in &m.newest {
            match c.get_with_head(t) {
                Some((gh, gd)) => {
                    prop_assert_eq!((gh, gd), (*h, &data[..]));
                    prop_assert!(c.may_hold(&t.block));
                    live += 1;
                }
                None => prop_assert!(*seq < recent, "{:?} put at {} of {} dropped", t, seq, m.sizes.len()),
            }
        }
        prop_assert_eq!(c.len(), live);
        assert_filter_counts(&c);
        // entries(): the live tuples, oldest first; put again in that order, the same cache.
        let listed: Vec<_> = c.entries().map(|(t, h, d)| (t, h, d.to_vec())).collect();
        prop_assert_eq!(listed.len(), live);
        let seqs: Vec<usize> = listed.iter().map(|(t, _, _)| m.newest[t].0).collect();
        prop_assert!(seqs.windows(2).all(|w| w[0] < w[1]));
        let mut again = TupleCache::new(cap);
        for (t, h, d) in &listed {
            again.put(*t, *h, d);
        }
        for (t, h, d) in &listed {
            prop_assert_eq!(again.get_with_head(t), Some((*h, &d[..])));
        }
        prop_assert_eq!(again.len(), live);
    }
}
