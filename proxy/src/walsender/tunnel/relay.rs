//! The two directions of a tunnelled session, relayed concurrently.
//!
//! A PostgreSQL backend does not read its socket while it is blocked sending results, and a
//! client that pipelines (libpq's pipeline mode, pgbench's `\startpipeline`) sends queries
//! while the answers to earlier ones are still coming. If writing in one direction stopped
//! the reading of the other, such a session would leave every party on the way waiting on
//! another for ever. So each direction waits only for itself: the client's socket is written
//! by a future of its own (polled alongside the loop, fed through a short queue); the link's
//! queue toward the upstream is entered only when it has room; and the loop reads the client
//! while the primary's answers wait for the client, and the upstream while the client's
//! messages wait for the link. A direction whose writer is blocked stops reading its own
//! source (backpressure), so memory stays bounded: one client message staged (`up_out`),
//! one frame's bytes and one refusal staged for the client (`client_out`), and
//! [`CLIENT_QUEUE`] chunk queued for its socket besides the one being written.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tonic::Streaming;
use tracing::{info, warn};

use walrelay_pgwire::scan::Seen;
use walrelay_pgwire::{encode, parse_tagged, RawMsg, WireError};
use walrelay_proto::frame::TunnelItem;
use walrelay_proto::link::TunnelFrame;

use super::{tunnel_gone, TunnelSession};
use crate::metrics::Metrics;
use crate::walsender::{shutting_down, End, Writer};

/// Chunks (each at most one link frame's bytes) queued for the client's socket while it
/// writes another: one keeps it busy.
const CLIENT_QUEUE: usize = 1;
/// How long what the client is still owed when the tunnel ends (the primary's last answers,
/// then the reason it ends) may take to be written; a client that does not read it by then
/// is closed without it.
const DRAIN: Duration = Duration::from_secs(10);

