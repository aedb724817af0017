//! Byte plumbing: LEB128 varints, bounds-checked readers, the streaming zstd sections and the
//! per-page zstd frames with a reference page.

use super::zprefix::{FrameError, PrefixCompressor, PrefixDecompressor};
use super::WalCodecError;
use zstd::stream::raw::{DParameter, Decoder, Operation};
use zstd_safe::zstd_sys::ZSTD_EndDirective;
use zstd_safe::{CCtx, CParameter, DCtx, FrameFormat, InBuffer, OutBuffer, ParamSwitch};

use super::wal::PAGE_SIZE;

/// Most reference pages a page frame is compressed against.
/// Most bytes a page frame may be compressed against: a reference page and up to a page of
/// known tuples of the block (see `tuples::page_prefix`).
pub const MAX_PREFIX: usize = 2 * PAGE_SIZE;

/// Window of RAW, PAGE, MAIN and the combined context (4 MiB); the decoder refuses larger
/// ones. This bounds the decoder's memory per stream.
pub const WINDOW_LOG: u32 = 22;
/// Bounds of the LONG stream's window ([`history_log`]): 4 MiB to 1 GiB.
pub const HISTORY_LOG_MIN: u32 = 22;
pub const HISTORY_LOG_MAX: u32 = 30;

/// Window of the LONG stream for a `block_cache_bytes` budget: the largest power of two up to
/// an eighth of it, within [`HISTORY_LOG_MIN`]..=[`HISTORY_LOG_MAX`] (128 MiB for the default
/// 1 GiB). Above 4 MiB zstd's long-distance matcher finds content written again under another
/// identity long after (a TOAST value rewritten whole under new chunk ids, a row copied).
pub fn history_log(block_cache_bytes: usize) -> u32 {
    let eighth = (block_cache_bytes / 8).max(1);
    (usize::BITS - 1 - eighth.leading_zeros()).clamp(HISTORY_LOG_MIN, HISTORY_LOG_MAX)
}
/// Shortest match the long-distance matcher takes (zstd's default at these levels is 64).
/// What it is for, a TOAST value rewritten whole, matches for kilobytes; shorter matches in a
/// bulk load's rows only displace better nearby ones. Recorded PG 15 WAL, against 64: a bulk
/// load (`INSERT … SELECT` of md5 text) 2.4 % fewer bytes, TOAST rewrites 0.03 % more,
/// pgbench, random-payload updates and moved rows the same within 0.003 %. The encoder's
/// choice only: the decoder reads any match.
const LDM_MIN_MATCH: u32 = 128;

/// Window of the small streams (CTRL, HDR, IMG): 1 MiB.
pub const SMALL_WINDOW_LOG: u32 = 20;

pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Zigzag for signed deltas.
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

