//! The TOML configuration of one walrelay process (upstream half, downstream half, or both).
//!
//! See `deploy/*.toml` for commented examples and README.md for the reference. Secrets (the
//! primary's password, the standbys' SCRAM verifiers) may be given inline, or as
//! `{ env = "VAR" }` or `{ file = "/path" }` so they need not sit in the file.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::conninfo::ConnInfo;
use walrelay_pgwire::scram::ScramVerifier;

/// Exit status for a bad configuration (EX_USAGE... sysexits EX_USAGE is 64).
pub const EXIT_CONFIG: i32 = 64;

/// A configuration problem, naming the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("config key `{key}`: {problem}")]
    Key { key: String, problem: String },
}

fn key_err(key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Key {
        key: key.into(),
        problem: problem.into(),
    }
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub upstream: Option<UpstreamConfig>,
    pub downstream: Option<DownstreamConfig>,
    #[serde(default)]
    pub link: LinkConfig,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub log: LogConfig,
    /// Optional: without it no HTTP endpoint is served.
    pub metrics: Option<MetricsConfig>,
}

/// The HTTP endpoint for Prometheus, the status page and `walrelay status`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Address to serve on, e.g. "127.0.0.1:9187" (no authentication: keep it private).
    pub listen: String,
}

/// The half next to the primary.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// libpq key=value conninfo of the primary.
    pub primary: Secret,
    /// Password for the primary, overriding any in `primary`.
    pub primary_password: Option<Secret>,
    /// Physical slot used for standbys that name none; created on the primary if missing.
    pub slot: Option<String>,
    /// Where downstream halves connect (the link).
    pub listen: String,
}

/// The half next to the standbys.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DownstreamConfig {
    /// Where standbys connect (their primary_conninfo points here).
    pub listen: String,
    /// Link address of the upstream half, host:port.
    pub upstream: String,
    #[serde(default)]
    pub auth: AuthMethod,
    /// Standby users and their SCRAM verifiers (pg_authid format).
    #[serde(default)]
    pub users: BTreeMap<String, Secret>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
pub enum AuthMethod {
    #[default]
    #[serde(rename = "scram-sha-256")]
    ScramSha256,
    #[serde(rename = "trust")]
    Trust,
}

pub use walrelay_wal::linkcodec::CodecKind;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LinkConfig {
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// CA that signs the peer's certificate; with it both sides verify each other (mTLS).
    pub tls_ca: Option<PathBuf>,
    /// Name expected in the upstream's certificate (default: the host of `downstream.upstream`).
    pub tls_server_name: Option<String>,
    /// The link runs without TLS only when this is true.
    pub plaintext: bool,
    pub codec: CodecKind,
    /// zstd level for the link (1..=19).
    pub zstd_level: i32,
    /// zstd window log (10..=27): the window both ends keep per session is 2^window_log bytes.
    pub zstd_window_log: u32,
    /// Block cache of the "wal" codec, bytes per session on each side.
    pub block_cache_bytes: u64,
    /// HTTP/2 keepalive interval on the link, seconds (a dead link is noticed within ~2x this).
    pub keepalive_secs: u64,
    /// Timeout for connecting to the upstream half, seconds.
    pub connect_timeout_secs: u64,
    /// How long WAL and feedback of a standby that no commit waits on may wait to share a link
    /// message with more, milliseconds (0: only what has already arrived). Standbys named in
    /// the primary's `synchronous_standby_names` never wait.
    pub batch_window_ms: u64,
    /// Bench only (not configurable): also run every message through generic streaming
    /// zstd-3 and count its bytes, for a side-by-side comparison.
    #[serde(skip)]
    pub bench_shadow_zstd: bool,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            tls_server_name: None,
            plaintext: false,
            codec: CodecKind::Wal,
            zstd_level: 3,
            zstd_window_log: 23,
            block_cache_bytes: 1 << 30,
            keepalive_secs: 10,
            connect_timeout_secs: 10,
            batch_window_ms: 10,
            bench_shadow_zstd: false,
        }
    }
}

/// Limits that bound memory and resources.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Messages queued per session between the primary's socket and the link (and between the
    /// link and the standby's socket); when full, reading from the primary pauses.
    pub queue_messages: usize,
    /// Largest message accepted from the primary (XLogData is at most 128 kB plus header).
    pub max_message_bytes: usize,
    /// Concurrent standby sessions per process.
    pub max_sessions: usize,
    /// Time allowed for startup and authentication of a standby, seconds.
    pub auth_timeout_secs: u64,
    /// On SIGTERM/SIGINT, time allowed for sessions to end before they are cut, seconds.
    pub drain_timeout_secs: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            queue_messages: 64,
            max_message_bytes: 4 << 20,
            max_sessions: 64,
            auth_timeout_secs: 60,
            drain_timeout_secs: 10,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// tracing filter, e.g. "info" or "walrelay=debug".
    pub level: String,
    /// "text" or "json".
    pub format: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".into(),
            format: "text".into(),
        }
    }
}

