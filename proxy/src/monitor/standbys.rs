//! Per-standby replication state, kept by each half for each live session.
//!
//! Every standby session registers one entry per half it crosses (a process running both halves
//! has two entries per standby, told apart by the `half` label); the entry is removed when the
//! session ends ([`StandbyHandle`] is a drop guard). What each half records:
//!
//! - `primary`: the primary's WAL end, from the `walEnd` field of XLogData and keepalive
//!   messages (the primary's flush position when it sent them);
//! - `sent`: the end of the WAL this half has passed on (to the link, or to the standby);
//! - `write`, `flush`, `replay`: the standby's own status updates ('r' messages);
//! - lag bytes = `primary − replay`;
//! - lag seconds = how long ago this half received the oldest WAL the standby has not replayed
//!   yet (0 when it has replayed everything this half received). It is measured on this
//!   process's clock only, so clock skew between datacenters does not enter it; at the
//!   downstream it leaves out the time the WAL spent crossing the link.
//!
//! The lag ring holds at most [`LAG_RING`] (position, time) points, one per 100 ms at most; when
//! it is full the newest point is moved forward instead, so the lag may be over-estimated for
//! the most recent WAL, never under-estimated.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::info;

use super::Half;
use walrelay_wal::lsn::Lsn;

/// Points kept per standby for lag seconds.
pub const LAG_RING: usize = 1024;
/// A standby this far behind the primary (bytes, after replay) gets progress lines.
pub const CATCH_UP_BYTES: u64 = 16 << 20;
/// Interval between progress lines.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// The registry of live standby sessions.
#[derive(Debug, Default)]
pub struct Standbys {
    inner: Arc<Mutex<Registry>>,
}

#[derive(Debug, Default)]
struct Registry {
    next_id: u64,
    entries: BTreeMap<u64, Arc<Entry>>,
}

#[derive(Debug)]
struct Entry {
    half: Half,
    application_name: String,
    peer: String,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    slot: Option<String>,
    primary: Lsn,
    sent: Lsn,
    /// write, flush, replay from the latest status update; None before the first.
    reply: Option<(Lsn, Lsn, Lsn)>,
    received: VecDeque<(Lsn, Instant)>,
    progress: Progress,
}

/// A snapshot of one standby entry.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct StandbyRow {
    pub half: String,
    pub application_name: String,
    pub slot: Option<String>,
    pub peer: String,
    pub primary_lsn: u64,
    pub sent_lsn: u64,
    pub write_lsn: Option<u64>,
    pub flush_lsn: Option<u64>,
    pub replay_lsn: Option<u64>,
    pub lag_bytes: Option<u64>,
    pub lag_seconds: Option<f64>,
}

impl Standbys {
    /// Registers a session; the entry lives until the handle is dropped.
    pub fn register(&self, half: Half, application_name: &str, peer: &str) -> StandbyHandle {
        let entry = Arc::new(Entry {
            half,
            application_name: application_name.to_string(),
            peer: peer.to_string(),
            state: Mutex::new(State::default()),
        });
        let mut r = lock(&self.inner);
        let id = r.next_id;
        r.next_id += 1;
        r.entries.insert(id, entry.clone());
        StandbyHandle {
            id,
            entry,
            registry: self.inner.clone(),
        }
    }

