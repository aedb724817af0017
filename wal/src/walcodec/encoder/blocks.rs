//! The encoder's per-block parts: heap tuples as deltas (see `walcodec::tuples`) and full-page
//! images through the block cache (page frames, the PAGE stream, images the primary
//! compressed).

use super::*;
use crate::walcodec::cache::Plan;
use crate::walcodec::mainxf;
use crate::walcodec::prunexf;

impl Encoder {
    /// Images and data, in block order, then main data (tuples as deltas, main data fields
    /// through `mainxf`); then what the record wrote into the tuple cache.
    pub(super) fn record_body(&mut self, rec: &[u8], xid: u32) -> Result<(), WalCodecError> {
        let tot = rec.len();
        let mut p = REC_HDR + self.area.len;
        let main = &rec[tot - self.area.main_len as usize..];
        let heap = HeapRec::parse(rec[17], rec[16], &self.area.blocks, main);
        let prune = prunexf::predict_record(
            self.pg_major,
            (rec[17], rec[16]),
            &self.area.blocks,
            &self.cache,
            &self.redo.candidates,
            &mut self.prune,
        );
        let blocks = std::mem::take(&mut self.area.blocks);
        self.seldom_reimaged =
            rec[17] == RM_XLOG_ID && matches!(rec[16] & 0xF0, XLOG_FPI | XLOG_FPI_FOR_HINT);
        let mut res = Ok(());
        let mut block0 = None;
        let mut expanded = false;
        let mut prune_zero = prune;
        // Every image first (so tuples may refer to any of them), then the data in order.
        let mut q = p;
        for b in &blocks {
            if let Some(img) = b.image {
                let bytes = &rec[q..q + usize::from(img.len)];
                if let Err(e) = self.encode_image(&b.key, &img, bytes) {
                    res = Err(e);
                    break;
                }
                q += usize::from(img.len);
            }
            q += usize::from(b.data_len);
        }
        for b in blocks.iter().filter(|_| res.is_ok()) {
            p += b.image.map_or(0, |img| usize::from(img.len));
            let d = usize::from(b.data_len);
            let data = &rec[p..p + d];
            if b.id == 0 && d > 0 {
                block0 = Some(p..p + d);
            }
            let stream = data_stream(rec[17], rec[16], d);
            let heap0 = heap.filter(|_| b.id == 0);
            // A cut update's old tuple, looked up once: its changed bytes go as a difference
            // from it, and the tuple cache gets the new tuple expanded with it.
            let old_user = heap0.and_then(|h| h.cut_old(&self.tuples, &self.cache));
            let mut changed = None;
            if let (Some(h), Some(old_user)) = (heap0, old_user) {
                self.expanded.clear();
                expanded = h.expand_cut(data, old_user, &mut self.expanded);
                changed = h
                    .changed_bytes(data, &blocks, old_user)
                    .map(|(at, r)| (at, &old_user[r]));
            }
            if let Some((at, old)) = changed {
                let out = &mut self.bufs[stream];
                let start = out.len() + at;
                out.extend_from_slice(data);
                tuples::changed_diff(&mut out[start..], old, true);
                self.stats.changed_diffs += 1;
            } else if prune && b.id == 0 {
                let out = &mut self.bufs[stream];
                let start = out.len();
                out.extend_from_slice(data);
                prunexf::apply_data(&mut out[start..], &self.prune);
                prune_zero &= prunexf::data_exact(&out[start..], &self.prune);
            } else {
                self.put_site(heap0.and_then(|h| h.block0_site(d)), stream, data);
            }
            self.stats.data_in += d as u64;
            p += d;
        }
        self.area.blocks = blocks;
        res?;
        let site = heap.and_then(|h| h.main_site(main.len()));
        let xl = MainXf::len(rec[17], rec[16]).min(main.len());
        let pl = if prune { prunexf::MAIN_LEN } else { 0 }.min(main.len());
        if xl > 0 || pl > 0 {
            let mut xmain = std::mem::take(&mut self.xmain);
            xmain.clear();
            xmain.extend_from_slice(main);
            let offnum = mainxf::predicted_offnum(rec[17], rec[16], &self.area.blocks, &self.cache);
            self.mainxf
                .forward(rec[17], rec[16], xid, offnum, &mut xmain[..xl]);
            prunexf::apply_main(&mut xmain[..pl], &self.prune);
            if prune {
                self.stats.prunes_predicted += 1;
                self.stats.prunes_data_exact += u64::from(prune_zero);
                if prune_zero && prunexf::main_exact(&xmain, &self.prune) {
                    self.stats.prunes_exact += 1;
                } else if prune_zero
                    && prunexf::main_missed_by_reason(&xmain, self.pg_major, &self.prune)
                {
                    self.stats.prunes_missed_by_reason += 1;
                }
            }
            self.put_site(site, S_MAIN, &xmain);
            self.xmain = xmain;
        } else {
            self.put_site(site, S_MAIN, main);
        }
        self.stats.data_in += (tot - p) as u64;
        if let Some(h) = heap {
            let expanded = expanded.then_some(&self.expanded[..]);
            h.feed(block0.map(|r| &rec[r]), xid, &mut self.tuples, expanded);
        }
        Ok(())
    }

