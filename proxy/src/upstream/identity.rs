//! A standby's identity: its own replication connection to the primary, under its
//! `application_name` and on its own slot, so that `pg_stat_replication`, the slot and
//! synchronous replication see the real standby while its WAL comes from the stream.
//!
//! Design (the least the primary can be asked to do with unmodified PostgreSQL): the primary
//! only counts a walsender's standby for synchronous replication and slot progress when that
//! walsender streams (state "streaming") and receives the standby's status updates. So the
//! identity runs the standby's replication commands (SHOW, READ_REPLICATION_SLOT) on its
//! connection, and when the standby starts streaming (from the downstream's spool) it starts
//! streaming too, at the primary's current position (nothing to catch up, so it is
//! "streaming" at once), reads and drops the WAL the primary sends it (it crossed the link
//! once, in the stream; read in batches, [`READ_PACE`]; on plain TCP most of a large
//! message dropped by the kernel unread: [`reads`]) and passes on the standby's
//! feedback. The primary's walsender for it costs what a local standby's costs; the WAL does
//! not cross the link again. Lag columns stay truthful (the primary times its WAL against the
//! real standby's replies); `sent_lsn` is what the primary sent to walrelay.
//!
//! The connection is re-established (every second) when it drops, as long as the standby is
//! connected to the downstream; the standby's latest feedback is passed on when it is back.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use walrelay_pgwire::repl::{keepalive_wants_reply, status_positions, XLogData};
use walrelay_pgwire::{encode, parse_tagged, ErrorFields, RawMsg, WireError};
use walrelay_proto::frame::Feedback;
use walrelay_proto::link::{Command, StandbyInfo, StartReplication};
use walrelay_wal::lsn::Lsn;

use super::encode::Event;
use super::feed::PRIMARY_TIMEOUT;
use super::{primary, Upstream};
use crate::link;
use crate::logging::Repeats;
use crate::monitor::{standbys::StandbyHandle, Half};
use crate::pgclient::{self, PgClientError, PrimaryConn};
use crate::silence::{self, Silence};

mod reads;
use reads::{paced_fill, Skipper, PACE_MARK, READ_BURST, READ_PACE, READ_ROOM};

/// Waits before the standby's connection to the primary is opened again after it ended: the
/// first, doubled after each attempt that failed soon, up to the last (a primary that is down
/// or refuses is not asked once a second for ever; one that restarts is found within it).
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(10);

/// Longest wait for the primary's answer to a standby's command (the downstream gives up on
/// it after 60 s).
const COMMAND_WAIT: Duration = Duration::from_secs(60);

/// What the stream passes to a standby's identity.
#[derive(Debug)]
pub enum ToIdentity {
    Command(Command),
    Start(StartReplication),
}

/// A standby the upstream has no room for (`limits.max_sessions`): each of its commands and
/// its START_REPLICATION are answered with an error naming the limit, as PostgreSQL answers
/// past `max_wal_senders` (SQLSTATE 53300); it never connects to the primary.
pub async fn refuse(
    chan: u32,
    mut rx: mpsc::Receiver<ToIdentity>,
    events: mpsc::Sender<Event>,
    max: usize,
) {
    let why = format!(
        "walrelay: the upstream already serves limits.max_sessions ({max}) standbys of this \
         downstream; raise it in the upstream's configuration or stop a standby"
    );
    while let Some(m) = rx.recv().await {
        let mut out = BytesMut::new();
        encode::error_response(&mut out, &ErrorFields::error("53300", why.clone()));
        if matches!(m, ToIdentity::Command(_)) {
            encode::ready_for_query(&mut out);
        }
        if events
            .send(Event::Backend {
                chan,
                bytes: out.to_vec(),
            })
            .await
            .is_err()
        {
            return;
        }
    }
}

/// One standby's identity task.
pub struct Identity {
    pub up: Arc<Upstream>,
    pub chan: u32,
    pub info: StandbyInfo,
    pub rx: mpsc::Receiver<ToIdentity>,
    /// The standby's latest status update and hot-standby feedback (newer replaces older:
    /// only the latest matters).
    pub feedback: watch::Receiver<[Option<Feedback>; 2]>,
    pub events: mpsc::Sender<Event>,
    pub synchronous: Arc<AtomicUsize>,
    /// End of the WAL the stream sent down (for the standby's entry).
    pub sent: watch::Receiver<Lsn>,
}

