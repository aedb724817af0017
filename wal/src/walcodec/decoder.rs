//! The receiving half: payload → the exact WAL bytes the encoder was given.

use super::areaxf::AreaXf;
use super::cache::{new_page, slots_for, DecCache, Page};
use super::format::*;
use super::fpi::{self, Recompressor};
use super::mainxf::{self, MainXf};
use super::pagexf::PageXf;
use super::payload::{self, DecSections};
use super::prunexf;
use super::redo::{self, Redo};
use super::streams::{history_log, unzigzag, PageDecompressor, Reader};
use super::tracker::Tracker;
use super::tuples::{self, HeapRec, TupleCache};
use super::wal::{parse_area, seal_record, Area, BlockKey, ImageRef, PAGE_SIZE, REC_HDR, WAL_PAGE};
use super::{
    check_params, CodecParams, WalCodecError, S_CTRL, S_DATA, S_HDR, S_HIT, S_IMG, S_LONG, S_MAIN,
    S_PAGE, S_RAW,
};
use crate::lsn::Lsn;
use crate::pg::PgMajor;

mod blocks;
mod deferred;
mod unpacker;

use deferred::Deferred;
use unpacker::Unpacker;

pub struct Decoder {
    /// The parameters it was made with (for `persist`).
    pub(super) params: CodecParams,
    /// Keep the caches through the first message's resync (restored by `persist`).
    pub(super) keep_caches: bool,
    magic: Option<u16>,
    max_message: usize,
    next_pos: Option<u64>,
    /// The sections' decompression, here or on a thread (see [`unpacker`]).
    unpacker: Unpacker,
    pub(super) st: State,
    poisoned: bool,
}

/// Everything the ops act on besides the section readers.
pub(super) struct State {
    compressed_mask: u8,
    pg_major: Option<PgMajor>,
    /// Compresses the pages of images the primary compressed (see [`fpi`]).
    recomp: Recompressor,
    tracker: Tracker,
    last_xid: u32,
    /// Main data fields derived from what both ends know (see [`super::mainxf`]).
    mainxf: MainXf,
    /// Relations named lately, for the block-header areas in HDR ([`super::areaxf`]).
    areaxf: AreaXf,
    /// Heap records replayed onto cached pages (see [`super::redo`]).
    redo: Redo,
    pub(super) cache: DecCache,
    pub(super) tuples: TupleCache,
    /// The cache slot the last image op stored into.
    stored: Option<usize>,
    /// Known tuples of the block of the image being restored.
    tprefix: Vec<u8>,
    /// A cut update's new tuple, expanded with its old version (`HeapRec::expand_cut`).
    expanded: Vec<u8>,
    /// The prune the record being restored was sent against (`prunexf`).
    prune: prunexf::Prediction,
    /// The current record's images, restored, and where each block's ends.
    imgs: Vec<u8>,
    img_ends: Vec<usize>,
    pd: PageDecompressor,
    rec: Vec<u8>,
    area: Area,
    page: Page,
    /// The transform of frames without a same-block reference, and a transformed reference.
    xf: PageXf,
    xref: Page,
    /// Use more than one core: images compressed again on a worker, a large message's
    /// sections decompressed on other threads (see [`Decoder::set_parallel`]).
    parallel: bool,
    deferred: Deferred,
}

/// Readers over this message's sections.
struct Sections<'a> {
    ctrl: Reader<'a>,
    hdr: Reader<'a>,
    data: Reader<'a>,
    long: Reader<'a>,
    main: Reader<'a>,
    raw: Reader<'a>,
    img: Reader<'a>,
    page: Reader<'a>,
    hit: Reader<'a>,
    fpi: Reader<'a>,
}

fn corrupt(msg: impl Into<String>) -> WalCodecError {
    WalCodecError::Corrupt(msg.into())
}

