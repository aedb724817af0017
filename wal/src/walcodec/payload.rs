//! The payload's framing: which sections a message has and where they are (format version 16;
//! the framing is that of version 3 with an eighth and a ninth stream and `present` a varint,
//! and since 16 the combined mode byte `0x80 |` the version instead of `0x10 |`).
//!
//! ```text
//! payload  = separate | combined
//! separate = 0x10 present:varint clen:varint × (sections present) section × (present) FPI-bytes
//!            present: bit s (0..=8) set when stream s (CTRL, HDR, DATA, RAW, IMG, PAGE, MAIN,
//!            LONG, HIT) has bytes this message, bit 9 when there are page frames (FPI);
//!            each present stream's section is `clen` bytes of its own streaming zstd
//!            context, flushed (ZSTD_e_flush); the FPI bytes are the rest of the payload (bit
//!            9 set iff any)
//! combined = 0x90 clen:varint chunk FPI-bytes
//!            chunk: `clen` bytes of the COMBINED streaming zstd context, flushed, which
//!            decompress to ulen:varint × 9 then the 9 streams' bytes in order; FPI as above
//! ```
//!
//! A message whose streams got fewer than [`COMBINED_MAX`] bytes goes combined: one flush
//! instead of up to nine, no section sizes outside the compressed chunk. Measured with a
//! message per commit (steady, payload / zstd-3): pgbench 0.502 → 0.449, random-payload
//! updates 0.690 → 0.663; 20 ms batches unchanged (bigger messages compress better kept
//! apart, by kind, in their own contexts: all combined was 6 % worse there). The decoder
//! follows the mode byte; each context only ever sees the messages of its mode.
//!
//! Decompressed sizes are capped before anything is allocated (the encoder's output always
//! meets the caps): CTRL 4 × raw_len + 1024, HDR 2 × raw_len + 1024 (since format 12),
//! PAGE 8 × raw_len + 8192, LONG 4 × raw_len + 8192 (DATA's since format 9, LONG's since 11),
//! the others raw_len (HIT's holds because a hit goes there only when it takes no more
//! bytes than its image in the WAL: `hitcode`); the combined chunk their sum plus 90 bytes
//! of lengths.

use super::format::DATA_PAGE_MIN_LEN;
use super::streams::{put_varint, CStream, DStream, Reader, SMALL_WINDOW_LOG, WINDOW_LOG};
use super::wal::PAGE_SIZE;
use super::{
    WalCodecError, FORMAT_VERSION, STREAMS, STREAM_NAMES, S_CTRL, S_DATA, S_HDR, S_HIT, S_LONG,
    S_MAIN, S_PAGE, S_RAW,
};

pub const SEPARATE: u8 = FORMAT_VERSION;
pub const COMBINED: u8 = 0x80 | FORMAT_VERSION;
/// The bit of a separate payload's `present` that says page frames follow the sections
/// (the streams have the bits below it).
const FPI_BIT: usize = STREAMS;
/// Messages whose streams' input is below this go combined.
pub const COMBINED_MAX: usize = 4 * 1024;

/// A separate payload whose compressed sections hold at least this many bytes has them
/// decompressed on several threads at once, when the decoder is asked to use more than one
/// core (`set_parallel`, on by default when the machine has more than one): each section is
/// its own zstd context, so the result is the same either way. Below it, starting threads
/// would cost more than it saves. (The encoder compresses a large message's sections on one
/// thread of their own while it transforms the next message instead: `encoder::sealer`.)
pub const PARALLEL_MIN: usize = 64 * 1024;
/// ... and only sections of at least this many bytes get a thread of their own. With 8 KiB,
/// a bulk load's 128 kB messages (DATA ~100 kB, kept on this thread, and HDR ~12 kB, given a
/// thread started and joined for the message) encoded 5–10 % slower on two cores than on
/// one when the encoder did the same; with 32 KiB, as fast as on one (recorded PG 15 WAL,
/// `codec_profile`, medians of three: bulk 304 → 332 MB/s; pgbench, TOAST rewrites, updates,
/// COPY and images the same within noise).
const PARALLEL_SECTION_MIN: usize = 32 * 1024;

/// Whether this machine has more than one core (asked once).
pub(super) fn multi_core() -> bool {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get())) > 1
}

