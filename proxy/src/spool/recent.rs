//! The newest spooled WAL, kept in memory as well as in the segment files, so that a standby
//! keeping up is served without a file lookup, an open, a seek and a read per XLogData (and
//! without a hop to a blocking thread for each one larger than a commit).
//!
//! A ring of [`RECENT_BYTES`]: byte `lsn` of the held range sits at `lsn % capacity`. It holds
//! one contiguous range `[start, end)` of one timeline, the last bytes the spool appended. An
//! append that does not continue that range (another timeline, a gap) starts the range over;
//! the spool's retention moves `start` up with the oldest segment kept, so a standby asking for
//! a removed segment still gets PostgreSQL's error. A read is answered only when the whole
//! requested range is held; otherwise the caller reads the files. The lock is held for one copy
//! in or out (a message, at most 128 KiB), never across I/O.

use std::sync::Mutex;

use walrelay_wal::lsn::{Lsn, TimeLineId};

/// Bytes of the newest WAL kept in memory per downstream.
pub const RECENT_BYTES: usize = 16 << 20;

/// The ring; shared by the spool (the one writer) and the standbys' sessions (readers).
#[derive(Debug)]
pub struct Recent {
    cap: usize,
    ring: Mutex<Ring>,
}

#[derive(Debug, Default)]
struct Ring {
    /// Allocated at the first append (`cap` bytes).
    buf: Vec<u8>,
    tli: TimeLineId,
    start: u64,
    end: u64,
}

impl Default for Recent {
    fn default() -> Recent {
        Recent::with_capacity(RECENT_BYTES)
    }
}

impl Recent {
    /// A ring holding at most `cap` bytes (at least one).
    pub fn with_capacity(cap: usize) -> Recent {
        Recent {
            cap: cap.max(1),
            ring: Mutex::new(Ring::default()),
        }
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        // A panic while holding the lock left at worst a range whose bytes are being
        // replaced; clear it rather than serve it.
        self.ring.lock().unwrap_or_else(|poisoned| {
            let mut r = poisoned.into_inner();
            r.start = r.end;
            r
        })
    }

    /// `bytes` of timeline `tli` were appended at `at`.
    pub fn append(&self, tli: TimeLineId, at: Lsn, bytes: &[u8]) {
        let mut at = at.0;
        let mut bytes = bytes;
        if bytes.len() > self.cap {
            // Only the last `cap` bytes can be held.
            let skip = bytes.len() - self.cap;
            at = at.saturating_add(skip as u64);
            bytes = &bytes[skip..];
        }
        let Some(new_end) = at.checked_add(bytes.len() as u64) else {
            return self.clear();
        };
        let mut r = self.ring();
        if r.buf.len() != self.cap {
            r.buf = vec![0; self.cap];
        }
        if r.tli != tli || r.end != at || r.start == r.end {
            r.tli = tli;
            r.start = at;
            r.end = at;
        }
        let cap = self.cap as u64;
        let mut pos = at;
        let mut rest = bytes;
        while !rest.is_empty() {
            let i = (pos % cap) as usize;
            let n = rest.len().min(self.cap - i);
            r.buf[i..i + n].copy_from_slice(&rest[..n]);
            rest = &rest[n..];
            pos += n as u64;
        }
        r.end = new_end;
        r.start = r.start.max(new_end.saturating_sub(cap));
    }

    /// Nothing before `lsn` is served from memory any more (the spool removed it).
    pub fn forget_before(&self, lsn: Lsn) {
        let mut r = self.ring();
        r.start = r.start.max(lsn.0).min(r.end);
    }

    /// Nothing is held.
    pub fn clear(&self) {
        let mut r = self.ring();
        r.start = r.end;
    }

    /// The `n` bytes of timeline `tli` from `at`, if all of them are held.
    pub fn read(&self, tli: TimeLineId, at: Lsn, n: usize) -> Option<Vec<u8>> {
        let r = self.ring();
        let end = at.0.checked_add(n as u64)?;
        if r.tli != tli || at.0 < r.start || end > r.end || r.buf.len() != self.cap {
            return None;
        }
        let cap = self.cap as u64;
        let mut out = Vec::with_capacity(n);
        let mut pos = at.0;
        while pos < end {
            let i = (pos % cap) as usize;
            let k = ((end - pos) as usize).min(self.cap - i);
            out.extend_from_slice(&r.buf[i..i + k]);
            pos += k as u64;
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T1: TimeLineId = TimeLineId(1);
    const T2: TimeLineId = TimeLineId(2);

    fn wal(from: u64, n: usize) -> Vec<u8> {
        (from..from + n as u64)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect()
    }

    #[test]
    fn holds_the_last_capacity_bytes_across_the_wrap() {
        let r = Recent::with_capacity(1000);
        assert_eq!(
            r.read(T1, Lsn(0), 0),
            None,
            "nothing before the first append"
        );
        let mut at = 5_000;
        for n in [300, 450, 10, 600, 1, 999] {
            r.append(T1, Lsn(at), &wal(at, n));
            at += n as u64;
        }
        // The last 1000 bytes, in any piece, wrapping or not.
        for (from, n) in [
            (at - 1000, 1000),
            (at - 1000, 1),
            (at - 700, 650),
            (at - 1, 1),
        ] {
            assert_eq!(r.read(T1, Lsn(from), n), Some(wal(from, n)), "{from}+{n}");
        }
        assert_eq!(r.read(T1, Lsn(at - 1001), 10), None, "overwritten");
        assert_eq!(r.read(T1, Lsn(at - 10), 11), None, "not written yet");
        assert_eq!(r.read(T2, Lsn(at - 10), 10), None, "another timeline");
        assert_eq!(r.read(T1, Lsn(u64::MAX - 2), 10), None, "no overflow");
    }

    #[test]
    fn an_append_larger_than_the_ring_keeps_its_tail() {
        let r = Recent::with_capacity(100);
        r.append(T1, Lsn(7), &wal(7, 1234));
        assert_eq!(r.read(T1, Lsn(1141), 100), Some(wal(1141, 100)));
        assert_eq!(r.read(T1, Lsn(1140), 1), None);
    }

    #[test]
    fn a_gap_or_a_new_timeline_starts_over() {
        let r = Recent::with_capacity(1000);
        r.append(T1, Lsn(0), &wal(0, 100));
        r.append(T1, Lsn(200), &wal(200, 100));
        assert_eq!(r.read(T1, Lsn(50), 10), None, "before the gap: dropped");
        assert_eq!(r.read(T1, Lsn(200), 100), Some(wal(200, 100)));
        r.append(T2, Lsn(300), &wal(300, 50));
        assert_eq!(r.read(T1, Lsn(200), 10), None);
        assert_eq!(r.read(T2, Lsn(300), 50), Some(wal(300, 50)));
    }

    #[test]
    fn forgotten_and_cleared_bytes_are_not_served() {
        let r = Recent::with_capacity(1000);
        r.append(T1, Lsn(0), &wal(0, 500));
        r.forget_before(Lsn(100));
        assert_eq!(r.read(T1, Lsn(99), 1), None);
        assert_eq!(r.read(T1, Lsn(100), 400), Some(wal(100, 400)));
        r.forget_before(Lsn(10_000));
        assert_eq!(r.read(T1, Lsn(499), 1), None, "start never passes the end");
        r.append(T1, Lsn(500), &wal(500, 10));
        assert_eq!(r.read(T1, Lsn(500), 10), Some(wal(500, 10)));
        r.clear();
        assert_eq!(r.read(T1, Lsn(500), 10), None);
    }
}
