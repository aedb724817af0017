//! The upstream's side of the link handshake, as pure functions: what a `Hello` asks for, what
//! this upstream agrees to, and where the stream starts.

use tonic::Status;

use walrelay_proto::link::Hello;
use walrelay_proto::PROTOCOL_VERSION;
use walrelay_wal::linkcodec::CodecKind;
use walrelay_wal::lsn::{Lsn, TimeLineId};
use walrelay_wal::segment::WalSegSize;

use crate::config::{LinkConfig, DEFAULT_SLOT, MAX_MESSAGE_BYTES_MIN};

/// What both ends of a stream use, as the upstream decided it from the downstream's `Hello`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agreed {
    pub codec: CodecKind,
    pub window_log: u32,
    pub block_cache_bytes: usize,
    /// The slot on the primary that belongs to this downstream's spool.
    pub slot: String,
    /// Most bytes of WAL (and other messages) the feed puts into one link message.
    pub batch_max: usize,
    /// Most bytes of WAL the encode stage holds back from a batch's end for the next
    /// ([`hold_max`]); a link message carries at most `batch_max + hold_max` bytes of WAL.
    pub hold_max: usize,
}

/// A walsender's largest XLogData message (`MAX_SEND_SIZE`, 16 WAL pages), its header and
/// what the feed counts for it in a batch.
const XLOGDATA_MAX: usize = 128 * 1024 + 64;

/// Most bytes in one batch of the feed, when the downstream takes that much: two of the
/// primary's largest XLogData messages (256 kB of WAL; before, 256 kB with the headers, one).
/// Each link message ends the codec's blocks, and a record its end cuts passes raw (neither
/// images nor tuples re-encoded) unless it is held back ([`hold_max`]): on recorded WAL of the
/// bench's pgbench window (`harness/examples/codec_profile.rs`, `WALRELAY_MESSAGE_KB`)
/// messages of 256 kB against 128 kB carried 7.4 % fewer bytes and encoded 7 % faster, 1 MiB
/// 13 % and 13 %. But batches of 1 MiB made both relays' replay lag under the bench's bulk
/// load three to four times the direct standby's in three runs of three, where 128 kB and
/// 256 kB batches kept it at 1.2–1.6 × (`docs/bench/2026-11-26-pg15-batch-size.txt`). So
/// batches stay small, and the record their end cuts waits for the next one instead.
pub const BATCH_MAX: usize = 2 * XLOGDATA_MAX;

/// The feed's batches for a downstream that takes messages of up to `downstream_max` bytes
/// (its `limits.max_message_bytes`, in its `Hello`): at most [`BATCH_MAX`], at least the
/// smallest limit any downstream has (a `Hello` without one says 0).
pub fn batch_max(downstream_max: u64) -> usize {
    usize::try_from(downstream_max)
        .unwrap_or(usize::MAX)
        .clamp(MAX_MESSAGE_BYTES_MIN, BATCH_MAX)
}

/// Most bytes of a batch's end the encode stage holds back for the next batch, when both
/// halves take messages that large: the head of a record the batch's end cut, which then
/// goes whole in the next message instead of raw in two (`WalEncoder::encode_held`). 64 kB
/// holds any record of up to eight page images.
pub const HOLD_MAX: usize = 64 * 1024;

/// What the encode stage may hold back ([`HOLD_MAX`]) when a link message may carry
/// `batch_max` bytes of a batch and up to this much before them: what is left of the
/// smaller of the downstream's limit (`downstream_max`, 0 when its `Hello` said none) and
/// this upstream's own (`own_max`); 0, nothing held, when that leaves none.
pub fn hold_max(batch_max: usize, downstream_max: u64, own_max: usize) -> usize {
    let limit = usize::try_from(downstream_max)
        .unwrap_or(usize::MAX)
        .min(own_max);
    limit.saturating_sub(batch_max).min(HOLD_MAX)
}

/// Refuses a link protocol version other than this build's (a stream's `Hello`, a tunnel's
/// `TunnelOpen`).
pub fn check_version(requested: u32) -> Result<(), Status> {
    if requested != PROTOCOL_VERSION {
        return Err(Status::failed_precondition(format!(
            "link protocol {requested} requested, this upstream speaks {PROTOCOL_VERSION}: run the same walrelay version on both halves"
        )));
    }
    Ok(())
}

