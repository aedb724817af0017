//! Shared by the walcodec targets: turns fuzzer bytes into WAL that is well-formed the way
//! PostgreSQL writes it (page headers, long headers at segment starts, MAXALIGNed records with
//! correct xl_tot_len, xl_prev and CRC, block-header areas with full-page images and block
//! data), so the codec's record paths run and not only its raw pass-through. Every choice
//! (record count, resource manager, blocks, images, holes, data lengths, contents) comes from
//! the input; optional corruption afterwards exercises the resync paths. Images may be
//! compressed as the primary does with wal_compression (pglz, lz4, zstd: the recompress path),
//! with pglz's "always" strategy (valid but not PostgreSQL's bytes: the fallback path) or be
//! garbage flagged as compressed.

#![allow(dead_code)] // each target uses part of it

use walrelay_wal::pg::PgMajor;
use walrelay_wal::walcodec::fpi::{Method, Recompressor};
use walrelay_wal::walcodec::pglz::{Pglz, STRATEGY_ALWAYS};
use walrelay_wal::walcodec::wal::{
    record_crc, ImageRef, PageTemplate, BKPBLOCK_HAS_DATA, BKPBLOCK_HAS_IMAGE, BKPBLOCK_SAME_REL,
    BKPIMAGE_HAS_HOLE, PAGE_SIZE, REC_HDR, WAL_PAGE, XLR_BLOCK_ID_DATA_LONG,
    XLR_BLOCK_ID_DATA_SHORT, XLR_BLOCK_ID_ORIGIN, XLR_BLOCK_ID_TOPLEVEL_XID,
};

/// Reads fuzzer bytes; yields zeros once the input is used up.
pub struct Src<'a> {
    pub b: &'a [u8],
}

impl Src<'_> {
    pub fn u8(&mut self) -> u8 {
        match self.b.split_first() {
            Some((&x, rest)) => {
                self.b = rest;
                x
            }
            None => 0,
        }
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | u64::from(self.u32()) << 32
    }
    pub fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.b.len());
        let (a, rest) = self.b.split_at(n);
        self.b = rest;
        a
    }
    pub fn is_empty(&self) -> bool {
        self.b.is_empty()
    }
}

/// PostgreSQL's default segment size (what the tracker assumes until it sees a long header).
const SEG_SIZE: u64 = walrelay_wal::segment::WalSegSize::DEFAULT.bytes();
/// Upper bound of generated WAL, to keep executions fast.
pub const MAX_WAL: usize = 96 * 1024;

/// Lays out a logical record stream into physical pages.
struct Pages {
    out: Vec<u8>,
    pos: u64,
    tmpl: PageTemplate,
}

impl Pages {
    /// Appends `b`, inserting page headers; `rem` is how many bytes of the current record
    /// remain including `b` (0 between records).
    fn put(&mut self, mut b: &[u8], mut rem: u32) {
        loop {
            if self.pos % WAL_PAGE == 0 {
                let long = self.pos % SEG_SIZE == 0;
                let (h, hl) = self
                    .tmpl
                    .build(self.pos, rem, long, SEG_SIZE)
                    .expect("page header");
                self.out.extend_from_slice(&h[..hl]);
                self.pos += hl as u64;
            }
            if b.is_empty() {
                return;
            }
            let room = (WAL_PAGE - self.pos % WAL_PAGE) as usize;
            let n = room.min(b.len());
            self.out.extend_from_slice(&b[..n]);
            self.pos += n as u64;
            rem = rem.saturating_sub(n as u32);
            b = &b[n..];
            if b.is_empty() && self.pos % WAL_PAGE != 0 {
                return;
            }
        }
    }
}

