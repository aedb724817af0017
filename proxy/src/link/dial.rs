//! The downstream's connector to the upstream half: walks the addresses of
//! `downstream.upstream` in order and returns the first socket that connects (and, unless
//! the link is plaintext, completes mutual TLS), each address within
//! `link.connect_timeout_secs`. tonic calls it for every (re)connection, so a connection that
//! drops starts again from the first address; one call tries each address once (the caller
//! decides about retries).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use super::CountingIo;
use crate::config::{LinkConfig, UpstreamAddr, UpstreamAddrs};
use crate::logging::Repeats;
use crate::metrics::Metrics;
use crate::pgclient::BoxIo;

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
    /// None: plaintext link (the current configuration at each dial: a reload replaces it).
    tls: super::ClientTls,
    /// `link.tls_server_name`; without it each address's host is checked.
    server_name: Option<String>,
    timeout: Duration,
    metrics: Option<Arc<Metrics>>,
    /// Each address's last failure as logged: the stream dials every second while the
    /// upstream is down, and a reason that repeats is logged once a minute.
    logged: Arc<Mutex<Vec<Repeats>>>,
}

impl Dialer {
    pub(super) fn new(
        link: &LinkConfig,
        addrs: &UpstreamAddrs,
        metrics: Option<Arc<Metrics>>,
        tls: super::ClientTls,
    ) -> Dialer {
        Dialer {
            addrs: Arc::new(addrs.clone()),
            tls,
            server_name: link.tls_server_name.clone(),
            timeout: Duration::from_secs(link.connect_timeout_secs.max(1)),
            metrics,
            logged: Arc::new(Mutex::new(
                std::iter::repeat_with(Repeats::default)
                    .take(addrs.len())
                    .collect(),
            )),
        }
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
                self.log_failure(i, addr, &why);
            }
            failures.push((addr.clone(), why));
        }
        Err(DialError(failures))
    }

    /// Logs that address `i` failed and the next is tried, once a minute for a repeated reason.
    fn log_failure(&self, i: usize, addr: &UpstreamAddr, why: &str) {
        if let Some(again) = self.failure_to_log(i, why) {
            tracing::warn!(upstream = %addr, "cannot connect to this upstream address ({why}){again}; trying the next one");
        }
    }

    /// Whether address `i`'s failure for `why` is to be logged now: Some(what to add, the
    /// times it came since it was last logged).
    fn failure_to_log(&self, i: usize, why: &str) -> Option<String> {
        let mut logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
        let n = logged.get_mut(i)?.report(why)?;
        Some(Repeats::since_text(n))
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
        let Some(cfg) = &self.tls.get() else {
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

#[cfg(test)]
mod tests;
