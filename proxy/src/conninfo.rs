//! libpq-style `key=value` connection strings for the upstream's connection to the primary.
//!
//! Values may be single-quoted (`password='a b\'c'`); backslash escapes the next character.
//! Only the keys walrelay uses are accepted, so a typo is an error instead of being ignored.
//!
//! Several hosts are written as libpq writes them: `host=a,b,c` (names, IPv4, IPv6 bare or in
//! brackets, or a Unix socket directory), optionally `hostaddr=` with as many numeric
//! addresses, and `port=` with one port for all hosts or one per host (an empty entry is
//! 5432). They are tried in order, each within `connect_timeout`, and
//! `target_session_attrs` says which server qualifies (see [`TargetSessionAttrs`]).

use std::net::IpAddr;
use std::path::PathBuf;

/// How the upstream negotiates TLS with the primary (libpq `sslmode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    Disable,
    Allow,
    #[default]
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// Which server of the host list the upstream accepts (libpq `target_session_attrs`, for a
/// physical replication connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TargetSessionAttrs {
    /// The first server that accepts the connection.
    #[default]
    Any,
    /// A server where `SHOW transaction_read_only` is `off`: a primary that accepts writes.
    ReadWrite,
    /// A server that is not in recovery (`SHOW in_hot_standby` is `off`), read-only or not.
    Primary,
}

impl TargetSessionAttrs {
    /// The value as written in a conninfo.
    pub fn as_str(self) -> &'static str {
        match self {
            TargetSessionAttrs::Any => "any",
            TargetSessionAttrs::ReadWrite => "read-write",
            TargetSessionAttrs::Primary => "primary",
        }
    }
}

/// One server of the host list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSpec {
    /// Host name, IP address (IPv6 without brackets) or Unix socket directory (starts with
    /// '/'). The name TLS verifies; when only `hostaddr` was given, that address.
    pub host: String,
    /// Numeric address to dial instead of resolving `host` (libpq `hostaddr`).
    pub hostaddr: Option<IpAddr>,
    pub port: u16,
}

impl HostSpec {
    /// What is dialed: `hostaddr` if given, else `host`.
    pub fn dial_host(&self) -> String {
        match self.hostaddr {
            Some(a) => a.to_string(),
            None => self.host.clone(),
        }
    }

    /// A Unix socket directory (no TLS, no TCP).
    pub fn is_unix_socket(&self) -> bool {
        self.hostaddr.is_none() && self.host.starts_with('/')
    }
}

impl std::fmt::Display for HostSpec {
    /// `db1:5432`, `[::1]:5432`, `db1 (10.0.0.1):5432`, `/run/postgresql/.s.PGSQL.5432`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_unix_socket() {
            return write!(f, "{}/.s.PGSQL.{}", self.host, self.port);
        }
        let bracket = |h: &str| match h.contains(':') {
            true => format!("[{h}]"),
            false => h.to_string(),
        };
        match self.hostaddr {
            Some(a) if a.to_string() != self.host => {
                write!(
                    f,
                    "{} ({}):{}",
                    self.host,
                    bracket(&a.to_string()),
                    self.port
                )
            }
            _ => write!(f, "{}:{}", bracket(&self.host), self.port),
        }
    }
}

/// A parsed connection string.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ConnInfo {
    /// The servers to try, in order; never empty after [`ConnInfo::parse`].
    pub hosts: Vec<HostSpec>,
    pub target_session_attrs: TargetSessionAttrs,
    pub user: String,
    pub password: Option<String>,
    pub dbname: Option<String>,
    pub sslmode: SslMode,
    pub sslrootcert: Option<PathBuf>,
    pub sslcert: Option<PathBuf>,
    pub sslkey: Option<PathBuf>,
    /// Per host: connecting, TLS, authentication and the `target_session_attrs` check, both
    /// tries of the sslmode fallback (`allow`, `prefer`) together, as libpq's timer.
    pub connect_timeout_secs: u64,
}

