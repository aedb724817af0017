//! The downstream's side of the link handshake, as pure functions: the `Hello` it sends for
//! its spool, and what a `Welcome` means for it (the codec both ends use, the spool ops to run
//! before the stream's WAL, the timeline that WAL is on).

use walrelay_proto::link::{Hello, Welcome};
use walrelay_proto::PROTOCOL_VERSION;
use walrelay_wal::linkcodec::{CodecKind, Setup};
use walrelay_wal::lsn::TimeLineId;
use walrelay_wal::pg::PgMajor;
use walrelay_wal::segment::WalSegSize;
use walrelay_wal::walcodec;

use super::writer::{Op, SpoolView};
use crate::config::{Limits, LinkConfig};

/// The `Hello` for a spool as `view` shows it (an empty spool asks the upstream where to
/// start), the downstream's `name`, the codec it wants, and the largest message it takes.
pub fn hello(
    view: &SpoolView,
    name: &str,
    codec: CodecKind,
    link: &LinkConfig,
    limits: &Limits,
) -> Hello {
    let empty = view.extent.end.0 == 0;
    Hello {
        protocol_version: PROTOCOL_VERSION,
        downstream_name: name.to_string(),
        codec: codec.name().into(),
        zstd_window_log_max: link.zstd_window_log,
        block_cache_bytes_max: link.block_cache_bytes,
        system_id: if empty { 0 } else { view.system_id },
        timeline: view.extent.tli.0,
        spool_end: view.extent.end.0,
        max_message_bytes: limits.max_message_bytes as u64,
    }
}

/// What a `Welcome` sets up.
#[derive(Debug)]
pub struct Agreed {
    pub setup: Setup,
    /// For the spool's writer, in order, before the stream's WAL.
    pub ops: Vec<Op>,
    /// The timeline the stream's WAL is on.
    pub tli: TimeLineId,
}

/// Checks a `Welcome` against this downstream's settings; `empty`: the spool holds no WAL.
pub fn agree(
    w: &Welcome,
    link: &LinkConfig,
    limits: &Limits,
    empty: bool,
) -> Result<Agreed, String> {
    if w.protocol_version != PROTOCOL_VERSION {
        return Err(format!(
            "the upstream speaks link protocol {}, this downstream {PROTOCOL_VERSION}: run the same walrelay version on both halves",
            w.protocol_version
        ));
    }
    let codec = CodecKind::from_name(&w.codec)
        .ok_or_else(|| format!("the upstream chose unknown codec {:?}", w.codec))?;
    if w.block_cache_bytes > link.block_cache_bytes {
        return Err("the upstream wants a larger block cache than link.block_cache_bytes".into());
    }
    let seg = WalSegSize::new(w.wal_segment_size)
        .ok_or_else(|| format!("invalid wal_segment_size {}", w.wal_segment_size))?;
    let setup = Setup {
        kind: codec,
        zstd_level: link.zstd_level,
        window_log: link.zstd_window_log,
        wal: walcodec::CodecParams {
            pg_major: PgMajor::from_wire(w.pg_major),
            block_cache_bytes: usize::try_from(w.block_cache_bytes)
                .map_err(|_| "block_cache_bytes does not fit".to_string())?,
            zstd_level: link.zstd_level,
            max_message_bytes: limits.max_message_bytes,
        },
    };
    let mut ops = vec![Op::Bind {
        system_id: w.system_id,
        seg,
    }];
    if empty && !w.history.is_empty() {
        ops.push(Op::History {
            tli: TimeLineId(w.timeline),
            history: w.history.to_vec(),
        });
    }
    // Timelines the spool holds to their end on the primary: switched before any WAL.
    let mut tli = TimeLineId(w.timeline);
    for s in &w.switches {
        if s.timeline <= tli.0 {
            return Err(format!("timeline switch to {} after {tli}", s.timeline));
        }
        tli = TimeLineId(s.timeline);
        ops.push(Op::Switch {
            tli,
            history: s.history.to_vec(),
        });
    }
    Ok(Agreed { setup, ops, tli })
}

#[cfg(test)]
mod tests {
    use super::*;
    use walrelay_proto::link::TimelineSwitch;
    use walrelay_wal::lsn::Lsn;

    fn welcome() -> Welcome {
        Welcome {
            protocol_version: PROTOCOL_VERSION,
            codec: "wal".into(),
            pg_major: 15,
            block_cache_bytes: 1 << 20,
            system_id: 7,
            wal_segment_size: 16 << 20,
            timeline: 1,
            start: 0x3000000,
            ..Default::default()
        }
    }

    #[test]
    fn hello_says_what_the_spool_holds() {
        let mut view = SpoolView::empty(7, TimeLineId(2));
        let link = LinkConfig::default();
        let limits = Limits {
            max_message_bytes: 300_000,
            ..Limits::default()
        };
        // Empty (even when bound): the upstream decides where to start.
        assert_eq!(
            hello(&view, "a", CodecKind::Wal, &link, &limits).system_id,
            0
        );
        view.extent.end = Lsn(0x5000000);
        let h = hello(&view, "a", CodecKind::Zstd, &link, &limits);
        assert_eq!(
            (h.system_id, h.timeline, h.spool_end, h.codec.as_str()),
            (7, 2, 0x5000000, "zstd")
        );
        // The upstream keeps its batches within what this downstream accepts.
        assert_eq!(h.max_message_bytes, 300_000);
    }

    #[test]
    fn a_welcome_sets_up_the_codec_and_the_spool() {
        let (link, limits) = (LinkConfig::default(), Limits::default());
        let a = agree(&welcome(), &link, &limits, true).unwrap();
        assert_eq!(a.setup.kind, CodecKind::Wal);
        assert_eq!(a.setup.wal.pg_major, PgMajor::from_wire(15));
        assert!(matches!(a.ops.as_slice(), [Op::Bind { system_id: 7, .. }]));
        assert_eq!(a.tli, TimeLineId(1));
        let switches = Welcome {
            switches: vec![
                TimelineSwitch {
                    timeline: 2,
                    history: b"1\t0/4000000\tx\n"[..].into(),
                },
                TimelineSwitch {
                    timeline: 3,
                    history: b"1\t0/4000000\tx\n2\t0/5000000\ty\n"[..].into(),
                },
            ],
            ..welcome()
        };
        let a = agree(&switches, &link, &limits, false).unwrap();
        assert_eq!(a.tli, TimeLineId(3));
        assert_eq!(a.ops.len(), 3);
        for bad in [
            Welcome {
                protocol_version: PROTOCOL_VERSION - 1,
                ..welcome()
            },
            Welcome {
                codec: "lz77".into(),
                ..welcome()
            },
            Welcome {
                block_cache_bytes: u64::MAX,
                ..welcome()
            },
            Welcome {
                wal_segment_size: 1000,
                ..welcome()
            },
            Welcome {
                switches: vec![TimelineSwitch {
                    timeline: 1,
                    history: Default::default(),
                }],
                ..welcome()
            },
        ] {
            assert!(agree(&bad, &link, &limits, false).is_err(), "{bad:?}");
        }
    }
}
