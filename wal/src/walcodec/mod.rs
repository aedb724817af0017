//! WAL-aware link codec: replaces generic zstd for the WAL bytes of XLogData messages.
//!
//! Pure and sans-IO: [`Encoder::encode`] turns one message's WAL bytes into a payload,
//! [`Decoder::decode`] restores exactly those bytes. Both are deterministic state machines fed
//! the same messages in the same order; the decoder mirrors the encoder's state (the WAL
//! [`tracker`], the block cache, the zstd streams), so derivable bytes never cross the link:
//!
//! - page headers are predicted from the previous header and the record being followed;
//! - xl_prev is the start of the previous record, xl_crc is recomputed, xl_tot_len follows from
//!   the block headers, padding is zeros;
//! - full-page images are rebuilt into 8 KiB pages (hole zero filled) and compressed with zstd
//!   against the last image of the same block held in a block cache on both ends (for a block
//!   not in the cache: the previous block of the relation, else the relation's latest page,
//!   both pages put through a reversible transform that delta-codes line pointers and item
//!   heads, [`pagexf`]); the encoder says which slots to read and write, the decoder obeys;
//!   both ends replay heap records onto the cached pages of the blocks they touch
//!   (`redo.rs`), so that the next image is framed against the page as it most likely is;
//! - full-page images the primary compressed (wal_compression pglz, lz4, zstd) are
//!   decompressed to the page and sent the same way; the decoder compresses the page again
//!   with the primary's method ([`fpi`]), which gives back the primary's exact bytes: the
//!   encoder has checked that it does for every image (library versions differ, zstd's
//!   above all) and sends the image as it is when it does not;
//! - heap tuples (new tuples of INSERT/UPDATE, old tuples that wal_level=logical adds) go as
//!   a prefix/suffix delta against a version both ends hold: a tuple cache fed by the records,
//!   or the tuple's line pointer in a cached page image ([`tuples`]);
//! - everything else (header fields that are not derivable, block headers, block and main data,
//!   raw bytes) goes through streaming zstd, one context per kind, flushed every message; the
//!   context of long block data (LONG: 256 bytes or more) keeps a long history (an eighth of
//!   `block_cache_bytes`) searched by zstd's long-distance matcher, so content that crossed
//!   the link before under another identity (a TOAST value written again under new chunk ids)
//!   is a reference.
//!
//! When a codec end may use more than one core (`set_parallel`: the runtime allows it while
//! messages wait behind the current one), each end splits a message's work in two halves
//! that run on two threads for consecutive messages (`handoff.rs`): the encoder compresses
//! a staged message's streams on a thread while the caller transforms the next message
//! (`Encoder::stage`, `encoder/sealer.rs`), the decoder decompresses a staged message's
//! sections while the caller restores the message before (`Decoder::stage`,
//! `decoder/unpacker.rs`); the zstd contexts move to the thread and back, never used by two
//! threads at once, so the bytes do not depend on it. A large message decoded without being staged has its sections decompressed
//! on several threads at once (`payload.rs`). Images the primary compressed are compressed
//! again on a worker thread (`imgworker.rs`) while the message goes on: the encoder's
//! checks (`encoder/verify.rs`), the decoder's restoring (`decoder/deferred.rs`). The worker
//! takes what it keeps up with; the rest is done in place.
//!
//! The caches can be saved and restored ([`persist`], pure functions with a digest both ends
//! can compare); the runtime does not use them yet, so every new session starts cold.
//!
//! Anything not understood (unsupported major, no lock on a record boundary yet, a record cut
//! by the message boundary, a CRC mismatch, an unparsable block header area) passes through as
//! raw bytes; the encoder never fails because of the WAL's contents. The caller still checks
//! length and xxh3 of the result (see `crate::linkcodec`).
//!
//! # Payload format (version 12)
//!
//! Version 2 added [`format::IMG_RECOMPRESS`] (images the primary compressed, sent as pages),
//! heap tuples as deltas ([`tuples`]) and all images of a record before its data. Version 3:
//! every page that is not framed against the previous image of its own block (image ops NEW,
//! REF, NOCACHE, STREAM, STREAM_NOCACHE) goes through [`pagexf`]'s transform, REF frames
//! against the transformed reference page, unless [`format::IMG_PLAIN`] says otherwise; known
//! tuples in page frames carry their on-page header ([`tuples::Head`]); main data fields that
//! follow from the record header or the previous record go transformed ([`mainxf`]); heap
//! records are replayed onto cached pages (`redo.rs`, part of the format: both ends must do
//! the same); no bytes for empty sections, and small messages in one combined zstd context
//! (`payload.rs`). Version 4: an image the primary compressed may be sent as its page and
//! its own bytes ([`format::IMG_PRIMARY`]), so that the encoder can learn whether the
//! receiver's compression reproduces it after writing the op (checks off the critical path:
//! `encoder/verify.rs`). Version 5: a frame against the previous image of the same block
//! (SAME) is made against that page alone, without the block's known tuples in front: the
//! records since were replayed onto the page (`redo.rs`), which holds their tuples already.
//! Recorded PG 15 WAL (the bench's load for 100 s, from the start), without them against
//! with them, one core, medians of five: pgbench 0.17 % more bytes, encoding 13 % faster;
//! random-payload updates 0.78 % and 11 %; rows moved to other pages 0.57 % and 13 %; zstd
//! images 0.07 % and 16 %. Version 6: an INSERT into a relation that has had 64 Ki INSERT
//! records since its last UPDATE or DELETE is not put into the tuple cache
//! ([`tuples`]`::inserts`): caching the rows of a bulk load was 40 % of encoding it, and
//! decoding ran twice as fast without it, for no delta ever made against them. Version 7: an
//! image the primary compressed may go whole through PAGE when its page's content (8192 bytes
//! less the hole) is at least 1 KiB, however few bytes it takes in the WAL, as long as the
//! message's PAGE input stays within the decoder's cap (8 × the message); before, only
//! images of at least 1 KiB in the WAL could, so most compressed images were framed one by
//! one. Recorded PG 15 pgbench WAL with pglz images, the bench's cold window (a checkpoint,
//! then 40 s at 2,300 tps): 12 % fewer bytes, encoding 14 % faster; 60 s at full speed with
//! pglz, lz4 and zstd images: 4-6 % fewer bytes. (A format 7 that sent cold relations' rows
//! through RAW was tried and reverted before any release; this is another.) Version 8:
//! [`format::IMG_PLAIN`] also on STREAM and STREAM_NOCACHE, and the encoder sends a page
//! plain wherever [`pagexf`]'s differences leave fewer than 60 % of the item heads' bytes
//! zero (`PageXf::helps`): text keys, whose differences cost more than the digits did.
//! Recorded PG 15 WAL of the bench's bulk load: its index builds 40 % fewer bytes, 6.8 % on
//! 1.2 GB of its loading; pgbench's and the image-compressed recordings the same bytes.
//! Version 9: a streamed page of long items (at least 1 KiB per line pointer by the image's
//! hole, an image of at least 2 KiB: [`format::page_stream`]) goes through DATA instead of
//! PAGE, where DATA's long window still holds the tuples the page was filled with (TOAST
//! chunks, wide rows); DATA's cap rises to 4 × the message. Recorded PG 15 WAL of TOAST
//! rewrites: 18.7 % fewer bytes; pgbench, bulk load, updates, moved rows and lz4 images the
//! same bytes. Version 10: the tuple cache keeps its tuples as records in one ring of its
//! size, the oldest dropped first, a tuple written again or removed dead until the ring passes
//! it ([`tuples`]' `ring.rs`); version 9 dropped the oldest tuples by their bytes plus 64 each
//! and used about twice its size in memory. The payload's layout is unchanged; which tuples
//! both ends hold, and so which deltas a record gets, changed. Version 11: the long window
//! and its long-distance matcher move from DATA to a stream of their own, LONG, which gets a
//! block's data of at least 256 bytes (not a multi-insert's) and the streamed pages of long
//! items ([`format::data_stream`], [`format::page_stream`]); DATA keeps the shorter data in a
//! 4 MiB window read in place, as RAW, PAGE and MAIN are; `present` becomes a varint (a
//! ninth bit). Recorded PG 15 WAL, one core: the bench's bulk load encodes 1.40 × as fast
//! for 0.009 % more bytes, TOAST rewrites 1.08 × for 4.4 % fewer, pgbench the same speed for
//! 0.39 % fewer ([`format::data_stream`]). Version 12: a cache hit (image op SAME) is no
//! longer a zstd frame of its own but its matches against the block's previous image,
//! written out (`hitcode`) into a stream of their own, HIT, which zstd codes a message at a
//! time; a hit that would take more bytes than its image in the WAL goes as any other page
//! against that reference. Recorded PG 15 WAL, one core: pgbench 5.8 % fewer bytes from a
//! cold start, 10.1 % once warm (the hits' 1.87 MB of frames became 0.5 MB of HIT), with
//! lz4, pglz and zstd images 4.5–5.0 % fewer. Also in version 12, the block-header areas go
//! through HDR with each relation as its place among the 16 named last and each block
//! number as the step from the one named last in its relation and fork (`areaxf.rs`); HDR's
//! cap rises to 2 × raw_len + 1024. Warmed on 200 MB: pgbench 6.3 % fewer bytes, pgbench
//! with zstd images 6.7 % (after the hits' change). An older decoder refuses a payload of a
//! newer version by the first byte (since version 16, `0x80 |` the version for a combined
//! payload, which `0x10 |` could no longer tell from a separate one).
//!
//! ```text
//! payload  = 0x10 present:varint clen:varint × (present sections) sections FPI-bytes
//!          | 0x90 clen:varint combined-chunk FPI-bytes
//! ```
//!
//! (the framing in detail: `payload.rs`).
//!
//! Varints are unsigned LEB128. Each of CTRL..HIT is the output of its own streaming zstd
//! context for this message, ended with ZSTD_e_flush (absent when the stream got nothing this
//! message), or a part of the combined chunk. A stream is a sequence of zstd frames: a
//! section may begin with the end (ZSTD_e_end) of the frame before and the start of a new one,
//! where the encoder changed the stream's level (`streams::CStream::set_fast`) or, in a
//! stream without long-distance matching, filled the two windows of input it keeps for a
//! frame (`streams::CStream`, a section may then hold several such boundaries); zstd's
//! streaming decoder reads on across them, and the new frame has no history. The streams:
//!
//! - CTRL: the op sequence ([`format`](mod@format)) and small record-header fields;
//! - HDR: block-header areas of records (relations and block numbers as `areaxf.rs` codes
//!   them) and page headers that were not predicted;
//! - DATA: block data of records (tuples, mostly) shorter than 256 bytes, and a multi-insert's
//!   ([`format::data_stream`]);
//! - RAW: bytes passed through as they are;
//! - IMG: image bytes that do not go through the cache (odd images, and compressed ones that
//!   do not decompress or would not be compressed back to the same bytes);
//! - PAGE: whole 8192-byte pages (hole zero filled; those of long items go through LONG) of
//!   images whose page holds at least 1 KiB
//!   besides its hole and that are not cache hits, unless the block's known tuples make up
//!   half of the page's content, and as long as the message's PAGE input stays within 8 × the
//!   message (the stream's window holds the other recent pages; the encoder chooses, the
//!   format allows either);
//! - MAIN: main data of records (rmgr structs; kept apart from tuples: 4% smaller);
//! - LONG: the other block data of records (TOAST chunks, wide rows, index page splits) and
//!   the streamed pages of long items ([`format::page_stream`]), with the long window
//!   (`streams::history_log`) and long-distance matching;
//! - HIT: cache hits, each as literals and matches against the block's previous image
//!   (`hitcode`), at the level of the hits (`encoder::levels`).
//!
//! FPI is not compressed further: it is the concatenation of magicless zstd frames, each
//! exactly one 8192-byte page, compressed against a cached reference page
//! (ZSTD_CCtx_refPrefix) or alone, lengths in CTRL (levels: `encoder::levels`): the pages that
//! are neither hits nor streamed whole.
//!
//! The decoder replays the ops in CTRL until it has `raw_len` bytes; every section must then be
//! used up exactly. Decompressed sizes are capped as they are allocated: CTRL at
//! 4 × raw_len + 1024, HDR at 2 × raw_len + 1024, PAGE at 8 × raw_len + 8192, LONG at
//! 4 × raw_len + 8192, the others (HIT too) at raw_len, a combined chunk at their sum and 90.
//!
//! # Memory per session (each end)
//!
//! - zstd windows: LONG's is the largest power of two up to `block_cache_bytes / 8`, between
//!   4 MiB and 1 GiB (128 MiB for the default 1 GiB; `streams::history_log`), with zstd's
//!   long-distance matcher above 4 MiB (its tables on the encoder: about 1/16 of the window);
//!   4 MiB for DATA, RAW, PAGE, MAIN and the combined context (the encoder holds two windows
//!   of their input, `streams::CStream`), 1 MiB for CTRL, HDR, IMG and HIT; the decoder refuses
//!   larger windows. zstd allocates a window when the first message uses the stream and the
//!   system commits its pages as they fill;
//! - the block cache: `block_cache_bytes / (8192 + 64)` slots of one page each, allocated as
//!   they are first used;
//! - the tuple cache: a ring of `block_cache_bytes / 8` bytes (32 bytes of header per tuple,
//!   64 at least) and its index, at most 32 bytes per cached tuple (`tuples/ring.rs`);
//! - buffers sized by the message: the streams' input (PAGE up to 8 × the message), the
//!   decoded sections, one record, six pages of scratch (two for [`pagexf`], one for the
//!   page compaction of `redo.rs`), [`pagexf`]'s item list (at most 2,042 entries of 4
//!   bytes, twice) and one tuple being replayed;
//! - recompression of compressed images (each end): pglz's history (about 90 KiB), a zstd
//!   compression context for 8 KiB inputs at level 3, a zstd decompression context (used by
//!   the encoder), a page of scratch; liblz4 keeps its 16 KiB state on the stack.

