//! The upstream's end of a tunnel (one `Tunnel` call): its own connection to the primary, as
//! the `TunnelOpen` item asks (physical or logical replication, or a read-only SQL session,
//! always with the upstream's credentials), and the protocol relayed both ways.
//!
//! Memory per tunnel is bounded: the primary is read only when the call's outgoing queue
//! ([`QUEUE_FRAMES`] frames of at most [`read_chunk`] bytes) has room, and that queue only
//! drains as fast as HTTP/2 flow control lets the downstream take it, which it does only as
//! fast as its client reads.

use std::time::Duration;

use bytes::BytesMut;
use futures::FutureExt;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};
use tracing::{info, warn};

use walrelay_pgwire::{encode, ErrorFields};
use walrelay_proto::frame::{tunnel_frame_max, TunnelItem, TunnelRx, TunnelTx, TUNNEL_DATA_MAX};
use walrelay_proto::link::{TunnelFrame, TunnelOpen};

use super::Upstream;
use crate::conninfo::HostSpec;
use crate::metrics::Metrics;
use crate::pgclient::{self, BoxIo, PgClientError, PrimaryConn};

/// Frames queued toward the downstream per tunnel.
pub const QUEUE_FRAMES: usize = 4;
/// Most bytes read from the primary into one frame: [`TUNNEL_DATA_MAX`], and half the
/// smaller `limits.max_message_bytes` of the two halves (`downstream_max`: the downstream's,
/// from `TunnelOpen`; 0 if it did not say), so that a frame of incompressible bytes still
/// fits the largest link message either half accepts.
pub fn read_chunk(own_max: usize, downstream_max: u64) -> usize {
    (own_max.min(theirs(own_max, downstream_max)) / 2).clamp(16 * 1024, TUNNEL_DATA_MAX)
}

/// The downstream's `limits.max_message_bytes` as its `TunnelOpen` states it; this upstream's
/// own (`own_max`) when it did not say (0).
fn theirs(own_max: usize, downstream_max: u64) -> usize {
    match downstream_max {
        0 => own_max,
        n => usize::try_from(n).unwrap_or(usize::MAX),
    }
}

/// Most bytes one frame from the downstream may restore after the first
/// ([`tunnel_frame_max`]): the downstream forwards each client message (at most its
/// `limits.max_message_bytes`, `downstream_max` from `TunnelOpen`) in a frame of its own, so
/// its limit decides, at most the largest any half may have; this upstream's own (`own_max`)
/// when the downstream did not say (0).
pub fn data_budget(own_max: usize, downstream_max: u64) -> usize {
    tunnel_frame_max(theirs(own_max, downstream_max).min(crate::config::MAX_MESSAGE_BYTES_MAX))
}

pub type Out = mpsc::Sender<Result<TunnelFrame, Status>>;

/// Reads the call's first frame: the `TunnelOpen` and any client bytes that came with it.
pub async fn first_frame(
    inbound: &mut Streaming<TunnelFrame>,
    rx: &mut TunnelRx,
) -> Result<(TunnelOpen, Vec<u8>), Status> {
    let first = tokio::time::timeout(Duration::from_secs(30), inbound.message())
        .await
        .map_err(|_| Status::deadline_exceeded("no TunnelOpen within 30 s"))??
        .ok_or_else(|| Status::cancelled("the downstream went away"))?;
    let items = rx
        .parse(&first.frame)
        .map_err(|e| Status::invalid_argument(format!("malformed tunnel frame: {e}")))?;
    let mut items = items.into_iter();
    let open = match items.next() {
        Some(TunnelItem::Open(b)) => TunnelOpen::decode(&b[..])
            .map_err(|e| Status::invalid_argument(format!("malformed TunnelOpen: {e}")))?,
        _ => return Err(Status::invalid_argument("a tunnel must start with T_OPEN")),
    };
    let mut data = Vec::new();
    for it in items {
        match it {
            TunnelItem::Data(d) => data.extend_from_slice(&d),
            _ => {
                return Err(Status::invalid_argument(
                    "unexpected item in a tunnel's first frame",
                ))
            }
        }
    }
    Ok((open, data))
}

