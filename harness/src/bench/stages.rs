//! Where along each path the WAL waits: positions taken with every sample, the largest lag
//! behind the primary at each stage over a window, and the samples as a CSV timeline.
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

use std::fmt::Write as _;

use serde::Serialize;

use super::sample::Sample;
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
        Some(RelayPositions {
            sent_down: max_of(up, sent, ("half", "upstream"))?,
            spooled: max_of(down, "walrelay_spool_end_lsn_bytes", ("", ""))?,
            sent_to_standby: max_of(down, sent, ("half", "downstream"))?,
        })
    }
}

/// Largest value of the series named `name` (with label `k` = `v`, unless `k` is empty).
fn max_of(samples: &[prom::Sample], name: &str, (k, v): (&str, &str)) -> Option<u64> {
    samples
        .iter()
        .filter(|s| s.name == name && (k.is_empty() || s.labels.get(k).is_some_and(|x| x == v)))
        .map(|s| s.value as u64)
        .max()
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
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PathLags {
    pub primary_sent: Option<u64>,
    pub received: u64,
    pub replayed: u64,
    pub mean_replayed: u64,
}

/// Largest lag behind the primary's write position at each stage over a window, bytes.
#[derive(Debug, Clone, Serialize, PartialEq)]
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

/// Largest `primary position − pos(sample)` over the samples that have `pos`.
pub(super) fn max_lag(samples: &[Sample], pos: impl Fn(&Sample) -> Option<u64>) -> Option<u64> {
    samples
        .iter()
        .filter_map(|s| pos(s).map(|p| s.primary_lsn.saturating_sub(p)))
        .max()
}

/// Mean of `primary position − pos(sample)` over `samples` (0 without samples).
fn mean_lag(samples: &[Sample], pos: &dyn Fn(&Sample) -> u64) -> u64 {
    let sum: u128 = samples
        .iter()
        .map(|s| u128::from(s.primary_lsn.saturating_sub(pos(s))))
        .sum();
    u64::try_from(sum / samples.len().max(1) as u128).unwrap_or(u64::MAX)
}

/// The lags of every stage over `samples` (one window's).
pub fn lags(samples: &[Sample]) -> StageLags {
    let path =
        |sent: usize, recv: &dyn Fn(&Sample) -> u64, replay: &dyn Fn(&Sample) -> u64| PathLags {
            primary_sent: max_lag(samples, |s| s.primary.sent[sent]),
            received: max_lag(samples, |s| Some(recv(s))).unwrap_or(0),
            replayed: max_lag(samples, |s| Some(replay(s))).unwrap_or(0),
            mean_replayed: mean_lag(samples, replay),
        };
    let relay = |f: fn(&RelayPositions) -> u64| max_lag(samples, |s| s.w_relay.as_ref().map(f));
    StageLags {
        flushed: max_lag(samples, |s| Some(s.primary.flushed)).unwrap_or(0),
        direct: path(2, &|s| s.direct_received, &|s| s.direct_replayed),
        z: path(1, &|s| s.received[1], &|s| s.replayed[1]),
        w: path(0, &|s| s.received[0], &|s| s.replayed[0]),
        w_sent_down: relay(|r| r.sent_down),
        w_spooled: relay(|r| r.spooled),
        w_sent_to_standby: relay(|r| r.sent_to_standby),
    }
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

/// The mean replay lags over `parts` equal parts of [0, `t_end`]: a lag that grows over the
/// run shows as parts that rise (a part without samples is left out).
pub fn lag_over_run(samples: &[Sample], t_end: f64, parts: usize) -> Vec<LagPart> {
    let step = t_end / parts.max(1) as f64;
    (0..parts)
        .filter_map(|i| {
            let (a, b) = (step * i as f64, step * (i + 1) as f64);
            let lo = samples.partition_point(|s| s.t < a);
            let hi = samples.partition_point(|s| s.t < b);
            let part = samples.get(lo..hi).filter(|p| !p.is_empty())?;
            Some(LagPart {
                t_start: a,
                t_end: b,
                w: mean_lag(part, &|s| s.replayed[0]),
                z: mean_lag(part, &|s| s.replayed[1]),
                direct: mean_lag(part, &|s| s.direct_replayed),
            })
        })
        .collect()
}

/// Header of [`timeline_csv`].
const CSV_HEAD: &str = "t,primary_written,primary_flushed,w_primary_sent,w_sent_down,w_spooled,w_sent_to_standby,w_received,w_replayed,z_primary_sent,z_received,z_replayed,direct_primary_sent,direct_received,direct_replayed,w_cpu_up_s,w_cpu_down_s,z_cpu_up_s,z_cpu_down_s\n";

/// Every sample as one CSV line: time (s), positions (bytes; empty when unknown), CPU seconds.
pub fn timeline_csv(samples: &[Sample]) -> String {
    let mut s = String::from(CSV_HEAD);
    let o = |v: Option<u64>| v.map(|x| x.to_string()).unwrap_or_default();
    for x in samples {
        let r = x.w_relay;
        let _ = writeln!(
            s,
            "{:.3},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.3},{:.3},{:.3},{:.3}",
            x.t,
            x.primary_lsn,
            x.primary.flushed,
            o(x.primary.sent[0]),
            o(r.map(|r| r.sent_down)),
            o(r.map(|r| r.spooled)),
            o(r.map(|r| r.sent_to_standby)),
            x.received[0],
            x.replayed[0],
            o(x.primary.sent[1]),
            x.received[1],
            x.replayed[1],
            o(x.primary.sent[2]),
            x.direct_received,
            x.direct_replayed,
            x.pairs[0].cpu_up,
            x.pairs[0].cpu_down,
            x.pairs[1].cpu_up,
            x.pairs[1].cpu_down,
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::pair::PairCounters;

    fn sample(t: f64, primary: u64, behind: u64) -> Sample {
        Sample {
            t,
            primary_lsn: primary,
            received: [primary - 5 * behind, primary - behind],
            replayed: [primary - 6 * behind, primary - 2 * behind],
            direct_received: primary - behind,
            direct_replayed: primary - 2 * behind,
            pairs: [PairCounters::default(); 2],
            primary: PrimaryPositions {
                flushed: primary - behind,
                sent: [Some(primary - behind), None, Some(primary)],
            },
            w_relay: (t > 0.0).then_some(RelayPositions {
                sent_down: primary - 2 * behind,
                spooled: primary - 3 * behind,
                sent_to_standby: primary - 4 * behind,
            }),
        }
    }

    #[test]
    fn each_stage_lags_by_its_largest_distance_and_unknown_positions_are_left_out() {
        let samples = [sample(0.0, 1000, 100), sample(1.0, 2000, 10)];
        let l = lags(&samples);
        assert_eq!(l.flushed, 100);
        assert_eq!(l.w.primary_sent, Some(100));
        // W's relay positions exist only at t = 1 (behind = 10).
        assert_eq!(
            (l.w_sent_down, l.w_spooled, l.w_sent_to_standby),
            (Some(20), Some(30), Some(40))
        );
        assert_eq!((l.w.received, l.w.replayed), (500, 600));
        // Replay lags of W: 600 and 60.
        assert_eq!(l.w.mean_replayed, 330);
        assert_eq!(lags(&[]).w.mean_replayed, 0);
        assert_eq!(l.z.primary_sent, None);
        assert_eq!((l.z.received, l.z.replayed), (100, 200));
        assert_eq!(l.direct.primary_sent, Some(0));
    }

    #[test]
    fn the_run_is_cut_in_equal_parts_and_each_gets_its_mean_lag() {
        let samples: Vec<Sample> = (0..6).map(|i| sample(i as f64, 1000, 10 * i)).collect();
        let parts = lag_over_run(&samples, 6.0, 3);
        assert_eq!(parts.len(), 3);
        // Part 2 holds t = 2, 3: W's replay lag is 6 x behind: 120 and 180.
        assert_eq!((parts[1].t_start, parts[1].t_end), (2.0, 4.0));
        assert_eq!((parts[1].w, parts[1].z, parts[1].direct), (150, 50, 50));
        // A part the samples do not reach is left out.
        assert_eq!(lag_over_run(&samples, 12.0, 3).len(), 2);
    }

    #[test]
    fn the_timeline_has_a_line_per_sample_with_every_column() {
        let csv = timeline_csv(&[sample(0.0, 1000, 100), sample(1.0, 2000, 10)]);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        let cols = lines[0].split(',').count();
        assert!(lines.iter().all(|l| l.split(',').count() == cols));
        // No relay positions at t = 0: empty cells; Z's walsender unknown: empty.
        assert!(lines[1].starts_with("0.000,1000,900,900,,,,500,400,,"));
        assert!(
            lines[2].starts_with("1.000,2000,1990,1990,1980,1970,1960,1950,1940,,1990,1980,2000,")
        );
    }

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
