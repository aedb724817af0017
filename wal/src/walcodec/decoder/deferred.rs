//! Images compressed again on a worker while the decoder goes on with the message.
//!
//! Restoring an image the primary compressed means compressing its page with the primary's
//! method ([`fpi`]): with `wal_compression = pglz` most of the decoder's time. When the
//! decoder may use more than one core (`Decoder::set_parallel`) the page goes to a worker
//! thread ([`ImgWorker`]) and the record gets as many zero bytes where the image goes; the
//! record is laid out as usual (page headers, the tracker, redo and the tuple cache read
//! none of an image's bytes), remembering where each of its bytes went in the output. At the
//! message's end ([`Deferred::settle`]) the images come back in order, each must have the
//! record's bimg_len bytes, and every such record gets them, its CRC, and its bytes written
//! over its place in the output again. The output is the same either way; the caller's
//! checksum over the message checks it.
//!
//! Memory: the worker's queue (see [`ImgWorker`]), and a copy of each waiting record: at most
//! the message.
//!
//! [`fpi`]: super::super::fpi

use super::super::cache::Page;
use super::super::fpi::Method;
use super::super::imgworker::{ImgWorker, Task};
use super::super::wal::{seal_record, ImageRef};
use super::super::WalCodecError;
use super::corrupt;

/// A record laid out with images still on the worker.
struct Waiting {
    /// The record's bytes, its CRC not set.
    rec: Vec<u8>,
    /// Its images on the worker, in order: (offset in `rec`, length).
    images: Vec<(usize, usize)>,
    /// Where its bytes went: (offset in `rec`, offset in the output, length).
    segments: Vec<(usize, usize, usize)>,
}

#[derive(Default)]
pub(in crate::walcodec) struct Deferred {
    worker: Option<ImgWorker>,
    /// The current record's images on the worker: (offset in `imgs`, length), then (offset
    /// in the record, length) once placed.
    in_imgs: Vec<(usize, usize)>,
    in_rec: Vec<(usize, usize)>,
    /// Where the current record's bytes went, while it has images on the worker.
    segments: Vec<(usize, usize, usize)>,
    /// The message's records that wait for images.
    records: Vec<Waiting>,
    /// Jobs whose outcome is not taken yet.
    submitted: usize,
}

impl Deferred {
    /// A new record: none of its images are on the worker yet.
    pub fn start_record(&mut self) {
        self.in_imgs.clear();
        self.in_rec.clear();
        self.segments.clear();
    }

    /// Hands the compression of `page` (image `img`, method `m`) to the worker; `imgs` gets
    /// the image's length in zeros meanwhile. False, and nothing done, when the worker is
    /// behind (the caller compresses it).
    pub fn compress(
        &mut self,
        m: Method,
        img: &ImageRef,
        page: &Page,
        imgs: &mut Vec<u8>,
    ) -> Result<bool, WalCodecError> {
        let w = ImgWorker::started(&mut self.worker)?;
        if !w.submit(m, img, page, || Task::Compress)? {
            return Ok(false);
        }
        self.submitted += 1;
        let len = usize::from(img.len);
        self.in_imgs.push((imgs.len(), len));
        imgs.resize(imgs.len() + len, 0);
        Ok(true)
    }

    /// The record got `imgs[from..to]` at `rec_at`.
    pub fn place(&mut self, from: usize, to: usize, rec_at: usize) {
        for &(off, len) in &self.in_imgs {
            if (from..to).contains(&off) {
                self.in_rec.push((rec_at + off - from, len));
            }
        }
    }

    /// Whether the current record has images on the worker (its CRC waits for them).
    pub fn waiting(&self) -> bool {
        !self.in_rec.is_empty()
    }

    /// The current record's bytes `rec[k..k + n]` went to the output at `at`.
    pub fn laid(&mut self, k: usize, at: usize, n: usize) {
        if self.waiting() {
            self.segments.push((k, at, n));
        }
    }

    /// The current record is laid out: keep it if it waits for images.
    pub fn record_done(&mut self, rec: &[u8]) {
        if self.waiting() {
            self.records.push(Waiting {
                rec: rec.to_vec(),
                images: std::mem::take(&mut self.in_rec),
                segments: std::mem::take(&mut self.segments),
            });
        }
    }

    /// The message is restored but for the images on the worker: they go into their records,
    /// which get their CRC and are written over their place in `out`.
    pub fn settle(&mut self, out: &mut [u8]) -> Result<(), WalCodecError> {
        for mut w in std::mem::take(&mut self.records) {
            for &(off, len) in &w.images {
                let worker = self.worker.as_mut();
                let outcome = worker.ok_or_else(|| corrupt("no image thread"))?.next()?;
                self.submitted -= 1;
                match outcome {
                    Some(b) if b.len() == len => w.rec[off..off + len].copy_from_slice(&b),
                    got => {
                        return Err(corrupt(format!(
                            "compressing an image again gave {} bytes where the record has \
                             {len}: both ends must run the same walrelay build (compression \
                             libraries)",
                            got.map_or(0, |b| b.len())
                        )))
                    }
                }
            }
            seal_record(&mut w.rec);
            for &(k, at, n) in &w.segments {
                let dst = out
                    .get_mut(at..at + n)
                    .ok_or_else(|| corrupt("internal: a record's place past the output"))?;
                dst.copy_from_slice(&w.rec[k..k + n]);
            }
        }
        Ok(())
    }

    /// Forgets the message (it failed): outcomes not taken are dropped, so that none is taken
    /// for a later image's.
    pub fn discard(&mut self) {
        if let Some(w) = &mut self.worker {
            w.drop_outcomes(self.submitted);
        }
        self.submitted = 0;
        self.records.clear();
        self.start_record();
    }
}
