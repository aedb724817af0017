//! A prune on access sent as its difference from the prune both ends predict from the cached
//! page ([`prunexf`]: format 15 for PostgreSQL 14-16, 16 for 17-18), through the whole codec.

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

/// xl_heap_prune of PostgreSQL 17-18 on access, and block 0's data: reason 0, flags
/// (XLHP_CLEANUP_LOCK, the horizon's bit when given, each array's when it has entries),
/// then each array present as its count and offsets.
fn prune17(horizon: u32, red: &[u16], dead: &[u16]) -> (Vec<u8>, Vec<u8>) {
    let mut flags = 0x04;
    let mut main = vec![0, 0];
    if horizon != 0 {
        flags |= 0x08;
        main.extend_from_slice(&horizon.to_le_bytes());
    }
    let mut data = Vec::new();
    for (list, n, bit) in [(red, red.len() / 2, 0x20), (dead, dead.len(), 0x40)] {
        if n > 0 {
            flags |= bit;
            data.extend((n as u16).to_le_bytes());
            data.extend(offsets(list));
        }
    }
    main[1] = flags;
    (main, data)
}

/// [`imaged`], then a HOT update by 900 of (0, 2) to (0, 4): the new version heap-only, 16
/// bytes of user data.
fn hot_updated(major: PgMajor) -> WalGen {
    let mut g = imaged(major);
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
    g
}

/// `major`'s prune records (main data, block 0's data): what PostgreSQL logs after a HOT
/// update of (0, 2) by 900 to (0, 4) (2 redirected to 4, horizon 900), one that is not what
/// the page says (line pointer 1 dead), and one of a page never seen.
fn prunes(major: PgMajor) -> [(Vec<u8>, Vec<u8>); 3] {
    if major >= PgMajor::V17 {
        [
            prune17(900, &[2, 4], &[]),
            prune17(5, &[], &[1]),
            prune17(7, &[1, 2], &[]),
        ]
    } else {
        [
            (prune_main(900, 1, 0), offsets(&[2, 4])),
            (prune_main(5, 0, 1), offsets(&[1])),
            (prune_main(7, 1, 0), offsets(&[1, 2])),
        ]
    }
}

/// After an image of a page and a HOT update of its second tuple, the prune PostgreSQL logs
/// (the root redirected to the new version, the updater as horizon) is the one both ends
/// predicted; a prune that differs, and one of a page never seen, still come back byte for
/// byte, however the messages are cut; in each major's layout.
#[test]
fn a_predicted_prune_goes_as_zeros_and_every_prune_comes_back() {
    for major in [PgMajor::V15, PgMajor::V16, PgMajor::V17, PgMajor::V18] {
        predicted_prunes(major);
    }
}

fn predicted_prunes(major: PgMajor) {
    let mut g = hot_updated(major);
    let start_prunes = g.buf.len();
    let [exact, other, unseen] = prunes(major);
    record(&mut g, RM_HEAP2_ID, 0x10, 0, Image::None, exact.1, &exact.0);
    record(&mut g, RM_HEAP2_ID, 0x10, 0, Image::None, other.1, &other.0);
    record(
        &mut g,
        RM_HEAP2_ID,
        0x10,
        9,
        Image::None,
        unseen.1,
        &unseen.0,
    );
    let end = g.buf.len();

    // Whole, cut between the records, and cut inside the exact prune (a record a message
    // boundary cuts goes raw: neither predicted nor replayed, so the next prune is predicted
    // from a page it did not change and misses).
    for (cuts, want) in [
        (vec![end], (2, 1, 1)),
        (vec![start_prunes, end], (2, 1, 1)),
        (vec![start_prunes + 40, end], (1, 0, 0)),
    ] {
        let p = CodecParams {
            pg_major: Some(major),
            ..params(64)
        };
        let (mut enc, mut dec) = (Encoder::new(&p).unwrap(), Decoder::new(&p).unwrap());
        let mut from = 0;
        for &to in &cuts {
            relay(&mut enc, &mut dec, &g, from, to);
            from = to;
        }
        let st = enc.stats();
        assert_eq!(
            (st.prunes_predicted, st.prunes_exact, st.prunes_data_exact),
            want,
            "{major:?}, cuts {cuts:?}"
        );
    }
}

/// `g`'s WAL through a fresh codec pair of `major` in one message, checked byte for byte;
/// the encoder's counters.
fn relayed_whole(major: PgMajor, g: &WalGen) -> CodecStats {
    let p = CodecParams {
        pg_major: Some(major),
        ..params(64)
    };
    let (mut enc, mut dec) = (Encoder::new(&p).unwrap(), Decoder::new(&p).unwrap());
    relay(&mut enc, &mut dec, g, 0, g.buf.len());
    enc.stats().clone()
}

/// A VACUUM's prune of 17 (PRUNE_VACUUM_SCAN) is not predicted, and comes back.
#[test]
fn vacuum_prunes_of_17_are_not_predicted() {
    let mut g = imaged(PgMajor::V17);
    let (main, data) = prune17(0, &[2, 3], &[]);
    record(&mut g, RM_HEAP2_ID, 0x20, 0, Image::None, data, &main);
    assert_eq!(relayed_whole(PgMajor::V17, &g).prunes_predicted, 0);
}

/// A prune of 18 whose `reason` byte the stack left non-zero (PostgreSQL never sets it):
/// its block data still counts as predicted, the record not whole, and it comes back.
#[test]
fn a_stray_reason_byte_misses_only_itself() {
    let mut g = hot_updated(PgMajor::V18);
    let (mut main, data) = prune17(900, &[2, 4], &[]);
    main[0] = 0x04;
    record(&mut g, RM_HEAP2_ID, 0x10, 0, Image::None, data, &main);
    let st = relayed_whole(PgMajor::V18, &g);
    assert_eq!(
        (st.prunes_predicted, st.prunes_exact, st.prunes_data_exact),
        (1, 0, 1)
    );
    assert_eq!(st.prunes_missed_by_reason, 1);
}
