//! Time spent runnable but waiting for a core, from Linux's own accounting: per process, the
//! sum over its threads of `/proc/<pid>/task/<tid>/schedstat` (its second field: nanoseconds
//! on a run queue), and for the machine, the CPU pressure total of `/proc/pressure/cpu` (the
//! `some` line's `total=`: microseconds during which at least one runnable task waited).
//!
//! The bench reads both beside CPU time: a relay that lags while its threads wait for a core
//! longer than they run is short of CPU on a busy machine, not slow at its work.
//!
//! Both return None where the kernel does not keep the figures (no `CONFIG_SCHED_INFO`, no
//! PSI), and the bench then prints "-". Threads that ended between two readings take their
//! waiting with them; the relay's threads that carry WAL live as long as its streams.

/// Seconds process `pid`'s current threads have spent waiting on a run queue.
pub fn process_wait_seconds(pid: u32) -> Option<f64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut ns: u64 = 0;
    let mut any = false;
    for task in tasks.flatten() {
        // A thread may end between the listing and the read: skip it.
        let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        if let Some(w) = schedstat_wait_ns(&text) {
            ns = ns.saturating_add(w);
            any = true;
        }
    }
    any.then(|| ns as f64 / 1e9)
}

/// The run-queue wait (second field, ns) of a `schedstat` line: `run_ns wait_ns timeslices`.
fn schedstat_wait_ns(text: &str) -> Option<u64> {
    text.split_whitespace().nth(1)?.parse().ok()
}

/// Seconds (since boot) during which some runnable task on the machine waited for a core.
pub fn machine_pressure_seconds() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/pressure/cpu").ok()?;
    psi_some_total_us(&text).map(|us| us as f64 / 1e6)
}

/// `total=` (µs) of the `some` line of a PSI file.
fn psi_some_total_us(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn parses_schedstat_and_psi() {
        assert_eq!(
            schedstat_wait_ns("257591611 121609350 1725\n"),
            Some(121609350)
        );
        assert_eq!(schedstat_wait_ns("257591611\n"), None);
        let psi = "some avg10=1.03 avg60=1.65 avg300=6.19 total=13747385306\n\
                   full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(psi_some_total_us(psi), Some(13747385306));
        assert_eq!(psi_some_total_us("full avg10=0.00 total=5\n"), None);
        assert_eq!(psi_some_total_us("some avg10=1.0 total=x\n"), None);
    }

    /// Two threads that both want a core for longer than the machine has cores: one of them
    /// waits, and the process's figure rises (on a kernel without schedstat, the test checks
    /// that there is none to read).
    #[test]
    fn own_threads_wait_when_they_outnumber_the_cores() {
        let pid = std::process::id();
        let Some(before) = process_wait_seconds(pid) else {
            assert!(
                !Path::new("/proc/self/schedstat").exists(),
                "schedstat unread"
            );
            return;
        };
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let spin = || {
            let t = std::time::Instant::now();
            let mut x = 0u64;
            while t.elapsed() < std::time::Duration::from_millis(300) {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
            }
        };
        let threads: Vec<_> = (0..cores * 3).map(|_| std::thread::spawn(spin)).collect();
        // Read while the spinners still live (their waiting leaves with them).
        std::thread::sleep(std::time::Duration::from_millis(200));
        let during = process_wait_seconds(pid).unwrap();
        for t in threads {
            t.join().unwrap();
        }
        assert!(during > before, "{before} -> {during}");
    }
}
