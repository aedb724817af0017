use super::*;
use crate::monitor::Half;
use walrelay_wal::lsn::Lsn;

#[test]
fn exposition_lines_are_well_formed_and_escaped() {
    let m = Metrics::default();
    Metrics::add(&m.wal_bytes_in, 1000);
    Metrics::add(&m.wal_payload_bytes_out, 250);
    let h = m
        .ops
        .standbys
        .register(Half::Downstream, "we\"ird\\name\n", "p");
    h.wal(Lsn(0x1_0000_0000));
    h.reply(Lsn(1), Lsn(1), Lsn(0x1_0000_0000));
    let text = render(&m, &ProcessStats::default());
    assert!(
        text.contains("walrelay_compression_ratio{half=\"upstream\"} 4\n"),
        "{text}"
    );
    assert!(text.contains(
        "walrelay_standby_replay_lsn_bytes{half=\"downstream\",application_name=\"we\\\"ird\\\\name\\n\",slot=\"\"} 4294967296\n"
    ), "{text}");
    assert!(!text.contains("walrelay_compression_ratio{half=\"downstream\"}"));
    for line in text.lines() {
        assert!(
            line.starts_with("# HELP ") || line.starts_with("# TYPE ") || line.contains(' '),
            "{line}"
        );
    }
    assert_eq!(fmt_value(f64::NAN), "NaN");
    assert_eq!(fmt_value(0.5), "0.5");
}
