//! Full-page images that the primary compressed (`wal_compression`): decompressed to the page
//! at the sender, compressed again at the receiver with the primary's method so that the
//! record gets back the primary's exact bytes.
//!
//! How PostgreSQL compresses an image (`XLogCompressBackupBlock` in
//! `src/backend/access/transam/xloginsert.c`, the same in 14..=18): the page without its hole
//! (`orig_len = BLCKSZ - hole_length` bytes) is compressed in one call, and kept if
//! `len + (hole ? 2 : 0) < orig_len`; bimg_len, hole_offset, the hole length and the method
//! flag in bimg_info (`src/include/access/xlogrecord.h`) describe it:
//!
//! | major | flags                                                     | method calls            |
//! |-------|-----------------------------------------------------------|-------------------------|
//! | 14    | BKPIMAGE_IS_COMPRESSED 0x02 (pglz only)                   | `pglz_compress(.., PGLZ_strategy_default)` |
//! | 15-18 | BKPIMAGE_COMPRESS_PGLZ 0x04, _LZ4 0x08, _ZSTD 0x10        | pglz as above; `LZ4_compress_default(src, dst, orig_len, bufsize)`; `ZSTD_compress(dst, bufsize, src, orig_len, ZSTD_CLEVEL_DEFAULT = 3)` |
//!
//! The destination buffer (`COMPRESS_BUFSIZE`) is at least the bound of each method, so its
//! size does not change the output. We use our own [`super::pglz`], liblz4 (`lz4-sys`)
//! and libzstd (the `zstd` crate) with the same calls. Whether that reproduces the primary's
//! bytes depends on library versions (libzstd differs between releases), so the sender
//! checks images and sends the original bytes when one does not reproduce
//! ([`Recompressor::check`]); the receiver then only compresses ([`Recompressor::compress`]),
//! and its result must have bimg_len bytes. Every decompression is bounded by the page: at
//! most BLCKSZ bytes out.
//!
//! The sender learns per method: after [`trust_after`] images of a method in a row
//! reproduced, it checks one image in [`CHECK_EVERY`] (recompressing is a large part of the
//! sender's cost on WAL with `wal_compression`); the first mismatch it ever sees of a method
//! makes it check every image of that method for the rest of the session. pglz and lz4 are
//! deterministic algorithms whose output has not changed between the library versions
//! PostgreSQL builds with (our pglz is PostgreSQL's; in recorded WAL of PG 14–17 every pglz
//! and lz4 image reproduced): 1,000 in a row earn trust. libzstd's level 3 is the same from
//! 1.5.1 to 1.5.6 on page-sized inputs, but 1.5.0 and older parse differently (three images
//! in four of a PG 15 recording differ) and 1.5.7 changed the double-fast parser (15 of
//! 20,226 differ, scattered among ones that reproduce). walrelay bundles 1.5.6 (pinned in
//! `Cargo.toml`; a test fails on another version), so the images of a primary built with
//! 1.5.1–1.5.6 all reproduce; zstd must reproduce 10,000 in a row, which a primary whose
//! images differ one in a thousand passes about once in a thousand sessions, and its first
//! mismatch ends that for good. An image that was not checked and does not reproduce still
//! never reaches a standby: the receiver's frame checksum over the restored WAL fails, the
//! stream starts again, and the downstream uses plain zstd for a while.

use super::pglz::{self, Pglz};
use super::wal::{ImageRef, PAGE_SIZE};
use crate::pg::PgMajor;

/// A compression method of full-page images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Pglz,
    Lz4,
    Zstd,
}

/// ZSTD_CLEVEL_DEFAULT, the level PostgreSQL compresses images with.
const ZSTD_LEVEL: i32 = 3;

/// The method of a compressed image in WAL of `pg_major`: exactly one known method flag.
pub fn method(pg_major: PgMajor, bimg_info: u8) -> Option<Method> {
    if pg_major == PgMajor::V14 {
        return (bimg_info & 0x02 != 0).then_some(Method::Pglz);
    }
    match bimg_info & (0x04 | 0x08 | 0x10) {
        0x04 => Some(Method::Pglz),
        0x08 => Some(Method::Lz4),
        0x10 => Some(Method::Zstd),
        _ => None,
    }
}

