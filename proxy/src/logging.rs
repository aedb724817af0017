//! tracing setup: text or JSON lines on standard error, filter from `log.level` (RUST_LOG
//! overrides it). Colours only when standard error is a terminal, so journald and log files get
//! plain text.
//!
//! JSON format (`log.format = "json"`), one object per line:
//!
//! ```text
//! {"timestamp":"2026-11-22T05:40:01.123456Z","level":"INFO","message":"standby authenticated",
//!  "peer":"10.0.2.7:51234","user":"replicator","target":"walrelay::walsender::startup",
//!  "span":{"peer":"10.0.2.7:51234","name":"standby"},"spans":[{"peer":"...","name":"standby"}]}
//! ```
//!
//! `timestamp` (RFC 3339, UTC), `level`, `target` and `message` are always there; the event's
//! own fields sit next to `message`; `span` is the innermost span the event happened in and
//! `spans` all of them, outermost first, each with its fields and `name` (both absent outside
//! any span).
//!
//! The filter can be replaced while running ([`LogHandle::set_level`], used on SIGHUP); the
//! format cannot.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

/// Changes the log filter of the running process.
#[derive(Clone)]
pub struct LogHandle {
    filter: reload::Handle<EnvFilter, Registry>,
    /// RUST_LOG was set at start: it keeps overriding `log.level`.
    env_override: bool,
}

/// Why the log level could not be changed.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("log.level {level:?} is not a valid filter: {reason}")]
    BadFilter { level: String, reason: String },
    #[error("the logging subscriber is gone: {0}")]
    Gone(String),
}

impl LogHandle {
    /// Installs `level` as the filter; false (and nothing changed) when RUST_LOG overrides it.
    pub fn set_level(&self, level: &str) -> Result<bool, LogError> {
        if self.env_override {
            return Ok(false);
        }
        let f = EnvFilter::try_new(level).map_err(|e| LogError::BadFilter {
            level: level.into(),
            reason: e.to_string(),
        })?;
        self.filter
            .reload(f)
            .map_err(|e| LogError::Gone(e.to_string()))?;
        Ok(true)
    }

    /// RUST_LOG is set and wins over `log.level`.
    pub fn env_override(&self) -> bool {
        self.env_override
    }
}

/// Installs the global subscriber (once per process; later calls only return a handle that
/// changes nothing visible). `format` is "text" or "json" (checked by the config).
pub fn init(level: &str, format: &str) -> LogHandle {
    let from_env = EnvFilter::try_from_default_env().ok();
    let env_override = from_env.is_some();
    let filter = from_env.unwrap_or_else(|| EnvFilter::new(level));
    let (filter, handle) = reload::Layer::new(filter);
    let json = (format == "json").then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(true)
            .with_writer(std::io::stderr)
    });
    let text = (format != "json").then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(|| OneLine(std::io::stderr()))
            .with_ansi(std::io::stderr().is_terminal())
    });
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(json)
        .with(text)
        .try_init();
    LogHandle {
        filter: handle,
        env_override,
    }
}

/// Standard error for the text log: each event on one line. A line break or another control
/// character inside an event (a client's `application_name`, user name or command, a
/// primary's error) is written escaped (`\n`, `\u{2028}`), so that no peer can start a log line
/// of its own making. The fmt layer writes each event whole, ending with its line's end, in
/// one `write_all`. The escape character stays: the formatter's colours use it, and it escapes
/// it in field values itself.
struct OneLine(std::io::Stderr);

