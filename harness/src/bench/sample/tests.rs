//! Cutting windows out of samples, the lags per stage and over the run, the CSV timeline.

use super::*;

fn s(t: f64, primary: u64, recv: [u64; 2], bytes: [u64; 2]) -> Sample {
    let c = |b: u64| PairCounters {
        toward_standby: b,
        toward_primary: b / 10,
        cpu_up: t,
        cpu_down: t / 2.0,
        kernel_up: t / 4.0,
        kernel_down: 0.0,
        wait_up: 2.0 * t,
        wait_down: f64::NAN,
        peak_rss_up: 1e6 * t,
        peak_rss_down: f64::NAN,
        rss_up: 1e6 * t,
        rss_down: f64::NAN,
        messages: f64::NAN,
        payload: f64::NAN,
        staged: [3.0 * t, t],
        fast: 5.0 * t,
        fast_spells: t,
        codec: [t, 2.0 * t, 10.0 * t, 4.0 * t],
    };
    Sample {
        t,
        primary_lsn: primary,
        received: recv,
        replayed: recv.map(|r| r.saturating_sub(5)),
        direct_received: primary,
        direct_replayed: primary - 1,
        direct_apply: None,
        pairs: [c(bytes[0]), c(bytes[1])],
        primary: PrimaryPositions {
            flushed: primary,
            sent: [Some(primary); 3],
        },
        w_relay: None,
        cpu_pressure: 0.5 * t,
    }
}

#[test]
fn each_pair_is_charged_for_the_same_wal_range() {
    // Pair 1 lags one sample behind pair 0.
    let samples = vec![
        s(0.0, 100, [100, 90], [0, 0]),
        s(1.0, 200, [200, 100], [10, 5]),
        s(2.0, 300, [300, 200], [20, 15]),
        s(3.0, 300, [300, 300], [20, 25]),
    ];
    let c = cut(&samples, 0.0, 2.0).unwrap();
    assert_eq!((c.lsn_start, c.lsn_end), (100, 300));
    assert_eq!(c.pairs[0].toward_standby, 20);
    assert_eq!((c.pairs[1].t0, c.pairs[1].t1), (1.0, 3.0));
    assert_eq!(c.pairs[1].toward_standby, 20);
    assert_eq!(c.pairs[1].toward_primary, 2);
    assert_eq!(c.pairs[1].max_receive_lag, 100);
    assert_eq!(c.pairs[1].max_replay_lag, 105);
    assert_eq!((c.direct_max_receive_lag, c.direct_max_replay_lag), (0, 1));
    assert!(c.pairs[0].messages.is_none());
    // Counters are charged over the same samples as the bytes.
    assert_eq!(
        (c.pairs[0].staged_up, c.pairs[0].staged_down),
        (Some(6.0), Some(2.0))
    );
    assert_eq!(c.pairs[1].staged_up, Some(6.0));
    assert_eq!(c.pairs[0].fast_up, Some(10.0));
    assert_eq!(c.pairs[0].fast_spells_up, Some(2.0));
    let codec = c.pairs[0].codec.unwrap();
    assert_eq!((codec.records_cut, codec.records_held), (2.0, 4.0));
    assert_eq!((codec.fpis, codec.fpi_cache_hits), (20.0, 8.0));
    // CPU and its kernel part between the same samples.
    assert_eq!((c.pairs[1].cpu_up_s, c.pairs[1].kernel_up_s), (2.0, 0.5));
    assert_eq!(
        (c.pairs[1].cpu_down_s, c.pairs[1].kernel_down_s),
        (1.0, 0.0)
    );
    // Waiting likewise; unknown stays unknown; the machine's pressure over the window.
    assert_eq!(
        (c.pairs[1].wait_up_s, c.pairs[1].wait_down_s),
        (Some(4.0), None)
    );
    // The peak resident set is the one at the window's end sample (t1 = 3 for pair 1).
    assert_eq!(
        (c.pairs[1].peak_rss_up, c.pairs[1].peak_rss_down),
        (Some(3e6), None)
    );
    assert_eq!(c.cpu_pressure, Some(0.5));
    assert!(cut(&samples, 0.0, 5.0).is_err());
}

