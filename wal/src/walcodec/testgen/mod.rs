//! Synthetic WAL: the one generator of the unit tests, the property tests and the fuzz targets
//! (outside this crate's own tests it is behind the feature `testgen`).
//!
//! [`WalGen`] writes WAL the way PostgreSQL lays it out: page headers (long at segment
//! starts), records crossing pages and segments (their 24-byte headers split too), MAXALIGN
//! padding, XLOG_SWITCH with its zero tail; each record has a real CRC, xl_prev and
//! xl_tot_len, and a block-header area with full-page images (holes, BKPIMAGE_APPLY, images
//! compressed with the major's methods) and block data. Every choice comes from an
//! [`Entropy`]: a seeded [`Rng`] in tests, the fuzzer's input ([`Src`]) in fuzz targets.
//!
//! Two mixes of records:
//!
//! - [`WalGen::random_record`] (`workload.rs`): like a workload: heap INSERT/UPDATE/DELETE
//!   whose tuples are edits of tuples written before (the tuple-delta paths), images of a
//!   small working set whose pages evolve (the block cache), commits, big records;
//! - [`WalGen::shaped_record`] (`shaped.rs`): every field from the entropy (resource manager,
//!   info, forks, holes, origins, top-level xids, images compressed as PostgreSQL does, with
//!   settings it does not use, or garbage flagged as compressed), so that fuzzing reaches
//!   every path of the codec's record parser.
//!
//! [`corrupt`] and [`split`] damage the result and cut it into messages.

use std::collections::HashMap;

use super::fpi::Recompressor;
use super::wal::{
    seal_record, BlockKey, BKPBLOCK_FORK_MASK, BKPBLOCK_HAS_DATA, BKPBLOCK_HAS_IMAGE,
    BKPBLOCK_SAME_REL, BKPIMAGE_HAS_HOLE, PAGE_SIZE, REC_HDR, WAL_PAGE, XLP_BKP_REMOVABLE,
    XLP_FIRST_IS_CONTRECORD, XLP_LONG_HEADER, XLR_BLOCK_ID_DATA_LONG, XLR_BLOCK_ID_DATA_SHORT,
    XLR_BLOCK_ID_ORIGIN, XLR_BLOCK_ID_TOPLEVEL_XID,
};
use crate::pg::PgMajor;

mod entropy;
mod shaped;
mod workload;

pub use entropy::{corrupt, split, Entropy, Rng, Src};
pub use shaped::{shaped, MAX_SHAPED};

/// Block `blkno` of relation `rel`'s main fork in the default tablespace (1663) of database
/// 5: the block the tests' records and caches use.
pub fn block_key(rel: u32, blkno: u32) -> BlockKey {
    BlockKey {
        spc: 1663,
        db: 5,
        rel,
        fork: 0,
        blkno,
    }
}

/// The full-page image of a block reference, if it has one.
pub enum Image {
    None,
    /// The block's next page version (the generator keeps one per block: a heap-like page
    /// that gains a tuple each time), its hole between pd_lower and pd_upper. `compressed`:
    /// compressed by [`WalGen::compressor`] when there is one (uncompressed when it declines,
    /// as PostgreSQL does), else random bytes flagged as pglz stand in for compressed data.
    Evolved {
        compressed: bool,
    },
    /// A page given whole.
    Given(GivenImage),
}

/// A page image as the caller made it.
pub struct GivenImage {
    pub page: Box<[u8; PAGE_SIZE]>,
    pub hole_offset: u16,
    pub hole_len: u16,
    /// BKPIMAGE_APPLY.
    pub apply: bool,
    /// The image's bytes compressed and the bimg_info flag of their method; `None`: stored
    /// as it is (without the hole).
    pub compressed: Option<(Vec<u8>, u8)>,
}

/// One block reference to put into a record.
pub struct GenBlock {
    pub key: BlockKey,
    pub image: Image,
    pub data: Vec<u8>,
}

/// Compresses a page without its hole: the bytes and the bimg_info method flag, or `None`
/// where PostgreSQL would store the image uncompressed.
pub type Compressor = Box<dyn FnMut(&[u8]) -> Option<(Vec<u8>, u8)>>;

