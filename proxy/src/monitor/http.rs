//! The HTTP server of `[metrics] listen`: `GET /metrics` (Prometheus), `GET /healthz` ("ok",
//! or 503 with the reason while the downstream's spool is failed),
//! `GET /` (the status page, one self-contained HTML file) and `GET /status.json`.
//!
//! HTTP/1.1 (hyper), GET and HEAD only, no request bodies read. Bounds: at most
//! [`MAX_CONNECTIONS`] connections at once, request heads of at most [`MAX_HEAD_BYTES`],
//! [`HEAD_TIMEOUT`] to send a request head and [`CONNECTION_TIMEOUT`] for a whole connection.
//! Probes are served even when those connections are all taken: a connection beyond them
//! goes to the probe lane ([`probe_lane`], at most [`PROBE_LANE`] at once, more are closed at
//! once), which reads one small request head within [`PROBE_TIMEOUT`], answers `/healthz`
//! and tells anything else to come back later (503). A sampler records the chart's bandwidth once a second into a ring of
//! [`HISTORY`] samples (10 minutes).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::expo::{self, Halves, Sample};
use crate::metrics::Metrics;

pub const MAX_CONNECTIONS: usize = 32;
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections served by the probe lane at once.
pub const PROBE_LANE: usize = 16;
/// Time a connection in the probe lane gets to send its request head.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Largest request head the probe lane reads.
const PROBE_HEAD_BYTES: usize = 2048;
/// Samples kept for the chart (one per second).
pub const HISTORY: usize = 600;

/// The status page. Self-contained (inline CSS and JS); `/*INITIAL*/null` is replaced by the
/// current `/status.json` document so the first paint needs no request.
const PAGE: &str = include_str!("page.html");

/// What the server reads.
pub struct Server {
    metrics: Arc<Metrics>,
    halves: Halves,
    started: Instant,
    history: Mutex<VecDeque<Sample>>,
}

impl Server {
    pub fn new(metrics: Arc<Metrics>, halves: Halves) -> Arc<Server> {
        Arc::new(Server {
            metrics,
            halves,
            started: Instant::now(),
            history: Mutex::new(VecDeque::with_capacity(HISTORY)),
        })
    }

    fn status_json(&self) -> String {
        let history = self
            .history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .collect();
        let doc = expo::status(
            &self.metrics,
            self.halves,
            self.started.elapsed().as_secs_f64(),
            history,
        );
        serde_json::to_string(&doc).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    fn respond(&self, req: &Request<Incoming>) -> Response<Full<Bytes>> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return reply(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "GET only\n".into(),
            );
        }
        match req.uri().path() {
            "/metrics" => reply(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                expo::render(&self.metrics, &super::process_stats()),
            ),
            "/healthz" => match health(&self.metrics) {
                Ok(()) => reply(StatusCode::OK, "text/plain", "ok\n".into()),
                Err(why) => reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", why),
            },
            "/status.json" => reply(StatusCode::OK, "application/json", self.status_json()),
            "/" => reply(StatusCode::OK, "text/html; charset=utf-8", self.page()),
            _ => reply(
                StatusCode::NOT_FOUND,
                "text/plain",
                "not found: try /metrics, /healthz, /status.json or /\n".into(),
            ),
        }
    }

    /// The status page with the current `/status.json` document in it. Inside `<script>`,
    /// a `<` of the document's strings (a standby's application_name) could end the element
    /// (`</script>`) or, as `<!--<script>`, make its end tag part of its text, so that the
    /// page's code never runs: JSON writes every `<` as `\u003c` (only strings hold one).
    fn page(&self) -> String {
        let initial = self.status_json().replace('<', "\\u003c");
        PAGE.replace("/*INITIAL*/null", &initial)
    }

    /// Records one bandwidth sample a second until `shutdown`.
    async fn sample(self: Arc<Self>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut prev: Option<(Instant, (u64, u64))> = None;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let now = Instant::now();
            let cur = expo::chart_counters(&self.metrics, self.halves);
            if let Some((t0, (w0, l0))) = prev {
                let dt = now.duration_since(t0).as_secs_f64().max(1e-3);
                let s = Sample {
                    t: super::unix_now(),
                    wal_bps: cur.0.saturating_sub(w0) as f64 / dt,
                    link_bps: cur.1.saturating_sub(l0) as f64 / dt,
                };
                let mut h = self.history.lock().unwrap_or_else(|e| e.into_inner());
                if h.len() == HISTORY {
                    h.pop_front();
                }
                h.push_back(s);
            }
            prev = Some((now, cur));
        }
    }
}