impl std::fmt::Debug for ConnInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the password.
        f.debug_struct("ConnInfo")
            .field("hosts", &self.hosts)
            .field("target_session_attrs", &self.target_session_attrs)
            .field("user", &self.user)
            .field("sslmode", &self.sslmode)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnInfoError {
    #[error("missing \"=\" after {0:?} in connection string")]
    MissingEquals(String),
    #[error("unterminated quoted value in connection string")]
    Unterminated,
    /// Not repeated in the message: a URI may hold the password.
    #[error("a URI (postgresql://...) is not taken here: write the connection string as libpq's key=value pairs, e.g. host=db1 port=5432 user=walrelay dbname=postgres")]
    Uri,
    #[error("unknown connection option {0:?} (known: host, hostaddr, port, user, password, dbname, sslmode, sslrootcert, sslcert, sslkey, connect_timeout, target_session_attrs, application_name)")]
    UnknownKey(String),
    #[error("invalid value {value:?} for {key}: {why}")]
    BadValue {
        key: String,
        value: String,
        why: &'static str,
    },
    #[error("connection string names no user: add user=...")]
    NoUser,
    #[error(
        "{what} lists {n} {items} but host lists {m}: give one for each host (port also takes one for all)"
    )]
    CountMismatch {
        what: &'static str,
        items: &'static str,
        n: usize,
        m: usize,
    },
}

/// Largest `connect_timeout`, seconds: a bound on how long one host may hold the upstream.
pub const MAX_CONNECT_TIMEOUT_SECS: u64 = 3600;

/// The raw comma-separated lists, before they are matched up.
#[derive(Default)]
struct Lists {
    host: Option<String>,
    hostaddr: Option<String>,
    port: Option<String>,
}

impl ConnInfo {
    /// The host list for logs and messages: `a:5432, b:5433`.
    pub fn hosts_display(&self) -> String {
        let all: Vec<String> = self.hosts.iter().map(ToString::to_string).collect();
        all.join(", ")
    }

