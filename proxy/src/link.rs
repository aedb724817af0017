//! The link between the halves: tonic gRPC over rustls (mutual TLS when `link.tls_ca` is set),
//! one bidirectional stream per standby session (see `proto/link.proto` for the messages and
//! `walrelay_proto::frame` for what they carry).
//!
//! The upstream serves; every accepted socket is wrapped in [`CountingIo`] so the bytes that
//! really crossed the link (TLS and HTTP/2 framing included) are counted. The downstream keeps
//! one lazily connected channel and opens a stream per standby; its sockets are counted too
//! (into the downstream's own counters) when it connects through [`client_channel_counted`].
//! The channel's connector ([`dial`]) tries the addresses of `downstream.upstream` in order.

use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

use crate::config::{Limits, LinkConfig, UpstreamAddrs};
use crate::metrics::Metrics;
use crate::tlsfiles::Swap;

pub mod dial;
pub mod tls;

pub use dial::DialError;

/// HTTP/2 flow-control windows of the link, per stream and per connection. HTTP/2's default
/// (64 KiB) makes the receiver send a WINDOW_UPDATE for every ~32 KiB it reads — link bytes
/// for nothing; with these, one per 512 KiB. Bounds what a peer may send ahead per session.
pub const STREAM_WINDOW: u32 = 1 << 20;
pub const CONNECTION_WINDOW: u32 = 8 << 20;
/// The connection window of the tunnels' connection, and of the upstream's side of every
/// connection: what a call received and its reader did not take yet counts against its
/// connection's window too, so with [`CONNECTION_WINDOW`] eight calls whose clients stopped
/// reading (or whose primary connection stopped taking data) would stop every other call on
/// the connection. Room for 64 such calls; each still holds at most [`STREAM_WINDOW`], so
/// memory is bounded by the calls a peer may have (`limits.max_sessions`), not by this.
pub const TUNNEL_CONNECTION_WINDOW: u32 = 64 << 20;
/// Streams a peer may make the server reset for its errors before it ends the connection
/// (hyper's default, which tonic's builder would otherwise switch off: RUSTSEC-2024-0003).
pub const MAX_LOCAL_ERROR_RESETS: usize = 1024;

/// Room for protobuf framing around the largest WAL message.
const FRAMING_SLACK: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("link TLS configuration: {0}")]
    Tls(String),
    #[error("invalid upstream address {0:?}: {1}")]
    Address(String, String),
}

/// Largest link message either side accepts.
pub fn max_link_message(limits: &Limits) -> usize {
    limits.max_message_bytes + FRAMING_SLACK
}

/// TLS for the upstream's link listener; None when the link is plaintext.
pub fn server_tls(link: &LinkConfig) -> Result<Option<Arc<rustls::ServerConfig>>, LinkError> {
    match link.plaintext {
        true => Ok(None),
        false => tls::server_config(link).map(Some),
    }
}

/// A lazily connecting channel from the downstream to the upstream half, trying the
/// addresses of `upstream` in order on each (re)connection (see [`dial`]).
pub fn client_channel(link: &LinkConfig, upstream: &UpstreamAddrs) -> Result<Channel, LinkError> {
    channel(link, upstream, None, &client_tls(link)?, CONNECTION_WINDOW)
}

/// The downstream's TLS toward the upstream (None: a plaintext link), which a reload may
/// replace: each new connection of the link takes the current one.
pub type ClientTls = Swap<Option<Arc<rustls::ClientConfig>>>;

/// The downstream's TLS toward the upstream as `link` configures it now.
pub fn client_tls_config(
    link: &LinkConfig,
) -> Result<Option<Arc<rustls::ClientConfig>>, LinkError> {
    match link.plaintext {
        true => Ok(None),
        false => tls::client_config(link).map(Some),
    }
}

/// [`client_tls_config`], replaceable.
pub fn client_tls(link: &LinkConfig) -> Result<ClientTls, LinkError> {
    client_tls_config(link).map(Swap::new)
}

/// [`client_channel`] for the WAL stream, counting socket bytes into the downstream's link
/// counters.
pub fn client_channel_counted(
    link: &LinkConfig,
    upstream: &UpstreamAddrs,
    tls: &ClientTls,
    metrics: Arc<Metrics>,
) -> Result<Channel, LinkError> {
    channel(link, upstream, Some(metrics), tls, CONNECTION_WINDOW)
}

/// [`client_channel_counted`] for the tunnels: a connection of their own, with
/// [`TUNNEL_CONNECTION_WINDOW`].
pub fn tunnel_channel_counted(
    link: &LinkConfig,
    upstream: &UpstreamAddrs,
    tls: &ClientTls,
    metrics: Arc<Metrics>,
) -> Result<Channel, LinkError> {
    channel(link, upstream, Some(metrics), tls, TUNNEL_CONNECTION_WINDOW)
}

