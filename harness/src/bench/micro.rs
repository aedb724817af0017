//! The one-core replays: WAL of the run through the link codec in the messages the upstream
//! sends while WAL comes faster than it goes (each the next 256 kB, two of the walsender's
//! 128 kB messages, the upstream's `handshake::BATCH_MAX`, after up to 64 kB the one before
//! held back: the head of a record its end cut, `handshake::HOLD_MAX`) on this thread, then
//! through streaming zstd-1 and zstd-3 (flushed per message, as the `zstd` link codec does)
//! on the same bytes, and through what `ssh -C` does to a forwarded stream
//! ([`super::sshc`]; no state to warm beyond its 32 kB window).
//! Speeds are per CPU-second of the whole process (the rest of the process is idle while the
//! replay runs; each pass keeps its payloads in memory touched before its timer starts,
//! [`super::payloads`]), and the wall-clock speed of the WAL-aware codec beside them. Each
//! pass also reports the share of its CPU time spent in the kernel: a one-core pass makes no
//! system call while timed, so that is the kernel handing the WAL-aware codec's growing block
//! and tuple caches memory not touched before (page faults, the pages zeroed; on a virtual
//! machine whose host backs guest memory lazily, far slower than the memory's speed); a staged
//! pass's share also holds its threads' waits and wake-ups. The WAL-aware codec also runs a
//! second time as the relay's stages run it while behind: more than one core allowed, each
//! message staged while the one before is finished (its sections compressed or decompressed
//! on the codec's threads, images checked on a worker); its wall-clock speed is what two
//! cores get through.
//!
//! - [`run`]: the cold window's bytes (at most 512 MB), from fresh codecs, as a relay that
//!   has just started; also what the codec did with each resource manager's records.
//! - [`run_warm`]: the steady window's bytes (at most 512 MB) after the WAL before them (at
//!   most 1 GiB, the default block cache) went through the same codecs untimed, encoded and
//!   restored in turn: a relay that has been running, its caches holding what that WAL
//!   imaged (a cache not yet full still grows while timed, and pays for those first touches).

use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use walrelay_wal::linkcodec::{checksum, CodecKind, Setup, WalDecoder, WalEncoder};
use walrelay_wal::lsn::Lsn;
use walrelay_wal::walcodec::rmgr::rmgr_name;
use walrelay_wal::walcodec::{CodecParams, CodecStats};

use super::payloads::Payloads;

/// Bytes of WAL per message of the replays, after what the message before held back.
pub const MESSAGE: usize = 256 << 10;
/// Most bytes of a message's end held back for the next (the `wal` codec only).
pub const HOLD: usize = 64 << 10;
/// Most WAL a replay times.
pub const MAX_BYTES: u64 = 512 << 20;
const PAGE: u64 = 8192;

