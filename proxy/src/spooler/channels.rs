//! The standbys' channels as the spooler holds them: what goes up for each (OPEN, commands,
//! START, feedback, CLOSE) and what must be opened again after the link comes back.
//!
//! Invariants: a channel is in `open` from the session's start until its CLOSE went up (or,
//! when the upstream never heard of it, until the session ends); `queue` holds items only
//! for channels in `open`, plus their CLOSE. So after a reconnect exactly the live sessions'
//! channels are opened again, and what a link outage holds is bounded by the sessions.

use std::collections::HashMap;
use std::time::Instant;

use tokio::sync::mpsc;

use walrelay_proto::frame::{Feedback, MAX_CHANNELS};
use walrelay_proto::link::{Command, StandbyInfo, StartReplication};

use super::ChanEvent;

/// An item for the upstream, in order.
#[derive(Debug, Clone)]
pub(crate) enum Out {
    Open(u32, StandbyInfo),
    Command(u32, Command),
    Start(u32, StartReplication),
    Close(u32),
}

impl Out {
    fn chan(&self) -> u32 {
        match self {
            Out::Open(c, _) | Out::Command(c, _) | Out::Start(c, _) | Out::Close(c) => *c,
        }
    }
}

/// A standby's channel (to open it again after a reconnect).
pub(crate) struct Chan {
    pub events: mpsc::Sender<ChanEvent>,
    pub info: StandbyInfo,
    pub start: Option<StartReplication>,
    /// Latest feedback not yet sent ([status, hot-standby]), and until when it may wait.
    pub pending: [Option<Feedback>; 2],
    pub due: Option<Instant>,
    /// Latest feedback sent (sent again after a reconnect).
    pub last: [Option<Feedback>; 2],
    pub synchronous: bool,
}

#[derive(Default)]
pub(crate) struct Channels {
    next: u32,
    pub open: HashMap<u32, Chan>,
    /// Control items waiting for the stream.
    pub queue: Vec<Out>,
}

impl Channels {
    /// A new channel, its OPEN queued; None when all [`MAX_CHANNELS`] ids are in use.
    pub fn open(&mut self, info: StandbyInfo, events: mpsc::Sender<ChanEvent>) -> Option<u32> {
        let chan = (0..MAX_CHANNELS)
            .map(|i| (self.next + i) % MAX_CHANNELS)
            .find(|c| !self.open.contains_key(c))?;
        self.next = (chan + 1) % MAX_CHANNELS;
        self.queue.push(Out::Open(chan, info.clone()));
        let chan_state = Chan {
            events,
            info,
            start: None,
            pending: [None, None],
            due: None,
            last: [None, None],
            synchronous: false,
        };
        self.open.insert(chan, chan_state);
        Some(chan)
    }

    /// The standby left. A channel whose OPEN has not gone up is forgotten with everything
    /// queued for it (the upstream never heard of it); otherwise its latest feedback goes,
    /// then its CLOSE.
    pub fn close(&mut self, chan: u32, now: Instant) {
        if !self.open.contains_key(&chan) {
            return;
        }
        let unsent = self
            .queue
            .iter()
            .any(|o| matches!(o, Out::Open(c, _) if *c == chan));
        if unsent {
            self.queue.retain(|o| o.chan() != chan);
            self.open.remove(&chan);
            return;
        }
        if let Some(c) = self.open.get_mut(&chan) {
            c.due = Some(now);
        }
        self.queue.push(Out::Close(chan));
    }

    /// The standby started streaming from `s`: remembered for a reconnect, and its START
    /// queued in place of one still waiting (only the latest counts), so that a standby
    /// starting again and again while the link is down queues one.
    pub fn start(&mut self, chan: u32, s: StartReplication) {
        let Some(c) = self.open.get_mut(&chan) else {
            return;
        };
        c.start = Some(s.clone());
        self.queue
            .retain(|o| !matches!(o, Out::Start(c, _) if *c == chan));
        self.queue.push(Out::Start(chan, s));
    }

    /// The standby's feedback `f` waits in its channel until `due`: `now` if it is `urgent`
    /// (or the standby is synchronous, or there is no window), else the end of the window
    /// its channel's earliest waiting feedback opened. True when the send loop must be
    /// woken to see it: the channel had nothing due, or is due earlier now. A later feedback
    /// within an open window only replaces what waits, and the loop, already sleeping until
    /// that window's end (or about to read it, having been woken when it opened), sends the
    /// latest then: no wake-up of its own, where a standby replies twice (written, flushed)
    /// to each message.
    pub fn feedback(
        &mut self,
        chan: u32,
        f: Feedback,
        urgent: bool,
        window: std::time::Duration,
        now: Instant,
    ) -> bool {
        let Some(c) = self.open.get_mut(&chan) else {
            return false;
        };
        c.pending[usize::from(!f.is_status())] = Some(f);
        let due = match urgent || c.synchronous || window.is_zero() {
            true => now,
            false => c.due.unwrap_or(now + window),
        };
        let wake = c.due.is_none_or(|d| due < d);
        c.due = Some(c.due.map_or(due, |d| d.min(due)));
        wake
    }

    /// The link went down: the items queued for it will not go (the next stream opens every
    /// channel again), except CLOSEs, which [`Channels::reopen`] applies.
    pub fn link_down(&mut self) {
        self.queue.retain(|o| matches!(o, Out::Close(_)));
    }

    /// After a (re)connect: the channels closed meanwhile are gone; every other one is
    /// opened again, started again if it was, and its latest feedback goes again. A command
    /// queued since the stream came up (sessions queue one only while the link is up, so
    /// between the Welcome and this call) goes after its channel's OPEN, not lost.
    pub fn reopen(&mut self, now: Instant) {
        let mut commands = Vec::new();
        for o in std::mem::take(&mut self.queue) {
            match o {
                Out::Close(chan) => {
                    self.open.remove(&chan);
                }
                o @ Out::Command(..) => commands.push(o),
                Out::Open(..) | Out::Start(..) => {}
            }
        }
        let mut chans: Vec<u32> = self.open.keys().copied().collect();
        chans.sort_unstable();
        let mut queue = Vec::new();
        for chan in chans {
            let Some(c) = self.open.get_mut(&chan) else {
                continue;
            };
            queue.push(Out::Open(chan, c.info.clone()));
            if let Some(s) = &c.start {
                queue.push(Out::Start(chan, s.clone()));
            }
            for i in 0..2 {
                c.pending[i] = c.pending[i].or(c.last[i]);
            }
            if c.pending.iter().any(Option::is_some) {
                c.due = Some(now);
            }
        }
        queue.extend(
            commands
                .into_iter()
                .filter(|o| self.open.contains_key(&o.chan())),
        );
        self.queue = queue;
    }
}

#[cfg(test)]
mod tests;
