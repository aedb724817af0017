//! The strict Prometheus parser of `walrelay_harness::prom`, panicking on what it rejects.

use walrelay_harness::prom::Sample;

/// Parses the text format 0.0.4 strictly (see `walrelay_harness::prom::parse_exposition`);
/// panics on anything it rejects.
pub fn parse_exposition(text: &str) -> Vec<Sample> {
    walrelay_harness::prom::parse_exposition(text).unwrap_or_else(|e| panic!("{e}"))
}
