//! The TOML configuration of one walrelay process (upstream half, downstream half, or both).
//!
//! See `deploy/*.toml` for commented examples and README.md for the reference. Secrets (the
//! primary's password, the standbys' SCRAM verifiers) may be given inline, or as
//! `{ env = "VAR" }` or `{ file = "/path" }` so they need not sit in the file.
//!
//! Each key is declared once, in its section struct below, together with when a change to it
//! takes effect ([`Reload`]: `live` on SIGHUP or `restart`; see [`keys`]). [`Config::resolve`]
//! (in `resolve.rs`) checks every key and reads secrets, files and addresses.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::conninfo::ConnInfo;

use walrelay_pgwire::scram::ScramVerifier;

mod addr;
pub mod keys;
mod resolve;

pub use addr::{AddrError, UpstreamAddr, UpstreamAddrs};

use keys::section;
pub use keys::{Key, Reload};

/// Exit status for a bad configuration (EX_USAGE... sysexits EX_USAGE is 64).
pub const EXIT_CONFIG: i32 = 64;

/// A configuration problem, naming the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The cause is in the message, so not also the `source()` (see `SpoolError::Io`).
    #[error("cannot read config file {path}: {cause}")]
    Read {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Syntax { path: PathBuf, message: String },
    /// A value of the wrong type (or an unknown key) at `key`, the dotted path in the file.
    #[error("config file {path}: key `{key}`: {message}")]
    Value {
        path: PathBuf,
        key: String,
        message: String,
    },
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

impl Config {
    /// Every key of every section, with its reload class.
    pub fn keys() -> impl Iterator<Item = &'static Key> {
        [
            UpstreamConfig::KEYS,
            DownstreamConfig::KEYS,
            LinkConfig::KEYS,
            Limits::KEYS,
            LogConfig::KEYS,
            MetricsConfig::KEYS,
        ]
        .into_iter()
        .flatten()
    }
}

section! {
    /// The HTTP endpoint for Prometheus, the status page and `walrelay status`.
    #[derive(Debug, Clone, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct MetricsConfig in "metrics" {
        /// Address to serve on, e.g. "127.0.0.1:9187" (no authentication: keep it private).
        restart listen: String,
    }
}

section! {
    /// The half next to the primary.
    #[derive(Debug, Clone, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct UpstreamConfig in "upstream" {
        /// libpq key=value conninfo of the primary.
        live primary: Secret,
        /// Password for the primary, overriding any in `primary`.
        live primary_password: Option<Secret>,
        /// The physical slot on the primary that holds WAL until a downstream's spool has it
        /// (default "walrelay"; a downstream with `downstream.name` N uses "<slot>_N");
        /// created if missing.
        live slot: Option<String>,
        /// Where downstream halves connect (the link).
        restart listen: String,
    }
}

section! {
    /// The half next to the standbys.
    #[derive(Debug, Clone, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct DownstreamConfig in "downstream" {
        /// Where standbys connect (their primary_conninfo points here).
        restart listen: String,
        /// Link address of the upstream half, host:port, or a list of them tried in order.
        restart upstream: AddrList,
        #[serde(default)]
        live auth: AuthMethod,
        /// Standby users and their SCRAM verifiers (pg_authid format).
        #[serde(default)]
        live users: BTreeMap<String, Secret>,
        restart tls_cert: Option<PathBuf>,
        restart tls_key: Option<PathBuf>,
        /// Directory of the spool: the primary's WAL as segment files, served to every
        /// standby (also while the link is down) and usable by a `restore_command`.
        restart spool_dir: Option<PathBuf>,
        /// Most bytes of complete segments the spool keeps (the oldest go first).
        #[serde(default = "default_spool_bytes")]
        restart spool_bytes: u64,
        /// This downstream's name when several downstreams serve the same primary (each has
        /// its own spool and its own slot on the primary, "<upstream.slot>_<name>").
        #[serde(default)]
        restart name: String,
        /// Let tunnelled clients create and drop (and alter) replication slots on the primary
        /// (CREATE_REPLICATION_SLOT, DROP_REPLICATION_SLOT, ALTER_REPLICATION_SLOT); temporary
        /// slots, which go with their connection, are always allowed.
        #[serde(default)]
        live allow_slot_commands: bool,
        /// Let tunnelled clients run any SQL (and the extended query protocol) on the primary,
        /// not only the read-only queries of subscriptions and slot synchronization.
        #[serde(default)]
        live allow_sql: bool,
    }
}

