//! The decoder's per-block parts: tuples sent as deltas and full-page images (mirrors
//! `encoder/blocks.rs`).

use super::*;
use crate::walcodec::hitcode;

/// What an image op names: (reference slot, slot to store into, page frame).
type ImageSlots<'a> = (Option<usize>, Option<usize>, Option<&'a [u8]>);

impl State {
    /// Appends `len` bytes of block 0's data or main data to `self.rec` (`head`: what was read
    /// of them already), restoring a tuple sent as a delta (see [`tuples`]).
    pub(super) fn get_site(
        &mut self,
        site: Option<tuples::Site>,
        head: &[u8],
        src: &mut Reader<'_>,
        len: usize,
        ctrl: &mut Reader<'_>,
    ) -> Result<(), WalCodecError> {
        self.rec.extend_from_slice(head);
        let rest = len - head.len();
        let Some(site) = site else {
            self.rec.extend_from_slice(src.bytes(rest)?);
            return Ok(());
        };
        let c = ctrl.u8()?;
        if c == 0 {
            self.rec.extend_from_slice(src.bytes(rest)?);
            return Ok(());
        }
        let tlen = len - site.skip;
        let pre = ctrl.len(tlen)?;
        let suf = ctrl.len(tlen - pre)?;
        let reference = tuples::candidate(c, &site, &self.tuples, &self.cache)
            .ok_or_else(|| corrupt(format!("tuple reference {c} is not known here")))?;
        if pre + suf > reference.len() {
            return Err(corrupt("a tuple delta longer than its reference"));
        }
        self.rec
            .extend_from_slice(src.bytes(site.skip - head.len())?);
        self.rec.extend_from_slice(&reference[..pre]);
        self.rec.extend_from_slice(src.bytes(tlen - pre - suf)?);
        self.rec
            .extend_from_slice(&reference[reference.len() - suf..]);
        Ok(())
    }

    /// Restores one block image into `self.imgs`.
    pub(super) fn image(
        &mut self,
        key: &BlockKey,
        img: &ImageRef,
        r: &mut Sections<'_>,
    ) -> Result<(), WalCodecError> {
        let op = r.ctrl.u8()?;
        if op == IMG_OPAQUE {
            self.imgs
                .extend_from_slice(r.img.bytes(usize::from(img.len))?);
            return Ok(());
        }
        let method = if op & IMG_RECOMPRESS != 0 {
            Some(
                self.pg_major
                    .and_then(|m| fpi::recompressible(m, img))
                    .ok_or_else(|| {
                        corrupt(
                    "a page to recompress for an image that is not compressed or has an odd hole",
                )
                    })?,
            )
        } else if img.reconstructible() {
            None
        } else {
            return Err(corrupt("a page frame for an image that cannot be rebuilt"));
        };
        if op & IMG_PRIMARY != 0 {
            let m = method
                .ok_or_else(|| corrupt("the primary's bytes for an image it did not compress"))?;
            return self.primary_image(op & 7, m, img, r);
        }
        let plain = op & IMG_PLAIN != 0;
        let op = op & !(IMG_RECOMPRESS | IMG_PLAIN);
        let plain_ok = matches!(
            op,
            IMG_NEW | IMG_REF | IMG_NOCACHE | IMG_STREAM | IMG_STREAM_NOCACHE
        );
        if plain && !plain_ok {
            return Err(corrupt(format!("image op {op} cannot be plain")));
        }
        let (reference, store, frame) = self.image_slots(op, img, r)?;
        match (op, reference) {
            // A cache hit (format 12): its matches against that page alone, as it is.
            (IMG_SAME, Some(j)) => self.restore_hit(j, &mut r.hit)?,
            // IDENT is not transformed either (see `pagexf`).
            _ => {
                let transformed = !plain && op != IMG_IDENT;
                self.restore_page(key, img, transformed, reference, frame)?;
            }
        }
        if let Some(k) = store {
            self.stored = Some(k);
            if !self.cache.put(k, &self.page) {
                return Err(WalCodecError::CacheTooSmall {
                    slot: k as u64,
                    capacity: self.cache.capacity(),
                });
            }
        }
        self.emit_image(method, img)
    }

    /// An image op with [`IMG_PRIMARY`] (kind `kind`, method `m`): the slots as the op has
    /// them, a frame length of 0, no PAGE bytes; the image is the next bimg_len bytes of IMG,
    /// and its page, what they decompress to, is stored where the op says.
    fn primary_image(
        &mut self,
        kind: u8,
        m: fpi::Method,
        img: &ImageRef,
        r: &mut Sections<'_>,
    ) -> Result<(), WalCodecError> {
        let cap = self.cache.capacity();
        let layout = op_layout(kind).ok_or_else(|| corrupt(format!("unknown image op {kind}")))?;
        let mut store = None;
        for _ in 0..layout.slots {
            store = Some(cache_slot(r.ctrl.varint()?, cap)?);
        }
        let store = store.filter(|_| layout.stores);
        if layout.framed && r.ctrl.varint()? != 0 {
            return Err(corrupt("a frame for an image sent as the primary's bytes"));
        }
        let bytes = r.img.bytes(usize::from(img.len))?;
        if !self.recomp.decompress_page(m, img, bytes, &mut self.page) {
            return Err(corrupt(format!(
                "the primary's bytes of a {m:?} image do not decompress to its page"
            )));
        }
        if let Some(k) = store {
            self.stored = Some(k);
            if !self.cache.put(k, &self.page) {
                return Err(WalCodecError::CacheTooSmall {
                    slot: k as u64,
                    capacity: cap,
                });
            }
        }
        self.imgs.extend_from_slice(bytes);
        Ok(())
    }

