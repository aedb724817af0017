//! One stream to an upstream at a time: handshake, then the two directions, then (after a
//! failure) again, every second, until shutdown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tracing::{info, warn};

use walrelay_proto::frame::{self, Digest, Up, UpState, ALIVE_EVERY, SILENT_LIMIT};
use walrelay_proto::link::link_client::LinkClient;
use walrelay_proto::link::{to_downstream, to_upstream, ToDownstream, ToUpstream, Welcome};
use walrelay_wal::linkcodec::{CodecKind, WalDecoder};
use walrelay_wal::lsn::{Lsn, TimeLineId};

use super::decode::{self, DecodeStage, Failure, Item};
use super::handshake;
use super::writer::{Op, SpoolView, REOPEN_AFTER};
use super::{lock, ChanEvent, Out, Spooler};
use crate::link;
use crate::logging::Repeats;
use crate::metrics::Metrics;
use crate::silence;

/// Why a stream ended.
#[derive(Debug)]
enum Ended {
    /// WAL failed verification (the stream's codec falls back to zstd for a while).
    Integrity(String),
    /// The spool failed (it is opened again between streams: `SpoolWriter::reopen`).
    Spool(String),
    Other(String),
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ended::Integrity(s) | Ended::Spool(s) | Ended::Other(s) => f.write_str(s),
        }
    }
}

/// Longest wait for the last stream's queued WAL to reach the spool before the next stream
/// starts; then the attempt ends, and the next one waits again.
const SETTLE_MAX: Duration = Duration::from_secs(60);

/// Longest wait for the upstream's Welcome once it answered the stream: its opening on the
/// primary takes each host of `upstream.primary` up to that host's connect_timeout.
const WELCOME_WAIT: Duration = Duration::from_secs(3600);

fn other(s: impl std::fmt::Display) -> Ended {
    Ended::Other(s.to_string())
}

pub(super) async fn run(sp: Arc<Spooler>) {
    // The WAL stream and the tunnels on connections of their own (each connects when first
    // used): HTTP/2 counts what a call has received and its reader not yet taken against the
    // whole connection's window, so eight tunnels whose clients stopped reading (a megabyte
    // each) would leave the WAL stream on the same connection nothing, and its feedback
    // likewise the other way.
    let (cfg, addrs) = (&sp.link_cfg, &sp.cfg.upstream);
    let channel = link::client_channel_counted(cfg, addrs, &sp.link_tls, sp.metrics.clone());
    let tunnels = link::tunnel_channel_counted(cfg, addrs, &sp.link_tls, sp.metrics.clone());
    let (channel, tunnels) = match (channel, tunnels) {
        (Ok(c), Ok(t)) => (c, t),
        (Err(e), _) | (_, Err(e)) => {
            warn!("the link to the upstream cannot be set up: {e}");
            return;
        }
    };
    let _ = sp.channel.set(tunnels);
    let mut repeats = Repeats::default();
    loop {
        if sp.shutdown.is_cancelled() {
            return;
        }
        let end = tokio::select! {
            e = stream_once(&sp, channel.clone()) => e,
            _ = sp.shutdown.cancelled() => return,
        };
        sp.set_welcome(None);
        sp.set_error(Some(end.to_string()));
        link_down(&sp);
        match end {
            Ended::Integrity(why) => {
                Metrics::add(&sp.metrics.integrity_failures, 1);
                warn!("link stream: {why} (failed verification); nothing of it was spooled");
                if sp.codec() == CodecKind::Wal {
                    sp.start_fallback();
                }
            }
            Ended::Spool(why) => {
                if let Some(n) = repeats.report(&why) {
                    let again = Repeats::since_text(n);
                    warn!("no link stream: {why}{again}; standbys are served what the spool holds");
                }
            }
            Ended::Other(why) => {
                if let Some(n) = repeats.report(&why) {
                    let again = Repeats::since_text(n);
                    warn!(
                        "link to the upstream lost: {why} (upstream {}){again}; standbys are served from the spool, reconnecting every second",
                        sp.cfg.upstream
                    );
                }
            }
        }
        Metrics::add(&sp.metrics.ops.sessions_failed_downstream, 1);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = sp.shutdown.cancelled() => return,
        }
    }
}

/// Tells the sessions the link is down: a command waiting for the primary's answer fails.
fn link_down(sp: &Spooler) {
    let mut ch = lock(&sp.channels);
    ch.link_down();
    for c in ch.open.values() {
        let _ = c.events.try_send(ChanEvent::LinkDown);
    }
}

