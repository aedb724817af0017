//! Real WAL: a PostgreSQL 15 primary runs pgbench (with checkpoints, so that full-page images
//! come back), then its pg_wal segments from a segment boundary up to the flush position are
//! round-tripped in random chunks and compared with generic streaming zstd-3.
#![deny(clippy::undocumented_unsafe_blocks)]

use std::path::Path;
use std::str::FromStr;

use walrelay_harness::cluster::{Cluster, PgInstall, PrimaryOpts, TempRoot};
use walrelay_wal::lsn::{Lsn, TimeLineId};
use walrelay_wal::pg::PgMajor;
use walrelay_wal::segment::WalSegSize;
use walrelay_wal::walcodec::testgen::{Entropy, Rng};
use walrelay_wal::walcodec::*;

/// Reads the WAL of timeline 1 in `dir` from its first segment up to `upto`; returns (start
/// LSN, bytes).
fn read_wal(dir: &Path, seg_size: WalSegSize, upto: u64) -> (u64, Vec<u8>) {
    let mut segs: Vec<u64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let (tli, segno) = seg_size.parse_file_name(&name)?;
            (tli == TimeLineId(1)).then_some(segno)
        })
        .collect();
    segs.sort_unstable();
    let first = segs[0];
    let mut wal = Vec::new();
    for (i, segno) in segs.iter().enumerate() {
        if *segno != first + i as u64 || segno * seg_size.bytes() >= upto {
            break;
        }
        let name = seg_size.file_name(TimeLineId(1), *segno);
        wal.extend_from_slice(&std::fs::read(dir.join(name)).unwrap());
    }
    let start = first * seg_size.bytes();
    wal.truncate((upto - start) as usize);
    (start, wal)
}

/// Cuts `len` bytes into random messages of 1..=128 KiB.
fn random_cuts(len: usize, seed: u64) -> Vec<usize> {
    let mut rng = Rng::new(seed);
    let mut cuts = Vec::new();
    let mut at = 0;
    loop {
        at += 1 + rng.below(128 * 1024) as usize;
        if at >= len {
            return cuts;
        }
        cuts.push(at);
    }
}

/// Cuts like a walsender under load: 128 KiB messages ending on page boundaries.
fn walsender_cuts(start: u64, len: usize) -> Vec<usize> {
    let first = (128 * 1024 - (start % (128 * 1024)) as usize) % (128 * 1024);
    (0..)
        .map(|i| first + i * 128 * 1024)
        .skip_while(|&c| c == 0)
        .take_while(|&c| c < len)
        .collect()
}

/// CPU time of this thread, in seconds (throughput per core, whatever else the machine runs).
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

struct Run {
    payload: usize,
    enc_secs: f64,
    dec_secs: f64,
    stats: CodecStats,
}

fn run_codec(p: &CodecParams, start: u64, wal: &[u8], cuts: &[usize]) -> Run {
    let mut enc = Encoder::new(p).unwrap();
    let mut dec = Decoder::new(p).unwrap();
    let mut payloads = Vec::new();
    let mut at = 0;
    let t = thread_cpu();
    for end in cuts.iter().copied().chain([wal.len()]) {
        let mut out = Vec::new();
        enc.encode(Lsn(start + at as u64), &wal[at..end], &mut out)
            .unwrap();
        payloads.push((at, end, out));
        at = end;
    }
    let enc_secs = thread_cpu() - t;
    let mut restored = Vec::with_capacity(256 * 1024);
    let t = thread_cpu();
    for (a, b, pl) in &payloads {
        dec.decode(Lsn(start + *a as u64), pl, b - a, &mut restored)
            .unwrap();
        assert!(
            restored == wal[*a..*b],
            "message at {} differs",
            Lsn(start + *a as u64)
        );
    }
    let dec_secs = thread_cpu() - t;
    Run {
        payload: payloads.iter().map(|(_, _, p)| p.len()).sum(),
        enc_secs,
        dec_secs,
        stats: enc.stats().clone(),
    }
}

/// Generic streaming zstd-3 (window 2^23, flushed every message, like the link's zstd codec):
/// total payload bytes.
fn zstd3(wal: &[u8], cuts: &[usize]) -> usize {
    use zstd::stream::raw::{CParameter, Encoder as ZEncoder, InBuffer, Operation, OutBuffer};
    let mut enc = ZEncoder::new(3).unwrap();
    enc.set_parameter(CParameter::WindowLog(23)).unwrap();
    let mut out = vec![0u8; 1 << 20];
    let mut at = 0;
    let mut total = 0;
    for end in cuts.iter().copied().chain([wal.len()]) {
        let mut input = InBuffer::around(&wal[at..end]);
        while input.pos() < end - at {
            let mut o = OutBuffer::around(&mut out[..]);
            enc.run(&mut input, &mut o).unwrap();
            total += o.pos();
        }
        loop {
            let mut o = OutBuffer::around(&mut out[..]);
            let left = enc.flush(&mut o).unwrap();
            total += o.pos();
            if left == 0 {
                break;
            }
        }
        at = end;
    }
    total
}

