//! Synthetic WAL for the tests: valid page headers (long at segment starts), records with real
//! CRCs and block headers, full-page images with holes that evolve per block, records crossing
//! pages and segments (headers split too), XLOG_SWITCH with its zero tail.

use std::collections::HashMap;

use super::wal::{record_crc, BlockKey, PAGE_SIZE, WAL_PAGE};
use crate::pg::PgMajor;

/// Small deterministic PRNG (xorshift64*).
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    /// Bytes that look like tuple data: mostly small integers and repeats.
    pub fn tuple(&mut self, n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| {
                if self.below(4) == 0 {
                    self.next() as u8
                } else {
                    (i % 7) as u8
                }
            })
            .collect()
    }
}

/// One block reference to put into a record.
pub struct GenBlock {
    pub key: BlockKey,
    pub image: bool,
    /// An opaque "compressed" image instead of a page.
    pub compressed: bool,
    pub data: Vec<u8>,
}

pub struct WalGen {
    pub magic: u16,
    pub pg_major: PgMajor,
    pub tli: u32,
    pub sysid: u64,
    pub seg_size: u64,
    /// LSN of `buf[0]`.
    pub start: u64,
    pub buf: Vec<u8>,
    prev: u64,
    pub rng: Rng,
    pages: HashMap<BlockKey, Vec<u8>>,
    /// Heap tuples written by the generated heap records, by (block, offset).
    tuples: HashMap<(BlockKey, u16), Vec<u8>>,
    /// Records whose 24-byte header was split by a page boundary.
    pub split_headers: usize,
    pub records: usize,
    pub xid: u32,
    /// Compresses the page (without its hole) of images marked `compressed`: the bytes and
    /// the bimg_info method flag, or None for an uncompressed image. Without it, random
    /// bytes stand in for compressed images.
    pub compressor: Option<Compressor>,
}

pub type Compressor = Box<dyn FnMut(&[u8]) -> Option<(Vec<u8>, u8)>>;

impl WalGen {
    /// A generator whose stream starts at `start` (a segment boundary).
    pub fn new(pg_major: PgMajor, seg_size: u64, start: u64, seed: u64) -> WalGen {
        WalGen {
            magic: pg_major.page_magic(),
            pg_major,
            tli: 1,
            sysid: 0x7000_1234_5678_9ABC,
            seg_size,
            start,
            buf: Vec::new(),
            prev: 0,
            rng: Rng::new(seed),
            pages: HashMap::new(),
            tuples: HashMap::new(),
            split_headers: 0,
            records: 0,
            xid: 1000,
            compressor: None,
        }
    }

    pub fn pos(&self) -> u64 {
        self.start + self.buf.len() as u64
    }