/// WAL generated from `src` for `pg_major`, starting at the page boundary `start`.
pub fn generate(src: &mut Src, pg_major: PgMajor, start: u64) -> Vec<u8> {
    debug_assert_eq!(start % WAL_PAGE, 0);
    let magic = pg_major.page_magic();
    let flags = src.u8();
    let mut w = Pages {
        out: Vec::new(),
        pos: start,
        tmpl: PageTemplate {
            magic,
            tli: 1 + u32::from(flags & 1),
            bkp_removable: flags & 2 != 0,
            sysid: Some(7_000_000_000_000_000_000 + u64::from(flags)),
        },
    };
    // Image flags: PG14 has BKPIMAGE_IS_COMPRESSED 0x02 and BKPIMAGE_APPLY 0x04; PG15+ has
    // BKPIMAGE_APPLY 0x02 and one compression flag per method.
    let apply: u8 = pg_major.bimg_apply();
    let mut recomp = Recompressor::new().expect("zstd context");
    let mut prev: u64 = start.saturating_sub(0x48);
    let mut rec = Vec::new();
    let mut data = Vec::new();
    while !src.is_empty() && w.out.len() < MAX_WAL {
        // Between records: pad to MAXALIGN (zeros), in the page.
        let pad = ((8 - w.pos % 8) % 8) as usize;
        if pad > 0 {
            w.put(&[0u8; 8][..pad], 0);
        }
        if w.pos % WAL_PAGE == 0 {
            // A record never starts exactly at a page boundary: the header comes first.
            w.put(&[], 0);
        }
        let this = w.pos;
        rec.clear();
        data.clear();
        rec.resize(REC_HDR, 0);
        let kind = src.u8();
        let xid = src.u32() % 1000;
        let rmid = src.u8() % 22;
        let mut info = src.u8();
        if rmid == 0 && info & 0xF0 == 0x40 {
            info ^= 0x10; // no XLOG_SWITCH (its zero tail is another layout)
        }
        let nblocks = kind % 5;
        let mut have_rel = false;
        for id in 0..nblocks {
            let f = src.u8();
            let has_image = f & 1 != 0;
            let has_data = f & 2 != 0;
            let same_rel = have_rel && f & 4 != 0;
            let mut fork_flags = (f >> 4) & 3;
            if has_image {
                fork_flags |= BKPBLOCK_HAS_IMAGE;
            }
            if has_data {
                fork_flags |= BKPBLOCK_HAS_DATA;
            }
            if same_rel {
                fork_flags |= BKPBLOCK_SAME_REL;
            }
            let data_len: u16 = if has_data { 1 + u16::from(src.u8()) } else { 0 };
            rec.push(id);
            rec.push(fork_flags);
            rec.extend_from_slice(&data_len.to_le_bytes());
            if has_image {
                let g = src.u8();
                let (hole_offset, hole_len) = if g & 1 != 0 {
                    let off = 24 + 4 * u16::from(src.u8());
                    let len = 8 * (1 + u16::from(src.u8()) * 4);
                    (off, len.min(PAGE_SIZE as u16 - off - 8))
                } else {
                    (0, 0)
                };
                // Page contents: a page header-ish prefix from the input, a few more input
                // bytes at an input-chosen place, zeros elsewhere (like a sparse heap page).
                let mut page = Box::new([0u8; PAGE_SIZE]);
                let head = src.bytes(24);
                page[..head.len()].copy_from_slice(head);
                let at = 24 + usize::from(src.u16()) % (PAGE_SIZE - 24 - 64);
                let n = usize::from(src.u8() % 64);
                let tail = src.bytes(n);
                page[at..at + tail.len()].copy_from_slice(tail);
                let (ho, hl) = (usize::from(hole_offset), usize::from(hole_len));
                let mut bimg_info = if hole_len > 0 { BKPIMAGE_HAS_HOLE } else { 0 };
                if g & 2 != 0 {
                    bimg_info |= apply;
                }
                // A quarter of the images (compressing costs much in unoptimised builds).
                let compressed = (g & 0x84 == 0x84)
                    .then(|| compress(&mut recomp, pg_major, (g >> 3) & 0xF, &page, ho, hl))
                    .flatten();
                if let Some((bytes, flag)) = compressed {
                    rec.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
                    rec.extend_from_slice(&hole_offset.to_le_bytes());
                    rec.push(bimg_info | flag);
                    if hole_len > 0 {
                        rec.extend_from_slice(&hole_len.to_le_bytes());
                    }
                    data.extend_from_slice(&bytes);
                } else {
                    let bimg_len = PAGE_SIZE as u16 - hole_len;
                    rec.extend_from_slice(&bimg_len.to_le_bytes());
                    rec.extend_from_slice(&hole_offset.to_le_bytes());
                    rec.push(bimg_info);
                    data.extend_from_slice(&page[..ho]);
                    data.extend_from_slice(&page[ho + hl..]);
                }
            }
            if !same_rel {
                let r = src.u8() % 3;
                rec.extend_from_slice(&1663u32.to_le_bytes());
                rec.extend_from_slice(&5u32.to_le_bytes());
                rec.extend_from_slice(&(16384 + u32::from(r)).to_le_bytes());
                have_rel = true;
            }
            rec.extend_from_slice(&u32::from(src.u8() % 4).to_le_bytes());
            let d = src.bytes(usize::from(data_len)).to_vec();
            data.extend_from_slice(&d);
            data.resize(data.len() + usize::from(data_len) - d.len(), 0x11);
        }
        if kind & 0x20 != 0 {
            rec.push(XLR_BLOCK_ID_ORIGIN);
            rec.extend_from_slice(&src.u16().to_le_bytes());
        }
        if kind & 0x40 != 0 {
            rec.push(XLR_BLOCK_ID_TOPLEVEL_XID);
            rec.extend_from_slice(&src.u32().to_le_bytes());
        }
        let main_len = usize::from(src.u8()) * if kind & 0x80 != 0 { 3 } else { 1 };
        if main_len > 0 {
            if main_len < 256 {
                rec.push(XLR_BLOCK_ID_DATA_SHORT);
                rec.push(main_len as u8);
            } else {
                rec.push(XLR_BLOCK_ID_DATA_LONG);
                rec.extend_from_slice(&(main_len as u32).to_le_bytes());
            }
            let d = src.bytes(main_len).to_vec();
            data.extend_from_slice(&d);
            data.resize(data.len() + main_len - d.len(), 0x22);
        }
        rec.extend_from_slice(&data);
        let tot = rec.len() as u32;
        rec[0..4].copy_from_slice(&tot.to_le_bytes());
        rec[4..8].copy_from_slice(&xid.to_le_bytes());
        rec[8..16].copy_from_slice(&prev.to_le_bytes());
        rec[16] = info;
        rec[17] = rmid;
        let crc = record_crc(&rec);
        rec[20..24].copy_from_slice(&crc.to_le_bytes());
        w.put(&rec, tot);
        prev = this;
    }
    w.out
}

