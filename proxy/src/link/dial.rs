//! The downstream's connector to the upstream half: walks the addresses of
//! `downstream.upstream` in order and returns the first socket that connects (and, unless
//! the link is plaintext, completes mutual TLS), each address within
//! `link.connect_timeout_secs`. tonic calls it for every (re)connection, so a connection that
//! drops starts again from the first address; one call tries each address once (the caller
//! decides about retries).

use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use super::{CountingIo, LinkError};
use crate::config::LinkConfig;
use crate::metrics::Metrics;
use crate::pgclient::BoxIo;

/// One address of `downstream.upstream`: `host:port`, IPv6 in brackets (`[::1]:7433`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamAddr {
    /// Name or IP address (IPv6 without brackets).
    pub host: String,
    pub port: u16,
}

impl FromStr for UpstreamAddr {
    type Err = LinkError;
    fn from_str(s: &str) -> Result<Self, LinkError> {
        let bad = |why: &str| LinkError::Address(s.to_string(), why.to_string());
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| bad("expected host:port"))?;
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| bad("the port is not a number from 1 to 65535"))?;
        let host = match host.strip_prefix('[') {
            Some(v6) => {
                let v6 = v6.strip_suffix(']').ok_or_else(|| bad("unclosed '['"))?;
                v6.parse::<std::net::Ipv6Addr>()
                    .map_err(|_| bad("brackets hold an IPv6 address, e.g. [::1]:7433"))?;
                v6
            }
            None if host.contains(':') => {
                return Err(bad("write an IPv6 address in brackets, e.g. [::1]:7433"))
            }
            None => host,
        };
        if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c == '/') {
            return Err(bad("expected host:port"));
        }
        Ok(UpstreamAddr {
            host: host.to_string(),
            port,
        })
    }
}

impl std::fmt::Display for UpstreamAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.host.contains(':') {
            true => write!(f, "[{}]:{}", self.host, self.port),
            false => write!(f, "{}:{}", self.host, self.port),
        }
    }
}

/// `downstream.upstream`: the upstream half's link addresses, tried in order; never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamAddrs(Vec<UpstreamAddr>);

impl UpstreamAddrs {
    pub fn new(addrs: Vec<UpstreamAddr>) -> Result<UpstreamAddrs, LinkError> {
        match addrs.is_empty() {
            true => Err(LinkError::Address(
                String::new(),
                "no address: give at least one host:port".into(),
            )),
            false => Ok(UpstreamAddrs(addrs)),
        }
    }

    /// Parses each of `addrs`.
    pub fn parse<S: AsRef<str>>(addrs: &[S]) -> Result<UpstreamAddrs, LinkError> {
        let parsed: Result<Vec<UpstreamAddr>, _> =
            addrs.iter().map(|a| a.as_ref().parse()).collect();
        UpstreamAddrs::new(parsed?)
    }

    pub fn first(&self) -> &UpstreamAddr {
        &self.0[0]
    }
}

impl std::ops::Deref for UpstreamAddrs {
    type Target = [UpstreamAddr];
    fn deref(&self) -> &[UpstreamAddr] {
        &self.0
    }
}

impl FromStr for UpstreamAddrs {
    type Err = LinkError;
    /// One address (`host:port`).
    fn from_str(s: &str) -> Result<Self, LinkError> {
        UpstreamAddrs::new(vec![s.parse()?])
    }
}

impl std::fmt::Display for UpstreamAddrs {
    /// `a:7433` or `a:7433, b:7433`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, a) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{a}")?;
        }
        Ok(())
    }
}

/// No address of `downstream.upstream` could be reached; each with why.
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to the upstream half at any of {}: check that it runs and that this host can reach it", list(.0))]
pub struct DialError(pub Vec<(UpstreamAddr, String)>);

fn list(f: &[(UpstreamAddr, String)]) -> String {
    let each: Vec<String> = f.iter().map(|(a, why)| format!("{a} ({why})")).collect();
    each.join(", ")
}