mod ahead;
mod areaxf;
mod blockmap;
mod cache;
mod decoder;
mod encoder;
pub mod format;
pub mod fpi;
mod handoff;
mod hitcode;
mod hitparse;
mod imgworker;
pub mod mainxf;
pub mod pagexf;
mod payload;
pub mod persist;
pub mod pglz;
mod prefetch;
pub mod prunexf;
mod redo;
pub mod rmgr;
mod streams;
pub mod tracker;
pub mod tuples;
pub mod wal;
mod zprefix;

/// Synthetic WAL for unit tests, property tests and fuzz targets (feature `testgen`).
#[cfg(any(test, feature = "testgen"))]
pub mod testgen;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_changed;
#[cfg(test)]
mod tests_fast;
#[cfg(test)]
mod tests_fpi;
#[cfg(test)]
mod tests_garbage;
#[cfg(test)]
mod tests_hold;
#[cfg(test)]
mod tests_inserts;
#[cfg(test)]
mod tests_long;
#[cfg(test)]
mod tests_offnum;
#[cfg(test)]
mod tests_prune;
#[cfg(test)]
mod tests_ring;
#[cfg(test)]
mod tests_stage;

pub use decoder::Decoder;
pub use encoder::{Encoder, STAGED_MAX};

use crate::pg::PgMajor;

