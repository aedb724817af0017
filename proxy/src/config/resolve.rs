//! [`Config::resolve`]: every key checked, secrets, files and addresses read. The first
//! problem found is the error, in this order: the halves, `[link]`, `[limits]`, `[log]`,
//! `[upstream]`, `[downstream]`, `[metrics]`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use super::UpstreamAddrs;
use super::{
    key_err, AsWritten, AuthMethod, Config, ConfigError, DownstreamConfig, Limits, LinkConfig,
    LogConfig, MetricsConfig, Resolved, ResolvedDownstream, ResolvedUpstream, UpstreamConfig,
};
use crate::conninfo::ConnInfo;
use walrelay_pgwire::scram::ScramVerifier;

impl Config {
    /// Checks every key and resolves secrets, files and addresses.
    pub fn resolve(self) -> Result<Resolved, ConfigError> {
        if self.upstream.is_none() && self.downstream.is_none() {
            return Err(key_err(
                "upstream/downstream",
                "neither [upstream] nor [downstream] is configured: this process would do nothing",
            ));
        }
        check_ranges(&self.link, &self.limits)?;
        check_link(
            &self.link,
            self.upstream.is_some(),
            self.downstream.is_some(),
        )?;
        check_log(&self.log)?;
        let as_written = AsWritten {
            upstream: self.upstream.clone(),
            downstream: self.downstream.clone(),
            metrics: self.metrics.clone(),
        };
        let upstream = self.upstream.map(resolve_upstream).transpose()?;
        let downstream = self.downstream.map(resolve_downstream).transpose()?;
        let metrics = self.metrics.as_ref().map(resolve_metrics).transpose()?;
        Ok(Resolved {
            upstream,
            downstream,
            link: self.link,
            limits: self.limits,
            log: self.log,
            metrics,
            as_written,
        })
    }
}