impl TunnelSession<'_> {
    /// Relays both directions until either side ends, then writes what the client is still
    /// owed (`writer`: its socket): as a backend would have, which writes its answers before
    /// it reads the client's next message (a Terminate, or the end of a client that only
    /// closed its sending side).
    pub(super) async fn relay(
        &mut self,
        mut inbound: Streaming<TunnelFrame>,
        out: &mpsc::Sender<TunnelFrame>,
        writer: &mut Writer,
    ) -> End {
        let (to_client, queued) = mpsc::channel(CLIENT_QUEUE);
        let socket = write_client(writer, queued);
        tokio::pin!(socket);
        let end = tokio::select! {
            end = self.exchange(&mut inbound, out, &to_client) => end,
            // The client's socket failed: it is gone.
            _ = &mut socket => return End::Quiet,
        };
        let rest = self.client_out.split().freeze();
        let last = async move {
            if !rest.is_empty() {
                let _ = to_client.send(rest).await;
            }
            // `to_client` dropped here: the writer ends once it has written everything.
        };
        match tokio::time::timeout(DRAIN, async { tokio::join!(last, socket).1 }).await {
            // The client got part of one of the primary's messages (a link frame ends
            // anywhere): an ErrorResponse after it would be read as the rest of it.
            Ok(Ok(())) if !self.scanner.at_boundary() => {
                if let End::Fatal(e) = &end {
                    warn!("tunnel ended inside one of the primary's messages, so the client only sees its connection close: {}", e.message);
                }
                End::Quiet
            }
            Ok(Ok(())) => end,
            // Cut or failed mid-message: nothing more may follow it.
            _ => End::Quiet,
        }
    }

    /// The loop of both directions. Each arm only takes what is ready and stages what it
    /// produces; the arms that hand staged bytes on wait for room, each only in its own
    /// direction.
    async fn exchange(
        &mut self,
        inbound: &mut Streaming<TunnelFrame>,
        out: &mpsc::Sender<TunnelFrame>,
        to_client: &mpsc::Sender<Bytes>,
    ) -> End {
        let cap = self.ds.limits.max_message_bytes;
        loop {
            // A refusal joins the client's bytes only when none wait (see `answer_held`).
            if self.client_out.is_empty() {
                self.answer_held();
            }
            let read_client = self.up_out.is_none() && (self.held.is_none() || self.skip_to_sync);
            tokio::select! {
                room = to_client.reserve(), if !self.client_out.is_empty() => match room {
                    Ok(room) => room.send(self.client_out.split().freeze()),
                    Err(_) => return End::Quiet,
                },
                room = out.reserve(), if self.up_out.is_some() => match (room, self.up_out.take()) {
                    (Ok(room), Some(frame)) => room.send(frame),
                    _ => return tunnel_gone(),
                },
                m = self.reader.read(|b| parse_tagged(b, |_| cap)), if read_client => {
                    let m = match m {
                        Ok(m) => m,
                        Err(WireError::Closed | WireError::Io(_)) => return self.leave(out, "the client left").await,
                        Err(e) => return End::fatal("08P01", format!("invalid message from the client: {e}")),
                    };
                    if let Err(end) = self.client_message(out, m).await {
                        return end;
                    }
                }
                f = inbound.message(), if self.client_out.is_empty() => match f {
                    Ok(Some(f)) => if let Err(end) = self.primary_frame(&f.frame) {
                        return end;
                    },
                    Ok(None) => return End::fatal("08006", "walrelay: the tunnel to the primary ended (the link to the upstream was lost); try again"),
                    Err(s) => return End::fatal("08006", format!("walrelay: the link to the upstream failed: {}; try again", s.message())),
                },
                _ = self.ds.shutdown.cancelled() => {
                    let _ = self.leave(out, "walrelay is shutting down").await;
                    return shutting_down();
                }
            }
        }
    }

    /// One message from the client: staged for the upstream, or refused (the refusal is
    /// answered by `answer_held` in its turn). Only the client's END waits for the link.
    async fn client_message(
        &mut self,
        out: &mpsc::Sender<TunnelFrame>,
        m: RawMsg,
    ) -> Result<(), End> {
        if self.skip_to_sync {
            return match m.tag {
                b'S' => {
                    self.skip_to_sync = false;
                    Ok(())
                }
                b'X' => Err(self.leave(out, "").await),
                _ => Ok(()),
            };
        }
        match self.policy.check(m.tag, &m.body) {
            Ok(passed) => {
                let m = match (m.tag, self.watch.clamp(&m.body)) {
                    (b'd', Some(lowered)) => RawMsg {
                        tag: b'd',
                        body: lowered.into(),
                    },
                    _ => m,
                };
                self.forward(&m, passed)?;
                if m.tag == b'X' {
                    return Err(self.leave(out, "").await);
                }
                Ok(())
            }
            Err(e) if e.severity == "FATAL" => Err(End::Fatal(e)),
            Err(e) => {
                Metrics::add(&self.ds.metrics.tunnel_refused, 1);
                warn!(tag = %(m.tag as char), "tunnel: refused a client message: {}", e.message);
                self.held = Some(e);
                self.skip_to_sync = m.tag != b'Q';
                Ok(())
            }
        }
    }

    /// A frame from the primary: staged for the client as it is.
    fn primary_frame(&mut self, frame: &[u8]) -> Result<(), End> {
        let items = self.rx.parse(frame).map_err(|e| {
            End::fatal(
                "08006",
                format!("walrelay: a tunnel frame from the upstream failed verification: {e}"),
            )
        })?;
        for it in items {
            match it {
                TunnelItem::Data(d) => {
                    self.watch_primary(&d)?;
                    if let [.., b'Z', 0, 0, 0, 5, st] = d[..] {
                        self.status = st;
                    }
                    self.client_out.extend_from_slice(&d);
                    self.progress.down += d.len() as u64;
                    Metrics::add(
                        &self.ds.metrics.tunnel_bytes_from_primary[1],
                        d.len() as u64,
                    );
                    self.progress.tick();
                    self.answer_held();
                }
                TunnelItem::End(why) => {
                    if why.is_empty() {
                        return Err(End::Quiet);
                    }
                    info!("tunnel: {why}");
                    // The upstream's reason reaches the client, as a backend's FATAL would
                    // (`relay` drops it where the frame cut one of the primary's messages).
                    return Err(End::fatal(
                        "08006",
                        format!("walrelay: the tunnel to the primary ended: {why}"),
                    ));
                }
                TunnelItem::Open(_) => {
                    return Err(End::fatal(
                        "08P01",
                        "walrelay: unexpected T_OPEN from the upstream",
                    ))
                }
            }
        }
        Ok(())
    }

    /// Follows the primary's messages in `d`: the answers counted, what `watch` learns.
    fn watch_primary(&mut self, d: &[u8]) -> Result<(), End> {
        let (watch, policy, answers) = (&mut self.watch, &mut self.policy, &mut self.answers);
        self.scanner
            .feed_seen(d, |s| match s {
                Seen::Start(t) => {
                    answers.primary_sent(t);
                    if let Some(slot) = watch.tag(t, answers.answered()) {
                        policy.temp_slot_created(slot);
                    }
                }
                Seen::Head { tag, head, len } => watch.head(tag, head, len),
            })
            .map_err(|e| {
                End::fatal(
                    "08P01",
                    format!("walrelay: the primary's messages are malformed: {e}"),
                )
            })
    }

    /// Stages a held refusal for the client once everything sent before it has been
    /// answered: after the primary's bytes staged so far, so the client gets the answers in
    /// the order of its messages. Called after each of the primary's frames, and otherwise
    /// only when nothing waits for the client, so refusals do not pile up for a client that
    /// does not read (the client is not read while one is held).
    fn answer_held(&mut self) {
        // Also not inside one of the primary's messages (a frame can end within its
        // ReadyForQuery): the next frame answers.
        if self.answers.pending() || self.skip_to_sync || !self.scanner.at_boundary() {
            return;
        }
        let Some(e) = self.held.take() else {
            return;
        };
        encode::error_response(&mut self.client_out, &e);
        let status = self.status;
        encode::tagged(&mut self.client_out, b'Z', |b| {
            b.extend_from_slice(&[status])
        });
    }
}

/// Writes the client's bytes in the order queued, until the queue closes (Ok: all written)
/// or the socket fails.
async fn write_client(
    writer: &mut Writer,
    mut queued: mpsc::Receiver<Bytes>,
) -> std::io::Result<()> {
    while let Some(b) = queued.recv().await {
        writer.write_all(&b).await?;
    }
    Ok(())
}
