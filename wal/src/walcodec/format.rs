//! The op sequence in the CTRL stream. Each op appends bytes to the restored message, which
//! both sides feed, in order, to their [`Tracker`](super::tracker::Tracker); the decoder runs
//! ops until it has `raw_len` bytes.
//!
//! ```text
//! op = RAW      0x01 n:varint            n bytes from RAW
//!    | RAW_HDR  0x02 n:varint            n bytes from HDR (a page header not predicted, or part)
//!    | ZERO     0x03 n:varint            n zero bytes
//!    | PAGE_HDR 0x04                     the page header the tracker predicts here
//!    | REC      0x40|flags record        one whole record, from a record start
//!
//! flags: 0x01 PREV_EXPLICIT  xl_prev follows (else the tracker's previous record start)
//!        0x02 PAD            the record's zero alignment padding follows it
//!        0x0C xid mode       0x00 same as the last record's xid, 0x04 zero, 0x08 delta follows
//!
//! record = [xl_prev:u64le if PREV_EXPLICIT] [zigzag(xid - last xid):varint if delta]
//!          xl_info:u8 xl_rmid:u8 area_len:varint      (area_len bytes of HDR: block headers)
//!          image-op × (blocks with an image, in block order)
//!          [site]     (block 0's data, if it holds a heap tuple: see super::tuples)
//!          [site]     (main data, if it holds an old heap tuple or key)
//!          boundary × (page boundaries the record crosses, in order)
//!
//! image-op = 0 OPAQUE                   bimg_len bytes from IMG
//!          | 1 NEW    k:varint len:varint  frame (no reference) → page; store in slot k
//!          | 2 SAME   k:varint             the next hit of HIT against slot k → page
//!                                          (`super::hitcode`); store in slot k
//!          | 3 REF    j:varint k:varint len:varint  frame against slot j; store in slot k
//!          | 4 IDENT  k:varint             the page in slot k, unchanged
//!          | 5 NOCACHE len:varint          frame (no reference), not stored
//!          | 6 STREAM k:varint             the next 8192 bytes of PAGE (of LONG for pages
//!                                          of long items: `page_stream`); store in slot k
//!                                          (only for images of at least 1024 bytes)
//!          | 7 STREAM_NOCACHE              the next 8192 bytes of PAGE (or LONG), not stored
//!          | 0x80|op (op 1..=7)           as op, for an image the primary compressed
//!          | 0xA0|op (op 1..=7)           the slots of op, a frame len of 0 (ops 1, 3,
//!                                         5) and no page or hit bytes (2, 6, 7); the image is
//!                                         bimg_len bytes from IMG, the primary's (which
//!                                         compressing the page again would not give),
//!                                         its page what they decompress to, stored as
//!                                         op says
//!          | 0x40|op (op 1, 3, 5)         as op, page (and reference) not transformed
//!          frames are `len` bytes of FPI; the page of ops 1, 3, 5, 6 and 7 is sent in the
//!          form of `super::pagexf` (transformed; REF frames are made against the
//!          transformed reference page), that of SAME as it is; the image is the page
//!          without its hole, or for
//!          0x80|op (IMG_RECOMPRESS) the page without its hole compressed with the method
//!          that bimg_info names, exactly bimg_len bytes (see `fpi`); the 1024 bytes of
//!          STREAM are counted in bimg_len, the compressed size

//!
//! boundary = 0 predicted header | 1 24 bytes of HDR | 2 40 bytes of HDR
//! ```
//!
//! The record is rebuilt as: the 24-byte header (xl_tot_len = 24 + area_len + data announced
//! by the area, the two pad bytes zero, xl_crc recomputed), the area, then per block its image
//! (from the image op) and its data (`data_length` bytes of DATA or LONG as [`data_stream`]
//! says, or fewer when a site says
//! its tuple is a delta; for a heap update PostgreSQL cut against its old tuple, the changed
//! bytes at its end as their difference from the old tuple's, where
//! `tuples::HeapRec::changed_bytes` finds them: format 14; for a prune on access, its data
//! XOR that predicted from the cached page, `prunexf`: format 15 for PostgreSQL 14-16, 16
//! for 17-18 too), then `main_len` bytes of MAIN (the same; a prune's first 8 XOR the
//! prediction's). All images
//! of a record are
//! restored (and enter the block cache) before any data, so a tuple may refer to the image of
//! any block of its own record. MAIN is read in two steps: first the fixed struct of a heap
//! record (`tuples::HeapRec::main_fixed`, which locates the record's tuples), then the rest.
//! It is laid out from the current position with a page header at each page boundary.

