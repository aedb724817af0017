//! How the report treats a pair whose standby received a window late.

use super::*;

#[test]
fn framing_is_estimated_only_where_the_standby_received_the_window_in_time() {
    // Both directions' socket bytes less the payload the upstream counted.
    assert_eq!(framing_overhead(10_000, Some(8_500.0), 0.0), Some(1_500.0));
    assert_eq!(
        framing_overhead(10_000, Some(8_500.0), LATE_SECS),
        Some(1_500.0)
    );
    // Not scraped: unknown.
    assert_eq!(framing_overhead(10_000, None, 0.0), None);
    // Late: the queues between the two counts make the difference meaningless (it may
    // even come out negative), so there is no estimate rather than a wrong one.
    assert_eq!(
        framing_overhead(10_000, Some(10_500.0), LATE_SECS + 0.1),
        None
    );
    assert_eq!(framing_overhead(10_000, Some(8_500.0), 30.0), None);
    // The same rule marks the pair's figures approximate (†).
    assert!(!is_late(LATE_SECS) && is_late(LATE_SECS + 0.1));
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
