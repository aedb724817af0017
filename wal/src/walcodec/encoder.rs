//! The sending half: WAL bytes → payload (format in [`super`] and [`super::format`]).

use super::ahead::Ahead;
use super::areaxf::AreaXf;
use super::cache::{new_page, slots_for, EncCache, Page};
use super::format::*;
use super::fpi::{self, Recompressor, Refusal};
use super::hitcode;
use super::hitparse::HitParse;
use super::mainxf::MainXf;
use super::pagexf::PageXf;
use super::payload;
use super::prunexf;
use super::redo::{self, Redo};
use super::rmgr::{Marks, RmgrTally};
use super::streams::{history_log, put_varint, zigzag, PageCompressor};
use super::tracker::{RecState, Tracker};
use super::tuples::{self, HeapRec, TupleCache};
use super::wal::{
    le16, le32, le64, parse_area, phd_len, record_crc, Area, BlockKey, ImageRef, PAGE_SIZE,
    REC_HDR, RM_XLOG_ID, SHORT_PHD, WAL_PAGE, XLOG_FPI, XLOG_FPI_FOR_HINT,
};
use super::{
    check_params, CodecParams, CodecStats, WalCodecError, STREAMS, S_CTRL, S_HDR, S_HIT, S_IMG,
    S_MAIN, S_RAW,
};
use crate::lsn::Lsn;
use crate::pg::PgMajor;

mod blocks;
mod sealer;
mod verify;
mod walk;

use sealer::Sealer;
use verify::{Spot, Verifier};

pub use sealer::STAGED_MAX;

pub struct Encoder {
    /// The parameters it was made with (for `persist`).
    pub(super) params: CodecParams,
    /// Keep the caches through the first message's resync (restored by `persist`).
    pub(super) keep_caches: bool,
    magic: Option<u16>,
    compressed_mask: u8,
    pg_major: Option<PgMajor>,
    max_message: usize,
    tracker: Tracker,
    /// Where the next message is expected to start.
    next_pos: Option<u64>,
    last_xid: u32,
    /// Main data fields derived from what both ends know (see [`super::mainxf`]).
    mainxf: MainXf,
    xmain: Vec<u8>,
    /// A cut update's new tuple, expanded with its old version (`HeapRec::expand_cut`).
    expanded: Vec<u8>,
    /// The prune the record being encoded is sent against (`prunexf`).
    prune: prunexf::Prediction,
    /// Heap records replayed onto cached pages (see [`super::redo`]).
    redo: Redo,
    pub(super) cache: EncCache,
    pub(super) tuples: TupleCache,
    /// Known tuples of the block of the image being encoded.
    tprefix: Vec<u8>,
    /// The encoder's own parse of cache hits (see [`super::hitparse`], [`super::hitcode`]).
    hit: HitParse,
    /// Page frames of everything else.
    pc: PageCompressor,
    /// The streams' input gathered this message.
    bufs: [Vec<u8>; STREAMS],
    /// Page frames of this message.
    fpi: Vec<u8>,
    /// A run of RAW / RAW_HDR / ZERO not yet written to CTRL (merged while it grows).
    pending: Option<(u8, usize)>,
    rec: Vec<u8>,
    /// Relations named lately, for the block-header areas in HDR ([`super::areaxf`]).
    areaxf: AreaXf,
    area: Area,
    page: Page,
    /// Transformed pages of frames without a same-block reference (see [`super::pagexf`]).
    xf: PageXf,
    xpage: Page,
    xref: Page,
    /// The streams' compression, here or on a thread (see [`sealer`]).
    sealer: Sealer,
    stats: CodecStats,
    rmgr: RmgrTally,
    poisoned: bool,
    /// Images the primary compressed: decompressed and checked (see [`fpi`]).
    recomp: Recompressor,
    /// Their checks, off the critical path when `parallel` (see [`verify`]).
    verify: Verifier,
    /// Use more than one core: checks on a worker, a large message's sections compressed on
    /// a thread (see [`Encoder::set_parallel`]).
    parallel: bool,
    /// The streams' fast settings for the next messages (see [`Encoder::set_fast`]).
    fast: bool,
    /// Bytes of the message being encoded.
    msg_len: usize,
    /// The record being encoded logs pages whole that are seldom imaged again soon (XLOG_FPI,
    /// XLOG_FPI_FOR_HINT): see `blocks::Encoder::encode_page_op`.
    seldom_reimaged: bool,
    /// Most bytes of the message's end that may be held back for the next message (see
    /// [`Encoder::encode_held`]); 0: none.
    hold: usize,
    /// The message's records scanned ahead, to prefetch what they touch (see [`super::ahead`]).
    ahead: Ahead,
}