/// Checks a `Hello` against this upstream's link settings; `own_max`: this upstream's
/// `limits.max_message_bytes`.
pub fn agree(
    hello: &Hello,
    link: &LinkConfig,
    own_max: usize,
    slot: Option<&str>,
) -> Result<Agreed, Status> {
    check_version(hello.protocol_version)?;
    let codec = CodecKind::from_name(&hello.codec)
        .ok_or_else(|| Status::invalid_argument(format!("unknown codec {:?}", hello.codec)))?;
    let name_ok = hello.downstream_name.len() <= 40
        && hello
            .downstream_name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !name_ok {
        return Err(Status::invalid_argument(
            "downstream.name may use only a-z, 0-9 and _, at most 40 characters",
        ));
    }
    let base = slot.unwrap_or(DEFAULT_SLOT);
    let slot = match hello.downstream_name.as_str() {
        "" => base.to_string(),
        n => format!("{base}_{n}"),
    };
    if slot.len() > 63 {
        return Err(Status::invalid_argument(format!(
            "the stream's slot name {slot:?} (upstream.slot, '_', downstream.name) is longer \
             than PostgreSQL's 63 bytes: shorten upstream.slot or downstream.name"
        )));
    }
    let block_cache_bytes =
        usize::try_from(link.block_cache_bytes.min(hello.block_cache_bytes_max))
            .map_err(|_| Status::invalid_argument("block_cache_bytes_max does not fit"))?;
    Ok(Agreed {
        codec,
        window_log: link.zstd_window_log.min(hello.zstd_window_log_max.max(10)),
        block_cache_bytes,
        slot,
        batch_max: batch_max(hello.max_message_bytes),
        hold_max: hold_max(
            batch_max(hello.max_message_bytes),
            hello.max_message_bytes,
            own_max,
        ),
    })
}

/// Where the stream starts and on which timeline, from the spool's end (`Hello`) and what the
/// primary says of itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Start {
    pub tli: TimeLineId,
    pub lsn: Lsn,
}

/// The primary as IDENTIFY_SYSTEM (and READ_REPLICATION_SLOT) describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrimaryState {
    pub system_id: u64,
    pub tli: TimeLineId,
    pub flush: Lsn,
    /// Where the stream's slot holds WAL from, and on which timeline when the primary says,
    /// when the primary can say (PG 15+).
    pub slot_restart: Option<(Lsn, Option<TimeLineId>)>,
}

