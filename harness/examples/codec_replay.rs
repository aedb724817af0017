//! The bench's one-core replay on a WAL file, for profiling the codec:
//!
//! ```sh
//! cargo build --release -p walrelay-harness --example codec_replay
//! perf record -g target/release/examples/codec_replay <file.wal> <start-lsn, e.g. 0/1000000> <major>
//! ```
//!
//! The file holds WAL bytes starting at the LSN given (e.g. segments of `pg_wal` concatenated).
use anyhow::{Context, Result};
use walrelay_harness::bench::micro;
use walrelay_wal::lsn::Lsn;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [file, start, major] = &args[..] else {
        anyhow::bail!("usage: codec_replay <file.wal> <start-lsn X/Y> <major>");
    };
    let start: Lsn = start.parse().context("the start LSN, as X/Y")?;
    let major: u32 = major.parse().context("the PostgreSQL major, e.g. 15")?;
    let r = micro::run(file.as_ref(), start, major)?;
    println!(
        "{} MB: walrelay {} B, enc {:.0} MB/s dec {:.0} MB/s per CPU-second (wall {:.0} / {:.0}); zstd-1 enc {:.0} dec {:.0}; zstd-3 {} B enc {:.0} dec {:.0}",
        r.wal_bytes >> 20,
        r.walrelay.encoded_bytes,
        r.walrelay.encode_mb_s,
        r.walrelay.decode_mb_s,
        r.walrelay.encode_wall_mb_s,
        r.walrelay.decode_wall_mb_s,
        r.zstd1.encode_mb_s,
        r.zstd1.decode_mb_s,
        r.zstd3.encoded_bytes,
        r.zstd3.encode_mb_s,
        r.zstd3.decode_mb_s,
    );
    Ok(())
}