async fn stream_once(sp: &Arc<Spooler>, channel: tonic::transport::Channel) -> Ended {
    // The last stream's WAL still queued for the spool lands first: the Hello says where
    // the spool ends, and the upstream resumes there.
    if !sp.writer.settled(&mut sp.view.clone(), SETTLE_MAX).await {
        // Starting now would state a spool end that the queued WAL still moves: the upstream
        // would resume there and the first append would not continue the spool (a gap, which
        // fails it for good). Standbys are served meanwhile; the next attempt waits again.
        return other(format!(
            "the spool's writer has not written the last stream's WAL within {} s (its disk is \
             slow or stuck); the next stream waits for it",
            SETTLE_MAX.as_secs()
        ));
    }
    if let Err(f) = sp.writer.reopen(&mut sp.view.clone(), SETTLE_MAX).await {
        return spool_failed(&f);
    }
    let view = sp.view.borrow().clone();
    let empty = view.extent.end == Lsn(0);
    let hello = handshake::hello(&view, &sp.cfg.name, sp.codec(), &sp.link_cfg, &sp.limits);
    let (ltx, lrx) = mpsc::channel::<ToUpstream>(sp.queue_messages());
    let _ = ltx.try_send(ToUpstream {
        msg: Some(to_upstream::Msg::Hello(hello)),
    });
    let (inbound, welcome) = match open(sp, channel, lrx).await {
        Ok(opened) => opened,
        Err(e) => return e,
    };
    let stage = match Applier::start(sp, &welcome, empty) {
        Ok(stage) => stage,
        Err(e) => return e,
    };
    info!(upstream = %sp.cfg.upstream, timeline = welcome.timeline, start = %Lsn(welcome.start), codec = %welcome.codec, timeline_switches = welcome.switches.len(), "link stream open: spooling the primary's WAL");
    sp.saw_primary_end(welcome.primary_end);
    sp.set_welcome(Some(Arc::new(welcome)));
    sp.set_error(None);
    reopen_channels(sp);
    let DecodeStage { frames, mut failed } = stage;
    // Frames in to the decode stage as they arrive; the stage applies them in order.
    let recv = forward_frames(inbound, frames);
    let end = tokio::select! {
        f = failed.recv() => f.map_or_else(|| other("the decode stage stopped"), Ended::from),
        e = recv => e,
        e = send_loop(sp, ltx) => e,
        e = until_spool_fails(sp.view.clone()) => e,
    };
    // The stage's input closed with `recv`. What the thread still holds was received whole,
    // and is applied before the next stream's Hello states where the spool ends (a stuck
    // writer is waited for up to SETTLE_MAX, as `settled` does); a frame of it that fails
    // verification names the stream's end. A stage still applying after that wait keeps
    // its `Producer`, so the next stream's `settled` waits for it too.
    let end = match tokio::time::timeout(SETTLE_MAX, failed.recv()).await {
        Ok(Some(f)) => Ended::from(f),
        _ => end,
    };
    // The decode stage may have stopped on the failed spool first: the spool is the cause.
    match sp.view.borrow().failed.clone() {
        Some(why) => spool_failed(&why),
        None => end,
    }
}

fn spool_failed(why: &str) -> Ended {
    Ended::Spool(format!(
        "the spool failed ({why}); it is opened again every {} s until it takes WAL",
        REOPEN_AFTER.as_secs()
    ))
}

/// Ends the stream once the spool fails: its WAL would go nowhere, and the spool is opened
/// again only between streams.
async fn until_spool_fails(mut view: watch::Receiver<SpoolView>) -> Ended {
    let failed = view.wait_for(|v| v.failed.is_some()).await;
    match failed.map(|v| v.failed.clone()) {
        Ok(Some(why)) => spool_failed(&why),
        _ => std::future::pending().await,
    }
}

impl From<Failure> for Ended {
    fn from(f: Failure) -> Ended {
        match f {
            Failure::Integrity(why) => Ended::Integrity(why),
            Failure::Malformed(why) | Failure::Stopped(why) => Ended::Other(why),
        }
    }
}

