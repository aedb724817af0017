//! When the encode thread trades bytes for speed (`link.catch_up`).
//!
//! A relay that falls behind the primary adds replication lag, which costs a user more than
//! a few more bytes on the link. While the thread cannot keep up because it runs out of CPU
//! (batches wait for it and the link takes its frames at once), the codec compresses its
//! bulk streams at a fast zstd level (`WalEncoder::set_fast`): on recorded WAL of a bulk load
//! about 1.4 × the encoding speed for about 1 % more bytes, of rewritten TOAST values 1.2 ×
//! for 2.7 % more (`docs/keeping-up.md`, thirty-seventh and forty-fifth rounds). When
//! the link is what holds the frames back, more bytes would only make it worse, so the normal
//! settings come back at once. Each change starts new zstd frames (the history is lost for
//! matches), so the policy changes rarely: fast after [`ENTER_BATCHES`] batches in a row
//! found the thread behind, normal again after [`LEAVE_AFTER`] without one.
//!
//! Pure: the thread tells it what it saw per batch and when; it answers with a change.

use std::time::{Duration, Instant};

/// Batches in a row that must find the thread behind (and the link open) before the fast
/// settings go on: a burst of a batch or two is absorbed by the queue.
pub const ENTER_BATCHES: u32 = 4;
/// Time without a batch that found the thread behind before the normal settings come back.
pub const LEAVE_AFTER: Duration = Duration::from_secs(5);

/// What the thread saw when it took a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// The batch queue behind this batch was full: the feed waits for the thread.
    pub behind: bool,
    /// The link's stream could not take the thread's previous frame at once.
    pub link_full: bool,
}

/// The policy's state for one stream.
#[derive(Debug)]
pub struct CatchUp {
    enabled: bool,
    fast: bool,
    /// Batches in a row that found the thread behind with the link open.
    streak: u32,
    /// When a batch last found the thread behind with the link open.
    last_behind: Option<Instant>,
}

impl CatchUp {
    /// `enabled`: `link.catch_up`; when false the settings never change.
    pub fn new(enabled: bool) -> CatchUp {
        CatchUp {
            enabled,
            fast: false,
            streak: 0,
            last_behind: None,
        }
    }

    /// Whether the fast settings are on.
    #[cfg(test)]
    pub fn fast(&self) -> bool {
        self.fast
    }

    /// One batch taken at `now`: the new setting (true: fast) when it changes.
    pub fn observe(&mut self, now: Instant, seen: Seen) -> Option<bool> {
        if !self.enabled {
            return None;
        }
        if seen.link_full {
            self.streak = 0;
            self.last_behind = None;
            return self.set(false);
        }
        if seen.behind {
            self.streak = self.streak.saturating_add(1);
            self.last_behind = Some(now);
            if self.streak >= ENTER_BATCHES {
                return self.set(true);
            }
            return None;
        }
        self.streak = 0;
        let calm = self
            .last_behind
            .is_none_or(|t| now.saturating_duration_since(t) >= LEAVE_AFTER);
        if calm {
            return self.set(false);
        }
        None
    }

    fn set(&mut self, fast: bool) -> Option<bool> {
        (self.fast != fast).then(|| {
            self.fast = fast;
            fast
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEHIND: Seen = Seen {
        behind: true,
        link_full: false,
    };
    const CALM: Seen = Seen {
        behind: false,
        link_full: false,
    };
    const LINK_FULL: Seen = Seen {
        behind: true,
        link_full: true,
    };

    /// A policy that just went fast after a run of batches behind at `t`.
    fn gone_fast(t: Instant) -> CatchUp {
        let mut c = CatchUp::new(true);
        for _ in 0..ENTER_BATCHES {
            c.observe(t, BEHIND);
        }
        assert!(c.fast());
        c
    }

    #[test]
    fn fast_after_a_run_of_batches_behind_and_not_for_a_burst() {
        let t = Instant::now();
        let mut c = CatchUp::new(true);
        for _ in 1..ENTER_BATCHES {
            assert_eq!(c.observe(t, BEHIND), None);
        }
        // A calm batch breaks the run.
        assert_eq!(c.observe(t, CALM), None);
        for _ in 1..ENTER_BATCHES {
            assert_eq!(c.observe(t, BEHIND), None);
        }
        assert_eq!(c.observe(t, BEHIND), Some(true));
        assert!(c.fast());
        assert_eq!(c.observe(t, BEHIND), None, "no change to report");
    }

    #[test]
    fn normal_again_only_after_a_calm_spell() {
        let t = Instant::now();
        let mut c = gone_fast(t);
        let soon = t + LEAVE_AFTER / 2;
        assert_eq!(
            c.observe(soon, CALM),
            None,
            "a calm batch soon after stays fast"
        );
        assert_eq!(c.observe(soon, BEHIND), None);
        let later = soon + LEAVE_AFTER - Duration::from_millis(1);
        assert_eq!(
            c.observe(later, CALM),
            None,
            "timed from the last batch behind"
        );
        assert_eq!(c.observe(soon + LEAVE_AFTER, CALM), Some(false));
        assert!(!c.fast());
    }

    #[test]
    fn a_full_link_turns_it_off_at_once_and_never_on() {
        let t = Instant::now();
        let mut c = gone_fast(t);
        assert_eq!(c.observe(t, LINK_FULL), Some(false));
        for _ in 0..10 * ENTER_BATCHES {
            assert_eq!(c.observe(t, LINK_FULL), None);
        }
        // The run starts over once the link is open again.
        for _ in 1..ENTER_BATCHES {
            assert_eq!(c.observe(t, BEHIND), None);
        }
        assert_eq!(c.observe(t, BEHIND), Some(true));
    }

    #[test]
    fn disabled_never_changes() {
        let t = Instant::now();
        let mut c = CatchUp::new(false);
        for _ in 0..10 * ENTER_BATCHES {
            assert_eq!(c.observe(t, BEHIND), None);
        }
        assert!(!c.fast());
    }
}