    /// Writes `bytes` (block 0's data or main data) to `stream`, its tuple as a delta when a
    /// reference both ends hold saves enough (site marker in CTRL, see [`tuples`]).
    pub(super) fn put_site(&mut self, site: Option<tuples::Site>, stream: usize, bytes: &[u8]) {
        let Some(site) = site else {
            self.bufs[stream].extend_from_slice(bytes);
            return;
        };
        let (head, tuple) = bytes.split_at(site.skip);
        let ctrl = &mut self.bufs[S_CTRL];
        match tuples::choose(tuple, &site, &self.tuples, &self.cache) {
            Some((c, pre, suf)) => {
                ctrl.push(c);
                put_varint(ctrl, pre as u64);
                put_varint(ctrl, suf as u64);
                let out = &mut self.bufs[stream];
                out.extend_from_slice(head);
                out.extend_from_slice(&tuple[pre..tuple.len() - suf]);
                self.stats.tuple_deltas += 1;
                self.stats.tuple_delta_saved += (pre + suf) as u64;
            }
            None => {
                ctrl.push(0);
                self.bufs[stream].extend_from_slice(bytes);
                self.stats.tuple_misses += 1;
            }
        }
    }

    /// One block image: through the cache as a page frame when it can be rebuilt (for an
    /// image the primary compressed: when the receiver's recompression will give the same
    /// bytes), else as is.
    pub(super) fn encode_image(
        &mut self,
        key: &BlockKey,
        img: &ImageRef,
        bytes: &[u8],
    ) -> Result<(), WalCodecError> {
        self.stats.fpi_in += bytes.len() as u64;
        let recompress = if let Some(m) = self.pg_major.and_then(|m| fpi::recompressible(m, img)) {
            match self.recomp.open(m, img, bytes, &mut self.page) {
                // Sent as a page; the outcome is applied when the message ends.
                Ok(true) if self.parallel && self.defer_check(m, img, bytes)? => {}
                Ok(true) => {
                    let same = self.recomp.reproduces(m, img, &self.page, bytes);
                    self.recomp.checked(m, same);
                    if !same {
                        self.stats.fpi_recompress_mismatch += 1;
                        self.opaque_image(bytes);
                        return Ok(());
                    }
                }
                Ok(false) => {}
                Err(Refusal::Undecodable | Refusal::Mismatch) => {
                    self.stats.fpi_undecodable += 1;
                    self.opaque_image(bytes);
                    return Ok(());
                }
            }
            self.stats.fpi_recompressed += 1;
            IMG_RECOMPRESS
        } else if img.reconstructible() {
            let off = usize::from(img.hole_offset);
            let hole = usize::from(img.hole_len);
            let page = &mut self.page;
            page[..off].copy_from_slice(&bytes[..off]);
            page[off..off + hole].fill(0);
            page[off + hole..].copy_from_slice(&bytes[off..]);
            0
        } else {
            self.opaque_image(bytes);
            return Ok(());
        };
        self.encode_page(key, img, recompress)
    }

    /// Hands the check of the image in `self.page` to the worker (see `verify`); false when
    /// it is behind (the caller checks in place).
    fn defer_check(
        &mut self,
        m: fpi::Method,
        img: &ImageRef,
        bytes: &[u8],
    ) -> Result<bool, WalCodecError> {
        let page_in = page_stream(img);
        let at = Spot {
            op_at: self.bufs[S_CTRL].len(),
            img_at: self.bufs[S_IMG].len(),
            fpi_at: self.fpi.len(),
            page_in,
            page_at: self.bufs[page_in].len(),
            hit_at: self.bufs[S_HIT].len(),
        };
        self.verify.defer(m, img, &self.page, bytes, at)
    }

