//! The link codec between walrelay's halves (`walrelay::codec`): the downstream half decodes
//! whatever arrives on the link.
//!
//! Decoding: the input is a sequence of records `raw_len: u32 BE | xxh3: u64 BE |
//! payload_len: u16 BE | payload`, fed in order to one zstd decoder (and one `none` decoder), as
//! a session does. A short last record takes the rest of the input as its payload.
//! Round trip: the whole input, encoded as three messages of one session (input, input again,
//! empty) with zstd and with `none`, must decode to the input with matching checksums.
//!
//! Properties: no panic; decoded output never exceeds the announced length, nor the session's
//! max_len; a successful decode gives exactly raw_len bytes whose xxh3 is the announced one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use walrelay::codec::{checksum, WalDecoder, WalEncoder};
use walrelay::config::CodecKind;

const MAX_LEN: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    decode_records(data);
    round_trip(data);
});

fn decode_records(mut data: &[u8]) {
    let mut zstd = WalDecoder::new(CodecKind::Zstd, 20, MAX_LEN).expect("zstd decoder");
    let mut none = WalDecoder::new(CodecKind::None, 20, MAX_LEN).expect("none decoder");
    let mut out = Vec::new();
    while data.len() >= 14 {
        let raw_len = u32::from_be_bytes(data[0..4].try_into().unwrap()) as usize;
        let xxh3 = u64::from_be_bytes(data[4..12].try_into().unwrap());
        let plen = u16::from_be_bytes(data[12..14].try_into().unwrap()) as usize;
        data = &data[14..];
        let plen = plen.min(data.len());
        let (payload, rest) = data.split_at(plen);
        data = rest;
        for dec in [&mut zstd, &mut none] {
            let res = dec.decode(payload, raw_len, xxh3, &mut out);
            assert!(out.len() <= MAX_LEN, "decoded {} bytes, max_len {MAX_LEN}", out.len());
            assert!(
                out.capacity() <= 2 * MAX_LEN + 2 * payload.len() + (1 << 17),
                "output buffer grew to {} bytes",
                out.capacity()
            );
            if res.is_ok() {
                assert_eq!(out.len(), raw_len);
                assert_eq!(checksum(&out), xxh3);
            }
        }
    }
}

fn round_trip(data: &[u8]) {
    for kind in [CodecKind::Zstd, CodecKind::None] {
        let mut enc = WalEncoder::new(kind, 3, 20).expect("encoder");
        let mut dec = WalDecoder::new(kind, 20, MAX_LEN).expect("decoder");
        let (mut e, mut d) = (Vec::new(), Vec::new());
        for msg in [data, data, &[][..]] {
            enc.encode(msg, &mut e).expect("encode");
            dec.decode(&e, msg.len(), checksum(msg), &mut d)
                .unwrap_or_else(|err| panic!("{kind:?}: decoding what was encoded failed: {err}"));
            assert_eq!(&d[..], msg, "{kind:?}: round trip changed the bytes");
        }
    }
}
