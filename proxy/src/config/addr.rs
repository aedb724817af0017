//! `downstream.upstream`: the link addresses of the upstream half, parsed once, for the
//! config check and the link's connector.

use std::str::FromStr;

/// An address that is not `host:port` (first field: the address as written, second: why).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid upstream address {0:?}: {1}")]
pub struct AddrError(pub String, pub String);

/// One address of `downstream.upstream`: `host:port`, IPv6 in brackets (`[::1]:7433`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamAddr {
    /// Name or IP address (IPv6 without brackets).
    pub host: String,
    pub port: u16,
}

impl FromStr for UpstreamAddr {
    type Err = AddrError;
    fn from_str(s: &str) -> Result<Self, AddrError> {
        let bad = |why: &str| AddrError(s.to_string(), why.to_string());
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| bad("expected host:port"))?;
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| bad("the port is not a number from 1 to 65535"))?;
        let host = match host.strip_prefix('[') {
            Some(v6) => {
                let v6 = v6.strip_suffix(']').ok_or_else(|| bad("unclosed '['"))?;
                v6.parse::<std::net::Ipv6Addr>()
                    .map_err(|_| bad("brackets hold an IPv6 address, e.g. [::1]:7433"))?;
                v6
            }
            None if host.contains(':') => {
                return Err(bad("write an IPv6 address in brackets, e.g. [::1]:7433"))
            }
            None => host,
        };
        if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c == '/') {
            return Err(bad("expected host:port"));
        }
        Ok(UpstreamAddr {
            host: host.to_string(),
            port,
        })
    }
}

impl std::fmt::Display for UpstreamAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.host.contains(':') {
            true => write!(f, "[{}]:{}", self.host, self.port),
            false => write!(f, "{}:{}", self.host, self.port),
        }
    }
}

/// `downstream.upstream`: the upstream half's link addresses, tried in order; never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamAddrs(Vec<UpstreamAddr>);

impl UpstreamAddrs {
    pub fn new(addrs: Vec<UpstreamAddr>) -> Result<UpstreamAddrs, AddrError> {
        match addrs.is_empty() {
            true => Err(AddrError(
                String::new(),
                "no address: give at least one host:port".into(),
            )),
            false => Ok(UpstreamAddrs(addrs)),
        }
    }

    /// Parses each of `addrs`.
    pub fn parse<S: AsRef<str>>(addrs: &[S]) -> Result<UpstreamAddrs, AddrError> {
        let parsed: Result<Vec<UpstreamAddr>, _> =
            addrs.iter().map(|a| a.as_ref().parse()).collect();
        UpstreamAddrs::new(parsed?)
    }

    pub fn first(&self) -> &UpstreamAddr {
        &self.0[0]
    }
}

impl std::ops::Deref for UpstreamAddrs {
    type Target = [UpstreamAddr];
    fn deref(&self) -> &[UpstreamAddr] {
        &self.0
    }
}

impl FromStr for UpstreamAddrs {
    type Err = AddrError;
    /// One address (`host:port`).
    fn from_str(s: &str) -> Result<Self, AddrError> {
        UpstreamAddrs::new(vec![s.parse()?])
    }
}

impl std::fmt::Display for UpstreamAddrs {
    /// `a:7433` or `a:7433, b:7433`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, a) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{a}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_as_host_port() {
        let a: UpstreamAddr = "relay-up-a:7433".parse().unwrap();
        assert_eq!((a.host.as_str(), a.port), ("relay-up-a", 7433));
        let a: UpstreamAddr = "[::1]:7433".parse().unwrap();
        assert_eq!((a.host.as_str(), a.port), ("::1", 7433));
        assert_eq!(a.to_string(), "[::1]:7433");
        assert_eq!(
            "10.1.2.3:1".parse::<UpstreamAddr>().unwrap().to_string(),
            "10.1.2.3:1"
        );
        for bad in [
            "",
            "host",
            ":7433",
            "host:",
            "host:0",
            "host:65536",
            "host:x",
            "::1:7433",
            "[::1:7433",
            "[host]:7433",
            "a b:1",
            "/tmp:1",
        ] {
            assert!(bad.parse::<UpstreamAddr>().is_err(), "{bad:?} was accepted");
        }
        assert!(UpstreamAddrs::parse::<&str>(&[]).is_err());
        let list = UpstreamAddrs::parse(&["a:1", "[::1]:2"]).unwrap();
        assert_eq!(list.to_string(), "a:1, [::1]:2");
        assert_eq!(list.len(), 2);
    }
}