    fn opaque_image(&mut self, bytes: &[u8]) {
        self.stats.image_ops[usize::from(IMG_OPAQUE)] += 1;
        self.bufs[S_CTRL].push(IMG_OPAQUE);
        self.bufs[S_IMG].extend_from_slice(bytes);
        self.stats.fpi_opaque += 1;
    }

    /// The page of an image (in `self.page`) through the block cache; `recompress` is
    /// [`IMG_RECOMPRESS`] or 0, or-ed into the image op.
    fn encode_page(
        &mut self,
        key: &BlockKey,
        img: &ImageRef,
        recompress: u8,
    ) -> Result<(), WalCodecError> {
        let (op_at, frames_at) = (self.bufs[S_CTRL].len(), self.fpi.len());
        self.encode_page_op(key, img, recompress)?;
        if let Some(op) = self.bufs[S_CTRL].get(op_at) {
            let k = usize::from(op & 7);
            self.stats.image_ops[k] += 1;
            self.stats.image_frame_out[k] += (self.fpi.len() - frames_at) as u64;
        }
        Ok(())
    }

    fn encode_page_op(
        &mut self,
        key: &BlockKey,
        img: &ImageRef,
        recompress: u8,
    ) -> Result<(), WalCodecError> {
        self.stats.fpis += 1;
        let plan = self.cache.plan(key);
        if let (true, Some(r), Some(s)) = (plan.hit, plan.reference, plan.store) {
            if self.encode_hit(key, img, r, s, recompress) {
                return Ok(());
            }
        }
        tuples::page_prefix(&self.tuples, key, img.hole_offset, &mut self.tprefix);
        // A big image that is not a cache hit goes whole through PAGE, whose window holds the
        // recent pages, unless the block's known tuples make up half of it or more. Even when
        // the cache has a reference (the relation's most recent page) PAGE is smaller: on
        // recorded PG 15 WAL 12 % fewer bytes for pgbench's images, 3 % for a running bulk
        // load's, 1-2 % elsewhere (TOAST rewrites +0.1 %), and cheaper than a frame per page
        // (see `docs/bench/2026-11-24-pg15-page-stream.txt`). "Big" is the page's content,
        // not the image's size in the WAL: an image the primary compressed is as big as the
        // page it decompresses to (format 7: pgbench's cold window with pglz images 12 %
        // fewer bytes, encoded 14 % faster), as long as PAGE stays within the decoder's cap.
        let content = PAGE_SIZE.saturating_sub(usize::from(img.hole_len));
        let stream = page_stream(img);
        let room = self.bufs[stream].len() + PAGE_SIZE <= payload::cap(stream, self.msg_len);
        let framed = content < MIN_STREAM_IMAGE || 2 * self.tprefix.len() >= content || !room;
        // Pages whose items are text go plain (`PageXf::helps`).
        self.xf.forward(&self.page, &mut self.xpage);
        let helps = self.xf.helps();
        // Pages written whole by a bulk operation (an index build, a table rewrite,
        // CREATE DATABASE: XLOG_FPI records) are seldom seen again soon: streamed, they do
        // not enter the cache unless already there, which spares both ends the copy (and the
        // first touch of the cache's memory) and keeps the cache for the blocks that are. So
        // do pages logged for a hint bit (XLOG_FPI_FOR_HINT) of blocks the cache does not
        // hold: with data checksums (PostgreSQL 18's default) vacuum's first pass over a
        // freshly loaded table logs each of its pages so; on recorded PG 18 WAL this kept
        // 28,715 of a bulk load's pages (237 MB) out of the cache for 0.01 % fewer bytes, and
        // touched 13 of pgbench's 35,552 images (the others are hits: blocks it holds).
        let store = plan.store.filter(|_| framed || !self.seldom_reimaged);
        if framed {
            self.encode_framed(&plan, helps, recompress)?;
        } else {
            self.encode_streamed(stream, store, helps, recompress);
        }
        if let Some(s) = store {
            self.cache.store(s, key, &self.page);
        }
        Ok(())
    }

