use proptest::prelude::*;

use super::*;
use crate::lsn::Lsn;
use crate::walcodec::cache::SLOT_BYTES;
use crate::walcodec::testgen::WalGen;

const SEG: u64 = 1 << 20;

fn params(slots: usize) -> CodecParams {
    CodecParams {
        pg_major: Some(PgMajor::V15),
        block_cache_bytes: slots * SLOT_BYTES,
        zstd_level: 3,
        max_message_bytes: 4 << 20,
    }
}

/// Encodes and decodes `wal[..]` from `start` in 50 kB messages; returns the payload bytes.
fn run(enc: &mut Encoder, dec: &mut Decoder, start: u64, wal: &[u8]) -> usize {
    let (mut pl, mut out, mut total) = (Vec::new(), Vec::new(), 0);
    for (i, msg) in wal.chunks(50_000).enumerate() {
        let lsn = Lsn(start + (i * 50_000) as u64);
        enc.encode(lsn, msg, &mut pl).unwrap();
        dec.decode(lsn, &pl, msg.len(), &mut out).unwrap();
        assert!(out == msg, "message at {lsn} restored differently");
        total += pl.len();
    }
    total
}

/// Two sessions over the same blocks: the second, restored from what both ends saved after
/// the first, starts warm (fewer bytes than a fresh pair) and restores exactly; the digests
/// of the two ends agree.
#[test]
fn a_restored_pair_starts_warm() {
    let mut g = WalGen::new(PgMajor::V15, SEG, 3 * SEG, 4);
    while g.buf.len() < 600_000 {
        g.random_record(40);
    }
    let first = g.buf.len() / 8192 * 8192;
    while g.buf.len() < first + 600_000 {
        g.random_record(40);
    }
    let p = params(200);
    let (mut enc, mut dec) = (Encoder::new(&p).unwrap(), Decoder::new(&p).unwrap());
    run(&mut enc, &mut dec, g.start, &g.buf[..first]);
    let (se, sd) = (enc.save_caches(), dec.save_caches().unwrap());
    assert_eq!(se.digest, sd.digest);
    assert!(enc.cache_bytes() > 0 && enc.tuple_cache_bytes() > 0);

    // The second session starts at a page boundary, as a reconnecting standby does.
    let second = &g.buf[first..];
    let start = g.start + first as u64;
    let mut fresh = (Encoder::new(&p).unwrap(), Decoder::new(&p).unwrap());
    let cold = run(&mut fresh.0, &mut fresh.1, start, second);
    let mut warm = (
        Encoder::with_caches(&p, &se.bytes).unwrap(),
        Decoder::with_caches(&p, &sd.bytes).unwrap(),
    );
    let warm_bytes = run(&mut warm.0, &mut warm.1, start, second);
    assert!(warm_bytes < cold, "restored {warm_bytes} vs fresh {cold}");
    assert!(warm.0.stats().fpi_cache_hits > fresh.0.stats().fpi_cache_hits);
}

#[test]
fn saved_caches_are_checked() {
    let mut g = WalGen::new(PgMajor::V15, SEG, 3 * SEG, 5);
    while g.buf.len() < 200_000 {
        g.random_record(10);
    }
    let p = params(50);
    let (mut enc, mut dec) = (Encoder::new(&p).unwrap(), Decoder::new(&p).unwrap());
    run(&mut enc, &mut dec, g.start, &g.buf);
    let se = enc.save_caches();
    // Another cache size, another major, a flipped byte, a cut file: refused.
    assert!(Encoder::with_caches(&params(60), &se.bytes).is_err());
    let other = CodecParams {
        pg_major: Some(PgMajor::V16),
        ..p.clone()
    };
    assert!(Decoder::with_caches(&other, &se.bytes).is_err());
    let mut bad = se.bytes.clone();
    bad[100] ^= 1;
    assert!(Encoder::with_caches(&p, &bad).is_err());
    assert!(Encoder::with_caches(&p, &se.bytes[..se.bytes.len() - 3]).is_err());
    // An encoder's file has the use order a decoder's has not.
    assert!(Decoder::with_caches(&p, &se.bytes).is_err());
    assert!(Encoder::with_caches(&p, &se.bytes).is_ok());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]
    #[test]
    fn garbage_never_panics(mut bytes in proptest::collection::vec(any::<u8>(), 0..300), slots in 0u32..4) {
        let p = params(4);
        // Steer past the header now and then.
        if bytes.len() > 20 && slots > 0 {
            bytes[..4].copy_from_slice(MAGIC);
            bytes[4..8].copy_from_slice(&15u32.to_le_bytes());
            bytes[8..16].copy_from_slice(&(p.block_cache_bytes as u64).to_le_bytes());
            bytes[16..20].copy_from_slice(&(slots - 1).to_le_bytes());
        }
        let _ = Encoder::with_caches(&p, &bytes);
        let _ = Decoder::with_caches(&p, &bytes);
    }
}