pub fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// A bounds-checked reader over one decoded section.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    name: &'static str,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8], name: &'static str) -> Reader<'a> {
        Reader { buf, pos: 0, name }
    }

    fn short(&self) -> WalCodecError {
        WalCodecError::Corrupt(format!("the {} section ends early", self.name))
    }

    pub fn u8(&mut self) -> Result<u8, WalCodecError> {
        let b = *self.buf.get(self.pos).ok_or_else(|| self.short())?;
        self.pos += 1;
        Ok(b)
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], WalCodecError> {
        let end = self.pos.checked_add(n).ok_or_else(|| self.short())?;
        let s = self.buf.get(self.pos..end).ok_or_else(|| self.short())?;
        self.pos = end;
        Ok(s)
    }

    pub fn u64(&mut self) -> Result<u64, WalCodecError> {
        let s = self.bytes(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }

    pub fn varint(&mut self) -> Result<u64, WalCodecError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7F) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(WalCodecError::Corrupt(format!(
            "overlong varint in the {} section",
            self.name
        )))
    }

    /// A varint that must not exceed `max` (a length about to be used).
    pub fn len(&mut self, max: usize) -> Result<usize, WalCodecError> {
        let v = self.varint()?;
        if v > max as u64 {
            return Err(WalCodecError::Corrupt(format!(
                "length {v} in the {} section exceeds the limit of {max}",
                self.name
            )));
        }
        Ok(v as usize)
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn done(&self) -> bool {
        self.pos == self.buf.len()
    }

    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// zstd level of the streams while the encoder catches up ([`CStream::set_fast`]), with
/// Huffman-coded literals (zstd turns them off at negative levels by default: a bulk load's
/// bytes then grow by 60 %). Measured on recorded WAL (`harness/examples/codec_profile.rs`,
/// PG 15, one core, DATA, LONG, PAGE and RAW fast as [`super::payload::Sections::set_fast`]
/// does it, medians of four paired runs; `docs/keeping-up.md`, thirty-seventh, forty-fifth
/// and forty-sixth rounds): at format 11 a bulk load 1.37 × the normal settings' encoding
/// speed for 1.2 % more bytes, `toast` 1.20 × for 3.9 % more; pgbench (format 10) no faster
/// (zstd is a quarter of its encoding) for 2.4 % more.
pub const FAST_LEVEL: i32 = -3;

/// How sparsely LONG's long-distance matcher samples its input at the fast settings:
/// `ZSTD_c_ldmHashRateLog`, one position in 2^9 looked up and inserted, where zstd's default
/// (1.5.6) is one in 2^7. The matcher stays on: it is what finds a TOAST value
/// rewritten whole from far back, and without it the bench's `toast` WAL took 2.15 × the
/// bytes (`docs/keeping-up.md`, forty-fifth round). Sampled this sparsely it still finds
/// those values (at format 10, 2.7 % more bytes than the normal settings; 0.6 % at one in
/// 2^8, 0.4 % at zstd's default) and left a bulk load most of the fast settings' speed:
/// 1.39 × the normal settings' (medians of paired runs), against 1.23 × at one in 2^8,
/// 1.16 × at zstd's default and 1.57 × without the matcher. (Since format 11 a bulk load's
/// rows go through DATA, which has no long-distance matcher at either setting.)
const FAST_LDM_HASH_RATE_LOG: u32 = 9;

/// How many windows a stream's in-place input holds ([`CStream`]): the frame starts over,
/// its history lost, each time it fills. Recorded PG 15 WAL at level 1 with 4 MiB windows
/// and 256 kB flushes: 0.01 % more bytes at 2 windows (0.006 % at 4) for 21–25 % more
/// MB/s than zstd's own input buffer, where the matcher reads history across the buffer's
/// wrap in its slower two-segment (`extDict`) form from the first wrap on.
const RING_WINDOWS: usize = 2;

/// Match finding of the structural streams (CTRL, HDR, MAIN: ops, block headers, main data,
/// a few bytes per record, repeating with small changes) at the levels where zstd's own is
/// `fast`, `dfast` or `greedy` (0..=[`STRUCTURAL_MAX_LEVEL`]; the streams run at level 1 for
/// the default `link.zstd_level = 3`, `encoder::levels`: `fast`, 7-byte matches): `lazy`,
/// matches of at least 6 bytes, 2^3 candidates searched per position, in the hash and chain
/// tables of the level. Recorded pgbench WAL at format 14 (`codec_profile FILE LSN 15
/// decode`, warmed on 300 MB): 5 min checkpoints 43,124,053 → 40,820,192 bytes (CTRL 4.0 →
/// 3.2 MB, HDR 8.1 → 7.2, MAIN 11.6 → 11.0), 30 s checkpoints 13,266,962 → 12,478,881, for
/// 12–17 % less encoding speed; a bulk load the same bytes (its structural streams are 2 %
/// of its input) for 7 % less. `lazy2` gave 0.2 % fewer bytes for 5 % less speed, 2^2
/// candidates 1 % more bytes for 4 % more speed; `lazy` on DATA made a bulk load's DATA 12 %
/// larger and its encoding 3 × slower, so DATA keeps zstd's settings. The decoder reads
/// either. While the encoder catches up ([`CStream::set_fast`]) these streams go back to
/// their level's own match finding ([`own_match_finding`]).
const STRUCTURAL: MatchFinding = (zstd_safe::Strategy::ZSTD_lazy, 6, 3);
/// The highest level whose settings [`STRUCTURAL`] replaces (zstd's level 6 is `lazy`).
pub const STRUCTURAL_MAX_LEVEL: i32 = 5;

/// zstd's own match finding at `level` (0..=[`STRUCTURAL_MAX_LEVEL`]; 0 is zstd's default,
/// 3) for input of unknown size: `ZSTD_defaultCParameters[0]` of the zstd the build links
/// (1.5.6, `zstd-sys` pinned by `Cargo.lock`).
fn own_match_finding(level: i32) -> MatchFinding {
    use zstd_safe::Strategy::{ZSTD_dfast, ZSTD_fast, ZSTD_greedy};
    match level {
        1 => (ZSTD_fast, 7, 1),
        2 => (ZSTD_fast, 6, 1),
        4 => (ZSTD_dfast, 5, 1),
        5 => (ZSTD_greedy, 5, 3),
        _ => (ZSTD_dfast, 5, 1),
    }
}

/// Strategy, shortest match, log2 of the candidates searched per position.
type MatchFinding = (zstd_safe::Strategy, u32, u32);

fn set_match_finding(ctx: &mut CCtx<'static>, m: MatchFinding) -> Result<(), WalCodecError> {
    let (strategy, min_match, search_log) = m;
    ctx.set_parameter(CParameter::Strategy(strategy))
        .and_then(|_| ctx.set_parameter(CParameter::MinMatch(min_match)))
        .and_then(|_| ctx.set_parameter(CParameter::SearchLog(search_log)))
        .map(|_| ())
        .map_err(zerr)
}

/// One streaming zstd context of the encoder.
///
/// A stream is a sequence of zstd frames: one for as long as the context keeps its
/// settings and its input fits its ring, a new one when [`CStream::set_fast`] changes them
/// (zstd applies a new level only from a frame's start) or the ring is full. A frame ends
/// inside a message's section and the next starts right after it; zstd's streaming decoder
/// reads across the boundary, so the decoder needs nothing for it. What a new frame costs
/// is the history: matches start over.
///
/// # Input in place
///
/// A stream without long-distance matching (a window of at most [`WINDOW_LOG`]) keeps its
/// frame's input in `ring`, [`RING_WINDOWS`] windows allocated once, and zstd reads it there
/// (`ZSTD_c_stableInBuffer`): the frame's bytes are contiguous, so the matcher never needs
/// its two-segment form, and zstd allocates no input buffer of its own. The ring is
/// appended to within its capacity only (it never moves while a frame reads it; zstd
/// checks the address at every call and fails rather than read elsewhere) and cleared only
/// once the frame has ended. LONG's window (up to 1 GiB, with long-distance matching) would
/// need a ring of several times its size: it keeps zstd's own buffer.
pub struct CStream {
    ctx: CCtx<'static>,
    level: i32,
    /// Long-distance matching (a window above [`WINDOW_LOG`]), at both settings.
    ldm: bool,
    /// The open frame's input, read by zstd in place; `None` for zstd's own buffer.
    ring: Option<Vec<u8>>,
    /// The settings of the frame being written: fast, or `level` (with `ldm`, the matcher
    /// sampling at zstd's default rate).
    fast: bool,
    /// The settings asked for; the next input with other settings than `fast` starts a frame.
    want_fast: bool,
    /// A frame has begun (bytes went out since the context's start or the last frame's end).
    open: bool,
    /// What the fast settings are for this context.
    kind: Kind,
}

/// A context's kind, which says what its fast settings are.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// [`FAST_LEVEL`].
    Plain,
    /// Made by [`CStream::structural`] at a level it tunes: the level's own match finding
    /// ([`own_match_finding`]) instead of [`STRUCTURAL`].
    Structural,
    /// Made by [`CStream::structural`] at a level above those it tunes: none, it keeps its
    /// settings, as the structural streams always did.
    Fixed,
}