    /// The time one host may take, from connecting to the `target_session_attrs` check.
    pub fn connect_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.connect_timeout_secs.max(1))
    }

    /// Parses `key=value ...`. Defaults as libpq: host localhost, port 5432, sslmode prefer,
    /// target_session_attrs any; connect_timeout 10 s (1..=3600). `user` is
    /// required.
    pub fn parse(s: &str) -> Result<ConnInfo, ConnInfoError> {
        let mut ci = ConnInfo {
            connect_timeout_secs: 10,
            ..Default::default()
        };
        let start = s.trim_start().as_bytes();
        if ["postgresql://", "postgres://"].iter().any(|p| {
            start
                .get(..p.len())
                .is_some_and(|b| b.eq_ignore_ascii_case(p.as_bytes()))
        }) {
            return Err(ConnInfoError::Uri);
        }
        let mut lists = Lists::default();
        for (key, value) in split_pairs(s)? {
            ci.set(key, value, &mut lists)?;
        }
        ci.hosts = host_list(&lists)?;
        if ci.user.is_empty() {
            return Err(ConnInfoError::NoUser);
        }
        // libpq looks for the other file in ~/.postgresql and fails without it; walrelay has
        // no such default, and a certificate without its key would be left out unsaid.
        let unpaired = match (&ci.sslcert, &ci.sslkey) {
            (Some(_), None) => Some((
                "sslkey",
                "sslcert (a client certificate) needs its private key: add sslkey=<file>",
            )),
            (None, Some(_)) => Some((
                "sslcert",
                "sslkey (a client key) needs its certificate: add sslcert=<file>",
            )),
            _ => None,
        };
        if let Some((key, why)) = unpaired {
            return Err(ConnInfoError::BadValue {
                key: key.into(),
                value: String::new(),
                why,
            });
        }
        if matches!(ci.sslmode, SslMode::VerifyCa | SslMode::VerifyFull) && ci.sslrootcert.is_none()
        {
            return Err(ConnInfoError::BadValue {
                key: "sslrootcert".into(),
                value: String::new(),
                why: "sslmode verify-ca/verify-full needs sslrootcert=<CA file>",
            });
        }
        Ok(ci)
    }

    /// One `key=value`; the host lists are kept raw in `lists` (matched up at the end).
    fn set(&mut self, key: String, value: String, lists: &mut Lists) -> Result<(), ConnInfoError> {
        let bad = |why| ConnInfoError::BadValue {
            key: key.clone(),
            value: value.clone(),
            why,
        };
        match key.as_str() {
            "host" => lists.host = Some(value),
            "hostaddr" => lists.hostaddr = Some(value),
            "port" => lists.port = Some(value),
            "user" => self.user = value,
            "password" => self.password = Some(value),
            "dbname" => self.dbname = Some(value),
            "sslmode" => {
                self.sslmode = parse_sslmode(&value).ok_or_else(|| {
                    bad("expected disable, allow, prefer, require, verify-ca or verify-full")
                })?
            }
            "sslrootcert" => self.sslrootcert = Some(value.into()),
            "sslcert" => self.sslcert = Some(value.into()),
            "sslkey" => self.sslkey = Some(value.into()),
            "connect_timeout" => {
                self.connect_timeout_secs = value
                    .parse()
                    .ok()
                    .filter(|t| (1..=MAX_CONNECT_TIMEOUT_SECS).contains(t))
                    .ok_or_else(|| {
                        bad(
                            "expected a number of seconds from 1 to 3600 (walrelay does not wait \
                             forever for a host, as libpq's 0 would)",
                        )
                    })?
            }
            "target_session_attrs" => {
                self.target_session_attrs = match value.as_str() {
                    "any" => TargetSessionAttrs::Any,
                    "read-write" => TargetSessionAttrs::ReadWrite,
                    "primary" => TargetSessionAttrs::Primary,
                    _ => return Err(bad(
                        "walrelay streams from the primary: expected any, read-write or primary",
                    )),
                }
            }
            // The standby's own application_name is used; a configured one is ignored.
            "application_name" | "fallback_application_name" => {}
            _ => return Err(ConnInfoError::UnknownKey(key)),
        }
        Ok(())
    }
}

fn parse_sslmode(v: &str) -> Option<SslMode> {
    Some(match v {
        "disable" => SslMode::Disable,
        "allow" => SslMode::Allow,
        "prefer" => SslMode::Prefer,
        "require" => SslMode::Require,
        "verify-ca" => SslMode::VerifyCa,
        "verify-full" => SslMode::VerifyFull,
        _ => return None,
    })
}