/// The page without its hole compressed with the method `sel` picks, and the bimg_info flag
/// of that method in `pg_major`; None where PostgreSQL would keep the image uncompressed.
fn compress(
    r: &mut Recompressor,
    pg_major: PgMajor,
    sel: u8,
    page: &[u8; PAGE_SIZE],
    ho: usize,
    hl: usize,
) -> Option<(Vec<u8>, u8)> {
    let (m, flag) = match (sel % 5, pg_major.bimg_lz4(), pg_major.bimg_zstd()) {
        (1, Some(f), _) => (Method::Lz4, f),
        (2, _, Some(f)) => (Method::Zstd, f),
        _ => (Method::Pglz, pg_major.bimg_pglz()),
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

/// Flips bytes of `wal` at input-chosen places (each entry: u16 position, xor byte).
pub fn corrupt(src: &mut Src, wal: &mut [u8], count: usize) {
    for _ in 0..count {
        let at = usize::from(src.u16());
        let x = src.u8();
        if let Some(b) = wal.get_mut(at) {
            *b ^= x.max(1);
        }
    }
}

/// Splits `len` bytes into message lengths taken from the input (1..=`max` each; the rest as
/// one message when the input runs out).
pub fn split(src: &mut Src, len: usize, max: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut left = len;
    while left > 0 {
        let n = if src.is_empty() {
            left
        } else {
            (1 + usize::from(src.u16()) * 2 % max).min(left)
        };
        v.push(n);
        left -= n;
    }
    v
}
