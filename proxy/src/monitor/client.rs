//! `walrelay status`: reads `/status.json` from a running process and prints it as tables.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;

use super::expo::StatusDoc;
use super::standbys::StandbyRow;
use walrelay_wal::lsn::Lsn;

/// Largest `/status.json` accepted.
const MAX_BODY: usize = 8 << 20;
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("{0:?} is not a URL like http://127.0.0.1:9187 (http only)")]
    Url(String),
    /// The cause is in the message, so not also the `source()` (see `SpoolError::Io`).
    #[error("cannot connect to {addr}: {cause}; is walrelay running with [metrics] listen = \"{addr}\" in its config?")]
    Connect { addr: String, cause: std::io::Error },
    #[error("no answer from {0} within {TIMEOUT:?}")]
    Timeout(String),
    #[error("{addr} does not answer like walrelay's metrics endpoint ({message}); is it the [metrics] listen address?")]
    Http { addr: String, message: String },
    #[error("{url} answered {status}; is this walrelay's metrics address?")]
    Status { url: String, status: u16 },
    #[error("{url} did not return walrelay's status document: {message}")]
    Json { url: String, message: String },
}

/// `host:port` of an `http://host[:port][/...]` URL (port 80 when it names none). A port that
/// is not a number up to 65535 is refused here, naming the URL, rather than becoming a host
/// name `host:99999:80` that fails to resolve.
fn authority(url: &str) -> Result<String, StatusError> {
    let bad = || StatusError::Url(url.into());
    let (host, _) = split_url(url)?;
    // Where a port would start: after an IPv6 literal's `]`, else at the one `:`.
    let after_host = match host.strip_prefix('[') {
        Some(v6) => v6.split_once(']').ok_or_else(bad)?.1,
        None => host.find(':').map_or("", |i| &host[i..]),
    };
    if host.len() == after_host.len() {
        return Err(bad());
    }
    match after_host {
        "" => Ok(format!("{host}:80")),
        p => match p.strip_prefix(':').map(str::parse::<u16>) {
            Some(Ok(_)) => Ok(host.to_string()),
            _ => Err(bad()),
        },
    }
}

/// An `http://` URL's authority (`host[:port]`) and what follows it (path, query, fragment).
fn split_url(url: &str) -> Result<(&str, &str), StatusError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| StatusError::Url(url.into()))?;
    Ok(rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len())))
}

/// The request target for `/status.json` under `url`'s path, so that an endpoint a reverse
/// proxy serves under a prefix (`http://gw/walrelay/`) is asked at `/walrelay/status.json`;
/// a URL that already ends in `/status.json` is taken as it is.
fn target(url: &str) -> Result<String, StatusError> {
    let (_, after) = split_url(url)?;
    let path = after.split(['?', '#']).next().unwrap_or("");
    let path = path.trim_end_matches('/');
    let path = path.strip_suffix("/status.json").unwrap_or(path);
    Ok(format!("{path}/status.json"))
}

/// Fetches and parses `<url>/status.json`.
pub async fn fetch(url: &str) -> Result<StatusDoc, StatusError> {
    let addr = authority(url)?;
    let path = target(url)?;
    let full = format!("http://{addr}{path}");
    let work = async {
        let sock = tokio::net::TcpStream::connect(&addr)
            .await
            .map_err(|cause| StatusError::Connect {
                addr: addr.clone(),
                cause,
            })?;
        let http = |e: hyper::Error| StatusError::Http {
            addr: addr.clone(),
            message: e.to_string(),
        };
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(sock))
            .await
            .map_err(http)?;
        tokio::spawn(conn);
        let req = hyper::Request::get(path.as_str())
            .header(hyper::header::HOST, &addr)
            .body(Empty::<Bytes>::new())
            .map_err(|e| StatusError::Url(format!("{url}: {e}")))?;
        let resp = send.send_request(req).await.map_err(http)?;
        if !resp.status().is_success() {
            return Err(StatusError::Status {
                url: full.clone(),
                status: resp.status().as_u16(),
            });
        }
        let body = Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| StatusError::Http {
                addr: addr.clone(),
                message: e.to_string(),
            })?
            .to_bytes();
        serde_json::from_slice(&body).map_err(|e| StatusError::Json {
            url: full.clone(),
            message: e.to_string(),
        })
    };
    tokio::time::timeout(TIMEOUT, work)
        .await
        .map_err(|_| StatusError::Timeout(addr.clone()))?
}

fn mb(v: u64) -> String {
    format!("{:.1} MB", v as f64 / 1e6)
}

fn opt_lsn(v: Option<u64>) -> String {
    v.map(|v| Lsn(v).to_string()).unwrap_or_else(|| "-".into())
}

