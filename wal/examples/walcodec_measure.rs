//! Payload of the WAL-aware codec against offline `zstd -3` of the same bytes, cold and
//! steady, on WAL recorded from live primaries (`tests/codec_measure.rs` records it).
//!
//! ```sh
//! cargo test -p walrelay --test codec_measure -- --ignored --nocapture   # record (once)
//! cargo run --release -p walrelay-wal --example walcodec_measure -- [options]
//!   --rec pg15-pgbench,pg15-updates   recordings (default: all under <target>/walrec/measure)
//!   --phase cold,steady                cold: a fresh encoder on the load's first 30 s;
//!                                      steady: an encoder warmed on 0-120 s, measured 120-160 s;
//!                                      restart: warmed on 0-120 s, caches saved and restored
//!                                      into a new pair (`walcodec::persist`), 120-150 s
//!   --cut walsender,batch,commit       walsender: ≤128 KiB messages ending at multiples of
//!                                      128 KiB (as `tests/codec_pg.rs`); batch: one message per
//!                                      20 ms of flushed WAL (sampled while recording), ≤ 1 MiB;
//!                                      commit: a message after every commit record (today's
//!                                      walsender under many small transactions; default: the
//!                                      first two)
//!   --cache BYTES                      block_cache_bytes (default 1 GiB, the link default)
//!   --dir DIR                          where the recordings are
//!   --brief                            one line per case, no breakdown
//! ```
//!
//! Every message is decoded and compared. The denominator is `zstd -3` of the measured byte
//! range as one frame (what the CLI does with a file); `flushed` is streaming zstd-3 flushed
//! at the same cuts (a generic compressing link). Byte counts are deterministic; MB/s is thread
//! CPU time of this process (noisy on a shared machine).

use std::path::{Path, PathBuf};

use walrelay_wal::lsn::Lsn;
use walrelay_wal::pg::PgMajor;
use walrelay_wal::walcodec::rmgr::rmgr_name;
use walrelay_wal::walcodec::{CodecParams, CodecStats, Decoder, Encoder};

struct Recording {
    name: String,
    major: u32,
    start: u64,
    load_start: u64,
    /// (ms since the load started, flushed LSN).
    samples: Vec<(u64, u64)>,
    bytes: Vec<u8>,
}

