//! The feed: a stream's one replication connection to the primary, on the downstream's slot,
//! and the primary → link direction of the stream.
//!
//! The feed reads the primary's WAL once and batches it into link frames, together with what
//! the standbys' own connections ([`super::identity`]) send down: command results, and the
//! news that a standby's connection streams. A batch takes every message that arrives within
//! the stream's window (`link.batch_window_ms`), up to the stream's `batch_max` bytes
//! ([`super::handshake::batch_max`]); the window is
//! zero while any standby of the stream is one `synchronous_standby_names` lists, and a batch
//! with anything a standby waits for (a command's result) goes at once.
//!
//! Toward the primary the feed answers as a standby would: status updates whose write and
//! flush positions are where the downstream's spool is durable (so the slot advances only
//! over WAL that is on the far side's disk), at least every [`status_every`] and whenever the
//! primary asks. At the end of a timeline (the primary was promoted from a standby and the
//! spool was on the old timeline) it ends the copy, fetches the next timeline's history, sends
//! it down and streams on.
//!
//! Reads wait when the stream's queue to the link is full, so a slow link pauses reading from
//! the primary instead of buffering.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use futures::FutureExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};
use tonic::Status;

use walrelay_pgwire::repl::{keepalive_end, keepalive_wants_reply, status_update, XLogData};
use walrelay_pgwire::{encode, parse_tagged, RawMsg, WireError};
use walrelay_proto::frame::{WalHeader, ALIVE_EVERY};
use walrelay_wal::lsn::{Lsn, TimeLineId};

use super::encode::{EncodeStage, Event, Job, Part};
use super::primary;
use crate::metrics::Metrics;
use crate::pgclient::PrimaryConn;
use crate::silence::{self, Silence};

/// The feed tells the primary where the spool is at least this often (as a walreceiver's
/// `wal_receiver_status_interval`), or more often for a short `wal_sender_timeout`
/// ([`status_every`]).
pub const STATUS_EVERY: Duration = Duration::from_secs(10);

/// How often the feed tells the primary where the spool is, for the primary's
/// `wal_sender_timeout` as `SHOW` prints it (None: unknown): [`STATUS_EVERY`], or half the
/// timeout when that is shorter (CloudNativePG sets 5 s). While the link is slow the feed
/// does not read the primary, so it does not hear the keepalive with which the walsender
/// asks for a reply at half the timeout: these updates alone must keep it from ending the
/// connection.
pub fn status_every(wal_sender_timeout: Option<&str>) -> Duration {
    match wal_sender_timeout.and_then(crate::upstream::primary::parse_millis) {
        Some(ms) if ms > 0 => {
            (Duration::from_millis(ms) / 2).clamp(Duration::from_millis(100), STATUS_EVERY)
        }
        _ => STATUS_EVERY,
    }
}
/// A primary that sent nothing for this long is taken for gone (a host lost without a reset
/// keeps a TCP connection open for many minutes), as `wal_receiver_timeout` takes it: after
/// half of it the status update asks for a reply, which a live primary sends at once.
pub const PRIMARY_TIMEOUT: Duration = Duration::from_secs(60);

/// Room for each read of what arrived within a batch's window, and how far past the batch's
/// room those reads go ([`FeedToLink::window_end`]).
const WINDOW_READ: usize = 64 * 1024;

/// Longest wait for bytes the socket holds at a window's end to be reported readable.
const WINDOW_READ_WAIT: Duration = Duration::from_millis(100);

#[derive(Default)]
struct Batch {
    parts: Vec<Part>,
    bytes: usize,
    /// Most bytes it takes (the stream's `batch_max`).
    max: usize,
    /// Something in it must not wait for the window.
    urgent: bool,
    /// The primary ended the timeline (CopyDone): switch after this batch.
    timeline_end: bool,
    wal_end: Option<Lsn>,
    /// It ended because the primary's next WAL, already read, did not fit ([`Job::more`]).
    more: bool,
}

impl Batch {
    fn new(max: usize) -> Batch {
        Batch {
            max,
            ..Batch::default()
        }
    }

    fn fits(&self, len: usize) -> bool {
        self.bytes == 0 || self.bytes + len + 5 <= self.max
    }

    fn full(&self) -> bool {
        self.bytes >= self.max
    }

    /// Bytes it has room for still.
    fn room(&self) -> usize {
        self.max.saturating_sub(self.bytes)
    }