/// The human tables `walrelay status` prints.
pub fn format(doc: &StatusDoc) -> String {
    let mut out = String::new();
    let halves: Vec<&str> = [
        doc.halves.upstream.then_some("upstream"),
        doc.halves.downstream.then_some("downstream"),
    ]
    .into_iter()
    .flatten()
    .collect();
    out.push_str(&format!(
        "walrelay {} ({}), up {:.0} s\n\n",
        doc.version,
        halves.join(" + "),
        doc.uptime_seconds
    ));
    let head = [
        "APPLICATION_NAME",
        "HALF",
        "SLOT",
        "SENT",
        "WRITE",
        "FLUSH",
        "REPLAY",
        "LAG",
        "LAG_S",
    ];
    let rows: Vec<[String; 9]> = doc.standbys.iter().map(standby_cells).collect();
    if rows.is_empty() {
        out.push_str("no standby connected\n");
    } else {
        let mut w = head.map(str::len);
        for r in &rows {
            for (wi, c) in w.iter_mut().zip(r) {
                *wi = (*wi).max(c.len());
            }
        }
        let line = |cells: &[&str]| {
            let mut l = String::new();
            for (i, (c, wi)) in cells.iter().zip(&w).enumerate() {
                if i < 3 {
                    l.push_str(&format!("{c:<wi$}  "));
                } else {
                    l.push_str(&format!("{c:>wi$}  "));
                }
            }
            l.trim_end().to_string() + "\n"
        };
        out.push_str(&line(&head));
        for r in &rows {
            out.push_str(&line(&r.each_ref().map(String::as_str)));
        }
    }
    let t = &doc.totals;
    out.push('\n');
    let ratio = t
        .ratio
        .map(|r| format!("{r:.2}x"))
        .unwrap_or_else(|| "-".into());
    // Each half counts its own side: the WAL from the primary and the link bytes sent are the
    // upstream's, the WAL delivered and (without an upstream here) the link bytes received
    // the downstream's, which the ratio then divides. A half this process does not run would
    // show a 0 that reads as "nothing flows".
    let (up, down) = (doc.halves.upstream, doc.halves.downstream);
    let link = match up {
        true => ("link out (socket bytes)", mb(t.link_sent_bytes)),
        false => ("link in (socket bytes)", mb(t.link_received_bytes)),
    };
    for (k, v) in [
        up.then(|| ("WAL in (from the primary)", mb(t.wal_received_bytes))),
        down.then(|| ("WAL delivered (to standbys)", mb(t.wal_delivered_bytes))),
        Some(link),
        Some(("link WAL payload", mb(t.link_payload_bytes))),
        Some(("ratio (WAL / link)", ratio)),
        Some(("integrity failures", t.integrity_failures.to_string())),
        Some((
            "block cache",
            format!(
                "{} in use, {} hits of {} images",
                mb(t.block_cache_bytes),
                t.fpi_cache_hits,
                t.fpis
            ),
        )),
    ]
    .into_iter()
    .flatten()
    {
        out.push_str(&format!("{k:<28} {v}\n"));
    }
    out
}