impl Recording {
    fn load(dir: &Path, name: &str) -> Recording {
        let meta = std::fs::read_to_string(dir.join(format!("{name}.txt")))
            .unwrap_or_else(|e| panic!("{name}.txt: {e}"));
        let field = |k: &str| -> u64 {
            meta.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("{name}.txt: no {k}"))
        };
        let samples = meta
            .lines()
            .skip_while(|l| *l != "samples:")
            .skip(1)
            .filter_map(|l| {
                let (t, lsn) = l.split_once(' ')?;
                Some((t.parse().ok()?, lsn.parse().ok()?))
            })
            .collect();
        let bytes = std::fs::read(dir.join(format!("{name}.wal"))).unwrap();
        Recording {
            name: name.to_string(),
            major: field("major") as u32,
            start: field("start_lsn"),
            load_start: field("load_start_lsn"),
            samples,
            bytes,
        }
    }

    /// The flushed LSN sampled first at or after `ms` into the load (the last one if none).
    fn lsn_at(&self, ms: u64) -> u64 {
        self.samples
            .iter()
            .find(|(t, _)| *t >= ms)
            .or(self.samples.last())
            .map_or(self.load_start, |s| s.1)
    }

    fn slice(&self, from: u64, to: u64) -> &[u8] {
        &self.bytes[(from - self.start) as usize..(to - self.start) as usize]
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Cut {
    Walsender,
    Batch,
    Commit,
}

/// Message ends (absolute LSNs) for `from..to`, the last one `to`.
fn cuts(rec: &Recording, cut: Cut, from: u64, to: u64) -> Vec<u64> {
    const W: u64 = 128 * 1024;
    const MAX_BATCH: u64 = 1 << 20;
    let mut ends = Vec::new();
    match cut {
        Cut::Walsender => {
            let mut at = (from / W + 1) * W;
            while at < to {
                ends.push(at);
                at += W;
            }
        }
        Cut::Commit => ends = commit_ends(rec, from, to),
        Cut::Batch => {
            let mut last = from;
            let mut next_ms = 0;
            for &(t, lsn) in &rec.samples {
                if t < next_ms || lsn <= last || lsn >= to {
                    continue;
                }
                while lsn - last > MAX_BATCH {
                    last += MAX_BATCH;
                    ends.push(last);
                }
                ends.push(lsn);
                last = lsn;
                next_ms = t + 20;
            }
            while to - last > MAX_BATCH {
                last += MAX_BATCH;
                ends.push(last);
            }
        }
    }
    ends.push(to);
    ends
}

/// Ends of the commit records in `from..to`: a message per commit, as a walsender sends when
/// every commit flushes.
fn commit_ends(rec: &Recording, from: u64, to: u64) -> Vec<u64> {
    const PAGE: u64 = 8192;
    let after = from;
    let from = from / PAGE * PAGE;
    let b = |pos: u64| rec.slice(pos, pos + 1)[0];
    let u16_at = |pos: u64| u16::from(b(pos)) | u16::from(b(pos + 1)) << 8;
    let u32_at = |pos: u64| u32::from(u16_at(pos)) | u32::from(u16_at(pos + 2)) << 16;
    let hdr_len = |page: u64| if u16_at(page + 2) & 2 != 0 { 40 } else { 24 };
    // Moves `pos` over `n` bytes of record data, skipping page headers (u64::MAX past `to`).
    let skip = |mut pos: u64, mut n: u64| -> u64 {
        while n > 0 {
            if pos + 40 > to {
                return u64::MAX;
            }
            if pos % PAGE == 0 {
                pos += hdr_len(pos);
            }
            let take = n.min(PAGE - pos % PAGE);
            pos += take;
            n -= take;
        }
        pos
    };
    let mut ends = Vec::new();
    // The first record starting on the first page.
    let rem = u64::from(u32_at(from + 16));
    let mut pos = if u16_at(from + 2) & 1 != 0 && rem > 0 {
        skip(from, rem).min(to)
    } else {
        from + hdr_len(from)
    };
    pos = pos.next_multiple_of(8);
    while pos + 24 + 2 * PAGE < to {
        if pos % PAGE == 0 {
            pos += hdr_len(pos);
        }
        let tot = u64::from(u32_at(pos));
        if tot == 0 {
            // After XLOG_SWITCH or at the end: the next segment.
            pos = (pos / (16 << 20) + 1) * (16 << 20);
            continue;
        }
        // Byte k of the record is at skip(pos, k + 1) - 1: xl_info is byte 16, xl_rmid 17.
        let info_pos = skip(pos, 17) - 1;
        let rmid_pos = skip(pos, 18) - 1;
        let end = skip(pos, tot);
        if end == u64::MAX {
            break;
        }
        let end = end.next_multiple_of(8);
        if b(rmid_pos) == 1 && b(info_pos) & 0x70 == 0 && end > after && end < to {
            ends.push(end);
        }
        pos = end;
    }
    ends
}

fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// The encoder and decoder of one session, fed message by message.
struct Session {
    enc: Encoder,
    dec: Decoder,
    payload: Vec<u8>,
    restored: Vec<u8>,
    enc_secs: f64,
    dec_secs: f64,
    payload_bytes: u64,
    messages: u64,
}

impl Session {
    fn new(p: &CodecParams) -> Session {
        Session {
            enc: Encoder::new(p).unwrap(),
            dec: Decoder::new(p).unwrap(),
            payload: Vec::new(),
            restored: Vec::new(),
            enc_secs: 0.0,
            dec_secs: 0.0,
            payload_bytes: 0,
            messages: 0,
        }
    }

    fn run(&mut self, rec: &Recording, from: u64, ends: &[u64]) {
        let mut at = from;
        for &end in ends {
            let msg = rec.slice(at, end);
            let t = thread_cpu();
            self.enc.encode(Lsn(at), msg, &mut self.payload).unwrap();
            let t2 = thread_cpu();
            self.dec
                .decode(Lsn(at), &self.payload, msg.len(), &mut self.restored)
                .unwrap();
            self.dec_secs += thread_cpu() - t2;
            self.enc_secs += t2 - t;
            assert!(
                self.restored == msg,
                "{}: message at {} differs",
                rec.name,
                Lsn(at)
            );
            self.payload_bytes += self.payload.len() as u64;
            self.messages += 1;
            at = end;
        }
    }
}

fn zstd3_offline(b: &[u8]) -> u64 {
    zstd::bulk::compress(b, 3).unwrap().len() as u64
}

fn zstd3_flushed(rec: &Recording, from: u64, ends: &[u64]) -> u64 {
    use zstd::stream::raw::{Encoder as ZEncoder, InBuffer, Operation, OutBuffer};
    let mut enc = ZEncoder::new(3).unwrap();
    let mut out = vec![0u8; 1 << 21];
    let (mut at, mut total) = (from, 0u64);
    for &end in ends {
        let msg = rec.slice(at, end);
        let mut input = InBuffer::around(msg);
        while input.pos() < msg.len() {
            let mut o = OutBuffer::around(&mut out[..]);
            enc.run(&mut input, &mut o).unwrap();
            total += o.pos() as u64;
        }
        loop {
            let mut o = OutBuffer::around(&mut out[..]);
            let left = enc.flush(&mut o).unwrap();
            total += o.pos() as u64;
            if left == 0 {
                break;
            }
        }
        at = end;
    }
    total
}

struct Opts {
    recs: Vec<String>,
    phases: Vec<String>,
    cuts: Vec<Cut>,
    cache: usize,
    dir: PathBuf,
    brief: bool,
}

fn opts() -> Opts {
    let mut o = Opts {
        recs: Vec::new(),
        phases: vec!["cold".into(), "steady".into()],
        cuts: vec![Cut::Walsender, Cut::Batch],
        cache: 1 << 30,
        dir: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/walrec/measure"),
        brief: false,
    };
    let mut args = std::env::args().skip(1);
    let list = |v: Option<String>| -> Vec<String> {
        v.unwrap_or_default()
            .split(',')
            .map(str::to_string)
            .collect()
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rec" => o.recs = list(args.next()),
            "--phase" => o.phases = list(args.next()),
            "--cut" => {
                o.cuts = list(args.next())
                    .iter()
                    .map(|c| match c.as_str() {
                        "walsender" => Cut::Walsender,
                        "batch" => Cut::Batch,
                        "commit" => Cut::Commit,
                        _ => panic!("--cut walsender,batch,commit"),
                    })
                    .collect()
            }
            "--cache" => o.cache = args.next().and_then(|v| v.parse().ok()).expect("--cache N"),
            "--dir" => o.dir = PathBuf::from(args.next().expect("--dir DIR")),
            "--brief" => o.brief = true,
            _ => panic!("unknown argument {a} (see the example's docs)"),
        }
    }
    if o.recs.is_empty() {
        let mut names: Vec<String> = std::fs::read_dir(&o.dir)
            .unwrap_or_else(|e| panic!("{}: {e}", o.dir.display()))
            .filter_map(|e| {
                let n = e.ok()?.file_name().into_string().ok()?;
                n.strip_suffix(".txt").map(str::to_string)
            })
            .collect();
        names.sort();
        o.recs = names;
    }
    o
}

