//! Checks of compressed images off the encoder's critical path.
//!
//! Before it sends an image the primary compressed as a page ([`IMG_RECOMPRESS`]), the
//! encoder must know whether the receiver's compression will give the primary's bytes back
//! ([`fpi`]): for zstd images that is one compression per image, a large part of encoding WAL
//! with `wal_compression = zstd`. When the encoder may use more than one core
//! (`Encoder::set_parallel`) the check runs on a worker thread (started when first needed)
//! while the encoder goes on with the message: the image is sent as a page,
//! and once the message is complete ([`Verifier::settle`]) the op of an image that did not
//! reproduce is rewritten (`Encoder::make_primary`): [`IMG_PRIMARY`], its frame (or its hit
//! in HIT, or its page's bytes in PAGE or LONG) taken out, the primary's bytes put into IMG
//! where the decoder will read them; the decoder gets the page by decompressing them. Such
//! an image costs what an opaque one does, and its page still enters the cache. The outcomes are
//! applied, last image first, when the message ends. When the worker is behind it declines
//! the check, which is then made in place as without a worker (an image that does not
//! reproduce goes as it is, OPAQUE): so which of the two forms such an image takes depends on
//! timing; what the payload restores does not.
//!
//! The worker and its bounds: [`super::super::imgworker`].
//!
//! [`IMG_RECOMPRESS`]: super::super::format::IMG_RECOMPRESS
//! [`IMG_PRIMARY`]: super::super::format::IMG_PRIMARY
//! [`fpi`]: super::super::fpi

use super::super::cache::Page;
use super::super::format::{op_layout, IMG_PRIMARY, IMG_RECOMPRESS};
use super::super::fpi::Method;
use super::super::hitcode;
use super::super::imgworker::{ImgWorker, Task};
use super::super::streams::Reader;
use super::super::wal::ImageRef;
use super::super::wal::PAGE_SIZE;
use super::super::WalCodecError;
use super::super::{S_CTRL, S_HIT, S_IMG};
use super::Encoder;

/// Where a deferred image's op and bytes are: the lengths of CTRL, IMG, the page frames, the
/// stream its page would go through (`page_in`: PAGE or LONG, `format::page_stream`) and HIT
/// before its op was written.
#[derive(Debug, Clone, Copy)]
pub(in crate::walcodec) struct Spot {
    pub op_at: usize,
    pub img_at: usize,
    pub fpi_at: usize,
    pub page_in: usize,
    pub page_at: usize,
    pub hit_at: usize,
}

/// The outcome of a deferred check, in image order.
pub(in crate::walcodec) struct Verdict {
    pub m: Method,
    pub spot: Spot,
    /// The primary's bytes, when they did not reproduce.
    pub mismatch: Option<Vec<u8>>,
}

pub(in crate::walcodec) struct Verifier {
    worker: Option<ImgWorker>,
    /// The message's deferred images, in order.
    pending: Vec<(Method, Spot)>,
}

impl Verifier {
    /// No worker yet: [`Verifier::defer`] starts it.
    pub fn new() -> Verifier {
        Verifier {
            worker: None,
            pending: Vec::new(),
        }
    }

    /// Queues the check of an image (`page` decompressed from `bytes`) whose op is about to be
    /// written at `spot`; false, and nothing queued, when the worker is behind.
    pub fn defer(
        &mut self,
        m: Method,
        img: &ImageRef,
        page: &Page,
        bytes: &[u8],
        spot: Spot,
    ) -> Result<bool, WalCodecError> {
        let w = ImgWorker::started(&mut self.worker)?;
        if !w.submit(m, img, page, || Task::Check(bytes.to_vec()))? {
            return Ok(false);
        }
        self.pending.push((m, spot));
        Ok(true)
    }

    /// The message is complete: every outcome, in image order (waits for the worker).
    pub fn settle(&mut self) -> Result<Vec<Verdict>, WalCodecError> {
        let mut out = Vec::with_capacity(self.pending.len());
        for (m, spot) in std::mem::take(&mut self.pending) {
            let w = self.worker.as_mut();
            let w = w.ok_or_else(|| WalCodecError::Zstd("no image thread".into()))?;
            out.push(Verdict {
                m,
                spot,
                mismatch: w.next()?,
            });
        }
        Ok(out)
    }

