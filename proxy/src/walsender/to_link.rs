//! Standby → link: commands validated and sent structured, feedback compact and coalesced.
//!
//! A standby sends a status update after every write and every flush (and hot-standby
//! feedback when it is on). For a standby no commit waits on, the latest update of each kind
//! waits up to the session's window (`link.batch_window_ms`) and only the latest goes: the
//! primary ends with exactly the standby's latest positions. Feedback goes at once when the
//! session has no window (a standby `synchronous_standby_names` lists), when the standby asks
//! the primary for a reply, right after the primary asked the standby for one, and ahead of a
//! command, CopyDone or the standby leaving.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use prost::Message;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tracing::debug;

use walrelay_pgwire::repl::{check_feedback, status_positions};
use walrelay_pgwire::{encode, replcmd, ErrorFields, FrontendMsg, WireError};
use walrelay_proto::frame::{self, Digest, UpItem, UpState, STATUS_LEN};
use walrelay_proto::link::{to_upstream, ToUpstream};

use super::{End, Reader};
use crate::link;
use crate::metrics::Metrics;
use crate::monitor::standbys::StandbyHandle;

/// The standby → link direction of one session.
pub struct StandbyToLink<'a> {
    pub reader: &'a mut Reader,
    pub ltx: mpsc::Sender<ToUpstream>,
    /// Local answers for the standby (refused commands), through the link → standby task.
    pub local: mpsc::Sender<Bytes>,
    /// One permit per command answered: commands are served strictly in turn.
    pub turns: &'a Semaphore,
    pub entry: &'a StandbyHandle,
    pub metrics: &'a Metrics,
    /// How long feedback may wait for newer feedback (zero: never).
    pub window: Duration,
    /// Set by the other direction when the primary asked for a reply.
    pub reply_wanted: &'a AtomicBool,
    pub state: UpState,
    /// The latest status update and hot-standby feedback not yet sent, and until when they
    /// may wait.
    pub status: Option<Vec<u8>>,
    pub hs: Option<Vec<u8>>,
    pub deadline: Option<Instant>,
}

/// What to send after the pending feedback.
enum Then {
    Nothing,
    Command(Vec<u8>),
    CopyDone,
}