/// Matches up `host`, `hostaddr` and `port` as libpq does: hosts and hostaddrs pair up one to
/// one; one port serves all hosts, or there is one per host.
fn host_list(lists: &Lists) -> Result<Vec<HostSpec>, ConnInfoError> {
    let split = |v: &Option<String>| -> Option<Vec<String>> {
        v.as_ref()
            .map(|v| v.split(',').map(|e| e.trim().to_string()).collect())
    };
    let names = split(&lists.host);
    let addrs = split(&lists.hostaddr)
        .map(|a| {
            a.iter()
                .map(|e| parse_hostaddr(e))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    let count = match (&names, &addrs) {
        (Some(n), Some(a)) if n.len() != a.len() => {
            return Err(ConnInfoError::CountMismatch {
                what: "hostaddr",
                items: "addresses",
                n: a.len(),
                m: n.len(),
            })
        }
        (Some(n), _) => n.len(),
        (None, Some(a)) => a.len(),
        (None, None) => 1,
    };
    let ports = match split(&lists.port) {
        None => vec![5432; count],
        Some(p) => {
            let p = p
                .iter()
                .map(|e| parse_port(e))
                .collect::<Result<Vec<_>, _>>()?;
            match p.len() {
                1 => vec![p[0]; count],
                n if n == count => p,
                n => {
                    return Err(ConnInfoError::CountMismatch {
                        what: "port",
                        items: "ports",
                        n,
                        m: count,
                    })
                }
            }
        }
    };
    (0..count)
        .map(|i| {
            let hostaddr = addrs.as_ref().and_then(|a| a[i]);
            let name = names.as_ref().map(|n| n[i].as_str()).unwrap_or("");
            let host = match (parse_host(name)?, hostaddr) {
                (Some(h), _) => h,
                (None, Some(a)) => a.to_string(),
                (None, None) => "localhost".to_string(),
            };
            Ok(HostSpec {
                host,
                hostaddr,
                port: ports[i],
            })
        })
        .collect()
}

/// One entry of `host`: empty is the default; `[v6]` loses its brackets.
fn parse_host(e: &str) -> Result<Option<String>, ConnInfoError> {
    if e.is_empty() {
        return Ok(None);
    }
    let bad = |why| ConnInfoError::BadValue {
        key: "host".into(),
        value: e.to_string(),
        why,
    };
    if let Some(inner) = e.strip_prefix('[') {
        let v6 = inner
            .strip_suffix(']')
            .ok_or_else(|| bad("unclosed '[': write an IPv6 address as [::1] or ::1"))?;
        return match v6.parse::<std::net::Ipv6Addr>() {
            Ok(_) => Ok(Some(v6.to_string())),
            Err(_) => Err(bad("brackets hold an IPv6 address, e.g. [::1]")),
        };
    }
    // An IPv6 address may carry a zone (fe80::1%eth0), which the resolver understands.
    let without_zone = e.split_once('%').map_or(e, |(a, _)| a);
    if e.contains(':') && without_zone.parse::<std::net::Ipv6Addr>().is_err() {
        return Err(bad("a host is a name, an IP address or a socket directory: give the port in port=, not host:port"));
    }
    Ok(Some(e.to_string()))
}

/// One entry of `hostaddr`: empty (resolve `host`) or a numeric IPv4/IPv6 address.
fn parse_hostaddr(e: &str) -> Result<Option<IpAddr>, ConnInfoError> {
    if e.is_empty() {
        return Ok(None);
    }
    let bare = e
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or(e);
    bare.parse().map(Some).map_err(|_| ConnInfoError::BadValue {
        key: "hostaddr".into(),
        value: e.to_string(),
        why: "hostaddr takes numeric IP addresses; put names in host=",
    })
}

/// One entry of `port`: empty is 5432.
fn parse_port(e: &str) -> Result<u16, ConnInfoError> {
    if e.is_empty() {
        return Ok(5432);
    }
    e.parse::<u16>()
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| ConnInfoError::BadValue {
            key: "port".into(),
            value: e.to_string(),
            why: "not a port number (1-65535)",
        })
}

fn skip_space(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    while chars.peek().is_some_and(|c| c.is_whitespace()) {
        chars.next();
    }
}

fn split_pairs(s: &str) -> Result<Vec<(String, String)>, ConnInfoError> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        skip_space(&mut chars);
        if chars.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        skip_space(&mut chars);
        if chars.next() != Some('=') {
            return Err(ConnInfoError::MissingEquals(key));
        }
        skip_space(&mut chars);
        let value = read_value(&mut chars)?;
        out.push((key, value));
    }
}

fn read_value(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
) -> Result<String, ConnInfoError> {
    let mut value = String::new();
    if chars.peek() == Some(&'\'') {
        chars.next();
        loop {
            match chars.next() {
                None => return Err(ConnInfoError::Unterminated),
                Some('\'') => return Ok(value),
                Some('\\') => value.push(chars.next().ok_or(ConnInfoError::Unterminated)?),
                Some(c) => value.push(c),
            }
        }
    }
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            break;
        }
        chars.next();
        if c == '\\' {
            value.push(chars.next().ok_or(ConnInfoError::Unterminated)?);
        } else {
            value.push(c);
        }
    }
    Ok(value)
}

#[cfg(test)]
mod tests;