/// The startup parameters of the primary connection for `open`.
fn startup(open: &TunnelOpen) -> Result<Vec<(&str, &str)>, Status> {
    let mut p = Vec::new();
    match open.replication.as_str() {
        "true" => {
            p.push(("replication", "true"));
            p.push(("database", "replication"));
        }
        "database" | "" => {
            if open.database.is_empty() {
                return Err(Status::invalid_argument(
                    "a tunnel to a database needs its name",
                ));
            }
            if !open.replication.is_empty() {
                p.push(("replication", "database"));
            }
            p.push(("database", open.database.as_str()));
        }
        other => {
            return Err(Status::invalid_argument(format!(
                "unknown tunnel kind replication={other:?}"
            )))
        }
    }
    p.push(("application_name", open.application_name.as_str()));
    Ok(p)
}

/// Where a cancel request for a tunnel goes: its primary backend.
#[derive(Debug, Clone)]
pub struct CancelTarget {
    pub host: HostSpec,
    pub pid: u32,
    pub key: u32,
}

/// One tunnel: the primary connection and both directions.
pub struct TunnelSession {
    pub open: TunnelOpen,
    pub inbound: Streaming<TunnelFrame>,
    pub rx: TunnelRx,
    pub tx: TunnelTx,
    pub out: Out,
    /// Client bytes that came with the first frame.
    pub pending: Vec<u8>,
}

impl TunnelSession {
    /// Connects to the primary and relays until either side ends; the downstream hears why.
    pub async fn run(mut self, up: &Upstream) {
        let _gauge = crate::metrics::GaugeGuard::inc(&up.metrics.tunnels_active[0]);
        let conn = match self.connect(up).await {
            Ok(c) => c,
            Err(e) => {
                warn!("tunnel: cannot connect to the primary: {}", e.message);
                let mut b = BytesMut::new();
                encode::error_response(&mut b, &e);
                let _ = self
                    .send(|tx| tx.data(&b).map(|_| tx.end(&e.message)))
                    .await;
                return;
            }
        };
        // Cancel requests naming the client's key reach this tunnel's backend while it lives.
        let _cancel = conn.backend_key.and_then(|(pid, key)| {
            let target = CancelTarget {
                host: conn.server.host.clone(),
                pid,
                key,
            };
            up.cancels
                .register((self.open.cancel_pid, self.open.cancel_key), target)
        });
        let chunk = read_chunk(up.limits.max_message_bytes, self.open.max_message_bytes);
        let why = self.relay(conn, chunk, &up.metrics).await;
        match &why {
            Ok(()) => info!("tunnel ended: the client left"),
            Err(w) => info!("tunnel ended: {w}"),
        }
        let reason = why.err().unwrap_or_default();
        let _ = self
            .send(|tx| {
                tx.end(&reason);
                Ok(())
            })
            .await;
    }

    async fn connect(&self, up: &Upstream) -> Result<PrimaryConn, ErrorFields> {
        let params = startup(&self.open).map_err(|s| ErrorFields::fatal("08P01", s.message()))?;
        let mut conn =
            pgclient::connect_with(&up.cfg.primary, &params, up.limits.max_message_bytes)
                .await
                .map_err(|e| match e {
                    PgClientError::Server(f) => f,
                    e => ErrorFields::fatal(
                        "08006",
                        format!(
                            "walrelay's upstream cannot connect to the primary: {}",
                            e.reason()
                        ),
                    ),
                })?;
        if self.open.replication != "true" {
            // SQL through walrelay (an ordinary session, or a logical replication
            // connection's) is read-only on the primary. The primary's ParameterStatus
            // answering the SET (PostgreSQL 14+ reports the setting) updates `conn.params`,
            // so the client's greeting says so too.
            conn.simple_query("SET default_transaction_read_only = on")
                .await
                .map_err(|e| {
                    ErrorFields::fatal(
                        "08006",
                        format!(
                            "walrelay's upstream cannot make the session read-only: {}",
                            e.reason()
                        ),
                    )
                })?;
        }
        info!(replication = %self.open.replication, database = %self.open.database, application_name = %self.open.application_name, user = %self.open.user, addr = %self.open.addr, "tunnel open to the primary");
        Ok(conn)
    }

