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
        check_link(&self.link, self.downstream.is_some())?;
        check_limits(&self.limits)?;
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

/// `[link]`: ranges, and TLS files unless the link is plaintext (a downstream also needs the
/// CA that signed the upstream's certificate).
fn check_link(link: &LinkConfig, has_downstream: bool) -> Result<(), ConfigError> {
    if !(1..=19).contains(&link.zstd_level) {
        return Err(key_err("link.zstd_level", "must be between 1 and 19"));
    }
    if !(10..=27).contains(&link.zstd_window_log) {
        return Err(key_err("link.zstd_window_log", "must be between 10 and 27"));
    }
    if link.block_cache_bytes > 64 << 30 {
        return Err(key_err("link.block_cache_bytes", "must be at most 64 GiB"));
    }
    if link.keepalive_secs == 0 {
        return Err(key_err("link.keepalive_secs", "must be at least 1"));
    }
    if link.batch_window_ms > 1000 {
        return Err(key_err(
            "link.batch_window_ms",
            "must be at most 1000 (milliseconds)",
        ));
    }
    if link.plaintext {
        return Ok(());
    }
    if link.tls_cert.is_none() || link.tls_key.is_none() {
        return Err(key_err("link.tls_cert", "the link needs TLS: set link.tls_cert and link.tls_key (and link.tls_ca for mutual TLS), or set link.plaintext = true on a trusted network"));
    }
    for (k, p) in [
        ("link.tls_cert", &link.tls_cert),
        ("link.tls_key", &link.tls_key),
        ("link.tls_ca", &link.tls_ca),
    ] {
        if let Some(p) = p {
            check_readable(k, p)?;
        }
    }
    if has_downstream && link.tls_ca.is_none() {
        return Err(key_err("link.tls_ca", "the downstream must verify the upstream's certificate: set link.tls_ca to the CA that signed it"));
    }
    Ok(())
}

fn check_limits(limits: &Limits) -> Result<(), ConfigError> {
    for (k, v, min) in [
        ("limits.queue_messages", limits.queue_messages, 1),
        (
            "limits.max_message_bytes",
            limits.max_message_bytes,
            256 * 1024,
        ),
        ("limits.max_sessions", limits.max_sessions, 1),
    ] {
        if v < min {
            return Err(key_err(k, format!("must be at least {min}")));
        }
    }
    if limits.max_message_bytes > 1 << 30 {
        return Err(key_err("limits.max_message_bytes", "must be at most 1 GiB"));
    }
    Ok(())
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
            check_readable("downstream.tls_cert", &c)?;
            check_readable("downstream.tls_key", &k)?;
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

fn check_readable(key: &str, p: &Path) -> Result<(), ConfigError> {
    std::fs::metadata(p)
        .map(|_| ())
        .map_err(|e| key_err(key, format!("cannot read {}: {e}", p.display())))
}
