//! Tunnels, the downstream's end: client sessions the downstream does not serve from its
//! spool, carried to the primary through the upstream (see `walrelay_proto::frame` for the
//! items and `crate::upstream` for the other end).
//!
//! - a physical replication session hands over when it sends BASE_BACKUP or creates a slot
//!   (`pg_basebackup`: the backup, and `-X stream`'s temporary slot and its streaming);
//! - `replication=database` sessions (logical replication: subscriptions, `pg_recvlogical`)
//!   and ordinary SQL sessions (PostgreSQL 17's slot synchronization) are tunnelled whole.
//!
//! The downstream authenticates the client itself; the upstream's connection uses the
//! upstream's own credentials. Every client message passes [`policy`] first: what it refuses
//! is answered here (after the primary's answers to everything sent before it) and never
//! reaches the primary. The client's BackendKeyData names its tunnel while it lives: cancel
//! requests with it are relayed to the tunnel's backend on the primary ([`cancel`]). The two
//! directions are relayed concurrently ([`relay`]), and memory is bounded per tunnel: a few
//! client messages and link frames at a time, and the link's HTTP/2 flow control holds the
//! upstream back while the client reads slowly.

mod answers;
pub mod cancel;
pub mod policy;
mod relay;
pub mod sql;
mod watch;

use std::time::{Duration, Instant};

use bytes::BytesMut;
use prost::Message;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tracing::info;

use walrelay_pgwire::scan::Scanner;
use walrelay_pgwire::{encode, ErrorFields, RawMsg};
use walrelay_proto::frame::{tunnel_frame_max, Dir, TunnelRx, TunnelTx};
use walrelay_proto::link::link_client::LinkClient;
use walrelay_proto::link::{TunnelFrame, TunnelOpen};
use walrelay_proto::PROTOCOL_VERSION;

use super::{Downstream, End, Reader, Standby, Writer};
use crate::link;
use crate::metrics::{GaugeGuard, Metrics};
use answers::Answers;
pub use policy::{Mode, Passed, Policy};

/// Frames queued toward the upstream per tunnel.
const QUEUE_FRAMES: usize = 4;
/// How often a long tunnel logs how far it got.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// One tunnelled session.
pub(crate) struct TunnelSession<'a> {
    pub ds: &'a Downstream,
    pub reader: &'a mut Reader,
    pub policy: Policy,
    scanner: Scanner,
    /// ReadyForQuery the primary still owes the client.
    answers: Answers,
    /// A refusal waiting for the answers to what was sent before it.
    held: Option<ErrorFields>,
    /// A message of the extended protocol was refused: as PostgreSQL after an error there,
    /// the client's messages are dropped up to its Sync, which the refusal answers.
    skip_to_sync: bool,
    /// Transaction status of the primary's last ReadyForQuery (for a refusal's).
    status: u8,
    /// What the primary's answers say: WAL sent, temporary slots created.
    watch: watch::PrimaryWatch,
    tx: TunnelTx,
    rx: TunnelRx,
    /// A frame built from the client's last message, not yet queued toward the upstream: no
    /// more of the client is read until it is.
    up_out: Option<TunnelFrame>,
    /// Bytes owed to the client, not yet queued for its socket: no more of the upstream is
    /// read until they are (a refusal may join them, see `relay`).
    client_out: BytesMut,
    progress: Progress,
}

/// Bytes relayed, logged every [`PROGRESS_EVERY`] while a tunnel is busy.
struct Progress {
    started: Instant,
    last: Instant,
    down: u64,
    up: u64,
}

impl Progress {
    fn tick(&mut self) {
        if self.last.elapsed() < PROGRESS_EVERY {
            return;
        }
        self.last = Instant::now();
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        info!(
            bytes_from_primary = self.down,
            bytes_to_primary = self.up,
            "tunnel progress: {:.1} MB from the primary so far ({:.1} MB/s)",
            self.down as f64 / 1e6,
            self.down as f64 / 1e6 / secs
        );
    }
}

/// Which session a startup asks for, from its `replication` parameter (the last, if it has
/// several); `Ok(None)`: physical replication, served from the spool. A value PostgreSQL
/// would refuse is refused the same way (FATAL 22023, before authentication).
pub(crate) fn mode_of(params: &[(String, String)]) -> Result<Option<Mode>, ErrorFields> {
    use walrelay_pgwire::replparam::{replication_of, Replication};
    Ok(match replication_of(params)? {
        Replication::Physical => None,
        Replication::Database => Some(Mode::Logical),
        Replication::Off => Some(Mode::Sql),
    })
}

