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