/// The method of `img` if it is compressed and its hole fits in the page (then the page is
/// `raw[..hole_offset] ++ zeros(hole) ++ raw[hole_offset..]` for the `orig_len` bytes `raw`
/// that decompress from it).
pub fn recompressible(pg_major: PgMajor, img: &ImageRef) -> Option<Method> {
    if !img.compressed || usize::from(img.len) >= PAGE_SIZE {
        return None;
    }
    let orig_len = PAGE_SIZE.checked_sub(usize::from(img.hole_len))?;
    if usize::from(img.hole_offset) > orig_len || usize::from(img.len) >= orig_len {
        return None;
    }
    method(pg_major, img.info)
}

/// Why an image was not sent for recompression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// It did not decompress to exactly `orig_len` bytes.
    Undecodable,
    /// Compressing the page again gives other bytes than the primary's.
    Mismatch,
}

/// pglz and lz4 images that must reproduce in a row before the sender checks only some.
pub const TRUST_AFTER: u32 = 1000;
/// zstd images that must reproduce in a row before the sender checks only some (see the
/// module docs: libzstd releases disagree on a few inputs in a thousand).
pub const TRUST_AFTER_ZSTD: u32 = 10_000;
/// Once trusted, the sender checks one image in this many.
pub const CHECK_EVERY: u32 = 16;

/// Images of method `m` that must reproduce in a row before the sender checks only some.
pub fn trust_after(m: Method) -> u32 {
    match m {
        Method::Zstd => TRUST_AFTER_ZSTD,
        Method::Pglz | Method::Lz4 => TRUST_AFTER,
    }
}

/// What the sender has seen of one method's images.
#[derive(Debug, Default, Clone, Copy)]
struct Trust {
    /// Images in a row that reproduced.
    streak: u32,
    /// Images not checked since the last checked one.
    unchecked: u32,
    /// An image of this method did not reproduce: every one is checked from then on.
    failed: bool,
}

impl Trust {
    /// Whether the next image (of a method that needs `after` in a row) must be checked.
    fn check_next(&mut self, after: u32) -> bool {
        if self.failed || self.streak < after || self.unchecked + 1 >= CHECK_EVERY {
            self.unchecked = 0;
            true
        } else {
            self.unchecked += 1;
            false
        }
    }

    fn checked(&mut self, reproduced: bool) {
        self.failed |= !reproduced;
        self.streak = if reproduced {
            self.streak.saturating_add(1)
        } else {
            0
        };
    }
}

/// Compression contexts of both methods that need one, and scratch space; one per codec end.
pub struct Recompressor {
    pglz: Pglz,
    zc: zstd_safe::CCtx<'static>,
    zd: zstd_safe::DCtx<'static>,
    raw: Box<[u8; PAGE_SIZE]>,
    out: Vec<u8>,
    /// Per method (pglz, lz4, zstd): the sender's record of reproductions.
    trust: [Trust; 3],
}

impl Recompressor {
    pub fn new() -> Option<Recompressor> {
        Some(Recompressor {
            pglz: Pglz::new(),
            zc: zstd_safe::CCtx::try_create()?,
            zd: zstd_safe::DCtx::try_create()?,
            raw: Box::new([0; PAGE_SIZE]),
            out: Vec::with_capacity(2 * PAGE_SIZE),
            trust: [Trust::default(); 3],
        })
    }

    /// Sender: decompresses `bytes` (`img`'s bytes, method `m`) into `page` (hole zero
    /// filled) and checks that [`Recompressor::compress`] gives `bytes` back (every image
    /// until the method earned trust, then one in [`CHECK_EVERY`]; see the module docs).
    pub fn check(
        &mut self,
        m: Method,
        img: &ImageRef,
        bytes: &[u8],
        page: &mut [u8; PAGE_SIZE],
    ) -> Result<(), Refusal> {
        if !self.open(m, img, bytes, page)? {
            return Ok(());
        }
        let same = self.reproduces(m, img, page, bytes);
        self.checked(m, same);
        if same {
            Ok(())
        } else {
            Err(Refusal::Mismatch)
        }
    }

