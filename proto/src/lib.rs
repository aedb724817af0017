//! The walrelay link protocol between the halves.
//!
//! Map:
//!
//! - [`link`]: the gRPC service and handshake messages, generated from `link.proto` (see that
//!   file for the message flow);
//! - [`frame`]: what a link message carries after the handshake, both directions, sans-IO:
//!   WAL runs, the primary's messages, the standbys' feedback and commands, one checksum.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod frame;

#[allow(clippy::all)]
pub mod link {
    tonic::include_proto!("walrelay.link.v4");
}

/// Version of the link protocol spoken by this build; both halves must agree. 5: the frames
/// and gRPC messages of 4 (package `walrelay.link.v4`), WAL payloads in walcodec format 3,
/// which a version-4 half cannot decode. 6: the same with walcodec format 4 (image op flag
/// `IMG_PRIMARY`), which a version-5 half cannot decode. 7: walcodec format 5 (frames against
/// the block's previous image without its known tuples), and the receiver compresses the
/// primary's zstd images with libzstd 1.5.6 instead of 1.5.7, whose bytes differ on a few: a
/// version-6 sender's checks would not predict them. 8: walcodec format 6 (the tuple cache
/// leaves out the inserts of insert-only relations). 9: each half sends something (the downstream
/// a new ALIVE item) when it has been silent for `frame::ALIVE_EVERY`, and ends a stream
/// silent for `frame::SILENT_LIMIT`, which a version-8 peer would reach on any idle stream. 10:
/// walcodec format 7 (images the primary compressed may come whole through the PAGE stream),
/// which a version-9 half refuses. 11: walcodec format 8 (pages sent through the PAGE stream
/// untransformed, `IMG_PLAIN`), which a version-10 half refuses. 12: walcodec format 9
/// (streamed pages of long items through DATA), which a version-11 half refuses. 13: walcodec
/// format 10 (the tuple cache is a ring of records: which tuples it holds changed), which a
/// version-12 half refuses. 14: walcodec format 11 (a stream of its own, LONG, for long data
/// and the long window; DATA short and read in place), which a version-13 half refuses. 15:
/// walcodec format 12 (cache hits as matches in a stream of their own, HIT, instead of a zstd
/// frame each), which a version-14 half refuses. 16: walcodec format 13 (a heap insert's or
/// update's new offset as predicted from the cached page), which a version-15 half refuses.
/// 17: walcodec format 14 (the changed bytes of an update PostgreSQL cut against its old
/// tuple as their difference from the old tuple's), which a version-16 half refuses.
/// 18: walcodec format 15 (a prune of PostgreSQL 14-16 as its difference from the prune
/// both ends predict from the cached page), which a version-17 half refuses. 19: walcodec
/// format 16 (prunes of PostgreSQL 17-18 predicted too; a combined payload's mode byte
/// `0x80 |` the format version), which a version-18 half refuses.
/// The version changes with anything that changes the walcodec format or what either half's
/// recompression of images gives.
pub const PROTOCOL_VERSION: u32 = 19;
