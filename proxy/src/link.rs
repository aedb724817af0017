//! The link between the halves: tonic gRPC over rustls (mutual TLS when `link.tls_ca` is set),
//! one bidirectional stream per standby session (see `proto/link.proto` for the messages).
//!
//! The upstream serves; every accepted socket is wrapped in [`CountingIo`] so the bytes that
//! really crossed the link (TLS and HTTP/2 framing included) are counted. The downstream keeps
//! one lazily connected channel and opens a stream per standby; its sockets are counted too
//! (into the downstream's own counters) when it connects through [`client_channel_counted`].

use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::{
    Certificate, Channel, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig,
};

use crate::config::{Limits, LinkConfig};
use crate::metrics::Metrics;

/// Room for protobuf framing around the largest WAL message.
const FRAMING_SLACK: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("link TLS configuration: {0}")]
    Tls(String),
    #[error("invalid upstream address {0:?}: {1}")]
    Address(String, String),
}

fn read(p: &std::path::Path) -> Result<Vec<u8>, LinkError> {
    std::fs::read(p).map_err(|source| LinkError::Read {
        path: p.display().to_string(),
        source,
    })
}

/// Largest link message either side accepts.
pub fn max_link_message(limits: &Limits) -> usize {
    limits.max_message_bytes + FRAMING_SLACK
}

/// TLS for the upstream's gRPC server; None when the link is plaintext.
pub fn server_tls(link: &LinkConfig) -> Result<Option<ServerTlsConfig>, LinkError> {
    if link.plaintext {
        return Ok(None);
    }
    let (Some(cert), Some(key)) = (&link.tls_cert, &link.tls_key) else {
        return Err(LinkError::Tls(
            "link.tls_cert and link.tls_key are required unless link.plaintext = true".into(),
        ));
    };
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(read(cert)?, read(key)?));
    if let Some(ca) = &link.tls_ca {
        tls = tls.client_ca_root(Certificate::from_pem(read(ca)?));
    }
    Ok(Some(tls))
}

/// A lazily connecting channel from the downstream to the upstream half.
pub fn client_channel(link: &LinkConfig, upstream: &str) -> Result<Channel, LinkError> {
    channel(link, upstream, None)
}

/// [`client_channel`], counting socket bytes into the downstream's link counters.
pub fn client_channel_counted(
    link: &LinkConfig,
    upstream: &str,
    metrics: Arc<Metrics>,
) -> Result<Channel, LinkError> {
    channel(link, upstream, Some(metrics))
}

fn channel(
    link: &LinkConfig,
    upstream: &str,
    metrics: Option<Arc<Metrics>>,
) -> Result<Channel, LinkError> {
    let scheme = if link.plaintext { "http" } else { "https" };
    let mut ep = Endpoint::from_shared(format!("{scheme}://{upstream}"))
        .map_err(|e| LinkError::Address(upstream.to_string(), e.to_string()))?
        .connect_timeout(Duration::from_secs(link.connect_timeout_secs))
        .http2_keep_alive_interval(Duration::from_secs(link.keepalive_secs))
        .keep_alive_timeout(Duration::from_secs(link.keepalive_secs))
        .keep_alive_while_idle(true)
        .tcp_nodelay(true);
    if !link.plaintext {
        let host = upstream
            .rsplit_once(':')
            .map(|(h, _)| h.trim_matches(['[', ']']))
            .unwrap_or(upstream);
        let mut tls = ClientTlsConfig::new().domain_name(
            link.tls_server_name
                .clone()
                .unwrap_or_else(|| host.to_string()),
        );
        if let Some(ca) = &link.tls_ca {
            tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
        }
        if let (Some(cert), Some(key)) = (&link.tls_cert, &link.tls_key) {
            tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        ep = ep
            .tls_config(tls)
            .map_err(|e| LinkError::Tls(e.to_string()))?;
    }
    Ok(match metrics {
        None => ep.connect_lazy(),
        Some(metrics) => ep.connect_with_connector_lazy(CountingConnector { metrics }),
    })
}

/// Connects TCP (no delay) and wraps the socket in a downstream [`CountingIo`]; tonic puts
/// TLS on top and applies `connect_timeout`.
#[derive(Clone)]
struct CountingConnector {
    metrics: Arc<Metrics>,
}

impl tonic::codegen::Service<http::Uri> for CountingConnector {
    type Response = hyper_util::rt::TokioIo<CountingIo>;
    type Error = std::io::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .unwrap_or("")
                .trim_matches(['[', ']'])
                .to_string();
            let port = uri.port_u16().unwrap_or(443);
            let s = TcpStream::connect((host.as_str(), port)).await?;
            s.set_nodelay(true)?;
            Ok(hyper_util::rt::TokioIo::new(CountingIo {
                inner: s,
                metrics,
                downstream: true,
            }))
        })
    }
}

/// A TCP stream that counts the bytes read and written into process metrics.
pub struct CountingIo {
    inner: TcpStream,
    metrics: Arc<Metrics>,
    /// Count into the downstream's counters (`metrics.ops`) instead of the upstream's.
    downstream: bool,
}