impl std::io::Write for OneLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let (body, end) = match buf.strip_suffix(b"\n") {
            Some(body) => (body, &b"\n"[..]),
            None => (buf, &b""[..]),
        };
        match one_line(body) {
            Some(mut escaped) => {
                escaped.extend_from_slice(end);
                self.0.write_all(&escaped)?;
            }
            None => self.0.write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// `text` with its line breaks and control characters (but tab and escape) escaped; None when
/// it has none (or is not UTF-8, which the fmt layer never writes).
fn one_line(text: &[u8]) -> Option<Vec<u8>> {
    let breaks = |c: char| {
        (c.is_control() && c != '\t' && c != '\x1b') || matches!(c, '\u{2028}' | '\u{2029}')
    };
    let text = std::str::from_utf8(text).ok()?;
    if !text.chars().any(breaks) {
        return None;
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match breaks(c) {
            true => out.extend(c.escape_default()),
            false => out.push(c),
        }
    }
    Some(out.into_bytes())
}

/// The same reason for something that is retried (a lost link stream, a standby's lost
/// connection to the primary) is logged once a minute while it repeats: a cause that will
/// not clear by itself, such as WAL the primary removed, would otherwise fill the log once a
/// second.
#[derive(Default)]
pub(crate) struct Repeats {
    last: Option<(String, Instant)>,
    since: u64,
}

impl Repeats {
    const EVERY: Duration = Duration::from_secs(60);

    /// Some(times it came since last logged) when `why` is to be logged now.
    pub(crate) fn report(&mut self, why: &str) -> Option<u64> {
        self.report_at(why, Instant::now())
    }

    pub(crate) fn report_at(&mut self, why: &str, now: Instant) -> Option<u64> {
        match &mut self.last {
            Some((w, at)) if w == why => {
                if now.duration_since(*at) < Self::EVERY {
                    self.since += 1;
                    return None;
                }
                *at = now;
                Some(std::mem::take(&mut self.since))
            }
            _ => {
                self.last = Some((why.to_string(), now));
                self.since = 0;
                Some(0)
            }
        }
    }

    /// " (N more times since it was last logged)" for a count [`Repeats::report`] gave.
    pub(crate) fn since_text(n: u64) -> String {
        match n {
            0 => String::new(),
            n => format!(" ({n} more times since it was last logged)"),
        }
    }
}

/// At most [`LogBudget::PER_MINUTE`] lines a minute of a kind whose lines differ (each names a
/// peer), so that many peers, or one that reconnects in a loop, cannot flood the log; the
/// first line after a minute that dropped some says how many.
pub(crate) struct LogBudget {
    minute: Option<Instant>,
    logged: u32,
    dropped: u64,
}

impl LogBudget {
    pub(crate) const PER_MINUTE: u32 = 20;

    pub(crate) const fn new() -> LogBudget {
        LogBudget {
            minute: None,
            logged: 0,
            dropped: 0,
        }
    }

    /// Some(lines dropped since the last one logged) when this one may be logged.
    pub(crate) fn allow(&mut self, now: Instant) -> Option<u64> {
        match self.minute {
            Some(t) if now.duration_since(t) < Duration::from_secs(60) => {}
            _ => {
                self.minute = Some(now);
                self.logged = 0;
            }
        }
        if self.logged >= Self::PER_MINUTE {
            self.dropped += 1;
            return None;
        }
        self.logged += 1;
        Some(std::mem::take(&mut self.dropped))
    }
}

/// A [`LogBudget`] for each of `N` kinds of line (a reason for refusing a connection), fit
/// for a `static`.
pub(crate) struct LogBudgets<const N: usize>([std::sync::Mutex<LogBudget>; N]);

impl<const N: usize> LogBudgets<N> {
    pub(crate) const fn new() -> LogBudgets<N> {
        LogBudgets([const { std::sync::Mutex::new(LogBudget::new()) }; N])
    }

    /// Some(what to append to the line) when a line of kind `kind` may be logged now; the
    /// text names `counter`, the metric that counts them all, when lines were dropped before.
    pub(crate) fn within(&self, kind: usize, counter: &str) -> Option<String> {
        let allowed = self.0[kind]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .allow(Instant::now())?;
        Some(match allowed {
            0 => String::new(),
            n => format!(" ({n} more like it in the last minute were not logged: see {counter})"),
        })
    }
}

#[cfg(test)]
#[test]
fn a_log_budget_drops_lines_past_its_minute_and_counts_them() {
    let mut b = LogBudget::new();
    let t = Instant::now();
    for _ in 0..LogBudget::PER_MINUTE {
        assert_eq!(b.allow(t), Some(0));
    }
    assert_eq!(b.allow(t + Duration::from_secs(1)), None);
    assert_eq!(b.allow(t + Duration::from_secs(2)), None);
    assert_eq!(b.allow(t + Duration::from_secs(61)), Some(2));
    assert_eq!(b.allow(t + Duration::from_secs(62)), Some(0));
}

#[cfg(test)]
#[test]
fn a_repeated_reason_is_logged_once_a_minute_with_its_count() {
    let mut r = Repeats::default();
    let t = Instant::now();
    let s = |n| t + Duration::from_secs(n);
    assert_eq!(r.report_at("gone", s(0)), Some(0));
    assert_eq!(r.report_at("gone", s(1)), None);
    assert_eq!(r.report_at("gone", s(2)), None);
    assert_eq!(r.report_at("gone", s(61)), Some(2));
    assert_eq!(
        r.report_at("other", s(62)),
        Some(0),
        "another reason at once"
    );
    assert_eq!(r.report_at("gone", s(63)), Some(0));
}

#[cfg(test)]
#[test]
fn a_text_log_event_stays_on_one_line() {
    assert_eq!(one_line(b"standby session open application_name=app"), None);
    assert_eq!(
        one_line("application_name=app\nFORGED INFO x\r\x0b\u{2028}".as_bytes()).as_deref(),
        Some(&br"application_name=app\nFORGED INFO x\r\u{b}\u{2028}"[..])
    );
    // The formatter's own colours and tabs pass.
    assert_eq!(one_line(b"\x1b[32m INFO\x1b[0m a\tb"), None);
}