/// Runs `f` on every `(index, item)`: the items of at least [`PARALLEL_SECTION_MIN`] by
/// `size` but the largest on threads of their own when `parallel`, the rest on this thread.
/// Returns the first error by index.
fn each_section<T: Send>(
    items: Vec<(usize, T)>,
    size: impl Fn(&T) -> usize,
    parallel: bool,
    f: impl Fn(usize, T) -> Result<(), WalCodecError> + Sync,
) -> Result<(), WalCodecError> {
    if !parallel {
        return items.into_iter().try_for_each(|(i, t)| f(i, t));
    }
    let largest = items.iter().map(|(_, t)| size(t)).max().unwrap_or(0);
    let (mut here, mut away) = (Vec::new(), Vec::new());
    let mut kept_largest = false;
    for (i, t) in items {
        let n = size(&t);
        if n < PARALLEL_SECTION_MIN || (n == largest && !kept_largest) {
            kept_largest |= n == largest;
            here.push((i, t));
        } else {
            away.push((i, t));
        }
    }
    std::thread::scope(|sc| {
        let f = &f;
        let spawned: Vec<_> = away
            .into_iter()
            .map(|(i, t)| (i, sc.spawn(move || f(i, t))))
            .collect();
        let mut results: Vec<(usize, Result<(), WalCodecError>)> =
            here.into_iter().map(|(i, t)| (i, f(i, t))).collect();
        for (i, h) in spawned {
            let r = h.join().unwrap_or_else(|_| {
                Err(WalCodecError::Corrupt("a section's thread panicked".into()))
            });
            results.push((i, r));
        }
        results.sort_by_key(|(i, _)| *i);
        results.into_iter().try_for_each(|(_, r)| r)
    })
}

/// The largest number of bytes stream `s` may restore to for a message of `raw_len` bytes:
/// PAGE's pages may stand for images of 1 kB, LONG's for images of at least
/// [`DATA_PAGE_MIN_LEN`] (format 9, `format::page_stream`) beside the records' data.
pub fn cap(s: usize, raw_len: usize) -> usize {
    match s {
        S_CTRL => raw_len.saturating_mul(4).saturating_add(1024),
        // A block reference's relation and block number may take 2 bytes more than in the
        // WAL (`areaxf`), and it takes 8 at least, with a record of 24 around it.
        S_HDR => raw_len.saturating_mul(2).saturating_add(1024),
        S_PAGE => raw_len.saturating_mul(8).saturating_add(PAGE_SIZE),
        S_LONG => raw_len
            .saturating_mul(PAGE_SIZE / DATA_PAGE_MIN_LEN)
            .saturating_add(PAGE_SIZE),
        _ => raw_len,
    }
}

/// The encoder's zstd contexts: one per stream and the combined one, with their buffers.
/// Owned by whichever thread compresses the message (see the encoder's `sealer`).
pub struct Sections {
    streams: Vec<CStream>,
    combined: CStream,
    /// The combined chunk's input.
    joined: Vec<u8>,
    /// Each stream's compressed section.
    scratch: [Vec<u8>; STREAMS],
}

