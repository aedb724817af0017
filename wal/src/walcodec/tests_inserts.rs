//! The tuple cache across a relation's change from caching its inserts to leaving them out
//! and back ([`tuples`]`::inserts`), through the whole codec.

use super::testgen::{block_key as key, Entropy, GenBlock, Image, WalGen};
use super::tests::relay;
use super::tuples::COLD_AFTER;
use super::*;
use crate::pg::PgMajor;

/// A heap record (`info`) of relation 16600 whose block 0 (`blkno`) carries the new tuple
/// `body` (from t_bits on) whole, after its `xl_heap_header`.
fn heap(g: &mut WalGen, info: u8, xid: u32, blkno: u32, body: &[u8], main: &[u8]) {
    let mut data = vec![0x02, 0x00, 0x02, 0x08, 24];
    data.extend_from_slice(body);
    let blocks = [GenBlock {
        key: key(16600, blkno),
        image: Image::None,
        data,
    }];
    let rec = g.record(10, info, xid, &blocks, main);
    g.write_record(&rec);
}

/// A heap INSERT of `body` at (`blkno`, `off`).
fn insert(g: &mut WalGen, blkno: u32, off: u16, body: &[u8]) {
    let mut main = off.to_le_bytes().to_vec();
    main.push(0);
    heap(g, 0x00, 900, blkno, body, &main);
}

/// A heap UPDATE of (0, 1) to (0, 2) with the new tuple `body`.
fn update(g: &mut WalGen, body: &[u8]) {
    let mut main = vec![0u8; 14];
    main[4..6].copy_from_slice(&1u16.to_le_bytes());
    main[12..14].copy_from_slice(&2u16.to_le_bytes());
    heap(g, 0x20, 901, 0, body, &main);
}

#[test]
fn inserts_stop_being_cached_and_resume_after_an_update_on_both_ends() {
    let mut g = WalGen::new(PgMajor::V15, 64 << 20, 0, 11);
    let first = g.rng.bytes(60);
    insert(&mut g, 0, 1, &first);
    // COLD_AFTER more inserts into the same relation: the last one is not cached.
    for i in 0..COLD_AFTER {
        let body = g.rng.bytes(24);
        insert(&mut g, 1 + i / 100, 1 + (i % 100) as u16, &body);
    }
    // A new tuple at the TID of the first: not cached, the first stays (stale).
    let mut second = g.rng.bytes(60);
    insert(&mut g, 0, 1, &second);
    let cold_end = g.buf.len();
    // Its update: candidate 1 is the stale tuple; the relation is warm again.
    second[7] ^= 0x55;
    update(&mut g, &second);
    let body = g.rng.bytes(24);
    insert(&mut g, 5000, 1, &body);

    let p = CodecParams {
        pg_major: Some(PgMajor::V15),
        block_cache_bytes: 1 << 30,
        zstd_level: 3,
        max_message_bytes: 64 << 20,
    };
    let (mut enc, mut dec) = (Encoder::new(&p).unwrap(), Decoder::new(&p).unwrap());
    relay(&mut enc, &mut dec, &g, 0, cold_end);
    let cached = COLD_AFTER as usize;
    assert_eq!(
        enc.tuples.len(),
        cached,
        "the first COLD_AFTER inserts only"
    );
    assert_eq!(dec.st.tuples.len(), cached);
    assert_eq!(
        enc.tuples.get(&tuples::Tid {
            block: key(16600, 0),
            off: 1
        }),
        Some(&first[..]),
        "the first tuple stays where the cold insert left it alone"
    );
    relay(&mut enc, &mut dec, &g, cold_end, g.buf.len());
    assert_eq!(
        enc.tuples.len(),
        cached + 2,
        "the update's tuple and the insert after it"
    );
    assert_eq!(dec.st.tuples.len(), cached + 2);
}