    /// Relays until the client leaves (Ok) or something ends the tunnel (Err: why).
    ///
    /// The two directions run concurrently, each with its own half of the primary
    /// connection: a backend blocked sending results reads no more of its client's messages,
    /// so a write to the primary may wait until the primary's results are read. A client
    /// that pipelines (sends queries before it reads the answers) would otherwise leave
    /// both sides waiting on each other for ever.
    async fn relay(
        &mut self,
        conn: PrimaryConn,
        chunk: usize,
        metrics: &Metrics,
    ) -> Result<(), String> {
        let key = (self.open.cancel_pid, self.open.cancel_key);
        let greeting = self.open.greet.then(|| greeting(&conn.params, key));
        let (mut r, buffered) = conn.reader.into_parts();
        let mut w = conn.writer;
        let first = std::mem::take(&mut self.pending);
        self.send(|tx| {
            if let Some(g) = &greeting {
                tx.data(g)?;
            }
            tx.data(&buffered)
        })
        .await?;
        let TunnelSession {
            inbound,
            rx,
            tx,
            out,
            ..
        } = self;
        // Whichever direction ends first ends the tunnel; the other is dropped where it
        // waits (neither loses a frame it has begun: see `queue`).
        let ended = tokio::select! {
            e = to_primary(inbound, rx, &mut w, &first, metrics) => e,
            e = from_primary(&mut r, tx, out, chunk, metrics) => Err(e),
        };
        ended?;
        terminate(&mut w, r).await;
        Ok(())
    }

    /// Builds one frame with `f` and queues it (waiting while the queue is full).
    async fn send(
        &mut self,
        f: impl FnOnce(&mut TunnelTx) -> std::io::Result<()>,
    ) -> Result<(), String> {
        queue(&mut self.tx, &self.out, f).await
    }
}

/// Builds one frame with `f` and queues it toward the downstream. The queue's room is taken
/// before the frame is built: dropped while it waits, this loses nothing of the compressed
/// stream the downstream has to follow.
async fn queue(
    tx: &mut TunnelTx,
    out: &Out,
    f: impl FnOnce(&mut TunnelTx) -> std::io::Result<()>,
) -> Result<(), String> {
    let room = out
        .reserve()
        .await
        .map_err(|_| "the downstream went away".to_string())?;
    f(tx).map_err(|e| format!("compressing tunnel data: {e}"))?;
    if !tx.is_empty() {
        room.send(Ok(TunnelFrame {
            frame: tx.finish().into(),
        }));
    }
    Ok(())
}

/// Why the link failed the tunnel's frames from the downstream. A frame over this half's
/// message limit (the downstream's `limits.max_message_bytes` is higher and a client sent a
/// message between the two) fails again on every try: the reason says which setting to change.
fn link_error(s: &Status) -> String {
    match s.code() {
        tonic::Code::OutOfRange => format!(
            "a client message is larger than the upstream takes ({}): set limits.max_message_bytes \
             on the upstream at least as high as on the downstream",
            s.message()
        ),
        _ => format!("the link: {}", s.message()),
    }
}

/// The client's direction: frames from the downstream, written to the primary in order
/// (`first`: the client bytes that came with the tunnel's first frame). Ok: the client
/// left (END); Err: why the tunnel ends. While a write waits, no more frames are taken
/// from the link (its flow control holds the downstream back).
async fn to_primary(
    inbound: &mut Streaming<TunnelFrame>,
    rx: &mut TunnelRx,
    w: &mut WriteHalf<BoxIo>,
    first: &[u8],
    metrics: &Metrics,
) -> Result<(), String> {
    write_primary(w, first).await?;
    loop {
        let f = match inbound.message().await {
            Ok(Some(f)) => f,
            Ok(None) => return Err("the downstream closed the tunnel".into()),
            Err(s) => return Err(link_error(&s)),
        };
        let items = rx
            .parse(&f.frame)
            .map_err(|e| format!("malformed tunnel frame from the downstream: {e}"))?;
        for it in items {
            match it {
                TunnelItem::Data(d) => {
                    Metrics::add(&metrics.tunnel_bytes_to_primary[0], d.len() as u64);
                    write_primary(w, &d).await?
                }
                TunnelItem::End(_) => return Ok(()),
                TunnelItem::Open(_) => return Err("a second T_OPEN in a tunnel".into()),
            }
        }
    }
}

