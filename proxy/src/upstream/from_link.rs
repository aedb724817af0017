//! Link → upstream: the downstream's frames of one stream, verified, dispatched to the
//! standbys' identities (open, commands, start, feedback, close) and to the feed (where the
//! spool is durable).

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;
use tonic::{Status, Streaming};
use tracing::{warn, Instrument};

use walrelay_proto::frame::{self, Digest, Feedback, Up, UpState, MAX_CONTROL_ITEM, SILENT_LIMIT};
use walrelay_proto::link::{to_upstream, Command, StandbyInfo, StartReplication, ToUpstream};
use walrelay_wal::lsn::Lsn;

use super::encode::Event;
use super::identity::{refuse, Identity, ToIdentity};
use super::Upstream;

/// A standby's identity as the stream holds it.
struct Channel {
    tx: mpsc::Sender<ToIdentity>,
    feedback: watch::Sender<[Option<Feedback>; 2]>,
    /// Refused for `limits.max_sessions`: answered with an error, no connection to the primary.
    refused: bool,
}

/// Where the downstream's spool is durable, as far as this stream may tell the primary (the
/// feed's flush position, which advances its slot and may release synchronous commits).
pub struct DurableReports {
    pub durable: watch::Sender<Lsn>,
    /// Where the WAL this stream sent down ends (from where the stream started).
    pub sent: watch::Receiver<Lsn>,
    /// The timeline the stream started on, after any switch the Welcome named.
    pub start_tli: u32,
}

impl DurableReports {
    /// The reports of a stream that starts at `from` on timeline `start_tli`, with the feed's
    /// side of them (where the spool is durable) and the encode stage's side of `sent`.
    ///
    /// The spool is durable nowhere (`Lsn(0)`, which tells the primary nothing: its slot
    /// stays and no synchronous commit returns) until the downstream's first report: the
    /// spool's end that its Hello stated (`from`) may still wait for an fsync, and a
    /// downstream that went down before it would need that WAL again.
    pub fn new(
        from: Lsn,
        start_tli: u32,
    ) -> (DurableReports, watch::Receiver<Lsn>, watch::Sender<Lsn>) {
        let (durable, durable_rx) = watch::channel(Lsn(0));
        let (sent_tx, sent) = watch::channel(from);
        let reports = DurableReports {
            durable,
            sent,
            start_tli,
        };
        (reports, durable_rx, sent_tx)
    }

    /// Takes the downstream's report that its spool is durable up to `end` on timeline `tli`.
    ///
    /// Never past what this stream sent: a downstream claiming more would let the slot drop
    /// WAL it lacks. And not of a timeline before the one the stream started on: when the
    /// spool went past the point where the primary's timeline forked off (a failover to a
    /// standby that was behind it), the downstream cuts its spool back to that point, and a
    /// report it made before the cut is of WAL the new timeline does not have.
    pub fn report(&self, tli: u32, end: u64) {
        if tli < self.start_tli {
            return;
        }
        let sent = *self.sent.borrow();
        self.durable.send_replace(Lsn(end).min(sent));
    }
}

/// The link → upstream direction of a stream.
pub struct LinkToUpstream {
    pub up: Arc<Upstream>,
    pub inbound: Streaming<ToUpstream>,
    pub state: UpState,
    pub durable: DurableReports,
    pub events: mpsc::Sender<Event>,
    pub synchronous: Arc<AtomicUsize>,
    channels: HashMap<u32, Channel>,
    /// Channels with an identity (not refused).
    identities: usize,
}

fn bad(what: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("link frame from the downstream: {what}"))
}

impl LinkToUpstream {
    pub fn new(
        up: Arc<Upstream>,
        inbound: Streaming<ToUpstream>,
        durable: DurableReports,
        events: mpsc::Sender<Event>,
        synchronous: Arc<AtomicUsize>,
    ) -> LinkToUpstream {
        LinkToUpstream {
            up,
            inbound,
            state: UpState::default(),
            durable,
            events,
            synchronous,
            channels: HashMap::new(),
            identities: 0,
        }
    }

    /// Runs until the downstream closes its side (Ok) or something is wrong (Err), including
    /// a downstream silent for [`SILENT_LIMIT`] (it sends at least every `ALIVE_EVERY`); the
    /// identities end with it (their channels close).
    pub async fn run(mut self) -> Result<(), Status> {
        loop {
            let Ok(next) = tokio::time::timeout(SILENT_LIMIT, self.inbound.next()).await else {
                return Err(Status::unavailable(format!(
                    "nothing from the downstream for {} s, though it sends at least every {} s: \
                     the link's stream is stalled (its framing lost?); ending it, the downstream \
                     opens a new one",
                    SILENT_LIMIT.as_secs(),
                    frame::ALIVE_EVERY.as_secs()
                )));
            };
            let Some(msg) = next else { break };
            let msg = msg.map_err(|s| Status::unavailable(format!("link: {}", s.message())))?;
            let Some(to_upstream::Msg::Frame(frame)) = msg.msg else {
                return Err(bad("expected a frame"));
            };
            let (items, sum) = self.state.parse(&frame, MAX_CONTROL_ITEM).map_err(bad)?;
            let mut digest = Digest::default();
            for item in &items {
                item.digest(&mut digest);
            }
            if digest.finish() != sum {
                return Err(Status::data_loss(
                    "a message from the downstream failed verification on the link and was not passed to the primary",
                ));
            }
            for item in items {
                self.dispatch(item).await?;
            }
        }
        Ok(())
    }