use super::wal::{ImageRef, PAGE_HEADER, PAGE_SIZE, RM_HEAP2_ID, XLOG_HEAP_OPMASK};
use super::{S_DATA, S_LONG, S_PAGE};

pub const OP_RAW: u8 = 0x01;
pub const OP_RAW_HDR: u8 = 0x02;
pub const OP_ZERO: u8 = 0x03;
pub const OP_PAGE_HDR: u8 = 0x04;
pub const OP_REC: u8 = 0x40;
pub const OP_REC_MASK: u8 = 0xC0;

pub const REC_PREV_EXPLICIT: u8 = 0x01;
pub const REC_PAD: u8 = 0x02;
pub const REC_XID_MASK: u8 = 0x0C;
pub const REC_XID_SAME: u8 = 0x00;
pub const REC_XID_ZERO: u8 = 0x04;
pub const REC_XID_DELTA: u8 = 0x08;
/// Flag bits a version-1 decoder understands.
pub const REC_KNOWN: u8 = 0x0F;

pub const IMG_OPAQUE: u8 = 0;
pub const IMG_NEW: u8 = 1;
pub const IMG_SAME: u8 = 2;
pub const IMG_REF: u8 = 3;
pub const IMG_IDENT: u8 = 4;
pub const IMG_NOCACHE: u8 = 5;
pub const IMG_STREAM: u8 = 6;
pub const IMG_STREAM_NOCACHE: u8 = 7;

pub const BND_PREDICTED: u8 = 0;
pub const BND_SHORT: u8 = 1;
pub const BND_LONG: u8 = 2;

/// Items (tuples) of at least this many bytes each on average, as the image's hole tells
/// ([`page_stream`]).
pub const LONG_ITEMS: usize = 1024;
/// The smallest image (bimg_len) whose page may go through LONG: each page there restores to
/// at most four times the WAL it stands for, which bounds LONG at 4 × the message
/// (`payload::cap`).
pub const DATA_PAGE_MIN_LEN: usize = PAGE_SIZE / 4;

/// The stream that holds the page of a STREAM or STREAM_NOCACHE op for image `img` (format
/// 9; LONG since format 11, where DATA was), decided from the image header, which both ends
/// have before the op: LONG for a page of long items (`pd_lower` from the hole's start,
/// `pd_upper` from its end, at least [`LONG_ITEMS`] bytes per line pointer) at least
/// [`DATA_PAGE_MIN_LEN`] long, else PAGE. Long items are mostly tuples a record carried
/// before (TOAST chunks, wide rows), still in LONG's long window (`streams::history_log`,
/// long-distance matching) where PAGE's 4 MiB window has lost them: recorded PG 15 WAL of
/// TOAST rewrites 18.7 % fewer bytes; pgbench, bulk loads, updates, moved rows and lz4 images
/// the same bytes (none of their pages qualifies; a threshold of 256 bytes would move some
/// and cost them).
pub fn page_stream(img: &ImageRef) -> usize {
    let lower = usize::from(img.hole_offset);
    let upper = lower + usize::from(img.hole_len);
    let items = lower.saturating_sub(PAGE_HEADER) / 4;
    let long = img.hole_len > 0
        && items > 0
        && upper <= PAGE_SIZE
        && PAGE_SIZE - upper >= LONG_ITEMS * items;
    if long && usize::from(img.len) >= DATA_PAGE_MIN_LEN {
        S_LONG
    } else {
        S_PAGE
    }
}