/// Every numeric key of `[link]` and `[limits]` with its smallest and largest value. The
/// maxima keep each value where the code that uses it cannot overflow or panic (tokio
/// semaphores, `Instant` arithmetic) and far above any sensible setting.
fn ranges(link: &LinkConfig, limits: &Limits) -> [(&'static str, i128, i128, i128); 16] {
    const HOUR: i128 = 3600;
    let n = |v: usize| v as i128;
    [
        ("link.zstd_level", link.zstd_level.into(), 1, 19),
        ("link.zstd_window_log", link.zstd_window_log.into(), 10, 27),
        (
            "link.block_cache_bytes",
            link.block_cache_bytes.into(),
            0,
            64 << 30,
        ),
        ("link.keepalive_secs", link.keepalive_secs.into(), 1, HOUR),
        (
            "link.connect_timeout_secs",
            link.connect_timeout_secs.into(),
            1,
            HOUR,
        ),
        ("link.batch_window_ms", link.batch_window_ms.into(), 0, 1000),
        (
            "limits.queue_messages",
            n(limits.queue_messages),
            1,
            1 << 16,
        ),
        (
            "limits.max_message_bytes",
            n(limits.max_message_bytes),
            n(super::MAX_MESSAGE_BYTES_MIN),
            n(super::MAX_MESSAGE_BYTES_MAX),
        ),
        ("limits.max_sessions", n(limits.max_sessions), 1, 100_000),
        ("limits.max_startups", n(limits.max_startups), 1, 100_000),
        (
            "limits.max_startups_per_address",
            n(limits.max_startups_per_address),
            1,
            100_000,
        ),
        (
            "limits.startup_timeout_secs",
            limits.startup_timeout_secs.into(),
            1,
            HOUR,
        ),
        (
            "limits.auth_timeout_secs",
            limits.auth_timeout_secs.into(),
            1,
            HOUR,
        ),
        (
            "limits.auth_failure_delay_ms",
            limits.auth_failure_delay_ms.into(),
            0,
            60_000,
        ),
        (
            "limits.drain_timeout_secs",
            limits.drain_timeout_secs.into(),
            0,
            HOUR,
        ),
        (
            "limits.standby_timeout_secs",
            limits.standby_timeout_secs.into(),
            0,
            HOUR,
        ),
    ]
}

fn check_ranges(link: &LinkConfig, limits: &Limits) -> Result<(), ConfigError> {
    for (key, v, min, max) in ranges(link, limits) {
        if v < min || v > max {
            return Err(key_err(
                key,
                format!("{v} is out of range: must be between {min} and {max}"),
            ));
        }
    }
    // A wrong password is answered after the delay, within the time the whole authentication
    // has: a delay as long would close the connection without its FATAL 28P01.
    if limits.auth_failure_delay_ms >= limits.auth_timeout_secs.saturating_mul(1000) {
        return Err(key_err(
            "limits.auth_failure_delay_ms",
            format!(
                "{} ms is not below limits.auth_timeout_secs ({} s): a wrong password would be \
                 cut off before its answer; lower the delay or raise the timeout",
                limits.auth_failure_delay_ms, limits.auth_timeout_secs
            ),
        ));
    }
    Ok(())
}

/// `[link]`: TLS files unless the link is plaintext (a downstream also needs the CA that
/// signed the upstream's certificate), each parsed, the key matched to its certificate, and
/// the configurations each half builds from them built once.
fn check_link(link: &LinkConfig, upstream: bool, downstream: bool) -> Result<(), ConfigError> {
    for n in &link.peer_names {
        if rustls::pki_types::ServerName::try_from(n.as_str()).is_err() {
            return Err(key_err(
                "link.peer_names",
                format!("{n:?} is not a DNS name"),
            ));
        }
    }
    if let Some(n) = &link.tls_server_name {
        if rustls::pki_types::ServerName::try_from(n.as_str()).is_err() {
            return Err(key_err(
                "link.tls_server_name",
                format!("{n:?} is not a DNS name or IP address"),
            ));
        }
    }
    if link.plaintext {
        return Ok(());
    }
    let (Some(cert), Some(key)) = (&link.tls_cert, &link.tls_key) else {
        return Err(key_err("link.tls_cert", "the link needs TLS: set link.tls_cert and link.tls_key (and link.tls_ca for mutual TLS), or set link.plaintext = true on a trusted network"));
    };
    check_pair(("link.tls_cert", cert), ("link.tls_key", key))?;
    if let Some(ca) = &link.tls_ca {
        crate::tls::check_ca(ca).map_err(|e| key_err("link.tls_ca", e.to_string()))?;
    }
    if downstream && link.tls_ca.is_none() {
        return Err(key_err("link.tls_ca", "the downstream must verify the upstream's certificate: set link.tls_ca to the CA that signed it"));
    }
    if upstream && link.tls_ca.is_none() {
        return Err(key_err("link.tls_ca", "the upstream must verify the downstreams' certificates (mutual TLS): set link.tls_ca to the CA that signed them; without it anyone who reaches upstream.listen could stream the primary's WAL (link.plaintext = true is the explicit choice of an unauthenticated link, for trusted networks)"));
    }
    let built = |e: crate::link::LinkError| key_err("link.tls_cert", e.to_string());
    if upstream {
        crate::link::tls::server_config(link).map_err(built)?;
    }
    if downstream {
        crate::link::tls::client_config(link).map_err(built)?;
    }
    Ok(())
}

/// A certificate file and its key: both parse, and the key is the certificate's.
fn check_pair(cert: (&str, &Path), key: (&str, &Path)) -> Result<(), ConfigError> {
    use crate::tls::{PairError, TlsError};
    crate::tls::check_pair(cert.1, key.1).map_err(|e| match e {
        PairError::Cert(e) => key_err(cert.0, e.to_string()),
        PairError::Key(e @ (TlsError::Read { .. } | TlsError::NoKey { .. })) => {
            key_err(key.0, e.to_string())
        }
        PairError::Key(e) => key_err(
            key.0,
            format!("{e} (is it the key of {}?)", cert.1.display()),
        ),
    })
}

fn check_log(log: &LogConfig) -> Result<(), ConfigError> {
    if !matches!(log.format.as_str(), "text" | "json") {
        return Err(key_err("log.format", "must be \"text\" or \"json\""));
    }
    tracing_subscriber::EnvFilter::try_new(&log.level)
        .map_err(|e| key_err("log.level", e.to_string()))?;
    Ok(())
}

fn resolve_upstream(u: UpstreamConfig) -> Result<ResolvedUpstream, ConfigError> {
    let mut primary = ConnInfo::parse(&u.primary.resolve("upstream.primary")?)
        .map_err(|e| key_err("upstream.primary", e.to_string()))?;
    if let Some(pw) = &u.primary_password {
        primary.password = Some(pw.resolve("upstream.primary_password")?);
    }
    if let Some(s) = &u.slot {
        if s.is_empty()
            || s.len() > 63
            || !s
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_')
        {
            return Err(key_err(
                "upstream.slot",
                "slot names use lower-case letters, digits and '_' (at most 63)",
            ));
        }
    }
    // sslrootcert, sslcert and sslkey are read and parsed as a connection would.
    crate::tls::primary_client_config(&primary)
        .map_err(|e| key_err("upstream.primary", e.to_string()))?;
    let listen = parse_addr("upstream.listen", &u.listen)?;
    Ok(ResolvedUpstream {
        primary,
        slot: u.slot,
        listen,
    })
}

fn resolve_downstream(d: DownstreamConfig) -> Result<ResolvedDownstream, ConfigError> {
    let listen = parse_addr("downstream.listen", &d.listen)?;
    let upstream = UpstreamAddrs::parse(&d.upstream.0).map_err(|e| {
        key_err(
            "downstream.upstream",
            format!("{e} (write \"host:port\" or [\"host-a:7433\", \"host-b:7433\"])"),
        )
    })?;
    let mut users = BTreeMap::new();
    for (name, secret) in &d.users {
        let key = format!("downstream.users.{name}");
        let v: ScramVerifier = secret.resolve(&key)?.parse().map_err(|e| {
            key_err(
                &key,
                format!("{e} (create one with `walrelay scram-verifier`)"),
            )
        })?;
        users.insert(name.clone(), v);
    }
    if d.auth == AuthMethod::ScramSha256 && users.is_empty() {
        return Err(key_err("downstream.users", "auth is scram-sha-256 but no users are configured: add users = { name = \"SCRAM-SHA-256$...\" }"));
    }
    let tls = match (d.tls_cert, d.tls_key) {
        (None, None) => None,
        (Some(c), Some(k)) => {
            check_pair(("downstream.tls_cert", &c), ("downstream.tls_key", &k))?;
            Some((c, k))
        }
        _ => {
            return Err(key_err(
                "downstream.tls_cert",
                "set both downstream.tls_cert and downstream.tls_key, or neither",
            ))
        }
    };
    let spool_dir = d.spool_dir.ok_or_else(|| {
        key_err(
            "downstream.spool_dir",
            "required: a directory for the spool of the primary's WAL (e.g. /var/lib/walrelay/spool)",
        )
    })?;
    if d.spool_bytes < 64 << 20 {
        return Err(key_err(
            "downstream.spool_bytes",
            "must be at least 64 MiB (four 16 MiB segments)",
        ));
    }
    if d.spool_bytes > 1 << 50 {
        return Err(key_err("downstream.spool_bytes", "must be at most 1 PiB"));
    }
    if !d
        .name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        || d.name.len() > 40
    {
        return Err(key_err(
            "downstream.name",
            "may use only a-z, 0-9 and _ (it becomes part of a slot name), at most 40 characters",
        ));
    }
    Ok(ResolvedDownstream {
        listen,
        upstream,
        auth: d.auth,
        users,
        tls,
        spool_dir,
        spool_bytes: d.spool_bytes,
        name: d.name,
        allow_slot_commands: d.allow_slot_commands,
        allow_sql: d.allow_sql,
    })
}

fn resolve_metrics(m: &MetricsConfig) -> Result<SocketAddr, ConfigError> {
    parse_addr("metrics.listen", &m.listen)
}

fn parse_addr(key: &str, s: &str) -> Result<SocketAddr, ConfigError> {
    s.parse()
        .map_err(|_| key_err(key, format!("{s:?} is not an address like 0.0.0.0:5433")))
}
