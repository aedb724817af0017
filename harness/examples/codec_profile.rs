//! Encodes (and with `decode`, also decodes) a WAL file with the `wal` link codec only, in
//! messages of 256 kB after up to 64 kB the one before held back (the bench's replays' sizes,
//! `bench::micro::Cutter`; `WALRELAY_MESSAGE_KB` and `WALRELAY_HOLD_KB` set others, a hold of
//! 0 cuts fixed chunks) one at a time on this thread (no other threads), for profiling one
//! side without the baselines:
//!
//! ```sh
//! cargo build --release -p walrelay-harness --example codec_profile
//! perf record -g target/release/examples/codec_profile <file.wal> <start-lsn> <major> [decode]
//! ```
//!
//! `WALRELAY_ZSTD_LEVEL` sets the codec's zstd level (`link.zstd_level`, default 3),
//! `WALRELAY_BLOCK_CACHE_MB` its block cache (`link.block_cache_bytes`, default 1024 MiB; the tuple
//! cache gets an eighth). `WALRELAY_STAGE=1` encodes as the upstream does while the primary
//! writes faster than one core encodes: more than one core allowed, each message staged
//! while the one before is compressed on the section thread (`WalEncoder::stage`), and
//! decodes likewise (`WalDecoder::stage`: a message's sections decompressed on a thread
//! while the one before is restored). `WALRELAY_WARM_MB=N` first passes the file's first N MB
//! through both codecs untimed and times the rest: a steady state, with the block cache
//! holding the pages the first part imaged (the numbers and counts printed are the rest's).
//! `WALRELAY_FAST=1` encodes everything with the streams' fast settings, as the upstream does
//! while it falls behind on CPU (`WalEncoder::set_fast`).
/// The walrelay binary's allocator (its `main.rs` says why), so that profiles match it.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::Instant;

use anyhow::{Context, Result};
use walrelay_harness::bench::micro::{self, decode_all, encode_all, Cores};
use walrelay_harness::bench::payloads::Payloads;
use walrelay_wal::linkcodec::{checksum, CodecKind, Setup, WalDecoder, WalEncoder};
use walrelay_wal::lsn::Lsn;
use walrelay_wal::walcodec::{CodecParams, CodecStats};

/// The run's settings from the environment (the module docs list them).
struct Options {
    level: i32,
    message: usize,
    hold: usize,
    cache_mb: usize,
    warm_mb: usize,
    cores: Cores,
    fast: bool,
}

impl Options {
    fn from_env() -> Result<Options> {
        let staged = std::env::var("WALRELAY_STAGE").is_ok_and(|v| v == "1");
        Ok(Options {
            level: env_or("WALRELAY_ZSTD_LEVEL", 3)?,
            message: env_or("WALRELAY_MESSAGE_KB", micro::MESSAGE >> 10)? << 10,
            hold: env_or("WALRELAY_HOLD_KB", micro::HOLD >> 10)? << 10,
            cache_mb: env_or("WALRELAY_BLOCK_CACHE_MB", 1024)?,
            warm_mb: env_or("WALRELAY_WARM_MB", 0)?,
            cores: if staged { Cores::Staged } else { Cores::One },
            fast: std::env::var("WALRELAY_FAST").is_ok_and(|v| v == "1"),
        })
    }
}

/// Environment variable `name` as a number, `default` when it is not set.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    match std::env::var(name) {
        Ok(v) => v.parse().with_context(|| format!("{name}={v}")),
        Err(_) => Ok(default),
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (file, start, major, decode) = match &args[..] {
        [f, s, m] => (f, s, m, false),
        [f, s, m, d] if d == "decode" => (f, s, m, true),
        _ => anyhow::bail!("usage: codec_profile <file.wal> <start-lsn X/Y> <major> [decode]"),
    };
    let start: Lsn = start.parse().context("the start LSN, as X/Y")?;
    let major: u32 = major.parse().context("the PostgreSQL major, e.g. 15")?;
    let wal = std::fs::read(file).with_context(|| format!("reading {file}"))?;
    let o = Options::from_env()?;
    let (message, cores) = (o.message, o.cores);
    let setup = Setup {
        kind: CodecKind::Wal,
        zstd_level: 3,
        window_log: 23,
        wal: CodecParams {
            pg_major: walrelay_wal::pg::PgMajor::from_number(major),
            block_cache_bytes: o.cache_mb << 20,
            zstd_level: o.level,
            max_message_bytes: message + o.hold,
        },
    };
    let split = ((o.warm_mb << 20) / message * message).min(wal.len());
    let timed_start = Lsn(start.0 + split as u64);
    let mut enc = WalEncoder::new(&setup)?;
    enc.set_parallel(cores == Cores::Staged);
    enc.set_fast(o.fast);
    let sizes = (message, o.hold);
    // The warm-up is not timed: its payloads need no memory touched beforehand.
    let mut warm_encoded = Payloads::with_room(0, 0);
    let warm = encode_all(
        &mut enc,
        start,
        &wal[..split],
        sizes,
        cores,
        &mut warm_encoded,
    )?;
    let before = enc.wal_stats().cloned().unwrap_or_default();
    let mut encoded = Payloads::with_room(wal.len() - split, message);
    let cpu = micro::process_user_sys_us();
    let t = Instant::now();
    let msgs = encode_all(
        &mut enc,
        timed_start,
        &wal[split..],
        sizes,
        cores,
        &mut encoded,
    )?;
    let mb = (wal.len() - split) as f64 / 1e6;
    let bytes = encoded.total();
    if split > 0 {
        println!("warmed on {} MB (untimed); timed: the rest", split >> 20);
    }
    println!(
        "encode {:.0} MB/s, {bytes} B, {}",
        mb / t.elapsed().as_secs_f64(),
        cpu_since(cpu)
    );
    if let Some(now) = enc.wal_stats() {
        print_stats(&since(&before, now));
    }
    if decode {
        let mut dec = WalDecoder::new(&setup)?;
        dec.set_parallel(cores == Cores::Staged);
        decode_all(
            &mut dec,
            &warm,
            &warm_encoded,
            |i| checksum(warm[i].1),
            cores,
        )?;
        // The relay's downstream gets each message's checksum from the link: computed before
        // the timer, as the bench's replays do.
        let sums: Vec<u64> = msgs.iter().map(|(_, c)| checksum(c)).collect();
        let cpu = micro::process_user_sys_us();
        let t = Instant::now();
        decode_all(&mut dec, &msgs, &encoded, |i| sums[i], cores)?;
        println!(
            "decode {:.0} MB/s, {}",
            mb / t.elapsed().as_secs_f64(),
            cpu_since(cpu)
        );
    }
    Ok(())
}