fn default_spool_bytes() -> u64 {
    8 << 30
}

/// The slot name when `upstream.slot` is not set.
pub const DEFAULT_SLOT: &str = "walrelay";

/// Smallest `limits.max_message_bytes` allowed: room for one of the primary's largest
/// XLogData messages (128 kB) and what joins it in a batch of the upstream's.
pub const MAX_MESSAGE_BYTES_MIN: usize = 256 << 10;
/// Largest `limits.max_message_bytes`.
pub const MAX_MESSAGE_BYTES_MAX: usize = 1 << 30;

/// `downstream.upstream` as written: `"host:port"` or `["host:port", ...]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrList(pub Vec<String>);

impl<'de> Deserialize<'de> for AddrList {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<AddrList, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = AddrList;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("\"host:port\" or a list of them, [\"a:7433\", \"b:7433\"]")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<AddrList, E> {
                Ok(AddrList(vec![v.to_string()]))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<AddrList, A::Error> {
                let mut out = Vec::new();
                while let Some(a) = seq.next_element::<String>()? {
                    out.push(a);
                }
                Ok(AddrList(out))
            }
        }
        d.deserialize_any(V)
    }
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

section! {
    #[derive(Debug, Clone, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct LinkConfig in "link" {
        restart tls_cert: Option<PathBuf>,
        restart tls_key: Option<PathBuf>,
        /// CA that signs the peer's certificate; with it both sides verify each other (mTLS).
        restart tls_ca: Option<PathBuf>,
        /// Name expected in the upstream's certificate (default: the host of each address
        /// of `downstream.upstream`).
        restart tls_server_name: Option<String>,
        /// Names (DNS subject alternative names) of which the peer's link certificate must
        /// carry at least one, checked on both ends; empty: any certificate signed by
        /// `tls_ca` is accepted.
        restart peer_names: Vec<String>,
        /// The link runs without TLS only when this is true.
        restart plaintext: bool,
        restart codec: CodecKind,
        /// zstd level for the link (1..=19).
        restart zstd_level: i32,
        /// zstd window log (10..=27): the window both ends keep per session is 2^window_log
        /// bytes.
        restart zstd_window_log: u32,
        /// Block cache of the "wal" codec, bytes per session on each side.
        restart block_cache_bytes: u64,
        /// HTTP/2 keepalive interval on the link, seconds (a dead link is noticed within ~2x
        /// this).
        restart keepalive_secs: u64,
        /// Timeout for connecting to one address of the upstream half (TCP and TLS), seconds.
        restart connect_timeout_secs: u64,
        /// How long WAL and feedback of a standby that no commit waits on may wait to share a
        /// link message with more, milliseconds (0: only what has already arrived). Standbys
        /// named in the primary's `synchronous_standby_names` never wait.
        restart batch_window_ms: u64,
        /// While the upstream falls behind the primary for lack of CPU (and the link is not
        /// what holds it back), compress the bulk of the WAL at a fast zstd level: on recorded
        /// WAL about 1.4 × the encoding speed for 1.2 % more bytes on a bulk load, 2.7 % more
        /// where TOASTed values are rewritten (`docs/keeping-up.md`, forty-fifth round). Each
        /// change starts new zstd frames and loses the long history built so far.
        /// False: the configured level always. The `wal` codec only.
        restart catch_up: bool,
    }
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            tls_server_name: None,
            peer_names: Vec::new(),
            plaintext: false,
            codec: CodecKind::Wal,
            zstd_level: 3,
            zstd_window_log: 23,
            block_cache_bytes: 1 << 30,
            keepalive_secs: 10,
            connect_timeout_secs: 10,
            batch_window_ms: 10,
            catch_up: true,
        }
    }
}