/// A session tunnelled whole (logical replication, SQL): authentication succeeded here; the
/// primary's startup reply comes through the tunnel.
pub(crate) async fn whole(
    ds: &Downstream,
    reader: &mut Reader,
    writer: &mut Writer,
    standby: &Standby,
    mode: Mode,
) -> End {
    let mut b = BytesMut::new();
    encode::auth_ok(&mut b);
    if writer.write_all(&b).await.is_err() {
        return End::Quiet;
    }
    let mut session = match TunnelSession::new(ds, reader, mode) {
        Ok(s) => s,
        Err(end) => return end,
    };
    // The primary's startup reply ends with a ReadyForQuery too: a refusal waits for it.
    session.answers = Answers::awaiting_startup();
    info!(peer = %standby.peer, user = %standby.user, application_name = %standby.application_name, database = %standby.database, ?mode, "session goes through a tunnel to the primary");
    let open = session.open_for(standby, &standby.database, true);
    session.run(writer, open, None).await
}

/// Whether a command a physical session sent, which the spool cannot serve, continues the
/// session in a tunnel: base backups and slot commands (`pg_basebackup -X stream` creates a
/// temporary slot and streams from it on the same connection).
pub(crate) fn hands_over(q: &str) -> bool {
    use walrelay_pgwire::replcmd::TunnelCmd as C;
    matches!(
        walrelay_pgwire::replcmd::classify(q),
        Ok(C::BaseBackup
            | C::UploadManifest
            | C::CreateSlot { .. }
            | C::DropSlot { .. }
            | C::AlterSlot { .. })
    )
}

/// Continues a physical session in a tunnel from command `q` on. `Err`: the allowlist refused
/// `q` (the session goes on as it was). `Ok`: the session ended, and its spool channel `chan`
/// was closed first: the standby's own connection to the primary is not needed by a tunnel,
/// and would hold a walsender of the primary for as long as the backup runs.
pub(crate) async fn hand_over(
    ds: &Downstream,
    reader: &mut Reader,
    writer: &mut Writer,
    standby: &Standby,
    q: &str,
    chan: u32,
) -> Result<End, ErrorFields> {
    let session = match TunnelSession::new(ds, reader, Mode::Physical) {
        Ok(s) => s,
        Err(end) => {
            ds.spooler.close_channel(chan);
            return Ok(end);
        }
    };
    let passed = match session.policy.query(q) {
        Ok(p) => p,
        Err(e) => {
            Metrics::add(&ds.metrics.tunnel_refused, 1);
            return Err(e);
        }
    };
    ds.spooler.close_channel(chan);
    info!(peer = %standby.peer, application_name = %standby.application_name, command = %walrelay_pgwire::clip(q.trim(), 80), "physical session continues through a tunnel to the primary");
    let open = session.open_for(standby, "", false);
    let mut body = BytesMut::from(q.as_bytes());
    body.extend_from_slice(&[0]);
    let first = RawMsg {
        tag: b'Q',
        body: body.freeze(),
    };
    Ok(session.run(writer, open, Some((first, passed))).await)
}

