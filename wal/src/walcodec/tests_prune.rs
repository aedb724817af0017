//! A prune of PostgreSQL 14-16 sent as its difference from the prune both ends predict from
//! the cached page (format 15, [`prunexf`]), through the whole codec.

use super::testgen::{block_key as key, GenBlock, GivenImage, Image, WalGen};
use super::tests::{heap_page, params, relay};
use super::wal::{PAGE_SIZE, RM_HEAP2_ID, RM_HEAP_ID};
use super::*;
use crate::pg::PgMajor;

/// xl_heap_update of a HOT update by 900 from `old` to `new`, nothing cut.
fn update_main(old: u16, new: u16) -> Vec<u8> {
    let mut m = 900u32.to_le_bytes().to_vec();
    m.extend_from_slice(&old.to_le_bytes());
    m.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    m.extend_from_slice(&new.to_le_bytes());
    m
}

fn record(
    g: &mut WalGen,
    rmid: u8,
    info: u8,
    blkno: u32,
    image: Image,
    data: Vec<u8>,
    main: &[u8],
) {
    let blocks = [GenBlock {
        key: key(16800, blkno),
        image,
        data,
    }];
    let xid = if rmid == RM_HEAP2_ID { 0 } else { 900 };
    let rec = g.record(rmid, info, xid, &blocks, main);
    g.write_record(&rec);
}

/// xl_heap_prune of PostgreSQL 14-15: horizon, nredirected, ndead.
fn prune_main(horizon: u32, nred: u16, ndead: u16) -> Vec<u8> {
    let mut m = horizon.to_le_bytes().to_vec();
    m.extend_from_slice(&nred.to_le_bytes());
    m.extend_from_slice(&ndead.to_le_bytes());
    m
}

fn offsets(o: &[u16]) -> Vec<u8> {
    o.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A generator of `major`'s WAL whose first record images block (16800, 0): a heap page of
/// three live tuples of 40 bytes.
fn imaged(major: PgMajor) -> WalGen {
    let mut g = WalGen::new(major, 64 << 20, 0, 7);
    let image = GivenImage {
        page: heap_page(&[[0x11u8; 16]; 3]),
        hole_offset: 36,
        hole_len: (PAGE_SIZE - 3 * 40 - 36) as u16,
        apply: true,
        compressed: None,
    };
    let image = Image::Given(image);
    record(
        &mut g,
        RM_HEAP_ID,
        0x40,
        0,
        image,
        Vec::new(),
        &update_main(3, 3),
    );
    g
}

/// After an image of a page and a HOT update of its second tuple, the prune PostgreSQL logs
/// (the root redirected to the new version, the updater as horizon) is the one both ends
/// predicted; a prune that differs, and one of a page never seen, still come back byte for
/// byte, however the messages are cut.
#[test]
fn a_predicted_prune_goes_as_zeros_and_every_prune_comes_back() {
    let mut g = imaged(PgMajor::V15);
    // HOT update (0, 2) → (0, 4): the new version heap-only, 16 bytes of user data.
    let mut tuple = vec![0x03, 0x80, 0x02, 0x28, 24, 0];
    tuple.extend_from_slice(&[0x22; 16]);
    record(
        &mut g,
        RM_HEAP_ID,
        0x40,
        0,
        Image::None,
        tuple,
        &update_main(2, 4),
    );
    let start_prunes = g.buf.len();
    // What heap_page_prune logs: 2 redirected to 4, horizon 900.
    let exact = (prune_main(900, 1, 0), offsets(&[2, 4]));
    record(&mut g, RM_HEAP2_ID, 0x10, 0, Image::None, exact.1, &exact.0);
    // Not what the page says (nothing left to prune there): line pointer 1 dead.
    let other = (prune_main(5, 0, 1), offsets(&[1]));
    record(&mut g, RM_HEAP2_ID, 0x10, 0, Image::None, other.1, &other.0);
    // A page never seen: no prediction.
    record(
        &mut g,
        RM_HEAP2_ID,
        0x10,
        9,
        Image::None,
        offsets(&[1, 2]),
        &prune_main(7, 1, 0),
    );
    let end = g.buf.len();

    // Whole, cut between the records, and cut inside the exact prune (a record a message
    // boundary cuts goes raw: neither predicted nor replayed, so the next prune is predicted
    // from a page it did not change and misses).
    for (cuts, want) in [
        (vec![end], (2, 1)),
        (vec![start_prunes, end], (2, 1)),
        (vec![start_prunes + 40, end], (1, 0)),
    ] {
        let p = params(64);
        let (mut enc, mut dec) = (Encoder::new(&p).unwrap(), Decoder::new(&p).unwrap());
        let mut from = 0;
        for &to in &cuts {
            relay(&mut enc, &mut dec, &g, from, to);
            from = to;
        }
        let st = enc.stats();
        assert_eq!(
            (st.prunes_predicted, st.prunes_exact),
            want,
            "cuts {cuts:?}"
        );
    }
}

/// The same records from PostgreSQL 17 are not predicted (its prunes are logged differently).
#[test]
fn prunes_of_17_are_not_predicted() {
    let mut g = imaged(PgMajor::V17);
    // xl_heap_prune of 17: reason, flags (redirected array: 0x20), then its count and pairs.
    let mut data = 1u16.to_le_bytes().to_vec();
    data.extend(offsets(&[2, 3]));
    record(&mut g, RM_HEAP2_ID, 0x10, 0, Image::None, data, &[0, 0x20]);
    let p = CodecParams {
        pg_major: Some(PgMajor::V17),
        ..params(64)
    };
    let (mut enc, mut dec) = (Encoder::new(&p).unwrap(), Decoder::new(&p).unwrap());
    relay(&mut enc, &mut dec, &g, 0, g.buf.len());
    assert_eq!(enc.stats().prunes_predicted, 0);
}