section! {
    /// Limits that bound memory and resources.
    #[derive(Debug, Clone, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct Limits in "limits" {
        /// Messages queued per session between the primary's socket and the link (and between
        /// the link and the standby's socket); when full, reading from the primary pauses.
        live queue_messages: usize,
        /// Largest message accepted from the primary (XLogData is at most 128 kB plus header).
        restart max_message_bytes: usize,
        /// Concurrent standby sessions per process (taken once a standby has authenticated).
        live max_sessions: usize,
        /// Connections in startup or authentication at once (the pre-authentication budget,
        /// separate from `max_sessions`).
        live max_startups: usize,
        /// Connections in startup or authentication at once from one source address.
        live max_startups_per_address: usize,
        /// Time a new connection gets to send its startup packet (TLS included), seconds.
        live startup_timeout_secs: u64,
        /// Time allowed for startup and authentication of a standby, seconds.
        live auth_timeout_secs: u64,
        /// Wait before telling a client its authentication failed, milliseconds (throttles
        /// password guessing; the connection holds a startup slot, not a session, meanwhile).
        /// A connection whose TLS handshake failed, on either port, keeps its startup slot
        /// this long after it is closed (bounds the handshakes one address can make fail).
        live auth_failure_delay_ms: u64,
        /// On SIGTERM/SIGINT, time allowed for sessions to end before they are cut, seconds.
        live drain_timeout_secs: u64,
        /// A streaming standby silent this long is cut, as PostgreSQL's `wal_sender_timeout`
        /// cuts it (a reply is asked for at half of it), seconds; 0: never.
        live standby_timeout_secs: u64,
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            queue_messages: 64,
            max_message_bytes: 4 << 20,
            max_sessions: 64,
            max_startups: 32,
            max_startups_per_address: 8,
            startup_timeout_secs: 10,
            auth_timeout_secs: 60,
            auth_failure_delay_ms: 1000,
            drain_timeout_secs: 10,
            standby_timeout_secs: 60,
        }
    }
}

section! {
    #[derive(Debug, Clone, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct LogConfig in "log" {
        /// tracing filter, e.g. "info" or "walrelay=debug" (unless RUST_LOG is set).
        live level: String,
        /// "text" or "json".
        restart format: String,
    }
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
#[derive(Clone, PartialEq, Deserialize)]
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
    /// The sections whose keys resolve into other values, as the file wrote them: a reload
    /// compares their keys ([`crate::lifecycle`]). Empty for a configuration built in code.
    pub as_written: AsWritten,
}

/// `[upstream]`, `[downstream]` and `[metrics]` as written in the file (`link`, `limits` and
/// `log` are in [`Resolved`] as written).
#[derive(Debug, Clone, Default)]
pub struct AsWritten {
    pub upstream: Option<UpstreamConfig>,
    pub downstream: Option<DownstreamConfig>,
    pub metrics: Option<MetricsConfig>,
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
    /// The upstream half's link addresses, tried in order.
    pub upstream: UpstreamAddrs,
    pub auth: AuthMethod,
    pub users: BTreeMap<String, ScramVerifier>,
    pub tls: Option<(PathBuf, PathBuf)>,
    pub spool_dir: PathBuf,
    pub spool_bytes: u64,
    pub name: String,
    pub allow_slot_commands: bool,
    pub allow_sql: bool,
}

impl Config {
    /// Parses the file; a value of the wrong type is named by its dotted key
    /// (`limits.queue_messages`), an unknown key by its section.
    pub fn from_toml(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let syntax = |e: toml::de::Error| ConfigError::Syntax {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        let de = toml::Deserializer::parse(text).map_err(syntax)?;
        serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            match key.as_str() {
                "" | "." => syntax(e.into_inner()),
                _ => ConfigError::Value {
                    path: path.to_path_buf(),
                    key,
                    message: e.into_inner().to_string(),
                },
            }
        })
    }

    pub fn load(path: &Path) -> Result<Resolved, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::Read {
            path: path.to_path_buf(),
            cause,
        })?;
        Config::from_toml(&text, path)?.resolve()
    }
}

#[cfg(test)]
mod tests;