/// A secret given inline, from an environment variable, or from a file.
#[derive(Clone, Deserialize)]
#[serde(untagged)]
pub enum Secret {
    Inline(String),
    Env { env: String },
    File { file: PathBuf },
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Secret::Inline(_) => write!(f, "Secret(inline)"),
            Secret::Env { env } => write!(f, "Secret(env {env})"),
            Secret::File { file } => write!(f, "Secret(file {})", file.display()),
        }
    }
}

impl Secret {
    /// Resolves the secret; `key` names it in errors. A file's trailing newline is dropped.
    pub fn resolve(&self, key: &str) -> Result<String, ConfigError> {
        match self {
            Secret::Inline(s) => Ok(s.clone()),
            Secret::Env { env } => std::env::var(env).map_err(|_| {
                key_err(
                    key,
                    format!("environment variable {env} is not set (or not UTF-8)"),
                )
            }),
            Secret::File { file } => std::fs::read_to_string(file)
                .map(|s| s.trim_end_matches(['\n', '\r']).to_string())
                .map_err(|e| key_err(key, format!("cannot read {}: {e}", file.display()))),
        }
    }
}

/// Everything resolved and checked: what the halves run with.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub upstream: Option<ResolvedUpstream>,
    pub downstream: Option<ResolvedDownstream>,
    pub link: LinkConfig,
    pub limits: Limits,
    pub log: LogConfig,
    /// `[metrics] listen`, if configured.
    pub metrics: Option<SocketAddr>,
}

#[derive(Debug, Clone)]
pub struct ResolvedUpstream {
    pub primary: ConnInfo,
    pub slot: Option<String>,
    pub listen: SocketAddr,
}

#[derive(Debug, Clone)]
pub struct ResolvedDownstream {
    pub listen: SocketAddr,
    pub upstream: String,
    pub auth: AuthMethod,
    pub users: BTreeMap<String, ScramVerifier>,
    pub tls: Option<(PathBuf, PathBuf)>,
}

impl Config {
    pub fn from_toml(text: &str, path: &Path) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    pub fn load(path: &Path) -> Result<Resolved, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::from_toml(&text, path)?.resolve()
    }

    /// Checks every key and resolves secrets, files and addresses.
    pub fn resolve(self) -> Result<Resolved, ConfigError> {
        if self.upstream.is_none() && self.downstream.is_none() {
            return Err(key_err(
                "upstream/downstream",
                "neither [upstream] nor [downstream] is configured: this process would do nothing",
            ));
        }
        let link = self.link;
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
        if !link.plaintext {
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
            if self.downstream.is_some() && link.tls_ca.is_none() {
                return Err(key_err("link.tls_ca", "the downstream must verify the upstream's certificate: set link.tls_ca to the CA that signed it"));
            }
        }
        let limits = self.limits;
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
        if !matches!(self.log.format.as_str(), "text" | "json") {
            return Err(key_err("log.format", "must be \"text\" or \"json\""));
        }
        tracing_subscriber::EnvFilter::try_new(&self.log.level)
            .map_err(|e| key_err("log.level", e.to_string()))?;

        let upstream = match self.upstream {
            None => None,
            Some(u) => {
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
                Some(ResolvedUpstream {
                    primary,
                    slot: u.slot,
                    listen,
                })
            }
        };
        let downstream = match self.downstream {
            None => None,
            Some(d) => {
                let listen = parse_addr("downstream.listen", &d.listen)?;
                if d.upstream
                    .rsplit_once(':')
                    .and_then(|(h, p)| (!h.is_empty()).then_some(p))
                    .and_then(|p| p.parse::<u16>().ok())
                    .is_none()
                {
                    return Err(key_err(
                        "downstream.upstream",
                        format!("{:?} is not host:port", d.upstream),
                    ));
                }
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
                Some(ResolvedDownstream {
                    listen,
                    upstream: d.upstream,
                    auth: d.auth,
                    users,
                    tls,
                })
            }
        };
        let metrics = match &self.metrics {
            Some(m) => Some(parse_addr("metrics.listen", &m.listen)?),
            None => None,
        };
        Ok(Resolved {
            upstream,
            downstream,
            link,
            limits,
            log: self.log,
            metrics,
        })
    }
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

#[cfg(test)]
mod tests;