/// A non-empty spool continues where it ends, on its own timeline (the primary serves an
/// older timeline up to its switchpoint, then the stream follows to the next). An empty one
/// starts at the segment holding the oldest WAL the slot keeps, on the timeline the slot
/// names (an older one when the slot was made on a promoted server before its first
/// checkpoint: the primary has that segment only under that timeline), or at the primary's
/// flush.
pub fn start(hello: &Hello, primary: &PrimaryState, seg: WalSegSize) -> Result<Start, Status> {
    if hello.system_id != 0 {
        if hello.system_id != primary.system_id {
            return Err(Status::failed_precondition(format!(
                "the downstream's spool holds WAL of system {}, the primary is system {}: point downstream.spool_dir at an empty directory",
                hello.system_id, primary.system_id
            )));
        }
        if Lsn(hello.spool_end) > primary.flush && TimeLineId(hello.timeline) == primary.tli {
            return Err(Status::failed_precondition(format!(
                "the downstream's spool ends at {}, ahead of the server the upstream reached ({}): \
                 if that server is a standby that is behind (upstream.primary lists several hosts \
                 and target_session_attrs is any), set target_session_attrs=primary and the spool \
                 is kept; only if it is the primary (restored from an older backup, say) does the \
                 spool hold WAL it never wrote: then empty downstream.spool_dir",
                Lsn(hello.spool_end),
                primary.flush
            )));
        }
        return Ok(Start {
            tli: TimeLineId(hello.timeline),
            lsn: Lsn(hello.spool_end),
        });
    }
    let (from, tli) = match primary.slot_restart {
        Some((lsn, tli)) if lsn <= primary.flush => {
            (lsn, tli.filter(|t| *t < primary.tli).unwrap_or(primary.tli))
        }
        _ => (primary.flush, primary.tli),
    };
    let lsn = seg
        .segment_start(seg.segment_of(from))
        .ok_or_else(|| Status::internal("start position out of range"))?;
    Ok(Start { tli, lsn })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            protocol_version: PROTOCOL_VERSION,
            codec: "wal".into(),
            zstd_window_log_max: 23,
            block_cache_bytes_max: 1 << 20,
            max_message_bytes: 4 << 20,
            ..Default::default()
        }
    }

    const P: PrimaryState = PrimaryState {
        system_id: 7,
        tli: TimeLineId(2),
        flush: Lsn(0x5123456),
        slot_restart: Some((Lsn(0x3800000), Some(TimeLineId(2)))),
    };

    #[test]
    fn agreement() {
        let link = LinkConfig::default();
        let a = agree(&hello(), &link, 4 << 20, None).unwrap();
        assert_eq!(a.slot, "walrelay");
        assert_eq!(a.codec, CodecKind::Wal);
        assert_eq!(a.block_cache_bytes, 1 << 20);
        assert_eq!(a.batch_max, BATCH_MAX);
        assert_eq!(a.hold_max, HOLD_MAX);
        let silent = Hello {
            max_message_bytes: 0,
            ..hello()
        };
        let a = agree(&silent, &link, 4 << 20, None).unwrap();
        assert_eq!((a.batch_max, a.hold_max), (MAX_MESSAGE_BYTES_MIN, 0));
        let named = Hello {
            downstream_name: "dc2_b".into(),
            ..hello()
        };
        assert_eq!(
            agree(&named, &link, 4 << 20, Some("relay")).unwrap().slot,
            "relay_dc2_b"
        );
        // 57 + '_' + 5 bytes fit PostgreSQL's 63; one more does not.
        let long = "s".repeat(57);
        assert!(agree(&named, &link, 4 << 20, Some(&long)).is_ok());
        let e = agree(&named, &link, 4 << 20, Some(&format!("{long}s"))).unwrap_err();
        assert!(e.message().contains("shorten upstream.slot"), "{e:?}");
        for bad in [
            Hello {
                protocol_version: 3,
                ..hello()
            },
            Hello {
                codec: "lz77".into(),
                ..hello()
            },
            Hello {
                downstream_name: "Bad Name".into(),
                ..hello()
            },
        ] {
            assert!(agree(&bad, &link, 4 << 20, None).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn batches_stay_within_what_the_downstream_takes() {
        assert_eq!(batch_max(4 << 20), BATCH_MAX);
        assert_eq!(batch_max(u64::MAX), BATCH_MAX);
        assert_eq!(batch_max(262_200), 262_200);
        // No limit said (0), or one below any downstream's: the smallest allowed.
        assert_eq!(batch_max(0), MAX_MESSAGE_BYTES_MIN);
        assert_eq!(batch_max(1000), MAX_MESSAGE_BYTES_MIN);
    }

    #[test]
    fn held_bytes_fit_both_halves_limits() {
        let b = BATCH_MAX;
        assert_eq!(hold_max(b, 4 << 20, 4 << 20), HOLD_MAX);
        assert_eq!(hold_max(b, u64::MAX, usize::MAX), HOLD_MAX);
        // Whichever half takes less bounds the message.
        assert_eq!(hold_max(b, (b + 1000) as u64, 4 << 20), 1000);
        assert_eq!(hold_max(b, 4 << 20, b + 999), 999);
        // No room over the batch, no limit said, or a limit under the batch: nothing held.
        assert_eq!(hold_max(b, b as u64, 4 << 20), 0);
        assert_eq!(hold_max(b, 0, 4 << 20), 0);
        let small = batch_max(MAX_MESSAGE_BYTES_MIN as u64);
        assert_eq!(hold_max(small, MAX_MESSAGE_BYTES_MIN as u64, 4 << 20), 0);
        assert_eq!(hold_max(b, 4 << 20, MAX_MESSAGE_BYTES_MIN), 0);
        for (d, o) in [
            (300_000u64, 4usize << 20),
            (4 << 20, 300_000),
            (1 << 30, 1 << 30),
        ] {
            let h = hold_max(batch_max(d), d, o);
            assert!(batch_max(d) + h <= (d as usize).min(o), "{d} {o}");
        }
    }

    #[test]
    fn where_the_stream_starts() {
        let seg = WalSegSize::DEFAULT;
        // Empty spool: the slot's segment.
        assert_eq!(
            start(&hello(), &P, seg).unwrap(),
            Start {
                tli: TimeLineId(2),
                lsn: Lsn(0x3000000)
            }
        );
        let no_slot = PrimaryState {
            slot_restart: None,
            ..P
        };
        assert_eq!(start(&hello(), &no_slot, seg).unwrap().lsn, Lsn(0x5000000));
        // A slot made on a promoted server before its first checkpoint holds WAL of the
        // timeline before: the stream starts there (and follows to the primary's).
        let older = PrimaryState {
            slot_restart: Some((Lsn(0x3800000), Some(TimeLineId(1)))),
            ..P
        };
        assert_eq!(
            start(&hello(), &older, seg).unwrap(),
            Start {
                tli: TimeLineId(1),
                lsn: Lsn(0x3000000)
            }
        );
        // A timeline the slot cannot have (newer than the primary's) is not taken; a slot
        // that says none starts on the primary's.
        for t in [Some(TimeLineId(3)), None] {
            let s = PrimaryState {
                slot_restart: Some((Lsn(0x3800000), t)),
                ..P
            };
            assert_eq!(start(&hello(), &s, seg).unwrap().tli, TimeLineId(2));
        }
        // A spool continues where it ends, on its timeline.
        let spool = Hello {
            system_id: 7,
            timeline: 1,
            spool_end: 0x4000123,
            ..hello()
        };
        assert_eq!(
            start(&spool, &P, seg).unwrap(),
            Start {
                tli: TimeLineId(1),
                lsn: Lsn(0x4000123)
            }
        );
        // Another cluster, or ahead of the primary on its own timeline: refused.
        assert!(start(
            &Hello {
                system_id: 8,
                ..spool.clone()
            },
            &P,
            seg
        )
        .is_err());
        assert!(start(
            &Hello {
                timeline: 2,
                spool_end: 0x6000000,
                ..spool
            },
            &P,
            seg
        )
        .is_err());
    }
}