impl Decoder {
    /// `p.block_cache_bytes` must be the encoder's (see [`CodecParams`]); a stream that needs
    /// more block cache is an error.
    pub fn new(p: &CodecParams) -> Result<Decoder, WalCodecError> {
        check_params(p)?;
        let magic = p.pg_major.map(PgMajor::page_magic);
        Ok(Decoder {
            params: p.clone(),
            keep_caches: false,
            magic,
            max_message: p.max_message_bytes,
            next_pos: None,
            unpacker: Unpacker::new(DecSections::new(history_log(p.block_cache_bytes))?),
            st: State {
                compressed_mask: p.pg_major.map_or(0, PgMajor::bimg_compressed_mask),
                pg_major: p.pg_major,
                recomp: Recompressor::new().ok_or_else(|| {
                    WalCodecError::Zstd(
                        "cannot create a zstd context for image recompression".into(),
                    )
                })?,
                tracker: Tracker::new(magic, 0),
                last_xid: 0,
                mainxf: MainXf::new(),
                areaxf: AreaXf::new(),
                redo: Redo::new(p.pg_major),
                cache: DecCache::new(slots_for(p.block_cache_bytes)),
                tuples: TupleCache::new(TupleCache::bytes_for(p.block_cache_bytes)),
                stored: None,
                imgs: Vec::new(),
                tprefix: Vec::new(),
                expanded: Vec::new(),
                prune: prunexf::Prediction::default(),
                img_ends: Vec::new(),
                pd: PageDecompressor::new()?,
                rec: Vec::new(),
                area: Area::default(),
                page: new_page(),
                xf: PageXf::new(),
                xref: new_page(),
                parallel: payload::multi_core(),
                deferred: Deferred::default(),
            },
            poisoned: false,
        })
    }

    /// Whether to use more than one core (on by default when the machine has more than one):
    /// a large staged message's sections decompressed on the unpack thread
    /// ([`Decoder::stage`]), a large message's sections decoded unstaged on several threads,
    /// images compressed again on a worker. The runtime turns it on while messages wait
    /// behind the one being restored, off while it keeps up (threads cost CPU). The output is
    /// the same either way.
    pub fn set_parallel(&mut self, on: bool) {
        self.st.parallel = on && payload::multi_core();
    }

    /// [`Decoder::set_parallel`], whatever the machine (tests).
    #[cfg(test)]
    pub(super) fn threaded_restores(&mut self, on: bool) {
        self.st.parallel = on;
    }

    /// Restores exactly the raw bytes given to the encoder for the message at `start`
    /// (`raw_len` bytes, capped by max_message_bytes); `out` cleared first. After an error the
    /// decoder's state no longer mirrors the encoder's and every later call fails.
    pub fn decode(
        &mut self,
        start: Lsn,
        payload: &[u8],
        raw_len: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), WalCodecError> {
        out.clear();
        if self.poisoned {
            return Err(WalCodecError::Poisoned);
        }
        let res = self.decode_inner(start, payload, raw_len, out);
        if res.is_err() {
            self.poisoned = true;
            self.st.deferred.discard();
            out.clear();
        }
        res
    }

    /// Hands the payload of a message to be decoded later (after those staged before) to
    /// have its sections decompressed meanwhile: on a thread when [`Decoder::set_parallel`]
    /// allows it and the payload is large (see `decoder/unpacker.rs`). The message must then
    /// be the next one given to [`Decoder::decode`], with the same payload; at most
    /// [`STAGED_MAX`] may be staged and not decoded.
    ///
    /// [`STAGED_MAX`]: super::STAGED_MAX
    pub fn stage(
        &mut self,
        start: Lsn,
        payload: &[u8],
        raw_len: usize,
    ) -> Result<(), WalCodecError> {
        if self.poisoned {
            return Err(WalCodecError::Poisoned);
        }
        if raw_len > self.max_message {
            return Err(WalCodecError::TooLong {
                len: raw_len,
                max: self.max_message,
            });
        }
        let away = self.st.parallel;
        let r = self.unpacker.stage(start, payload, raw_len, away);
        if matches!(r, Err(WalCodecError::Zstd(_))) {
            self.poisoned = true;
        }
        r
    }

    /// Messages staged and not decoded yet.
    pub fn staged(&self) -> usize {
        self.unpacker.staged()
    }