/// Opens the link stream with the Hello queued in `lrx` and waits for the upstream's Welcome.
async fn open(
    sp: &Spooler,
    channel: tonic::transport::Channel,
    lrx: mpsc::Receiver<ToUpstream>,
) -> Result<(tonic::Streaming<ToDownstream>, Welcome), Ended> {
    let max = link::max_link_message(&sp.limits);
    let mut client = LinkClient::new(channel)
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    // The upstream answers at once, then opens the stream on the primary before its
    // Welcome, which can take each host of its `upstream.primary` the connect_timeout: that
    // wait is bounded by WELCOME_WAIT only, the connection's keepalive telling a dead upstream.
    let answered = Duration::from_secs(sp.link_cfg.connect_timeout_secs.saturating_add(30));
    let welcome = async {
        let call = client.stream(ReceiverStream::new(lrx));
        let Ok(inbound) = tokio::time::timeout(answered, call).await else {
            return Ok(None);
        };
        let mut inbound = inbound?.into_inner();
        let first = tokio::time::timeout(WELCOME_WAIT, inbound.next()).await;
        let Ok(first) = first else { return Ok(None) };
        Ok::<_, tonic::Status>(Some((inbound, first.transpose()?)))
    };
    match welcome.await.transpose() {
        None => Err(other(
            "the upstream did not answer in time (the link's TCP, TLS and HTTP/2 within \
             link.connect_timeout_secs + 30 s, its Welcome within an hour)",
        )),
        Some(Err(status)) => Err(other(status.message())),
        Some(Ok((
            i,
            Some(ToDownstream {
                msg: Some(to_downstream::Msg::Welcome(w)),
            }),
        ))) => Ok((i, w)),
        Some(Ok(_)) => Err(other("the upstream did not answer with Welcome")),
    }
}

/// Passes the stream's frames to the decode stage until the stream ends, stalls or fails.
async fn forward_frames(
    mut inbound: tonic::Streaming<ToDownstream>,
    frames: decode::FrameInput,
) -> Ended {
    loop {
        let Ok(next) = tokio::time::timeout(SILENT_LIMIT, inbound.next()).await else {
            return other(format!(
                "nothing from the upstream for {} s, though it sends at least every {} s: \
                 the stream is stalled (its framing lost?)",
                SILENT_LIMIT.as_secs(),
                ALIVE_EVERY.as_secs()
            ));
        };
        let f = match next {
            None => return other("the upstream closed the stream"),
            Some(Err(s)) => return other(s.message()),
            Some(Ok(ToDownstream {
                msg: Some(to_downstream::Msg::Frame(f)),
            })) => f,
            Some(Ok(_)) => return other("unexpected message from the upstream"),
        };
        if frames.send(f).await.is_err() {
            return other("the decode stage stopped");
        }
    }
}

/// After a (re)connect, every channel is opened again, started again if it was, and its
/// latest feedback goes again.
fn reopen_channels(sp: &Spooler) {
    lock(&sp.channels).reopen(Instant::now());
    sp.wake.notify_one();
}

/// The upstream → downstream direction: frames restored and verified by the decode stage
/// ([`decode`]) are applied here, in order, on the stage's thread: WAL and timeline switches
/// to the spool's writer, answers and starts to the standbys' channels.
struct Applier {
    sp: Arc<Spooler>,
    tli: TimeLineId,
    /// Until the decode stage is gone (it may outlive its stream), no next stream starts.
    _producer: super::writer::Producer,
}

impl Applier {
    /// Agrees on the stream's parameters and starts its decode stage.
    fn start(sp: &Arc<Spooler>, w: &Welcome, empty: bool) -> Result<DecodeStage, Ended> {
        let agreed = handshake::agree(w, &sp.link_cfg, &sp.limits, empty).map_err(other)?;
        let decoder = WalDecoder::new(&agreed.setup).map_err(|e| {
            other(format!(
                "cannot set up the {} decoder: {e}",
                agreed.setup.kind.name()
            ))
        })?;
        let (ops, tli) = (agreed.ops, agreed.tli);
        for op in ops {
            sp.writer
                .send_now(op)
                .map_err(|_| other("the spool's writer stopped"))?;
        }
        let caps = decode::Caps {
            max_raw: sp.limits.max_message_bytes,
            max_frame: link::max_link_message(&sp.limits),
        };
        let sink = Box::new(Applier {
            sp: sp.clone(),
            tli,
            _producer: sp.writer.producer(),
        });
        DecodeStage::spawn(decoder, caps, sp.metrics.clone(), sink)
            .map_err(|e| other(format!("cannot start the stream's decode thread: {e}")))
    }

    /// Hands an op to the spool's writer, waiting while its queue is full.
    fn write(&self, op: Op) -> Result<(), String> {
        self.sp
            .writer
            .send(op)
            .map_err(|_| "the spool's writer stopped".to_string())
    }
}

impl decode::Apply for Applier {
    fn apply(&mut self, items: Vec<Item>) -> Result<(), String> {
        let sp = &*self.sp;
        for item in items {
            match item {
                Item::Wal {
                    start,
                    primary_end,
                    bytes,
                } => {
                    sp.saw_primary_end(primary_end);
                    Metrics::add(&sp.metrics.wal_bytes_delivered, bytes.len() as u64);
                    let tli = self.tli;
                    self.write(Op::Append { tli, start, bytes })?;
                }
                Item::Timeline { tli, history } => {
                    self.tli = TimeLineId(tli);
                    let tli = self.tli;
                    self.write(Op::Switch { tli, history })?;
                }
                Item::Backend { chan, bytes } => route(sp, chan, ChanEvent::Backend(bytes)),
                Item::Started { chan, synchronous } => {
                    if let Some(c) = lock(&sp.channels).open.get_mut(&chan) {
                        c.synchronous = synchronous;
                    }
                    route(sp, chan, ChanEvent::Started { synchronous });
                }
                Item::Keepalive { end } => sp.saw_primary_end(end),
            }
        }
        Ok(())
    }