/// Why a record starting here is not encoded.
enum Skip {
    /// It does not end inside this message.
    Split,
    /// Something about it is not understood.
    Odd,
}

impl Encoder {
    pub fn new(p: &CodecParams) -> Result<Encoder, WalCodecError> {
        check_params(p)?;
        let magic = p.pg_major.map(PgMajor::page_magic);
        let (level, hit_level) = levels(p.zstd_level);
        let sections = payload::Sections::new(level, hit_level, history_log(p.block_cache_bytes))?;
        Ok(Encoder {
            params: p.clone(),
            keep_caches: false,
            magic,
            compressed_mask: p.pg_major.map_or(0, PgMajor::bimg_compressed_mask),
            pg_major: p.pg_major,
            max_message: p.max_message_bytes,
            tracker: Tracker::new(magic, 0),
            next_pos: None,
            last_xid: 0,
            mainxf: MainXf::new(),
            xmain: Vec::new(),
            expanded: Vec::new(),
            prune: prunexf::Prediction::default(),
            redo: Redo::new(p.pg_major),
            cache: EncCache::new(slots_for(p.block_cache_bytes)),
            tuples: TupleCache::new(TupleCache::bytes_for(p.block_cache_bytes)),
            tprefix: Vec::new(),
            hit: HitParse::new(),
            areaxf: AreaXf::new(),
            pc: PageCompressor::new(level)?,
            bufs: Default::default(),
            fpi: Vec::new(),
            pending: None,
            rec: Vec::new(),
            area: Area::default(),
            page: new_page(),
            xf: PageXf::new(),
            xpage: new_page(),
            xref: new_page(),
            sealer: Sealer::new(sections),
            stats: CodecStats::default(),
            rmgr: RmgrTally::default(),
            poisoned: false,
            recomp: Recompressor::new().ok_or_else(|| {
                WalCodecError::Zstd("cannot create a zstd context for image recompression".into())
            })?,
            verify: Verifier::new(),
            parallel: payload::multi_core(),
            fast: false,
            msg_len: 0,
            seldom_reimaged: false,
            hold: 0,
            ahead: Ahead::default(),
        })
    }

    /// Whether to use more than one core (on by default when the machine has more than
    /// one): image checks on a worker thread (`verify`), a large staged message's streams
    /// compressed on the section thread ([`Encoder::stage`]). The runtime turns it on while
    /// WAL waits behind the message being encoded, off while it keeps up (threads cost CPU).
    /// Either way the payload restores the same WAL; only images that do not reproduce go
    /// differently.
    pub fn set_parallel(&mut self, on: bool) {
        self.parallel = on && payload::multi_core();
    }

    /// Compresses the streams of the messages encoded from now on at a fast zstd level
    /// ([`super::streams::FAST_LEVEL`], LONG's long-distance matcher sampling sparsely), or
    /// again at the configured level: the runtime turns it on while it falls behind the
    /// primary on CPU (more bytes, less lag). Each stream starts a new zstd frame at its first
    /// input after a change, so the history built so far stops counting for matches. The
    /// decoder needs nothing: the payload restores the same WAL either way.
    pub fn set_fast(&mut self, on: bool) {
        self.fast = on;
    }

    /// Whether the next messages get the fast settings ([`Encoder::set_fast`]).
    pub fn fast(&self) -> bool {
        self.fast
    }

    /// [`Encoder::set_parallel`], whatever the machine (tests).
    #[cfg(test)]
    pub(super) fn threaded_checks(&mut self, on: bool) {
        self.parallel = on;
    }