impl CountingIo {
    pub fn new(inner: TcpStream, metrics: Arc<Metrics>) -> Self {
        CountingIo {
            inner,
            metrics,
            downstream: false,
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

/// The XLogData header fields of consecutive `Wal` messages, delta-encoded (see `link.proto`):
/// both ends keep one of these per session.
#[derive(Debug, Default)]
pub struct WalPositions {
    next_start: u64,
    send_time: i64,
}

/// XLogData header fields in absolute form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalHeader {
    pub start: Lsn,
    pub end: Lsn,
    pub send_time: i64,
    pub raw_len: u32,
}

/// The integrity check of a downstream → upstream message (`ToUpstream.xxh3`): the feedback's
/// bytes, or the command as encoded (the receiver re-encodes what it decoded, so a corrupted
/// field shows).
pub fn upstream_checksum(msg: &walrelay_proto::link::to_upstream::Msg) -> u64 {
    use prost::Message;
    use walrelay_proto::link::to_upstream::Msg;
    match msg {
        Msg::Feedback(b) => xxhash_rust::xxh3::xxh3_64(b),
        Msg::Command(c) => xxhash_rust::xxh3::xxh3_64(&c.encode_to_vec()),
        _ => 0,
    }
}

impl WalHeader {
    /// xxh3-64 of the header's fields (see `Wal.header_xxh3` in link.proto).
    pub fn checksum(&self) -> u64 {
        let mut b = [0u8; 28];
        b[..8].copy_from_slice(&self.start.0.to_le_bytes());
        b[8..16].copy_from_slice(&self.end.0.to_le_bytes());
        b[16..24].copy_from_slice(&self.send_time.to_le_bytes());
        b[24..].copy_from_slice(&self.raw_len.to_le_bytes());
        xxhash_rust::xxh3::xxh3_64(&b)
    }
}

impl WalPositions {
    /// Fills the header fields of `w` for `h` and advances.
    pub fn encode(&mut self, h: &WalHeader, w: &mut walrelay_proto::link::Wal) {
        w.start_delta = h.start.0.wrapping_sub(self.next_start) as i64;
        w.end_delta = h
            .end
            .0
            .wrapping_sub(h.start.0.wrapping_add(h.raw_len as u64)) as i64;
        w.send_time_delta = h.send_time.wrapping_sub(self.send_time);
        w.raw_len = h.raw_len;
        w.header_xxh3 = h.checksum();
        self.next_start = h.start.0.wrapping_add(h.raw_len as u64);
        self.send_time = h.send_time;
    }

    /// Restores the header of `w` and advances.
    pub fn decode(&mut self, w: &walrelay_proto::link::Wal) -> WalHeader {
        let start = self.next_start.wrapping_add(w.start_delta as u64);
        let end = start
            .wrapping_add(w.raw_len as u64)
            .wrapping_add(w.end_delta as u64);
        let send_time = self.send_time.wrapping_add(w.send_time_delta);
        self.next_start = start.wrapping_add(w.raw_len as u64);
        self.send_time = send_time;
        WalHeader {
            start: Lsn(start),
            end: Lsn(end),
            send_time,
            raw_len: w.raw_len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wal_positions_round_trip_and_cost_nothing_when_contiguous() {
        let (mut enc, mut dec) = (WalPositions::default(), WalPositions::default());
        let headers = [
            WalHeader {
                start: Lsn(0x3000000),
                end: Lsn(0x3000100),
                send_time: 800_000_000_000_000,
                raw_len: 0x100,
            },
            WalHeader {
                start: Lsn(0x3000100),
                end: Lsn(0x3000200),
                send_time: 800_000_000_000_500,
                raw_len: 0x100,
            },
            // A new START_REPLICATION further back, a walEnd beyond the data, time going back.
            WalHeader {
                start: Lsn(0x2000000),
                end: Lsn(u64::MAX),
                send_time: -5,
                raw_len: 7,
            },
        ];
        for (i, h) in headers.iter().enumerate() {
            let mut w = walrelay_proto::link::Wal::default();
            enc.encode(h, &mut w);
            if i == 1 {
                assert_eq!((w.start_delta, w.end_delta), (0, 0));
            }
            assert_eq!(dec.decode(&w), *h);
            assert_eq!(w.header_xxh3, h.checksum());
        }
        // Any flipped bit of a position field shows in the header checksum.
        let mut w = walrelay_proto::link::Wal::default();
        WalPositions::default().encode(&headers[0], &mut w);
        for bit in 0..64 {
            let mut bad = w.clone();
            bad.start_delta ^= 1 << bit;
            let got = WalPositions::default().decode(&bad);
            assert_ne!(got.checksum(), w.header_xxh3, "start bit {bit}");
            let mut bad = w.clone();
            bad.end_delta ^= 1 << bit;
            let got = WalPositions::default().decode(&bad);
            assert_ne!(got.checksum(), w.header_xxh3, "end bit {bit}");
        }
    }
}