/// Configuration shared by both ends: they must agree on `pg_major` and `block_cache_bytes`
/// (the link handshake sends the upstream's values to the downstream).
#[derive(Debug, Clone)]
pub struct CodecParams {
    /// PostgreSQL major version of the primary; unknown (`None`: not 14..=18, or no
    /// `server_version`) makes everything pass raw.
    pub pg_major: Option<PgMajor>,
    /// Block cache memory (each slot costs 8192 + 64 bytes). The decoder refuses a stream
    /// that uses more slots than this pays for. The tuple cache gets an eighth of it on each
    /// end; its evictions follow from its capacity, so both ends must use the same value.
    pub block_cache_bytes: usize,
    /// zstd effort (`link.zstd_level`); the encoder derives the levels of its streams and
    /// page frames from it (see `encoder::levels`).
    pub zstd_level: i32,
    /// Largest message (raw WAL bytes) either end accepts.
    pub max_message_bytes: usize,
}

/// Counters of what the codec did, for metrics. `*_in` are raw WAL bytes by kind; `*_out` are
/// link bytes: for the zstd streams the compressed size of the stream carrying that kind
/// (CTRL and HDR count as record headers, IMG and FPI as images); page headers count the bytes
/// put into the streams before compression (1 per predicted header).
#[derive(Debug, Default, Clone)]
pub struct CodecStats {
    pub messages: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub page_header_in: u64,
    pub page_header_out: u64,
    /// 24-byte record headers and block-header areas of encoded records.
    pub record_header_in: u64,
    pub record_header_out: u64,
    /// Page images of encoded records (as they are in the WAL, holes removed).
    pub fpi_in: u64,
    pub fpi_out: u64,
    /// Block data and main data of encoded records.
    pub data_in: u64,
    pub data_out: u64,
    /// Zero padding (between records, after XLOG_SWITCH) sent as a count.
    pub zeros_in: u64,
    /// Bytes passed through raw (not locked, records cut by messages, not understood).
    pub raw_in: u64,
    pub raw_out: u64,
    /// Records encoded field by field.
    pub records: u64,
    /// Images sent as page frames through the cache.
    pub fpis: u64,
    /// Of those, images whose block was in the cache.
    pub fpi_cache_hits: u64,
    /// Frame bytes of the cache hits (part of `fpi_out`).
    pub fpi_hit_out: u64,
    /// Images identical to the cached page (no frame at all).
    pub fpi_identical: u64,
    /// Images passed opaquely (wal_compression, odd geometry).
    pub fpi_opaque: u64,
    /// Records that were complete in a message but passed raw (bad CRC, unknown layout).
    pub records_raw: u64,
    /// Records cut by a message boundary (passed raw).
    pub records_split: u64,
    /// Records that would have been cut, held back for the next message instead
    /// ([`Encoder::encode_held`]).
    pub records_held: u64,
    /// Records the encoder had scanned ahead of its walk when it reached them (their caches'
    /// memory asked for in advance: `ahead.rs`), and records it did not scan because the
    /// caches held too little of what it had looked up (the scan paused); the rest start
    /// where the scan lost its way.
    pub records_ahead: u64,
    pub records_ahead_paused: u64,
    /// Lock losses: messages not continuing the previous one, and WAL disagreeing with the
    /// tracker.
    pub resyncs: u64,
    /// Images the primary compressed (wal_compression) sent as pages for the receiver to
    /// compress again (part of `fpis`).
    pub fpi_recompressed: u64,
    /// Compressed images whose page, compressed again, did not give the primary's bytes
    /// (another library version or build): passed opaquely (part of `fpi_opaque`) when
    /// checked in place, else sent as pages with the primary's bytes beside them (counted in
    /// `fpi_primary_bytes`).
    pub fpi_recompress_mismatch: u64,
    /// Of those, images sent as pages with the primary's bytes (their check ran off the
    /// critical path and was applied at the message's end: `encoder/verify.rs`).
    pub fpi_primary_bytes: u64,
    /// Compressed images passed opaquely because they did not decompress to the page (corrupt
    /// or unknown; part of `fpi_opaque`).
    pub fpi_undecodable: u64,
    /// Heap tuples sent as a delta against a version both ends hold, and the bytes that saved.
    pub tuple_deltas: u64,
    pub tuple_delta_saved: u64,
    /// Tuples that could have been sent as a delta but had no good reference.
    pub tuple_misses: u64,
    /// Updates PostgreSQL cut against their old tuple whose changed bytes went as their
    /// difference from the old ones (`HeapRec::changed_bytes`, format 14).
    pub changed_diffs: u64,
    /// Prunes on access sent as their difference from the prune both ends predict from the
    /// cached page (`prunexf`: format 15 for PostgreSQL 14-16, 16 for 17-18), and of them
    /// those the prediction matched whole (on 17-18 with the `reason` byte PostgreSQL leaves
    /// unset, which misses where it is not 0), and those whose block data (the offsets, on
    /// 17-18 with their counts) it matched.
    pub prunes_predicted: u64,
    pub prunes_exact: u64,
    pub prunes_data_exact: u64,
    /// Of the prunes not matched whole, those that missed by 17–18's unset `reason` byte
    /// alone: what that byte holds is whatever the primary's stack held, which varies
    /// between builds and machines (0 in 99.8 % of one machine's PostgreSQL 17 prunes, in
    /// none of another's).
    pub prunes_missed_by_reason: u64,
    /// Bytes in and out per resource manager, for encoded records.
    pub by_rmgr: rmgr::RmgrTotals,
    /// Per payload section (the streams in payload order, then the page frames): bytes put
    /// in before compression and bytes in the payload.
    pub section_in: [u64; STREAMS + 1],
    pub section_out: [u64; STREAMS + 1],
    /// Payload bytes that are not sections (version, section sizes).
    pub header_out: u64,
    /// Image ops by kind (`format::IMG_*` without `IMG_RECOMPRESS`), and the page-frame
    /// bytes of each kind.
    pub image_ops: [u64; 8],
    pub image_frame_out: [u64; 8],
}