    fn decode_inner(
        &mut self,
        start: Lsn,
        payload: &[u8],
        raw_len: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), WalCodecError> {
        if raw_len > self.max_message {
            return Err(WalCodecError::TooLong {
                len: raw_len,
                max: self.max_message,
            });
        }
        let end = start
            .0
            .checked_add(raw_len as u64)
            .ok_or(WalCodecError::Overflow {
                start,
                len: raw_len,
            })?;
        if self.next_pos != Some(start.0) {
            self.st.tracker = Tracker::new(self.magic, start.0);
            if !std::mem::take(&mut self.keep_caches) {
                self.st.cache.clear();
                self.st.tuples.clear();
            }
            self.st.last_xid = 0;
            self.st.mainxf = MainXf::new();
            self.st.areaxf = AreaXf::new();
        }

        let u = self
            .unpacker
            .take(start, payload, raw_len, self.st.parallel)?;
        let b = &u.bufs;
        let mut r = Sections {
            ctrl: Reader::new(&b[S_CTRL], "CTRL"),
            hdr: Reader::new(&b[S_HDR], "HDR"),
            data: Reader::new(&b[S_DATA], "DATA"),
            long: Reader::new(&b[S_LONG], "LONG"),
            main: Reader::new(&b[S_MAIN], "MAIN"),
            raw: Reader::new(&b[S_RAW], "RAW"),
            img: Reader::new(&b[S_IMG], "IMG"),
            page: Reader::new(&b[S_PAGE], "PAGE"),
            hit: Reader::new(&b[S_HIT], "HIT"),
            fpi: Reader::new(&payload[u.fpi_at..], "FPI"),
        };

        out.reserve(raw_len);
        while out.len() < raw_len {
            self.st.op(&mut r, out, raw_len)?;
        }
        self.st.deferred.settle(out)?;
        for rd in [
            &r.ctrl, &r.hdr, &r.data, &r.long, &r.main, &r.raw, &r.img, &r.page, &r.hit, &r.fpi,
        ] {
            if !rd.done() {
                return Err(corrupt(format!(
                    "the {} section has bytes left after the message was restored",
                    rd.name()
                )));
            }
        }
        self.unpacker.recycle(u);
        self.next_pos = Some(end);
        Ok(())
    }
}

impl State {
    fn op(
        &mut self,
        r: &mut Sections<'_>,
        out: &mut Vec<u8>,
        raw_len: usize,
    ) -> Result<(), WalCodecError> {
        let op = r.ctrl.u8()?;
        let room = raw_len - out.len();
        match op {
            OP_RAW | OP_RAW_HDR => {
                let n = r.ctrl.len(room)?;
                let src = if op == OP_RAW { &mut r.raw } else { &mut r.hdr };
                let b = src.bytes(n)?;
                out.extend_from_slice(b);
                self.tracker.feed(b);
            }
            OP_ZERO => {
                let n = r.ctrl.len(room)?;
                let s = out.len();
                out.resize(s + n, 0);
                self.tracker.feed(&out[s..]);
            }
            OP_PAGE_HDR => self.page_header(out, room)?,
            op if op & OP_REC_MASK == OP_REC => self.record(op, r, out, raw_len)?,
            op => return Err(corrupt(format!("unknown op 0x{op:02x}"))),
        }
        Ok(())
    }

    fn page_header(&mut self, out: &mut Vec<u8>, room: usize) -> Result<(), WalCodecError> {
        let (h, hl) = self.tracker.predict_header().ok_or_else(|| {
            corrupt(format!(
                "no page header can be predicted at {}",
                Lsn(self.tracker.pos)
            ))
        })?;
        if hl > room {
            return Err(corrupt("a page header runs past the message end"));
        }
        out.extend_from_slice(&h[..hl]);
        self.tracker.feed(&h[..hl]);
        Ok(())
    }

    fn record(
        &mut self,
        flags: u8,
        r: &mut Sections<'_>,
        out: &mut Vec<u8>,
        raw_len: usize,
    ) -> Result<(), WalCodecError> {
        if flags & !(OP_REC | REC_KNOWN) != 0 {
            return Err(corrupt(format!("unknown record flags 0x{flags:02x}")));
        }
        let (xid, tot) = self.record_header(flags, r, raw_len - out.len())?;
        self.record_body(xid, tot, r)?;
        self.lay_out(flags, tot, r, out, raw_len)?;
        if xid != 0 {
            self.last_xid = xid;
        }
        Ok(())
    }