    /// Ends the batch before `next`, which did not fit: the next batch starts with it.
    fn close_before(&mut self, next: &RawMsg) {
        let follows = match XLogData::parse(&next.body) {
            Ok(Some(x)) => next.tag == b'd' && Some(x.start) == self.wal_end,
            _ => false,
        };
        self.more = follows && matches!(self.parts.last(), Some(Part::Wal { .. }));
    }

    fn push_event(&mut self, e: Event) {
        self.bytes += match &e {
            Event::Backend { bytes, .. } => bytes.len() + 8,
            Event::Started { .. } => 8,
        };
        self.urgent = true;
        self.parts.push(Part::Event(e));
    }

    fn push_wal(&mut self, x: XLogData) -> Result<(), WireError> {
        let data_end = x.data_end().ok_or(WireError::Malformed {
            tag: 'w',
            what: "XLogData runs past the end of the WAL address space",
        })?;
        self.bytes += x.data.len() + 25;
        self.wal_end = Some(data_end);
        if let Some(Part::Wal { header, data }) = self.parts.last_mut() {
            if header.start.checked_add(data.len() as u64) == Some(x.start.0) {
                data.extend_from_slice(&x.data);
                header.end = x.end.0;
                header.send_time = x.send_time;
                return Ok(());
            }
        }
        self.parts.push(Part::Wal {
            header: WalHeader {
                start: x.start.0,
                end: x.end.0,
                send_time: x.send_time,
                raw_len: 0,
            },
            data: BytesMut::from(&x.data[..]),
        });
        Ok(())
    }
}

/// The primary → link direction of a stream, with the feed's connection.
pub struct FeedToLink<'a> {
    pub conn: PrimaryConn,
    /// Frames the batches, in order, on the stream's encode thread.
    pub stage: EncodeStage,
    pub events: mpsc::Receiver<Event>,
    pub metrics: &'a Metrics,
    pub window: Duration,
    /// Most bytes in one batch ([`super::handshake::batch_max`]).
    pub batch_max: usize,
    /// Standbys of this stream that a commit may wait on (no window while any).
    pub synchronous: &'a AtomicUsize,
    /// Where the downstream's spool is durable (written by the link → upstream direction).
    pub durable: watch::Receiver<Lsn>,
    pub slot: String,
    pub tli: TimeLineId,
    pub pending: Option<RawMsg>,
    /// The primary hears where the spool is at least this often ([`status_every`]).
    pub status_every: Duration,
    pub last_status: tokio::time::Instant,
    /// When the stream last carried something down: a keepalive goes when nothing else has
    /// for `ALIVE_EVERY` (the downstream ends a stream silent for `SILENT_LIMIT`).
    pub last_sent: tokio::time::Instant,
    /// The primary's WAL end as last seen (that keepalive's position).
    pub primary_end: u64,
    /// How long the primary has been silent ([`PRIMARY_TIMEOUT`]).
    pub silence: Silence,
}

fn primary_gone(e: WireError) -> Status {
    match e {
        WireError::Closed => Status::unavailable("the primary closed the replication connection"),
        e => Status::unavailable(format!("primary connection: {e}")),
    }
}