fn standby_cells(r: &StandbyRow) -> [String; 9] {
    [
        r.application_name.clone(),
        r.half.clone(),
        r.slot.clone().unwrap_or_else(|| "-".into()),
        Lsn(r.sent_lsn).to_string(),
        opt_lsn(r.write_lsn),
        opt_lsn(r.flush_lsn),
        opt_lsn(r.replay_lsn),
        r.lag_bytes.map(mb).unwrap_or_else(|| "-".into()),
        r.lag_seconds
            .map(|s| format!("{s:.1}"))
            .unwrap_or_else(|| "-".into()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            authority("http://127.0.0.1:9187").unwrap(),
            "127.0.0.1:9187"
        );
        assert_eq!(authority("http://h:1/x").unwrap(), "h:1");
        assert_eq!(authority("http://h").unwrap(), "h:80");
        assert!(authority("https://h:1").is_err());
        assert!(authority("127.0.0.1:9187").is_err());
        assert_eq!(authority("http://[::1]:9187/").unwrap(), "[::1]:9187");
        assert_eq!(authority("http://[::1]").unwrap(), "[::1]:80");
        assert_eq!(authority("http://h:9187?x").unwrap(), "h:9187");
        // A port that is no port is refused, not looked up as a host name.
        for bad in [
            "http://127.0.0.1:99999",
            "http://127.0.0.1:",
            "http://h:port",
            "http://::1:9187",
            "http://[::1]x",
            "http://[::1",
            "http://:9187",
            "http://",
        ] {
            assert!(authority(bad).is_err(), "{bad}: {:?}", authority(bad));
        }
    }

    #[test]
    fn status_json_is_asked_for_under_the_urls_path() {
        for (url, want) in [
            ("http://127.0.0.1:9187", "/status.json"),
            ("http://127.0.0.1:9187/", "/status.json"),
            ("http://h:1?x", "/status.json"),
            ("http://h:1/status.json", "/status.json"),
            ("http://gw/walrelay", "/walrelay/status.json"),
            ("http://gw/walrelay/", "/walrelay/status.json"),
            (
                "http://gw/dc2/walrelay/status.json?x#y",
                "/dc2/walrelay/status.json",
            ),
        ] {
            assert_eq!(target(url).unwrap(), want, "{url}");
        }
    }

    #[tokio::test]
    async fn fetch_asks_under_the_urls_path() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = vec![0; 4096];
            let n = s.read(&mut buf).await.unwrap();
            s.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                .await
                .unwrap();
            String::from_utf8_lossy(&buf[..n])
                .lines()
                .next()
                .unwrap()
                .to_string()
        });
        let e = fetch(&format!("http://127.0.0.1:{port}/walrelay/"))
            .await
            .unwrap_err();
        assert!(matches!(e, StatusError::Status { status: 404, .. }), "{e}");
        assert_eq!(server.await.unwrap(), "GET /walrelay/status.json HTTP/1.1");
    }

    #[test]
    fn table_has_a_row_per_standby_and_the_totals() {
        let m = crate::metrics::Metrics::default();
        crate::metrics::Metrics::add(&m.wal_bytes_in, 40_400_000);
        crate::metrics::Metrics::add(&m.link_socket_bytes_out, 1_600_000);
        let h = m
            .ops
            .standbys
            .register(super::super::Half::Downstream, "dc2_a", "p");
        h.set_slot(Some("dc2"));
        h.wal(Lsn(0x5688FD8));
        h.reply(Lsn(0x5688FD8), Lsn(0x5688FD8), Lsn(0x5000000));
        let halves = super::super::expo::Halves {
            upstream: true,
            downstream: true,
        };
        let text = format(&super::super::expo::status(&m, halves, 13.0, Vec::new()));
        println!("{text}");
        let row = text.lines().find(|l| l.starts_with("dc2_a")).expect(&text);
        for cell in ["downstream", "dc2", "0/5688FD8", "0/5000000", "6.9 MB"] {
            assert!(row.contains(cell), "{cell} not in {row:?}");
        }
        assert!(
            text.contains("ratio (WAL / link)           25.25x"),
            "{text}"
        );
    }

    /// A downstream-only process (DC2's usual deployment) shows what it received and
    /// delivered, not the upstream's counters, which are 0 there.
    #[test]
    fn totals_are_those_of_the_halves_the_process_runs() {
        let m = crate::metrics::Metrics::default();
        crate::metrics::Metrics::add(&m.wal_bytes_delivered, 40_400_000);
        crate::metrics::Metrics::add(&m.ops.link_socket_bytes_in_downstream, 1_600_000);
        crate::metrics::Metrics::add(&m.ops.link_socket_bytes_out_downstream, 20_000);
        let down = super::super::expo::Halves {
            upstream: false,
            downstream: true,
        };
        let text = format(&super::super::expo::status(&m, down, 13.0, Vec::new()));
        assert!(!text.contains("WAL in (from the primary)"), "{text}");
        assert!(!text.contains("link out"), "{text}");
        assert!(
            text.contains("WAL delivered (to standbys)  40.4 MB"),
            "{text}"
        );
        assert!(
            text.contains("link in (socket bytes)       1.6 MB"),
            "{text}"
        );
        assert!(
            text.contains("ratio (WAL / link)           25.25x"),
            "{text}"
        );

        let m = crate::metrics::Metrics::default();
        crate::metrics::Metrics::add(&m.wal_bytes_in, 40_400_000);
        crate::metrics::Metrics::add(&m.link_socket_bytes_out, 1_600_000);
        let up = super::super::expo::Halves {
            upstream: true,
            downstream: false,
        };
        let text = format(&super::super::expo::status(&m, up, 13.0, Vec::new()));
        assert!(!text.contains("WAL delivered"), "{text}");
        assert!(
            text.contains("WAL in (from the primary)    40.4 MB"),
            "{text}"
        );
        assert!(
            text.contains("link out (socket bytes)      1.6 MB"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn refused_connection_names_the_config_key() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let e = fetch(&format!("http://127.0.0.1:{port}"))
            .await
            .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("[metrics] listen"), "{msg}");
    }
}