/// One codec's pass over the bytes.
#[derive(Debug, Clone, Serialize)]
pub struct Pass {
    pub encoded_bytes: u64,
    /// Per CPU-second (all threads).
    pub encode_mb_s: f64,
    pub decode_mb_s: f64,
    /// Per second of wall-clock time (more than the above when several cores worked).
    pub encode_wall_mb_s: f64,
    pub decode_wall_mb_s: f64,
    /// Of the CPU time, the share spent in the kernel (0 to 1).
    pub encode_kernel_share: f64,
    pub decode_kernel_share: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Replay {
    pub wal_bytes: u64,
    /// One core; and two, messages staged as the relay's stages do while behind.
    pub walrelay: Pass,
    pub walrelay_staged: Pass,
    pub zstd1: Pass,
    pub zstd3: Pass,
    /// zlib level 6 in full `ssh -C` packets (bytes on the wire, packet framing included).
    pub ssh_c: Pass,
    /// What the WAL-aware codec did with each resource manager's records (bytes out are the
    /// records' share of the compressed streams).
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

/// CPU time of the whole process (every thread), nanoseconds.
fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// User and kernel CPU time of the whole process, microseconds (`getrusage`: the kernel
/// splits the total by sampling ticks, so the split gives the share; the total stays
/// [`process_cpu_ns`]'s nanoseconds, as the speeds always used).
pub fn process_user_sys_us() -> (u64, u64) {
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage only writes into the rusage we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (us(ru.ru_utime), us(ru.ru_stime))
}

/// How long a timed stretch took.
#[derive(Debug, Clone, Copy)]
struct Took {
    cpu_secs: f64,
    wall_secs: f64,
    /// Of the CPU time, the share spent in the kernel.
    kernel_share: f64,
}

/// CPU time of the whole process and wall-clock time since [`Stopwatch::start`].
struct Stopwatch {
    cpu_ns: u64,
    user_sys_us: (u64, u64),
    wall: std::time::Instant,
}

impl Stopwatch {
    fn start() -> Stopwatch {
        Stopwatch {
            cpu_ns: process_cpu_ns(),
            user_sys_us: process_user_sys_us(),
            wall: std::time::Instant::now(),
        }
    }

    /// CPU seconds, wall-clock seconds and the kernel's share since the start.
    fn took(&self) -> Took {
        let cpu_secs = process_cpu_ns().saturating_sub(self.cpu_ns) as f64 / 1e9;
        let (user, sys) = process_user_sys_us();
        let user = user.saturating_sub(self.user_sys_us.0);
        let sys = sys.saturating_sub(self.user_sys_us.1);
        Took {
            cpu_secs,
            wall_secs: self.wall.elapsed().as_secs_f64(),
            kernel_share: kernel_share(user, sys),
        }
    }
}

/// `sys` of `user + sys`, 0 when both are 0.
fn kernel_share(user: u64, sys: u64) -> f64 {
    let all = user.saturating_add(sys);
    if all == 0 {
        0.0
    } else {
        sys as f64 / all as f64
    }
}

impl Pass {
    /// The pass over `wal_len` bytes that made `encoded_bytes`, its encode and decode having
    /// taken `enc` and `dec`.
    fn timed(wal_len: usize, encoded_bytes: u64, enc: Took, dec: Took) -> Pass {
        let mb = wal_len as f64 / 1e6;
        let speed = |secs: f64| mb / secs.max(1e-9);
        Pass {
            encoded_bytes,
            encode_mb_s: speed(enc.cpu_secs),
            decode_mb_s: speed(dec.cpu_secs),
            encode_wall_mb_s: speed(enc.wall_secs),
            decode_wall_mb_s: speed(dec.wall_secs),
            encode_kernel_share: enc.kernel_share,
            decode_kernel_share: dec.kernel_share,
        }
    }
}

/// How a pass runs the codec.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Cores {
    /// One message at a time, one core (`set_parallel(false)`).
    One,
    /// As the relay's stages do while behind: more than one core allowed, each message
    /// staged while the one before is finished (`WalEncoder::stage`, `WalDecoder::stage`).
    Staged,
}

/// WAL to replay: `wal`, which starts at `start`, of PostgreSQL `major`; the bytes before
/// `timed_from` go through the codecs untimed first.
#[derive(Clone, Copy)]
struct Recording<'a> {
    major: u32,
    start: Lsn,
    wal: &'a [u8],
    timed_from: usize,
}