/// W's payload in flight at the two samples it is charged between (what its upstream had
/// sent down and its standby not yet received) bounds the framing estimate's error: the
/// larger of the two; unknown without W's positions at both, and never for pair Z.
#[test]
fn the_wal_in_flight_is_the_larger_at_the_window_ends() {
    let with_sent = |mut x: Sample, sent_down: u64| {
        x.w_relay = Some(RelayPositions {
            sent_down,
            spooled: x.received[0],
            sent_to_standby: x.received[0],
        });
        x
    };
    let samples = vec![
        with_sent(s(0.0, 100, [100, 100], [0, 0]), 130),
        with_sent(s(1.0, 200, [200, 200], [10, 5]), 210),
        with_sent(s(2.0, 300, [300, 300], [20, 15]), 380),
        s(3.0, 400, [400, 400], [30, 25]),
    ];
    let c = cut(&samples, 0.0, 2.0).unwrap();
    assert_eq!(c.pairs[0].inflight_wal, Some(80));
    assert_eq!(c.pairs[1].inflight_wal, None);
    let c = cut(&samples, 1.0, 3.0).unwrap();
    assert_eq!(c.pairs[0].inflight_wal, None);
}

/// A window in which the primary wrote nothing has no WAL to measure: its ratios and CPU
/// per GB would divide by nothing (they came out 0.00 x zstd-3, a perfect score) and its
/// link bytes would be charged over no time at all. The bench fails instead.
#[test]
fn a_window_without_wal_is_an_error_not_zeros() {
    let samples = vec![
        s(0.0, 100, [100, 100], [0, 0]),
        s(1.0, 100, [100, 100], [5, 5]),
        s(2.0, 100, [100, 100], [9, 9]),
        s(3.0, 200, [200, 200], [20, 20]),
    ];
    let e = cut(&samples, 0.0, 2.0).unwrap_err().to_string();
    assert!(
        e.contains("no WAL") && e.contains("t = 0.0 s") && e.contains("t = 2.0 s"),
        "{e}"
    );
    // One byte is a window.
    let mut one = samples.clone();
    one[2].primary_lsn = 101;
    one[2].received = [101, 101];
    assert_eq!(cut(&one, 0.0, 2.0).unwrap().lsn_end, 101);
}

/// The direct standby is the reference for replay lag. One that stopped streaming keeps
/// reporting its last positions, so its lag grew with the primary and W's and Z's looked
/// small beside it; the bench fails instead. Outside the window it may come and go.
#[test]
fn a_window_whose_direct_standby_stopped_streaming_is_an_error() {
    let mut samples = vec![
        s(0.0, 100, [100, 100], [0, 0]),
        s(1.0, 200, [200, 200], [5, 5]),
        s(2.0, 300, [300, 300], [9, 9]),
        s(3.0, 400, [400, 400], [20, 20]),
    ];
    samples[3].primary.sent[2] = None;
    cut(&samples, 0.0, 2.0).unwrap();
    samples[1].primary.sent[2] = None;
    samples[1].direct_received = 150;
    let e = cut(&samples, 0.0, 2.0).unwrap_err().to_string();
    assert!(e.contains("direct") && e.contains("t = 1.0 s"), "{e}");
}

fn staged(t: f64, primary: u64, behind: u64) -> Sample {
    Sample {
        t,
        primary_lsn: primary,
        received: [primary - 5 * behind, primary - behind],
        replayed: [primary - 6 * behind, primary - 2 * behind],
        direct_received: primary - behind,
        direct_replayed: primary - 2 * behind,
        direct_apply: None,
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
        cpu_pressure: f64::NAN,
    }
}