/// The primary's direction: what it sends, in frames of at most `chunk` bytes, until it
/// closes or fails (why). The primary is read only when the queue toward the downstream has
/// taken the last frame.
async fn from_primary(
    r: &mut ReadHalf<BoxIo>,
    tx: &mut TunnelTx,
    out: &Out,
    chunk: usize,
    metrics: &Metrics,
) -> String {
    let mut buf = BytesMut::with_capacity(chunk);
    loop {
        buf.clear();
        match r.read_buf(&mut buf).await {
            Ok(0) => return "the primary closed the connection".into(),
            Ok(_) => {}
            Err(e) => return format!("reading from the primary: {e}"),
        }
        // What else has arrived goes in the same frame (one flush of the compressor per
        // frame).
        while buf.len() < chunk {
            match r.read_buf(&mut buf).now_or_never() {
                Some(Ok(n)) if n > 0 => {}
                _ => break,
            }
        }
        Metrics::add(&metrics.tunnel_bytes_from_primary[0], buf.len() as u64);
        if let Err(e) = queue(tx, out, |tx| tx.data(&buf)).await {
            return e;
        }
    }
}

async fn write_primary(w: &mut WriteHalf<BoxIo>, b: &[u8]) -> Result<(), String> {
    if b.is_empty() {
        return Ok(());
    }
    w.write_all(b)
        .await
        .map_err(|e| format!("writing to the primary: {e}"))
}

/// The client left: the primary connection ends as a client's would (its own Terminate has
/// usually gone already), without waiting long for the primary.
async fn terminate(w: &mut WriteHalf<BoxIo>, mut r: ReadHalf<BoxIo>) {
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = w.shutdown().await;
        let mut sink = [0u8; 4096];
        while matches!(r.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// The primary's startup reply for a client that has not been greeted yet: its parameters,
/// the BackendKeyData the downstream chose for the client (`key`; the cancel requests it
/// relays name the tunnel by it; made up when it chose none) and ReadyForQuery.
fn greeting(params: &[(String, String)], key: (u32, u32)) -> Vec<u8> {
    let mut out = BytesMut::new();
    for (k, v) in params {
        encode::parameter_status(&mut out, k, v);
    }
    let (pid, key) = match key {
        (0, 0) => crate::cancelkeys::new_key(),
        k => k,
    };
    encode::backend_key_data(&mut out, pid, key);
    encode::ready_for_query(&mut out);
    out.to_vec()
}

#[cfg(test)]
mod tests {
    use super::{data_budget, read_chunk};
    use walrelay_proto::frame::TUNNEL_DATA_MAX;

    #[test]
    fn the_budget_of_a_frame_from_the_downstream_follows_its_limit() {
        // One client message of up to the downstream's limit (and its 5-byte header) fits.
        assert_eq!(data_budget(4 << 20, 4 << 20), (4 << 20) + TUNNEL_DATA_MAX);
        assert_eq!(data_budget(4 << 20, 64 << 20), (64 << 20) + TUNNEL_DATA_MAX);
        assert_eq!(
            data_budget(64 << 20, 256 << 10),
            (256 << 10) + TUNNEL_DATA_MAX
        );
        assert_eq!(data_budget(4 << 20, 0), (4 << 20) + TUNNEL_DATA_MAX);
        // A downstream claiming more than any half may have gets the most a half may have.
        assert_eq!(data_budget(4 << 20, u64::MAX), (1 << 30) + TUNNEL_DATA_MAX);
    }

    #[test]
    fn a_frame_fits_the_smaller_message_limit_of_the_halves() {
        assert_eq!(read_chunk(4 << 20, 4 << 20), 1 << 20);
        assert_eq!(read_chunk(4 << 20, 256 << 10), 128 << 10);
        assert_eq!(read_chunk(256 << 10, 0), 128 << 10);
        assert_eq!(read_chunk(1 << 30, u64::MAX), 1 << 20);
    }
}