fn main() {
    let o = opts();
    println!(
        "| recording | phase | cut | WAL MB | msgs | zstd-3 MB | codec MB | codec / zstd-3 | flushed zstd-3 / zstd-3 | enc MB/s | dec MB/s |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut notes = String::new();
    for name in &o.recs {
        let rec = Recording::load(&o.dir, name);
        let p = CodecParams {
            pg_major: PgMajor::from_number(rec.major),
            block_cache_bytes: o.cache,
            zstd_level: 3,
            max_message_bytes: 4 << 20,
        };
        let begin = rec.load_start / 8192 * 8192;
        for phase in &o.phases {
            let (warm, from, to) = match phase.as_str() {
                "cold" => (None, begin, rec.lsn_at(30_000)),
                "steady" => (Some(begin), rec.lsn_at(120_000), rec.lsn_at(160_000)),
                // As steady, but the warmed pair saves its caches and a new pair restored
                // from them takes over at a page boundary (a restart with `persist`).
                "restart" => (
                    Some(begin),
                    rec.lsn_at(120_000) / 8192 * 8192,
                    rec.lsn_at(150_000),
                ),
                p => panic!("unknown phase {p}"),
            };
            let zstd = zstd3_offline(rec.slice(from, to));
            for &cut in &o.cuts {
                let mut s = Session::new(&p);
                let mut base = CodecStats::default();
                if let Some(w) = warm {
                    s.run(&rec, w, &cuts(&rec, cut, w, from));
                    base = s.enc.stats().clone();
                    (s.enc_secs, s.dec_secs, s.payload_bytes, s.messages) = (0.0, 0.0, 0, 0);
                    if phase == "restart" {
                        let (se, sd) = (s.enc.save_caches(), s.dec.save_caches().unwrap());
                        assert_eq!(se.digest, sd.digest, "the two ends saved different caches");
                        s.enc = Encoder::with_caches(&p, &se.bytes).unwrap();
                        s.dec = Decoder::with_caches(&p, &sd.bytes).unwrap();
                        base = CodecStats::default();
                    }
                }
                let ends = cuts(&rec, cut, from, to);
                s.run(&rec, from, &ends);
                let flushed = zstd3_flushed(&rec, from, &ends);
                let mb = (to - from) as f64 / 1e6;
                println!(
                    "| {name} | {phase} | {cut:?} | {mb:.1} | {} | {:.2} | {:.2} | **{:.3}** | {:.3} | {:.0} | {:.0} |",
                    s.messages,
                    zstd as f64 / 1e6,
                    s.payload_bytes as f64 / 1e6,
                    s.payload_bytes as f64 / zstd as f64,
                    flushed as f64 / zstd as f64,
                    mb / s.enc_secs,
                    mb / s.dec_secs,
                );
                if !o.brief {
                    let d = delta(&base, s.enc.stats());
                    notes.push_str(&breakdown(&format!("{name} {phase} {cut:?}"), &d, zstd));
                }
            }
        }
    }
    print!("{notes}");
}

/// The counters of `b` minus those of `a` (what the measured range did).
fn delta(a: &CodecStats, b: &CodecStats) -> Delta {
    let mut d = Delta {
        sections: [0; 9],
        header: b.header_out - a.header_out,
        ops: [0; 8],
        frames: [0; 8],
        rmgr: Vec::new(),
        fpi_in: b.fpi_in - a.fpi_in,
        data_in: b.data_in - a.data_in,
        hdr_in: b.record_header_in - a.record_header_in,
        raw_in: b.raw_in - a.raw_in,
        tuple: (
            b.tuple_deltas - a.tuple_deltas,
            b.tuple_misses - a.tuple_misses,
            b.tuple_delta_saved - a.tuple_delta_saved,
        ),
        split: b.records_split - a.records_split,
        fpi_opaque: b.fpi_opaque - a.fpi_opaque,
        recompressed: b.fpi_recompressed - a.fpi_recompressed,
    };
    for (i, s) in d.sections.iter_mut().enumerate() {
        *s = b.section_out[i] - a.section_out[i];
    }
    for i in 0..8 {
        d.ops[i] = b.image_ops[i] - a.image_ops[i];
        d.frames[i] = b.image_frame_out[i] - a.image_frame_out[i];
    }
    for id in 0..=255u8 {
        let (x, y) = (a.by_rmgr.get(id), b.by_rmgr.get(id));
        if y.records > x.records {
            d.rmgr.push((
                id,
                y.records - x.records,
                y.bytes_in - x.bytes_in,
                y.bytes_out - x.bytes_out,
            ));
        }
    }
    d.rmgr.sort_by_key(|r| std::cmp::Reverse(r.3));
    d
}

struct Delta {
    sections: [u64; 9],
    header: u64,
    ops: [u64; 8],
    frames: [u64; 8],
    rmgr: Vec<(u8, u64, u64, u64)>,
    fpi_in: u64,
    data_in: u64,
    hdr_in: u64,
    raw_in: u64,
    /// Tuple deltas, misses, bytes saved.
    tuple: (u64, u64, u64),
    split: u64,
    fpi_opaque: u64,
    recompressed: u64,
}

fn breakdown(label: &str, d: &Delta, zstd: u64) -> String {
    const NAMES: [&str; 10] = [
        "CTRL", "HDR", "DATA", "RAW", "IMG", "PAGE", "MAIN", "LONG", "HIT", "FPI",
    ];
    const OPS: [&str; 8] = [
        "opaque",
        "new",
        "same",
        "ref",
        "ident",
        "nocache",
        "stream",
        "stream-nc",
    ];
    let total: u64 = d.sections.iter().sum::<u64>() + d.header;
    let pct = |x: u64| 100.0 * x as f64 / zstd as f64;
    let mut s = format!(
        "\n{label}: payload {total} bytes = {:.1}% of zstd-3\n  sections (% of zstd-3):",
        pct(total)
    );
    for (n, b) in NAMES.iter().zip(d.sections) {
        s.push_str(&format!(" {n} {:.1}", pct(b)));
    }
    s.push_str(&format!(" header {:.1}\n  images:", pct(d.header)));
    for (i, n) in OPS.iter().enumerate() {
        if d.ops[i] > 0 {
            s.push_str(&format!(
                " {n} {} ({:.0} B/frame)",
                d.ops[i],
                d.frames[i] as f64 / d.ops[i] as f64
            ));
        }
    }
    s.push_str(&format!(
        "; {} recompressed, {} opaque\n  in: images {:.1} MB, data {:.1} MB, record headers {:.1} MB, raw {:.1} MB ({} records split); tuple deltas {} / misses {}, {} B saved\n  by rmgr (out % of zstd-3, out/in):",
        d.recompressed,
        d.fpi_opaque,
        d.fpi_in as f64 / 1e6,
        d.data_in as f64 / 1e6,
        d.hdr_in as f64 / 1e6,
        d.raw_in as f64 / 1e6,
        d.split,
        d.tuple.0,
        d.tuple.1,
        d.tuple.2
    ));
    for (id, _n, bin, bout) in &d.rmgr {
        s.push_str(&format!(
            " {} {:.1} ({:.3})",
            rmgr_name(*id),
            pct(*bout),
            *bout as f64 / (*bin).max(1) as f64
        ));
    }
    s.push('\n');
    s
}
