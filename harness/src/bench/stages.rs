//! Where along each path the WAL waits: the positions taken with every sample (the primary's
//! query, W's metrics) and the lags reported for each stage, which [`super::sample`] computes
//! over a window's samples (also the CSV timeline).
//!
//! The stages of pair W, in the order its WAL passes them:
//!
//! | stage | position | from |
//! |---|---|---|
//! | flushed | the primary's WAL flush position | `pg_current_wal_flush_lsn()` |
//! | primary sent | the primary's walsender sent it to the upstream's feed | `pg_stat_replication.sent_lsn` of `walrelay_<name>` |
//! | sent down | the upstream encoded it and handed its frame to the link | `walrelay_standby_sent_lsn_bytes{half="upstream"}` |
//! | spooled | the downstream restored, verified and wrote it to the spool | `walrelay_spool_end_lsn_bytes` |
//! | sent to standby | the downstream's walsender sent it to the standby | `walrelay_standby_sent_lsn_bytes{half="downstream"}` |
//! | received | the standby's walreceiver wrote and flushed it | `pg_last_wal_receive_lsn()` |
//! | replayed | the standby replayed it | `pg_last_wal_replay_lsn()` |
//!
//! Pair Z and the direct standby have the primary's stages and the standby's. Every lag is
//! measured from the primary's write position (`pg_current_wal_lsn()`), as the replay lag is,
//! so a stage's lag minus the previous stage's is the WAL that stage held at that moment.

use serde::Serialize;

use crate::prom;

/// Positions of pair W's relay stages, from its two processes' metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RelayPositions {
    pub sent_down: u64,
    pub spooled: u64,
    pub sent_to_standby: u64,
}

impl RelayPositions {
    /// From one scrape of each half (None when a half has no such series yet).
    pub fn from_scrapes(up: &[prom::Sample], down: &[prom::Sample]) -> Option<RelayPositions> {
        let sent = "walrelay_standby_sent_lsn_bytes";
        let pos = |samples, name, labels| prom::max(samples, name, labels).map(|v| v as u64);
        Some(RelayPositions {
            sent_down: pos(up, sent, &[("half", "upstream")])?,
            spooled: pos(down, "walrelay_spool_end_lsn_bytes", &[])?,
            sent_to_standby: pos(down, sent, &[("half", "downstream")])?,
        })
    }
}

/// The primary's side of one sample.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PrimaryPositions {
    pub flushed: u64,
    /// `sent_lsn` of the primary's walsender toward pair W's feed, pair Z's and the direct standby
    /// (None while that walsender is not streaming).
    pub sent: [Option<u64>; 3],
}

/// One query for the primary's positions; `apps`: application_name of W's and Z's feed and
/// of the direct standby (`max`: a connection reopening may show twice for a moment).
pub fn primary_sql(apps: [&str; 3]) -> String {
    let sent = |a: &str| {
        format!(
            "(select max(sent_lsn)::text from pg_stat_replication where application_name = '{a}')"
        )
    };
    format!(
        "select pg_current_wal_lsn()::text, pg_current_wal_flush_lsn()::text, {}, {}, {}",
        sent(apps[0]),
        sent(apps[1]),
        sent(apps[2])
    )
}

/// A path's largest lags: the primary's walsender, the standby's receipt and replay; and its
/// mean replay lag over the window's samples (the largest is one moment, often a burst).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct PathLags {
    pub primary_sent: Option<u64>,
    pub received: u64,
    pub replayed: u64,
    pub mean_replayed: u64,
}

/// Largest lag behind the primary's write position at each stage over a window, bytes.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct StageLags {
    pub flushed: u64,
    pub direct: PathLags,
    pub z: PathLags,
    pub w: PathLags,
    /// Pair W's relay stages (None when its metrics were never read).
    pub w_sent_down: Option<u64>,
    pub w_spooled: Option<u64>,
    pub w_sent_to_standby: Option<u64>,
}

/// Mean replay lag of each standby over one part of the run, bytes.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LagPart {
    /// Seconds since t = 0.
    pub t_start: f64,
    pub t_end: f64,
    pub w: u64,
    pub z: u64,
    pub direct: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relay_positions_come_from_the_named_series_of_each_half() {
        let up = prom::parse_exposition(
            "# TYPE walrelay_standby_sent_lsn_bytes gauge\nwalrelay_standby_sent_lsn_bytes{half=\"upstream\",application_name=\"a\"} 300\n",
        )
        .unwrap();
        let down = prom::parse_exposition(
            "# TYPE walrelay_spool_end_lsn_bytes gauge\nwalrelay_spool_end_lsn_bytes 200\n# TYPE walrelay_standby_sent_lsn_bytes gauge\nwalrelay_standby_sent_lsn_bytes{half=\"downstream\",application_name=\"a\"} 100\n",
        )
        .unwrap();
        let r = RelayPositions::from_scrapes(&up, &down).unwrap();
        assert_eq!((r.sent_down, r.spooled, r.sent_to_standby), (300, 200, 100));
        // Before the standby streams, the downstream has no standby row.
        let none = prom::parse_exposition("").unwrap();
        assert_eq!(RelayPositions::from_scrapes(&up, &none), None);
    }

    #[test]
    fn the_primary_query_names_each_standby() {
        let q = primary_sql(["w", "z", "d"]);
        assert!(q.contains("application_name = 'w'") && q.contains("application_name = 'd'"));
        assert!(
            q.starts_with("select pg_current_wal_lsn()::text, pg_current_wal_flush_lsn()::text")
        );
    }
}
