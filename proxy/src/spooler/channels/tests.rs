use super::*;

fn info(name: &str) -> StandbyInfo {
    StandbyInfo {
        application_name: name.into(),
        ..Default::default()
    }
}

fn start() -> StartReplication {
    StartReplication {
        slot: "s".into(),
        start_lsn: 1,
        timeline: 1,
    }
}

fn kinds(ch: &Channels) -> Vec<String> {
    ch.queue
        .iter()
        .map(|o| match o {
            Out::Open(c, _) => format!("open {c}"),
            Out::Command(c, _) => format!("command {c}"),
            Out::Start(c, _) => format!("start {c}"),
            Out::Close(c) => format!("close {c}"),
        })
        .collect()
}

/// Takes the queue as `build` does once the items went up.
fn sent(ch: &mut Channels) {
    for o in std::mem::take(&mut ch.queue) {
        if let Out::Close(c) = o {
            ch.open.remove(&c);
        }
    }
}

#[test]
fn a_channel_closed_while_the_link_is_down_is_not_opened_again() {
    let mut ch = Channels::default();
    let (tx, _rx) = mpsc::channel(1);
    let a = ch.open(info("a"), tx.clone()).unwrap();
    let b = ch.open(info("b"), tx.clone()).unwrap();
    ch.queue.push(Out::Start(a, start()));
    sent(&mut ch);
    // The link goes down; `a` leaves, then `c` comes and goes, `d` comes and stays.
    ch.link_down();
    let now = Instant::now();
    ch.close(a, now);
    let c = ch.open(info("c"), tx.clone()).unwrap();
    ch.close(c, now);
    let d = ch.open(info("d"), tx.clone()).unwrap();
    assert!(
        !ch.open.contains_key(&c),
        "c never went up: forgotten at once"
    );
    ch.reopen(now);
    assert_eq!(kinds(&ch), [format!("open {b}"), format!("open {d}")]);
    let mut live: Vec<u32> = ch.open.keys().copied().collect();
    live.sort_unstable();
    assert_eq!(live, [b, d]);
}

#[test]
fn a_channel_closed_on_a_live_link_sends_its_close() {
    let mut ch = Channels::default();
    let (tx, _rx) = mpsc::channel(1);
    let a = ch.open(info("a"), tx.clone()).unwrap();
    sent(&mut ch);
    ch.queue.push(Out::Command(a, Command::default()));
    let now = Instant::now();
    ch.close(a, now);
    assert_eq!(kinds(&ch), [format!("command {a}"), format!("close {a}")]);
    assert_eq!(ch.open[&a].due, Some(now), "its latest feedback goes first");
    // Closed before its OPEN went up: nothing goes at all.
    let b = ch.open(info("b"), tx).unwrap();
    ch.close(b, now);
    assert_eq!(kinds(&ch), [format!("command {a}"), format!("close {a}")]);
}

#[test]
fn ids_are_reused_and_run_out_without_spinning() {
    let mut ch = Channels::default();
    let (tx, _rx) = mpsc::channel(1);
    for i in 0..MAX_CHANNELS {
        assert_eq!(ch.open(info("x"), tx.clone()), Some(i));
    }
    assert_eq!(ch.open(info("x"), tx.clone()), None, "all ids in use");
    sent(&mut ch);
    ch.close(7, Instant::now());
    sent(&mut ch);
    assert_eq!(ch.open(info("x"), tx), Some(7));
}

#[test]
fn a_standby_starting_again_and_again_queues_one_start() {
    let mut ch = Channels::default();
    let (tx, _rx) = mpsc::channel(1);
    let a = ch.open(info("a"), tx).unwrap();
    ch.link_down();
    for i in 0..10_000 {
        ch.start(
            a,
            StartReplication {
                start_lsn: i,
                ..start()
            },
        );
    }
    assert_eq!(kinds(&ch), [format!("start {a}")]);
    assert_eq!(ch.open[&a].start.as_ref().unwrap().start_lsn, 9_999);
    // After a command, a new START goes after it, the older one gone.
    ch.queue.push(Out::Command(a, Command::default()));
    ch.start(a, start());
    assert_eq!(kinds(&ch), [format!("command {a}"), format!("start {a}")]);
    // A channel that is not open queues nothing.
    ch.start(a + 1, start());
    assert_eq!(ch.queue.len(), 2);
}