/// The generator: the WAL written so far and what later records build on.
pub struct WalGen<E: Entropy = Rng> {
    pub magic: u16,
    pub pg_major: PgMajor,
    pub tli: u32,
    pub sysid: u64,
    pub seg_size: u64,
    /// XLP_BKP_REMOVABLE in page headers.
    pub bkp_removable: bool,
    /// LSN of `buf[0]`.
    pub start: u64,
    pub buf: Vec<u8>,
    /// Start of the last record (the next one's xl_prev).
    prev: u64,
    pub rng: E,
    pages: HashMap<BlockKey, Vec<u8>>,
    /// Heap tuples written by the generated heap records, by (block, offset).
    tuples: HashMap<(BlockKey, u16), Vec<u8>>,
    /// Records whose 24-byte header was split by a page boundary.
    pub split_headers: usize,
    pub records: usize,
    pub xid: u32,
    /// Compresses the images of [`Image::Evolved`] marked `compressed`.
    pub compressor: Option<Compressor>,
    /// Compression contexts of [`WalGen::shaped_record`], made when first needed.
    recomp: Option<Recompressor>,
}

impl WalGen<Rng> {
    /// A generator seeded with `seed` whose stream starts at `start` (a page boundary;
    /// a segment boundary gives a long header first).
    pub fn new(pg_major: PgMajor, seg_size: u64, start: u64, seed: u64) -> WalGen<Rng> {
        WalGen::with_entropy(pg_major, seg_size, start, Rng::new(seed))
    }
}

impl<E: Entropy> WalGen<E> {
    /// A generator taking its choices from `rng`.
    pub fn with_entropy(pg_major: PgMajor, seg_size: u64, start: u64, rng: E) -> WalGen<E> {
        WalGen {
            magic: pg_major.page_magic(),
            pg_major,
            tli: 1,
            sysid: 0x7000_1234_5678_9ABC,
            seg_size,
            bkp_removable: true,
            start,
            buf: Vec::new(),
            prev: 0,
            rng,
            pages: HashMap::new(),
            tuples: HashMap::new(),
            split_headers: 0,
            records: 0,
            xid: 1000,
            compressor: None,
            recomp: None,
        }
    }

    pub fn pos(&self) -> u64 {
        self.start + self.buf.len() as u64
    }