impl CStream {
    /// A context with a window of 2^`window_log` bytes (at most [`HISTORY_LOG_MAX`]), with
    /// long-distance matching above [`WINDOW_LOG`], and its input in place at or below it.
    pub fn new(level: i32, window_log: u32) -> Result<CStream, WalCodecError> {
        let mut ctx = new_cctx()?;
        let window_log = window_log.min(HISTORY_LOG_MAX);
        let ldm = window_log > WINDOW_LOG;
        ctx.set_parameter(CParameter::CompressionLevel(level))
            .and_then(|_| ctx.set_parameter(CParameter::WindowLog(window_log)))
            .map_err(zerr)?;
        if ldm {
            ctx.set_parameter(CParameter::EnableLongDistanceMatching(true))
                .and_then(|_| ctx.set_parameter(CParameter::LdmMinMatch(LDM_MIN_MATCH)))
                .map_err(zerr)?;
        } else {
            ctx.set_parameter(CParameter::StableInBuffer(true))
                .map_err(zerr)?;
        }
        let ring = (!ldm).then(|| Vec::with_capacity(RING_WINDOWS << window_log));
        Ok(CStream {
            ctx,
            level,
            ldm,
            ring,
            fast: false,
            want_fast: false,
            open: false,
            kind: Kind::Plain,
        })
    }