impl FeedToLink<'_> {
    /// Runs until the primary, the link or the downstream goes away.
    pub async fn run(&mut self) -> Result<(), Status> {
        loop {
            let batch = self.gather().await?;
            let timeline_end = batch.timeline_end;
            if !batch.parts.is_empty() {
                let job = Job {
                    parts: batch.parts,
                    wal_end: batch.wal_end,
                    more: batch.more,
                };
                self.send_down(job).await?;
                self.last_sent = tokio::time::Instant::now();
            }
            if timeline_end {
                self.next_timeline().await?;
            }
        }
    }

    /// Hands a batch to the encode stage. While its queue is full (the link slow) the primary
    /// is not read, so it still hears from us every `status_every`: its `wal_sender_timeout`
    /// would otherwise end the connection of a stream that is only waiting.
    async fn send_down(&mut self, job: Job) -> Result<(), Status> {
        let waited_from = tokio::time::Instant::now();
        let mut send = std::pin::pin!(self.stage.send(job));
        loop {
            tokio::select! {
                r = &mut send => {
                    // The primary was not read meanwhile: its silence is timed from now on,
                    // or a long wait on the link would look like a primary gone.
                    if waited_from.elapsed() > self.status_every {
                        self.silence.heard(tokio::time::Instant::now());
                    }
                    return r;
                }
                _ = tokio::time::sleep_until(self.last_status + self.status_every) => {
                    let at = self.durable.borrow_and_update().0;
                    write_status(&mut self.conn, at, false).await?;
                    self.last_status = tokio::time::Instant::now();
                }
            }
        }
    }

    async fn read(&mut self) -> Result<RawMsg, Status> {
        let max = self.conn.max_message_bytes;
        let m = self
            .conn
            .reader
            .read(|b| parse_tagged(b, |_| max))
            .await
            .map_err(primary_gone)?;
        self.silence.heard(tokio::time::Instant::now());
        Ok(m)
    }

    fn window(&self) -> Duration {
        match self.synchronous.load(Ordering::Relaxed) {
            0 => self.window,
            _ => Duration::ZERO,
        }
    }

    /// Reads one batch: waits for its first message (answering the primary meanwhile), takes
    /// what has already arrived with it, and when the batch has room left and there is a
    /// window, takes what arrived within it once the window ends. A batch that begins with
    /// what the last one had no room for has no window.
    ///
    /// Within the window the primary's connection is not read: what the primary sends
    /// meanwhile waits in the socket, and joins the batch in one go at the window's end
    /// ([`Self::window_end`]). A busy primary sends each commit's WAL on its own, and
    /// reading each as it came cost a read per commit. On TCP the runtime is not even told
    /// of those arrivals until the batch's room has come ([`crate::tcp::RecvWake`]: then
    /// the batch fills and goes), so the commits within a window no longer wake the upstream
    /// at all. Nothing waits longer than the window for it; a keepalive that asks for a
    /// reply is answered when it is read, at the latest at the window's end, while the
    /// stream's own status updates (every `status_every`, half the primary's
    /// `wal_sender_timeout` at most) go out meanwhile.
    async fn gather(&mut self) -> Result<Batch, Status> {
        let batch = self.gather_window().await;
        // However the batch ended, the next one's first message wakes the feed as it comes.
        if let Some(w) = self.conn.wake.as_mut() {
            w.restore();
        }
        batch
    }

    /// [`Self::gather`], but for the socket's wake-ups set back.
    async fn gather_window(&mut self) -> Result<Batch, Status> {
        let mut batch = Batch::new(self.batch_max);
        // What did not fit in the last batch has waited for its window already: this batch
        // takes what has arrived with it and goes.
        let carried = self.pending.is_some();
        if let Some(m) = self.pending.take() {
            self.take(&mut batch, m).await?;
        }
        let mut deadline: Option<tokio::time::Instant> = None;
        loop {
            if batch.urgent || batch.timeline_end || batch.full() {
                return Ok(batch);
            }
            if deadline.is_none() && !batch.parts.is_empty() {
                let window = if carried {
                    Duration::ZERO
                } else {
                    self.window()
                };
                if !self.take_arrived(&mut batch).await? || window.is_zero() {
                    return Ok(batch);
                }
                deadline = Some(tokio::time::Instant::now() + window);
                self.defer_wake(&batch);
                continue;
            }
            // Deferred, the socket tells only once the batch's room has come.
            let deferred = self.conn.wake.as_ref().is_some_and(|w| w.deferred());
            let status_due = self.last_status + self.status_every;
            let window_over = silence::until(deadline);
            let max = self.conn.max_message_bytes;
            let (ask_at, gone_at) = (self.silence.ask_at(), self.silence.deadline());
            tokio::select! {
                biased;
                e = self.events.recv() => match e {
                    Some(e) => batch.push_event(e),
                    None => return Err(Status::cancelled("the stream's standby connections ended")),
                },
                m = self.conn.reader.read(|b| parse_tagged(b, |_| max)), if deadline.is_none() || deferred => {
                    let m = m.map_err(primary_gone)?;
                    self.silence.heard(tokio::time::Instant::now());
                    if !self.admit(&mut batch, m).await? {
                        return Ok(batch);
                    }
                    if deadline.is_some() {
                        if !self.take_arrived(&mut batch).await? {
                            // The room came within the window: the batch is full and goes.
                            return Ok(batch);
                        }
                        // Woken short of the room (a receive window down to a segment, a
                        // buffer short of memory: the kernel's reasons): the window goes on.
                        self.defer_wake(&batch);
                    }
                }
                r = self.durable.changed() => {
                    if r.is_err() {
                        return Err(Status::cancelled("the downstream went away"));
                    }
                    self.status(false).await?;
                }
                _ = tokio::time::sleep_until(status_due) => self.status(false).await?,
                _ = silence::until(ask_at) => {
                    self.silence.asked();
                    self.status(true).await?;
                }
                _ = silence::until(gone_at) => {
                    return Err(Status::unavailable(format!(
                        "nothing from the primary for {} s, though it was asked for a reply: \
                         taken for gone (its host lost?); connecting again, to the promoted \
                         server if upstream.primary lists it",
                        PRIMARY_TIMEOUT.as_secs()
                    )));
                }
                _ = window_over => {
                    self.window_end(&mut batch).await?;
                    return Ok(batch);
                }
                _ = tokio::time::sleep_until(self.last_sent + ALIVE_EVERY), if batch.parts.is_empty() => {
                    batch.bytes += 16;
                    batch.parts.push(Part::Keepalive {
                        end: self.primary_end,
                        send_time: walrelay_pgwire::repl::pg_now(),
                    });
                    return Ok(batch);
                }
            }
        }
    }

    /// For the rest of a batch's window the socket tells of the primary's bytes only once
    /// the batch's room has come (TCP).
    fn defer_wake(&mut self, batch: &Batch) {
        if let Some(w) = self.conn.wake.as_mut() {
            w.defer(batch.room());
        }
    }

    /// The end of a batch's window: the socket tells of every arrival again, what came within
    /// the window is read (as much as the batch has room for, and a read more) and joins the
    /// batch ([`Self::take_arrived`]).
    async fn window_end(&mut self, batch: &mut Batch) -> Result<(), Status> {
        let waiting = match self.conn.wake.as_mut() {
            Some(w) if w.deferred() => {
                w.restore();
                w.unread().unwrap_or(0)
            }
            _ => 0,
        };
        let mut left = waiting.min(batch.room().saturating_add(WINDOW_READ));
        while left > 0 {
            // The kernel told the runtime of these bytes when the mark went back; the wait
            // is bounded all the same, and a socket that did not tell is not deferred again.
            let read = self.conn.reader.fill(WINDOW_READ);
            match tokio::time::timeout(WINDOW_READ_WAIT, read).await {
                Ok(n) => left = left.saturating_sub(n.map_err(primary_gone)?),
                Err(_) => {
                    tracing::warn!("bytes waiting on the primary's connection were not reported readable within {} ms; its batches wake the feed at every arrival from now on", WINDOW_READ_WAIT.as_millis());
                    self.conn.wake = None;
                    break;
                }
            }
        }
        self.take_arrived(batch).await.map(|_| ())
    }

    /// Adds to `batch` the messages of the primary that have already arrived (read, or
    /// readable without waiting), while it has room; false when one did not fit (the batch
    /// is closed before it, [`Self::admit`]).
    async fn take_arrived(&mut self, batch: &mut Batch) -> Result<bool, Status> {
        while !batch.urgent && !batch.timeline_end && !batch.full() {
            let Some(m) = self.read().now_or_never() else {
                break;
            };
            if !self.admit(batch, m?).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// `m` into the batch if it fits; false when it does not (the batch is closed before it,
    /// and `m` waits for the next).
    async fn admit(&mut self, batch: &mut Batch, m: RawMsg) -> Result<bool, Status> {
        if !batch.fits(m.body.len()) {
            batch.close_before(&m);
            self.pending = Some(m);
            return Ok(false);
        }
        self.take(batch, m).await?;
        Ok(true)
    }

    /// One message of the primary into the batch.
    async fn take(&mut self, batch: &mut Batch, m: RawMsg) -> Result<(), Status> {
        match m.tag {
            b'd' => {
                if let Some(x) = XLogData::parse(&m.body).map_err(primary_gone)? {
                    Metrics::add(&self.metrics.wal_bytes_in, x.data.len() as u64);
                    self.saw_primary_end(x.end.0);
                    return batch.push_wal(x).map_err(primary_gone);
                }
                if let Some(end) = keepalive_end(&m.body) {
                    self.saw_primary_end(end.0);
                    if keepalive_wants_reply(&m.body) {
                        self.status(false).await?;
                    }
                    let send_time = m
                        .body
                        .get(9..17)
                        .and_then(|b| b.try_into().ok())
                        .map(i64::from_be_bytes)
                        .unwrap_or(0);
                    batch.bytes += 16;
                    batch.parts.push(Part::Keepalive {
                        end: end.0,
                        send_time,
                    });
                }
                Ok(())
            }
            // The end of a timeline the spool was on: the primary now waits for our CopyDone.
            b'c' => {
                batch.timeline_end = true;
                Ok(())
            }
            b'E' => Err(self.primary_error(&m)),
            // Notices, parameter changes: nothing for the stream.
            _ => Ok(()),
        }
    }

    /// The primary's ErrorResponse `m` in the middle of the stream, as the stream's end: WAL
    /// it no longer has says what to do ([`super::primary::wal_gone`]); anything else is
    /// tried again.
    fn primary_error(&self, m: &RawMsg) -> Status {
        match walrelay_pgwire::ErrorFields::parse(&m.body) {
            Ok(e) => super::primary::wal_gone(&self.slot, &e).unwrap_or_else(|| {
                Status::unavailable(format!("the primary ended the stream's replication: {e}"))
            }),
            Err(e) => primary_gone(e),
        }
    }

    /// Tells the primary where the spool is durable (write = flush = that position; none, 0,
    /// before the downstream's first report, which the primary takes as no claim). Apply is
    /// none (0), as pg_receivewal says it: the spool replays nothing, and a stream matched by
    /// `synchronous_standby_names` (`*`) must not let a `remote_apply` commit return.
    /// `reply`: the primary is asked to answer at once (whether it is still there).
    async fn status(&mut self, reply: bool) -> Result<(), Status> {
        let at = self.durable.borrow_and_update().0;
        if at != 0 {
            self.slot_gauge(|s| s.confirmed = at);
        }
        write_status(&mut self.conn, at, reply).await?;
        self.last_status = tokio::time::Instant::now();
        Ok(())
    }

    /// The primary's WAL end reached `end` (an XLogData's or a keepalive's): kept for the
    /// stream's own keepalives and shown in the slot gauge.
    fn saw_primary_end(&mut self, end: u64) {
        self.primary_end = self.primary_end.max(end);
        self.slot_gauge(|s| s.primary_end = s.primary_end.max(end));
    }

    /// Updates this stream's entry of the slot gauge (`walrelay_slot_retained_bytes`).
    fn slot_gauge(&self, f: impl FnOnce(&mut crate::monitor::SlotState)) {
        let mut slots = self
            .metrics
            .ops
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        f(slots.entry(self.slot.clone()).or_default());
    }

    /// The primary ended the timeline the spool was on: finish the copy, read where the next
    /// timeline starts, send its history down, stream on.
    async fn next_timeline(&mut self) -> Result<(), Status> {
        let mut out = BytesMut::new();
        encode::copy_done(&mut out);
        let err = |e: crate::pgclient::PgClientError| {
            Status::unavailable(format!("following the primary's next timeline: {e}"))
        };
        self.conn
            .writer
            .write_all(&out)
            .await
            .map_err(|e| Status::unavailable(format!("writing to the primary: {e}")))?;
        // The next timeline and where it starts, then CommandComplete and ReadyForQuery.
        let mut ended = None;
        loop {
            let m = self.read().await?;
            match m.tag {
                b'D' => ended = Some(primary::next_timeline_row(&m).map_err(err)?),
                b'Z' => break,
                b'E' => {
                    return Err(Status::unavailable(
                        "the primary refused to end the timeline",
                    ))
                }
                _ => {}
            }
        }
        let Some((mut next, mut at)) = ended else {
            return Err(Status::unavailable(
                "the primary ended the timeline without naming the next one",
            ));
        };
        loop {
            let history = self.conn.timeline_history(next).await.map_err(err)?.content;
            tracing::info!(from = %self.tli, to = %next, at = %at, "the primary is on a new timeline: following it");
            let timeline = Part::Timeline {
                tli: next.0,
                history: history.to_vec(),
            };
            let job = Job {
                parts: vec![timeline],
                wal_end: None,
                more: false,
            };
            self.stage.send(job).await?;
            self.tli = next;
            match primary::start_replication(&mut self.conn, Some(&self.slot), at, next)
                .await
                .map_err(err)?
            {
                primary::Started::Streaming => return Ok(()),
                // That one ended at once too: on to the one after.
                primary::Started::TimelineEnded { next: n, at: a } => (next, at) = (n, a),
            }
        }
    }
}

/// A status update to the primary: written and flushed up to `at`, nothing applied; `reply`:
/// the primary is asked to answer at once (whether it is still there).
async fn write_status(conn: &mut PrimaryConn, at: u64, reply: bool) -> Result<(), Status> {
    let msg = status_update(Lsn(at), Lsn(at), Lsn(0), reply);
    let mut out = BytesMut::new();
    encode::copy_data(&mut out, &msg);
    conn.writer
        .write_all(&out)
        .await
        .map_err(|e| Status::unavailable(format!("writing to the primary: {e}")))
}

#[cfg(test)]
mod tests;