impl Sections {
    /// The contexts for streams compressed at `level` (CTRL, HDR and MAIN with the match
    /// finding of `streams::STRUCTURAL`), HIT at `hit_level`; LONG keeps
    /// `data_log` of history (with long-distance matching), DATA, RAW, PAGE and MAIN
    /// [`WINDOW_LOG`], the rest less.
    pub fn new(level: i32, hit_level: i32, data_log: u32) -> Result<Sections, WalCodecError> {
        let streams = (0..STREAMS)
            .map(|s| {
                let wlog = match s {
                    S_LONG => data_log,
                    S_DATA | S_RAW | S_PAGE | S_MAIN => WINDOW_LOG,
                    _ => SMALL_WINDOW_LOG,
                };
                match s {
                    S_HIT => CStream::new(hit_level, wlog),
                    S_CTRL | S_HDR | S_MAIN => CStream::structural(level, wlog),
                    _ => CStream::new(level, wlog),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Sections {
            streams,
            combined: CStream::new(level, WINDOW_LOG)?,
            joined: Vec::new(),
            scratch: Default::default(),
        })
    }

    /// The fast settings for the next messages' bulk streams, or the normal ones
    /// ([`CStream::set_fast`]: each stream changes at its next input).
    ///
    /// DATA, LONG, PAGE and RAW go to the fast level: where a bulk load's bytes go, and where
    /// zstd's own time is most of the encoding. The structural streams (CTRL, HDR, MAIN), IMG
    /// and the combined chunk of small messages keep their level: on pgbench WAL, where zstd
    /// is a quarter of the encoding, they took most of the 9.5 % more bytes that every stream
    /// at the fast settings cost, for no speed (`docs/keeping-up.md`, thirty-seventh round).
    /// CTRL, HDR and MAIN only go back from `streams::STRUCTURAL`'s match finding to zstd's
    /// own at their level, which encodes pgbench WAL 14–16 % faster for 6 % more bytes.
    pub fn set_fast(&mut self, fast: bool) {
        for s in [S_DATA, S_LONG, S_PAGE, S_RAW, S_CTRL, S_HDR, S_MAIN] {
            self.streams[s].set_fast(fast);
        }
    }

    /// Writes the payload of one message: the streams' gathered bytes `bufs` (cleared),
    /// then `fpi`. `clens` gets each stream's share of the payload (the combined chunk is
    /// shared out by input bytes), for the counters.
    pub fn write(
        &mut self,
        bufs: &mut [Vec<u8>; STREAMS],
        fpi: &[u8],
        out: &mut Vec<u8>,
        clens: &mut [usize; STREAMS],
    ) -> Result<(), WalCodecError> {
        let ulens: [usize; STREAMS] = std::array::from_fn(|s| bufs[s].len());
        let total: usize = ulens.iter().sum();
        if total < COMBINED_MAX {
            let (buf, section) = (&mut self.joined, &mut self.scratch[0]);
            out.push(COMBINED);
            buf.clear();
            for u in &ulens {
                put_varint(buf, *u as u64);
            }
            for b in bufs.iter_mut() {
                buf.extend_from_slice(b);
                b.clear();
            }
            section.clear();
            self.combined.compress(buf, section)?;
            put_varint(out, section.len() as u64);
            out.extend_from_slice(section);
            for (c, u) in clens.iter_mut().zip(&ulens) {
                *c = (section.len() * u).checked_div(total).unwrap_or(0);
            }
        } else {
            out.push(SEPARATE);
            let mut present = u64::from(!fpi.is_empty()) << FPI_BIT;
            for (s, u) in ulens.iter().enumerate() {
                present |= u64::from(*u > 0) << s;
            }
            put_varint(out, present);
            for s in 0..STREAMS {
                let section = &mut self.scratch[s];
                section.clear();
                self.streams[s].compress(&bufs[s], section)?;
                bufs[s].clear();
                clens[s] = section.len();
                if ulens[s] > 0 {
                    put_varint(out, clens[s] as u64);
                }
            }
            for (s, section) in self.scratch.iter().enumerate() {
                if ulens[s] > 0 {
                    out.extend_from_slice(section);
                }
            }
        }
        out.extend_from_slice(fpi);
        Ok(())
    }
}

/// The decoder's zstd contexts: one per stream and the combined one, with the combined
/// chunk's buffer; the counterpart of [`Sections`]. Owned by whichever thread decompresses
/// the message (see the decoder's `unpacker`).
pub struct DecSections {
    streams: Vec<DStream>,
    combined: DStream,
    /// The combined chunk, decompressed.
    scratch: Vec<u8>,
}

impl DecSections {
    /// The contexts; LONG's refuses windows above 2^`data_log` bytes, the others above
    /// [`WINDOW_LOG`].
    pub fn new(data_log: u32) -> Result<DecSections, WalCodecError> {
        let streams = (0..STREAMS)
            .map(|s| DStream::new(if s == S_LONG { data_log } else { WINDOW_LOG }))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(DecSections {
            streams,
            combined: DStream::new(WINDOW_LOG)?,
            scratch: Vec::new(),
        })
    }

    /// Restores the sections of `payload` (a message of `raw_len` bytes) into `bufs`, one
    /// per stream; returns the page frames (FPI bytes). `parallel`: large sections on
    /// threads of their own ([`PARALLEL_MIN`]).
    pub fn read<'a>(
        &mut self,
        payload: &'a [u8],
        raw_len: usize,
        bufs: &mut [Vec<u8>],
        parallel: bool,
    ) -> Result<&'a [u8], WalCodecError> {
        let mut hdr = Reader::new(payload, "payload header");
        match hdr.u8()? {
            SEPARATE => self.read_separate(payload, hdr, raw_len, bufs, parallel),
            COMBINED => self.read_combined(payload, hdr, raw_len, bufs),
            v => Err(corrupt(format!(
                "payload format byte 0x{v:02x}, this decoder reads version {FORMAT_VERSION} \
                 (0x{SEPARATE:02x}, 0x{COMBINED:02x})"
            ))),
        }
    }