    /// Sender, the first half of [`Recompressor::check`]: decompresses `bytes` into `page`
    /// and says whether this image is to be checked ([`Recompressor::reproduces`], then
    /// [`Recompressor::checked`] with the outcome, which may come later and from another
    /// context, in the order of the images).
    pub fn open(
        &mut self,
        m: Method,
        img: &ImageRef,
        bytes: &[u8],
        page: &mut [u8; PAGE_SIZE],
    ) -> Result<bool, Refusal> {
        if !self.decompress_page(m, img, bytes, page) {
            return Err(Refusal::Undecodable);
        }
        Ok(self.trust[m as usize].check_next(trust_after(m)))
    }

    /// Decompresses `bytes` (`img`'s bytes, method `m`) into `page`, hole zero filled; false
    /// when they do not decompress to exactly the page without its hole.
    pub fn decompress_page(
        &mut self,
        m: Method,
        img: &ImageRef,
        bytes: &[u8],
        page: &mut [u8; PAGE_SIZE],
    ) -> bool {
        let orig_len = PAGE_SIZE - usize::from(img.hole_len);
        let raw = &mut self.raw[..orig_len];
        if !decompress(&mut self.zd, m, bytes, raw) {
            return false;
        }
        let off = usize::from(img.hole_offset);
        let hole = usize::from(img.hole_len);
        page[..off].copy_from_slice(&raw[..off]);
        page[off..off + hole].fill(0);
        page[off + hole..].copy_from_slice(&raw[off..]);
        true
    }

    /// Whether compressing `page` (an image `img` of method `m`) again gives `bytes`.
    pub fn reproduces(
        &mut self,
        m: Method,
        img: &ImageRef,
        page: &[u8; PAGE_SIZE],
        bytes: &[u8],
    ) -> bool {
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        let same = self.compress(m, img, page, &mut out) && out == bytes;
        self.out = out;
        same
    }

    /// Records whether a checked image of method `m` reproduced (trust, see [`trust_after`]).
    pub fn checked(&mut self, m: Method, reproduced: bool) {
        self.trust[m as usize].checked(reproduced);
    }

    /// Compresses `page` without `img`'s hole with method `m` as the primary does, appending
    /// to `out`; false where PostgreSQL would not have kept a compressed image.
    pub fn compress(
        &mut self,
        m: Method,
        img: &ImageRef,
        page: &[u8; PAGE_SIZE],
        out: &mut Vec<u8>,
    ) -> bool {
        let off = usize::from(img.hole_offset);
        let hole = usize::from(img.hole_len);
        let orig_len = PAGE_SIZE - hole;
        let src: &[u8] = if hole == 0 {
            &page[..]
        } else {
            self.raw[..off].copy_from_slice(&page[..off]);
            self.raw[off..orig_len].copy_from_slice(&page[off + hole..]);
            &self.raw[..orig_len]
        };
        let start = out.len();
        let len = compress_raw(&mut self.pglz, &mut self.zc, m, src, out);
        let extra = if hole != 0 { 2 } else { 0 };
        match len {
            Some(n) if n + extra < orig_len && out.len() == start + n => true,
            _ => {
                out.truncate(start);
                false
            }
        }
    }
}

/// One compression call as PostgreSQL makes it, appended to `out` (None: the call failed).
fn compress_raw(
    pglz: &mut Pglz,
    zc: &mut zstd_safe::CCtx<'static>,
    m: Method,
    src: &[u8],
    out: &mut Vec<u8>,
) -> Option<usize> {
    match m {
        Method::Pglz => pglz.compress(src, &pglz::STRATEGY_DEFAULT, out),
        Method::Lz4 => lz4_compress_fast(src, out, 1),
        Method::Zstd => {
            let start = out.len();
            out.reserve(zstd_safe::compress_bound(src.len()));
            let mut dst = std::io::Cursor::new(&mut *out);
            dst.set_position(start as u64);
            zc.compress(&mut dst, src, ZSTD_LEVEL).ok()
        }
    }
}