/// A block's data of at least this many bytes goes through LONG ([`data_stream`]): the last
/// chunk of a TOAST value can be short, and shorter data would not be taken by the
/// long-distance matcher anyway (`streams::LDM_MIN_MATCH`); a bulk load's rows of a key and
/// a 128-character text (182 bytes) stay in DATA.
pub const LONG_DATA: usize = 256;
/// The op of a heap2 multi-insert (`heapam_xlog.h`).
const XLOG_HEAP2_MULTI_INSERT: u8 = 0x50;

/// The stream that holds `len` bytes of a block's data of a record (`xl_rmid`, `xl_info`)
/// (format 11), decided from what both ends have before the data: LONG for data of at least
/// [`LONG_DATA`] bytes, unless it is a multi-insert's (the many short rows of a `COPY`),
/// else DATA. LONG has the long window and long-distance matching that find a TOAST chunk or
/// a wide row written again long after; DATA, the short rows, a 4 MiB window read in place
/// (`streams::CStream`), where zstd's faster one-segment matcher runs and no long-distance
/// matcher samples every byte. Recorded PG 15 WAL, one core, format 10 (all of it in DATA)
/// against 11, medians of four paired runs (`docs/keeping-up.md`, forty-sixth round): the
/// bench's bulk load (all its data short or a multi-insert's) encodes 1.40 × as fast for
/// 0.009 % more bytes; TOAST rewrites 1.08 × for 4.4 % fewer (the rows apart from their
/// chunks); pgbench the same speed for 0.39 % fewer; random-payload updates, moved rows and
/// pglz images the same bytes within 0.005 %. Sending only the heap's records to LONG (prune
/// and index-split data kept in DATA) gave pgbench back its 0.39 % for no measurable speed
/// (forty-seventh round), so every record's long data goes there.
pub fn data_stream(rmid: u8, info: u8, len: usize) -> usize {
    let multi_insert = rmid == RM_HEAP2_ID && info & XLOG_HEAP_OPMASK == XLOG_HEAP2_MULTI_INSERT;
    if len >= LONG_DATA && !multi_insert {
        S_LONG
    } else {
        S_DATA
    }
}

/// Or-ed into image ops 1..=7 for an image the primary compressed (bimg_info names the
/// method): the page is rebuilt as for other images, then compressed without its hole with
/// that method (see `fpi`) to give the record's bimg_len bytes.
pub const IMG_RECOMPRESS: u8 = 0x80;

/// What follows image op `kind` (1..=7, flags removed): slot varints in CTRL (the last one
/// the slot stored into, except for IDENT, whose one slot is read), then for NEW, REF and
/// NOCACHE a frame length varint (and the frame in FPI); STREAM and STREAM_NOCACHE take a
/// page from PAGE, SAME a hit from HIT (format 12). `None` for OPAQUE and unknown kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpLayout {
    pub slots: usize,
    pub stores: bool,
    pub framed: bool,
    pub page: bool,
    pub hit: bool,
}

pub fn op_layout(kind: u8) -> Option<OpLayout> {
    let (slots, framed) = match kind {
        IMG_NEW => (1, true),
        IMG_REF => (2, true),
        IMG_NOCACHE => (0, true),
        IMG_IDENT | IMG_STREAM | IMG_SAME => (1, false),
        IMG_STREAM_NOCACHE => (0, false),
        _ => return None,
    };
    Some(OpLayout {
        slots,
        stores: slots > 0 && kind != IMG_IDENT,
        framed,
        page: matches!(kind, IMG_STREAM | IMG_STREAM_NOCACHE),
        hit: kind == IMG_SAME,
    })
}

/// Or-ed into an op with [`IMG_RECOMPRESS`]: the image is read from IMG (bimg_len bytes, the
/// primary's) and its page is what they decompress to; the op keeps its slots, with no frame
/// (length 0) or PAGE bytes. The encoder learns that recompression does not reproduce an
/// image after the op is written, and rewrites it (`encoder/verify.rs`).
pub const IMG_PRIMARY: u8 = 0x20;

/// Or-ed into NEW, REF, NOCACHE, STREAM and STREAM_NOCACHE (the last two since format 8):
/// the page (and REF's reference) went as it is, not transformed: where the transform does
/// not help (`PageXf::helps`), and for frames whichever is smaller when the block has known
/// tuples (they match the page as it is).
pub const IMG_PLAIN: u8 = 0x40;
