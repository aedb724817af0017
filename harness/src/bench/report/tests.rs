//! How the report treats a pair whose standby received a window late.

use super::*;

#[test]
fn framing_is_estimated_only_where_the_standby_received_the_window_in_time() {
    // Both directions' socket bytes less the payload the upstream counted.
    let none_in_flight = Some(0.0);
    assert_eq!(
        framing_overhead(10_000, Some(8_500.0), 0.0, none_in_flight),
        Some(1_500.0)
    );
    assert_eq!(
        framing_overhead(10_000, Some(8_500.0), LATE_SECS, none_in_flight),
        Some(1_500.0)
    );
    // Not scraped: unknown.
    assert_eq!(framing_overhead(10_000, None, 0.0, none_in_flight), None);
    assert_eq!(framing_overhead(10_000, Some(8_500.0), 0.0, None), None);
    // Late: the queues between the two counts make the difference meaningless (it may
    // even come out negative), so there is no estimate rather than a wrong one.
    assert_eq!(
        framing_overhead(10_000, Some(10_500.0), LATE_SECS + 0.1, none_in_flight),
        None
    );
    assert_eq!(
        framing_overhead(10_000, Some(8_500.0), 30.0, none_in_flight),
        None
    );
    // The same rule marks the pair's figures approximate (†).
    assert!(!is_late(LATE_SECS) && is_late(LATE_SECS + 0.1));
}

/// In time but with payload in flight at the window's ends that could be a large part of the
/// difference (a bulk load): no estimate; a negative difference never is one.
#[test]
fn framing_is_not_estimated_where_the_payload_in_flight_could_make_it() {
    let est = 1_500.0;
    let at_most = est * FRAMING_TOLERANCE;
    assert_eq!(
        framing_overhead(10_000, Some(8_500.0), 0.0, Some(at_most)),
        Some(est)
    );
    assert_eq!(
        framing_overhead(10_000, Some(8_500.0), 0.0, Some(at_most + 1.0)),
        None
    );
    // The cold window of a bulk run that printed −76.6 bytes a message.
    assert_eq!(
        framing_overhead(10_000, Some(10_500.0), 0.0, Some(0.0)),
        None
    );
}

/// The window converts the WAL in flight to payload at the window's own payload per WAL
/// byte, and the table says why the figure is missing.
#[test]
fn a_window_with_payload_in_flight_has_no_framing_figure_and_says_why() {
    let pair = |inflight_wal| PairCut {
        t0: 0.0,
        t1: 10.0,
        toward_standby: 2_000_000,
        toward_primary: 20_000,
        messages: Some(1_000.0),
        // 0.2 payload bytes a WAL byte; framing + feedback 20,000 bytes, 20 a message.
        payload: Some(2_000_000.0),
        inflight_wal: Some(inflight_wal),
        ..PairCut::default()
    };
    let base = Baselines {
        zstd3: 1,
        zstd19: 1,
        ssh_c: 1,
    };
    let window = |inflight_wal| {
        let cut = Cut {
            t_start: 0.0,
            t_end: 10.0,
            lsn_start: 0,
            lsn_end: 10_000_000,
            pairs: [pair(inflight_wal), PairCut::default()],
            direct_max_replay_lag: 0,
            direct_max_receive_lag: 0,
            direct_apply_cpu_s: None,
            stages: Default::default(),
            cpu_pressure: None,
        };
        Window::new("cold", &cut, base, ["wal", "zstd"])
    };
    let quiet = window(10_000);
    assert_eq!(quiet.w.framing_in_flight_bytes, Some(2_000.0));
    assert_eq!(quiet.w.framing_feedback_bytes_per_message, Some(20.0));
    let bulk = window(1_000_000);
    assert_eq!(bulk.w.framing_in_flight_bytes, Some(200_000.0));
    assert_eq!(bulk.w.framing_feedback_bytes_per_message, None);
    assert_eq!(bulk.w.framing_feedback_share, None);
    let run = |w: Window| Report {
        runs: vec![RunResult::bare(
            crate::bench::workloads::Workload::Bulk,
            (w.clone(), w),
        )],
        ..Report::default()
    };
    let md = run(bulk).markdown();
    assert!(md.contains("(up to 0.20 MB)"), "{md}");
    assert!(!run(quiet).markdown().contains("in flight between"));
}

#[test]
fn each_half_reports_the_kernel_share_of_its_cpu_time() {
    let w = PairCut {
        t0: 0.0,
        t1: 10.0,
        cpu_up_s: 4.0,
        kernel_up_s: 1.0,
        cpu_down_s: 2.0,
        kernel_down_s: 1.5,
        ..PairCut::default()
    };
    // A half that used no CPU at all has no kernel share rather than a division by zero.
    let z = PairCut {
        t0: 0.0,
        t1: 10.0,
        ..PairCut::default()
    };
    let cut = Cut {
        t_start: 0.0,
        t_end: 10.0,
        lsn_start: 0,
        lsn_end: 1_000_000_000,
        pairs: [w, z],
        direct_max_replay_lag: 0,
        direct_max_receive_lag: 0,
        direct_apply_cpu_s: Some(0.5),
        stages: Default::default(),
        cpu_pressure: None,
    };
    let base = Baselines {
        zstd3: 1,
        zstd19: 1,
        ssh_c: 1,
    };
    let win = Window::new("cold", &cut, base, ["wal", "zstd"]);
    assert_eq!(win.w.upstream_kernel_share, 0.25);
    assert_eq!(win.w.downstream_kernel_share, 0.75);
    assert_eq!(win.w.upstream_cpu_s_per_gb, 4.0);
    assert_eq!(win.direct_apply_cpu_s_per_gb, Some(0.5));
    assert_eq!(
        (win.z.upstream_kernel_share, win.z.downstream_kernel_share),
        (0.0, 0.0)
    );
}

/// The tables name the command that made them, first, as a shell would take it back: a
/// published run's figures come with their command.
#[test]
fn the_tables_begin_with_the_command_that_made_them() {
    let args = [
        "walrelay",
        "bench",
        "--workload",
        "pgbench,bulk",
        "--json",
        "a b/it's.json",
    ];
    let line = super::super::command_line(args.iter().map(|a| a.to_string()));
    assert_eq!(
        line,
        r#"walrelay bench --workload pgbench,bulk --json 'a b/it'\''s.json'"#
    );
    assert_eq!(super::super::command_line([String::new()]), "''");
    let mut report = Report {
        command: Some(line.clone()),
        ..Report::default()
    };
    let md = report.markdown();
    assert!(md.starts_with(&format!("\nCommand: `{line}`\n")), "{md}");
    report.command = None;
    assert!(!report.markdown().contains("Command:"));
}

/// The targets' ratios are W over Z (CPU per GB, both halves) and W over direct (replay lag),
/// with no ratio where there is nothing to divide by.
#[test]
fn the_targets_ratios_divide_w_by_its_references() {
    let mut w = Window::default();
    w.w.upstream_cpu_s_per_gb = 2.0;
    w.w.downstream_cpu_s_per_gb = 1.0;
    w.z.upstream_cpu_s_per_gb = 1.5;
    w.z.downstream_cpu_s_per_gb = 0.5;
    w.w.max_replay_lag_bytes = 30 << 20;
    w.direct_max_replay_lag_bytes = 20 << 20;
    assert_eq!(super::markdown::target_ratios(&w), (Some(1.5), Some(1.5)));
    w.direct_max_replay_lag_bytes = 1 << 19;
    w.z = PairWindow::default();
    assert_eq!(super::markdown::target_ratios(&w), (None, None));
}