/// Compresses `src` (a page without its hole) with `m` as PostgreSQL does, whether or not
/// the primary would keep the result (for test WAL).
#[cfg(test)]
pub(crate) fn compress_like_pg(m: Method, src: &[u8]) -> Option<Vec<u8>> {
    let mut r = Recompressor::new()?;
    let mut out = Vec::new();
    compress_raw(&mut r.pglz, &mut r.zc, m, src, &mut out)?;
    Some(out)
}

/// Decompresses `src` into exactly `dst` (which bounds the output); false on any error.
fn decompress(zd: &mut zstd_safe::DCtx<'static>, m: Method, src: &[u8], dst: &mut [u8]) -> bool {
    match m {
        Method::Pglz => pglz::decompress(src, dst).is_ok(),
        Method::Lz4 => {
            let (Ok(n), Ok(cap)) = (i32::try_from(src.len()), i32::try_from(dst.len())) else {
                return false;
            };
            // SAFETY: LZ4_decompress_safe reads at most `n` bytes of `src` and writes at most
            // `cap` bytes into `dst`, whatever the input (it is the variant for untrusted
            // data); both lengths are those of the slices.
            let got = unsafe {
                lz4_sys::LZ4_decompress_safe(src.as_ptr().cast(), dst.as_mut_ptr().cast(), n, cap)
            };
            got == cap
        }
        Method::Zstd => {
            let want = dst.len();
            match zd.decompress(dst, src) {
                Ok(n) => n == want,
                Err(_) => {
                    let _ = zd.reset(zstd_safe::ResetDirective::SessionOnly);
                    false
                }
            }
        }
    }
}

