//! Settings that change while the process runs (SIGHUP), and the session count they bound.
//!
//! A half keeps its current settings in a [`Live`]: every new connection takes the `Arc` that
//! is current when it arrives and keeps it to its end, so a reload reaches new connections and
//! leaves sessions in flight as they started.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// The current value of something a reload may replace.
#[derive(Debug)]
pub struct Live<T>(RwLock<Arc<T>>);

impl<T> Live<T> {
    pub fn new(v: Arc<T>) -> Arc<Live<T>> {
        Arc::new(Live(RwLock::new(v)))
    }

    /// The value new connections use now.
    pub fn get(&self) -> Arc<T> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the value for connections that arrive from now on.
    pub fn set(&self, v: Arc<T>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = v;
    }
}

/// Sessions open in one half, checked against a `limits.max_sessions` that may change: a
/// lower limit refuses new sessions until enough have ended, it never ends open ones.
#[derive(Debug, Default)]
pub struct SessionSlots(AtomicUsize);

/// One open session; frees its slot when dropped.
#[derive(Debug)]
pub struct Slot(Arc<SessionSlots>);

impl SessionSlots {
    pub fn new() -> Arc<SessionSlots> {
        Arc::default()
    }

    /// Takes a slot if fewer than `max` sessions are open.
    pub fn try_take(self: &Arc<Self>, max: usize) -> Option<Slot> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(self.clone()))
    }

    pub fn open(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_a_changing_limit() {
        let s = SessionSlots::new();
        let a = s.try_take(2).unwrap();
        let b = s.try_take(2).unwrap();
        assert!(s.try_take(2).is_none());
        // The limit is lowered to 1: open sessions stay, no new one until one has ended.
        assert!(s.try_take(1).is_none());
        drop(a);
        assert!(s.try_take(1).is_none());
        drop(b);
        let c = s.try_take(1).unwrap();
        assert_eq!(s.open(), 1);
        // Raised to 3: room again.
        let _d = s.try_take(3).unwrap();
        drop(c);
        assert_eq!(s.open(), 1);
    }

    #[test]
    fn live_values_are_snapshots() {
        let l = Live::new(Arc::new(1));
        let before = l.get();
        l.set(Arc::new(2));
        assert_eq!((*before, *l.get()), (1, 2));
    }
}