impl StandbyToLink<'_> {
    /// Runs until the standby leaves (Quiet), the link goes away (Quiet: the other direction
    /// knows why) or the standby breaks the protocol.
    pub async fn run(mut self) -> End {
        // Wait for the answer to the previous command before reading the next message.
        let mut awaiting = false;
        loop {
            if std::mem::take(&mut awaiting) {
                match self.turns.acquire().await {
                    Ok(p) => p.forget(),
                    Err(_) => return End::Quiet,
                }
            }
            let msg = tokio::select! {
                m = self.reader.read(walrelay_pgwire::parse_frontend) => m,
                _ = sleep_until(self.deadline), if self.deadline.is_some() => {
                    if self.send(Then::Nothing).await.is_err() {
                        return End::Quiet;
                    }
                    continue;
                }
            };
            let msg = match msg {
                Ok(m) => m,
                Err(WireError::Closed) => return self.leave().await,
                Err(WireError::Io(e)) => {
                    debug!("standby socket: {e}");
                    return self.leave().await;
                }
                Err(e) => {
                    return End::fatal("08P01", format!("invalid message from the standby: {e}"))
                }
            };
            match self.handle(msg, &mut awaiting).await {
                Ok(()) => {}
                Err(end) => return end,
            }
        }
    }

    /// One message of the standby.
    async fn handle(&mut self, msg: FrontendMsg, awaiting: &mut bool) -> Result<(), End> {
        let gone = |_| End::Quiet; // the other direction reports why
        match msg {
            FrontendMsg::Query(q) => {
                *awaiting = true;
                match replcmd::parse(&q) {
                    Ok(cmd) => {
                        debug!(command = %q.trim(), "relaying replication command");
                        if let replcmd::ReplCommand::StartReplication { slot, .. } = &cmd {
                            self.entry.set_slot(slot.as_deref());
                        }
                        let c = link::command_to_proto(&cmd).encode_to_vec();
                        self.send(Then::Command(c)).await.map_err(gone)
                    }
                    Err(e) => self.refuse(e).await,
                }
            }
            FrontendMsg::CopyData(d) => self.feedback(d).await,
            FrontendMsg::CopyDone => {
                *awaiting = true; // the primary ends the command with ReadyForQuery
                self.send(Then::CopyDone).await.map_err(gone)
            }
            FrontendMsg::Terminate => Err(self.leave().await),
            FrontendMsg::CopyFail(why) => Err(End::fatal("57014", format!("COPY failed: {why}"))),
            FrontendMsg::Password(_) => Err(End::fatal(
                "08P01",
                "unexpected password message after authentication",
            )),
            FrontendMsg::Other(tag) => Err(End::fatal(
                "08P01",
                format!("unexpected message type '{}' (walrelay serves the replication protocol's simple queries only)", tag.escape_ascii()),
            )),
        }
    }

    /// A command walrelay does not relay: answered here.
    async fn refuse(&mut self, e: replcmd::ReplCmdError) -> Result<(), End> {
        let mut out = BytesMut::new();
        match e {
            replcmd::ReplCmdError::Empty => encode::tagged(&mut out, b'I', |_| {}),
            replcmd::ReplCmdError::Unsupported(_) => {
                encode::error_response(&mut out, &ErrorFields::error("0A000", e.to_string()))
            }
            _ => encode::error_response(&mut out, &ErrorFields::error("42601", e.to_string())),
        }
        encode::ready_for_query(&mut out);
        self.local.send(out.freeze()).await.map_err(|_| End::Quiet)
    }

    /// A status update or hot-standby feedback: kept as the latest of its kind, sent now or
    /// when the window closes.
    async fn feedback(&mut self, d: Bytes) -> Result<(), End> {
        if let Err(e) = check_feedback(&d) {
            return Err(End::fatal(
                "08P01",
                format!("invalid message from the standby: {e}"),
            ));
        }
        if let Some((w, f, r)) = status_positions(&d) {
            self.entry.reply(w, f, r);
        }
        // The standby asks the primary for a reply (last byte of a status update).
        let asks = d[0] == b'r' && d.len() == STATUS_LEN && d[STATUS_LEN - 1] != 0;
        match d[0] {
            b'r' => self.status = Some(d.to_vec()),
            _ => self.hs = Some(d.to_vec()),
        }
        let urgent =
            self.window.is_zero() || asks || self.reply_wanted.swap(false, Ordering::Relaxed);
        if urgent {
            return self.send(Then::Nothing).await.map_err(|_| End::Quiet);
        }
        if self.deadline.is_none() {
            self.deadline = Some(Instant::now() + self.window);
        }
        Ok(())
    }

    /// The standby left: its latest feedback still reaches the primary.
    async fn leave(&mut self) -> End {
        if self.status.is_some() || self.hs.is_some() {
            let _ = self.send(Then::Nothing).await;
        }
        End::Quiet
    }

    /// Sends the pending feedback, then `then`, as one frame (nothing when there is nothing).
    async fn send(&mut self, then: Then) -> Result<(), ()> {
        self.deadline = None;
        let (mut out, mut digest) = (Vec::new(), Digest::default());
        for fb in [self.status.take(), self.hs.take()].into_iter().flatten() {
            self.state.put_feedback(&mut out, &fb).map_err(|_| ())?;
            let mut b = [0u8; STATUS_LEN];
            b[..fb.len()].copy_from_slice(&fb);
            digest.up(&UpItem::Feedback(b, fb.len()));
        }
        match &then {
            Then::Nothing => {}
            Then::Command(c) => {
                frame::put_command(&mut out, c);
                digest.up(&UpItem::Command(c));
            }
            Then::CopyDone => {
                frame::put_copy_done(&mut out);
                digest.up(&UpItem::CopyDone);
            }
        }
        if out.is_empty() {
            return Ok(());
        }
        frame::finish(&mut out, &digest);
        Metrics::add(&self.metrics.ops.link_messages_out_downstream, 1);
        self.ltx
            .send(ToUpstream {
                msg: Some(to_upstream::Msg::Frame(out.into())),
            })
            .await
            .map_err(|_| ())
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
