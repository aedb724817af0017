//! The mix of records whose every field comes from the entropy ([`WalGen::shaped_record`]),
//! for fuzzing: well-formed the way PostgreSQL writes WAL, so the codec's record paths run and
//! not only its raw pass-through.

use super::{Entropy, GenBlock, GivenImage, Image, RecordHead, Src, WalGen};
use crate::pg::PgMajor;
use crate::segment::WalSegSize;
use crate::walcodec::fpi::{Method, Recompressor};
use crate::walcodec::pglz::{Pglz, STRATEGY_ALWAYS};
use crate::walcodec::wal::{BlockKey, ImageRef, PAGE_SIZE, WAL_PAGE};

/// Most WAL [`shaped`] generates, to keep fuzz executions fast.
pub const MAX_SHAPED: usize = 96 * 1024;

/// WAL of `major` generated from a fuzzer's input, starting at the page boundary `start`
/// (16 MiB segments): the page-header flags, then [`WalGen::shaped_record`]s until the input
/// is used up or the WAL reaches [`MAX_SHAPED`] bytes. `src` is left after what it used.
pub fn shaped(src: &mut Src<'_>, major: PgMajor, start: u64) -> Vec<u8> {
    debug_assert_eq!(start % WAL_PAGE, 0);
    let seg = WalSegSize::DEFAULT.bytes();
    let mut g = WalGen::with_entropy(major, seg, start, src);
    let flags = g.rng.u8();
    g.tli = 1 + u32::from(flags & 1);
    g.bkp_removable = flags & 2 != 0;
    g.sysid = 7_000_000_000_000_000_000 + u64::from(flags);
    g.prev = start.saturating_sub(0x48);
    while !g.rng.exhausted() && g.buf.len() < MAX_SHAPED {
        g.shaped_record();
    }
    g.buf
}

impl<E: Entropy> WalGen<E> {
    /// Writes one record every field of which comes from the entropy: up to 4 blocks (fork,
    /// relation, block number, data, a page image given by [`WalGen::shaped_image`]), the
    /// resource manager and info (never XLOG_SWITCH), an origin, a top-level xid, main data.
    pub fn shaped_record(&mut self) {
        let kind = self.rng.u8();
        let xid = self.rng.u32() % 1000;
        let rmid = self.rng.u8() % 22;
        let mut info = self.rng.u8();
        if rmid == 0 && info & 0xF0 == 0x40 {
            info ^= 0x10; // no XLOG_SWITCH (its zero tail is another layout)
        }
        let mut blocks: Vec<GenBlock> = Vec::new();
        for _ in 0..kind % 5 {
            let f = self.rng.u8();
            let data_len = if f & 2 != 0 {
                1 + usize::from(self.rng.u8())
            } else {
                0
            };
            let image = if f & 1 != 0 {
                Image::Given(self.shaped_image())
            } else {
                Image::None
            };
            // The previous block's relation (then written as BKPBLOCK_SAME_REL) or one of 3.
            let rel = match blocks.last() {
                Some(last) if f & 4 != 0 => last.key.rel,
                _ => 16384 + u32::from(self.rng.u8() % 3),
            };
            let key = BlockKey {
                spc: 1663,
                db: 5,
                rel,
                fork: (f >> 4) & 3,
                blkno: u32::from(self.rng.u8() % 4),
            };
            let data = self.rng.bytes(data_len);
            blocks.push(GenBlock { key, image, data });
        }
        let origin = (kind & 0x20 != 0).then(|| self.rng.u16());
        let toplevel = (kind & 0x40 != 0).then(|| self.rng.u32());
        let main_len = usize::from(self.rng.u8()) * if kind & 0x80 != 0 { 3 } else { 1 };
        let main = self.rng.bytes(main_len);
        let (area, payload) = self.block_area(&blocks);
        let head = RecordHead {
            rmid,
            info,
            xid,
            origin,
            toplevel,
        };
        let rec = self.assemble(&head, area, &payload, &main);
        self.write_record(&rec);
    }

    /// A page image from the entropy: a header-like prefix and a few bytes elsewhere (zeros
    /// around them, like a sparse heap page), maybe a hole, BKPIMAGE_APPLY or not; a quarter
    /// compressed by [`compress`].
    pub fn shaped_image(&mut self) -> GivenImage {
        let g = self.rng.u8();
        let (hole_offset, hole_len) = if g & 1 != 0 {
            let off = 24 + 4 * u16::from(self.rng.u8());
            let len = 8 * (1 + u16::from(self.rng.u8()) * 4);
            (off, len.min(PAGE_SIZE as u16 - off - 8))
        } else {
            (0, 0)
        };
        let mut page = Box::new([0u8; PAGE_SIZE]);
        page[..24].copy_from_slice(&self.rng.bytes(24));
        let at = 24 + usize::from(self.rng.u16()) % (PAGE_SIZE - 24 - 64);
        let n = usize::from(self.rng.u8() % 64);
        page[at..at + n].copy_from_slice(&self.rng.bytes(n));
        // A quarter of the images (compressing costs much in unoptimised builds).
        let compressed = if g & 0x84 == 0x84 {
            let major = self.pg_major;
            let r = self.recomp.get_or_insert_with(|| {
                Recompressor::new().expect("zstd contexts for the test generator")
            });
            let hole = (usize::from(hole_offset), usize::from(hole_len));
            compress(r, major, (g >> 3) & 0xF, &page, hole)
        } else {
            None
        };
        GivenImage {
            page,
            hole_offset,
            hole_len,
            apply: g & 2 != 0,
            compressed,
        }
    }
}

/// The page without its hole compressed with the method `sel` picks, and the bimg_info flag
/// of that method in `major`; `None` where PostgreSQL would keep the image uncompressed.
/// Besides PostgreSQL's own calls: valid pglz with another strategy (the codec must send the
/// original bytes) and garbage flagged as compressed.
fn compress(
    r: &mut Recompressor,
    major: PgMajor,
    sel: u8,
    page: &[u8; PAGE_SIZE],
    (ho, hl): (usize, usize),
) -> Option<(Vec<u8>, u8)> {
    let (m, flag) = match (sel % 5, major.bimg_lz4(), major.bimg_zstd()) {
        (1, Some(f), _) => (Method::Lz4, f),
        (2, _, Some(f)) => (Method::Zstd, f),
        _ => (Method::Pglz, major.bimg_pglz()),
    };
    let img = ImageRef {
        len: 0,
        hole_offset: ho as u16,
        hole_len: hl as u16,
        compressed: true,
        info: flag,
    };
    let mut out = Vec::new();
    match sel % 5 {
        // Valid pglz, but not what PostgreSQL's default strategy makes.
        3 => {
            let mut raw = page[..ho].to_vec();
            raw.extend_from_slice(&page[ho + hl..]);
            Pglz::new().compress(&raw, &STRATEGY_ALWAYS, &mut out)?;
            (out.len() + 2 < raw.len()).then_some(())?;
        }
        // Garbage flagged as compressed.
        4 => out.extend_from_slice(&page[..(PAGE_SIZE - hl).min(64)]),
        _ => r.compress(m, &img, page, &mut out).then_some(())?,
    }
    Some((out, flag))
}