    /// The slots and frame of image op `op`: (reference slot, slot to store into, frame);
    /// the page of a STREAM op is copied into `self.page` from PAGE, or from DATA when `img`
    /// is of long items (`format::page_stream`, format 9). Any image may come whole: the
    /// sections' caps bound how many pages a message brings (format 7).
    fn image_slots<'a>(
        &mut self,
        op: u8,
        img: &ImageRef,
        r: &mut Sections<'a>,
    ) -> Result<ImageSlots<'a>, WalCodecError> {
        let cap = self.cache.capacity();
        let slot = |v: u64| cache_slot(v, cap);
        Ok(match op {
            IMG_IDENT => (Some(slot(r.ctrl.varint()?)?), None, None),
            IMG_NEW => {
                let k = slot(r.ctrl.varint()?)?;
                (None, Some(k), Some(read_frame(r)?))
            }
            IMG_SAME => {
                let k = slot(r.ctrl.varint()?)?;
                (Some(k), Some(k), None)
            }
            IMG_REF => {
                let j = slot(r.ctrl.varint()?)?;
                let k = slot(r.ctrl.varint()?)?;
                (Some(j), Some(k), Some(read_frame(r)?))
            }
            IMG_NOCACHE => (None, None, Some(read_frame(r)?)),
            IMG_STREAM | IMG_STREAM_NOCACHE => {
                let store = if op == IMG_STREAM {
                    Some(slot(r.ctrl.varint()?)?)
                } else {
                    None
                };
                let from = if page_stream(img) == S_LONG {
                    &mut r.long
                } else {
                    &mut r.page
                };
                self.page.copy_from_slice(from.bytes(PAGE_SIZE)?);
                (None, store, None)
            }
            op => return Err(corrupt(format!("unknown image op {op}"))),
        })
    }

    /// Restores the page of a cache hit into `self.page`: the next hit of HIT against the
    /// page in slot `j` ([`hitcode`]).
    fn restore_hit(&mut self, j: usize, hit: &mut Reader<'_>) -> Result<(), WalCodecError> {
        hitcode::apply(hit, cached(&self.cache, j)?, &mut self.page)
    }

    /// Restores the page into `self.page` from its frame (against the known tuples of the
    /// block and the reference page) or the reference itself (IDENT).
    fn restore_page(
        &mut self,
        key: &BlockKey,
        img: &ImageRef,
        transformed: bool,
        reference: Option<usize>,
        frame: Option<&[u8]>,
    ) -> Result<(), WalCodecError> {
        let ref_page = reference.map(|j| cached(&self.cache, j)).transpose()?;
        if frame.is_some() {
            tuples::page_prefix(&self.tuples, key, img.hole_offset, &mut self.tprefix);
        } else {
            self.tprefix.clear();
        }
        let tp = &self.tprefix[..];
        match (frame, ref_page) {
            (Some(f), Some(p)) if transformed => {
                self.xf.forward(p, &mut self.xref);
                self.pd
                    .decompress(f, &[tp, &self.xref[..]], &mut self.page)?
            }
            (Some(f), Some(p)) => self.pd.decompress(f, &[tp, &p[..]], &mut self.page)?,
            (Some(f), None) => self.pd.decompress(f, &[tp], &mut self.page)?,
            // IDENT: the reference is the page.
            (None, Some(p)) => self.page.copy_from_slice(p),
            // STREAM: already in place.
            (None, None) => {}
        }
        if transformed {
            self.xf.inverse(&mut self.page);
        }
        Ok(())
    }

    /// Appends the image of `self.page` as the record has it: without its hole, or
    /// compressed again with the primary's method.
    fn emit_image(
        &mut self,
        method: Option<fpi::Method>,
        img: &ImageRef,
    ) -> Result<(), WalCodecError> {
        if let (Some(m), true) = (method, self.parallel) {
            if self.deferred.compress(m, img, &self.page, &mut self.imgs)? {
                return Ok(());
            }
        }
        if let Some(m) = method {
            let start = self.imgs.len();
            let ok = self.recomp.compress(m, img, &self.page, &mut self.imgs);
            let got = self.imgs.len() - start;
            if !ok || got != usize::from(img.len) {
                return Err(corrupt(format!(
                    "compressing a {m:?} image again gave {got} bytes where the record has {}: \
                     both ends must run the same walrelay build (compression libraries)",
                    img.len
                )));
            }
            return Ok(());
        }
        let off = usize::from(img.hole_offset);
        let hole = usize::from(img.hole_len);
        self.imgs.extend_from_slice(&self.page[..off]);
        self.imgs.extend_from_slice(&self.page[off + hole..]);
        Ok(())
    }
}

/// Cache slot `v` of an op, which must be below the cache's `capacity`.
fn cache_slot(v: u64, capacity: usize) -> Result<usize, WalCodecError> {
    match usize::try_from(v) {
        Ok(k) if k < capacity => Ok(k),
        _ => Err(WalCodecError::CacheTooSmall { slot: v, capacity }),
    }
}

/// The length (CTRL) and bytes (FPI) of one page frame.
fn read_frame<'a>(r: &mut Sections<'a>) -> Result<&'a [u8], WalCodecError> {
    let n = r.ctrl.len(2 * PAGE_SIZE)?;
    r.fpi.bytes(n)
}

/// The page in cache slot `j`, which the payload references.
fn cached(cache: &DecCache, j: usize) -> Result<&[u8; PAGE_SIZE], WalCodecError> {
    cache
        .get(j)
        .ok_or_else(|| corrupt(format!("cache slot {j} is referenced but empty")))
}
