//! libpq-style `key=value` connection strings for the upstream's connection to the primary.
//!
//! Values may be single-quoted (`password='a b\'c'`); backslash escapes the next character.
//! Only the keys walrelay uses are accepted, so a typo is an error instead of being ignored.

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

/// A parsed connection string.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ConnInfo {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: Option<String>,
    pub dbname: Option<String>,
    pub sslmode: SslMode,
    pub sslrootcert: Option<PathBuf>,
    pub sslcert: Option<PathBuf>,
    pub sslkey: Option<PathBuf>,
    pub connect_timeout_secs: u64,
}

impl std::fmt::Debug for ConnInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the password.
        f.debug_struct("ConnInfo")
            .field("host", &self.host)
            .field("port", &self.port)
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
    #[error("unknown connection option {0:?} (known: host, port, user, password, dbname, sslmode, sslrootcert, sslcert, sslkey, connect_timeout, application_name)")]
    UnknownKey(String),
    #[error("invalid value {value:?} for {key}: {why}")]
    BadValue {
        key: String,
        value: String,
        why: &'static str,
    },
    #[error("connection string names no user: add user=...")]
    NoUser,
}

impl ConnInfo {
    /// Parses `key=value ...`. Defaults as libpq: host localhost, port 5432, sslmode prefer;
    /// connect_timeout 10 s. `user` is required.
    pub fn parse(s: &str) -> Result<ConnInfo, ConnInfoError> {
        let mut ci = ConnInfo {
            host: "localhost".into(),
            port: 5432,
            connect_timeout_secs: 10,
            ..Default::default()
        };
        for (key, value) in split_pairs(s)? {
            let bad = |why| ConnInfoError::BadValue {
                key: key.clone(),
                value: value.clone(),
                why,
            };
            match key.as_str() {
                "host" | "hostaddr" => ci.host = value.clone(),
                "port" => ci.port = value.parse().map_err(|_| bad("not a port number"))?,
                "user" => ci.user = value.clone(),
                "password" => ci.password = Some(value.clone()),
                "dbname" => ci.dbname = Some(value.clone()),
                "sslmode" => {
                    ci.sslmode = match value.as_str() {
                        "disable" => SslMode::Disable,
                        "allow" => SslMode::Allow,
                        "prefer" => SslMode::Prefer,
                        "require" => SslMode::Require,
                        "verify-ca" => SslMode::VerifyCa,
                        "verify-full" => SslMode::VerifyFull,
                        _ => return Err(bad(
                            "expected disable, allow, prefer, require, verify-ca or verify-full",
                        )),
                    }
                }
                "sslrootcert" => ci.sslrootcert = Some(value.clone().into()),
                "sslcert" => ci.sslcert = Some(value.clone().into()),
                "sslkey" => ci.sslkey = Some(value.clone().into()),
                "connect_timeout" => {
                    ci.connect_timeout_secs =
                        value.parse().map_err(|_| bad("not a number of seconds"))?
                }
                // The standby's own application_name is used; a configured one is ignored.
                "application_name" | "fallback_application_name" => {}
                _ => return Err(ConnInfoError::UnknownKey(key)),
            }
        }
        if ci.user.is_empty() {
            return Err(ConnInfoError::NoUser);
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
}

fn split_pairs(s: &str) -> Result<Vec<(String, String)>, ConnInfoError> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
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
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') {
            return Err(ConnInfoError::MissingEquals(key));
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            loop {
                match chars.next() {
                    None => return Err(ConnInfoError::Unterminated),
                    Some('\'') => break,
                    Some('\\') => value.push(chars.next().ok_or(ConnInfoError::Unterminated)?),
                    Some(c) => value.push(c),
                }
            }
        } else {
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
        }
        out.push((key, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_quoted_values() {
        let ci =
            ConnInfo::parse("host=db1 port = 6543 user=rep password='a b\\'c' sslmode=require")
                .unwrap();
        assert_eq!(ci.host, "db1");
        assert_eq!(ci.port, 6543);
        assert_eq!(ci.password.as_deref(), Some("a b'c"));
        assert_eq!(ci.sslmode, SslMode::Require);
        assert!(!format!("{ci:?}").contains("a b"));
    }

    #[test]
    fn errors_name_the_problem() {
        assert_eq!(
            ConnInfo::parse("host=x user=u sslmod=require"),
            Err(ConnInfoError::UnknownKey("sslmod".into()))
        );
        assert!(matches!(
            ConnInfo::parse("host=x user=u port=abc"),
            Err(ConnInfoError::BadValue { .. })
        ));
        assert_eq!(ConnInfo::parse("host=x"), Err(ConnInfoError::NoUser));
        assert_eq!(
            ConnInfo::parse("user=u password='x"),
            Err(ConnInfoError::Unterminated)
        );
        assert!(ConnInfo::parse("user=u sslmode=verify-full").is_err());
        assert_eq!(
            ConnInfo::parse("user"),
            Err(ConnInfoError::MissingEquals("user".into()))
        );
    }
}