/// The endpoint names the first address (HTTP/2 `:authority`); the connector dials the list
/// and puts TLS on itself, so the endpoint is `http` and has no connect timeout of its own
/// (each address gets `link.connect_timeout_secs` in the connector).
fn channel(
    link: &LinkConfig,
    upstream: &UpstreamAddrs,
    metrics: Option<Arc<Metrics>>,
    tls: &ClientTls,
    connection_window: u32,
) -> Result<Channel, LinkError> {
    let first = upstream.first();
    let ep = Endpoint::from_shared(format!("http://{first}"))
        .map_err(|e| LinkError::Address(first.to_string(), e.to_string()))?
        .http2_keep_alive_interval(Duration::from_secs(link.keepalive_secs))
        .keep_alive_timeout(Duration::from_secs(link.keepalive_secs))
        .keep_alive_while_idle(true)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(connection_window)
        .tcp_nodelay(true);
    Ok(ep.connect_with_connector_lazy(dial::Dialer::new(link, upstream, metrics, tls.clone())))
}

/// A TCP stream that counts the bytes read and written into process metrics.
pub struct CountingIo {
    inner: TcpStream,
    metrics: Arc<Metrics>,
    /// Count into the downstream's counters (`metrics.ops`) instead of the upstream's.
    downstream: bool,
}

impl CountingIo {
    /// The upstream's side: counts into `link_socket_bytes_*`.
    pub fn new(inner: TcpStream, metrics: Arc<Metrics>) -> Self {
        CountingIo {
            inner,
            metrics,
            downstream: false,
        }
    }
    /// The downstream's side: counts into `ops.link_socket_bytes_*_downstream`.
    fn downstream(inner: TcpStream, metrics: Arc<Metrics>) -> Self {
        CountingIo {
            inner,
            metrics,
            downstream: true,
        }
    }
    fn counters(&self) -> (&AtomicU64, &AtomicU64) {
        let m = &self.metrics;
        match self.downstream {
            false => (&m.link_socket_bytes_in, &m.link_socket_bytes_out),
            true => (
                &m.ops.link_socket_bytes_in_downstream,
                &m.ops.link_socket_bytes_out_downstream,
            ),
        }
    }
    fn count(c: &AtomicU64, n: usize) {
        Metrics::add(c, n as u64);
    }
}

impl AsyncRead for CountingIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        Self::count(self.counters().0, n);
        r
    }
}

impl AsyncWrite for CountingIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            Self::count(self.counters().1, n);
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for CountingIo {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

use walrelay_pgwire::replcmd::ReplCommand;
use walrelay_proto::link::{command, Command};
use walrelay_wal::lsn::{Lsn, TimeLineId};

/// A validated replication command as it travels on the link.
pub fn command_to_proto(cmd: &ReplCommand) -> Command {
    use walrelay_proto::link as p;
    let kind = match cmd {
        ReplCommand::IdentifySystem => command::Kind::IdentifySystem(p::IdentifySystem {}),
        ReplCommand::Show(name) => command::Kind::Show(p::Show { name: name.clone() }),
        ReplCommand::TimelineHistory(t) => {
            command::Kind::TimelineHistory(p::TimelineHistory { timeline: t.0 })
        }
        ReplCommand::StartReplication {
            slot,
            start,
            timeline,
        } => command::Kind::StartReplication(p::StartReplication {
            slot: slot.clone().unwrap_or_default(),
            start_lsn: start.0,
            timeline: timeline.map(|t| t.0).unwrap_or(0),
        }),
        ReplCommand::ReadReplicationSlot(s) => {
            command::Kind::ReadReplicationSlot(p::ReadReplicationSlot { slot: s.clone() })
        }
    };
    Command { kind: Some(kind) }
}

/// The command back from the link, checked again (the rendered SQL must parse to the same
/// command). A START_REPLICATION that names no slot uses `default_slot`.
pub fn command_from_proto(
    c: Command,
    default_slot: Option<&str>,
) -> Result<ReplCommand, tonic::Status> {
    let cmd = match c
        .kind
        .ok_or_else(|| tonic::Status::invalid_argument("empty command"))?
    {
        command::Kind::IdentifySystem(_) => ReplCommand::IdentifySystem,
        command::Kind::Show(s) => ReplCommand::Show(s.name),
        command::Kind::TimelineHistory(t) => ReplCommand::TimelineHistory(TimeLineId(t.timeline)),
        command::Kind::StartReplication(s) => ReplCommand::StartReplication {
            slot: if s.slot.is_empty() {
                default_slot.map(str::to_string)
            } else {
                Some(s.slot)
            },
            start: Lsn(s.start_lsn),
            timeline: (s.timeline != 0).then_some(TimeLineId(s.timeline)),
        },
        command::Kind::ReadReplicationSlot(s) => ReplCommand::ReadReplicationSlot(s.slot),
    };
    match walrelay_pgwire::replcmd::parse(&cmd.to_sql()) {
        Ok(again) if again == cmd => Ok(cmd),
        _ => Err(tonic::Status::invalid_argument(format!(
            "invalid replication command on the link: {cmd:?}"
        ))),
    }
}
