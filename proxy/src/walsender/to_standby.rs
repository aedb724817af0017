//! Link → standby: link frames restored — WAL decoded by the session's codec, the primary's
//! other messages verbatim — and verified against the frame's checksum before any byte of the
//! frame is written to the standby; plus local answers (errors for commands walrelay does not
//! relay).

use std::sync::atomic::{AtomicBool, Ordering};

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, Semaphore};
use tokio_stream::StreamExt;

use walrelay_pgwire::repl::{keepalive_end, keepalive_wants_reply, XLogData};
use walrelay_pgwire::{parse_tagged, WireError};
use walrelay_proto::frame::{Digest, DownItem, DownState};
use walrelay_proto::link::{to_downstream, ToDownstream};
use walrelay_wal::linkcodec::WalDecoder;
use walrelay_wal::lsn::Lsn;

use super::{shutting_down, Downstream, End, Writer, DRAIN_MAX_MESSAGES};
use crate::link;
use crate::metrics::{timed, Metrics};
use crate::monitor::standbys::StandbyHandle;

/// What one restored frame holds besides its bytes.
#[derive(Default)]
struct Restored {
    /// Commands whose turn it ends (ReadyForQuery, CopyBothResponse).
    turns: usize,
    /// The primary's WAL end last stated, and the end of the WAL delivered.
    primary_end: Option<Lsn>,
    wal_end: Option<Lsn>,
    /// A keepalive in it asks for a reply at once.
    wants_reply: bool,
    /// WAL bytes in it.
    wal_bytes: u64,
}

/// The link → standby direction of one session.
pub struct LinkToStandby<'a> {
    pub inbound: &'a mut tonic::Streaming<ToDownstream>,
    pub local: mpsc::Receiver<Bytes>,
    pub writer: &'a mut Writer,
    pub decoder: &'a mut WalDecoder,
    pub ds: &'a Downstream,
    /// Permits for the standby → link direction: one per command answered.
    pub turns: &'a Semaphore,
    pub entry: &'a StandbyHandle,
    /// Set when a delivered keepalive asked for a reply: the standby's next feedback goes at
    /// once, whatever the window.
    pub reply_wanted: &'a AtomicBool,
    pub state: DownState,
}

