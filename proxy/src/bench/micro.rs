//! Codec micro-benchmark: the primary's WAL of the run (complete segment files), replayed
//! through the codec in 128 kB messages (the walsender's MAX_SEND_SIZE) on one core, then
//! through streaming zstd-3 for comparison. Speeds are per CPU-second of the measuring thread.

use anyhow::Result;
use serde::Serialize;

use crate::config::CodecKind;
use crate::metrics::thread_cpu_ns;
use walrelay_harness::cluster::Cluster;
use walrelay_wal::linkcodec::{checksum, Setup, WalDecoder, WalEncoder};
use walrelay_wal::lsn::Lsn;
use walrelay_wal::walcodec::rmgr::rmgr_name;
use walrelay_wal::walcodec::{CodecParams, CodecStats};

const SEGMENT: u64 = walrelay_wal::segment::WalSegSize::DEFAULT.bytes();
const MESSAGE: usize = 128 * 1024;
const MAX_BYTES: u64 = 512 << 20;

#[derive(Debug, Clone, Serialize)]
pub struct MicroResult {
    pub wal_bytes: u64,
    pub encoded_bytes: u64,
    pub zstd3_bytes: u64,
    pub encode_mb_s: f64,
    pub decode_mb_s: f64,
    pub zstd3_encode_mb_s: f64,
    pub zstd3_decode_mb_s: f64,
    /// What the WAL-aware codec did with each resource manager's records (see
    /// `walcodec::rmgr`: bytes out are the records' share of the compressed streams).
    pub by_rmgr: Vec<RmgrRow>,
    /// Heap tuples sent as deltas, bytes they saved, and tuples without a good reference.
    pub tuple_deltas: u64,
    pub tuple_delta_saved: u64,
    pub tuple_misses: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct RmgrRow {
    pub rmgr: &'static str,
    pub records: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// Reads the complete segments between `from` and `to` (timeline 1) from the primary's pg_wal.
fn read_wal(primary: &Cluster, from: Lsn, to: Lsn) -> Result<(Lsn, Vec<u8>)> {
    let first = from.0 / SEGMENT;
    let last = (to.0 / SEGMENT).min(first + MAX_BYTES / SEGMENT);
    let mut wal = Vec::new();
    for segno in first..last {
        let name = walrelay_wal::segment::WalSegSize::DEFAULT
            .file_name(walrelay_wal::lsn::TimeLineId(1), segno);
        wal.extend_from_slice(&std::fs::read(primary.wal_dir().join(name))?);
    }
    anyhow::ensure!(
        !wal.is_empty(),
        "no complete WAL segment between {from} and {to}"
    );
    Ok((Lsn(first * SEGMENT), wal))
}

/// Encoded bytes, encode and decode MB/s, and the WAL-aware codec's counters.
type Pass = (u64, f64, f64, Option<CodecStats>);

fn pass(kind: CodecKind, major: u32, start: Lsn, wal: &[u8]) -> Result<Pass> {
    let setup = Setup {
        kind,
        zstd_level: 3,
        window_log: 23,
        wal: CodecParams {
            pg_major: walrelay_wal::pg::PgMajor::from_number(major),
            block_cache_bytes: 1 << 30,
            zstd_level: 3,
            max_message_bytes: MESSAGE,
        },
    };
    let mut enc = WalEncoder::new(&setup)?;
    let mut encoded = Vec::new();
    let mut out = Vec::new();
    let t = thread_cpu_ns();
    for (i, chunk) in wal.chunks(MESSAGE).enumerate() {
        enc.encode(Lsn(start.0 + (i * MESSAGE) as u64), chunk, &mut out)?;
        encoded.push(out.clone());
    }
    let enc_s = (thread_cpu_ns() - t) as f64 / 1e9;
    let stats = enc.wal_stats().cloned();
    let sums: Vec<u64> = wal.chunks(MESSAGE).map(checksum).collect();
    let mut dec = WalDecoder::new(&setup)?;
    let t = thread_cpu_ns();
    for (i, (chunk, payload)) in wal.chunks(MESSAGE).zip(&encoded).enumerate() {
        dec.decode(
            Lsn(start.0 + (i * MESSAGE) as u64),
            payload,
            chunk.len(),
            MESSAGE,
            sums[i],
            &mut out,
        )?;
    }
    let dec_s = (thread_cpu_ns() - t) as f64 / 1e9;
    let mb = wal.len() as f64 / 1e6;
    Ok((
        encoded.iter().map(|e| e.len() as u64).sum(),
        mb / enc_s,
        mb / dec_s,
        stats,
    ))
}

pub fn run(primary: &Cluster, major: u32, from: Lsn, to: Lsn) -> Result<MicroResult> {
    let (start, wal) = read_wal(primary, from, to)?;
    let (encoded, e, d, stats) = pass(CodecKind::Wal, major, start, &wal)?;
    let (zbytes, ze, zd, _) = pass(CodecKind::Zstd, major, start, &wal)?;
    let stats = stats.unwrap_or_default();
    Ok(MicroResult {
        wal_bytes: wal.len() as u64,
        encoded_bytes: encoded,
        zstd3_bytes: zbytes,
        encode_mb_s: e,
        decode_mb_s: d,
        zstd3_encode_mb_s: ze,
        zstd3_decode_mb_s: zd,
        by_rmgr: stats
            .by_rmgr
            .iter()
            .map(|(id, t)| RmgrRow {
                rmgr: rmgr_name(id),
                records: t.records,
                bytes_in: t.bytes_in,
                bytes_out: t.bytes_out,
            })
            .collect(),
        tuple_deltas: stats.tuple_deltas,
        tuple_delta_saved: stats.tuple_delta_saved,
        tuple_misses: stats.tuple_misses,
    })
}
