//! The link codec between walrelay's halves (`walrelay_wal::linkcodec`): the downstream half decodes
//! whatever arrives on the link, for each codec kind (`zstd`, `none`, `wal`).
//!
//! Decoding: byte 0 picks the kind; the rest is a sequence of records `raw_len: u32 BE |
//! xxh3: u64 BE | payload_len: u16 BE | payload`, fed in order to one decoder session, as a
//! session does, each at the LSN where the previous one ended. A short last record takes the rest
//! of the input as its payload.
//! Round trip: the whole input, encoded as three messages of one session (input, input again,
//! empty) with every kind, must decode to the input with matching checksums.
//!
//! Properties: no panic; buffers stay bounded by the announced lengths and the session's
//! max_len; a successful decode gives exactly raw_len bytes whose xxh3 is the announced one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use walrelay_wal::linkcodec::{checksum, Setup, WalDecoder, WalEncoder};
use walrelay_wal::linkcodec::CodecKind;
use walrelay_wal::lsn::Lsn;
use walrelay_wal::walcodec::CodecParams;

const MAX_LEN: usize = 1 << 20;
const KINDS: [CodecKind; 3] = [CodecKind::Zstd, CodecKind::None, CodecKind::Wal];

fn setup(kind: CodecKind) -> Setup {
    Setup {
        kind,
        zstd_level: 3,
        window_log: 20,
        wal: CodecParams {
            pg_major: Some(walrelay_wal::pg::PgMajor::V16),
            block_cache_bytes: 4 * (8192 + 64),
            zstd_level: 1,
            max_message_bytes: MAX_LEN,
        },
    }
}

fuzz_target!(|data: &[u8]| {
    if let Some((&sel, rest)) = data.split_first() {
        decode_records(KINDS[usize::from(sel) % KINDS.len()], rest);
    }
    round_trip(data);
});

fn decode_records(kind: CodecKind, mut data: &[u8]) {
    let mut dec = WalDecoder::new(&setup(kind)).expect("decoder");
    let mut out = Vec::new();
    let mut pos = 0x0300_0000u64;
    while data.len() >= 14 {
        let raw_len = u32::from_be_bytes(data[0..4].try_into().unwrap()) as usize;
        let xxh3 = u64::from_be_bytes(data[4..12].try_into().unwrap());
        let plen = u16::from_be_bytes(data[12..14].try_into().unwrap()) as usize;
        data = &data[14..];
        let plen = plen.min(data.len());
        let (payload, rest) = data.split_at(plen);
        data = rest;
        let res = dec.decode(Lsn(pos), payload, raw_len, MAX_LEN, xxh3, &mut out);
        assert!(
            out.capacity() <= 2 * MAX_LEN + 2 * payload.len() + (1 << 17),
            "{kind:?}: output buffer grew to {} bytes",
            out.capacity()
        );
        if res.is_ok() {
            assert_eq!(out.len(), raw_len, "{kind:?}");
            assert!(raw_len <= MAX_LEN, "{kind:?}");
            assert_eq!(checksum(&out), xxh3, "{kind:?}");
        }
        pos = pos.wrapping_add(raw_len as u64) % (1 << 40);
    }
}

fn round_trip(data: &[u8]) {
    for kind in KINDS {
        let mut enc = WalEncoder::new(&setup(kind)).expect("encoder");
        let mut dec = WalDecoder::new(&setup(kind)).expect("decoder");
        let (mut e, mut d) = (Vec::new(), Vec::new());
        let mut at = 0x0300_0000u64;
        for msg in [data, data, &[][..]] {
            enc.encode(Lsn(at), msg, &mut e).expect("encode");
            dec.decode(Lsn(at), &e, msg.len(), MAX_LEN, checksum(msg), &mut d)
                .unwrap_or_else(|err| panic!("{kind:?}: decoding what was encoded failed: {err}"));
            assert_eq!(&d[..], msg, "{kind:?}: round trip changed the bytes");
            at += msg.len() as u64;
        }
    }
}
