//! Test helpers: a `wal` codec session setup, WAL-shaped bytes the codec passes raw, and a
//! wait for a stage's input queue to fill.

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

/// Waits (up to 30 s) until the bounded queue `probe` sends into is full: a stage's thread
/// then holds an item it cannot pass on and the feed waits with the next one counted, so the
/// next item the thread takes finds it behind, however busy the machine.
pub async fn wait_full<T>(probe: &tokio::sync::mpsc::Sender<T>) {
    let full = async {
        while probe.capacity() > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), full)
        .await
        .expect("the stage's input queue never filled");
}
