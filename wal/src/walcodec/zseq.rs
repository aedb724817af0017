//! zstd frames from sequences the caller found (`ZSTD_compressSequences`): zstd does only the
//! entropy coding, the frame is an ordinary one (magicless, as [`super::streams`]' page
//! frames), and the decoder reads it against the same prefix as any other.
//!
//! zstd-safe has no binding for it, so this owns a raw context. zstd does not read the
//! prefix to code sequences (only a decoder does, to copy from it), so none is referenced:
//! the frame is made from the sequences and the input alone, with no prefix to index. zstd's
//! own check of the sequences (`validateSequences`) cannot see a prefix that is not
//! referenced, so [`SeqCompressor::compress`] checks them itself: each match at least
//! [`MIN_MATCH`] long and reaching back no further than the prefix, all of them within the
//! input. A match's length must also be right, which nothing here can tell: a wrong one
//! makes a frame that decodes to other bytes (the parse compares every match it takes).
//!
//! Parameters: magicless, no content size, checksum or dictionary id (as [`super::streams`]'
//! page frames), and a 16 KiB window, enough for a page against one page of prefix.

use std::ptr::NonNull;

use zstd_sys::{ZSTD_ResetDirective, ZSTD_cParameter as P};

use super::WalCodecError;

/// One sequence: `lit_length` literals, then `match_length` bytes copied from `offset` bytes
/// back (in the prefix followed by the output).
pub use zstd_sys::ZSTD_Sequence as Seq;

/// Shortest match zstd is told to accept (`ZSTD_c_minMatch`).
pub const MIN_MATCH: u32 = 4;
/// `ZSTD_c_format` (an experimental parameter of zstd 1.5).
const C_FORMAT: P = P::ZSTD_c_experimentalParam2;
/// `ZSTD_f_zstd1_magicless`.
const MAGICLESS: i32 = 1;

fn zerr(code: usize) -> WalCodecError {
    WalCodecError::Zstd(zstd_safe::get_error_name(code).to_string())
}

fn is_error(code: usize) -> bool {
    // SAFETY: a pure function of its argument.
    unsafe { zstd_sys::ZSTD_isError(code) != 0 }
}

/// A compression context for frames from given sequences.
pub struct SeqCompressor {
    /// `None` once freed because zstd refused to reset it after an error.
    cctx: Option<NonNull<zstd_sys::ZSTD_CCtx>>,
}

// SAFETY: the context is owned by this value alone and used only through `&mut self`; a zstd
// context may be used from any thread, one at a time.
unsafe impl Send for SeqCompressor {}

impl SeqCompressor {
    /// A context whose entropy coding is that of `level`.
    pub fn new(level: i32) -> Result<SeqCompressor, WalCodecError> {
        // SAFETY: allocates a context, or returns null (checked).
        let cctx = NonNull::new(unsafe { zstd_sys::ZSTD_createCCtx() })
            .ok_or_else(|| WalCodecError::Zstd("cannot create a compression context".into()))?;
        let me = SeqCompressor { cctx: Some(cctx) };
        for (p, v) in [
            (P::ZSTD_c_compressionLevel, level),
            (C_FORMAT, MAGICLESS),
            (P::ZSTD_c_contentSizeFlag, 0),
            (P::ZSTD_c_checksumFlag, 0),
            (P::ZSTD_c_dictIDFlag, 0),
            (P::ZSTD_c_minMatch, MIN_MATCH as i32),
            (P::ZSTD_c_windowLog, 14),
        ] {
            // SAFETY: a live context; zstd checks the parameter and its value.
            let code = unsafe { zstd_sys::ZSTD_CCtx_setParameter(cctx.as_ptr(), p, v) };
            if is_error(code) {
                return Err(zerr(code));
            }
        }
        Ok(me)
    }

