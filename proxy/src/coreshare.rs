//! Whether a stage's thread gets a core when it is ready to run, from the kernel's scheduler
//! statistics for that thread.
//!
//! The encode stage ([`crate::upstream`]) and the decode stage ([`crate::spooler`]) use more
//! than one core while they are behind: they stage the next message on the codec's section
//! thread and check images on a worker. That pays only where a second thread gets a core of
//! its own. Where the machine is short of CPU, a second thread shares the same CPU time with
//! the first and adds hand-offs between them. The kernel shares CPU between sessions and
//! cgroups before threads (autogroup; a service's cgroup), so more threads do not bring a
//! larger share. Measured with `codec_profile` on recorded pgbench WAL, on this project's
//! 2-core machine, with busy loops in sessions of their own (`docs/keeping-up.md`,
//! forty-first round):
//! - Nothing else running: staging ran the two threads at 1.37 cores and took 0.64–0.75 × the
//!   one-core wall time.
//! - One busy loop: the one-core thread waited for a core 2 % as long as it ran. Staged, the
//!   two threads got 1.0 core between them, as one thread alone did.
//! - Two busy loops: the one-core thread waited 40 % as long as it ran. Staged, the two
//!   threads together got less CPU than the one thread, and wall time was 1.06–1.17 × the
//!   one-core time.
//!
//! So a stage stays on one core while its own thread has been waiting for a CPU at least
//! [`SHORT_WAIT_PER_RUN`] as long as it ran (the thread's `schedstat`: time on a CPU, time
//! runnable on a run queue). The verdict covers the last [`INTERVAL`], and a short verdict
//! holds for [`HOLD`]. When the hold ends, that time (on one core) is judged: if the thread
//! got a core whenever it wanted one, more cores are tried again. Where the statistics cannot
//! be read (no `/proc`, a kernel without `CONFIG_SCHED_INFO`), the thread is never
//! judged short, and stages as before.
//!
//! `/proc/thread-self/schedstat` holds three numbers: nanoseconds on a CPU, nanoseconds
//! runnable and waiting on a run queue, and time slices. The file is opened by the thread it
//! describes, and is read again from its start for each sample.

use std::fs::File;
use std::io::Read;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use crate::metrics::Metrics;

/// How often the thread's statistics are sampled (at most; only when the stage asks).
pub const INTERVAL: Duration = Duration::from_millis(250);
/// How long a thread found short of CPU stays on one core before it is judged again.
pub const HOLD: Duration = Duration::from_secs(5);
/// Short of CPU: waited for a core at least this share of the time it ran.
pub const SHORT_WAIT_PER_RUN: f64 = 0.25;
/// Less than this much time runnable (on a CPU or waiting) in an interval tells nothing: the
/// thread mostly slept.
pub const MIN_WANTED: Duration = Duration::from_millis(20);

/// One reading of a thread's statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub at: Instant,
    /// Nanoseconds on a CPU.
    pub run_ns: u64,
    /// Nanoseconds runnable, waiting for a CPU.
    pub wait_ns: u64,
}

/// `/proc/<pid>/task/<tid>/schedstat` text: (time on a CPU, time waiting on a run queue), ns.
pub fn parse_schedstat(text: &str) -> Option<(u64, u64)> {
    let mut fields = text.split_ascii_whitespace().map(str::parse::<u64>);
    let run = fields.next()?.ok()?;
    let wait = fields.next()?.ok()?;
    Some((run, wait))
}

/// Whether a thread that ran `run_ns` and waited `wait_ns` for a CPU in an interval was short
/// of CPU; `None` when it wanted a CPU for too little of the interval to tell.
pub fn verdict(run_ns: u64, wait_ns: u64) -> Option<bool> {
    let wanted = run_ns.saturating_add(wait_ns);
    if u128::from(wanted) < MIN_WANTED.as_nanos() {
        return None;
    }
    Some(wait_ns as f64 >= run_ns as f64 * SHORT_WAIT_PER_RUN)
}

/// One stage thread's view of its CPU share (see the module docs). Made and used on that
/// thread.
#[derive(Debug)]
pub struct CoreShare {
    /// The thread's own `schedstat`; `None` when it cannot be read.
    stat: Option<File>,
    judge: Judge,
}

impl CoreShare {
    /// For the calling thread.
    pub fn for_this_thread() -> CoreShare {
        CoreShare {
            stat: File::open("/proc/thread-self/schedstat").ok(),
            judge: Judge::default(),
        }
    }

    /// Whether a stage that is `behind` may use more than one core now: only while its thread
    /// is not short of CPU. Each time it is behind and kept to one core counts in `kept` (the
    /// stage's half of `walrelay_codec_short_of_cpu_messages_total`).
    pub fn spread(&mut self, behind: bool, kept: &AtomicU64) -> bool {
        if !behind {
            return false;
        }
        let short = self.short(Instant::now());
        if short {
            Metrics::add(kept, 1);
        }
        !short
    }

    /// Whether the thread is short of CPU at `now`, so that another thread would not run
    /// beside it; samples the statistics at most once per [`INTERVAL`].
    pub fn short(&mut self, now: Instant) -> bool {
        if !self.judge.wants_sample(now) {
            return self.judge.short();
        }
        match self.stat.as_mut().and_then(read) {
            Some((run_ns, wait_ns)) => self.judge.observe(Sample {
                at: now,
                run_ns,
                wait_ns,
            }),
            None => {
                // Unreadable: never judged short.
                self.stat = None;
                self.judge = Judge::default();
                false
            }
        }
    }
}

/// The file's numbers, read from its start.
fn read(f: &mut File) -> Option<(u64, u64)> {
    use std::io::Seek;
    f.rewind().ok()?;
    let mut buf = [0u8; 128];
    let n = f.read(&mut buf).ok()?;
    parse_schedstat(std::str::from_utf8(&buf[..n]).ok()?)
}

/// The verdict from successive samples. Pure: [`CoreShare`] feeds it the readings.
#[derive(Debug, Default)]
pub struct Judge {
    last: Option<Sample>,
    /// Short of CPU until this time.
    hold_until: Option<Instant>,
    short: bool,
}

impl Judge {
    /// Whether a new sample is due at `now`.
    pub fn wants_sample(&self, now: Instant) -> bool {
        if let Some(until) = self.hold_until {
            return now >= until;
        }
        self.last
            .is_none_or(|s| now.saturating_duration_since(s.at) >= INTERVAL)
    }

    /// A new reading; returns whether the thread is short of CPU from now on.
    pub fn observe(&mut self, s: Sample) -> bool {
        let before = self.last.replace(s);
        self.hold_until = None;
        let Some(b) = before else {
            return self.short;
        };
        let run = s.run_ns.saturating_sub(b.run_ns);
        let wait = s.wait_ns.saturating_sub(b.wait_ns);
        // Too little wanted to tell: the verdict before stands, without a new hold (judged
        // again after the next interval, not kept on one core for HOLD without evidence).
        if let Some(short) = verdict(run, wait) {
            self.short = short;
            if short {
                self.hold_until = Some(s.at + HOLD);
            }
        }
        self.short
    }

    /// The verdict now.
    pub fn short(&self) -> bool {
        self.short
    }
}

#[cfg(test)]
mod tests;