impl Recording<'_> {
    /// One codec (`kind` at zstd `level`) over the WAL in messages as [`encode_all`] cuts
    /// them: the bytes before `timed_from` are encoded and restored in turn without being
    /// timed, the rest are encoded, then restored, and timed.
    fn pass(self, kind: CodecKind, level: i32, cores: Cores) -> Result<(Pass, Option<CodecStats>)> {
        let Recording {
            major,
            start,
            wal,
            timed_from,
        } = self;
        let setup = Setup {
            kind,
            zstd_level: level,
            window_log: 23,
            wal: CodecParams {
                pg_major: walrelay_wal::pg::PgMajor::from_number(major),
                block_cache_bytes: 1 << 30,
                zstd_level: 3,
                max_message_bytes: MESSAGE + HOLD,
            },
        };
        let mut enc = WalEncoder::new(&setup)?;
        let mut dec = WalDecoder::new(&setup)?;
        enc.set_parallel(cores == Cores::Staged);
        dec.set_parallel(cores == Cores::Staged);
        let mut out = Vec::new();
        let mut restored = Vec::new();
        let mut cut = Cutter::new(&wal[..timed_from], MESSAGE, HOLD);
        while let Some((from, chunk, hold)) = cut.next_chunk() {
            let at = Lsn(start.0 + from as u64);
            let n = enc.encode_held(at, chunk, hold, &mut out)?;
            cut.took(n);
            let max = MESSAGE + HOLD;
            let sum = checksum(&chunk[..n]);
            dec.decode(at, &out, n, max, sum, &mut restored)?;
        }
        let (start, wal) = (Lsn(start.0 + timed_from as u64), &wal[timed_from..]);
        let mut encoded = Payloads::with_room(wal.len(), MESSAGE);
        let clock = Stopwatch::start();
        let msgs = encode_all(&mut enc, start, wal, (MESSAGE, HOLD), cores, &mut encoded)?;
        let enc_took = clock.took();
        let stats = enc.wal_stats().cloned();
        let sums: Vec<u64> = msgs.iter().map(|(_, c)| checksum(c)).collect();
        let clock = Stopwatch::start();
        decode_all(&mut dec, &msgs, &encoded, |i| sums[i], cores)?;
        let dec_took = clock.took();
        let bytes = encoded.total() as u64;
        Ok((Pass::timed(wal.len(), bytes, enc_took, dec_took), stats))
    }
}

/// `wal` through `ssh -C` ([`super::sshc`]) in reads of [`MESSAGE`] bytes, then restored and
/// compared; one core, timed as the codecs' passes are.
fn ssh_c_pass(wal: &[u8]) -> Result<Pass> {
    let mut tx = super::sshc::SshC::new();
    let mut packets = Payloads::with_room(wal.len(), MESSAGE);
    let clock = Stopwatch::start();
    for chunk in wal.chunks(MESSAGE) {
        tx.send(chunk, Some(&mut packets))?;
    }
    let enc_took = clock.took();
    let mut rx = super::sshc::SshCReceiver::new();
    let mut at = 0;
    let clock = Stopwatch::start();
    for p in packets.iter() {
        let data = rx.receive(p)?;
        anyhow::ensure!(
            wal.get(at..at + data.len()) == Some(data),
            "ssh -C restored other bytes at offset {at}"
        );
        at += data.len();
    }
    anyhow::ensure!(
        at == wal.len(),
        "ssh -C restored {at} of {} bytes",
        wal.len()
    );
    let dec_took = clock.took();
    Ok(Pass::timed(wal.len(), tx.wire_bytes, enc_took, dec_took))
}

/// Cuts WAL into the messages the upstream sends while behind: each the next `message` bytes
/// after what the one before held back, with up to `hold` bytes of its end allowed to be
/// held back for the next (none from the last).
pub struct Cutter<'a> {
    wal: &'a [u8],
    message: usize,
    hold: usize,
    /// Where the next message starts, and where its new bytes end.
    from: usize,
    end: usize,
}

