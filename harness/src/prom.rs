//! Reading a `walrelay run` process's `[metrics]` endpoint: a plain HTTP/1.0 GET, the
//! Prometheus text exposition format 0.0.4 parsed strictly, and the metric names of a PromQL
//! expression (the dashboard test checks them against what is exported).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Fetching or parsing an exposition failed.
#[derive(Debug, thiserror::Error)]
pub enum PromError {
    #[error("GET http://127.0.0.1:{port}{path}: {detail} (is the process running with [metrics] listen on that port?)")]
    Http {
        port: u16,
        path: String,
        detail: String,
    },
    /// The process did not answer within the time allowed (it may only be slow: a process at
    /// the lowest priority on a busy CPU can take seconds).
    #[error("GET http://127.0.0.1:{port}{path}: no answer within {timeout:?} (is the process running with [metrics] listen on that port?)")]
    NoAnswer {
        port: u16,
        path: String,
        timeout: Duration,
    },
    #[error("line {line}: {detail}: {text:?}")]
    Parse {
        line: usize,
        detail: String,
        text: String,
    },
}

/// One sample of the exposition: name, labels, value.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// `GET path` on 127.0.0.1:`port` (HTTP/1.0, at most `timeout`); the body of a 200 answer.
pub async fn http_get(port: u16, path: &str, timeout: Duration) -> Result<String, PromError> {
    let err = |detail: String| PromError::Http {
        port,
        path: path.to_string(),
        detail,
    };
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(timeout, fetch)
        .await
        .map_err(|_| PromError::NoAnswer {
            port,
            path: path.to_string(),
            timeout,
        })?
        .map_err(|e| err(e.to_string()))?;
    let text = String::from_utf8(raw).map_err(|_| err("the answer is not UTF-8".into()))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| err("not an HTTP answer".into()))?;
    let status = head.split(' ').nth(1).unwrap_or("");
    if status != "200" {
        return Err(err(format!("status {status}")));
    }
    Ok(body.to_string())
}

/// Scrapes `/metrics` on 127.0.0.1:`port` (5 s at most) and parses it.
pub async fn scrape(port: u16) -> Result<Vec<Sample>, PromError> {
    scrape_within(port, Duration::from_secs(5)).await
}

/// Scrapes `/metrics` on 127.0.0.1:`port` (`timeout` at most) and parses it.
pub async fn scrape_within(port: u16, timeout: Duration) -> Result<Vec<Sample>, PromError> {
    parse_exposition(&http_get(port, "/metrics", timeout).await?)
}

/// The samples named `name` whose labels include every pair of `labels`.
fn matching<'a>(
    samples: &'a [Sample],
    name: &'a str,
    labels: &'a [(&str, &str)],
) -> impl Iterator<Item = f64> + 'a {
    samples
        .iter()
        .filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
}

/// Sum of the samples named `name` whose labels include every pair of `labels` (0 if none).
pub fn sum(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    matching(samples, name, labels).sum()
}

/// Largest of the samples named `name` whose labels include every pair of `labels` (None if
/// none).
pub fn max(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    matching(samples, name, labels).reduce(f64::max)
}

fn is_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

/// Parses the text format 0.0.4 strictly: every line is `# HELP name text`, `# TYPE name
/// type`, or `name{label="value",...} value`; a family's TYPE precedes its samples.
pub fn parse_exposition(text: &str) -> Result<Vec<Sample>, PromError> {
    let mut typed = BTreeSet::new();
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let bad = |detail: &str| PromError::Parse {
            line: i + 1,
            detail: detail.to_string(),
            text: line.to_string(),
        };
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("");
            if !is_name(name) {
                return Err(bad("bad HELP line"));
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').ok_or_else(|| bad("bad TYPE line"))?;
            if !is_name(name) {
                return Err(bad("bad TYPE line"));
            }
            if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                return Err(bad("bad TYPE"));
            }
            if !typed.insert(name.to_string()) {
                return Err(bad("family typed twice"));
            }
            continue;
        }
        if line.starts_with('#') {
            return Err(bad("unexpected comment"));
        }
        out.push(parse_sample(line, &typed).map_err(|d| bad(&d))?);
    }
    Ok(out)
}