/// A session that sees the link up queues its command at once; one queued between the
/// Welcome and the channels' reopening goes after its channel's OPEN. Before, the reopening
/// dropped it and the session waited a minute for an answer that never came.
#[test]
fn a_command_queued_as_the_link_comes_up_is_kept() {
    let mut ch = Channels::default();
    let (tx, _rx) = mpsc::channel(1);
    let a = ch.open(info("a"), tx.clone()).unwrap();
    let b = ch.open(info("b"), tx.clone()).unwrap();
    sent(&mut ch);
    ch.link_down();
    ch.close(b, Instant::now());
    // The stream is up again; `a` asks the primary something before the reopening.
    ch.queue.push(Out::Command(a, Command::default()));
    ch.queue.push(Out::Command(b, Command::default()));
    ch.reopen(Instant::now());
    assert_eq!(kinds(&ch), [format!("open {a}"), format!("command {a}")]);
}

/// A standby status update ('r', 34 bytes) whose write position is `w`.
fn status(w: u64) -> Feedback {
    let mut m = vec![b'r'];
    m.extend_from_slice(&w.to_be_bytes());
    m.resize(34, 0);
    Feedback::new(&m).unwrap()
}

/// The send loop is woken for a feedback that opens a window or makes its channel due
/// earlier, and not for one that only replaces what waits in an open window; what goes at
/// the window's end is the latest.
#[test]
fn feedback_within_an_open_window_does_not_wake_the_send_loop() {
    let (tx, _rx) = mpsc::channel(1);
    let mut ch = Channels::default();
    let c = ch.open(info("a"), tx).unwrap();
    let (window, t0) = (std::time::Duration::from_millis(10), Instant::now());
    assert!(ch.feedback(c, status(1), false, window, t0));
    assert_eq!(ch.open[&c].due, Some(t0 + window));
    // The flush reply a moment later: same window, no wake-up, the latest waits.
    let t1 = t0 + std::time::Duration::from_millis(2);
    assert!(!ch.feedback(c, status(2), false, window, t1));
    assert_eq!(ch.open[&c].due, Some(t0 + window));
    assert_eq!(ch.open[&c].pending[0], Some(status(2)));
    // An urgent reply (the standby asked for it, or it starts) is due now: earlier, woken.
    assert!(ch.feedback(c, status(3), true, window, t1));
    assert_eq!(ch.open[&c].due, Some(t1));
    // Once due, nothing later makes it wait longer, and nothing needs to wake the loop.
    assert!(!ch.feedback(c, status(4), false, window, t1));
    assert!(!ch.feedback(c, status(5), true, window, t1 + window));
    assert_eq!(ch.open[&c].due, Some(t1));
    // Sent (as `build` does): the next one opens a new window and wakes the loop again.
    ch.open.get_mut(&c).unwrap().due = None;
    ch.open.get_mut(&c).unwrap().pending = [None, None];
    assert!(ch.feedback(c, status(6), false, window, t1 + window));
    // A synchronous standby's feedback is never held back.
    ch.open.get_mut(&c).unwrap().synchronous = true;
    ch.open.get_mut(&c).unwrap().due = None;
    assert!(ch.feedback(c, status(7), false, window, t1 + window));
    assert_eq!(ch.open[&c].due, Some(t1 + window));
    // No window at all: due at once.
    ch.open.get_mut(&c).unwrap().synchronous = false;
    ch.open.get_mut(&c).unwrap().due = None;
    let zero = std::time::Duration::ZERO;
    assert!(ch.feedback(c, status(8), false, zero, t0));
    assert_eq!(ch.open[&c].due, Some(t0));
    // A channel that is gone takes nothing and wakes nothing.
    assert!(!ch.feedback(c + 1, status(9), true, window, t0));
}