    async fn dispatch(&mut self, item: Up<'_>) -> Result<(), Status> {
        match item {
            Up::Open { chan, info } => {
                let info = StandbyInfo::decode(info).map_err(bad)?;
                self.open(chan, info)
            }
            Up::Command { chan, bytes } => {
                let c = Command::decode(bytes).map_err(bad)?;
                self.to(chan, ToIdentity::Command(c)).await
            }
            Up::Start { chan, cmd } => {
                let s = StartReplication::decode(cmd).map_err(bad)?;
                self.to(chan, ToIdentity::Start(s)).await
            }
            Up::Feedback { chan, msg } => {
                let ch = self.channel(chan)?;
                let i = usize::from(!msg.is_status());
                ch.feedback.send_modify(|f| f[i] = Some(msg));
                Ok(())
            }
            Up::Close { chan } => {
                if self.channels.remove(&chan).is_some_and(|c| !c.refused) {
                    self.identities -= 1;
                }
                Ok(())
            }
            Up::Durable { tli, end } => {
                self.durable.report(tli, end);
                Ok(())
            }
            Up::Alive => Ok(()),
        }
    }

    fn channel(&self, chan: u32) -> Result<&Channel, Status> {
        self.channels
            .get(&chan)
            .ok_or_else(|| bad(format!("channel {chan} is not open")))
    }

    async fn to(&mut self, chan: u32, m: ToIdentity) -> Result<(), Status> {
        let tx = self.channel(chan)?.tx.clone();
        // The identity ends only with its channel; a closed sender means it failed for good.
        let _ = tx.send(m).await;
        Ok(())
    }

    fn open(&mut self, chan: u32, info: StandbyInfo) -> Result<(), Status> {
        if self.channels.contains_key(&chan) {
            return Err(bad(format!("channel {chan} opened twice")));
        }
        let max = self.up.limits.max_sessions;
        let (tx, rx) = mpsc::channel(4);
        let (feedback, feedback_rx) = watch::channel([None, None]);
        let refused = self.identities >= max;
        if refused {
            // One standby too many is refused on its own; the stream and the other standbys
            // go on. Only a downstream with as many refused as served ends the stream.
            if self.channels.len() >= max.saturating_mul(2) {
                return Err(Status::resource_exhausted(format!(
                    "the downstream keeps opening standbys past the upstream's limits.max_sessions ({max})"
                )));
            }
            warn!(application_name = %info.application_name, standby = %info.addr, "standby refused: this downstream's standbys already hold the upstream's limits.max_sessions ({max})");
            let events = self.events.clone();
            self.up.tasks.spawn(refuse(chan, rx, events, max));
        } else {
            let span = tracing::info_span!("standby_identity", application_name = %info.application_name, standby = %info.addr);
            let identity = Identity {
                up: self.up.clone(),
                chan,
                info,
                rx,
                feedback: feedback_rx,
                events: self.events.clone(),
                synchronous: self.synchronous.clone(),
                sent: self.durable.sent.clone(),
            };
            self.up.tasks.spawn(identity.run().instrument(span));
            self.identities += 1;
        }
        let channel = Channel {
            tx,
            feedback,
            refused,
        };
        self.channels.insert(chan, channel);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_durable_before_the_downstream_says_so() {
        // The Hello's spool end may not be fsynced yet: not a position to tell the primary.
        let (r, durable, sent) = DurableReports::new(Lsn(0x5000000), 1);
        assert_eq!(*durable.borrow(), Lsn(0));
        r.report(1, 0x4800000);
        assert_eq!(*durable.borrow(), Lsn(0x4800000));
        // Never past what the stream sent (from where it started until it sends more).
        r.report(1, 0x5800000);
        assert_eq!(*durable.borrow(), Lsn(0x5000000));
        sent.send_replace(Lsn(0x6000000));
        r.report(1, 0x5800000);
        assert_eq!(*durable.borrow(), Lsn(0x5800000));
    }

    #[test]
    fn a_durable_report_never_passes_what_was_sent_nor_comes_from_an_earlier_timeline() {
        let (durable, durable_rx) = watch::channel(Lsn(1000));
        let (sent_tx, sent) = watch::channel(Lsn(1000));
        let r = DurableReports {
            durable,
            sent,
            start_tli: 2,
        };
        // The spool's end on timeline 1, past the fork at 1000: not taken.
        r.report(1, 5000);
        assert_eq!(*durable_rx.borrow(), Lsn(1000));
        // On timeline 2, within what was sent.
        sent_tx.send_replace(Lsn(3000));
        r.report(2, 2000);
        assert_eq!(*durable_rx.borrow(), Lsn(2000));
        // Claiming more than was sent: cut to it.
        r.report(2, 9000);
        assert_eq!(*durable_rx.borrow(), Lsn(3000));
        // A later timeline (the stream followed the primary onto it): taken.
        r.report(3, 2500);
        assert_eq!(*durable_rx.borrow(), Lsn(2500));
    }
}