/// What `GET /healthz` says: Err with the reason while the downstream's spool is failed (it
/// takes no WAL until it is opened again, which the downstream tries by itself every few
/// seconds: `spooler::writer::REOPEN_AFTER`).
fn health(metrics: &Metrics) -> Result<(), String> {
    match metrics.ops.spool.failure() {
        None => Ok(()),
        Some(why) => Err(format!(
            "unhealthy: the spool failed ({why}); it takes no WAL until it is opened again, \
             which walrelay tries by itself every few seconds: free space on its disk or fix \
             the I/O error\n"
        )),
    }
}

fn reply(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r.headers_mut().insert(
        hyper::header::CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-store"),
    );
    r
}

/// A connection beyond [`MAX_CONNECTIONS`]: one request head within [`PROBE_TIMEOUT`];
/// `GET /healthz` gets what [`health`] says, anything else `503` (the port is busy), then the
/// connection closes. Cheap on purpose: no metrics rendered, one small buffer.
async fn probe_lane(mut sock: tokio::net::TcpStream, metrics: Arc<Metrics>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = [0u8; PROBE_HEAD_BYTES];
    let mut n = 0;
    let head = tokio::time::timeout(PROBE_TIMEOUT, async {
        while n < buf.len() {
            match sock.read(&mut buf[n..]).await {
                Ok(0) | Err(_) => return false,
                Ok(k) => n += k,
            }
            if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                return true;
            }
        }
        false
    })
    .await;
    if head != Ok(true) {
        return;
    }
    let line = buf[..n].split(|&b| b == b'\r').next().unwrap_or_default();
    let healthz = line.starts_with(b"GET /healthz ");
    let reply = match (healthz, health(&metrics)) {
        (true, Ok(())) => b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncache-control: no-store\r\ncontent-length: 3\r\nconnection: close\r\n\r\nok\n".to_vec(),
        (true, Err(why)) => format!("HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncache-control: no-store\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{why}", why.len()).into_bytes(),
        (false, _) => b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\nretry-after: 1\r\ncontent-length: 38\r\nconnection: close\r\n\r\nbusy: too many connections, try again\n".to_vec(),
    };
    let _ = tokio::time::timeout(PROBE_TIMEOUT, sock.write_all(&reply)).await;
}

/// Serves `listener` until `shutdown`, and runs the sampler.
pub async fn serve(server: Arc<Server>, listener: TcpListener, shutdown: CancellationToken) {
    tokio::spawn(server.clone().sample(shutdown.clone()));
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let lane = Arc::new(Semaphore::new(PROBE_LANE));
    loop {
        let (sock, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    warn!("accept on the metrics listener failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            match lane.clone().try_acquire_owned() {
                Ok(p) => {
                    let metrics = server.metrics.clone();
                    tokio::spawn(async move {
                        let _p = p;
                        probe_lane(sock, metrics).await
                    });
                }
                Err(_) => debug!(%peer, "metrics listener: too many connections, closing this one"),
            }
            continue;
        };
        let server = server.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let r = server.respond(&req);
                async move { Ok::<_, Infallible>(r) }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .max_buf_size(MAX_HEAD_BYTES);
            let conn = builder.serve_connection(TokioIo::new(sock), svc);
            tokio::select! {
                r = tokio::time::timeout(CONNECTION_TIMEOUT, conn) => {
                    if let Ok(Err(e)) = r {
                        debug!(%peer, "metrics connection: {e}");
                    }
                }
                _ = shutdown.cancelled() => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthz_says_why_once_the_spool_failed() {
        let m = Metrics::default();
        assert_eq!(health(&m), Ok(()));
        *m.ops.spool.failure.lock().unwrap() =
            Some("writing 000000010000000000000003: No space left on device".into());
        let why = health(&m).unwrap_err();
        assert!(why.contains("No space left on device"), "{why}");
        assert!(why.contains("opened again"), "{why}");
    }

    /// A standby named `<!--<script>` made the page's JSON element swallow its own end tag
    /// and the page's script: the status page showed nothing while it was connected.
    #[test]
    fn a_standby_name_cannot_break_out_of_the_page_json() {
        let m = Arc::new(Metrics::default());
        let name = "<!--<script></script>\\<x";
        let _h = m
            .ops
            .standbys
            .register(super::super::Half::Downstream, name, "p");
        let server = Server::new(m, Halves::default());
        let page = server.page();
        let start = page.find("id=\"initial\">").unwrap() + "id=\"initial\">".len();
        let end = start + page[start..].find("</script>").unwrap();
        let json = &page[start..end];
        assert!(!json.contains('<'), "{json}");
        let doc: expo::StatusDoc = serde_json::from_str(json).unwrap();
        assert_eq!(doc.standbys[0].application_name, name);
        assert_eq!(
            page.matches("<script").count(),
            PAGE.matches("<script").count()
        );
    }
}
