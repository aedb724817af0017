//! tracing setup: text or JSON, filter from `log.level` (RUST_LOG overrides). Colours only when
//! standard error is a terminal, so journald and log files get plain text.

use std::io::IsTerminal;

pub fn init(level: &str, format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = if format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
