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
