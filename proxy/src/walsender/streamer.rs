//! START_REPLICATION served from the spool, as PostgreSQL's walsender serves it
//! (`StartReplication`, `XLogSendPhysical`):
//!
//! - an older timeline is checked against the spool's history: a start past its end gets the
//!   next timeline at once (no COPY); otherwise WAL goes up to the switchpoint, then CopyDone,
//!   and after the standby's CopyDone the next timeline and where it starts;
//! - a start past what the spool has but not past the primary's end waits for the spool; past
//!   both, it gets "requested starting point … is ahead of the WAL flush position of this
//!   server"; WAL the spool no longer has "requested WAL segment … has already been removed";
//! - XLogData of at most 128 KiB (MAX_SEND_SIZE), a keepalive when nothing was sent for
//!   [`KEEPALIVE_EVERY`] and at once when the standby asks for a reply;
//! - the standby's feedback goes to its own connection to the primary, through the stream.
//!
//! Before COPY starts, the standby's own connection to the primary starts streaming as it
//! (on its slot); the primary's refusal (a slot that does not exist, ...) is the standby's
//! answer. While the link is down the standby is served at once and its connection starts
//! when the link is back.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::time::Instant;

use walrelay_pgwire::repl::{
    check_feedback, clamp_status_update, pg_now, status_positions, XLogData,
};
use walrelay_pgwire::{encode, results, ErrorFields, FrontendMsg, WireError};
use walrelay_proto::frame::Feedback;
use walrelay_proto::link::StartReplication;
use walrelay_wal::lsn::{Lsn, TimeLineId};
use walrelay_wal::segment::WalSegSize;
use walrelay_wal::timeline;
use walrelay_wal::walcodec::wal::{LONG_PHD, SHORT_PHD, WAL_PAGE};

use super::session::Session;
use super::{shutting_down, End};
use crate::silence::{self, Silence};
use crate::spool::SpoolError;
use crate::spooler::ChanEvent;

/// Most WAL bytes in one XLogData (PostgreSQL's MAX_SEND_SIZE).
const MAX_SEND: usize = 128 * 1024;
/// Most bytes read from the spool on the runtime itself (see [`send_wal`]).
const INLINE_READ: u64 = 16 * 1024;
/// A keepalive goes when nothing was sent for this long.
pub const KEEPALIVE_EVERY: Duration = Duration::from_secs(10);
/// Longest the start of the standby's own connection may hold up streaming.
const START_WAIT: Duration = Duration::from_secs(10);

/// Whether a streaming standby is still there, as PostgreSQL's walsender judges it
/// (`WalSndKeepaliveIfNecessary`, `WalSndCheckTimeOut`): any message from it counts; when it
/// was silent for half of `limits.standby_timeout_secs` a keepalive asks for a reply, after all
/// of it the session ends, also while a write to it is stuck.
#[derive(Debug)]
struct Liveness(Silence);

impl Liveness {
    fn new(timeout_secs: u64, now: Instant) -> Liveness {
        let timeout = (timeout_secs > 0).then(|| Duration::from_secs(timeout_secs));
        Liveness(Silence::new(timeout, now))
    }

    fn timed_out(&self) -> End {
        let secs = self.0.timeout().map_or(0, |t| t.as_secs());
        tracing::warn!("standby session ended: no reply from the standby for {secs} s (limits.standby_timeout_secs)");
        End::fatal(
            "08006",
            format!("walrelay: terminating the session due to replication timeout (nothing from the standby for {secs} s)"),
        )
    }

    /// `io` (a write to the standby), ended by the deadline if the standby stops reading.
    async fn bounded<T>(
        &self,
        io: impl std::future::Future<Output = Result<T, End>>,
    ) -> Result<T, End> {
        match self.0.deadline() {
            Some(d) => tokio::time::timeout_at(d, io)
                .await
                .map_err(|_| self.timed_out())?,
            None => io.await,
        }
    }
}

/// Where the timeline being sent ends, if it is an older one.
#[derive(Debug, Clone, Copy)]
struct Historic {
    end: Lsn,
    next: TimeLineId,
}