impl<'a> TunnelSession<'a> {
    pub fn new(
        ds: &'a Downstream,
        reader: &'a mut Reader,
        mode: Mode,
    ) -> Result<TunnelSession<'a>, End> {
        let io = |e: std::io::Error| End::fatal("XX000", format!("walrelay: zstd: {e}"));
        Ok(TunnelSession {
            policy: Policy {
                mode,
                allow_slot_commands: ds.cfg.allow_slot_commands,
                allow_sql: ds.cfg.allow_sql,
                temp_slots: Vec::new(),
            },
            watch: watch::PrimaryWatch::new(mode == Mode::Logical),
            ds,
            reader,
            scanner: Scanner::default(),
            answers: Answers::default(),
            held: None,
            skip_to_sync: false,
            status: b'I',
            tx: TunnelTx::new(Dir::Up, ds.link_cfg.zstd_level, ds.link_cfg.zstd_window_log)
                .map_err(io)?,
            rx: TunnelRx::new(Dir::Down, tunnel_frame_max(ds.limits.max_message_bytes))
                .map_err(io)?,
            up_out: None,
            client_out: BytesMut::new(),
            progress: Progress {
                started: Instant::now(),
                last: Instant::now(),
                down: 0,
                up: 0,
            },
        })
    }

    /// The `TunnelOpen` for a client: `greet` when the downstream has not sent it the
    /// startup reply (a session tunnelled whole).
    pub fn open_for(&self, standby: &Standby, database: &str, greet: bool) -> TunnelOpen {
        TunnelOpen {
            protocol_version: PROTOCOL_VERSION,
            replication: self.policy.mode.replication().to_string(),
            database: database.to_string(),
            application_name: standby.application_name.clone(),
            user: standby.user.clone(),
            addr: standby.peer.to_string(),
            greet,
            zstd_level: self.ds.link_cfg.zstd_level,
            zstd_window_log: self.ds.link_cfg.zstd_window_log,
            max_message_bytes: self.ds.limits.max_message_bytes as u64,
            cancel_pid: standby.cancel_key.0,
            cancel_key: standby.cancel_key.1,
        }
    }

    /// Opens the tunnel with `first` (a client message already checked, or none) and relays
    /// until either side ends (`writer`: the client's socket).
    pub async fn run(
        mut self,
        writer: &mut Writer,
        open: TunnelOpen,
        first: Option<(RawMsg, Passed)>,
    ) -> End {
        let metrics = self.ds.metrics.clone();
        let _gauge = GaugeGuard::inc(&metrics.tunnels_active[1]);
        // The client's cancel requests are relayed while the tunnel lives.
        let _cancel = self
            .ds
            .cancels
            .register((open.cancel_pid, open.cancel_key), ());
        let Some(channel) = self.ds.spooler.channel() else {
            return End::fatal("08006", "walrelay: the link to the upstream is not set up");
        };
        let max = link::max_link_message(&self.ds.limits);
        let mut client = LinkClient::new(channel)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max);
        let (out, out_rx) = mpsc::channel(QUEUE_FRAMES);
        self.tx.open(&open.encode_to_vec());
        match first {
            Some((m, passed)) => {
                if let Err(end) = self.forward(&m, passed) {
                    return end;
                }
            }
            None => self.stage(),
        }
        if let Err(end) = self.send_staged(&out).await {
            return end;
        }
        let wait = Duration::from_secs(self.ds.link_cfg.connect_timeout_secs.max(1) + 30);
        let inbound = match tokio::time::timeout(wait, client.tunnel(ReceiverStream::new(out_rx))).await {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => {
                return End::fatal("08006", "walrelay: the upstream half runs an older walrelay that carries no tunnels (base backups, logical replication, slot synchronization); upgrade it")
            }
            Ok(Err(s)) => {
                return End::fatal("08006", format!("walrelay cannot open a tunnel to the primary through the upstream at {}: {}", self.ds.cfg.upstream, s.message()))
            }
            Err(_) => return End::fatal("08006", format!("walrelay: the upstream at {} did not answer a tunnel in time; check the link", self.ds.cfg.upstream)),
        };
        info!(mode = ?self.policy.mode, database = %open.database, "tunnel open through the upstream");
        let end = self.relay(inbound, &out, writer).await;
        info!(
            bytes_from_primary = self.progress.down,
            bytes_to_primary = self.progress.up,
            seconds = self.progress.started.elapsed().as_secs(),
            "tunnel closed"
        );
        end
    }

    /// Builds the frame for one client message (`passed`: what the policy found it asks of
    /// the primary); it goes up with [`TunnelSession::send_staged`].
    fn forward(&mut self, m: &RawMsg, passed: Passed) -> Result<(), End> {
        let mut b = BytesMut::new();
        m.encode(&mut b);
        self.progress.up += b.len() as u64;
        Metrics::add(&self.ds.metrics.tunnel_bytes_to_primary[1], b.len() as u64);
        if let Some(slot) = passed.temp_slot {
            self.watch.creating(slot, self.answers.answer_mark());
        }
        self.answers.client_sent(m.tag);
        self.tx
            .data(&b)
            .map_err(|e| End::fatal("XX000", format!("walrelay: zstd: {e}")))?;
        self.stage();
        Ok(())
    }

    /// Finishes the frame built so far into `up_out` (only ever empty here: the client is
    /// read only when it is).
    fn stage(&mut self) {
        if !self.tx.is_empty() {
            debug_assert!(self.up_out.is_none(), "a staged frame would be lost");
            self.up_out = Some(TunnelFrame {
                frame: self.tx.finish().into(),
            });
        }
    }

    /// Queues the staged frame toward the upstream, waiting for room.
    async fn send_staged(&mut self, out: &mpsc::Sender<TunnelFrame>) -> Result<(), End> {
        let Some(frame) = self.up_out.take() else {
            return Ok(());
        };
        out.send(frame).await.map_err(|_| tunnel_gone())
    }

    /// The session ends (`why` empty: the client said Terminate): the tunnel's END goes up,
    /// after any client message still staged.
    async fn leave(&mut self, out: &mpsc::Sender<TunnelFrame>, why: &str) -> End {
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            self.send_staged(out).await?;
            self.tx.end(why);
            self.stage();
            self.send_staged(out).await
        })
        .await;
        End::Quiet
    }
}

/// The tunnel's queue toward the upstream is gone: the call ended.
fn tunnel_gone() -> End {
    End::fatal(
        "08006",
        "walrelay: the tunnel to the primary ended; try again",
    )
}