    /// A context for a structural stream: [`CStream::new`] with the match finding of
    /// [`STRUCTURAL`] at levels up to [`STRUCTURAL_MAX_LEVEL`] (above, zstd's settings of
    /// the level, kept when the fast ones are asked for).
    pub fn structural(level: i32, window_log: u32) -> Result<CStream, WalCodecError> {
        let mut c = CStream::new(level, window_log)?;
        if (0..=STRUCTURAL_MAX_LEVEL).contains(&level) {
            set_match_finding(&mut c.ctx, STRUCTURAL)?;
            c.kind = Kind::Structural;
        } else {
            c.kind = Kind::Fixed;
        }
        Ok(c)
    }

    /// Asks for the fast settings ([`FAST_LEVEL`]; for a structural stream its level's own
    /// match finding, [`own_match_finding`], or nothing above the levels it tunes) or the
    /// normal ones from the next input on.
    pub fn set_fast(&mut self, fast: bool) {
        self.want_fast = fast && self.kind != Kind::Fixed;
    }

    /// Compresses `buf` and flushes, appending to `out` (nothing for no bytes).
    pub fn compress(&mut self, buf: &[u8], out: &mut Vec<u8>) -> Result<(), WalCodecError> {
        if buf.is_empty() {
            return Ok(());
        }
        if self.want_fast != self.fast {
            self.switch(out)?;
        }
        self.open = true;
        out.reserve(buf.len() / 2 + 64);
        let Some(ring) = self.ring.as_mut() else {
            return flush_from(&mut self.ctx, &mut InBuffer::around(buf), out);
        };
        // Pieces of at most half the ring, so that each fits once the ring is cleared.
        for piece in buf.chunks(ring.capacity() / 2) {
            if ring.len() + piece.len() > ring.capacity() {
                end_frame(&mut self.ctx, out)?;
                ring.clear();
            }
            let pos = ring.len();
            // Within the capacity: the ring does not move, and bytes before `pos` stay.
            ring.extend_from_slice(piece);
            flush_from(&mut self.ctx, &mut InBuffer { src: ring, pos }, out)?;
        }
        Ok(())
    }

    /// Ends the open frame (its end goes to `out`) and sets the wanted settings for the next.
    fn switch(&mut self, out: &mut Vec<u8>) -> Result<(), WalCodecError> {
        if self.open {
            end_frame(&mut self.ctx, out)?;
            if let Some(ring) = self.ring.as_mut() {
                ring.clear();
            }
            self.open = false;
        }
        let fast = self.want_fast;
        if self.kind == Kind::Structural {
            let m = match fast {
                true => own_match_finding(self.level),
                false => STRUCTURAL,
            };
            set_match_finding(&mut self.ctx, m)?;
            self.fast = fast;
            return Ok(());
        }
        let (level, literals) = if fast {
            (FAST_LEVEL, ParamSwitch::Enable)
        } else {
            (self.level, ParamSwitch::Auto)
        };
        // 0 is zstd's default sampling for the window.
        let rate = if fast { FAST_LDM_HASH_RATE_LOG } else { 0 };
        let ctx = &mut self.ctx;
        ctx.set_parameter(CParameter::CompressionLevel(level))
            .and_then(|_| ctx.set_parameter(CParameter::LiteralCompressionMode(literals)))
            .and_then(|_| match self.ldm {
                true => ctx.set_parameter(CParameter::LdmHashRateLog(rate)),
                false => Ok(0),
            })
            .map_err(zerr)?;
        self.fast = fast;
        Ok(())
    }
}