/// How COPY mode ended.
enum CopyEnd {
    /// The standby sent CopyDone.
    Standby,
    /// The older timeline was sent up to its end; CopyDone sent.
    TimelineEnd(Historic),
}

/// The end of `tli` in the spool's current history (None: it is the current timeline).
fn historic(s: &Session<'_>, tli: TimeLineId) -> Result<Option<Historic>, ErrorFields> {
    let view = s.ds.spooler.view.borrow().clone();
    let (_, cur, _) = s.served();
    if tli == cur {
        return Ok(None);
    }
    let not_in = || {
        ErrorFields::error(
            "XX000",
            format!(
                "requested timeline {} is not in this server's history",
                tli.0
            ),
        )
    };
    let text = view.files.history(cur).ok_or_else(not_in)?;
    let entries = timeline::parse(&String::from_utf8_lossy(&text)).map_err(|_| not_in())?;
    let end = timeline::switchpoint(&entries, tli).ok_or_else(not_in)?;
    let next = timeline::next_timeline(&entries, cur, tli).ok_or_else(not_in)?;
    Ok(Some(Historic { end, next }))
}

pub(super) async fn stream(
    s: &mut Session<'_>,
    slot: Option<String>,
    start: Lsn,
    timeline: Option<TimeLineId>,
) -> Result<(), End> {
    let tli = timeline.unwrap_or_else(|| s.served().1);
    let mut hist = match historic(s, tli) {
        Ok(h) => h,
        Err(e) => return s.error(e).await,
    };
    if let Some(h) = hist {
        if h.end < start {
            return s
                .error(
                    ErrorFields::error(
                        "XX000",
                        format!("requested starting point {start} on timeline {} is not in this server's history", tli.0),
                    )
                    .with_detail(format!("This server's history forked from timeline {} at {}.", tli.0, h.end)),
                )
                .await;
        }
        if start == h.end {
            let mut out = BytesMut::new();
            results::next_timeline(&mut out, h.next, h.end);
            end_start_replication(&mut out);
            return s.write(&out).await;
        }
    }
    if !start_identity(s, slot, start, tli).await? {
        return Ok(());
    }
    // Ahead of the spool: the spool may still be catching up with the primary; wait for it
    // (bounded), or for the primary to state it has that WAL.
    if hist.is_none() && !reached(&s.ds.spooler, start).await {
        let end = s.ds.spooler.view.borrow().extent.end;
        let mut out = BytesMut::new();
        encode::tagged(&mut out, b'W', |b| b.extend_from_slice(&[0, 0, 0]));
        s.write(&out).await?;
        return s
            .error(ErrorFields::error(
                "XX000",
                format!("requested starting point {start} is ahead of the WAL flush position of this server {end}"),
            ))
            .await;
    }
    // CopyBothResponse: text format, no columns.
    let mut out = BytesMut::new();
    encode::tagged(&mut out, b'W', |b| b.extend_from_slice(&[0, 0, 0]));
    s.write(&out).await?;
    let how = copy(s, tli, start, &mut hist).await?;
    let mut out = BytesMut::new();
    if let CopyEnd::TimelineEnd(h) = how {
        results::next_timeline(&mut out, h.next, h.end);
    } else {
        results::command_complete(&mut out, "START_STREAMING");
    }
    end_start_replication(&mut out);
    s.write(&out).await
}

/// What ends START_REPLICATION after its own CommandComplete (START_STREAMING), as
/// PostgreSQL's `exec_replication_command` ends it: a second CommandComplete ("dupe, but
/// necessary per libpqrcv_endstreaming", which reads the next-timeline result set and then
/// one more command result; pg_receivewal fails at a timeline's end without it), then
/// ReadyForQuery.
fn end_start_replication(out: &mut BytesMut) {
    results::command_complete(out, "START_REPLICATION");
    encode::ready_for_query(out);
}

/// Longest a standby ahead of the spool waits for the spool to catch up.
const AHEAD_WAIT: Duration = Duration::from_secs(30);

