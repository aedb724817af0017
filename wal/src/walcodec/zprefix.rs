//! zstd contexts that compress or decompress single frames against a borrowed prefix
//! (`ZSTD_CCtx_refPrefix`, `ZSTD_DCtx_refPrefix`), sound by construction.
//!
//! zstd does not copy a referenced prefix: it keeps the pointer until the frame that uses it
//! is done. zstd-safe therefore ties the prefix's lifetime to the context's (`CCtx<'a>` takes a
//! prefix `&'a [u8]`), and a context kept in a long-lived struct is a `CCtx<'static>`, which
//! would need a `'static` prefix. The wrappers below own such a context, and the only way to
//! reference a prefix is one call that takes the prefix and the input together and, before it
//! returns, on every path, either leaves the context holding no reference to the prefix or
//! drops the context. Inside the call the context is used as a `CCtx<'p>` (a context is
//! covariant in its lifetime), so the borrow checker sees the prefix borrowed for exactly
//! that long; the single `unsafe` step, giving the context back its `'static` lifetime, is
//! taken only after zstd has confirmed that the prefix is no longer referenced.
//!
//! A frame is decompressed against its prefix with `ZSTD_decompress_usingDict` (the prefix as
//! raw content for that one call, nothing kept, no allocation) unless the prefix starts with
//! zstd's dictionary magic, which that call would read as a formatted dictionary; only then
//! is the prefix referenced as above.
//!
//! Why that confirmation suffices (zstd 1.5, `zstd_compress.c`, `zstd_decompress.c`):
//!
//! - `ZSTD_CCtx_reset(session_only)` ends any frame in progress (stage `zcss_init`);
//!   `ZSTD_CCtx_refPrefix(cctx, NULL, 0)` is then accepted and clears every dictionary
//!   reference (`ZSTD_clearAllDicts`). What else points into the last frame's input (the match
//!   window) is only read while a frame is compressed, and each new frame resets it first;
//!   zstd-safe's `compress2` rests on the same fact for its unbounded `src`.
//! - `ZSTD_DCtx_reset(session_only)` ends any frame in progress (stage `zdss_init`);
//!   `ZSTD_DCtx_refPrefix(dctx, NULL, 0)` is then accepted and frees the dictionary that
//!   referenced the prefix (`ZSTD_clearDict`).

use zstd_safe::{CCtx, DCtx, ResetDirective, WriteBuf};

use super::WalCodecError;

fn zerr(code: usize) -> WalCodecError {
    WalCodecError::Zstd(zstd_safe::get_error_name(code).to_string())
}

fn lost(what: &str) -> WalCodecError {
    WalCodecError::Zstd(format!(
        "the {what} context was dropped after zstd refused to clear its prefix; start a new session"
    ))
}

/// A compression context whose frames may be made against a borrowed prefix.
pub struct PrefixCompressor {
    /// `None` once dropped because a prefix could not be cleared (see the module docs).
    cctx: Option<CCtx<'static>>,
}

impl PrefixCompressor {
    /// Wraps `cctx` (parameters already set).
    pub fn new(cctx: CCtx<'static>) -> PrefixCompressor {
        PrefixCompressor { cctx: Some(cctx) }
    }

    /// Compresses `src` as one whole frame appended to `dst`, against `prefix` (none when
    /// empty); returns the frame's length.
    pub fn compress<C: WriteBuf + ?Sized>(
        &mut self,
        dst: &mut C,
        src: &[u8],
        prefix: &[u8],
    ) -> Result<usize, WalCodecError> {
        if prefix.is_empty() {
            let cctx = self.cctx.as_mut().ok_or_else(|| lost("compression"))?;
            return cctx.compress2(dst, src).map_err(zerr);
        }
        // Covariance: for this call the context is a CCtx<'p> with 'p the prefix's borrow.
        let mut cctx: CCtx<'_> = self.cctx.take().ok_or_else(|| lost("compression"))?;
        let res = cctx
            .ref_prefix(prefix)
            .and_then(|_| cctx.compress2(dst, src));
        let cleared = cctx
            .reset(ResetDirective::SessionOnly)
            .and_then(|_| cctx.ref_prefix(&[]));
        if cleared.is_ok() {
            // SAFETY: the types differ only in the lifetime parameter (same layout). zstd
            // accepted the reset of the session and the empty prefix, after which the context
            // references nothing of `prefix` (module docs), so it may outlive the borrow.
            // Otherwise `cctx` is dropped (ZSTD_freeCCtx reads nothing of the prefix).
            self.cctx = Some(unsafe { std::mem::transmute::<CCtx<'_>, CCtx<'static>>(cctx) });
        }
        res.map_err(zerr)
    }
}