    /// Appends to `out` one frame of `src` made of `seqs` (the bytes after the last sequence
    /// are literals), whose matches may reach back `prefix_len` bytes before `src`; returns
    /// its length. Sequences that break those bounds are refused.
    pub fn compress(
        &mut self,
        out: &mut Vec<u8>,
        seqs: &[Seq],
        src: &[u8],
        prefix_len: usize,
    ) -> Result<usize, WalCodecError> {
        check(seqs, src.len(), prefix_len)?;
        let cctx = self.cctx.ok_or_else(|| {
            WalCodecError::Zstd(
                "the sequence compression context was dropped after zstd refused to reset it; \
                 start a new session"
                    .into(),
            )
        })?;
        // SAFETY: a pure function of its argument.
        let bound = unsafe { zstd_sys::ZSTD_compressBound(src.len()) };
        out.reserve(bound);
        let start = out.len();
        let ctx = cctx.as_ptr();
        // SAFETY: `ctx` is live and ours. `src` and `seqs` are valid for their lengths for
        // the whole call and not written, and the sequences cover no more than `src` (checked
        // above), so zstd reads only `src`'s bytes as literals. The destination is the spare
        // capacity of `out`, `bound` bytes or more (reserved above), which zstd writes at
        // most.
        let made = unsafe {
            zstd_sys::ZSTD_compressSequences(
                ctx,
                out.as_mut_ptr().add(start).cast(),
                out.capacity() - start,
                seqs.as_ptr(),
                seqs.len(),
                src.as_ptr().cast(),
                src.len(),
            )
        };
        if is_error(made) {
            // SAFETY: `ctx` is live; a reset ends the frame that failed.
            let r = unsafe {
                zstd_sys::ZSTD_CCtx_reset(ctx, ZSTD_ResetDirective::ZSTD_reset_session_only)
            };
            if is_error(r) {
                self.free();
            }
            return Err(zerr(made));
        }
        // SAFETY: zstd wrote `made` bytes (at most the spare capacity) after `start`.
        unsafe { out.set_len(start + made) };
        Ok(made)
    }

    fn free(&mut self) {
        if let Some(c) = self.cctx.take() {
            // SAFETY: the context is live and dropped from this value, so freed once.
            unsafe { zstd_sys::ZSTD_freeCCtx(c.as_ptr()) };
        }
    }
}

impl Drop for SeqCompressor {
    fn drop(&mut self) {
        self.free();
    }
}

/// Whether `seqs` may be coded for an input of `len` bytes after a prefix of `prefix_len`:
/// every match at least [`MIN_MATCH`] long, with an offset from 1 to the bytes before it
/// (prefix and input), all within the input.
fn check(seqs: &[Seq], len: usize, prefix_len: usize) -> Result<(), WalCodecError> {
    let bad = |what: &str| {
        Err(WalCodecError::Zstd(format!(
            "bad sequence for a page frame: {what}"
        )))
    };
    let mut pos = 0usize;
    for s in seqs {
        pos = match pos.checked_add(s.litLength as usize) {
            Some(p) => p,
            None => return bad("too many literals"),
        };
        if s.matchLength < MIN_MATCH {
            return bad("a match shorter than the minimum");
        }
        if s.offset == 0 || s.offset as usize > pos + prefix_len {
            return bad("an offset beyond the prefix");
        }
        pos = match pos.checked_add(s.matchLength as usize) {
            Some(p) if p <= len => p,
            _ => return bad("beyond the input"),
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(lit: u32, off: u32, ml: u32) -> Seq {
        Seq {
            offset: off,
            litLength: lit,
            matchLength: ml,
            rep: 0,
        }
    }

    #[test]
    fn sequences_out_of_bounds_are_refused() {
        let mut c = SeqCompressor::new(6).unwrap();
        let src = [7u8; 100];
        let mut out = Vec::new();
        for (seqs, ok) in [
            (vec![seq(0, 10, 100)], true),
            (vec![seq(0, 11, 100)], false),
            (vec![seq(5, 15, 4)], true),
            (vec![seq(5, 16, 4)], false),
            (vec![seq(0, 1, 3)], false),
            (vec![seq(0, 0, 4)], false),
            (vec![seq(0, 1, 101)], false),
            (vec![seq(90, 1, 10), seq(0, 1, 4)], false),
            (vec![seq(u32::MAX, 1, 4)], false),
        ] {
            assert_eq!(
                c.compress(&mut out, &seqs, &src, 10).is_ok(),
                ok,
                "{seqs:?}"
            );
        }
    }
}
