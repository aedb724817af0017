//! The link listener's accept loop, in front of tonic: each connection gets a place in the
//! pre-authentication budget (`limits.max_startups`, and `limits.max_startups_per_address`
//! per source address) and `limits.startup_timeout_secs` to complete its TLS handshake (mutual
//! TLS when `link.tls_ca` is set) and send HTTP/2's client preface (inside TLS, or on a
//! `link.plaintext` link in the clear); only then is it handed to the gRPC server. Connections
//! refused, timed out or failing TLS are logged with the peer's address and the reason, and
//! counted in `walrelay_link_handshake_failures_total{reason}`. A connection whose handshake
//! failed keeps its place for `limits.auth_failure_delay_ms` after it is closed (see
//! [`crate::gate`]).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::Upstream;
use crate::gate::{Refused, StartupGate, StartupPass};
use crate::link::CountingIo;
use crate::live::Live;
use crate::logging::LogBudgets;
use crate::metrics::Metrics;

/// A link connection that has completed its handshake: TLS, or plaintext with
/// `link.plaintext`. Each comes with how many bytes of HTTP/2's preface, already read to
/// check the peer speaks HTTP/2, tonic has yet to be given.
pub(super) enum LinkIo {
    Plain(CountingIo, usize),
    Tls(Box<TlsStream<CountingIo>>, usize),
}

/// Connections ready for the gRPC server; the stream ends at shutdown.
pub(super) type Incoming = ReceiverStream<Result<LinkIo, std::io::Error>>;

/// Starts the accept loop on `listener` and returns what it hands to tonic.
pub(super) fn incoming(
    live: Arc<Live<Upstream>>,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Incoming {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(accept_loop(live, listener, shutdown, tx));
    ReceiverStream::new(rx)
}

async fn accept_loop(
    live: Arc<Live<Upstream>>,
    listener: TcpListener,
    shutdown: CancellationToken,
    tx: mpsc::Sender<Result<LinkIo, std::io::Error>>,
) {
    let gate = StartupGate::new();
    let mut accept_errors = crate::tcp::AcceptErrors::new("link");
    loop {
        let (sock, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    accept_errors.failed(e).await;
                    continue;
                }
            },
        };
        let up = live.get();
        let l = &up.limits;
        let pass = match gate.try_enter(peer.ip(), l.max_startups, l.max_startups_per_address) {
            Ok(p) => p,
            Err(why) => {
                let key = match why {
                    Refused::Total => "limits.max_startups",
                    Refused::PerAddress => "limits.max_startups_per_address",
                };
                failed(&up.metrics, peer, Reason::Busy, &format!("{key} reached"));
                continue;
            }
        };
        let _ = sock.set_nodelay(true);
        tokio::spawn(handshake(up, sock, peer, pass, tx.clone()));
    }
}

/// A connection's handshake within `limits.startup_timeout_secs`: TLS (the configuration
/// current now: a reload may have replaced the files) and HTTP/2's preface, or the preface
/// alone on a `link.plaintext` link; handed to tonic, or refused.
async fn handshake(
    up: Arc<Upstream>,
    sock: TcpStream,
    peer: SocketAddr,
    pass: StartupPass,
    tx: mpsc::Sender<Result<LinkIo, std::io::Error>>,
) {
    let deadline = Duration::from_secs(up.limits.startup_timeout_secs);
    let started = tokio::time::Instant::now();
    // A peer that closes without sending a byte (a TCP health check) is refused as before,
    // but has cost nothing: its place is not held.
    if matches!(
        tokio::time::timeout(deadline, sock.peek(&mut [0u8; 1])).await,
        Ok(Ok(0))
    ) {
        drop(sock);
        failed(
            &up.metrics,
            peer,
            Reason::Silent,
            "closed before its handshake",
        );
        return;
    }
    let deadline = deadline.saturating_sub(started.elapsed());
    let io = CountingIo::new(sock, up.metrics.clone());
    let r = match up.link_tls_acceptor() {
        Some(acceptor) => tls_accept(acceptor, io, deadline)
            .await
            .map(|s| LinkIo::Tls(Box::new(s), 0)),
        None => plain_accept(io, deadline)
            .await
            .map(|io| LinkIo::Plain(io, 0)),
    };
    match r {
        Ok(link) => {
            drop(pass);
            let _ = tx.send(Ok(link)).await;
        }
        Err((reason, why)) => {
            failed(&up.metrics, peer, reason, &why);
            // A peer failing handshakes in a loop, each costing a signature, gets at most
            // `limits.max_startups_per_address` of them per `limits.auth_failure_delay_ms`
            // (see `crate::gate`); one that timed out held its place for the whole deadline.
            if !matches!(reason, Reason::Timeout) {
                pass.failed();
            }
            pass.release(Duration::from_millis(up.limits.auth_failure_delay_ms))
                .await;
        }
    }
}

