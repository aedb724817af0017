//! One half of a message's work on a thread of its own, its state travelling with it.
//!
//! Both ends split a message's work in two: the encoder transforms records, then compresses
//! the streams ([`super::encoder`]'s sealer); the decoder decompresses the sections, then
//! restores the records ([`super::decoder`]'s unpacker). The zstd contexts of the
//! (de)compressing half carry history from message to message, so that half must see the
//! messages in order, one at a time. A [`Handoff`] runs it for a queue of messages:
//!
//! - **here**, at once ([`Handoff::push`] with `away` false), when its state is here (or
//!   nothing is queued: the state is then called back from the thread first);
//! - **on the thread** (started when first needed) when `away`: the state ([`Work`]) goes to
//!   the thread with the first such job and stays there while jobs follow; a job pushed while
//!   the state is there goes there too, whatever `away` says, behind the others. The thread
//!   runs them in order and sends the outcomes back; it never waits for the caller to take
//!   one before it starts the next, so the caller's wake-ups are off the thread's path. The
//!   state comes back when the caller needs it here ([`Handoff::home`]), after the jobs
//!   queued before. It is never used by two threads at once and sees the jobs in order: the
//!   outcomes are the same wherever they were made.
//!
//! [`Handoff::pop`] returns the outcomes oldest first. At most `max` jobs are queued and not
//! popped; [`Handoff::push`] refuses one more. The channels hold that many and one more (the
//! state's way home), so neither side ever blocks on a send.

use std::collections::VecDeque;
use std::sync::mpsc;
use std::thread::JoinHandle;

use super::WalCodecError;

/// The state of the half that runs on the thread, and what it does with a job.
pub(crate) trait Work: Send + 'static {
    type Job: Send + 'static;
    type Out: Send + 'static;
    /// `away`: this runs on the handoff's thread (so the caller is busy with other work).
    fn run(&mut self, job: Self::Job, away: bool) -> Result<Self::Out, WalCodecError>;
}

type Outcome<W> = Result<<W as Work>::Out, WalCodecError>;

enum Slot<W: Work> {
    /// On the thread (its outcome comes back in order).
    Away,
    Done(Outcome<W>),
}

enum ToThread<W: Work> {
    /// A job, with the state when it is the first since the state was here.
    Job(Option<Box<W>>, W::Job),
    /// Send the state back (after the jobs before).
    Home,
}

enum FromThread<W: Work> {
    Done(Outcome<W>),
    Home(Box<W>),
}

pub(crate) struct Handoff<W: Work> {
    /// The state when here (`None` while on the thread, or lost with it).
    home: Option<Box<W>>,
    /// The state is on the thread.
    on_thread: bool,
    /// Jobs not popped yet, oldest first.
    slots: VecDeque<Slot<W>>,
    thread: Option<Thread<W>>,
    name: &'static str,
    max: usize,
}

struct Thread<W: Work> {
    to: Option<mpsc::SyncSender<ToThread<W>>>,
    from: mpsc::Receiver<FromThread<W>>,
    handle: Option<JoinHandle<()>>,
}

impl<W: Work> Handoff<W> {
    /// `name`: the thread's; `max`: most jobs queued.
    pub fn new(state: W, name: &'static str, max: usize) -> Handoff<W> {
        Handoff {
            home: Some(Box::new(state)),
            on_thread: false,
            slots: VecDeque::with_capacity(max),
            thread: None,
            name,
            max,
        }
    }

    /// Jobs queued and not popped.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// The state, brought back from the thread if it is there (after the jobs queued there;
    /// their outcomes wait to be popped); `None` if it was lost with the thread.
    pub fn home(&mut self) -> Option<&mut W> {
        if self.on_thread {
            self.on_thread = false;
            if self.send(ToThread::Home).is_ok() {
                self.call_home();
            }
        }
        self.home.as_deref_mut()
    }

    /// Takes a job: run here now, or on the thread when `away` or when the state is there
    /// (see the module doc). Refused when `max` jobs are queued.
    pub fn push(&mut self, job: W::Job, away: bool) -> Result<(), WalCodecError> {
        if self.slots.len() >= self.max {
            return Err(WalCodecError::Params(format!(
                "{} messages are staged already: take one before staging another",
                self.max
            )));
        }
        if !away && self.slots.is_empty() {
            // Back to one core: the state comes home (once) rather than every job going out.
            self.home();
        }
        let slot = match self.home.take() {
            Some(state) if away => {
                self.send(ToThread::Job(Some(state), job))?;
                self.on_thread = true;
                Slot::Away
            }
            Some(mut state) => {
                let r = state.run(job, false);
                self.home = Some(state);
                Slot::Done(r)
            }
            None if self.on_thread => {
                self.send(ToThread::Job(None, job))?;
                Slot::Away
            }
            None => Slot::Done(Err(self.stopped())),
        };
        self.slots.push_back(slot);
        Ok(())
    }

    /// The oldest job's outcome (waits for the thread if it is there); `None` when nothing
    /// is queued.
    pub fn pop(&mut self) -> Option<Outcome<W>> {
        Some(match self.slots.pop_front()? {
            Slot::Done(r) => r,
            Slot::Away => match self.recv() {
                Some(FromThread::Done(r)) => r,
                _ => Err(self.stopped()),
            },
        })
    }

