//! The tuple cache's resident memory against its capacity (walcodec format 10's ring, see
//! `wal/src/walcodec/tuples/ring.rs`): puts three capacities' worth of tuples of one size on
//! distinct TIDs (60 per block) into a cache of 128 MiB, the default's (an eighth of a 1 GiB
//! block cache), and prints how many it holds, the memory it reports and the growth of the
//! process's resident set (with the binary's allocator, mimalloc). More sizes are phases, one
//! after the other in the same cache (e.g. small tuples, then large ones that push them out:
//! the index follows the live tuples down).
//!
//! ```text
//! cargo build --release -p walrelay-harness --example tuple_cache_memory
//! target/release/examples/tuple_cache_memory 100      # tuple bytes (from t_bits on)
//! target/release/examples/tuple_cache_memory 30 2000  # 30-byte tuples, then 2,000-byte ones
//! ```

use anyhow::{Context, Result};
use walrelay_harness::relayproc::process_status_bytes;
use walrelay_wal::walcodec::tuples::{Head, Tid, TupleCache};
use walrelay_wal::walcodec::wal::BlockKey;

/// The walrelay binary's allocator, so that the resident set is the relay's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CAP: usize = 128 << 20;

fn rss_kib() -> Result<u64> {
    process_status_bytes(std::process::id(), "VmRSS:")
        .map(|b| b >> 10)
        .context("no VmRSS in /proc/self/status")
}

fn main() -> Result<()> {
    let lens: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().context("a tuple's length in bytes"))
        .collect::<Result<_>>()?;
    anyhow::ensure!(
        !lens.is_empty(),
        "usage: tuple_cache_memory <tuple bytes> [<tuple bytes> ...]"
    );
    let before = rss_kib()?;
    let mut cache = TupleCache::new(CAP);
    for (phase, &len) in lens.iter().enumerate() {
        let ns = fill(&mut cache, phase as u32, len);
        println!(
            "{len}-byte tuples: {} cached, {} MiB reported, resident set +{} MiB, {ns:.0} ns a put",
            cache.len(),
            cache.bytes() >> 20,
            (rss_kib()? - before) >> 10,
        );
    }
    Ok(())
}

/// Puts three capacities' worth of `len`-byte tuples on TIDs of its own `phase`; returns
/// the nanoseconds a put took.
fn fill(cache: &mut TupleCache, phase: u32, len: usize) -> f64 {
    let data = vec![7u8; len];
    let puts = 3 * CAP / (len + 32);
    let t = std::time::Instant::now();
    for i in 0..puts {
        let block = BlockKey {
            spc: 1663,
            db: 5,
            rel: 16384 + phase,
            fork: 0,
            blkno: (i / 60) as u32,
        };
        let off = (i % 60) as u16 + 1;
        cache.put(Tid { block, off }, Head::default(), &data);
    }
    t.elapsed().as_nanos() as f64 / puts as f64
}