#[derive(Debug, thiserror::Error)]
pub enum WalCodecError {
    #[error("unsupported codec parameters: {0}")]
    Params(String),
    #[error("message of {len} bytes exceeds the limit of {max} bytes (max_message_bytes)")]
    TooLong { len: usize, max: usize },
    #[error("message at {start} of {len} bytes runs past the end of the WAL address space")]
    Overflow { start: crate::lsn::Lsn, len: usize },
    #[error("zstd: {0}")]
    Zstd(String),
    #[error("corrupt walcodec payload: {0}")]
    Corrupt(String),
    #[error("the stream needs block cache slot {slot} but this side's cache has {capacity} slots (raise block_cache_bytes to match the sender)")]
    CacheTooSmall { slot: u64, capacity: usize },
    #[error("codec state lost after an earlier error; start a new session")]
    Poisoned,
}

impl WalCodecError {
    fn zstd(e: std::io::Error) -> WalCodecError {
        WalCodecError::Zstd(e.to_string())
    }
}

/// Number of zstd streams and their names (payload order).
pub(crate) const STREAMS: usize = 9;
pub(crate) const STREAM_NAMES: [&str; STREAMS] = [
    "CTRL", "HDR", "DATA", "RAW", "IMG", "PAGE", "MAIN", "LONG", "HIT",
];
pub(crate) const S_CTRL: usize = 0;
pub(crate) const S_HDR: usize = 1;
pub(crate) const S_DATA: usize = 2;
pub(crate) const S_RAW: usize = 3;
pub(crate) const S_IMG: usize = 4;
pub(crate) const S_PAGE: usize = 5;
pub(crate) const S_MAIN: usize = 6;
pub(crate) const S_LONG: usize = 7;
pub(crate) const S_HIT: usize = 8;
pub(crate) const FORMAT_VERSION: u8 = 16;
// A payload's first byte is the format version, or `0x80 |` it for a combined payload
// (`payload::COMBINED`; until format 15 `0x10 |`): from format 128 on that scheme cannot
// tell the two apart.
const _: () = assert!(
    FORMAT_VERSION < 0x80,
    "format 128 needs a new payload format byte scheme (payload::SEPARATE, COMBINED)"
);

fn check_params(p: &CodecParams) -> Result<(), WalCodecError> {
    if p.max_message_bytes == 0 || p.max_message_bytes > (1 << 30) {
        return Err(WalCodecError::Params(format!(
            "max_message_bytes must be between 1 and 1 GiB, not {}",
            p.max_message_bytes
        )));
    }
    let (lo, hi) = (zstd_safe::min_c_level(), zstd_safe::max_c_level());
    if !(lo..=hi).contains(&p.zstd_level) {
        return Err(WalCodecError::Params(format!(
            "zstd_level {} is outside {lo}..={hi}",
            p.zstd_level
        )));
    }
    Ok(())
}
