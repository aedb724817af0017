//! Opening a link stream's feed: the replication connection to the primary on the stream's
//! slot, where the stream starts (the spool's end, the slot's oldest WAL, a timeline switch the
//! spool must take first), START_REPLICATION, and the `Welcome` that tells the downstream.

use tracing::info;

use walrelay_proto::link::{Hello, Param, Welcome};
use walrelay_proto::PROTOCOL_VERSION;
use walrelay_wal::lsn::{Lsn, TimeLineId};
use walrelay_wal::pg::PgMajor;

use super::handshake::{self, Agreed, PrimaryState};
use super::{primary, Upstream};
use crate::pgclient::{self, PrimaryConn};
use tonic::Status;

/// The feed's connection to the primary, streaming, with the `Welcome` the downstream is
/// sent and where the stream starts: the spool's end the Hello stated, or, when the spool
/// went past the point where its timeline forked off the primary's, that point.
pub(super) struct Feed {
    pub(super) conn: PrimaryConn,
    pub(super) welcome: Welcome,
    pub(super) from: Lsn,
    /// How often the feed tells the primary where the spool is, for its
    /// `wal_sender_timeout` ([`super::feed::status_every`]).
    pub(super) status_every: std::time::Duration,
}

/// Connects the feed to the primary on the downstream's slot, decides where the stream
/// starts, starts streaming, and builds the `Welcome`.
pub(super) async fn open_feed(
    up: &Upstream,
    hello: &Hello,
    agreed: &Agreed,
) -> Result<Feed, Status> {
    let mut conn = connect_with_slot(up, hello, agreed).await?;
    let id = conn
        .identify_system()
        .await
        .map_err(|e| unavailable("IDENTIFY_SYSTEM on the primary", e))?;
    let (system_id, flush) = (id.system_id, id.xlogpos);
    let seg = primary::segment_size(&mut conn)
        .await
        .map_err(|e| unavailable("SHOW wal_segment_size on the primary", e))?;
    let timeout = conn.show("wal_sender_timeout").await.ok();
    let status_every = super::feed::status_every(timeout.as_deref());
    let state = PrimaryState {
        system_id,
        tli: id.timeline,
        flush,
        slot_restart: primary::slot_restart(&mut conn, &agreed.slot).await,
    };
    let start = handshake::start(hello, &state, seg)?;
    let history = match (hello.system_id, start.tli.0) {
        (0, t) if t > 1 => conn
            .timeline_history(start.tli)
            .await
            .map_err(|e| unavailable("TIMELINE_HISTORY on the primary", e))?
            .content
            .to_vec(),
        _ => Vec::new(),
    };
    let (switches, at, tli) = catch_up_timelines(&mut conn, &state, start).await?;
    start_streaming(&mut conn, &agreed.slot, at, tli).await?;
    let pg_major = PgMajor::from_server_version(
        conn.params
            .iter()
            .find(|(k, _)| k == "server_version")
            .map(|(_, v)| v.as_str())
            .unwrap_or(""),
    );
    let welcome = Welcome {
        protocol_version: PROTOCOL_VERSION,
        params: conn
            .params
            .iter()
            .map(|(name, value)| Param {
                name: name.clone(),
                value: value.clone(),
            })
            .collect(),
        codec: agreed.codec.name().into(),
        pg_major: PgMajor::to_wire(pg_major),
        block_cache_bytes: agreed.block_cache_bytes as u64,
        system_id,
        wal_segment_size: seg.bytes(),
        timeline: start.tli.0,
        start: start.lsn.0,
        history: history.into(),
        switches: switches
            .into_iter()
            .map(|(tli, history)| walrelay_proto::link::TimelineSwitch {
                timeline: tli.0,
                history: history.into(),
            })
            .collect(),
        primary_end: flush.0,
    };
    Ok(Feed {
        conn,
        welcome,
        from: at,
        status_every,
    })
}

/// `unavailable` status for a step on the primary that failed.
fn unavailable(what: &str, e: pgclient::PgClientError) -> Status {
    Status::unavailable(format!("{what}: {e}"))
}