/// Round-trips `wal` in random and walsender-like chunks; prints the numbers; returns the
/// ratio to zstd-3 and the stats for the random chunking.
fn measure(label: &str, p: &CodecParams, start: u64, wal: &[u8]) -> (f64, CodecStats) {
    let mut first = None;
    for (name, cuts) in [
        ("random 1..128KiB", random_cuts(wal.len(), 7)),
        ("walsender 128KiB", walsender_cuts(start, wal.len())),
    ] {
        let t = thread_cpu();
        let z = zstd3(wal, &cuts);
        let z_secs = thread_cpu() - t;
        let r = run_codec(p, start, wal, &cuts);
        let mb = wal.len() as f64 / 1e6;
        println!(
            "{label} [{name}]: {} bytes of WAL at {}: walcodec {} bytes ({:.3} of zstd-3's {z}; \
             {:.1}x); per CPU second: encode {:.0} MB/s, decode {:.0} MB/s (zstd-3 encode {:.0} MB/s)",
            wal.len(),
            Lsn(start),
            r.payload,
            r.payload as f64 / z as f64,
            wal.len() as f64 / r.payload as f64,
            mb / r.enc_secs,
            mb / r.dec_secs,
            mb / z_secs,
        );
        println!("  {:?}", r.stats);
        if first.is_none() {
            first = Some((r.payload as f64 / z as f64, r.stats));
        }
    }
    first.unwrap_or_default()
}

