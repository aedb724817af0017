//! One half of a message's work on a thread of its own, its state travelling with it.
//!
//! Both ends split a message's work in two: the encoder transforms records, then compresses
//! the streams ([`super::encoder`]'s sealer); the decoder decompresses the sections, then
//! restores the records ([`super::decoder`]'s unpacker). The zstd contexts of the
//! (de)compressing half carry history from message to message, so that half must see the
//! messages in order, one at a time. A [`Handoff`] runs it for a queue of messages:
//!
//! - **here**, at once ([`Handoff::push`] with `away` false), when its state is here;
//! - **on the thread** (started when first needed) when `away`: the state ([`Work`]) goes to
//!   the thread with the job and comes back with the outcome, so it is never used by two
//!   threads and sees the jobs in order; the outcome is the same wherever it was made;
//! - **later**, when the state is away with the job before: the job waits here and goes to
//!   the thread as soon as the state comes back ([`Handoff::pop`]).
//!
//! [`Handoff::pop`] returns the outcomes oldest first. At most `max` jobs are queued and not
//! popped; [`Handoff::push`] refuses one more. One job at a time is on the thread.

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
    /// Waiting for the state (away with the job before).
    Waiting(W::Job),
    /// On the thread.
    Away,
    Done(Outcome<W>),
}

pub(crate) struct Handoff<W: Work> {
    /// The state when here (`None` while away with a job, or lost with the thread).
    home: Option<Box<W>>,
    /// Jobs not popped yet, oldest first; at most one `Away`, `Waiting` ones only after it.
    slots: VecDeque<Slot<W>>,
    thread: Option<Thread<W>>,
    name: &'static str,
    max: usize,
}

struct Thread<W: Work> {
    jobs: Option<mpsc::SyncSender<(Box<W>, W::Job)>>,
    done: mpsc::Receiver<(Box<W>, Outcome<W>)>,
    handle: Option<JoinHandle<()>>,
}

impl<W: Work> Handoff<W> {
    /// `name`: the thread's; `max`: most jobs queued.
    pub fn new(state: W, name: &'static str, max: usize) -> Handoff<W> {
        Handoff {
            home: Some(Box::new(state)),
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

    /// The state, when it is here.
    pub fn home(&mut self) -> Option<&mut W> {
        self.home.as_deref_mut()
    }

    /// Takes a job: run here now, or on the thread when `away`, or later (see the module
    /// doc). Refused when `max` jobs are queued.
    pub fn push(&mut self, job: W::Job, away: bool) -> Result<(), WalCodecError> {
        if self.slots.len() >= self.max {
            return Err(WalCodecError::Params(format!(
                "{} messages are staged already: take one before staging another",
                self.max
            )));
        }
        let Some(mut state) = self.home.take() else {
            self.slots.push_back(Slot::Waiting(job));
            return Ok(());
        };
        if away {
            self.ship(state, job)?;
            self.slots.push_back(Slot::Away);
        } else {
            let r = state.run(job, false);
            self.home = Some(state);
            self.slots.push_back(Slot::Done(r));
        }
        Ok(())
    }

    /// The oldest job's outcome (waits for the thread if it is there); `None` when nothing
    /// is queued.
    pub fn pop(&mut self) -> Option<Outcome<W>> {
        let r = match self.slots.pop_front()? {
            Slot::Done(r) => r,
            Slot::Away => self.receive(),
            Slot::Waiting(job) => match self.home.as_mut() {
                Some(state) => state.run(job, false),
                None => Err(self.stopped()),
            },
        };
        // The next job waited for the state, which is back now (else the thread is gone and
        // the job waits on, to fail when popped).
        if matches!(self.slots.front(), Some(Slot::Waiting(_))) {
            if let Some(state) = self.home.take() {
                if let Some(Slot::Waiting(job)) = self.slots.pop_front() {
                    let slot = match self.ship(state, job) {
                        Ok(()) => Slot::Away,
                        Err(e) => Slot::Done(Err(e)),
                    };
                    self.slots.push_front(slot);
                }
            }
        }
        Some(r)
    }

    /// Sends the state and `job` to the thread (started if need be).
    fn ship(&mut self, state: Box<W>, job: W::Job) -> Result<(), WalCodecError> {
        if self.thread.is_none() {
            self.thread = Some(Thread::start(self.name)?);
        }
        let sent = self
            .thread
            .as_ref()
            .and_then(|t| t.jobs.as_ref())
            .is_some_and(|j| j.send((state, job)).is_ok());
        if sent {
            Ok(())
        } else {
            Err(self.stopped())
        }
    }

    /// The thread's outcome; the state comes home with it.
    fn receive(&mut self) -> Outcome<W> {
        let got = self.thread.as_mut().and_then(|t| t.done.recv().ok());
        let Some((state, r)) = got else {
            return Err(self.stopped());
        };
        self.home = Some(state);
        r
    }

    fn stopped(&self) -> WalCodecError {
        WalCodecError::Zstd(format!(
            "the {} thread stopped (the session's zstd contexts are lost)",
            self.name
        ))
    }
}

impl<W: Work> Thread<W> {
    fn start(name: &'static str) -> Result<Thread<W>, WalCodecError> {
        // One job at a time: the handoff ships the next only once the state came back.
        let (jobs, queue) = mpsc::sync_channel::<(Box<W>, W::Job)>(1);
        let (done_tx, done) = mpsc::sync_channel(1);
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                for (mut state, job) in queue {
                    let r = state.run(job, true);
                    if done_tx.send((state, r)).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| WalCodecError::Zstd(format!("cannot start the {name} thread: {e}")))?;
        Ok(Thread {
            jobs: Some(jobs),
            done,
            handle: Some(handle),
        })
    }
}

impl<W: Work> Drop for Thread<W> {
    fn drop(&mut self) {
        // Closing the queue ends the thread once its job (at most one) is done.
        self.jobs = None;
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
