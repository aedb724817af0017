//! How long a peer that should speak regularly has been silent: the one clock behind each
//! "is it still there?" judgement of the relay, as PostgreSQL's walsender and walreceiver
//! make it (`WalSndKeepaliveIfNecessary`, `WalSndCheckTimeOut`, `wal_receiver_timeout`):
//! after half the timeout without a word the peer is asked for a reply (once, until it next
//! speaks); after all of it, it is given up.
//!
//! Used for a standby by the walsender (`limits.standby_timeout_secs`) and for the primary by
//! the upstream's stream and by each standby's own connection to it.

use std::time::Duration;

use tokio::time::Instant;

/// The silence of one peer.
#[derive(Debug, Clone)]
pub struct Silence {
    timeout: Option<Duration>,
    last_heard: Instant,
    asked: bool,
}

impl Silence {
    /// A clock started at `now`; `None` never times out.
    pub fn new(timeout: Option<Duration>, now: Instant) -> Silence {
        Silence {
            timeout,
            last_heard: now,
            asked: false,
        }
    }

    /// The timeout, if any.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The peer spoke at `now` (or its silence is to be timed from `now` on).
    pub fn heard(&mut self, now: Instant) {
        self.last_heard = now;
        self.asked = false;
    }

    /// When to ask for a reply: half the timeout after the peer last spoke, unless already
    /// asked since.
    pub fn ask_at(&self) -> Option<Instant> {
        let t = self.timeout?;
        (!self.asked).then(|| self.last_heard + t / 2)
    }

    /// The peer was asked for a reply.
    pub fn asked(&mut self) {
        self.asked = true;
    }

    /// When the peer is given up if it stays silent.
    pub fn deadline(&self) -> Option<Instant> {
        Some(self.last_heard + self.timeout?)
    }
}

/// Sleeps until `at`, or for ever when there is no such time (a `select!` branch that never
/// fires).
pub async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asked_at_half_the_timeout_and_given_up_at_all_of_it() {
        let t0 = Instant::now();
        let mut s = Silence::new(Some(Duration::from_secs(60)), t0);
        assert_eq!(s.ask_at(), Some(t0 + Duration::from_secs(30)));
        assert_eq!(s.deadline(), Some(t0 + Duration::from_secs(60)));
        s.asked();
        assert_eq!(s.ask_at(), None, "asked once until it speaks");
        assert_eq!(s.deadline(), Some(t0 + Duration::from_secs(60)));
        let t1 = t0 + Duration::from_secs(45);
        s.heard(t1);
        assert_eq!(s.ask_at(), Some(t1 + Duration::from_secs(30)));
        assert_eq!(s.deadline(), Some(t1 + Duration::from_secs(60)));
        let off = Silence::new(None, t0);
        assert_eq!(
            (off.ask_at(), off.deadline()),
            (None, None),
            "no timeout: never"
        );
    }
}
