//! The HTTP server of `[metrics] listen`: `GET /metrics` (Prometheus), `GET /healthz` ("ok",
//! or 503 with the reason while the downstream's spool is failed), `GET /livez` ("ok" while
//! the process answers: for liveness probes, which must not restart a process for a failed
//! spool it recovers from by itself),
//! `GET /` (the status page, one self-contained HTML file) and `GET /status.json`.
//!
//! HTTP/1.1 (hyper), GET and HEAD only, no request bodies read. Bounds: at most
//! [`MAX_CONNECTIONS`] connections at once, request heads of at most [`MAX_HEAD_BYTES`],
//! [`HEAD_TIMEOUT`] to send a request head and [`CONNECTION_TIMEOUT`] for a whole connection.
//! Probes are served even when those connections are all taken: a connection beyond them
//! goes to the probe lane ([`probe_lane`], at most [`PROBE_LANE`] at once, more are closed at
//! once), which reads one small request head within [`PROBE_TIMEOUT`], answers `/healthz`
//! and `/livez` and tells anything else to come back later (503). A sampler records the chart's bandwidth once a second into a ring of
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
use tracing::debug;

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
        if let Some(h) = probe(req.uri().path().as_bytes(), &self.metrics) {
            return match h {
                Ok(()) => reply(StatusCode::OK, "text/plain", "ok\n".into()),
                Err(why) => reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", why),
            };
        }
        match req.uri().path() {
            "/metrics" => reply(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                expo::render(&self.metrics, &super::process_stats()),
            ),
            "/status.json" => reply(StatusCode::OK, "application/json", self.status_json()),
            "/" => reply(StatusCode::OK, "text/html; charset=utf-8", self.page()),
            _ => reply(
                StatusCode::NOT_FOUND,
                "text/plain",
                "not found: try /metrics, /healthz, /livez, /status.json or /\n".into(),
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

/// What a probe's path gets: `/healthz` what [`health`] says, `/livez` ok whatever the spool
/// (the process answers; a restart would not mend a failed spool, which the downstream opens
/// again by itself); None for any other path.
fn probe(path: &[u8], metrics: &Metrics) -> Option<Result<(), String>> {
    match path {
        b"/healthz" => Some(health(metrics)),
        b"/livez" => Some(Ok(())),
        _ => None,
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
/// `GET /healthz` and `GET /livez` get what [`probe`] says, anything else `503` (the port is busy), then the
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
    let path = line
        .strip_prefix(b"GET ")
        .and_then(|rest| rest.split(|&b| b == b' ').next());
    let reply = match path.and_then(|p| probe(p, &metrics)) {
        Some(Ok(())) => b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncache-control: no-store\r\ncontent-length: 3\r\nconnection: close\r\n\r\nok\n".to_vec(),
        Some(Err(why)) => format!("HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncache-control: no-store\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{why}", why.len()).into_bytes(),
        None => b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\nretry-after: 1\r\ncontent-length: 38\r\nconnection: close\r\n\r\nbusy: too many connections, try again\n".to_vec(),
    };
    let _ = tokio::time::timeout(PROBE_TIMEOUT, sock.write_all(&reply)).await;
}

/// Serves `listener` until `shutdown`, and runs the sampler.
pub async fn serve(server: Arc<Server>, listener: TcpListener, shutdown: CancellationToken) {
    tokio::spawn(server.clone().sample(shutdown.clone()));
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let lane = Arc::new(Semaphore::new(PROBE_LANE));
    let mut accept_errors = crate::tcp::AcceptErrors::new("metrics");
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

    /// A failed spool fails `/healthz` and not `/livez`, in the probe lane too: a liveness
    /// probe on `/healthz` restarted a downstream for what it mends by itself.
    #[tokio::test]
    async fn livez_answers_ok_while_the_spool_is_failed() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let m = Arc::new(Metrics::default());
        *m.ops.spool.failure.lock().unwrap() = Some("No space left on device".into());
        assert_eq!(probe(b"/livez", &m), Some(Ok(())));
        assert!(probe(b"/healthz", &m).is_some_and(|h| h.is_err()));
        assert_eq!(probe(b"/metrics", &m), None);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        for (path, status) in [("/livez", "200"), ("/healthz", "503"), ("/metrics", "503")] {
            let mut client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
                .await
                .unwrap();
            let (sock, _) = listener.accept().await.unwrap();
            let lane = tokio::spawn(probe_lane(sock, m.clone()));
            let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
            client.write_all(head.as_bytes()).await.unwrap();
            let mut answer = String::new();
            client.read_to_string(&mut answer).await.unwrap();
            lane.await.unwrap();
            assert!(
                answer.starts_with(&format!("HTTP/1.1 {status} ")),
                "{path}: {answer}"
            );
        }
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
