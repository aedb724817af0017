//! Primary → link: the primary's messages of one session, batched into link frames.
//!
//! A batch starts with the next message of the primary and takes every further message that
//! arrives within the session's window (`link.batch_window_ms`; zero for a standby that
//! `synchronous_standby_names` lists), up to [`BATCH_MAX`] bytes. It goes at once, without
//! waiting for the window, when it holds something a peer waits for: a command's result (any
//! message but CopyData), a keepalive (the primary may have asked for a reply), or when the
//! session has no window. Contiguous XLogData messages become one WAL run (one XLogData for
//! the standby), encoded by the session's codec when the frame is built.
//!
//! Reading waits when the session's queue to the link is full (`limits.queue_messages`
//! frames), so a slow link pauses reading from the primary instead of buffering.

use std::time::Duration;

use bytes::BytesMut;
use futures::FutureExt;
use tokio::io::AsyncRead;
use tokio::sync::mpsc;
use tonic::Status;

use walrelay_pgwire::repl::{keepalive_end, XLogData};
use walrelay_pgwire::{parse_tagged, RawMsg, WireError};
use walrelay_proto::frame::{self, Digest, DownState, WalHeader};
use walrelay_proto::link::{to_downstream, ToDownstream};
use walrelay_wal::linkcodec::WalEncoder;
use walrelay_wal::lsn::Lsn;

use crate::metrics::{timed, Metrics};
use crate::monitor::codec_totals::SessionCodecStats;
use crate::monitor::standbys::StandbyHandle;
use crate::pgio::MsgReader;

/// Most bytes (WAL and other messages of the primary) in one batch: within the smallest
/// allowed `limits.max_message_bytes`, so any downstream accepts the frame.
pub const BATCH_MAX: usize = 256 * 1024;

/// One run of contiguous WAL, or the primary's other messages, waiting to be framed.
enum Part {
    Wal { header: WalHeader, data: BytesMut },
    Backend(BytesMut),
}

/// What a batch holds before it is framed.
#[derive(Default)]
struct Batch {
    parts: Vec<Part>,
    bytes: usize,
    /// Something in it must not wait for the window.
    urgent: bool,
    /// The primary's WAL end last stated (XLogData or keepalive), and the end of its WAL.
    primary_end: Option<Lsn>,
    wal_end: Option<Lsn>,
}

impl Batch {
    /// Whether `m` (whose body is `len` bytes) still fits (an empty batch takes anything).
    fn fits(&self, len: usize) -> bool {
        self.bytes == 0 || self.bytes + len + 5 <= BATCH_MAX
    }

    fn push(&mut self, m: RawMsg) -> Result<(), WireError> {
        self.bytes += m.body.len() + 5;
        if m.tag == b'd' {
            if let Some(x) = XLogData::parse(&m.body)? {
                return self.push_wal(x);
            }
            self.primary_end = keepalive_end(&m.body).or(self.primary_end);
        }
        // Command results and keepalives: a standby (or the primary, through it) waits.
        self.urgent = true;
        match self.parts.last_mut() {
            Some(Part::Backend(b)) => m.encode(b),
            _ => {
                let mut b = BytesMut::with_capacity(m.body.len() + 5);
                m.encode(&mut b);
                self.parts.push(Part::Backend(b));
            }
        }
        Ok(())
    }