    pub fn stats(&self) -> &CodecStats {
        &self.stats
    }

    /// Block cache memory in use (bytes accounted per slot).
    pub fn cache_bytes(&self) -> usize {
        self.cache.bytes()
    }

    /// Tuple cache memory in use.
    pub fn tuple_cache_bytes(&self) -> usize {
        self.tuples.bytes()
    }

    /// One XLogData message's WAL bytes starting at `start`, in stream order; `out` cleared
    /// first. Output is self-contained per message (everything flushed): nothing waits for
    /// later bytes. Refused while messages are staged ([`Encoder::stage`]).
    pub fn encode(
        &mut self,
        start: Lsn,
        raw: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), WalCodecError> {
        self.encode_held(start, raw, 0, out).map(|_| ())
    }

    /// [`Encoder::encode`] of the message's first bytes: a record that starts in the last
    /// `hold` bytes and does not end in the message is left out, with everything after it,
    /// when something comes before it. Returns how many bytes the payload restores; the
    /// caller sends the rest at the start of its next message, where the record is encoded
    /// whole instead of passing raw in two pieces (a record cut by a message's end is not
    /// understood by either message).
    pub fn encode_held(
        &mut self,
        start: Lsn,
        raw: &[u8],
        hold: usize,
        out: &mut Vec<u8>,
    ) -> Result<usize, WalCodecError> {
        out.clear();
        if self.sealer.staged() > 0 {
            return Err(WalCodecError::Params(
                "encode called with messages staged: collect them first".into(),
            ));
        }
        let n = self.transform(start, raw, false, hold)?;
        self.collect(out)?;
        Ok(n)
    }

    /// The first half of [`Encoder::encode`]: transforms the message and hands its streams
    /// to be compressed (on a thread when [`Encoder::set_parallel`] allows it and the
    /// message is large), so that the caller can transform the next message meanwhile. Its
    /// payload comes from [`Encoder::collect`], oldest first; at most [`STAGED_MAX`] messages
    /// may be staged and not collected.
    pub fn stage(&mut self, start: Lsn, raw: &[u8]) -> Result<(), WalCodecError> {
        self.stage_held(start, raw, 0).map(|_| ())
    }

    /// [`Encoder::stage`] of the message's first bytes, as [`Encoder::encode_held`] chooses
    /// them; returns how many.
    pub fn stage_held(
        &mut self,
        start: Lsn,
        raw: &[u8],
        hold: usize,
    ) -> Result<usize, WalCodecError> {
        self.transform(start, raw, self.parallel, hold)
    }

    /// [`Encoder::stage_held`]; `away`: the streams may be compressed on the section thread.
    fn transform(
        &mut self,
        start: Lsn,
        raw: &[u8],
        away: bool,
        hold: usize,
    ) -> Result<usize, WalCodecError> {
        if self.poisoned {
            return Err(WalCodecError::Poisoned);
        }
        if self.sealer.staged() >= STAGED_MAX {
            return Err(WalCodecError::Params(format!(
                "{STAGED_MAX} messages are staged already: collect one before staging another"
            )));
        }
        if raw.len() > self.max_message {
            return Err(WalCodecError::TooLong {
                len: raw.len(),
                max: self.max_message,
            });
        }
        let end = start
            .0
            .checked_add(raw.len() as u64)
            .ok_or(WalCodecError::Overflow {
                start,
                len: raw.len(),
            })?;
        if self.next_pos != Some(start.0) {
            self.restart(start);
        }
        self.hold = hold.min(raw.len());
        // Stream caps follow the bytes the message restores: the fewest it may.
        self.msg_len = raw.len() - self.hold;
        let before = self.tracker.resyncs;
        let res = self
            .encode_body(raw)
            .and_then(|n| self.end_message(n, away).map(|()| n));
        self.stats.resyncs += self.tracker.resyncs - before;
        match res {
            Ok(n) => {
                self.next_pos = Some(end - (raw.len() - n) as u64);
                Ok(n)
            }
            Err(e) => {
                self.poisoned = true;
                self.verify.discard();
                Err(e)
            }
        }
    }