    fn page_header(&mut self, rem: u32) {
        let pos = self.pos();
        let long = pos % self.seg_size == 0;
        let mut info: u16 = 0;
        if self.bkp_removable {
            info |= XLP_BKP_REMOVABLE;
        }
        if rem > 0 {
            info |= XLP_FIRST_IS_CONTRECORD;
        }
        if long {
            info |= XLP_LONG_HEADER;
        }
        let b = &mut self.buf;
        b.extend_from_slice(&self.magic.to_le_bytes());
        b.extend_from_slice(&info.to_le_bytes());
        b.extend_from_slice(&self.tli.to_le_bytes());
        b.extend_from_slice(&pos.to_le_bytes());
        b.extend_from_slice(&rem.to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        if long {
            b.extend_from_slice(&self.sysid.to_le_bytes());
            b.extend_from_slice(&(self.seg_size as u32).to_le_bytes());
            b.extend_from_slice(&8192u32.to_le_bytes());
        }
    }

    /// Writes a complete record (header + body, CRC filled in) at the current position.
    pub fn write_record(&mut self, rec: &[u8]) {
        if self.pos() % WAL_PAGE == 0 {
            self.page_header(0);
        }
        let start = self.pos();
        let mut k = 0;
        while k < rec.len() {
            if self.pos() % WAL_PAGE == 0 {
                self.page_header((rec.len() - k) as u32);
            }
            let room = (WAL_PAGE - self.pos() % WAL_PAGE) as usize;
            if k < REC_HDR && room < REC_HDR - k {
                self.split_headers += 1;
            }
            let n = (rec.len() - k).min(room);
            self.buf.extend_from_slice(&rec[k..k + n]);
            k += n;
        }
        self.prev = start;
        self.records += 1;
        while self.pos() % 8 != 0 {
            self.buf.push(0);
        }
    }

    /// Builds a record: blocks (images from the evolving page of each key) and main data;
    /// one record in ten names a top-level xid.
    pub fn record(
        &mut self,
        rmid: u8,
        info: u8,
        xid: u32,
        blocks: &[GenBlock],
        main: &[u8],
    ) -> Vec<u8> {
        let (area, payload) = self.block_area(blocks);
        let toplevel = (self.rng.below(10) == 0).then(|| xid.wrapping_sub(3));
        let head = RecordHead {
            rmid,
            info,
            xid,
            origin: None,
            toplevel,
        };
        self.assemble(&head, area, &payload, main)
    }

    /// The block headers of `blocks` and the bytes that follow the area for them (images,
    /// then data, block by block).
    fn block_area(&mut self, blocks: &[GenBlock]) -> (Vec<u8>, Vec<u8>) {
        let mut area = Vec::new();
        let mut payload = Vec::new();
        let mut last_rel = None;
        for (id, b) in blocks.iter().enumerate() {
            let mut flags = b.key.fork & BKPBLOCK_FORK_MASK;
            let same = last_rel == Some((b.key.spc, b.key.db, b.key.rel));
            if same {
                flags |= BKPBLOCK_SAME_REL;
            }
            if !b.data.is_empty() {
                flags |= BKPBLOCK_HAS_DATA;
            }
            if !matches!(b.image, Image::None) {
                flags |= BKPBLOCK_HAS_IMAGE;
            }
            area.push(id as u8);
            area.push(flags);
            area.extend_from_slice(&(b.data.len() as u16).to_le_bytes());
            match &b.image {
                Image::None => {}
                Image::Evolved { compressed } => {
                    self.evolved_image(&b.key, *compressed, &mut area, &mut payload)
                }
                Image::Given(img) => self.given_image(img, &mut area, &mut payload),
            }
            if !same {
                area.extend_from_slice(&b.key.spc.to_le_bytes());
                area.extend_from_slice(&b.key.db.to_le_bytes());
                area.extend_from_slice(&b.key.rel.to_le_bytes());
            }
            area.extend_from_slice(&b.key.blkno.to_le_bytes());
            last_rel = Some((b.key.spc, b.key.db, b.key.rel));
            payload.extend_from_slice(&b.data);
        }
        (area, payload)
    }

    /// The image header and bytes of [`Image::Evolved`].
    fn evolved_image(
        &mut self,
        key: &BlockKey,
        compressed: bool,
        area: &mut Vec<u8>,
        payload: &mut Vec<u8>,
    ) {
        let apply = self.pg_major.bimg_apply();
        if compressed && self.compressor.is_none() {
            let len = 300 + self.rng.below(2000) as u16;
            area.extend_from_slice(&len.to_le_bytes());
            area.extend_from_slice(&100u16.to_le_bytes());
            area.push(apply | self.pg_major.bimg_pglz() | BKPIMAGE_HAS_HOLE);
            area.extend_from_slice(&2000u16.to_le_bytes());
            payload.extend_from_slice(&self.rng.bytes(len as usize));
            return;
        }
        let page = self.evolve(key);
        let lower = u16::from_le_bytes([page[12], page[13]]) as usize;
        let upper = u16::from_le_bytes([page[14], page[15]]) as usize;
        let (off, hole) = if upper > lower {
            (lower, upper - lower)
        } else {
            (0, 0)
        };
        // As PostgreSQL: uncompressed when compression does not pay.
        let comp = if compressed {
            self.compress_page(&page, off, hole)
        } else {
            None
        };
        if let Some((bytes, flag)) = comp {
            area.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
            area.extend_from_slice(&(off as u16).to_le_bytes());
            area.push(apply | flag | u8::from(hole > 0));
            if hole > 0 {
                area.extend_from_slice(&(hole as u16).to_le_bytes());
            }
            payload.extend_from_slice(&bytes);
        } else if hole > 0 {
            area.extend_from_slice(&((PAGE_SIZE - hole) as u16).to_le_bytes());
            area.extend_from_slice(&(lower as u16).to_le_bytes());
            area.push(apply | BKPIMAGE_HAS_HOLE);
            payload.extend_from_slice(&page[..lower]);
            payload.extend_from_slice(&page[upper..]);
        } else {
            area.extend_from_slice(&(PAGE_SIZE as u16).to_le_bytes());
            area.extend_from_slice(&0u16.to_le_bytes());
            area.push(apply);
            payload.extend_from_slice(&page);
        }
    }

    /// The image header and bytes of [`Image::Given`].
    fn given_image(&self, img: &GivenImage, area: &mut Vec<u8>, payload: &mut Vec<u8>) {
        let (ho, hl) = (usize::from(img.hole_offset), usize::from(img.hole_len));
        let mut info = if hl > 0 { BKPIMAGE_HAS_HOLE } else { 0 };
        if img.apply {
            info |= self.pg_major.bimg_apply();
        }
        match &img.compressed {
            Some((bytes, flag)) => {
                area.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
                area.extend_from_slice(&img.hole_offset.to_le_bytes());
                area.push(info | flag);
                if hl > 0 {
                    area.extend_from_slice(&img.hole_len.to_le_bytes());
                }
                payload.extend_from_slice(bytes);
            }
            None => {
                area.extend_from_slice(&((PAGE_SIZE - hl) as u16).to_le_bytes());
                area.extend_from_slice(&img.hole_offset.to_le_bytes());
                area.push(info);
                payload.extend_from_slice(&img.page[..ho]);
                payload.extend_from_slice(&img.page[ho + hl..]);
            }
        }
    }

    /// The whole record: header (xl_tot_len, xl_prev, CRC), the block area, origin,
    /// top-level xid and main data headers, then the payload and the main data.
    fn assemble(&self, h: &RecordHead, mut area: Vec<u8>, payload: &[u8], main: &[u8]) -> Vec<u8> {
        if let Some(origin) = h.origin {
            area.push(XLR_BLOCK_ID_ORIGIN);
            area.extend_from_slice(&origin.to_le_bytes());
        }
        if let Some(xid) = h.toplevel {
            area.push(XLR_BLOCK_ID_TOPLEVEL_XID);
            area.extend_from_slice(&xid.to_le_bytes());
        }
        if !main.is_empty() {
            if main.len() < 256 {
                area.push(XLR_BLOCK_ID_DATA_SHORT);
                area.push(main.len() as u8);
            } else {
                area.push(XLR_BLOCK_ID_DATA_LONG);
                area.extend_from_slice(&(main.len() as u32).to_le_bytes());
            }
        }
        let tot = REC_HDR + area.len() + payload.len() + main.len();
        let mut rec = Vec::with_capacity(tot);
        rec.extend_from_slice(&(tot as u32).to_le_bytes());
        rec.extend_from_slice(&h.xid.to_le_bytes());
        rec.extend_from_slice(&self.prev.to_le_bytes());
        rec.extend_from_slice(&[h.info, h.rmid, 0, 0, 0, 0, 0, 0]);
        rec.extend_from_slice(&area);
        rec.extend_from_slice(payload);
        rec.extend_from_slice(main);
        seal_record(&mut rec);
        rec
    }

    /// `page` without its hole compressed by `compressor`: (bytes, method flag).
    fn compress_page(&mut self, page: &[u8], off: usize, hole: usize) -> Option<(Vec<u8>, u8)> {
        let f = self.compressor.as_mut()?;
        let mut src = page[..off].to_vec();
        src.extend_from_slice(&page[off + hole..]);
        f(&src)
    }

    /// The next version of a block's page: a heap-like page (pd_lower/pd_upper at 12/14) with
    /// one more tuple and a few changed bytes.
    fn evolve(&mut self, key: &BlockKey) -> Vec<u8> {
        let WalGen { pages, rng, .. } = self;
        let page = pages.entry(*key).or_insert_with(|| {
            let mut p = vec![0u8; PAGE_SIZE];
            p[12..14].copy_from_slice(&24u16.to_le_bytes());
            p[14..16].copy_from_slice(&(PAGE_SIZE as u16).to_le_bytes());
            p[16..18].copy_from_slice(&(PAGE_SIZE as u16).to_le_bytes());
            p
        });
        let lower = u16::from_le_bytes([page[12], page[13]]) as usize;
        let upper = u16::from_le_bytes([page[14], page[15]]) as usize;
        let tlen = 40 + rng.below(80) as usize;
        if upper >= lower + 4 + tlen + 64 {
            let nu = upper - tlen;
            let t = rng.tuple(tlen);
            page[nu..upper].copy_from_slice(&t);
            page[lower..lower + 4]
                .copy_from_slice(&((nu as u32) | (1 << 15) | ((tlen as u32) << 17)).to_le_bytes());
            page[12..14].copy_from_slice(&((lower + 4) as u16).to_le_bytes());
            page[14..16].copy_from_slice(&(nu as u16).to_le_bytes());
        } else {
            // Full: "vacuum" it by flipping some tuple bytes.
            for _ in 0..8 {
                let i = upper + rng.below((PAGE_SIZE - upper) as u64) as usize;
                page[i] ^= 0x5A;
            }
        }
        // Page LSN changes every time.
        let lsn = rng.next_u64();
        page[0..8].copy_from_slice(&lsn.to_le_bytes());
        page.clone()
    }

    /// Writes the XLOG_SWITCH record and the zero tail (page headers zeroed too, as PostgreSQL
    /// 14+ does) up to the segment end.
    pub fn switch(&mut self) {
        let rec = self.record(0, 0x40, 0, &[], &[]);
        self.write_record(&rec);
        let end = (self.pos() / self.seg_size + 1) * self.seg_size;
        if self.pos() % self.seg_size != 0 {
            self.buf.resize((end - self.start) as usize, 0);
        }
    }
}

/// The header fields of a record besides its lengths, xl_prev and CRC.
struct RecordHead {
    rmid: u8,
    info: u8,
    xid: u32,
    /// XLR_BLOCK_ID_ORIGIN: the replication origin.
    origin: Option<u16>,
    /// XLR_BLOCK_ID_TOPLEVEL_XID.
    toplevel: Option<u32>,
}