/// HTTP/2's client preface in the clear, within `deadline`.
async fn plain_accept(
    mut io: CountingIo,
    deadline: Duration,
) -> Result<CountingIo, (Reason, String)> {
    match tokio::time::timeout(deadline, preface(&mut io)).await {
        Ok(Ok(true)) => Ok(io),
        Ok(Ok(false)) => Err((
            Reason::Tls,
            "not an HTTP/2 client (link.plaintext is set: the peer must not use TLS)".into(),
        )),
        Ok(Err(e)) => Err((Reason::Tls, e.to_string())),
        Err(_) => Err((
            Reason::Timeout,
            "no HTTP/2 preface within limits.startup_timeout_secs".into(),
        )),
    }
}

/// HTTP/2's client connection preface: the first bytes of every plaintext link connection.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads HTTP/2's client preface (given to tonic again by [`LinkIo`]): false as soon as the
/// peer sent something else, or closed before all of it.
async fn preface<S: AsyncRead + Unpin>(s: &mut S) -> std::io::Result<bool> {
    let mut buf = [0u8; H2_PREFACE.len()];
    let mut n = 0;
    while n < buf.len() {
        let got = s.read(&mut buf[n..]).await?;
        if got == 0 || buf[n..n + got] != H2_PREFACE[n..n + got] {
            return Ok(false);
        }
        n += got;
    }
    Ok(true)
}

/// The TLS handshake, then HTTP/2's client preface from inside TLS, within `deadline`: a
/// peer with a valid certificate must still speak HTTP/2 in time (one that only completed the
/// handshake would otherwise hold its socket for good).
async fn tls_accept(
    acceptor: TlsAcceptor,
    io: CountingIo,
    deadline: Duration,
) -> Result<TlsStream<CountingIo>, (Reason, String)> {
    let started = tokio::time::Instant::now();
    let stream = match tokio::time::timeout(deadline, acceptor.accept(io)).await {
        Err(_) => {
            let why = "no TLS handshake within limits.startup_timeout_secs";
            return Err((Reason::Timeout, why.into()));
        }
        Ok(Err(e)) => {
            let e = e.to_string();
            let reason = match e.contains(crate::link::tls::PEER_NAMES_ERROR) {
                true => Reason::PeerName,
                false => Reason::Tls,
            };
            return Err((reason, e));
        }
        Ok(Ok(s)) => s,
    };
    let left = deadline.saturating_sub(started.elapsed());
    match tokio::time::timeout(left, tls_preface(stream)).await {
        Err(_) => Err((
            Reason::Timeout,
            "no HTTP/2 preface within limits.startup_timeout_secs after the TLS handshake".into(),
        )),
        Ok(Err(e)) => Err((Reason::Tls, e.to_string())),
        Ok(Ok(s)) => Ok(s),
    }
}

/// Reads HTTP/2's client preface from inside TLS (given to tonic again by [`LinkIo`]).
async fn tls_preface(mut stream: TlsStream<CountingIo>) -> std::io::Result<TlsStream<CountingIo>> {
    if !preface(&mut stream).await? {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not an HTTP/2 client (after the TLS handshake)",
        ));
    }
    Ok(stream)
}

#[derive(Debug, Clone, Copy)]
enum Reason {
    Timeout,
    Tls,
    /// Closed before sending anything: counted with `Tls`, its place not held.
    Silent,
    Busy,
    PeerName,
}