impl LinkToStandby<'_> {
    /// Runs until the link or the standby goes away, or the process drains.
    pub async fn run(mut self) -> End {
        let shutdown = self.ds.shutdown.clone();
        let mut out = BytesMut::new();
        // At shutdown: frames still delivered, from those already received.
        let mut drain: Option<usize> = None;
        loop {
            out.clear();
            if let Some(left) = drain.as_mut() {
                if *left == 0 {
                    return shutting_down();
                }
                *left -= 1;
            }
            let mut got = Restored::default();
            tokio::select! {
                biased;
                _ = shutdown.cancelled(), if drain.is_none() => {
                    drain = Some(DRAIN_MAX_MESSAGES);
                    continue;
                }
                l = self.local.recv() => match l {
                    Some(b) => {
                        out.extend_from_slice(&b);
                        got.turns = 1;
                    }
                    None => return End::Quiet,
                },
                m = self.inbound.next() => match m {
                    // While this process shuts down, its own upstream half may end the link
                    // first: the standby should hear the real reason.
                    None | Some(Err(_)) if shutdown.is_cancelled() => return shutting_down(),
                    None => return End::fatal("08006", "walrelay: the upstream ended the session (the primary connection closed); the standby will reconnect"),
                    Some(Err(status)) => return End::fatal("08006", format!("walrelay: link to the upstream lost: {}; the standby will reconnect and resume", status.message())),
                    Some(Ok(ToDownstream { msg: Some(to_downstream::Msg::Frame(f)) })) => {
                        got = match self.restore(&f, &mut out) {
                            Ok(r) => r,
                            Err(end) => return end,
                        };
                    }
                    Some(Ok(_)) => return End::fatal("08P01", "walrelay: unexpected message from the upstream"),
                },
                // Draining and nothing more has arrived: done.
                _ = std::future::ready(()), if drain.is_some() => return shutting_down(),
            }
            if self.writer.write_all(&out).await.is_err() {
                return End::Quiet;
            }
            self.turns.add_permits(got.turns);
            if got.wants_reply {
                self.reply_wanted.store(true, Ordering::Relaxed);
            }
            if let Some(end) = got.primary_end {
                self.entry.primary_end(end);
            }
            if let Some(end) = got.wal_end {
                self.entry.wal(end);
            }
        }
    }

    /// Restores one frame into `out` (the bytes for the standby) and verifies it; on a
    /// failure `out` must not be written.
    fn restore(&mut self, frame: &[u8], out: &mut BytesMut) -> Result<Restored, End> {
        let metrics = &*self.ds.metrics;
        let max_len = self.ds.limits.max_message_bytes;
        let (items, sum) = self
            .state
            .parse(frame, max_len, link::max_link_message(&self.ds.limits))
            .map_err(|e| {
                End::fatal(
                    "08P01",
                    format!("walrelay: malformed frame from the upstream: {e}"),
                )
            })?;
        let (mut digest, mut got, mut restored) =
            (Digest::default(), Restored::default(), Vec::new());
        for item in items {
            match item {
                DownItem::Wal { header: h, payload } => {
                    let start = Lsn(h.start);
                    Metrics::add(
                        &metrics.ops.link_payload_bytes_received,
                        payload.len() as u64,
                    );
                    timed(&metrics.decode_ns, || {
                        self.decoder
                            .restore(start, payload, h.raw_len as usize, max_len, &mut restored)
                    })
                    .map_err(|e| {
                        integrity_failure(metrics, format!("walrelay: WAL from {start} failed verification, nothing of it was delivered: {e}; the standby will reconnect and resume"))
                    })?;
                    digest.wal(&h, &restored);
                    got.wal_bytes += restored.len() as u64;
                    got.primary_end = Some(Lsn(h.end));
                    got.wal_end = start.checked_add(restored.len() as u64);
                    XLogData {
                        start,
                        end: Lsn(h.end),
                        send_time: h.send_time,
                        data: Bytes::copy_from_slice(&restored),
                    }
                    .encode_copy_data(out);
                }
                DownItem::Backend(b) => {
                    digest.backend(b);
                    check_framing(b, &mut got).map_err(|e| {
                        End::fatal(
                            "08P01",
                            format!("walrelay: malformed message from the upstream: {e}"),
                        )
                    })?;
                    out.extend_from_slice(b);
                }
            }
        }
        if digest.finish() != sum {
            return Err(integrity_failure(metrics, "walrelay: a link message from the primary failed verification, nothing of it was delivered; the standby will reconnect and resume".into()));
        }
        Metrics::add(&metrics.wal_bytes_delivered, got.wal_bytes);
        Ok(got)
    }
}

fn integrity_failure(metrics: &Metrics, msg: String) -> End {
    Metrics::add(&metrics.integrity_failures, 1);
    End::fatal("XX001", msg)
}

/// Checks that `b` is a sequence of whole backend messages and notes in `got` how many of
/// them end a command's turn (ReadyForQuery, or CopyBothResponse which starts streaming), the
/// primary's WAL end from a keepalive, and whether a keepalive asks for a reply.
fn check_framing(b: &[u8], got: &mut Restored) -> Result<(), WireError> {
    let mut buf = BytesMut::from(b);
    while !buf.is_empty() {
        match parse_tagged(&mut buf, |_| usize::MAX)? {
            Some(m) => {
                got.turns += usize::from(m.tag == b'Z' || m.tag == b'W');
                if m.tag == b'd' {
                    got.primary_end = got.primary_end.max(keepalive_end(&m.body));
                    got.wants_reply |= keepalive_wants_reply(&m.body);
                }
            }
            None => {
                return Err(WireError::Malformed {
                    tag: '?',
                    what: "truncated message",
                })
            }
        }
    }
    Ok(())
}
