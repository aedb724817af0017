//! The workload-like mix of records ([`WalGen::random_record`]).

use super::{Entropy, GenBlock, Image, WalGen};
use crate::walcodec::wal::{BlockKey, WAL_PAGE};

/// An uncompressed image of the block's next page version, or none.
fn evolved_if(image: bool) -> Image {
    if image {
        Image::Evolved { compressed: false }
    } else {
        Image::None
    }
}

impl<E: Entropy> WalGen<E> {
    pub fn random_record(&mut self, blocks_in_play: u32) {
        let r = self.rng.below(100);
        self.xid += self.rng.below(3) as u32;
        let xid = self.xid;
        let key = |rng: &mut E, n: u32| BlockKey {
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
                image: Image::None,
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
                    image: Image::Evolved { compressed },
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
        let off = |rng: &mut E| 1 + rng.below(6) as u16;
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
            new[i] = self.rng.u8();
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
            image: evolved_if(self.rng.below(5) == 0),
            data,
        }];
        if info != 0x00 {
            blocks.push(GenBlock {
                key: other,
                image: evolved_if(self.rng.below(4) == 0),
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
