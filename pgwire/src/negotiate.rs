//! Protocol version negotiation at startup, as PostgreSQL's `ProcessStartupPacket`
//! (`backend_startup.c`) does it, for a server speaking protocol 3.0.
//!
//! A client may ask for a newer minor version (PostgreSQL 18's libpq asks for 3.2 with
//! `max_protocol_version=3.2`, or `latest`) and may send protocol options, startup parameters
//! named `_pq_.*`. The server then answers, before authentication, with one
//! NegotiateProtocolVersion message ('v'): the *whole* version number it will speak
//! (`major << 16 | minor`, here 196608 = 3.0; PostgreSQL sends its `FrontendProtocol`) and
//! the options it did not recognize (walrelay recognizes none). With nothing to negotiate no
//! message goes: libpq 18 refuses one that "asks for no changes".
//!
//! walrelay answers with 3.0 semantics because its sessions end at PostgreSQL connections
//! that speak 3.0 (the 4-byte cancel key of BackendKeyData, the only difference of 3.2 a
//! relay would see).

use crate::PROTOCOL_3_0;

/// The newest minor version of protocol 3 walrelay speaks.
pub const NEWEST_MINOR: u16 = 0;

/// What the server answers a startup packet with, when it must negotiate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiation {
    /// The version the session will use, as the message carries it (`3 << 16 | minor`).
    pub version: u32,
    /// The `_pq_.` options of the startup packet, in order: none is recognized.
    pub unrecognized: Vec<String>,
}

/// Whether (and how) to negotiate for a protocol-3 startup packet with minor version `minor`
/// and these parameters. `None`: nothing to negotiate, send no message.
pub fn negotiate(minor: u16, params: &[(String, String)]) -> Option<Negotiation> {
    let unrecognized: Vec<String> = params
        .iter()
        .filter(|(k, _)| is_protocol_option(k))
        .map(|(k, _)| k.clone())
        .collect();
    // 3.0 is both the oldest minor and the newest walrelay speaks: any other minor is newer.
    if minor == NEWEST_MINOR && unrecognized.is_empty() {
        return None;
    }
    Some(Negotiation {
        version: PROTOCOL_3_0 | u32::from(NEWEST_MINOR),
        unrecognized,
    })
}

/// A startup parameter that is a protocol option (`_pq_.` prefix) rather than a GUC.
pub fn is_protocol_option(name: &str) -> bool {
    name.starts_with("_pq_.")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{encode, parse_tagged};
    use bytes::{Buf, BytesMut};

    fn params(names: &[&str]) -> Vec<(String, String)> {
        names
            .iter()
            .map(|n| (n.to_string(), "x".to_string()))
            .collect()
    }

    #[test]
    fn protocol_3_0_without_options_needs_no_message() {
        assert_eq!(negotiate(0, &params(&["user", "replication"])), None);
    }

    #[test]
    fn protocol_3_2_is_answered_with_3_0() {
        let n = negotiate(2, &params(&["user"])).unwrap();
        assert_eq!(n.version, 196_608);
        assert!(n.unrecognized.is_empty());
    }

    #[test]
    fn unknown_options_are_listed_in_order_even_at_3_0() {
        let n = negotiate(0, &params(&["user", "_pq_.b", "database", "_pq_.a"])).unwrap();
        assert_eq!(n.version, 196_608);
        assert_eq!(n.unrecognized, vec!["_pq_.b", "_pq_.a"]);
        let n = negotiate(9999, &params(&["_pq_.x"])).unwrap();
        assert_eq!(n.version, 196_608);
        assert_eq!(n.unrecognized, vec!["_pq_.x"]);
    }

    #[test]
    fn message_carries_the_whole_version_and_the_options() {
        let n = negotiate(2, &params(&["_pq_.opt"])).unwrap();
        let mut out = BytesMut::new();
        encode::negotiate_protocol_version(&mut out, &n);
        let m = parse_tagged(&mut out, |_| 1000).unwrap().unwrap();
        assert_eq!(m.tag, b'v');
        let mut b = m.body.clone();
        assert_eq!(b.get_u32(), 0x0003_0000);
        assert_eq!(b.get_u32(), 1);
        assert_eq!(&b[..], b"_pq_.opt\0");
    }
}