    /// Receives until the state is back, keeping the outcomes that come first in their slots.
    fn call_home(&mut self) {
        loop {
            match self.recv() {
                Some(FromThread::Home(state)) => {
                    self.home = Some(state);
                    return;
                }
                Some(FromThread::Done(r)) => {
                    match self.slots.iter_mut().find(|s| matches!(s, Slot::Away)) {
                        Some(slot) => *slot = Slot::Done(r),
                        None => return,
                    }
                }
                None => return,
            }
        }
    }

    /// Sends to the thread (started if need be).
    fn send(&mut self, msg: ToThread<W>) -> Result<(), WalCodecError> {
        if self.thread.is_none() {
            self.thread = Some(Thread::start(self.name, self.max + 1)?);
        }
        let sent = self
            .thread
            .as_ref()
            .and_then(|t| t.to.as_ref())
            .is_some_and(|to| to.send(msg).is_ok());
        if sent {
            Ok(())
        } else {
            self.on_thread = false;
            Err(self.stopped())
        }
    }

    fn recv(&mut self) -> Option<FromThread<W>> {
        self.thread.as_ref().and_then(|t| t.from.recv().ok())
    }

    fn stopped(&self) -> WalCodecError {
        WalCodecError::Zstd(format!(
            "the {} thread stopped (the session's zstd contexts are lost)",
            self.name
        ))
    }
}

impl<W: Work> Thread<W> {
    /// A thread whose channels hold `room` messages each.
    fn start(name: &'static str, room: usize) -> Result<Thread<W>, WalCodecError> {
        let (to, inbox) = mpsc::sync_channel::<ToThread<W>>(room);
        let (back, from) = mpsc::sync_channel::<FromThread<W>>(room);
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut state: Option<Box<W>> = None;
                for msg in inbox {
                    let reply = match msg {
                        ToThread::Job(with, job) => {
                            if with.is_some() {
                                state = with;
                            }
                            FromThread::Done(match state.as_mut() {
                                Some(s) => s.run(job, true),
                                None => Err(WalCodecError::Zstd(format!(
                                    "the {name} thread got a job without its state"
                                ))),
                            })
                        }
                        ToThread::Home => match state.take() {
                            Some(s) => FromThread::Home(s),
                            None => return,
                        },
                    };
                    if back.send(reply).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| WalCodecError::Zstd(format!("cannot start the {name} thread: {e}")))?;
        Ok(Thread {
            to: Some(to),
            from,
            handle: Some(handle),
        })
    }
}

impl<W: Work> Drop for Thread<W> {
    fn drop(&mut self) {
        // Closing the inbox ends the thread once the jobs in it (at most `max`) are done;
        // their outcomes fit in the way back.
        self.to = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A running sum: each job's outcome depends on every job before it.
    struct Sum(u64);

    impl Work for Sum {
        type Job = u64;
        type Out = (u64, bool);
        fn run(&mut self, job: u64, away: bool) -> Result<(u64, bool), WalCodecError> {
            if job == 0 {
                return Err(WalCodecError::Corrupt("zero".into()));
            }
            self.0 += job;
            Ok((self.0, away))
        }
    }

    #[test]
    fn outcomes_come_in_order_wherever_the_jobs_ran() {
        let mut h = Handoff::new(Sum(0), "test-handoff", 3);
        let mut got = Vec::new();
        for (i, job) in (1..=20u64).enumerate() {
            h.push(job, i % 3 != 0).unwrap();
            if h.len() == 3 {
                got.push(h.pop().unwrap().unwrap());
            }
        }
        while let Some(r) = h.pop() {
            got.push(r.unwrap());
        }
        let sums: Vec<u64> = got.iter().map(|g| g.0).collect();
        let want: Vec<u64> = (1..=20u64).map(|n| n * (n + 1) / 2).collect();
        assert_eq!(sums, want);
        assert!(got.iter().any(|g| g.1) && got.iter().any(|g| !g.1));
        assert!(h.home().is_some());
    }

    #[test]
    fn the_state_comes_home_after_the_jobs_before_it() {
        let mut h = Handoff::new(Sum(0), "test-handoff", 4);
        for job in 1..=3 {
            h.push(job, true).unwrap();
        }
        // Brought back while three jobs are on the thread: after them, their outcomes kept.
        assert_eq!(h.home().unwrap().0, 6);
        let got: Vec<_> = std::iter::from_fn(|| h.pop()).map(|r| r.unwrap()).collect();
        assert_eq!(got, [(1, true), (3, true), (6, true)]);
        // Nothing queued and one core asked for: here, with the state that came back.
        h.push(4, false).unwrap();
        assert_eq!(h.pop().unwrap().unwrap(), (10, false));
    }

    #[test]
    fn a_full_queue_refuses_and_errors_keep_their_place() {
        let mut h = Handoff::new(Sum(0), "test-handoff", 2);
        h.push(5, true).unwrap();
        h.push(0, true).unwrap();
        assert!(h.push(1, true).is_err());
        assert_eq!(h.pop().unwrap().unwrap().0, 5);
        assert!(matches!(h.pop(), Some(Err(WalCodecError::Corrupt(_)))));
        assert!(h.pop().is_none());
        h.push(2, false).unwrap();
        assert_eq!(h.pop().unwrap().unwrap(), (7, false));
    }
}