/// The connector tonic calls for each connection of the downstream's channel.
#[derive(Clone)]
pub(super) struct Dialer {
    addrs: Arc<UpstreamAddrs>,
    /// None: plaintext link.
    tls: Option<Arc<rustls::ClientConfig>>,
    /// `link.tls_server_name`; without it each address's host is checked.
    server_name: Option<String>,
    timeout: Duration,
    metrics: Option<Arc<Metrics>>,
}

impl Dialer {
    pub(super) fn new(
        link: &LinkConfig,
        addrs: &UpstreamAddrs,
        metrics: Option<Arc<Metrics>>,
    ) -> Result<Dialer, LinkError> {
        let tls = match link.plaintext {
            true => None,
            false => Some(client_tls(link)?),
        };
        Ok(Dialer {
            addrs: Arc::new(addrs.clone()),
            tls,
            server_name: link.tls_server_name.clone(),
            timeout: Duration::from_secs(link.connect_timeout_secs.max(1)),
            metrics,
        })
    }

    async fn dial_all(self) -> Result<hyper_util::rt::TokioIo<BoxIo>, DialError> {
        let mut failures = Vec::new();
        for (i, addr) in self.addrs.iter().enumerate() {
            let why = match tokio::time::timeout(self.timeout, self.dial(addr)).await {
                Ok(Ok(io)) => return Ok(hyper_util::rt::TokioIo::new(io)),
                Ok(Err(why)) => why,
                Err(_) => format!(
                    "timed out after {} s (link.connect_timeout_secs)",
                    self.timeout.as_secs()
                ),
            };
            if i + 1 < self.addrs.len() {
                tracing::warn!(upstream = %addr, "cannot connect to this upstream address ({why}); trying the next one");
            }
            failures.push((addr.clone(), why));
        }
        Err(DialError(failures))
    }

    /// TCP (no delay), counted when metrics are given, then TLS with ALPN h2.
    async fn dial(&self, addr: &UpstreamAddr) -> Result<BoxIo, String> {
        let tcp = TcpStream::connect((addr.host.as_str(), addr.port))
            .await
            .map_err(|e| e.to_string())?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        let io: BoxIo = match &self.metrics {
            Some(m) => Box::new(CountingIo::downstream(tcp, m.clone())),
            None => Box::new(tcp),
        };
        let Some(cfg) = &self.tls else {
            return Ok(io);
        };
        let name = self
            .server_name
            .clone()
            .unwrap_or_else(|| addr.host.clone());
        let name = ServerName::try_from(name.clone())
            .map_err(|e| format!("invalid TLS server name {name:?}: {e}"))?;
        let tls = tokio_rustls::TlsConnector::from(cfg.clone())
            .connect(name, io)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
            return Err(
                "TLS: the peer did not agree to HTTP/2 (ALPN h2): is it a walrelay upstream?"
                    .into(),
            );
        }
        Ok(Box::new(tls))
    }
}

impl tonic::codegen::Service<http::Uri> for Dialer {
    type Response = hyper_util::rt::TokioIo<BoxIo>;
    type Error = DialError;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, DialError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), DialError>> {
        Poll::Ready(Ok(()))
    }

    /// The URI is the endpoint's nominal one; the addresses come from the list.
    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        Box::pin(self.clone().dial_all())
    }
}

/// The downstream's TLS: the upstream's certificate must chain to `link.tls_ca`; our own
/// certificate (`link.tls_cert`/`tls_key`) is presented for mutual TLS.
fn client_tls(link: &LinkConfig) -> Result<Arc<rustls::ClientConfig>, LinkError> {
    let tls_err = |e: &dyn std::fmt::Display| LinkError::Tls(e.to_string());
    let ca = link.tls_ca.as_ref().ok_or_else(|| {
        LinkError::Tls("link.tls_ca is required to verify the upstream's certificate".into())
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for c in crate::tls::load_certs(ca).map_err(|e| tls_err(&e))? {
        roots.add(c).map_err(|e| tls_err(&e))?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err(&e))?
        .with_root_certificates(roots);
    let mut cfg = match (&link.tls_cert, &link.tls_key) {
        (Some(c), Some(k)) => {
            let certs = crate::tls::load_certs(c).map_err(|e| tls_err(&e))?;
            let key = crate::tls::load_key(k).map_err(|e| tls_err(&e))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| tls_err(&e))?
        }
        _ => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests;