impl<'a> Cutter<'a> {
    pub fn new(wal: &'a [u8], message: usize, hold: usize) -> Cutter<'a> {
        Cutter {
            wal,
            message,
            hold,
            from: 0,
            end: 0,
        }
    }

    /// The next message's offset, bytes and hold; then [`Cutter::took`] with how many of
    /// them it carried.
    pub fn next_chunk(&mut self) -> Option<(usize, &'a [u8], usize)> {
        if self.from >= self.wal.len() {
            return None;
        }
        self.end = (self.end.max(self.from) + self.message).min(self.wal.len());
        let hold = if self.end == self.wal.len() {
            0
        } else {
            self.hold
        };
        Some((self.from, &self.wal[self.from..self.end], hold))
    }

    /// The last message carried its first `n` bytes (the encoder's answer).
    pub fn took(&mut self, n: usize) {
        self.from += n.max(1);
    }
}

/// `wal` (starting at `start`) cut into messages of `(message, hold)` bytes as [`Cutter`]
/// does, and their payloads, in order; [`Cores::Staged`]: each message staged before the one
/// before it is collected.
#[allow(clippy::type_complexity)]
pub fn encode_all<'a>(
    enc: &mut WalEncoder,
    start: Lsn,
    wal: &'a [u8],
    (message, hold): (usize, usize),
    cores: Cores,
    encoded: &mut Payloads,
) -> Result<Vec<(Lsn, &'a [u8])>> {
    let (mut msgs, mut out) = (Vec::new(), Vec::new());
    let mut cut = Cutter::new(wal, message, hold);
    while let Some((from, chunk, hold)) = cut.next_chunk() {
        let at = Lsn(start.0 + from as u64);
        let n = match cores {
            Cores::One => {
                let n = enc.encode_held(at, chunk, hold, &mut out)?;
                encoded.push(&out);
                n
            }
            Cores::Staged => {
                let n = enc.stage_held(at, chunk, hold)?;
                if !msgs.is_empty() && enc.collect(&mut out)? {
                    encoded.push(&out);
                }
                n
            }
        };
        anyhow::ensure!(n > 0 && n <= chunk.len(), "the encoder took {n} bytes");
        msgs.push((at, &chunk[..n]));
        cut.took(n);
    }
    while enc.collect(&mut out)? {
        encoded.push(&out);
    }
    anyhow::ensure!(
        encoded.len() == msgs.len(),
        "a staged message's payload is missing"
    );
    Ok(msgs)
}

/// Restores every message and checks it against `sum(i)`, its checksum (computed
/// beforehand, or then); [`Cores::Staged`]: each payload staged before the message before it
/// is restored.
pub fn decode_all(
    dec: &mut WalDecoder,
    msgs: &[(Lsn, &[u8])],
    encoded: &Payloads,
    sum: impl Fn(usize) -> u64,
    cores: Cores,
) -> Result<()> {
    let mut out = Vec::new();
    let staged = cores == Cores::Staged;
    if let (true, Some(((at, chunk), payload))) = (staged, msgs.first().zip(encoded.get(0))) {
        dec.stage(*at, payload, chunk.len(), chunk.len())?;
    }
    for (i, ((at, chunk), payload)) in msgs.iter().zip(encoded.iter()).enumerate() {
        if let (true, Some(((next, c), p))) = (staged, msgs.get(i + 1).zip(encoded.get(i + 1))) {
            dec.stage(*next, p, c.len(), c.len())?;
        }
        dec.decode(*at, payload, chunk.len(), chunk.len(), sum(i), &mut out)?;
    }
    Ok(())
}

/// The first `max` bytes of `file`, whose WAL starts at `start`, from the first page
/// boundary on (where a walsender's stream starts), and the LSN there.
fn read_wal(file: &Path, start: Lsn, max: u64) -> Result<(Lsn, Vec<u8>)> {
    let mut wal = Vec::new();
    std::fs::File::open(file)
        .with_context(|| format!("opening {}", file.display()))?
        .take(max)
        .read_to_end(&mut wal)?;
    let skip = ((PAGE - start.0 % PAGE) % PAGE) as usize;
    anyhow::ensure!(wal.len() > skip, "no WAL to replay in {}", file.display());
    wal.drain(..skip);
    Ok((Lsn(start.0 + skip as u64), wal))
}