/// Per resource manager: every encoded record counted once, Heap and Btree carry most bytes,
/// and the attributed output stays within what was sent.
fn rmgr_tallies_add_up(stats: &CodecStats) {
    let by: Vec<_> = stats.by_rmgr.iter().collect();
    let records: u64 = by.iter().map(|(_, t)| t.records).sum();
    let (rin, rout): (u64, u64) = by
        .iter()
        .fold((0, 0), |(a, b), (_, t)| (a + t.bytes_in, b + t.bytes_out));
    assert_eq!(records, stats.records, "{by:?}");
    assert!(
        rin <= stats.bytes_in && rout <= stats.bytes_out,
        "{by:?} vs {stats:?}"
    );
    let heap = by
        .iter()
        .find(|(id, _)| rmgr::rmgr_name(*id) == "Heap")
        .map(|x| x.1);
    assert!(
        heap.is_some_and(|h| h.bytes_in > rin / 4 && h.bytes_out > 0),
        "{by:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg15_pgbench_wal_round_trips() {
    let pg15 = Path::new("/usr/lib/postgresql/15/bin");
    let install = if pg15.join("postgres").is_file() {
        PgInstall::from_bindir(pg15).unwrap()
    } else {
        PgInstall::discover().expect("PostgreSQL binaries (see scripts/install-deps.sh)")
    };
    let root = TempRoot::new().unwrap();
    let opts = PrimaryOpts {
        checkpoint_timeout: "30s".into(),
        ..PrimaryOpts::default()
    };
    let primary = Cluster::init_primary(&install, &root, "walcodec", &opts).unwrap();
    primary.start().await.unwrap();

    let bench = |args: &'static [&'static str]| {
        let mut cmd = primary.pgbench(args);
        async move {
            let out = tokio::task::spawn_blocking(move || cmd.output())
                .await
                .unwrap()
                .unwrap();
            assert!(
                out.status.success(),
                "pgbench: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    };
    bench(&["-i", "-s", "3", "-q", "postgres"]).await;
    primary.execute("CHECKPOINT").await.unwrap();
    // Three rounds of pgbench, each after a checkpoint: the same hot blocks get full-page
    // images again in every round.
    for round in 0..3 {
        bench(&["-t", "400", "-c", "4", "-j", "2", "-n", "postgres"]).await;
        if round == 0 {
            // An XLOG_SWITCH, whose zero-filled segment tail the codec sends as a count.
            primary.execute("SELECT pg_switch_wal()").await.unwrap();
        }
        primary.execute("CHECKPOINT").await.unwrap();
    }
    bench(&["-t", "200", "-c", "4", "-j", "2", "-n", "postgres"]).await;
    let flush = primary
        .query_one_string("SELECT pg_current_wal_flush_lsn()::text")
        .await
        .unwrap();
    let flush = Lsn::from_str(&flush).unwrap();
    let (start, wal) = read_wal(&primary.wal_dir(), WalSegSize::DEFAULT, flush.0);
    assert!(wal.len() > 1 << 20, "only {} bytes of WAL", wal.len());

    let p = CodecParams {
        pg_major: Some(PgMajor::try_from(install.major).unwrap()),
        block_cache_bytes: 256 << 20,
        zstd_level: 3,
        max_message_bytes: 4 << 20,
    };
    let (ratio, stats) = measure("PG15 pgbench", &p, start, &wal);
    // Everything from the segment start is understood: no lock losses, no record passed raw
    // except those cut by message boundaries, page headers and the switch tail derived.
    assert_eq!((stats.resyncs, stats.records_raw), (0, 0), "{stats:?}");
    assert!(stats.zeros_in > 1 << 20, "{stats:?}");
    assert!(
        stats.page_header_out * 10 < stats.page_header_in,
        "{stats:?}"
    );
    assert!(stats.fpis > 0 && stats.records > 10_000, "{stats:?}");
    rmgr_tallies_add_up(&stats);
    // The WAL after the initial load only (pgbench rounds with checkpoints).
    let (_, tail) = wal.split_at(wal.len() * 2 / 3);
    let tail_start = start + (wal.len() - tail.len()) as u64;
    measure("PG15 pgbench, last third", &p, tail_start, tail);
    assert!(ratio < 1.0, "walcodec should beat zstd-3, got {ratio:.3}");
}

/// wal_level=logical, REPLICA IDENTITY FULL, updates that move rows to other pages (full pages)
/// and deletes: new tuples and the old tuples logical decoding adds travel as deltas against
/// versions both ends hold (the tuple cache, or the page images in the block cache), restore
/// exactly at any chunking, also with a tuple cache so small that it evicts all the time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg15_logical_updates_travel_as_tuple_deltas() {
    let install = PgInstall::discover().expect("PostgreSQL binaries (see scripts/install-deps.sh)");
    let root = TempRoot::new().unwrap();
    let opts = PrimaryOpts {
        wal_level: "logical".into(),
        ..PrimaryOpts::default()
    };
    let primary = Cluster::init_primary(&install, &root, "tuples", &opts).unwrap();
    primary.start().await.unwrap();
    primary
        .execute(
            "create table movers (id int primary key, n int not null default 0, payload text) \
               with (fillfactor = 100);
             alter table movers replica identity full;
             insert into movers select g, 0, (select string_agg(md5(random()::text || i), '') \
               from generate_series(1, 8 + 0 * g) i) from generate_series(1, 4000) g;
             checkpoint;",
        )
        .await
        .unwrap();
    let start_lsn = primary
        .query_one_string("select pg_current_wal_lsn()::text")
        .await
        .unwrap();
    primary
        .execute(
            "update movers set n = n + 1 where id % 3 = 0;
             update movers set n = n + 1 where id % 5 = 0;
             delete from movers where id % 7 = 0;
             checkpoint;
             update movers set n = n + 1 where id % 4 = 0;",
        )
        .await
        .unwrap();
    let flush = primary
        .query_one_string("select pg_current_wal_flush_lsn()::text")
        .await
        .unwrap();
    let seg = WalSegSize::DEFAULT;
    let (seg_start, wal) = read_wal(&primary.wal_dir(), seg, Lsn::from_str(&flush).unwrap().0);
    // From the segment holding the first update on.
    let from =
        (seg.segment_of(Lsn::from_str(&start_lsn).unwrap()) * seg.bytes() - seg_start) as usize;
    let (start, wal) = (seg_start + from as u64, &wal[from..]);
    let params = |cache: usize| CodecParams {
        pg_major: Some(PgMajor::try_from(install.major).unwrap()),
        block_cache_bytes: cache,
        zstd_level: 3,
        max_message_bytes: 4 << 20,
    };
    let (ratio, stats) = measure("PG logical updates", &params(256 << 20), start, wal);
    println!("  zstd-3 ratio {ratio:.3}");
    assert_eq!(stats.resyncs, 0, "{stats:?}");
    // Most updates and deletes carry a tuple that went as a delta, saving most of its bytes.
    assert!(stats.tuple_deltas > 2000, "{stats:?}");
    assert!(
        stats.tuple_delta_saved > stats.tuple_deltas * 200,
        "{stats:?}"
    );
    // Without caches the same WAL costs more: the deltas are what made the difference.
    let (_, bare) = measure("PG logical updates, no caches", &params(0), start, wal);
    assert_eq!(bare.tuple_deltas, 0, "{bare:?}");
    assert!(bare.bytes_out > stats.bytes_out, "{bare:?} vs {stats:?}");
    // A tiny cache (7 page slots, 8 KiB of tuples): constant eviction, still exact.
    let (_, tiny) = measure(
        "PG logical updates, tiny cache",
        &params(64 << 10),
        start,
        wal,
    );
    assert!(tiny.tuple_deltas < stats.tuple_deltas, "{tiny:?}");
}