    fn push_wal(&mut self, x: XLogData) -> Result<(), WireError> {
        let data_end = x.data_end().ok_or(WireError::Malformed {
            tag: 'w',
            what: "XLogData runs past the end of the WAL address space",
        })?;
        self.primary_end = Some(x.end);
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

/// The primary → link direction of one session.
pub struct PrimaryToLink<'a, R> {
    pub reader: MsgReader<R>,
    pub tx: mpsc::Sender<Result<ToDownstream, Status>>,
    pub encoder: WalEncoder,
    pub metrics: &'a Metrics,
    pub standby: &'a StandbyHandle,
    /// Largest message accepted from the primary.
    pub max_message: usize,
    /// How long a batch may wait for more (zero: only what has already arrived).
    pub window: Duration,
    pub codec_stats: SessionCodecStats,
    pub state: DownState,
    /// A message read that did not fit the previous batch.
    pub pending: Option<RawMsg>,
}

fn primary_gone(e: WireError) -> Status {
    match e {
        WireError::Closed => Status::unavailable("the primary closed the replication connection"),
        e => Status::unavailable(format!("primary connection: {e}")),
    }
}

impl<R: AsyncRead + Unpin> PrimaryToLink<'_, R> {
    /// Runs until the primary or the link goes away.
    pub async fn run(mut self) -> Result<(), Status> {
        loop {
            let batch = self.gather().await?;
            let frame = self.frame(&batch)?;
            Metrics::add(&self.metrics.link_messages_out, 1);
            self.tx
                .send(Ok(ToDownstream {
                    msg: Some(to_downstream::Msg::Frame(frame.into())),
                }))
                .await
                .map_err(|_| Status::cancelled("the downstream went away"))?;
            if let Some(end) = batch.primary_end {
                self.standby.primary_end(end);
            }
            if let Some(end) = batch.wal_end {
                self.standby.wal(end);
            }
        }
    }

    async fn read(&mut self) -> Result<RawMsg, Status> {
        let max = self.max_message;
        self.reader
            .read(|b| parse_tagged(b, |_| max))
            .await
            .map_err(primary_gone)
    }

    /// Reads one batch: waits for its first message, then takes what arrives within the
    /// window (reads are cancellation-safe: a message is never half taken).
    async fn gather(&mut self) -> Result<Batch, Status> {
        let mut batch = Batch::default();
        let first = match self.pending.take() {
            Some(m) => m,
            None => self.read().await?,
        };
        batch.push(first).map_err(primary_gone)?;
        let deadline = tokio::time::Instant::now() + self.window;
        while !batch.urgent && batch.bytes < BATCH_MAX {
            let next = if self.window.is_zero() {
                match self.read().now_or_never() {
                    Some(m) => m?,
                    None => break,
                }
            } else {
                match tokio::time::timeout_at(deadline, self.read()).await {
                    Ok(m) => m?,
                    Err(_) => break,
                }
            };
            if !batch.fits(next.body.len()) {
                self.pending = Some(next);
                break;
            }
            batch.push(next).map_err(primary_gone)?;
        }
        Ok(batch)
    }

    /// Encodes the batch's WAL runs and builds its frame.
    fn frame(&mut self, batch: &Batch) -> Result<Vec<u8>, Status> {
        let (mut out, mut digest) = (Vec::with_capacity(batch.bytes / 2 + 64), Digest::default());
        let mut encoded = Vec::new();
        for part in &batch.parts {
            match part {
                Part::Wal { header, data } => {
                    let header = WalHeader {
                        raw_len: u32::try_from(data.len())
                            .map_err(|_| Status::internal("a WAL run longer than 4 GiB"))?,
                        ..*header
                    };
                    Metrics::add(&self.metrics.wal_bytes_in, data.len() as u64);
                    let start = Lsn(header.start);
                    timed(&self.metrics.encode_ns, || {
                        self.encoder.encode(start, data, &mut encoded)
                    })
                    .map_err(|e| Status::internal(format!("encoding WAL at {start}: {e}")))?;
                    Metrics::add(&self.metrics.wal_payload_bytes_out, encoded.len() as u64);
                    self.codec_stats
                        .observe(&self.encoder, &self.metrics.ops.codec);
                    self.state.put_wal(&mut out, &header, &encoded);
                    digest.wal(&header, data);
                }
                Part::Backend(b) => {
                    frame::put_backend(&mut out, b);
                    digest.backend(b);
                }
            }
        }
        frame::finish(&mut out, &digest);
        Ok(out)
    }
}