/// Counts a synchronous standby while it is held.
struct SyncGuard(Arc<AtomicUsize>);

impl Drop for SyncGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One connection to the primary as the standby, and where it stands.
struct Session {
    conn: PrimaryConn,
    /// Whether the primary lists the standby in `synchronous_standby_names` (then counted in
    /// the upstream's synchronous standbys while the connection lasts).
    sync: bool,
    _counted: Option<SyncGuard>,
    /// Whether it streams (before, it runs the standby's commands).
    streaming: bool,
    /// How long the primary has been silent on it, while it streams.
    silence: Silence,
    /// Not to read from the primary before this (None: at once).
    read_at: Option<tokio::time::Instant>,
    /// The WAL dropped unread ([`reads`]).
    skipper: Skipper,
}

/// Why one connection of the identity ended.
enum Ended {
    /// The standby left (its channel closed).
    Closed,
    /// The connection failed; try again.
    Lost(String),
}

impl Identity {
    pub async fn run(mut self) {
        let app = self.info.application_name.clone();
        let entry = self
            .up
            .metrics
            .ops
            .standbys
            .register(Half::Upstream, &app, &self.info.addr);
        let mut started: Option<StartReplication> = None;
        let shutdown = self.up.shutdown.clone();
        let (mut repeats, mut wait) = (Repeats::default(), RETRY_FIRST);
        loop {
            // The standby left while there was no connection (the primary down or refusing):
            // nothing more will come, so no connection is opened for it again.
            if self.rx.is_closed() && self.rx.is_empty() {
                return;
            }
            let began = tokio::time::Instant::now();
            let end = self.connection(&entry, &mut started).await;
            match end {
                Ended::Closed => return,
                Ended::Lost(why) => {
                    // A connection that ran a while starts the waits over.
                    if began.elapsed() > RETRY_MAX {
                        wait = RETRY_FIRST;
                    }
                    if let Some(n) = repeats.report(&why) {
                        let again = Repeats::since_text(n);
                        warn!(application_name = %app, "the standby's connection to the primary ended ({why}){again}; opening it again in {} s", wait.as_secs());
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = shutdown.cancelled() => return,
                    }
                    wait = (wait * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// One connection to the primary as the standby, until it or the standby ends.
    async fn connection(
        &mut self,
        entry: &StandbyHandle,
        started: &mut Option<StartReplication>,
    ) -> Ended {
        let mut s = match self.open(entry, started).await {
            Ok(s) => s,
            Err(ended) => return ended,
        };
        let shutdown = self.up.shutdown.clone();
        // The stream's sender is gone when the stream ended; then no more updates.
        let mut stream_open = true;
        loop {
            let (ask_at, gone_at) = (s.silence.ask_at(), s.silence.deadline());
            let streaming = s.streaming;
            let step = tokio::select! {
                r = self.sent.changed(), if stream_open => {
                    match r {
                        // The entry's `sent` follows the stream as it goes down, not only
                        // when the primary next writes to this connection.
                        Ok(()) => entry.wal(*self.sent.borrow_and_update()),
                        Err(_) => stream_open = false,
                    }
                    Ok(())
                }
                _ = shutdown.cancelled() => Err(Ended::Closed),
                m = self.rx.recv() => self.on_standby(&mut s, entry, started, m).await,
                r = self.feedback.changed(), if streaming => match r {
                    Ok(()) => self.pass_feedback(&mut s.conn, entry).await.map_err(Ended::Lost),
                    Err(_) => Ok(()),
                },
                // A primary silent for long (a lost host keeps the TCP connection open) is
                // asked for a reply, then given up, as the stream's own connection does.
                _ = silence::until(ask_at), if streaming => {
                    s.silence.asked();
                    self.ping(&mut s.conn).await.map_err(Ended::Lost)
                }
                _ = silence::until(gone_at), if streaming => Err(Ended::Lost(format!(
                    "nothing from the primary for {} s, though it was asked for a reply",
                    PRIMARY_TIMEOUT.as_secs()
                ))),
                r = paced_fill(&mut s.conn.reader, &mut s.conn.wake, s.read_at, s.skipper.room(READ_ROOM)), if streaming => match r {
                    Ok(n) => {
                        s.silence.heard(tokio::time::Instant::now());
                        self.drain_primary(&mut s, entry, n).await
                    }
                    Err(e) => Err(Ended::Lost(e.to_string())),
                },
            };
            if let Err(ended) = step {
                if matches!(ended, Ended::Closed) {
                    terminate(&mut s.conn).await;
                }
                return ended;
            }
        }
    }

    /// Connects to the primary as the standby and, when the standby streams already (a
    /// connection opened again), streams.
    async fn open(
        &mut self,
        entry: &StandbyHandle,
        started: &Option<StartReplication>,
    ) -> Result<Session, Ended> {
        let app = &self.info.application_name;
        let max = self.up.limits.max_message_bytes;
        // The primary's conninfo as reloaded last, not as it was when the stream opened.
        let mut conn = pgclient::connect(&self.up.primary_now(), app, max)
            .await
            .map_err(|e| Ended::Lost(e.to_string()))?;
        let sync = super::synchronous(&mut conn, app).await;
        let counted = sync.then(|| {
            self.synchronous.fetch_add(1, Ordering::Relaxed);
            SyncGuard(self.synchronous.clone())
        });
        if let Some(s) = started {
            self.start(&mut conn, s, sync, entry)
                .await
                .map_err(Ended::Lost)?;
        }
        Ok(Session {
            conn,
            sync,
            _counted: counted,
            streaming: started.is_some(),
            silence: Silence::new(Some(PRIMARY_TIMEOUT), tokio::time::Instant::now()),
            read_at: None,
            skipper: Skipper::default(),
        })
    }

    /// What the stream passed for the standby: a command to run (before it streams), its
    /// START_REPLICATION, or its end (`None`).
    async fn on_standby(
        &mut self,
        s: &mut Session,
        entry: &StandbyHandle,
        started: &mut Option<StartReplication>,
        m: Option<ToIdentity>,
    ) -> Result<(), Ended> {
        match m {
            None => Err(Ended::Closed),
            Some(ToIdentity::Command(c)) if !s.streaming => {
                match self.command(&mut s.conn, c).await {
                    Ok(()) => Ok(()),
                    Err(e) => Err(self.command_failed(e).await),
                }
            }
            Some(ToIdentity::Command(_)) => Ok(()),
            // The standby starts again (the next timeline, on the same session): this
            // connection streams from the primary's position already; a second
            // START_REPLICATION in COPY would end it.
            Some(ToIdentity::Start(st)) if s.streaming => {
                *started = Some(st);
                let ev = Event::Started {
                    chan: self.chan,
                    synchronous: s.sync,
                };
                let _ = self.events.send(ev).await;
                self.pass_feedback(&mut s.conn, entry)
                    .await
                    .map_err(Ended::Lost)
            }
            Some(ToIdentity::Start(st)) => {
                self.start(&mut s.conn, &st, s.sync, entry)
                    .await
                    .map_err(Ended::Lost)?;
                *started = Some(st);
                s.streaming = true;
                // Its silence counts from here: before, it had nothing to say.
                s.silence.heard(tokio::time::Instant::now());
                Ok(())
            }
        }
    }

    /// Tells the standby that its command failed with the connection to the primary.
    async fn command_failed(&mut self, e: PgClientError) -> Ended {
        let mut out = BytesMut::new();
        let msg = format!("walrelay: the connection to the primary failed during the command: {e}");
        encode::error_response(&mut out, &ErrorFields::error("08006", msg));
        encode::ready_for_query(&mut out);
        self.send(out.to_vec()).await;
        Ended::Lost(e.to_string())
    }

    /// After a read of `burst` bytes: handles every whole message, skips a large one still
    /// arriving (dropping what of it waits, [`reads`]), and reads on while the socket has
    /// more (up to [`READ_BURST`], the bytes dropped unread counted); when it has none, the
    /// next read waits [`READ_PACE`].
    async fn drain_primary(
        &mut self,
        s: &mut Session,
        entry: &StandbyHandle,
        mut burst: usize,
    ) -> Result<(), Ended> {
        loop {
            self.on_primary_bytes(&mut s.conn, entry).await?;
            if let Some(end) = s.skipper.after_messages(&mut s.conn) {
                entry.primary_end(end);
            }
            let lost = |e: WireError| Ended::Lost(e.to_string());
            burst += s.skipper.drop_waiting(&mut s.conn).map_err(lost)?;
            if burst >= READ_BURST {
                s.read_at = None;
                return Ok(());
            }
            match s.conn.reader.fill_at_most_ready(s.skipper.room(READ_ROOM)) {
                None => {
                    s.read_at = Some(tokio::time::Instant::now() + READ_PACE);
                    if let Some(w) = s.conn.wake.as_mut() {
                        w.defer(PACE_MARK);
                    }
                    return Ok(());
                }
                Some(Ok(n)) => burst += n,
                Some(Err(e)) => return Err(Ended::Lost(e.to_string())),
            }
        }
    }

    /// Every whole message the last reads completed.
    async fn on_primary_bytes(
        &mut self,
        conn: &mut PrimaryConn,
        entry: &StandbyHandle,
    ) -> Result<(), Ended> {
        let max = conn.max_message_bytes;
        while let Some(m) = conn
            .reader
            .try_read(|b| parse_tagged(b, |_| max))
            .map_err(|e| Ended::Lost(e.to_string()))?
        {
            self.on_primary_message(conn, entry, m).await?;
        }
        Ok(())
    }

    /// A message of the primary on this standby's streaming connection. The WAL crossed
    /// the link in the stream: dropped here, its end noted; a keepalive that asks is
    /// answered; an error ends the connection.
    async fn on_primary_message(
        &mut self,
        conn: &mut PrimaryConn,
        entry: &StandbyHandle,
        m: RawMsg,
    ) -> Result<(), Ended> {
        match m.tag {
            b'd' => {
                if let Ok(Some(x)) = XLogData::parse(&m.body) {
                    entry.primary_end(x.end);
                } else if keepalive_wants_reply(&m.body) {
                    self.reply(conn, entry).await.map_err(Ended::Lost)?;
                }
                entry.wal(*self.sent.borrow());
                Ok(())
            }
            b'E' => {
                let why = ErrorFields::parse(&m.body)
                    .map(|e| e.message)
                    .unwrap_or_default();
                Err(Ended::Lost(format!("the primary ended streaming: {why}")))
            }
            _ => Ok(()),
        }
    }

    /// Runs one of the standby's commands and sends the primary's answer down.
    async fn command(&mut self, conn: &mut PrimaryConn, c: Command) -> Result<(), PgClientError> {
        let cmd = match link::command_from_proto(c, None) {
            Ok(cmd) => cmd,
            Err(status) => {
                let mut out = BytesMut::new();
                encode::error_response(&mut out, &ErrorFields::error("08P01", status.message()));
                encode::ready_for_query(&mut out);
                self.send(out.to_vec()).await;
                return Ok(());
            }
        };
        let mut out = BytesMut::new();
        encode::query(&mut out, &cmd.to_sql());
        conn.writer
            .write_all(&out)
            .await
            .map_err(walrelay_pgwire::WireError::Io)?;
        // The answer as the primary gave it, within read_reply's bounds and COMMAND_WAIT.
        let msgs = tokio::time::timeout(COMMAND_WAIT, conn.read_reply("a standby's command"))
            .await
            .map_err(|_| PgClientError::BadReply {
                command: "a standby's command",
                why: format!("no answer within {} s", COMMAND_WAIT.as_secs()),
            })??;
        let mut answer = BytesMut::new();
        for m in &msgs {
            m.encode(&mut answer);
        }
        self.send(answer.to_vec()).await;
        Ok(())
    }

    async fn send(&self, bytes: Vec<u8>) {
        let _ = self
            .events
            .send(Event::Backend {
                chan: self.chan,
                bytes,
            })
            .await;
    }

    /// Streams as the standby, from the primary's current position, on the standby's slot;
    /// tells the downstream (STARTED), or sends the primary's error down (a slot that does not
    /// exist, ...), which the downstream gives the standby.
    async fn start(
        &mut self,
        conn: &mut PrimaryConn,
        s: &StartReplication,
        sync: bool,
        entry: &StandbyHandle,
    ) -> Result<(), String> {
        let id = conn.identify_system().await.map_err(|e| e.to_string())?;
        let slot = (!s.slot.is_empty()).then_some(s.slot.as_str());
        entry.set_slot(slot);
        match primary::start_replication(conn, slot, id.xlogpos, id.timeline).await {
            Ok(primary::Started::TimelineEnded { .. }) => {
                Err("the primary ended its current timeline at its own position".into())
            }
            Ok(primary::Started::Streaming) => {
                info!(application_name = %self.info.application_name, synchronous = sync, "the standby's own connection to the primary streams");
                let _ = self
                    .events
                    .send(Event::Started {
                        chan: self.chan,
                        synchronous: sync,
                    })
                    .await;
                self.pass_feedback(conn, entry).await
            }
            Err(PgClientError::Server(e)) => {
                let mut out = BytesMut::new();
                encode::error_response(&mut out, &e);
                self.send(out.to_vec()).await;
                Err(format!(
                    "the primary refused START_REPLICATION: {}",
                    e.message
                ))
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// The primary asks for a reply: the standby's latest feedback, or, before the standby's
    /// first one has arrived, a status update with no positions (which tells the primary the
    /// standby is there without claiming anything).
    async fn reply(&mut self, conn: &mut PrimaryConn, entry: &StandbyHandle) -> Result<(), String> {
        if self.feedback.borrow().iter().any(Option::is_some) {
            return self.pass_feedback(conn, entry).await;
        }
        write_copy_data(conn, &status_without_positions()).await
    }

    /// Asks the primary to answer at once: the standby's latest status update (or one with
    /// no positions) with its reply flag set.
    async fn ping(&self, conn: &mut PrimaryConn) -> Result<(), String> {
        let mut msg = match self.feedback.borrow()[0] {
            Some(f) if f.is_status() => f.bytes().to_vec(),
            _ => status_without_positions(),
        };
        if let Some(reply) = msg.last_mut() {
            *reply = 1;
        }
        write_copy_data(conn, &msg).await
    }

    /// The standby's latest feedback, to the primary.
    async fn pass_feedback(
        &mut self,
        conn: &mut PrimaryConn,
        entry: &StandbyHandle,
    ) -> Result<(), String> {
        let latest = *self.feedback.borrow_and_update();
        let mut out = BytesMut::new();
        for f in latest.iter().flatten() {
            if let Some((w, fl, r)) = status_positions(f.bytes()) {
                entry.reply(w, fl, r);
            }
            encode::copy_data(&mut out, f.bytes());
        }
        if out.is_empty() {
            return Ok(());
        }
        conn.writer
            .write_all(&out)
            .await
            .map_err(|e| format!("writing to the primary: {e}"))
    }
}

/// A status update that claims nothing (no positions), asking for no reply.
fn status_without_positions() -> Vec<u8> {
    walrelay_pgwire::repl::status_update(Lsn(0), Lsn(0), Lsn(0), false)
}

async fn write_copy_data(conn: &mut PrimaryConn, msg: &[u8]) -> Result<(), String> {
    let mut out = BytesMut::new();
    encode::copy_data(&mut out, msg);
    conn.writer
        .write_all(&out)
        .await
        .map_err(|e| format!("writing to the primary: {e}"))
}

/// Ends a connection to the primary politely (bounded: a primary that stopped reading does
/// not hold the caller).
pub async fn terminate(conn: &mut PrimaryConn) {
    let mut out = BytesMut::new();
    encode::terminate(&mut out);
    let _ = tokio::time::timeout(Duration::from_secs(1), conn.writer.write_all(&out)).await;
}
