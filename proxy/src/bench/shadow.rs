//! Bench only: generic streaming zstd-3 fed the same messages as the link codec, for a
//! side-by-side comparison in one run.

use walrelay_wal::linkcodec::{checksum, CodecError, CodecKind, Setup, WalDecoder, WalEncoder};
use walrelay_wal::lsn::Lsn;
use walrelay_wal::walcodec;

/// Bench only: the same messages through generic streaming zstd-3 (flushed per message, as
/// the `zstd` codec does), counting bytes and encode/decode time into the metrics.
pub struct ShadowZstd {
    enc: WalEncoder,
    dec: WalDecoder,
    encoded: Vec<u8>,
    decoded: Vec<u8>,
}

impl ShadowZstd {
    pub fn new(max_len: usize) -> Result<ShadowZstd, CodecError> {
        let setup = Setup {
            kind: CodecKind::Zstd,
            zstd_level: 3,
            window_log: 23,
            wal: walcodec::CodecParams {
                pg_major: None,
                block_cache_bytes: 0,
                zstd_level: 3,
                max_message_bytes: max_len,
            },
        };
        Ok(ShadowZstd {
            enc: WalEncoder::new(&setup)?,
            dec: WalDecoder::new(&setup)?,
            encoded: Vec::new(),
            decoded: Vec::new(),
        })
    }

    pub fn observe(
        &mut self,
        start: Lsn,
        raw: &[u8],
        metrics: &crate::metrics::Metrics,
    ) -> Result<(), CodecError> {
        use crate::metrics::{timed, Metrics};
        timed(&metrics.shadow_encode_ns, || {
            self.enc.encode(start, raw, &mut self.encoded)
        })?;
        Metrics::add(&metrics.shadow_zstd_bytes, self.encoded.len() as u64);
        timed(&metrics.shadow_decode_ns, || {
            self.dec.decode(
                start,
                &self.encoded,
                raw.len(),
                usize::MAX,
                checksum(raw),
                &mut self.decoded,
            )
        })
    }
}