    /// Starts `self.rec` with the record's header (CRC still zero) and block-header area;
    /// returns its xid and total length (checked against `room`).
    fn record_header(
        &mut self,
        flags: u8,
        r: &mut Sections<'_>,
        room: usize,
    ) -> Result<(u32, usize), WalCodecError> {
        let prev = if flags & REC_PREV_EXPLICIT != 0 {
            r.ctrl.u64()?
        } else {
            self.tracker
                .last_rec
                .ok_or_else(|| corrupt("xl_prev derived where no previous record is known"))?
        };
        let xid = match flags & REC_XID_MASK {
            REC_XID_SAME => self.last_xid,
            REC_XID_ZERO => 0,
            REC_XID_DELTA => self
                .last_xid
                .wrapping_add(unzigzag(r.ctrl.varint()?) as u32),
            _ => return Err(corrupt("unknown xid mode")),
        };
        let info = r.ctrl.u8()?;
        let rmid = r.ctrl.u8()?;
        let area_len = r.ctrl.len(room)?;
        let rec = &mut self.rec;
        rec.clear();
        rec.extend_from_slice(&[0; 4]);
        rec.extend_from_slice(&xid.to_le_bytes());
        rec.extend_from_slice(&prev.to_le_bytes());
        rec.extend_from_slice(&[info, rmid, 0, 0, 0, 0, 0, 0]);
        self.areaxf
            .inverse(&mut r.hdr, area_len, self.compressed_mask, rec)?;
        parse_area(&rec[REC_HDR..], None, self.compressed_mask, &mut self.area)
            .map_err(|e| corrupt(format!("bad block header area: {e:?}")))?;
        let tot = (REC_HDR as u64 + area_len as u64).saturating_add(self.area.data_total);
        if tot > room as u64 {
            return Err(corrupt("a record runs past the message end"));
        }
        let tot = tot as usize;
        rec.reserve(tot - rec.len());
        rec[..4].copy_from_slice(&(tot as u32).to_le_bytes());
        Ok((xid, tot))
    }

    /// Appends the record's images, block data and main data to `self.rec` (tuples restored
    /// from their deltas, main data fields from `mainxf`), then its CRC.
    fn record_body(
        &mut self,
        xid: u32,
        tot: usize,
        r: &mut Sections<'_>,
    ) -> Result<(), WalCodecError> {
        let (info, rmid) = (self.rec[16], self.rec[17]);
        // The fixed part of main data first: it says where the record's tuples belong (and
        // the fields `mainxf` transformed, undone).
        let main_len = self.area.main_len as usize;
        let prune = prunexf::predict_record(
            self.pg_major,
            (rmid, info),
            &self.area.blocks,
            &self.cache,
            &self.redo.candidates,
            &mut self.prune,
        );
        let head_len = HeapRec::main_fixed(rmid, info)
            .max(MainXf::len(rmid, info))
            .max(if prune { prunexf::MAIN_LEN } else { 0 })
            .min(main_len);
        let mut head = [0u8; 16];
        let head = head
            .get_mut(..head_len)
            .ok_or_else(|| corrupt("main data head too long"))?;
        head.copy_from_slice(r.main.bytes(head_len)?);
        let xl = MainXf::len(rmid, info).min(head_len);
        let offnum = mainxf::predicted_offnum(rmid, info, &self.area.blocks, &self.cache);
        self.mainxf
            .inverse(rmid, info, xid, offnum, &mut head[..xl]);
        if prune {
            prunexf::apply_main(head, &self.prune);
        }
        let main_head = &*head;
        let heap = HeapRec::parse(rmid, info, &self.area.blocks, main_head);
        let (block0, expanded) = self.blocks(heap, prune, r)?;
        let site = heap.and_then(|h| h.main_site(main_len));
        self.get_site(site, main_head, &mut r.main, main_len, &mut r.ctrl)?;
        if let Some(h) = heap {
            h.feed(
                block0.map(|x| &self.rec[x]),
                xid,
                &mut self.tuples,
                expanded.then_some(&self.expanded[..]),
            );
        }
        if self.rec.len() != tot {
            return Err(corrupt("record length mismatch"));
        }
        // With images still on the worker, the CRC is set when they come back.
        if !self.deferred.waiting() {
            seal_record(&mut self.rec);
        }
        Ok(())
    }