    /// Every live entry, ordered by application_name, half, then registration.
    pub fn rows(&self) -> Vec<StandbyRow> {
        let entries: Vec<Arc<Entry>> = lock(&self.inner).entries.values().cloned().collect();
        let now = Instant::now();
        let mut rows: Vec<StandbyRow> = entries.iter().map(|e| e.row(now)).collect();
        rows.sort_by(|a, b| (&a.application_name, &a.half).cmp(&(&b.application_name, &b.half)));
        rows
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Entry {
    fn row(&self, now: Instant) -> StandbyRow {
        let s = lock(&self.state);
        let replay = s.reply.map(|r| r.2);
        StandbyRow {
            half: self.half.label().into(),
            application_name: self.application_name.clone(),
            slot: s.slot.clone(),
            peer: self.peer.clone(),
            primary_lsn: s.primary.0,
            sent_lsn: s.sent.0,
            write_lsn: s.reply.map(|r| r.0 .0),
            flush_lsn: s.reply.map(|r| r.1 .0),
            replay_lsn: replay.map(|l| l.0),
            lag_bytes: replay.map(|r| s.primary.0.saturating_sub(r.0)),
            lag_seconds: replay.map(|r| lag_seconds(&s.received, r, now)),
        }
    }
}

/// Seconds since the oldest point of `received` beyond `replay` was received.
fn lag_seconds(received: &VecDeque<(Lsn, Instant)>, replay: Lsn, now: Instant) -> f64 {
    received
        .iter()
        .find(|(l, _)| *l > replay)
        .map(|(_, t)| now.saturating_duration_since(*t).as_secs_f64())
        .unwrap_or(0.0)
}

/// A session's entry; removes it when dropped.
#[derive(Debug)]
pub struct StandbyHandle {
    id: u64,
    entry: Arc<Entry>,
    registry: Arc<Mutex<Registry>>,
}

impl Drop for StandbyHandle {
    fn drop(&mut self) {
        lock(&self.registry).entries.remove(&self.id);
    }
}

impl StandbyHandle {
    /// The slot the standby streams from (its START_REPLICATION's, or the configured one).
    pub fn set_slot(&self, slot: Option<&str>) {
        lock(&self.entry.state).slot = slot.map(str::to_string);
    }

    /// The primary's WAL end as stated in an XLogData or keepalive message.
    pub fn primary_end(&self, end: Lsn) {
        let mut s = lock(&self.entry.state);
        s.primary = s.primary.max(end);
    }

    /// WAL up to `end` was received by this half now (and passed on: `sent`).
    pub fn wal(&self, end: Lsn) {
        let now = Instant::now();
        let mut s = lock(&self.entry.state);
        s.sent = s.sent.max(end);
        s.primary = s.primary.max(end);
        let full = s.received.len() >= LAG_RING;
        match s.received.back_mut() {
            Some(last) if last.0 >= end => {}
            Some(last)
                if full || now.saturating_duration_since(last.1) < Duration::from_millis(100) =>
            {
                last.0 = end
            }
            _ => s.received.push_back((end, now)),
        }
    }

    /// A standby status update ('r' message: write, flush, apply positions).
    pub fn reply(&self, write: Lsn, flush: Lsn, replay: Lsn) {
        let now = Instant::now();
        let mut s = lock(&self.entry.state);
        s.reply = Some((write, flush, replay));
        while s.received.front().is_some_and(|(l, _)| *l <= replay) {
            s.received.pop_front();
        }
        if self.entry.half != Half::Downstream {
            return; // one progress line per standby: the downstream's, next to it
        }
        let primary = s.primary;
        if let Some(line) = s.progress.observe(now, primary, replay) {
            let app = &self.entry.application_name;
            match line {
                ProgressLine::Behind {
                    bytes_per_sec,
                    remaining,
                    eta,
                } => info!(
                    application_name = %app,
                    replay = %replay,
                    primary = %primary,
                    rate_mb_s = %format!("{:.1}", bytes_per_sec / 1e6),
                    remaining_mb = remaining >> 20,
                    eta = %eta.map(|s| format!("{s:.0}s")).unwrap_or_else(|| "unknown".into()),
                    "standby catching up"
                ),
                ProgressLine::CaughtUp => {
                    info!(application_name = %app, replay = %replay, "standby caught up")
                }
            }
        }
    }
}

/// The catch-up progress state machine (sans-IO: it is given the time).
///
/// Quiet while the standby is within [`CATCH_UP_BYTES`] of the primary; once it is further
/// behind, a line every [`PROGRESS_EVERY`] (the first one after that interval, so short bursts
/// stay quiet) with the replay rate over the interval, then one line when it has caught up.
#[derive(Debug, Default)]
pub struct Progress {
    /// Time and replay position of the last line (or of falling behind).
    mark: Option<(Instant, Lsn)>,
    logged: bool,
}

/// What [`Progress::observe`] wants logged.
#[derive(Debug, Clone, PartialEq)]
pub enum ProgressLine {
    Behind {
        bytes_per_sec: f64,
        remaining: u64,
        /// Seconds to catch up at the current rate (None when not advancing).
        eta: Option<f64>,
    },
    CaughtUp,
}

impl Progress {
    pub fn observe(&mut self, now: Instant, primary: Lsn, replay: Lsn) -> Option<ProgressLine> {
        let remaining = primary.0.saturating_sub(replay.0);
        if remaining <= CATCH_UP_BYTES {
            self.mark = None;
            return std::mem::take(&mut self.logged).then_some(ProgressLine::CaughtUp);
        }
        let Some((t0, r0)) = self.mark else {
            self.mark = Some((now, replay));
            return None;
        };
        let dt = now.saturating_duration_since(t0);
        if dt < PROGRESS_EVERY {
            return None;
        }
        let bytes_per_sec = replay.0.saturating_sub(r0.0) as f64 / dt.as_secs_f64();
        self.mark = Some((now, replay));
        self.logged = true;
        Some(ProgressLine::Behind {
            bytes_per_sec,
            remaining,
            eta: (bytes_per_sec > 0.0).then(|| remaining as f64 / bytes_per_sec),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_live_as_long_as_their_handle() {
        let reg = Standbys::default();
        let h = reg.register(Half::Downstream, "s1", "127.0.0.1:1");
        let _u = reg.register(Half::Upstream, "s1", "127.0.0.1:2");
        h.set_slot(Some("slot1"));
        h.wal(Lsn(1000));
        h.primary_end(Lsn(1500));
        let rows = reg.rows();
        assert_eq!(rows.len(), 2);
        let d = rows.iter().find(|r| r.half == "downstream").unwrap();
        assert_eq!((d.sent_lsn, d.primary_lsn), (1000, 1500));
        assert_eq!(d.slot.as_deref(), Some("slot1"));
        assert_eq!(d.replay_lsn, None, "no status update yet");
        h.reply(Lsn(1000), Lsn(900), Lsn(800));
        let d = reg
            .rows()
            .into_iter()
            .find(|r| r.half == "downstream")
            .unwrap();
        assert_eq!(d.lag_bytes, Some(700));
        assert!(d.lag_seconds.unwrap() >= 0.0);
        drop(h);
        assert_eq!(reg.rows().len(), 1);
    }

    #[test]
    fn lag_seconds_counts_from_the_oldest_unreplayed_wal() {
        let t = Instant::now();
        let ring: VecDeque<(Lsn, Instant)> =
            [(Lsn(100), t), (Lsn(200), t + Duration::from_secs(5))].into();
        let now = t + Duration::from_secs(8);
        assert_eq!(lag_seconds(&ring, Lsn(50), now), 8.0);
        assert_eq!(lag_seconds(&ring, Lsn(100), now), 3.0);
        assert_eq!(lag_seconds(&ring, Lsn(200), now), 0.0);
    }

    #[test]
    fn lag_ring_is_bounded() {
        let reg = Standbys::default();
        let h = reg.register(Half::Upstream, "s", "p");
        for i in 0..(LAG_RING as u64 * 3) {
            // Spread in time is not needed to fill it: force new points by backdating.
            lock(&h.entry.state)
                .received
                .iter_mut()
                .for_each(|p| p.1 -= Duration::from_millis(200));
            h.wal(Lsn((i + 1) * 10));
        }
        let s = lock(&h.entry.state);
        assert_eq!(s.received.len(), LAG_RING);
        assert_eq!(s.received.back().unwrap().0, Lsn(LAG_RING as u64 * 30));
    }

    #[test]
    fn progress_is_quiet_when_caught_up_and_periodic_when_behind() {
        let mut p = Progress::default();
        let t = Instant::now();
        let mb = 1u64 << 20;
        assert_eq!(p.observe(t, Lsn(10 * mb), Lsn(0)), None);
        // Falls behind: nothing at once, a line after the interval.
        assert_eq!(p.observe(t, Lsn(100 * mb), Lsn(0)), None);
        assert_eq!(
            p.observe(t + Duration::from_secs(5), Lsn(100 * mb), Lsn(10 * mb)),
            None
        );
        let line = p.observe(t + Duration::from_secs(10), Lsn(100 * mb), Lsn(20 * mb));
        let Some(ProgressLine::Behind {
            bytes_per_sec,
            remaining,
            eta,
        }) = line
        else {
            panic!("{line:?}")
        };
        assert_eq!(remaining, 80 * mb);
        assert_eq!(bytes_per_sec, 2.0 * mb as f64);
        assert_eq!(eta, Some(40.0));
        assert_eq!(
            p.observe(t + Duration::from_secs(11), Lsn(100 * mb), Lsn(99 * mb)),
            Some(ProgressLine::CaughtUp)
        );
        assert_eq!(
            p.observe(t + Duration::from_secs(30), Lsn(100 * mb), Lsn(99 * mb)),
            None
        );
    }
}