/// Compresses the rest of `input` and flushes it, appending to `out`.
fn flush_from(
    ctx: &mut CCtx<'static>,
    input: &mut InBuffer<'_>,
    out: &mut Vec<u8>,
) -> Result<(), WalCodecError> {
    loop {
        spare(out, 64 * 1024);
        let mut o = OutBuffer::around_pos(out, out.len());
        let left = ctx
            .compress_stream2(&mut o, input, ZSTD_EndDirective::ZSTD_e_flush)
            .map_err(zerr)?;
        if left == 0 && input.pos() == input.src.len() {
            return Ok(());
        }
    }
}

/// Ends the frame (zstd then starts the next at the next input), appending to `out`.
fn end_frame(ctx: &mut CCtx<'static>, out: &mut Vec<u8>) -> Result<(), WalCodecError> {
    loop {
        spare(out, 1024);
        let mut o = OutBuffer::around_pos(out, out.len());
        if ctx.end_stream(&mut o).map_err(zerr)? == 0 {
            return Ok(());
        }
    }
}

/// A fresh compression context, or the error that says zstd could not allocate one.
fn new_cctx() -> Result<CCtx<'static>, WalCodecError> {
    CCtx::try_create()
        .ok_or_else(|| WalCodecError::Zstd("cannot create a compression context".into()))
}

fn spare(out: &mut Vec<u8>, n: usize) {
    if out.capacity() - out.len() < n {
        out.reserve(n);
    }
}

/// One streaming zstd context of the decoder.
pub struct DStream {
    ctx: Decoder<'static>,
}

impl DStream {
    /// A context that refuses windows above 2^`window_log_max` bytes.
    pub fn new(window_log_max: u32) -> Result<DStream, WalCodecError> {
        let mut ctx = Decoder::new().map_err(WalCodecError::zstd)?;
        ctx.set_parameter(DParameter::WindowLogMax(
            window_log_max.min(HISTORY_LOG_MAX),
        ))
        .map_err(WalCodecError::zstd)?;
        Ok(DStream { ctx })
    }

    /// Decompresses one flushed chunk into `out` (cleared): at most `cap` bytes, allocated as
    /// they come (the chunk's own sizes are not trusted).
    pub fn decode_capped(
        &mut self,
        chunk: &[u8],
        cap: usize,
        out: &mut Vec<u8>,
        name: &str,
    ) -> Result<(), WalCodecError> {
        out.clear();
        let mut input = InBuffer::around(chunk);
        loop {
            if out.len() == out.capacity() {
                // out.len() <= cap here: room for one byte more than cap shows an overrun.
                let want = out
                    .len()
                    .max(16 * 1024)
                    .min(cap.saturating_add(1) - out.len());
                out.reserve_exact(want);
            }
            let before = (input.pos(), out.len());
            let mut o = OutBuffer::around_pos(out, out.len());
            self.ctx
                .run(&mut input, &mut o)
                .map_err(WalCodecError::zstd)?;
            if out.len() > cap {
                return Err(WalCodecError::Corrupt(format!(
                    "the {name} section decompresses to more than {cap} bytes"
                )));
            }
            let room = out.len() < out.capacity();
            if (input.pos() == chunk.len() && room) || (input.pos(), out.len()) == before {
                break;
            }
        }
        if input.pos() != chunk.len() {
            return Err(WalCodecError::Corrupt(format!(
                "the {name} section has bytes that do not decompress"
            )));
        }
        Ok(())
    }
}

/// Compresses single pages as magicless zstd frames, optionally against reference bytes.
///
/// The references and the page are copied next to each other into one buffer, so that zstd sees
/// the references as a contiguous prefix of the input (faster than a separate dictionary).
pub struct PageCompressor {
    cctx: PrefixCompressor,
    scratch: Vec<u8>,
}