/// A replication connection to the primary (application name `walrelay_<downstream.name>`,
/// which `synchronous_standby_names` may list) and the stream's physical slot on it.
async fn connect_with_slot(
    up: &Upstream,
    hello: &Hello,
    agreed: &Agreed,
) -> Result<PrimaryConn, Status> {
    let app = match hello.downstream_name.as_str() {
        "" => "walrelay".to_string(),
        n => format!("walrelay_{n}"),
    };
    let mut conn = pgclient::connect(&up.cfg.primary, &app, up.limits.max_message_bytes)
        .await
        .map_err(|e| unavailable("cannot connect to the primary", e))?;
    if conn.ensure_physical_slot(&agreed.slot).await.map_err(|e| {
        unavailable(
            &format!("cannot create slot {:?} on the primary", agreed.slot),
            e,
        )
    })? {
        info!(slot = %agreed.slot, "created the stream's physical replication slot on the primary");
    }
    Ok(conn)
}

/// START_REPLICATION on `slot` at `at` on timeline `tli`; errors say what to do.
async fn start_streaming(
    conn: &mut PrimaryConn,
    slot: &str,
    at: Lsn,
    tli: TimeLineId,
) -> Result<(), Status> {
    match primary::start_replication(conn, Some(slot), at, tli).await {
        Ok(primary::Started::Streaming) => Ok(()),
        Ok(primary::Started::TimelineEnded { next, .. }) => Err(Status::unavailable(format!(
            "the primary ended timeline {tli} at the stream's start, naming timeline {next}: try again"
        ))),
        Err(pgclient::PgClientError::Server(e)) if e.message.contains("is active") => {
            Err(Status::unavailable(format!(
                "slot {slot:?} is in use by another connection: give each downstream its own downstream.name ({})",
                e.message
            )))
        }
        Err(pgclient::PgClientError::Server(e)) => Err(primary::wal_gone(slot, &e)
            .unwrap_or_else(|| Status::unavailable(format!("START_REPLICATION on the primary: {e}")))),
        Err(e) => Err(unavailable("START_REPLICATION on the primary", e)),
    }
}

/// The spool may be on an older timeline than the primary (it was promoted from a standby):
/// every timeline the spool already holds to its end is switched at once (the spool then
/// continues at that timeline's switchpoint); the last one it does not hold to its end is
/// streamed from the primary as an older timeline, which the feed follows when it ends.
/// Returns the switches, and where and on which timeline to start streaming.
async fn catch_up_timelines(
    conn: &mut PrimaryConn,
    primary: &PrimaryState,
    start: handshake::Start,
) -> Result<(Vec<(TimeLineId, Vec<u8>)>, Lsn, TimeLineId), Status> {
    let (mut tli, mut at, mut switches) = (start.tli, start.lsn, Vec::new());
    if tli == primary.tli {
        return Ok((switches, at, tli));
    }
    if tli > primary.tli {
        return Err(Status::failed_precondition(format!(
            "the downstream's spool is on timeline {tli}, newer than the primary's {}: is upstream.primary the right server?",
            primary.tli
        )));
    }
    let err = |e| unavailable("TIMELINE_HISTORY on the primary", e);
    let file = conn.timeline_history(primary.tli).await.map_err(err)?;
    let entries = file.entries().map_err(err)?;
    while tli != primary.tli {
        let Some(end) = walrelay_wal::timeline::switchpoint(&entries, tli) else {
            return Err(Status::failed_precondition(format!(
                "the downstream's spool is on timeline {tli}, which is not in the primary's history: empty downstream.spool_dir"
            )));
        };
        if at < end {
            break;
        }
        let next = walrelay_wal::timeline::next_timeline(&entries, primary.tli, tli)
            .unwrap_or(primary.tli);
        let history = conn
            .timeline_history(next)
            .await
            .map_err(err)?
            .content
            .to_vec();
        info!(from = %tli, to = %next, at = %end, "the spool's timeline ended on the primary; switching it");
        switches.push((next, history));
        (tli, at) = (next, end);
    }
    Ok((switches, at, tli))
}