    fn page_header(&mut self, rem: u32) {
        let pos = self.pos();
        let long = pos % self.seg_size == 0;
        let mut info: u16 = 0x0004; // XLP_BKP_REMOVABLE
        if rem > 0 {
            info |= 0x0001;
        }
        if long {
            info |= 0x0002;
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
            if k < 24 && room < 24 - k {
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

    /// Builds a record: blocks (images from the evolving page of each key) and main data.
    pub fn record(
        &mut self,
        rmid: u8,
        info: u8,
        xid: u32,
        blocks: &[GenBlock],
        main: &[u8],
    ) -> Vec<u8> {
        let mut area = Vec::new();
        let mut payload = Vec::new();
        let mut last_rel = None;
        for (id, b) in blocks.iter().enumerate() {
            let mut flags = b.key.fork & 0x0F;
            let same = last_rel == Some((b.key.spc, b.key.db, b.key.rel));
            if same {
                flags |= 0x80;
            }
            if !b.data.is_empty() {
                flags |= 0x20;
            }
            if b.image {
                flags |= 0x10;
            }
            area.push(id as u8);
            area.push(flags);
            area.extend_from_slice(&(b.data.len() as u16).to_le_bytes());
            if b.image {
                let apply: u8 = self.pg_major.bimg_apply();
                if b.compressed && self.compressor.is_none() {
                    let len = 300 + self.rng.below(2000) as u16;
                    let comp: u8 = self.pg_major.bimg_pglz();
                    area.extend_from_slice(&len.to_le_bytes());
                    area.extend_from_slice(&100u16.to_le_bytes());
                    area.push(apply | comp | 0x01);
                    area.extend_from_slice(&2000u16.to_le_bytes());
                    payload.extend_from_slice(&self.rng.bytes(len as usize));
                } else {
                    let page = self.evolve(&b.key);
                    let lower = u16::from_le_bytes([page[12], page[13]]) as usize;
                    let upper = u16::from_le_bytes([page[14], page[15]]) as usize;
                    let (off, hole) = if upper > lower {
                        (lower, upper - lower)
                    } else {
                        (0, 0)
                    };
                    // As PostgreSQL: uncompressed when compression does not pay.
                    let comp = if b.compressed {
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
                        area.push(apply | 0x01);
                        payload.extend_from_slice(&page[..lower]);
                        payload.extend_from_slice(&page[upper..]);
                    } else {
                        area.extend_from_slice(&(PAGE_SIZE as u16).to_le_bytes());
                        area.extend_from_slice(&0u16.to_le_bytes());
                        area.push(apply);
                        payload.extend_from_slice(&page);
                    }
                }
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
        if self.rng.below(10) == 0 {
            area.push(252); // XLR_BLOCK_ID_TOPLEVEL_XID
            area.extend_from_slice(&(xid.wrapping_sub(3)).to_le_bytes());
        }
        if !main.is_empty() {
            if main.len() < 256 {
                area.push(255);
                area.push(main.len() as u8);
            } else {
                area.push(254);
                area.extend_from_slice(&(main.len() as u32).to_le_bytes());
            }
        }
        let tot = 24 + area.len() + payload.len() + main.len();
        let mut rec = Vec::with_capacity(tot);
        rec.extend_from_slice(&(tot as u32).to_le_bytes());
        rec.extend_from_slice(&xid.to_le_bytes());
        rec.extend_from_slice(&self.prev.to_le_bytes());
        rec.extend_from_slice(&[info, rmid, 0, 0, 0, 0, 0, 0]);
        rec.extend_from_slice(&area);
        rec.extend_from_slice(&payload);
        rec.extend_from_slice(main);
        let crc = record_crc(&rec);
        rec[20..24].copy_from_slice(&crc.to_le_bytes());
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
        let mut rng = self.rng.clone();
        let page = self.pages.entry(*key).or_insert_with(|| {
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
        let lsn = rng.next();
        page[0..8].copy_from_slice(&lsn.to_le_bytes());
        let out = page.clone();
        self.rng = rng;
        out
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

    /// A random mix of records: heap-ish updates, FPIs of a small working set, commits, big
    /// records crossing pages.
    pub fn random_record(&mut self, blocks_in_play: u32) {
        let r = self.rng.below(100);
        self.xid += self.rng.below(3) as u32;
        let xid = self.xid;
        let key = |rng: &mut Rng, n: u32| BlockKey {
            spc: 1663,
            db: 5,
            rel: 16384 + (rng.below(3) as u32),
            fork: 0,
            blkno: rng.below(u64::from(n.max(1))) as u32,
        };
        let rec = if r < 20 {
            // A small heap of its own, so that rows are updated again and again.
            let k = BlockKey {
                rel: 16390,
                blkno: self.rng.below(4) as u32,
                ..key(&mut self.rng, 1)
            };
            self.heap_record(k, xid)
        } else if r < 40 {
            let k = key(&mut self.rng, blocks_in_play);
            let n = 20 + self.rng.below(150) as usize;
            let data = self.rng.tuple(n);
            let main = self.rng.tuple(14);
            let b = [GenBlock {
                key: k,
                image: false,
                compressed: false,
                data,
            }];
            self.record(10, 0x20, xid, &b, &main)
        } else if r < 65 {
            let n = 1 + self.rng.below(3) as usize;
            let mut bs = Vec::new();
            let mut k = key(&mut self.rng, blocks_in_play);
            for i in 0..n {
                k.blkno = k.blkno.wrapping_add(i as u32);
                let data = if self.rng.below(2) == 0 {
                    self.rng.tuple(30)
                } else {
                    Vec::new()
                };
                let compressed = self.rng.below(8) == 0;
                bs.push(GenBlock {
                    key: k,
                    image: true,
                    compressed,
                    data,
                });
            }
            let main = self.rng.tuple(6);
            self.record(11, 0x10, xid, &bs, &main)
        } else if r < 90 {
            let n = 8 + self.rng.below(40) as usize;
            let main = self.rng.tuple(n);
            self.record(1, 0x00, xid, &[], &main)
        } else if r < 95 {
            let n = 300 + self.rng.below(20000) as usize;
            let main = self.rng.tuple(n);
            self.record(9, 0x30, 0, &[], &main)
        } else {
            // Land the next record near the end of a page, so its header gets split.
            let off = self.pos() % WAL_PAGE;
            let target = WAL_PAGE - 8 * (1 + self.rng.below(2));
            let want = if target > off + 64 {
                target - off
            } else {
                WAL_PAGE - off + target
            };
            let main_len = want.saturating_sub(24 + 5) as usize;
            let main = self.rng.tuple(main_len.max(1));
            let rec = self.record(1, 0x00, xid, &[], &main);
            self.write_record(&rec);
            let main = self.rng.tuple(40);
            self.record(1, 0x00, xid, &[], &main)
        };
        self.write_record(&rec);
    }

    /// A heap INSERT, UPDATE (to the same or another block, sometimes with the old tuple that
    /// wal_level=logical adds, sometimes with an image of the new block) or DELETE whose tuples
    /// are small edits of tuples written before at the same offsets: the tuple-delta paths.
    fn heap_record(&mut self, k: BlockKey, xid: u32) -> Vec<u8> {
        let off = |rng: &mut Rng| 1 + rng.below(6) as u16;
        let (old_off, new_off) = (off(&mut self.rng), off(&mut self.rng));
        let mut other = k;
        other.blkno = other.blkno.wrapping_add(1 + self.rng.below(2) as u32);
        let fresh = 60 + self.rng.below(200) as usize;
        let old = match self.tuples.get(&(other, old_off)) {
            Some(t) => t.clone(),
            None => self.rng.tuple(fresh),
        };
        let mut new = old.clone();
        for _ in 0..1 + self.rng.below(3) {
            let i = self.rng.below(new.len() as u64) as usize;
            new[i] = self.rng.next() as u8;
        }
        let header = [0u8, 0, 0, 0, 24];
        let op = self.rng.below(10);
        let (info, main, data) = if op < 2 {
            let mut m = new_off.to_le_bytes().to_vec();
            m.push(0);
            (0x00, m, [&header[..], &new].concat())
        } else if op < 3 {
            let mut m = vec![0u8; 8];
            m[4..6].copy_from_slice(&old_off.to_le_bytes());
            m[7] = if self.rng.below(2) == 0 { 0x02 } else { 0 };
            if m[7] != 0 {
                m.extend_from_slice(&header);
                m.extend_from_slice(&old);
            }
            (0x10, m, Vec::new())
        } else {
            let mut m = vec![0u8; 14];
            m[4..6].copy_from_slice(&old_off.to_le_bytes());
            m[7] = if self.rng.below(2) == 0 { 0x04 } else { 0 };
            m[12..14].copy_from_slice(&new_off.to_le_bytes());
            if m[7] != 0 {
                m.extend_from_slice(&header);
                m.extend_from_slice(&old);
            }
            (0x20, m, [&header[..], &new].concat())
        };
        let mut blocks = vec![GenBlock {
            key: k,
            image: self.rng.below(5) == 0,
            compressed: false,
            data,
        }];
        if info != 0x00 {
            blocks.push(GenBlock {
                key: other,
                image: self.rng.below(4) == 0,
                compressed: false,
                data: Vec::new(),
            });
        }
        if info == 0x10 {
            blocks.swap(0, 1);
            blocks.pop();
            blocks[0].key = other;
        }
        if info != 0x10 {
            self.tuples.insert((k, new_off), new);
        }
        self.record(10, info, xid, &blocks, &main)
    }
}