/// One `name{labels} value` line whose family was typed before.
fn parse_sample(line: &str, typed: &BTreeSet<String>) -> Result<Sample, String> {
    let i = line.find(['{', ' ']).ok_or("no value")?;
    let (name, mut rest) = line.split_at(i);
    if !is_name(name) {
        return Err("bad metric name".into());
    }
    if !typed.contains(name) {
        return Err(format!("{name} has no TYPE before it"));
    }
    let mut labels = BTreeMap::new();
    if let Some(r) = rest.strip_prefix('{') {
        let end = parse_labels(r, &mut labels)?;
        rest = &r[end + 1..];
    }
    let value = rest
        .strip_prefix(' ')
        .ok_or("not one space before the value")?;
    let value: f64 = match value {
        "NaN" => f64::NAN,
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().map_err(|_| format!("bad value {v:?}"))?,
    };
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Parses `key="value",...}` into `labels`; returns the index of the closing brace in `r`.
fn parse_labels(r: &str, labels: &mut BTreeMap<String, String>) -> Result<usize, String> {
    let mut chars = r.char_indices().peekable();
    loop {
        let Some((start, c)) = chars.next() else {
            return Err("unterminated labels".into());
        };
        if c == '}' {
            return Ok(start);
        }
        let mut key_end = start;
        while let Some(&(j, c)) = chars.peek() {
            if c == '=' {
                key_end = j;
                break;
            }
            chars.next();
        }
        let key = &r[start..key_end];
        if !is_name(key) {
            return Err(format!("bad label name {key:?}"));
        }
        if chars.next().map(|x| x.1) != Some('=') || chars.next().map(|x| x.1) != Some('"') {
            return Err("expected =\" after a label name".into());
        }
        let mut value = String::new();
        loop {
            match chars.next().map(|x| x.1) {
                Some('\\') => match chars.next().map(|x| x.1) {
                    Some('\\') => value.push('\\'),
                    Some('"') => value.push('"'),
                    Some('n') => value.push('\n'),
                    other => return Err(format!("bad escape {other:?}")),
                },
                Some('"') => break,
                Some(c) => value.push(c),
                None => return Err("unterminated label value".into()),
            }
        }
        if labels.insert(key.to_string(), value).is_some() {
            return Err(format!("label {key} twice"));
        }
        if chars.peek().map(|x| x.1) == Some(',') {
            chars.next();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_families_labels_and_escapes() {
        let text = "# HELP a_total help text\n# TYPE a_total counter\na_total{half=\"up\",x=\"q\\\"\\n\"} 3\n# TYPE b gauge\nb 1.5\n";
        let s = parse_exposition(text).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].labels["x"], "q\"\n");
        assert_eq!(sum(&s, "a_total", &[("half", "up")]), 3.0);
        assert_eq!(sum(&s, "a_total", &[("half", "down")]), 0.0);
        assert_eq!(sum(&s, "b", &[]), 1.5);
    }

    #[test]
    fn rejects_untyped_samples_and_bad_lines() {
        assert!(parse_exposition("a 1\n").is_err());
        assert!(parse_exposition("# TYPE a counter\na{x=1} 1\n").is_err());
        assert!(parse_exposition("# TYPE a counter\na  1\n").is_err());
        assert!(parse_exposition("# random\n").is_err());
    }

    /// A process that accepts but does not answer in time is told apart from one that
    /// refuses (the bench tolerates the first while the load runs, never the second).
    #[tokio::test]
    async fn a_slow_answer_is_no_answer_and_a_refusal_is_not() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let held = tokio::spawn(async move {
            let (conn, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(conn);
        });
        let e = scrape_within(port, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(
            matches!(e, PromError::NoAnswer { port: p, .. } if p == port),
            "{e}"
        );
        assert!(e.to_string().contains("no answer within 300ms"), "{e}");
        held.abort();
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed_port = closed.local_addr().unwrap().port();
        drop(closed);
        let e = scrape_within(closed_port, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(e, PromError::Http { .. }), "{e}");
    }
}