    fn ready(&self) -> bool {
        self.sp.writer.idle()
    }
}

fn route(sp: &Spooler, chan: u32, e: ChanEvent) {
    if let Some(c) = lock(&sp.channels).open.get(&chan) {
        if c.events.try_send(e).is_err() {
            warn!(
                chan,
                "a standby session does not take its channel's events; dropped one"
            );
        }
    }
}

/// The downstream → upstream direction: control items, due feedback and the spool's durable
/// end, batched into frames; an ALIVE item when nothing else went for [`ALIVE_EVERY`].
async fn send_loop(sp: &Spooler, ltx: mpsc::Sender<ToUpstream>) -> Ended {
    let mut state = UpState::default();
    let mut durable_rx = sp.writer.durable();
    // (timeline, end) last reported: a timeline switch can move the end back (the spool cut
    // to where the new timeline forks off), which the upstream must hear too.
    let mut durable_sent = (0, Lsn(0));
    let mut last_sent = tokio::time::Instant::now();
    loop {
        let next_due = lock(&sp.channels).open.values().filter_map(|c| c.due).min();
        let due = silence::until(next_due.map(tokio::time::Instant::from_std));
        let alive_due = last_sent + ALIVE_EVERY;
        tokio::select! {
            _ = sp.wake.notified() => {}
            _ = due => {}
            _ = tokio::time::sleep_until(alive_due) => {}
            r = durable_rx.changed() => if r.is_err() { return other("the spool's writer stopped") },
        }
        let (durable, tli) = {
            let v = sp.view.borrow();
            (v.extent.durable, v.extent.tli)
        };
        let mut out = build(sp, &mut state);
        if tli.0 != durable_sent.0 || durable > durable_sent.1 {
            let item = Up::Durable {
                tli: tli.0,
                end: durable.0,
            };
            push(&mut state, &mut out, &item);
            durable_sent = (tli.0, durable);
        }
        if out.0.is_empty() {
            if tokio::time::Instant::now() < alive_due {
                continue;
            }
            push(&mut state, &mut out, &Up::Alive);
        }
        frame::finish(&mut out.0, &out.1);
        Metrics::add(&sp.metrics.ops.link_messages_out_downstream, 1);
        let msg = ToUpstream {
            msg: Some(to_upstream::Msg::Frame(out.0.into())),
        };
        if ltx.send(msg).await.is_err() {
            return other("the link went away");
        }
        last_sent = tokio::time::Instant::now();
    }
}

type Building = (Vec<u8>, Digest);

fn push(state: &mut UpState, out: &mut Building, item: &Up<'_>) {
    state.put(&mut out.0, item);
    item.digest(&mut out.1);
}

/// Everything ready to go up: control items in order (a channel's due feedback before its
/// CLOSE), then the due feedback of the other channels.
fn build(sp: &Spooler, state: &mut UpState) -> Building {
    let mut out: Building = (Vec::new(), Digest::default());
    let now = Instant::now();
    let mut ch = lock(&sp.channels);
    let queue = std::mem::take(&mut ch.queue);
    for o in queue {
        match o {
            Out::Open(chan, info) => {
                let b = info.encode_to_vec();
                push(state, &mut out, &Up::Open { chan, info: &b });
            }
            Out::Command(chan, c) => {
                let b = c.encode_to_vec();
                push(state, &mut out, &Up::Command { chan, bytes: &b });
            }
            Out::Start(chan, s) => {
                let b = s.encode_to_vec();
                push(state, &mut out, &Up::Start { chan, cmd: &b });
            }
            Out::Close(chan) => {
                if let Some(mut c) = ch.open.remove(&chan) {
                    for f in c.pending.iter_mut().filter_map(Option::take) {
                        push(state, &mut out, &Up::Feedback { chan, msg: f });
                    }
                }
                push(state, &mut out, &Up::Close { chan });
            }
        }
    }
    for (chan, c) in ch.open.iter_mut() {
        if c.due.is_some_and(|d| d <= now) {
            c.due = None;
            for i in 0..2 {
                if let Some(f) = c.pending[i].take() {
                    push(
                        state,
                        &mut out,
                        &Up::Feedback {
                            chan: *chan,
                            msg: f,
                        },
                    );
                    c.last[i] = Some(f);
                }
            }
        }
    }
    out
}
