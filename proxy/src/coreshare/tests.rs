use std::time::{Duration, Instant};

use super::*;

const MS: u64 = 1_000_000;

fn at(t0: Instant, ms: u64, run_ms: u64, wait_ms: u64) -> Sample {
    Sample {
        at: t0 + Duration::from_millis(ms),
        run_ns: run_ms * MS,
        wait_ns: wait_ms * MS,
    }
}

#[test]
fn parses_the_kernels_three_numbers() {
    assert_eq!(
        parse_schedstat("1993000123 17000456 3021\n"),
        Some((1_993_000_123, 17_000_456))
    );
    assert_eq!(parse_schedstat("12 34"), Some((12, 34)));
    for bad in ["", "12", "x 1 2", "12 -3 4"] {
        assert_eq!(parse_schedstat(bad), None, "{bad:?}");
    }
}

#[test]
fn verdict_needs_enough_wanted_time_and_weighs_waiting_against_running() {
    // The thread slept through the interval: nothing to tell.
    assert_eq!(verdict(5 * MS, 5 * MS), None);
    // The measured cases of the module docs: alone, one busy loop, two busy loops, staged.
    assert_eq!(verdict(1993 * MS, 0), Some(false));
    assert_eq!(verdict(1996 * MS, 38 * MS), Some(false));
    assert_eq!(verdict(1443 * MS, 575 * MS), Some(true));
    assert_eq!(verdict(1403 * MS, 580 * MS), Some(true));
    // The boundary: waiting a quarter of the running time is short.
    assert_eq!(verdict(100 * MS, 25 * MS), Some(true));
    assert_eq!(verdict(100 * MS, 24 * MS), Some(false));
    // Counters that went backwards (another thread's file, say) cannot overflow.
    assert_eq!(verdict(u64::MAX, u64::MAX), Some(true));
}

#[test]
fn samples_once_per_interval_and_holds_a_short_verdict() {
    let t0 = Instant::now();
    let mut j = Judge::default();
    assert!(j.wants_sample(t0));
    // The first sample is a baseline only.
    assert!(!j.observe(at(t0, 0, 0, 0)));
    assert!(!j.wants_sample(t0 + INTERVAL / 2));
    assert!(j.wants_sample(t0 + INTERVAL));
    // Ran 250 ms of 250: not short.
    assert!(!j.observe(at(t0, 250, 240, 5)));
    // Waited 60 % as long as it ran: short, and held.
    assert!(j.observe(at(t0, 500, 390, 100)));
    assert!(j.short());
    assert!(!j.wants_sample(t0 + Duration::from_millis(500) + HOLD / 2));
    let end = Duration::from_millis(500) + HOLD;
    assert!(j.wants_sample(t0 + end));
    // On one core through the hold, it got a CPU whenever it wanted one: try more cores.
    let ms = end.as_millis() as u64;
    assert!(!j.observe(at(t0, ms, 390 + 4900, 100 + 50)));
    assert!(!j.short());
}

#[test]
fn a_short_thread_stays_short_while_it_still_waits_and_an_idle_one_keeps_its_verdict() {
    let t0 = Instant::now();
    let mut j = Judge::default();
    j.observe(at(t0, 0, 0, 0));
    assert!(j.observe(at(t0, 250, 100, 150)));
    // After the hold, still waiting: another hold.
    assert!(j.observe(at(t0, 5250, 1100, 800)));
    assert!(!j.wants_sample(t0 + Duration::from_millis(5250) + HOLD / 2));
    // Idle through the hold (2 ms wanted): the verdict stands, but is not held again without
    // evidence: the next interval judges it.
    assert!(j.observe(at(t0, 10250, 1101, 801)));
    let idle = t0 + Duration::from_millis(10250);
    assert!(!j.wants_sample(idle + INTERVAL / 2));
    assert!(j.wants_sample(idle + INTERVAL));
    // That interval: it got a core whenever it wanted one.
    assert!(!j.observe(at(t0, 10500, 1301, 801)));
    // Not short, then idle: still not short.
    let mut k = Judge::default();
    k.observe(at(t0, 0, 0, 0));
    assert!(!k.observe(at(t0, 250, 200, 0)));
    assert!(!k.observe(at(t0, 500, 201, 1)));
}

#[test]
fn reads_the_calling_threads_own_statistics() {
    let mut c = CoreShare::for_this_thread();
    let Some(f) = c.stat.as_mut() else {
        panic!("/proc/thread-self/schedstat did not open: this test needs Linux with CONFIG_SCHED_INFO");
    };
    let (run0, _) = read(f).expect("schedstat reads");
    // Spin until the file shows 20 ms more on a CPU (at most 10 s of wall time, for a busy
    // machine): the number follows this thread's work.
    let t = std::time::Instant::now();
    let mut run1 = run0;
    while run1 < run0 + 20 * MS && t.elapsed() < Duration::from_secs(10) {
        let mut x = 0u64;
        for _ in 0..100_000 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        run1 = read(c.stat.as_mut().expect("still open"))
            .expect("schedstat reads again")
            .0;
    }
    assert!(run1 >= run0 + 20 * MS, "{run0} then {run1}");
    // Another thread's CPU time is not this one's.
    std::thread::spawn(|| {
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_millis(50) {
            std::hint::black_box(0u64);
        }
    })
    .join()
    .expect("spinner");
    let (run2, _) = read(c.stat.as_mut().expect("still open")).expect("schedstat reads again");
    assert!(run2 < run1 + 20 * MS, "{run1} then {run2}");
    // The first sample is a baseline: no verdict yet.
    assert!(!c.short(Instant::now()));
}

#[test]
fn spreads_only_while_behind_and_counts_the_batches_kept_to_one_core() {
    let kept = std::sync::atomic::AtomicU64::new(0);
    let mut c = CoreShare::for_this_thread();
    assert!(!c.spread(false, &kept));
    // Behind for the first time: the baseline sample, no verdict, so more cores.
    assert!(c.spread(true, &kept));
    // Judged short: kept to one core, and counted.
    c.judge.short = true;
    c.judge.hold_until = Some(Instant::now() + HOLD);
    assert!(!c.spread(true, &kept));
    assert!(!c.spread(false, &kept));
    assert_eq!(kept.load(std::sync::atomic::Ordering::Relaxed), 1);
}