impl PageCompressor {
    pub fn new(level: i32) -> Result<PageCompressor, WalCodecError> {
        let mut cctx = new_cctx()?;
        for p in [
            zstd_safe::CParameter::CompressionLevel(level),
            zstd_safe::CParameter::Format(FrameFormat::Magicless),
            zstd_safe::CParameter::ContentSizeFlag(false),
            zstd_safe::CParameter::ChecksumFlag(false),
            zstd_safe::CParameter::DictIdFlag(false),
        ] {
            cctx.set_parameter(p).map_err(zerr)?;
        }
        Ok(PageCompressor {
            cctx: PrefixCompressor::new(cctx),
            scratch: Vec::with_capacity(MAX_PREFIX + PAGE_SIZE),
        })
    }

    /// Appends the frame of `page`, compressed against the concatenation of `refs` (at most
    /// [`MAX_PREFIX`] bytes: the rest is not used, on both ends alike), to `out`; returns its
    /// length.
    pub fn compress(
        &mut self,
        page: &[u8; PAGE_SIZE],
        refs: &[&[u8]],
        out: &mut Vec<u8>,
    ) -> Result<usize, WalCodecError> {
        let start = out.len();
        out.reserve(zstd_safe::compress_bound(PAGE_SIZE));
        let mut dst = std::io::Cursor::new(&mut *out);
        dst.set_position(start as u64);
        let n = gather_prefix(&mut self.scratch, refs);
        if n > 0 {
            self.scratch.extend_from_slice(page);
            let (prefix, src) = self.scratch.split_at(n);
            self.cctx.compress(&mut dst, src, prefix)?;
        } else {
            self.cctx.compress(&mut dst, &page[..], &[])?;
        }
        Ok(out.len() - start)
    }
}

/// Copies the references into `scratch` (cleared first), at most [`MAX_PREFIX`] bytes in all;
/// returns how many.
fn gather_prefix(scratch: &mut Vec<u8>, refs: &[&[u8]]) -> usize {
    scratch.clear();
    for r in refs {
        let room = MAX_PREFIX - scratch.len();
        scratch.extend_from_slice(&r[..r.len().min(room)]);
    }
    scratch.len()
}

/// Decompresses the frames of [`PageCompressor`] (references contiguous with the output too).
pub struct PageDecompressor {
    dctx: PrefixDecompressor,
    scratch: Vec<u8>,
}

impl PageDecompressor {
    pub fn new() -> Result<PageDecompressor, WalCodecError> {
        let mut dctx = DCtx::try_create()
            .ok_or_else(|| WalCodecError::Zstd("cannot create a decompression context".into()))?;
        dctx.set_parameter(zstd_safe::DParameter::Format(FrameFormat::Magicless))
            .map_err(zerr)?;
        dctx.set_parameter(zstd_safe::DParameter::WindowLogMax(WINDOW_LOG))
            .map_err(zerr)?;
        Ok(PageDecompressor {
            dctx: PrefixDecompressor::new(dctx),
            scratch: Vec::with_capacity(MAX_PREFIX + PAGE_SIZE),
        })
    }

    /// Decompresses `frame` (made against the same `refs`) into `page`, which it must fill
    /// exactly.
    pub fn decompress(
        &mut self,
        frame: &[u8],
        refs: &[&[u8]],
        page: &mut [u8; PAGE_SIZE],
    ) -> Result<(), WalCodecError> {
        let n = gather_prefix(&mut self.scratch, refs);
        let res = if n > 0 {
            self.scratch.resize(n + PAGE_SIZE, 0);
            let (prefix, dst) = self.scratch.split_at_mut(n);
            let res = self.dctx.decompress(&mut *dst, frame, prefix);
            if matches!(res, Ok(PAGE_SIZE)) {
                page.copy_from_slice(dst);
            }
            res
        } else {
            self.dctx.decompress(&mut page[..], frame, &[])
        };
        match res {
            Ok(PAGE_SIZE) => Ok(()),
            Ok(n) => Err(WalCodecError::Corrupt(format!(
                "a page frame decompressed to {n} bytes instead of {PAGE_SIZE}"
            ))),
            Err(FrameError::Zstd(code)) => Err(WalCodecError::Corrupt(format!(
                "bad page frame: {}",
                zstd_safe::get_error_name(code)
            ))),
            Err(FrameError::Lost(e)) => Err(e),
        }
    }
}

fn zerr(code: usize) -> WalCodecError {
    WalCodecError::Zstd(zstd_safe::get_error_name(code).to_string())
}

#[cfg(test)]
mod tests;