#[test]
fn each_stage_lags_by_its_largest_distance_and_unknown_positions_are_left_out() {
    let samples = [staged(0.0, 1000, 100), staged(1.0, 2000, 10)];
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
    let samples: Vec<Sample> = (0..6).map(|i| staged(i as f64, 1000, 10 * i)).collect();
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
    let mut second = staged(1.0, 2000, 10);
    second.pairs[0].cpu_up = 2.5;
    second.pairs[0].kernel_up = 0.75;
    second.pairs[1].kernel_down = 0.125;
    second.pairs[0].rss_up = 123.4e6;
    second.pairs[1].rss_down = f64::NAN;
    second.pairs[0].codec = [1.0, 2.0, 300.0, 40.0];
    let mut first = staged(0.0, 1000, 100);
    first.pairs[0].codec = [f64::NAN; 4];
    let csv = timeline_csv(&[first, second]);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 3);
    let cols = lines[0].split(',').count();
    assert!(lines.iter().all(|l| l.split(',').count() == cols));
    // No relay positions at t = 0: empty cells; Z's walsender unknown: empty.
    assert!(lines[1].starts_with("0.000,1000,900,900,,,,500,400,,"));
    assert!(lines[2].starts_with("1.000,2000,1990,1990,1980,1970,1960,1950,1940,,1990,1980,2000,"));
    // CPU seconds of W up / down, Z up / down, then their kernel parts.
    let cols2: Vec<&str> = lines[2].split(',').collect();
    assert_eq!(
        cols2[15..23],
        ["2.500", "0.000", "0.000", "0.000", "0.750", "0.000", "0.000", "0.125"]
    );
    // Seconds waited for a core, the machine's pressure (unknown here: empty), each half's
    // resident set in MB, W's images and cache hits (not scraped at t = 0: empty), and the
    // direct standby's apply CPU (not found: empty).
    assert!(lines[1]
        .ends_with(",0.000,0.000,0.000,0.000,0.000,0.000,0.000,0.000,,0.000,0.000,0.000,0.000,,,"));
    assert!(lines[2].ends_with(",,123.400,0.000,0.000,,300,40,"));
}

/// The direct standby's apply CPU is charged from the sample at which it had replayed the
/// window's start to the one at which it had replayed its end, not by the window's times;
/// not at all when the startup process was missing at either or was another one.
#[test]
fn the_direct_apply_is_charged_by_what_the_standby_replayed() {
    let mut samples = vec![
        s(0.0, 100, [100, 100], [0, 0]),
        s(1.0, 200, [200, 200], [0, 0]),
        s(2.0, 300, [300, 300], [0, 0]),
        s(3.0, 300, [300, 300], [0, 0]),
    ];
    // The standby replays one sample late: 100 at t = 1, 200 at t = 2, 300 at t = 3.
    for (i, x) in samples.iter_mut().enumerate() {
        x.direct_replayed = [99, 100, 200, 300][i];
        x.direct_apply = Some((7, [1.0, 1.5, 2.5, 4.5][i]));
    }
    let c = cut(&samples, 0.0, 2.0).unwrap();
    assert_eq!((c.lsn_start, c.lsn_end), (100, 300));
    assert_eq!(c.direct_apply_cpu_s, Some(3.0));
    // Not found when the standby had replayed the window's end.
    samples[3].direct_apply = None;
    assert_eq!(cut(&samples, 0.0, 2.0).unwrap().direct_apply_cpu_s, None);
    // A startup process that began again (another pid): its seconds count from 0.
    samples[3].direct_apply = Some((8, 0.2));
    assert_eq!(cut(&samples, 0.0, 2.0).unwrap().direct_apply_cpu_s, None);
    // The timeline carries the seconds, empty where unknown.
    samples[3].direct_apply = None;
    let csv = timeline_csv(&samples);
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].ends_with(",direct_apply_cpu_s"), "{csv}");
    assert!(lines[1].ends_with(",1.000"), "{csv}");
    assert!(lines[4].ends_with(','), "{csv}");
}

/// The samples go on after the relayed standbys received the steady window's end until the
/// direct standby has replayed it, so that its apply CPU has a figure.
#[test]
fn the_direct_standby_has_replayed_a_window_once_its_replay_passes_the_end() {
    let mut samples = vec![
        s(0.0, 100, [100, 100], [0, 0]),
        s(1.0, 200, [200, 200], [10, 5]),
    ];
    samples[1].direct_replayed = 150;
    assert!(!direct_replayed(&samples, 1.0));
    assert!(direct_replayed(&samples, 0.0));
    samples.push(s(2.0, 300, [300, 300], [20, 15]));
    samples[2].direct_replayed = 200;
    assert!(direct_replayed(&samples, 1.0));
    // A window past the last sample has no end yet.
    assert!(!direct_replayed(&samples, 5.0));
}