    /// A cache hit: the page against the previous image of the same block (slot `r`), as it
    /// is (see `pagexf`), alone: the block's records since were replayed onto it (`redo`), so
    /// it holds their tuples already (format version 5 in `walcodec`). Its matches go into
    /// HIT ([`hitcode`], format 12), unless they would take more bytes than the image does in
    /// the WAL (which keeps HIT within its cap, the message's length): false then, and the
    /// caller sends the page as any other against that reference. Stored into `s`.
    fn encode_hit(
        &mut self,
        key: &BlockKey,
        img: &ImageRef,
        r: u32,
        s: u32,
        recompress: u8,
    ) -> bool {
        if *self.cache.page(r) == *self.page {
            let ctrl = &mut self.bufs[S_CTRL];
            ctrl.push(IMG_IDENT | recompress);
            put_varint(ctrl, u64::from(s));
            self.cache.touch(s);
            self.stats.fpi_cache_hits += 1;
            self.stats.fpi_identical += 1;
            return true;
        }
        let seqs = self.hit.parse(self.cache.page(r), &self.page);
        let out = &mut self.bufs[S_HIT];
        let at = out.len();
        match hitcode::put(seqs, &self.page, out) {
            Some(n) if n <= usize::from(img.len) => {
                self.stats.fpi_hit_out += n as u64;
            }
            fits => {
                // A bound broken is a bug of the parse; a hit longer than its image, a page
                // the primary compressed to very little.
                debug_assert!(
                    fits.is_some(),
                    "a hit the encoder's own parse made out of bounds"
                );
                out.truncate(at);
                return false;
            }
        }
        let ctrl = &mut self.bufs[S_CTRL];
        ctrl.push(IMG_SAME | recompress);
        put_varint(ctrl, u64::from(s));
        self.stats.fpi_cache_hits += 1;
        self.cache.store(s, key, &self.page);
        true
    }

    /// A page framed on its own: transformed (`helps`), against the transformed reference
    /// if `plan` has one; with known tuples of the block (`tprefix`, which match the page as
    /// it is) also as it is, and the smaller frame is sent.
    fn encode_framed(
        &mut self,
        plan: &Plan,
        helps: bool,
        recompress: u8,
    ) -> Result<(), WalCodecError> {
        let tp = &self.tprefix[..];
        // (A reference comes with a slot to store into: no cache, no reference.)
        let reference = plan.store.and(plan.reference).map(|r| {
            if helps {
                self.xf.forward(self.cache.page(r), &mut self.xref);
            }
            (r, self.cache.page(r))
        });
        let at = self.fpi.len();
        let (mut len, mut plain) = (0, 0);
        if helps {
            let xr: &[u8] = reference.map_or(&[], |_| &self.xref[..]);
            len = self.pc.compress(&self.xpage, &[tp, xr], &mut self.fpi)?;
        }
        if !helps || !tp.is_empty() {
            let r: &[u8] = reference.map_or(&[], |(_, p)| &p[..]);
            let n = self.pc.compress(&self.page, &[tp, r], &mut self.fpi)?;
            if !helps || n < len {
                self.fpi.drain(at..at + len);
                (len, plain) = (n, IMG_PLAIN);
            } else {
                self.fpi.truncate(at + len);
            }
        }
        let flags = recompress | plain;
        let ctrl = &mut self.bufs[S_CTRL];
        match (reference, plan.store) {
            (Some((r, _)), Some(s)) => {
                ctrl.push(IMG_REF | flags);
                put_varint(ctrl, u64::from(r));
                put_varint(ctrl, u64::from(s));
            }
            (_, Some(s)) => {
                ctrl.push(IMG_NEW | flags);
                put_varint(ctrl, u64::from(s));
            }
            (_, None) => ctrl.push(IMG_NOCACHE | flags),
        }
        put_varint(ctrl, len as u64);
        Ok(())
    }

    /// A page whole through `stream` (PAGE, or LONG for long items: `format::page_stream`),
    /// transformed where that `helps`; stored into the cache slot `store`, if any.
    fn encode_streamed(&mut self, stream: usize, store: Option<u32>, helps: bool, recompress: u8) {
        let flags = recompress | if helps { 0 } else { IMG_PLAIN };
        let ctrl = &mut self.bufs[S_CTRL];
        match store {
            Some(s) => {
                ctrl.push(IMG_STREAM | flags);
                put_varint(ctrl, u64::from(s));
            }
            None => ctrl.push(IMG_STREAM_NOCACHE | flags),
        }
        let page = if helps { &self.xpage } else { &self.page };
        self.bufs[stream].extend_from_slice(&page[..]);
    }
}