/// Whether the spool reaches `start`, or the primary says it has it, within [`AHEAD_WAIT`].
async fn reached(sp: &crate::spooler::Spooler, start: Lsn) -> bool {
    let mut view = sp.view.clone();
    let ok = |v: &crate::spooler::writer::SpoolView| v.extent.end >= start;
    if ok(&view.borrow()) {
        return true;
    }
    let wait = async {
        loop {
            if sp.primary_end() >= start {
                return true;
            }
            tokio::select! {
                r = view.changed() => if r.is_err() { return false },
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
            if ok(&view.borrow()) {
                return true;
            }
        }
    };
    tokio::time::timeout(AHEAD_WAIT, wait)
        .await
        .unwrap_or(false)
}

/// The primary's refusal of the standby's own START_REPLICATION, when `b` (what the standby's
/// channel was sent) is one: an ErrorResponse with no ReadyForQuery (a command's answer ends
/// with one). It comes while the standby streams from the spool when the link was down at its
/// START (or the primary was): ending the session with it, the standby hears it at its next
/// START, as from PostgreSQL itself (a slot missing on a promoted primary, say), instead of
/// streaming on without a connection the primary knows of.
fn start_refused(b: &[u8]) -> Option<ErrorFields> {
    let mut buf = BytesMut::from(b);
    let mut refusal = None;
    while let Ok(Some(m)) = walrelay_pgwire::parse_tagged(&mut buf, |_| b.len()) {
        match m.tag {
            b'E' if refusal.is_none() => refusal = ErrorFields::parse(&m.body).ok(),
            b'Z' => return None,
            _ => {}
        }
    }
    refusal
}

/// Starts the standby's own connection to the primary (when the link is up) and waits for
/// it; false when the primary refused (its answer went to the standby).
async fn start_identity(
    s: &mut Session<'_>,
    slot: Option<String>,
    start: Lsn,
    tli: TimeLineId,
) -> Result<bool, End> {
    // What is pending is old, as in `commands::relay`: an answer that came after an earlier
    // command timed out is not this START's refusal.
    while s.events.try_recv().is_ok() {}
    let up = s.ds.spooler.link.borrow().is_some();
    s.ds.spooler.start(
        s.chan,
        StartReplication {
            slot: slot.unwrap_or_default(),
            start_lsn: start.0,
            timeline: tli.0,
        },
    );
    if !up {
        return Ok(true);
    }
    let answer = tokio::time::timeout(START_WAIT, async {
        match s.events.recv().await {
            Some(ChanEvent::Backend(b)) => Some(b),
            Some(ChanEvent::Started { .. } | ChanEvent::LinkDown) | None => None,
        }
    })
    .await;
    match answer {
        Ok(Some(refusal)) => {
            let mut out = BytesMut::from(&refusal[..]);
            encode::ready_for_query(&mut out);
            s.write(&out).await?;
            Ok(false)
        }
        _ => Ok(true),
    }
}

/// COPY mode: WAL from the spool, keepalives, the standby's feedback.
async fn copy(
    s: &mut Session<'_>,
    tli: TimeLineId,
    mut pos: Lsn,
    hist: &mut Option<Historic>,
) -> Result<CopyEnd, End> {
    let mut view = s.ds.spooler.view.clone();
    let mut last_sent = Instant::now();
    let mut live = Liveness::new(s.ds.limits.standby_timeout_secs, last_sent);
    loop {
        let ext = view.borrow_and_update().extent;
        if hist.is_none() && ext.tli != tli {
            // The spool moved to a new timeline: this one now ends at its switchpoint.
            *hist = historic(s, tli).map_err(End::Fatal)?;
        }
        let limit = send_limit(*hist, ext.end, view.borrow().files.seg);
        let window = Window {
            tli,
            limit,
            end: ext.end,
            hist: *hist,
        };
        if let Some(h) = *hist {
            if pos >= h.end {
                let mut out = BytesMut::new();
                encode::copy_done(&mut out);
                s.write(&out).await?;
                // As the walsender checks its timeout until both sides sent CopyDone.
                live.bounded(drain_until_copy_done(s, pos.min(h.end)))
                    .await?;
                return Ok(CopyEnd::TimelineEnd(h));
            }
        }
        let more = pos < limit;
        let (ask_at, deadline) = (live.0.ask_at(), live.0.deadline());
        tokio::select! {
            biased;
            m = s.reader.read(walrelay_pgwire::parse_frontend) => {
                live.0.heard(Instant::now());
                // On a timeline the spool has left, nothing past its switchpoint counts: a
                // standby that got more of it before the switch has WAL the new primary never
                // wrote, and must not tell it otherwise.
                let sent = hist.map_or(pos, |h| pos.min(h.end));
                match live.bounded(standby_message(s, m, limit, sent)).await? {
                    Some(end) => return Ok(end),
                    None => continue,
                }
            }
            _ = s.ds.shutdown.cancelled() => return Err(shutting_down()),
            _ = silence::until(deadline) => return Err(live.timed_out()),
            // Before the WAL, which is always ready while the standby catches up: a standby
            // that replies only when asked (wal_receiver_status_interval = 0, pg_receivewal
            // -s 0) is asked then too, as WalSndKeepaliveIfNecessary asks it on every turn.
            _ = silence::until(ask_at) => {
                live.0.asked();
                live.bounded(keepalive(s, limit, true)).await?;
                last_sent = Instant::now();
            }
            e = s.events.recv() => match e {
                None => return Err(End::fatal("XX000", "walrelay: the spooler stopped")),
                Some(ChanEvent::Backend(b)) => if let Some(e) = start_refused(&b) {
                    return Err(End::Fatal(e));
                },
                Some(_) => {}
            },
            _ = std::future::ready(()), if more => {
                pos = live.bounded(send_wal(s, pos, window)).await?;
                last_sent = Instant::now();
            }
            r = view.changed(), if !more => {
                if r.is_err() {
                    return Err(End::fatal("XX000", "walrelay: the spool stopped"));
                }
            }
            _ = tokio::time::sleep_until(last_sent + KEEPALIVE_EVERY) => {
                live.bounded(keepalive(s, limit, false)).await?;
                last_sent = Instant::now();
            }
        }
    }
}

/// Where one XLogData starting at `pos` ends, cut as PostgreSQL's walsender cuts them
/// (`XLogSendPhysical`): at `limit` when that is within [`MAX_SEND`], otherwise at the last WAL
/// page boundary within it.
///
/// This is a contract with the standby, not a matter of taste: a standby's WAL reader copies
/// the part of a record that lies on the record's first page without waiting for it
/// (`xlogreader.c`, "Copy the first fragment of the record from the first page"), trusting
/// that what it has received ends at a record's end or at a page boundary, as the primary's
/// flush position always does. `limit` is such a place (the end of what the primary sent, or
/// a timeline's switchpoint); a cut anywhere else, inside a page-crossing record's first
/// fragment, made standbys read stale bytes from their recycled segment, fail the record's
/// CRC ("incorrect resource manager data checksum") and restart their walreceiver.
fn send_end(pos: Lsn, limit: Lsn) -> Lsn {
    let max = MAX_SEND as u64;
    if limit.0.saturating_sub(pos.0) <= max {
        return limit;
    }
    let end = pos.0 + max;
    Lsn(end - end % WAL_PAGE)
}

/// How far WAL may be sent: an older timeline up to its switchpoint; the current one up to
/// the spool's `end`, except when that lies inside or just at the end of a page header: then
/// up to the page's start, until more has arrived.
///
/// Another contract with the standby. PostgreSQL's flush position, and so what its walsender
/// sends, never ends there (`GetXLogBuffer` takes care not to advertise it). A standby's WAL
/// reader that is given exactly a page header fails without a word (`ReadPageInternal` wants
/// more than a short header; for a segment's first page it reads the record length past the
/// long header from bytes not received yet), stops its walreceiver, finds zeros in pg_wal, and
/// then stops every new walreceiver before it can write the missing bytes, for good. The
/// spool does end there when the upstream held back a record that begins right after a page
/// header for its next message (`Encoder::encode_held`).
fn send_limit(hist: Option<Historic>, end: Lsn, seg: WalSegSize) -> Lsn {
    if let Some(h) = hist {
        return h.end;
    }
    let in_page = end.0 % WAL_PAGE;
    let header = match seg.offset_in_segment(end) < WAL_PAGE {
        true => LONG_PHD,
        false => SHORT_PHD,
    } as u64;
    match in_page > 0 && in_page <= header {
        true => Lsn(end.0 - in_page),
        false => end,
    }
}

/// WAL of timeline `tli` from `pos` to `to`. A standby keeping up is served from the spool's
/// memory, here. Otherwise what the spool writer just wrote is in the page cache: a few kB (a
/// commit) are read here in microseconds, sparing a synchronous commit a hop to a blocking
/// thread; more is read on one.
async fn read_spool(
    files: &crate::spool::SpoolFiles,
    tli: TimeLineId,
    pos: Lsn,
    to: Lsn,
) -> Result<Result<Vec<u8>, SpoolError>, End> {
    if let Some(d) = files.read_recent(tli, pos, to, MAX_SEND) {
        return Ok(Ok(d));
    }
    if to.0 - pos.0 <= INLINE_READ {
        return Ok(files.read(tli, pos, to, MAX_SEND));
    }
    let files = files.clone();
    tokio::task::spawn_blocking(move || files.read(tli, pos, to, MAX_SEND))
        .await
        .map_err(|_| End::fatal("XX000", "walrelay: reading the spool failed"))
}

/// What the COPY loop may send of timeline `tli` as it stands: up to `limit`
/// ([`send_limit`]), the spool ending at `end`, the timeline ending at `hist` if it is an
/// older one.
#[derive(Debug, Clone, Copy)]
struct Window {
    tli: TimeLineId,
    limit: Lsn,
    end: Lsn,
    hist: Option<Historic>,
}

/// One XLogData from the spool, from `pos` within `w`.
async fn send_wal(s: &mut Session<'_>, pos: Lsn, w: Window) -> Result<Lsn, End> {
    let files = s.ds.spooler.view.borrow().files.clone();
    let to = send_end(pos, w.limit);
    let mut read = read_spool(&files, w.tli, pos, to).await?;
    if let (Err(SpoolError::Removed(_)), Some(h)) = (&read, w.hist) {
        // An older timeline's last segment: the next timeline's file holds the same bytes up
        // to the switchpoint, and is there when the spool began on that timeline
        // (PostgreSQL's walsender reads that segment from the next timeline's file too).
        if let found @ Ok(_) = read_spool(&files, h.next, pos, to).await? {
            read = found;
        }
    }
    let data = match read {
        Ok(d) => d,
        Err(e @ SpoolError::Removed(_)) => {
            return Err(End::Fatal(ErrorFields::error("58P01", e.to_string())))
        }
        Err(e) => {
            return Err(End::fatal(
                "XX000",
                format!("walrelay: reading the spool: {e}"),
            ))
        }
    };
    let next = Lsn(pos.0 + data.len() as u64);
    let mut out = BytesMut::with_capacity(data.len() + 32);
    XLogData {
        start: pos,
        end: w.end.max(next),
        send_time: pg_now(),
        data: Bytes::from(data),
    }
    .encode_copy_data(&mut out);
    s.write(&out).await?;
    s.entry.wal(next);
    s.entry.primary_end(w.end);
    Ok(next)
}

async fn keepalive(s: &mut Session<'_>, end: Lsn, reply: bool) -> Result<(), End> {
    let mut body = Vec::with_capacity(18);
    body.push(b'k');
    body.extend_from_slice(&end.0.to_be_bytes());
    body.extend_from_slice(&pg_now().to_be_bytes());
    body.push(u8::from(reply));
    let mut out = BytesMut::new();
    encode::copy_data(&mut out, &body);
    s.write(&out).await
}

/// A status update with no position beyond `sent`, the end of the WAL this session sent the
/// standby (its start before any): a standby cannot have more from us, and the primary must
/// not believe it has (a synchronous commit would return on its word). A standby that
/// reconnects reports where it had got to, up to a segment ahead of where it asks to start:
/// lowered until it has been sent that far again, moments later.
fn clamp(s: &Session<'_>, d: &[u8], sent: Lsn) -> Bytes {
    let (d, clamped) = clamp_status_update(d, sent);
    if clamped {
        crate::metrics::Metrics::add(&s.ds.metrics.positions_clamped, 1);
        tracing::debug!("status update beyond the WAL sent ({sent}) lowered to it");
    }
    Bytes::copy_from_slice(&d)
}

/// A message of the standby during COPY; Some when COPY ends. `sent`: the end of what this
/// session has sent.
async fn standby_message(
    s: &mut Session<'_>,
    m: Result<FrontendMsg, WireError>,
    end: Lsn,
    sent: Lsn,
) -> Result<Option<CopyEnd>, End> {
    match m {
        Ok(FrontendMsg::CopyData(d)) => {
            if let Err(e) = check_feedback(&d) {
                return Err(End::fatal("08P01", format!("invalid standby message: {e}")));
            }
            let d = clamp(s, &d, sent);
            if let Some((w, f, r)) = status_positions(&d) {
                s.entry.reply(w, f, r);
            }
            let fb = Feedback::new(&d).map_err(|e| End::fatal("08P01", e.to_string()))?;
            // The standby asks for a reply (its wal_receiver_timeout is running out).
            if fb.is_status() && d.last().is_some_and(|b| *b != 0) {
                keepalive(s, end, false).await?;
            }
            // The first status update of a stream goes at once: the primary learns where the
            // standby is without waiting for the window.
            let first = fb.is_status() && !std::mem::replace(&mut s.reported, true);
            s.ds.spooler.feedback(s.chan, fb, first);
            Ok(None)
        }
        Ok(FrontendMsg::CopyDone) => {
            let mut out = BytesMut::new();
            encode::copy_done(&mut out);
            s.write(&out).await?;
            Ok(Some(CopyEnd::Standby))
        }
        Ok(FrontendMsg::Terminate) | Err(WireError::Closed) | Err(WireError::Io(_)) => {
            Err(End::Quiet)
        }
        Ok(FrontendMsg::Query(_)) | Ok(FrontendMsg::Other(_)) | Ok(FrontendMsg::Password(_)) => {
            // As PostgreSQL: anything but CopyData/CopyDone during COPY ends the session.
            Err(End::fatal("08P01", "invalid standby message type"))
        }
        Ok(FrontendMsg::CopyFail(why)) => Err(End::fatal("57014", format!("COPY failed: {why}"))),
        Err(e) => Err(End::fatal(
            "08P01",
            format!("invalid message from the standby: {e}"),
        )),
    }
}

/// After our CopyDone at the end of a timeline: feedback until the standby's CopyDone.
async fn drain_until_copy_done(s: &mut Session<'_>, sent: Lsn) -> Result<(), End> {
    loop {
        let m = tokio::select! {
            m = s.reader.read(walrelay_pgwire::parse_frontend) => m,
            _ = s.ds.shutdown.cancelled() => return Err(shutting_down()),
        };
        match m {
            Ok(FrontendMsg::CopyDone) => return Ok(()),
            Ok(FrontendMsg::CopyData(d)) => {
                let d = clamp(s, &d, sent);
                if let Ok(fb) = Feedback::new(&d) {
                    if let Some((w, f, r)) = status_positions(&d) {
                        s.entry.reply(w, f, r);
                    }
                    s.ds.spooler.feedback(s.chan, fb, false);
                }
            }
            Ok(FrontendMsg::Terminate) | Err(WireError::Closed) | Err(WireError::Io(_)) => {
                return Err(End::Quiet)
            }
            _ => return Err(End::fatal("08P01", "invalid standby message type")),
        }
    }
}

#[cfg(test)]
mod tests;
