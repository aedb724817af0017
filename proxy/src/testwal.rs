//! Test helpers: a `wal` codec session setup and WAL-shaped bytes the codec passes raw.

use crate::config::CodecKind;
use walrelay_wal::linkcodec::Setup;

/// The `wal` codec for PostgreSQL 15 with a 1 MiB block cache and messages up to 1 MiB.
pub fn wal_setup() -> Setup {
    Setup {
        kind: CodecKind::Wal,
        zstd_level: 3,
        window_log: 20,
        wal: walrelay_wal::walcodec::CodecParams {
            pg_major: Some(walrelay_wal::pg::PgMajor::V15),
            block_cache_bytes: 1 << 20,
            zstd_level: 3,
            max_message_bytes: 1 << 20,
        },
    }
}

/// `len` compressible bytes that are not WAL the codec locks on (it passes them raw),
/// different for every `seed`.
pub fn raw_run(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| ((k / 7) as u8).wrapping_mul(31) ^ (seed as u8) ^ ((k % 5) as u8))
        .collect()
}