    /// Messages staged and not collected yet.
    pub fn staged(&self) -> usize {
        self.sealer.staged()
    }

    /// A message that does not follow the last one: the tracker starts over here, and the
    /// caches are dropped (unless restored for this message by `persist`).
    fn restart(&mut self, start: Lsn) {
        if self.next_pos.is_some() {
            self.stats.resyncs += 1;
        }
        self.tracker = Tracker::new(self.magic, start.0);
        if !std::mem::take(&mut self.keep_caches) {
            self.cache.clear();
            self.tuples.clear();
        }
        self.last_xid = 0;
        self.mainxf = MainXf::new();
        self.areaxf = AreaXf::new();
    }

    /// Encodes the record starting here as a REC op if it is complete in `rest` and understood.
    fn try_record(&mut self, rest: &[u8]) -> Result<Result<usize, Skip>, WalCodecError> {
        let span = match self.gather(rest) {
            Ok(s) => s,
            Err(e) => return Ok(Err(e)),
        };
        let rec = std::mem::take(&mut self.rec);
        let res = self.encode_record(rest, &rec, span);
        self.rec = rec;
        res
    }

    fn encode_record(
        &mut self,
        rest: &[u8],
        rec: &[u8],
        span: usize,
    ) -> Result<Result<usize, Skip>, WalCodecError> {
        let (Some(xid), Some(prev), Some(crc)) = (le32(rec, 4), le64(rec, 8), le32(rec, 20)) else {
            return Ok(Err(Skip::Odd));
        };
        if rec[18] != 0 || rec[19] != 0 || record_crc(rec) != crc {
            return Ok(Err(Skip::Odd));
        }
        let body = &rec[REC_HDR..];
        if parse_area(body, Some(body.len()), self.compressed_mask, &mut self.area).is_err() {
            return Ok(Err(Skip::Odd));
        }
        let end = self.tracker.pos + span as u64;
        let pad = ((8 - end % 8) % 8) as usize;
        let mut flags = OP_REC;
        if self.tracker.last_rec != Some(prev) {
            flags |= REC_PREV_EXPLICIT;
        }
        if pad > 0 && rest.get(span..span + pad).is_some_and(is_zero) {
            flags |= REC_PAD;
        }
        flags |= if xid == self.last_xid {
            REC_XID_SAME
        } else if xid == 0 {
            REC_XID_ZERO
        } else {
            REC_XID_DELTA
        };
        self.flush_pending();
        let marks = self.marks();
        self.record_header(rec, flags, prev, xid)?;
        self.record_body(rec, xid)?;
        let mut j = self.lay_out(rest, rec);
        if flags & REC_PAD != 0 {
            self.tracker.feed(&rest[j..j + pad]);
            self.stats.zeros_in += pad as u64;
            j += pad;
        }
        if xid != 0 {
            self.last_xid = xid;
        }
        self.stats.records += 1;
        let after = self.marks();
        self.rmgr
            .charge(&mut self.stats.by_rmgr, rec[17], j as u64, &marks, &after);
        Ok(Ok(j))
    }

    /// The REC op's fields (CTRL) and the block-header area (HDR).
    fn record_header(
        &mut self,
        rec: &[u8],
        flags: u8,
        prev: u64,
        xid: u32,
    ) -> Result<(), WalCodecError> {
        let area_len = self.area.len;
        let ctrl = &mut self.bufs[S_CTRL];
        ctrl.push(flags);
        if flags & REC_PREV_EXPLICIT != 0 {
            ctrl.extend_from_slice(&prev.to_le_bytes());
        }
        if flags & REC_XID_MASK == REC_XID_DELTA {
            put_varint(
                ctrl,
                zigzag(i64::from(xid.wrapping_sub(self.last_xid) as i32)),
            );
        }
        ctrl.push(rec[16]);
        ctrl.push(rec[17]);
        put_varint(ctrl, area_len as u64);
        let area = &rec[REC_HDR..REC_HDR + area_len];
        self.areaxf
            .forward(area, self.compressed_mask, &mut self.bufs[S_HDR])?;
        self.stats.record_header_in += (REC_HDR + area_len) as u64;
        Ok(())
    }