    /// Appends every block's image and data: all images first (so tuples may refer to any of
    /// them), then the blocks in order. Returns where block 0's data is, and whether a cut
    /// update's new tuple is in `self.expanded` (`HeapRec::expand_cut`).
    fn blocks(
        &mut self,
        heap: Option<HeapRec>,
        prune: bool,
        r: &mut Sections<'_>,
    ) -> Result<(Option<std::ops::Range<usize>>, bool), WalCodecError> {
        self.imgs.clear();
        self.img_ends.clear();
        self.deferred.start_record();
        for i in 0..self.area.blocks.len() {
            let b = self.area.blocks[i];
            if let Some(img) = b.image {
                self.image(&b.key, &img, r)?;
                if let Some(k) = self.stored.take() {
                    self.cache.set_key(k, &b.key);
                }
            }
            self.img_ends.push(self.imgs.len());
        }
        let mut block0 = None;
        let mut expanded = false;
        for i in 0..self.area.blocks.len() {
            let b = self.area.blocks[i];
            let from = if i == 0 { 0 } else { self.img_ends[i - 1] };
            let rec_at = self.rec.len();
            self.rec
                .extend_from_slice(&self.imgs[from..self.img_ends[i]]);
            self.deferred.place(from, self.img_ends[i], rec_at);
            let d = usize::from(b.data_len);
            let at = self.rec.len();
            let heap0 = heap.filter(|_| b.id == 0);
            let site = heap0.and_then(|h| h.block0_site(d));
            let from = match data_stream(self.rec[17], self.rec[16], d) {
                S_LONG => &mut r.long,
                _ => &mut r.data,
            };
            self.get_site(site, &[], from, d, &mut r.ctrl)?;
            if prune && b.id == 0 {
                prunexf::apply_data(&mut self.rec[at..at + d], &self.prune);
            }
            // A cut update's old tuple, looked up once: its changed bytes came as a
            // difference from it, and the tuple cache gets the new tuple expanded with it.
            let old_user = heap0.and_then(|h| h.cut_old(&self.tuples, &self.cache));
            if let (Some(h), Some(old_user)) = (heap0, old_user) {
                let changed = h.changed_bytes(&self.rec[at..at + d], &self.area.blocks, old_user);
                if let Some((k, range)) = changed {
                    tuples::changed_diff(&mut self.rec[at + k..], &old_user[range], false);
                }
                self.expanded.clear();
                expanded = h.expand_cut(&self.rec[at..at + d], old_user, &mut self.expanded);
            }
            if b.id == 0 && d > 0 {
                block0 = Some(at..at + d);
            }
        }
        Ok((block0, expanded))
    }

    /// Writes the record out with page headers at the boundaries and its padding, and
    /// replays it onto the cached pages (`redo`).
    fn lay_out(
        &mut self,
        flags: u8,
        tot: usize,
        r: &mut Sections<'_>,
        out: &mut Vec<u8>,
        raw_len: usize,
    ) -> Result<(), WalCodecError> {
        let mut k = 0;
        while k < tot {
            let room = raw_len - out.len();
            if self.tracker.pos % WAL_PAGE == 0 {
                match r.ctrl.u8()? {
                    BND_PREDICTED => self.page_header(out, room)?,
                    b @ (BND_SHORT | BND_LONG) => {
                        let hl = if b == BND_SHORT { 24 } else { 40 };
                        if hl > room {
                            return Err(corrupt("a page header runs past the message end"));
                        }
                        let h = r.hdr.bytes(hl)?;
                        out.extend_from_slice(h);
                        self.tracker.feed(h);
                    }
                    b => return Err(corrupt(format!("unknown page boundary flag {b}"))),
                }
                continue;
            }
            let n = (tot - k).min(self.tracker.to_page_end()).min(room);
            if n == 0 {
                return Err(corrupt("a record runs past the message end"));
            }
            self.deferred.laid(k, out.len(), n);
            out.extend_from_slice(&self.rec[k..k + n]);
            self.tracker.feed(&self.rec[k..k + n]);
            k += n;
        }
        self.deferred.record_done(&self.rec);
        let rr = redo::Record {
            bytes: &self.rec,
            area: &self.area,
            end_lsn: self.tracker.pos.next_multiple_of(8),
        };
        self.redo.apply(&rr, &mut self.cache);
        if flags & REC_PAD != 0 {
            let pad = ((8 - self.tracker.pos % 8) % 8) as usize;
            if pad > raw_len - out.len() {
                return Err(corrupt("record padding runs past the message end"));
            }
            let s = out.len();
            out.resize(s + pad, 0);
            self.tracker.feed(&out[s..]);
        }
        Ok(())
    }
}
