//! A cache hit's page as pieces against the previous image of its block (format 12): the
//! matches [`super::hitparse`] finds, written as they are into the HIT stream, whose zstd
//! context codes the hits of a message together.
//!
//! Why: up to format 11 each hit was a zstd frame of its own, made from the same matches
//! (`ZSTD_compressSequences`). A frame of 77 bytes on average paid its own headers and
//! entropy tables, and the encoder built those tables once per page. On recorded PG 15
//! pgbench WAL (24,268 hits) the frames took 1,874,147 bytes; the same matches in this form,
//! compressed by zstd -3 in one stream flushed every 1.3 kB (about a message's hits),
//! 538,684 (of the forms tried, literals after their lengths and the match's two numbers
//! after the literals compressed best among those that read forwards).
//!
//! ```text
//! hit   = piece … piece               the page's 8192 bytes in order; the piece whose
//!                                     literals reach the page's end is the last
//! piece = ll:varint  byte × ll        ll bytes as they are (literals)
//!         d:varint   ml:varint        then ml bytes (1 or more) copied one by one from
//!                                     position pos − zigzag⁻¹(d) of `reference ++ page`,
//!                                     where pos is where they go in the page (so d = 0 is
//!                                     the reference's same place; a source at 8192 or more
//!                                     is the page's own bytes before pos, which a run may
//!                                     overlap)
//! ```
//!
//! Every number is checked as it is read: literals and matches within the page, a source
//! before the byte it gives. The stream's cap (`payload::cap`: the message's length) holds
//! because the encoder sends a hit this way only when it takes no more bytes than the image
//! does in the WAL, and sends the other hits as frames through the normal path.

use super::streams::{put_varint, unzigzag, zigzag, Reader};
use super::wal::PAGE_SIZE;
use super::WalCodecError;

/// One match of [`super::hitparse`]: `lit` literals, then `ml` bytes copied from `offset`
/// bytes back in `reference ++ page` (so `offset` = [`PAGE_SIZE`] is the reference's same
/// place).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seq {
    pub offset: u32,
    pub lit: u32,
    pub ml: u32,
}

/// Appends the hit of `page` made of `seqs` (the bytes after the last match are literals) to
/// `out`; returns how many bytes, or None (and `out` as it was) when a match reaches outside
/// the page or before the reference.
pub fn put(seqs: &[Seq], page: &[u8; PAGE_SIZE], out: &mut Vec<u8>) -> Option<usize> {
    let start = out.len();
    let mut pos = 0usize;
    for s in seqs {
        let (lit, ml, offset) = (s.lit as usize, s.ml as usize, s.offset as usize);
        let after = pos + lit;
        if after + ml > PAGE_SIZE || ml == 0 || offset == 0 || offset > PAGE_SIZE + after {
            out.truncate(start);
            return None;
        }
        put_varint(out, lit as u64);
        out.extend_from_slice(&page[pos..after]);
        put_varint(out, zigzag(offset as i64 - PAGE_SIZE as i64));
        put_varint(out, ml as u64);
        pos = after + ml;
    }
    put_varint(out, (PAGE_SIZE - pos) as u64);
    out.extend_from_slice(&page[pos..]);
    Some(out.len() - start)
}

fn corrupt(msg: &str) -> WalCodecError {
    WalCodecError::Corrupt(format!("cache hit in HIT: {msg}"))
}

/// One piece read: the literals, then the match (source in `reference ++ page`, length), or
/// None for the last piece.
type Piece<'a> = (&'a [u8], Option<(usize, usize)>);

/// Reads the piece that starts at `pos` of the page.
fn piece<'a>(r: &mut Reader<'a>, pos: usize) -> Result<Piece<'a>, WalCodecError> {
    let ll = r.len(PAGE_SIZE - pos)?;
    let lit = r.bytes(ll)?;
    let after = pos + lit.len();
    if after == PAGE_SIZE {
        return Ok((lit, None));
    }
    let src = (after as i64).checked_sub(unzigzag(r.varint()?));
    let ml = r.len(PAGE_SIZE - after)?;
    if ml == 0 {
        return Err(corrupt("a match of no bytes"));
    }
    match src {
        Some(src) if (0..(PAGE_SIZE + after) as i64).contains(&src) => {
            Ok((lit, Some((src as usize, ml))))
        }
        _ => Err(corrupt(
            "a match from outside the reference and the page so far",
        )),
    }
}

/// Restores the page of the hit at `r` against `reference` into `page`.
pub fn apply(
    r: &mut Reader<'_>,
    reference: &[u8; PAGE_SIZE],
    page: &mut [u8; PAGE_SIZE],
) -> Result<(), WalCodecError> {
    let mut pos = 0;
    loop {
        let (lit, m) = piece(r, pos)?;
        page[pos..pos + lit.len()].copy_from_slice(lit);
        pos += lit.len();
        let Some((src, ml)) = m else {
            return Ok(());
        };
        copy_match(reference, page, src, pos, ml);
        pos += ml;
    }
}

/// Copies `ml` bytes from `src` of `reference ++ page` to `page[pos..]`, one by one where the
/// source overlaps the destination (a run). `src < PAGE_SIZE + pos` and `pos + ml <=
/// PAGE_SIZE` (checked by the caller).
fn copy_match(
    reference: &[u8; PAGE_SIZE],
    page: &mut [u8; PAGE_SIZE],
    mut src: usize,
    mut pos: usize,
    mut ml: usize,
) {
    if src < PAGE_SIZE {
        let n = ml.min(PAGE_SIZE - src);
        page[pos..pos + n].copy_from_slice(&reference[src..src + n]);
        if n == ml {
            return;
        }
        (src, pos, ml) = (PAGE_SIZE, pos + n, ml - n);
    }
    let from = src - PAGE_SIZE;
    if from + ml <= pos {
        page.copy_within(from..from + ml, pos);
    } else {
        for i in 0..ml {
            page[pos + i] = page[from + i];
        }
    }
}

/// The length of the hit at the start of `bytes` (the encoder takes a hit out of HIT again
/// when its image goes as the primary's bytes: `encoder/verify.rs`).
pub fn span(bytes: &[u8]) -> Result<usize, WalCodecError> {
    let mut r = Reader::new(bytes, "HIT");
    let mut pos = 0;
    loop {
        let (lit, m) = piece(&mut r, pos)?;
        pos += lit.len();
        let Some((_, ml)) = m else {
            return Ok(r.position());
        };
        pos += ml;
    }
}

#[cfg(test)]
mod tests;