    /// Forgets the message's checks (it failed): their outcomes are received and dropped, so
    /// that none is taken for a later image's.
    pub fn discard(&mut self) {
        let waiting = self.pending.len();
        self.pending.clear();
        if let Some(w) = &mut self.worker {
            w.drop_outcomes(waiting);
        }
    }
}

impl Encoder {
    /// Applies the outcomes of the message's image checks (this module's doc): an image that did
    /// not reproduce goes as the primary's bytes ([`Encoder::make_primary`]).
    pub(super) fn settle_checks(&mut self) -> Result<(), WalCodecError> {
        let verdicts = self.verify.settle()?;
        // Last first, so that the offsets of the earlier ones still hold.
        for v in verdicts.iter().rev() {
            if let Some(bytes) = &v.mismatch {
                self.make_primary(&v.spot, bytes)?;
            }
        }
        for v in &verdicts {
            self.recomp.checked(v.m, v.mismatch.is_none());
        }
        Ok(())
    }

    /// Rewrites the image op written at `spot` for an image whose recompression does not give
    /// the primary's `bytes`: [`IMG_PRIMARY`], a frame length of 0 (the frame taken out of
    /// the page frames), no PAGE bytes or no hit in HIT, the bytes in IMG. Slots stay as they
    /// were: the decoder stores the page it decompresses from the bytes where the op said.
    fn make_primary(&mut self, spot: &Spot, bytes: &[u8]) -> Result<(), WalCodecError> {
        let internal = |what: &str| WalCodecError::Corrupt(format!("internal: {what}"));
        let ctrl = &self.bufs[S_CTRL];
        let op = *ctrl
            .get(spot.op_at)
            .ok_or_else(|| internal("no image op"))?;
        if op & IMG_RECOMPRESS == 0 {
            return Err(internal("a checked image without IMG_RECOMPRESS"));
        }
        let kind = op & 7;
        let layout = op_layout(kind).ok_or_else(|| internal("a checked image sent opaque"))?;
        let mut r = Reader::new(&ctrl[spot.op_at + 1..], "CTRL");
        for _ in 0..layout.slots {
            r.varint()?;
        }
        let frame = if layout.framed {
            let at = spot.op_at + 1 + r.position();
            let len = r.len(2 * PAGE_SIZE)?;
            Some((at..spot.op_at + 1 + r.position(), len))
        } else {
            None
        };
        if let Some((varint, len)) = frame {
            let frames = spot.fpi_at..spot.fpi_at + len;
            if frames.end > self.fpi.len() {
                return Err(internal("a frame past the end of the page frames"));
            }
            self.fpi.drain(frames);
            self.bufs[S_CTRL].splice(varint, [0u8]);
            let out = &mut self.stats.image_frame_out[usize::from(kind)];
            *out = out.saturating_sub(len as u64);
        }
        if layout.hit {
            let hit = self.bufs[S_HIT]
                .get(spot.hit_at..)
                .ok_or_else(|| internal("a hit past the end of HIT"))?;
            let len = hitcode::span(hit)?;
            self.bufs[S_HIT].drain(spot.hit_at..spot.hit_at + len);
            self.stats.fpi_hit_out = self.stats.fpi_hit_out.saturating_sub(len as u64);
        }
        if layout.page {
            let page = &mut self.bufs[spot.page_in];
            if spot.page_at + PAGE_SIZE > page.len() {
                return Err(internal("a page past the end of its stream"));
            }
            page.drain(spot.page_at..spot.page_at + PAGE_SIZE);
        }
        self.bufs[S_CTRL][spot.op_at] = op | IMG_PRIMARY;
        let img = &mut self.bufs[S_IMG];
        if spot.img_at > img.len() {
            return Err(internal("an IMG offset past its end"));
        }
        img.splice(spot.img_at..spot.img_at, bytes.iter().copied());
        self.stats.fpi_recompressed -= 1;
        self.stats.fpi_recompress_mismatch += 1;
        self.stats.fpi_primary_bytes += 1;
        Ok(())
    }
}