/// `LZ4_compress_default(src, dst, len, bound)` (acceleration 1), or `LZ4_compress_fast` with
/// another acceleration, appended to `out`.
pub(crate) fn lz4_compress_fast(src: &[u8], out: &mut Vec<u8>, accel: i32) -> Option<usize> {
    let n = i32::try_from(src.len()).ok()?;
    // SAFETY: LZ4_compressBound is a pure function of its argument.
    let bound = unsafe { lz4_sys::LZ4_compressBound(n) };
    let cap = usize::try_from(bound).ok().filter(|&b| b > 0)?;
    let start = out.len();
    out.reserve(cap);
    // SAFETY: `out` has at least `cap` bytes of spare capacity after `start`; LZ4 reads `n`
    // bytes of `src` and writes at most `bound` (= cap) bytes there, and we set the length
    // only to what it reports having written.
    let written = unsafe {
        let (src, dst) = (src.as_ptr().cast(), out.as_mut_ptr().add(start).cast());
        if accel == 1 {
            lz4_sys::LZ4_compress_default(src, dst, n, bound)
        } else {
            lz4_sys::LZ4_compress_fast(src, dst, n, bound, accel)
        }
    };
    let w = usize::try_from(written)
        .ok()
        .filter(|&w| w > 0 && w <= cap)?;
    // SAFETY: LZ4 initialised these `w` bytes (w <= cap, within the reserved capacity).
    unsafe { out.set_len(start + w) };
    Some(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img(len: usize, hole_offset: u16, hole_len: u16, info: u8) -> ImageRef {
        ImageRef {
            len: len as u16,
            hole_offset,
            hole_len,
            compressed: true,
            info,
        }
    }

    /// `page()` without its hole: the bytes PostgreSQL compresses.
    fn without_hole(p: &[u8; PAGE_SIZE]) -> Vec<u8> {
        let mut src = p[..200].to_vec();
        src.extend_from_slice(&p[6000..]);
        src
    }

    /// A heap-like page with a hole between 200 and 6000.
    fn page() -> Box<[u8; PAGE_SIZE]> {
        let mut p = Box::new([0u8; PAGE_SIZE]);
        for (i, b) in p.iter_mut().enumerate() {
            *b = match i {
                ..200 => (i * 7) as u8,
                200..6000 => 0,
                _ => ((i % 37) as u8) ^ ((i / 300) as u8),
            };
        }
        p
    }

    #[test]
    fn method_flags_per_major() {
        assert_eq!(method(PgMajor::V14, 0x02 | 0x01), Some(Method::Pglz));
        assert_eq!(method(PgMajor::V14, 0x04), None); // BKPIMAGE_APPLY in 14
        assert_eq!(method(PgMajor::V15, 0x02), None); // BKPIMAGE_APPLY in 15+
        assert_eq!(method(PgMajor::V16, 0x04 | 0x02), Some(Method::Pglz));
        assert_eq!(method(PgMajor::V17, 0x08), Some(Method::Lz4));
        assert_eq!(method(PgMajor::V18, 0x10 | 0x01), Some(Method::Zstd));
        assert_eq!(method(PgMajor::V18, 0x18), None);
    }

    #[test]
    fn every_method_round_trips_through_check() {
        let p = page();
        let mut r = Recompressor::new().unwrap();
        for (major, info, m) in [
            (PgMajor::V14, 0x02 | 0x01, Method::Pglz),
            (PgMajor::V15, 0x04 | 0x01, Method::Pglz),
            (PgMajor::V16, 0x08 | 0x01, Method::Lz4),
            (PgMajor::V18, 0x10 | 0x01, Method::Zstd),
        ] {
            let probe = img(0, 200, 5800, info);
            let mut bytes = Vec::new();
            assert!(r.compress(m, &probe, &p, &mut bytes), "{m:?}");
            let im = img(bytes.len(), 200, 5800, info);
            assert_eq!(recompressible(major, &im), Some(m));
            let mut back = Box::new([0xAAu8; PAGE_SIZE]);
            assert_eq!(r.check(m, &im, &bytes, &mut back), Ok(()), "{m:?}");
            assert!(back[..] == p[..], "{m:?}");
            // Damaged bytes: never a panic; accepted only if they are what compressing the
            // page they decompress to gives (a changed literal, say).
            for k in 0..bytes.len() {
                let mut bad = bytes.clone();
                bad[k] ^= 0x41;
                if r.check(m, &im, &bad, &mut back).is_ok() {
                    assert!(back[..] != p[..], "{m:?} byte {k}");
                    let mut again = Vec::new();
                    assert!(r.compress(m, &im, &back, &mut again));
                    assert_eq!(again, bad, "{m:?} byte {k}");
                }
            }
            assert_eq!(
                r.check(m, &im, &bytes[..bytes.len() / 2], &mut back),
                Err(Refusal::Undecodable)
            );
        }
    }

    #[test]
    fn other_compressor_settings_are_refused() {
        let p = page();
        let mut r = Recompressor::new().unwrap();
        let src = without_hole(&p);
        // lz4 with another acceleration, zstd at another level: valid, but not our bytes.
        let mut fast = Vec::new();
        lz4_compress_fast(&src, &mut fast, 50).unwrap();
        let im = img(fast.len(), 200, 5800, 0x08);
        let mut back = Box::new([0u8; PAGE_SIZE]);
        assert_eq!(
            r.check(Method::Lz4, &im, &fast, &mut back),
            Err(Refusal::Mismatch)
        );
        assert!(back[..] == p[..]);
        let z19 = zstd::bulk::compress(&src, 19).unwrap();
        let im = img(z19.len(), 200, 5800, 0x10);
        assert_eq!(
            r.check(Method::Zstd, &im, &z19, &mut back),
            Err(Refusal::Mismatch)
        );
        // pglz with the "always" strategy.
        let mut always = Vec::new();
        Pglz::new()
            .compress(&src, &pglz::STRATEGY_ALWAYS, &mut always)
            .unwrap();
        let im = img(always.len(), 200, 5800, 0x04);
        let mut default = Vec::new();
        Pglz::new()
            .compress(&src, &pglz::STRATEGY_DEFAULT, &mut default)
            .unwrap();
        if always != default {
            assert_eq!(
                r.check(Method::Pglz, &im, &always, &mut back),
                Err(Refusal::Mismatch)
            );
        }
    }

    /// After TRUST_AFTER reproductions in a row (TRUST_AFTER_ZSTD for zstd) the sender checks
    /// one image in CHECK_EVERY; the first mismatch it sees makes it check every image of
    /// that method for good.
    #[test]
    fn trust_is_earned_sampled_and_lost_for_good() {
        let p = page();
        let mut r = Recompressor::new().unwrap();
        let src = without_hole(&p);
        let mut good = Vec::new();
        assert!(r.compress(Method::Lz4, &img(0, 200, 5800, 0x08), &p, &mut good));
        let good_im = img(good.len(), 200, 5800, 0x08);
        let mut fast = Vec::new();
        lz4_compress_fast(&src, &mut fast, 50).unwrap();
        let fast_im = img(fast.len(), 200, 5800, 0x08);
        let mut back = Box::new([0u8; PAGE_SIZE]);
        let sampled = |r: &mut Recompressor,
                       m,
                       im: &ImageRef,
                       bytes: &[u8],
                       back: &mut Box<[u8; PAGE_SIZE]>| {
            (0..CHECK_EVERY)
                .take_while(|_| r.check(m, im, bytes, back).is_ok())
                .count() as u32
        };
        for _ in 0..TRUST_AFTER {
            assert_eq!(r.check(Method::Lz4, &good_im, &good, &mut back), Ok(()));
        }
        // Trusted: foreign bytes pass unchecked until the sampled check catches them.
        let passed = sampled(&mut r, Method::Lz4, &fast_im, &fast, &mut back);
        assert!(passed > 0 && passed < CHECK_EVERY, "{passed}");
        assert!(back[..] == p[..]);
        // Trust lost for good: a new streak earns nothing.
        for _ in 0..TRUST_AFTER + CHECK_EVERY {
            assert_eq!(r.check(Method::Lz4, &good_im, &good, &mut back), Ok(()));
        }
        assert_eq!(sampled(&mut r, Method::Lz4, &fast_im, &fast, &mut back), 0);
        // Other methods earned nothing.
        assert_eq!(
            r.check(Method::Zstd, &img(9, 200, 5800, 0x10), &[0u8; 9], &mut back),
            Err(Refusal::Undecodable)
        );
        // zstd needs TRUST_AFTER_ZSTD in a row.
        let mut zgood = Vec::new();
        assert!(r.compress(Method::Zstd, &img(0, 200, 5800, 0x10), &p, &mut zgood));
        let zim = img(zgood.len(), 200, 5800, 0x10);
        let z19 = zstd::bulk::compress(&src, 19).unwrap();
        let z19im = img(z19.len(), 200, 5800, 0x10);
        for _ in 0..TRUST_AFTER {
            assert_eq!(r.check(Method::Zstd, &zim, &zgood, &mut back), Ok(()));
        }
        assert_eq!(
            r.check(Method::Zstd, &z19im, &z19, &mut back),
            Err(Refusal::Mismatch)
        );
        let mut r = Recompressor::new().unwrap();
        for _ in 0..TRUST_AFTER_ZSTD {
            assert_eq!(r.check(Method::Zstd, &zim, &zgood, &mut back), Ok(()));
        }
        let passed = sampled(&mut r, Method::Zstd, &z19im, &z19, &mut back);
        assert!(passed > 0 && passed < CHECK_EVERY, "{passed}");
    }

    /// The bundled libzstd is one whose level 3 gives the bytes of PostgreSQL built with
    /// libzstd 1.5.1–1.5.6 (module docs); 1.5.7 parses differently. Pinned in Cargo.toml.
    #[test]
    fn bundled_libzstd_is_of_the_reproducing_releases() {
        let v = zstd_safe::version_number();
        assert!(
            (10501..=10506).contains(&v),
            "libzstd {v}: image recompression was measured with 1.5.1–1.5.6 (see the module docs)"
        );
    }

    #[test]
    fn geometry_is_checked() {
        assert_eq!(
            recompressible(PgMajor::V15, &img(100, 9000, 100, 0x08)),
            None
        );
        assert_eq!(recompressible(PgMajor::V15, &img(100, 0, 8192, 0x08)), None);
        assert_eq!(recompressible(PgMajor::V15, &img(8192, 0, 0, 0x08)), None);
        let mut plain = img(100, 0, 0, 0x08);
        plain.compressed = false;
        assert_eq!(recompressible(PgMajor::V15, &plain), None);
        assert_eq!(
            recompressible(PgMajor::V15, &img(100, 0, 0, 0x08)),
            Some(Method::Lz4)
        );
    }
}