    /// Lays the record out again as it is in `rest`, feeding the tracker, with a flag per
    /// page boundary; replays it onto the cached pages (`redo`). Returns the bytes of `rest`
    /// it spans (without padding).
    fn lay_out(&mut self, rest: &[u8], rec: &[u8]) -> usize {
        let tot = rec.len();
        let (mut j, mut k) = (0usize, 0usize);
        while k < tot {
            if self.tracker.pos % WAL_PAGE == 0 {
                let hl = le16(rest, j + 2).map_or(SHORT_PHD, phd_len);
                let actual = &rest[j..j + hl];
                let predicted = self
                    .tracker
                    .predict_header()
                    .is_some_and(|(h, len)| len == hl && h[..hl] == *actual);
                if predicted {
                    self.bufs[S_CTRL].push(BND_PREDICTED);
                    self.stats.page_header_out += 1;
                } else {
                    self.bufs[S_CTRL].push(if hl == SHORT_PHD { BND_SHORT } else { BND_LONG });
                    self.bufs[S_HDR].extend_from_slice(actual);
                    self.stats.page_header_out += hl as u64;
                }
                self.stats.page_header_in += hl as u64;
                self.tracker.feed(actual);
                j += hl;
                continue;
            }
            let n = (tot - k).min(self.tracker.to_page_end());
            self.tracker.feed(&rest[j..j + n]);
            j += n;
            k += n;
        }
        let r = redo::Record {
            bytes: rec,
            area: &self.area,
            end_lsn: self.tracker.pos.next_multiple_of(8),
        };
        self.redo.apply(&r, &mut self.cache);
        j
    }

    /// Where the streams' inputs and the page frames end now.
    fn marks(&self) -> Marks {
        let mut m = [0; STREAMS + 1];
        for (x, b) in m.iter_mut().zip(&self.bufs) {
            *x = b.len();
        }
        m[STREAMS] = self.fpi.len();
        m
    }
}

/// zstd levels the codec uses for a configured `link.zstd_level`: (the streams and the page
/// frames without a reference, the HIT stream of cache hits).
///
/// The configured level is the effort asked for; the codec spends it where it pays. Against
/// the previous image of the same block the lazy matchers of levels 5+ find the few changes
/// much better (hit frames 57 % smaller than at level 3 on pgbench WAL), while the streams
/// and the other page frames, whose repeats the codec has mostly taken out already, gain
/// little above level 1. Measured on recorded WAL (`harness/examples/codec_profile.rs`, best
/// of three; PG 15 pgbench, bulk load, lz4 and zstd images, PG 14 pglz images): (1, 6) gives
/// 1–5 % fewer bytes for 9–18 % less encoding CPU than (3, 5), the levels before, on every
/// one of them. Since then the encoder parses cache hits itself (`hitparse`: frames 10 %
/// smaller on recorded WAL, several times faster), and since format 12 the second level is
/// that of the HIT stream, where those matches go (`hitcode`): on recorded PG 15 pgbench WAL
/// 0.4 % fewer bytes in all than at the streams' level (23,646,272 against 23,739,819).
pub(crate) fn levels(level: i32) -> (i32, i32) {
    (
        level.saturating_sub(2).max(1),
        level.saturating_add(3).min(zstd_safe::max_c_level()),
    )
}

/// Smallest page content (8192 bytes less the hole) sent as a whole page through PAGE. For an
/// image as it is, that is its size in the WAL, so such images keep PAGE within 8 × the
/// message ([`payload::cap`], which the decoder enforces); an image the primary compressed
/// takes less WAL than its page, and goes through PAGE only while the message's PAGE input
/// stays within that cap (format 7).
pub(crate) const MIN_STREAM_IMAGE: usize = PAGE_SIZE / 8;

/// Whether `b` is all zero bytes (eight at a time).
pub(crate) fn is_zero(b: &[u8]) -> bool {
    let mut chunks = b.chunks_exact(8);
    chunks.all(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) == 0)
        && chunks.remainder().iter().all(|&x| x == 0)
}