fn failed(m: &Metrics, peer: SocketAddr, reason: Reason, why: &str) {
    let (counter, label, i) = match reason {
        Reason::Timeout => (&m.refusals.link_handshake_timeout, "timeout", 0),
        Reason::Tls | Reason::Silent => (&m.refusals.link_handshake_tls, "tls", 1),
        Reason::Busy => (&m.refusals.link_handshake_busy, "busy", 2),
        Reason::PeerName => (&m.refusals.link_handshake_peer_name, "peer_name", 3),
    };
    Metrics::add(counter, 1);
    // Many peers, or one reconnecting in a loop (a TCP health check on the port), would
    // otherwise log a line each; the counter has them all. A budget per reason.
    static BUDGETS: LogBudgets<4> = LogBudgets::new();
    if let Some(more) = BUDGETS.within(i, "walrelay_link_handshake_failures_total") {
        warn!(%peer, reason = label, "link connection refused: {why}{more}");
    }
}

impl AsyncRead for LinkIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let (LinkIo::Plain(_, given) | LinkIo::Tls(_, given)) = this;
        if *given < H2_PREFACE.len() {
            let n = (H2_PREFACE.len() - *given).min(buf.remaining());
            buf.put_slice(&H2_PREFACE[*given..*given + n]);
            *given += n;
            return Poll::Ready(Ok(()));
        }
        match this {
            LinkIo::Plain(s, _) => Pin::new(s).poll_read(cx, buf),
            LinkIo::Tls(s, _) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for LinkIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            LinkIo::Plain(s, _) => Pin::new(s).poll_write(cx, buf),
            LinkIo::Tls(s, _) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            LinkIo::Plain(s, _) => Pin::new(s).poll_flush(cx),
            LinkIo::Tls(s, _) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            LinkIo::Plain(s, _) => Pin::new(s).poll_shutdown(cx),
            LinkIo::Tls(s, _) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl tonic::transport::server::Connected for LinkIo {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        match self {
            LinkIo::Plain(s, _) => s.connect_info(),
            LinkIo::Tls(s, _) => s.get_ref().0.connect_info(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    #[tokio::test]
    async fn the_preface_is_awaited_and_given_to_tonic() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let peer = |bytes: &'static [u8]| async move {
            let mut c = TcpStream::connect(addr).await.unwrap();
            for part in bytes.chunks(7) {
                c.write_all(part).await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            c
        };
        let metrics = Arc::new(Metrics::default());
        // The preface in pieces, then a frame: tonic reads both, in order.
        let (mut c, (s, _)) = tokio::join!(peer(H2_PREFACE), async { l.accept().await.unwrap() });
        let mut io = CountingIo::new(s, metrics.clone());
        assert!(preface(&mut io).await.unwrap());
        c.write_all(b"frame").await.unwrap();
        let mut link = LinkIo::Plain(io, 0);
        let mut got = [0u8; 29];
        link.read_exact(&mut got).await.unwrap();
        assert_eq!(&got[..24], H2_PREFACE);
        assert_eq!(&got[24..], b"frame");
        drop(c);
        // Anything else is refused at its first byte that differs, without waiting for more.
        let (_c, (s, _)) = tokio::join!(peer(b"\x16\x03\x01"), async { l.accept().await.unwrap() });
        let mut io = CountingIo::new(s, metrics.clone());
        let quick = tokio::time::timeout(Duration::from_millis(300), preface(&mut io)).await;
        assert!(!quick.expect("refused at once").unwrap());
        // A peer that closes inside the preface.
        let (c, (s, _)) = tokio::join!(peer(b"PRI * "), async { l.accept().await.unwrap() });
        drop(c);
        let mut io = CountingIo::new(s, metrics.clone());
        assert!(!preface(&mut io).await.unwrap());
        // A partial preface waits (the deadline cuts it).
        let (_c, (s, _)) = tokio::join!(peer(b"PRI * HT"), async { l.accept().await.unwrap() });
        let mut io = CountingIo::new(s, metrics);
        let stalled = tokio::time::timeout(Duration::from_millis(300), preface(&mut io)).await;
        assert!(stalled.is_err(), "a partial preface waits");
    }
}