/// The process's user and kernel CPU seconds since `before` (`micro::process_user_sys_us`):
/// on a machine whose kernel time swings (page faults of new memory), user time is what
/// compares between builds.
fn cpu_since(before: (u64, u64)) -> String {
    let (user, sys) = micro::process_user_sys_us();
    format!(
        "user {:.3} s, kernel {:.3} s",
        user.saturating_sub(before.0) as f64 / 1e6,
        sys.saturating_sub(before.1) as f64 / 1e6
    )
}

/// The encoder's counters for the timed part: images, sections, records, raw bytes.
fn print_stats(st: &CodecStats) {
    println!(
        "images: {} recompressed, {} did not reproduce, {} undecodable, {} opaque",
        st.fpi_recompressed, st.fpi_recompress_mismatch, st.fpi_undecodable, st.fpi_opaque
    );
    let names = [
        "CTRL", "HDR", "DATA", "RAW", "IMG", "PAGE", "MAIN", "LONG", "HIT", "frames",
    ];
    let sections: Vec<String> = names
        .iter()
        .zip(st.section_in.iter().zip(&st.section_out))
        .map(|(n, (i, o))| format!("{n} {:.1} → {:.1}", *i as f64 / 1e6, *o as f64 / 1e6))
        .collect();
    println!("sections MB in → out: {}", sections.join(", "));
    println!(
        "records {}, images {} ({} cache hits: {} identical, the rest in {} B of HIT), \
         image ops by kind {:?}",
        st.records, st.fpis, st.fpi_cache_hits, st.fpi_identical, st.fpi_hit_out, st.image_ops
    );
    println!(
        "raw: {} records cut by a message boundary ({} more held for the next), \
         {} B in → {} B out",
        st.records_split, st.records_held, st.raw_in, st.raw_out
    );
    println!(
        "prunes predicted: {}, of them exactly: {}, their block data exactly: {}, missed by the reason byte alone: {}",
        st.prunes_predicted, st.prunes_exact, st.prunes_data_exact, st.prunes_missed_by_reason
    );
}

/// The counters `now` less `before` (the timed part's, after a warm-up).
fn since(before: &CodecStats, now: &CodecStats) -> CodecStats {
    let sub = |a: &[u64], b: &[u64]| -> Vec<u64> { a.iter().zip(b).map(|(x, y)| x - y).collect() };
    let mut st = now.clone();
    st.fpi_recompressed -= before.fpi_recompressed;
    st.fpi_recompress_mismatch -= before.fpi_recompress_mismatch;
    st.fpi_undecodable -= before.fpi_undecodable;
    st.fpi_opaque -= before.fpi_opaque;
    st.records -= before.records;
    st.fpis -= before.fpis;
    st.fpi_cache_hits -= before.fpi_cache_hits;
    st.fpi_identical -= before.fpi_identical;
    st.fpi_hit_out -= before.fpi_hit_out;
    st.records_split -= before.records_split;
    st.records_held -= before.records_held;
    st.prunes_predicted -= before.prunes_predicted;
    st.prunes_exact -= before.prunes_exact;
    st.prunes_data_exact -= before.prunes_data_exact;
    st.prunes_missed_by_reason -= before.prunes_missed_by_reason;
    st.section_in
        .copy_from_slice(&sub(&now.section_in, &before.section_in));
    st.section_out
        .copy_from_slice(&sub(&now.section_out, &before.section_out));
    st.image_ops
        .copy_from_slice(&sub(&now.image_ops, &before.image_ops));
    st
}
