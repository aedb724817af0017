//! Link → primary: what the downstream sends for one session — validated replication commands,
//! the standby's feedback, CopyDone — restored from link frames, verified, and written to the
//! primary, so `pg_stat_replication` and synchronous replication reflect the real standby.

use bytes::BytesMut;
use prost::Message;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio_stream::StreamExt;
use tonic::{Status, Streaming};

use walrelay_pgwire::encode;
use walrelay_pgwire::repl::{check_feedback, status_positions};
use walrelay_pgwire::replcmd::ReplCommand;
use walrelay_proto::frame::{Digest, UpItem, UpState};
use walrelay_proto::link::{to_upstream, Command, ToUpstream};

use crate::link;
use crate::monitor::standbys::StandbyHandle;

/// Largest command on the link (a protobuf `Command`: a slot name and a few numbers).
const MAX_COMMAND: usize = 4096;

/// The link → primary direction of one session.
pub struct LinkToPrimary<'a, W> {
    pub inbound: Streaming<ToUpstream>,
    pub writer: W,
    /// Slot for a START_REPLICATION that names none (`upstream.slot`).
    pub default_slot: Option<&'a str>,
    pub standby: &'a StandbyHandle,
    pub state: UpState,
}

impl<W: AsyncWrite + Unpin> LinkToPrimary<'_, W> {
    /// Runs until the downstream closes its side (Ok) or something is wrong (Err).
    pub async fn run(mut self) -> Result<(), Status> {
        let mut out = BytesMut::new();
        while let Some(msg) = self.inbound.next().await {
            let msg = msg.map_err(|s| Status::unavailable(format!("link: {}", s.message())))?;
            let frame = match msg.msg {
                Some(to_upstream::Msg::Frame(f)) => f,
                _ => {
                    return Err(Status::invalid_argument(
                        "unexpected message on the link session",
                    ))
                }
            };
            out.clear();
            self.restore(&frame, &mut out)?;
            self.writer
                .write_all(&out)
                .await
                .map_err(|e| Status::unavailable(format!("writing to the primary: {e}")))?;
        }
        // The downstream closed its side; the session tells the primary.
        Ok(())
    }

    /// Restores and verifies one frame into the messages for the primary (nothing of a frame
    /// that fails verification is written).
    fn restore(&mut self, frame: &[u8], out: &mut BytesMut) -> Result<(), Status> {
        let (items, sum) = self
            .state
            .parse(frame, MAX_COMMAND)
            .map_err(|e| Status::invalid_argument(format!("link frame: {e}")))?;
        let mut digest = Digest::default();
        for item in &items {
            digest.up(item);
        }
        if digest.finish() != sum {
            return Err(Status::data_loss(
                "a message from the standby failed verification on the link and was not passed to the primary",
            ));
        }
        for item in &items {
            match item {
                UpItem::Feedback(..) => {
                    let b = item.feedback().unwrap_or_default();
                    check_feedback(b).map_err(|e| Status::invalid_argument(e.to_string()))?;
                    if let Some((w, f, r)) = status_positions(b) {
                        self.standby.reply(w, f, r);
                    }
                    encode::copy_data(out, b);
                }
                UpItem::Command(c) => {
                    let c = Command::decode(*c).map_err(|e| {
                        Status::invalid_argument(format!("undecodable command on the link: {e}"))
                    })?;
                    let cmd = link::command_from_proto(c, self.default_slot)?;
                    if let ReplCommand::StartReplication { slot, .. } = &cmd {
                        self.standby.set_slot(slot.as_deref());
                    }
                    encode::query(out, &cmd.to_sql());
                }
                UpItem::CopyDone => encode::copy_done(out),
            }
        }
        Ok(())
    }
}