/// A decompression context whose frames may have been made against a borrowed prefix.
pub struct PrefixDecompressor {
    /// `None` once dropped because a prefix could not be cleared (see the module docs).
    dctx: Option<DCtx<'static>>,
}

/// Why a frame did not decompress.
pub enum FrameError {
    /// zstd's error code for the frame.
    Zstd(usize),
    /// The context is gone (see the module docs).
    Lost(WalCodecError),
}

impl PrefixDecompressor {
    /// Wraps `dctx` (parameters already set).
    pub fn new(dctx: DCtx<'static>) -> PrefixDecompressor {
        PrefixDecompressor { dctx: Some(dctx) }
    }

    /// Decompresses the one frame `src` into `dst`, against `prefix` (none when empty);
    /// returns the decompressed length. After an error the context is ready for the next
    /// frame.
    pub fn decompress<C: WriteBuf + ?Sized>(
        &mut self,
        dst: &mut C,
        src: &[u8],
        prefix: &[u8],
    ) -> Result<usize, FrameError> {
        let gone = || FrameError::Lost(lost("decompression"));
        if prefix.is_empty() {
            let dctx = self.dctx.as_mut().ok_or_else(gone)?;
            let res = dctx.decompress(dst, src);
            if res.is_err() {
                // Leave the context ready for the next frame.
                let _ = dctx.reset(ResetDirective::SessionOnly);
            }
            return res.map_err(FrameError::Zstd);
        }
        if !starts_like_a_dictionary(prefix) {
            // The prefix as raw content for this frame only (ZSTD_decompress_usingDict): the
            // same as a referenced prefix, without the DDict that ZSTD_DCtx_refPrefix
            // allocates and initialises for every frame (a third of restoring a page frame).
            let dctx = self.dctx.as_mut().ok_or_else(gone)?;
            let res = dctx.decompress_using_dict(dst, src, prefix);
            if res.is_err() {
                let _ = dctx.reset(ResetDirective::SessionOnly);
            }
            return res.map_err(FrameError::Zstd);
        }
        // Covariance: for this call the context is a DCtx<'p> with 'p the prefix's borrow.
        let mut dctx: DCtx<'_> = self.dctx.take().ok_or_else(gone)?;
        let res = dctx
            .ref_prefix(prefix)
            .and_then(|_| dctx.decompress(dst, src));
        let cleared = dctx
            .reset(ResetDirective::SessionOnly)
            .and_then(|_| dctx.ref_prefix(&[]));
        if cleared.is_ok() {
            // SAFETY: the types differ only in the lifetime parameter (same layout). zstd
            // accepted the reset of the session and the empty prefix, which frees the
            // dictionary that referenced `prefix` (module docs), so the context may outlive
            // the borrow. Otherwise `dctx` is dropped (ZSTD_freeDCtx reads nothing of it).
            self.dctx = Some(unsafe { std::mem::transmute::<DCtx<'_>, DCtx<'static>>(dctx) });
        }
        res.map_err(FrameError::Zstd)
    }
}

/// zstd's magic number of a formatted dictionary (`ZSTD_MAGIC_DICTIONARY`).
const DICTIONARY_MAGIC: u32 = 0xEC30_A437;

/// Whether `ZSTD_decompress_usingDict` would read `prefix` as a formatted dictionary (entropy
/// tables first) instead of raw content: such a prefix takes the `refPrefix` path, which is
/// raw content whatever its bytes.
fn starts_like_a_dictionary(prefix: &[u8]) -> bool {
    prefix.len() >= 8
        && u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) == DICTIONARY_MAGIC
}

#[cfg(test)]
mod tests {
    use super::*;
    use zstd_safe::{CParameter, DParameter, FrameFormat};