    /// A separate payload, `hdr` past its mode byte.
    fn read_separate<'a>(
        &mut self,
        payload: &'a [u8],
        mut hdr: Reader,
        raw_len: usize,
        bufs: &mut [Vec<u8>],
        parallel: bool,
    ) -> Result<&'a [u8], WalCodecError> {
        let present = hdr.varint()?;
        if present >> (FPI_BIT + 1) != 0 {
            return Err(corrupt(format!(
                "payload header names sections 0x{present:x}, this decoder knows {STREAMS} and \
                 the page frames"
            )));
        }
        let mut clens = [0usize; STREAMS];
        for (s, c) in clens.iter_mut().enumerate() {
            if present & (1 << s) != 0 {
                *c = hdr.len(payload.len())?;
            }
        }
        let mut rest = payload.get(hdr.position()..).unwrap_or(&[]);
        let mut items = Vec::with_capacity(STREAMS);
        for ((s, (stream, buf)), &clen) in self
            .streams
            .iter_mut()
            .zip(bufs.iter_mut())
            .enumerate()
            .zip(&clens)
        {
            buf.clear();
            if present & (1 << s) == 0 {
                continue;
            }
            let chunk = rest
                .get(..clen)
                .ok_or_else(|| corrupt(format!("the {} section is cut short", STREAM_NAMES[s])))?;
            rest = &rest[clen..];
            items.push((s, (stream, buf, chunk)));
        }
        let parallel = parallel && clens.iter().sum::<usize>() >= PARALLEL_MIN;
        each_section(
            items,
            |(_, _, chunk)| chunk.len(),
            parallel,
            |s, (stream, buf, chunk)| {
                stream.decode_capped(chunk, cap(s, raw_len), buf, STREAM_NAMES[s])
            },
        )?;
        if (present & (1 << FPI_BIT) != 0) == rest.is_empty() {
            return Err(corrupt("page frames present or absent against the header"));
        }
        Ok(rest)
    }

    /// A combined payload, `hdr` past its mode byte.
    fn read_combined<'a>(
        &mut self,
        payload: &'a [u8],
        mut hdr: Reader,
        raw_len: usize,
        bufs: &mut [Vec<u8>],
    ) -> Result<&'a [u8], WalCodecError> {
        let clen = hdr.len(payload.len())?;
        let rest = payload.get(hdr.position()..).unwrap_or(&[]);
        let chunk = rest
            .get(..clen)
            .ok_or_else(|| corrupt("the combined section is cut short"))?;
        let all = (0..STREAMS)
            .map(|s| cap(s, raw_len))
            .fold(10 * STREAMS, usize::saturating_add);
        self.combined
            .decode_capped(chunk, all, &mut self.scratch, "combined")?;
        let mut r = Reader::new(&self.scratch, "combined");
        let mut ulens = [0usize; STREAMS];
        for (s, u) in ulens.iter_mut().enumerate() {
            *u = r.len(cap(s, raw_len))?;
        }
        for (buf, &u) in bufs.iter_mut().zip(&ulens) {
            buf.clear();
            buf.extend_from_slice(r.bytes(u)?);
        }
        if !r.done() {
            return Err(corrupt("the combined section has bytes left over"));
        }
        Ok(&rest[clen..])
    }
}

fn corrupt(msg: impl Into<String>) -> WalCodecError {
    WalCodecError::Corrupt(msg.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sections compressed on threads are the bytes one thread makes, and the first error by
    /// index is the one returned.
    #[test]
    fn sections_on_threads_are_the_same_bytes() {
        let inputs: Vec<Vec<u8>> = (0..5u8)
            .map(|s| {
                (0..20_000u32 * u32::from(s + 1))
                    .map(|i| (i.wrapping_mul(2_654_435_761) >> 27) as u8 ^ s)
                    .collect()
            })
            .collect();
        let run = |parallel: bool| -> Vec<Vec<u8>> {
            let mut streams: Vec<CStream> = (0..5).map(|_| CStream::new(3, 22).unwrap()).collect();
            let mut outs = vec![Vec::new(); 5];
            for round in 0..2 {
                let items: Vec<_> = streams
                    .iter_mut()
                    .zip(outs.iter_mut())
                    .zip(&inputs)
                    .enumerate()
                    .collect();
                each_section(
                    items,
                    |((_, _), i)| i.len() - round * 100,
                    parallel,
                    |_, ((s, o), i)| s.compress(&i[round * 100..], o),
                )
                .unwrap();
            }
            outs
        };
        assert_eq!(run(true), run(false));
        let items: Vec<(usize, usize)> = (0..4).map(|i| (i, 10_000 * i)).collect();
        let err = each_section(
            items,
            |n| *n,
            true,
            |i, _| match i {
                0 => Ok(()),
                _ => Err(WalCodecError::Corrupt(format!("section {i}"))),
            },
        );
        assert!(matches!(err, Err(WalCodecError::Corrupt(m)) if m == "section 1"));
    }
}