/// Replays the WAL in `file`, which starts at `start`, on the calling thread.
pub fn run(file: &Path, start: Lsn, major: u32) -> Result<Replay> {
    let (start, wal) = read_wal(file, start, MAX_BYTES)?;
    let wal = &wal[..];
    let rec = Recording {
        major,
        start,
        wal,
        timed_from: 0,
    };
    let (walrelay, stats) = rec.pass(CodecKind::Wal, 3, Cores::One)?;
    let (walrelay_staged, _) = rec.pass(CodecKind::Wal, 3, Cores::Staged)?;
    let (zstd1, _) = rec.pass(CodecKind::Zstd, 1, Cores::One)?;
    let (zstd3, _) = rec.pass(CodecKind::Zstd, 3, Cores::One)?;
    let ssh_c = ssh_c_pass(wal)?;
    let stats = stats.unwrap_or_default();
    let mut by_rmgr: Vec<RmgrRow> = stats
        .by_rmgr
        .iter()
        .map(|(id, t)| RmgrRow {
            rmgr: rmgr_name(id),
            records: t.records,
            bytes_in: t.bytes_in,
            bytes_out: t.bytes_out,
        })
        .collect();
    by_rmgr.sort_by_key(|x| std::cmp::Reverse(x.bytes_in));
    Ok(Replay {
        wal_bytes: wal.len() as u64,
        walrelay,
        walrelay_staged,
        zstd1,
        zstd3,
        ssh_c,
        by_rmgr,
        tuple_deltas: stats.tuple_deltas,
        tuple_delta_saved: stats.tuple_delta_saved,
        tuple_misses: stats.tuple_misses,
    })
}

/// Most WAL before the steady window that [`run_warm`] replays first (the default
/// `link.block_cache_bytes`: older pages would mostly have left the cache).
pub const WARM_MAX_BYTES: u64 = 1 << 30;

/// The replay of a window with warm codecs.
#[derive(Debug, Clone, Serialize)]
pub struct WarmReplay {
    /// WAL replayed untimed first, and WAL timed.
    pub warm_bytes: u64,
    pub wal_bytes: u64,
    pub walrelay: Pass,
    pub walrelay_staged: Pass,
    pub zstd1: Pass,
    pub zstd3: Pass,
    pub ssh_c: Pass,
}

/// Replays the WAL in `file` (starting at `start`) on the calling thread, timing only what
/// lies `warm` bytes or more after `start` (from the message boundary at or before it, at
/// most [`MAX_BYTES`] of it); what lies before goes through the codecs untimed first.
pub fn run_warm(file: &Path, start: Lsn, warm: u64, major: u32) -> Result<WarmReplay> {
    let (at, wal) = read_wal(file, start, warm.saturating_add(MAX_BYTES))?;
    let warm = warm.saturating_sub(at.0 - start.0) as usize;
    let timed_from = (warm.min(wal.len().saturating_sub(1)) / MESSAGE) * MESSAGE;
    let rec = Recording {
        major,
        start: at,
        wal: &wal,
        timed_from,
    };
    let (walrelay, _) = rec.pass(CodecKind::Wal, 3, Cores::One)?;
    let (walrelay_staged, _) = rec.pass(CodecKind::Wal, 3, Cores::Staged)?;
    let (zstd1, _) = rec.pass(CodecKind::Zstd, 1, Cores::One)?;
    let (zstd3, _) = rec.pass(CodecKind::Zstd, 3, Cores::One)?;
    let ssh_c = ssh_c_pass(&wal[timed_from..])?;
    Ok(WarmReplay {
        warm_bytes: timed_from as u64,
        wal_bytes: (wal.len() - timed_from) as u64,
        walrelay,
        walrelay_staged,
        zstd1,
        zstd3,
        ssh_c,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_share_is_sys_of_user_plus_sys() {
        assert_eq!(kernel_share(0, 0), 0.0);
        assert_eq!(kernel_share(3, 1), 0.25);
        assert_eq!(kernel_share(0, 5), 1.0);
        assert_eq!(kernel_share(u64::MAX, 1), 1.0 / u64::MAX as f64);
    }
}