    fn pair() -> (PrefixCompressor, PrefixDecompressor) {
        let mut c = CCtx::try_create().unwrap();
        c.set_parameter(CParameter::Format(FrameFormat::Magicless))
            .unwrap();
        let mut d = DCtx::try_create().unwrap();
        d.set_parameter(DParameter::Format(FrameFormat::Magicless))
            .unwrap();
        (PrefixCompressor::new(c), PrefixDecompressor::new(d))
    }

    /// Each frame uses only its own prefix: a prefix freed after its call is never read again
    /// (under Miri or ASan this would show as a use after free), and a frame made without a
    /// prefix does not decompress against an earlier one.
    #[test]
    fn prefixes_last_one_frame() {
        let (mut c, mut d) = pair();
        // Incompressible alone, nearly equal to each prefix.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let data: Vec<u8> = (0..16_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let near = |round: u8| -> Vec<u8> {
            let mut p = data.clone();
            p.iter_mut().step_by(97).for_each(|b| *b ^= round + 1);
            p
        };
        let mut frames = Vec::new();
        for round in 0..3u8 {
            let prefix = near(round);
            let mut with = Vec::with_capacity(1 << 16);
            c.compress(&mut with, &data, &prefix).unwrap();
            drop(prefix);
            let mut alone = Vec::with_capacity(1 << 16);
            c.compress(&mut alone, &data, &[]).unwrap();
            frames.push((round, with, alone));
        }
        for (round, with, alone) in frames {
            let prefix = near(round);
            assert!(
                with.len() < alone.len() / 4,
                "{} vs {}",
                with.len(),
                alone.len()
            );
            let mut out = Vec::with_capacity(data.len());
            assert_eq!(
                d.decompress(&mut out, &with, &prefix).ok(),
                Some(data.len())
            );
            assert!(out == data);
            out.clear();
            assert_eq!(d.decompress(&mut out, &alone, &[]).ok(), Some(data.len()));
            assert!(out == data);
            // Without its prefix the frame does not restore the data.
            out.clear();
            let res = d.decompress(&mut out, &with, &[]);
            assert!(res.is_err() || out != data);
        }
    }

    /// A prefix that begins like a formatted zstd dictionary is still raw content: the frame
    /// made against it restores (ZSTD_decompress_usingDict would parse it as entropy tables).
    #[test]
    fn a_prefix_with_the_dictionary_magic_is_raw_content() {
        let (mut c, mut d) = pair();
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut prefix = DICTIONARY_MAGIC.to_le_bytes().to_vec();
        prefix.extend_from_slice(&data[..4000]);
        assert!(starts_like_a_dictionary(&prefix));
        let mut frame = Vec::with_capacity(1 << 14);
        c.compress(&mut frame, &data, &prefix).unwrap();
        let mut out = Vec::with_capacity(data.len());
        assert_eq!(
            d.decompress(&mut out, &frame, &prefix).ok(),
            Some(data.len())
        );
        assert!(out == data);
        // The raw path and the referenced path alternate on one context.
        let plain = &prefix[4..];
        let mut frame2 = Vec::with_capacity(1 << 14);
        c.compress(&mut frame2, &data, plain).unwrap();
        out.clear();
        assert_eq!(
            d.decompress(&mut out, &frame2, plain).ok(),
            Some(data.len())
        );
        assert!(out == data);
    }

    /// A frame that fails leaves both contexts usable.
    #[test]
    fn errors_leave_the_contexts_usable() {
        let (mut c, mut d) = pair();
        let data = vec![7u8; 5000];
        let prefix = vec![7u8; 100];
        let mut small = Vec::with_capacity(2);
        assert!(c.compress(&mut small, &data, &prefix).is_err());
        let mut frame = Vec::with_capacity(1 << 14);
        c.compress(&mut frame, &data, &prefix).unwrap();
        let mut out = Vec::with_capacity(10);
        assert!(matches!(
            d.decompress(&mut out, &frame, &prefix),
            Err(FrameError::Zstd(_))
        ));
        let mut out = Vec::with_capacity(data.len());
        assert_eq!(
            d.decompress(&mut out, &frame, &prefix).ok(),
            Some(data.len())
        );
        assert!(out == data);
    }
}
