//! libpq's sslmode fallback on one host, as decisions without I/O: which transport the first
//! try uses, and whether a failed first try earns a second one with the other transport.
//!
//! libpq (`PQconnectPoll` in `fe-connect.c`) makes at most two tries per host address, both
//! within that address's `connect_timeout`:
//!
//! - `allow` first connects in the clear. If the server then refuses with an ErrorResponse
//!   before AuthenticationOk (state `CONNECTION_AWAITING_RESPONSE`), it connects again and
//!   asks for TLS.
//! - `prefer` first asks for TLS; the server's 'N' goes on in the clear on the same
//!   connection (no second try). If the TLS handshake fails, or the server refuses the TLS
//!   connection with an ErrorResponse before AuthenticationOk, it connects again in the
//!   clear.
//! - The refusal that earns a second try is any ErrorResponse before AuthenticationOk
//!   (pg_hba.conf, a wrong password, too many connections, ...) except SQLSTATE 57P03
//!   (`cannot_connect_now`), after which libpq moves on to the next host. Errors after
//!   AuthenticationOk (a missing database, ...), errors of the client's own (no password
//!   configured, a SCRAM proof that does not verify), I/O and protocol errors, an error answer
//!   to the SSLRequest, and a server that does not qualify under `target_session_attrs` earn
//!   none.

use crate::conninfo::SslMode;

/// SQLSTATE `cannot_connect_now`: the server is starting up, shutting down or in recovery
/// without hot standby. libpq moves on to the next host instead of changing the transport.
pub const CANNOT_CONNECT_NOW: &str = "57P03";

/// How one try on a host treats TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tls {
    /// No SSLRequest: in the clear.
    Off,
    /// SSLRequest; a server that answers 'N' is used in the clear, on the same connection.
    IfOffered,
    /// SSLRequest; a server that answers 'N' fails the try.
    Required,
}

/// Why a try failed, as much as the fallback needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The TLS handshake failed after the server agreed to TLS.
    Handshake,
    /// The server sent an ErrorResponse (SQLSTATE `code`) before AuthenticationOk, on a
    /// connection that was (`tls`) or was not encrypted.
    Refused { code: String, tls: bool },
    /// Anything else.
    Other,
}

/// The transport of the first try on a host.
pub fn first_try(mode: SslMode) -> Tls {
    match mode {
        SslMode::Disable | SslMode::Allow => Tls::Off,
        SslMode::Prefer => Tls::IfOffered,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Tls::Required,
    }
}

/// The transport of the second try on the same host after the first failed with `failure`,
/// or `None`: no second try. There is never a third.
pub fn second_try(mode: SslMode, failure: &Failure) -> Option<Tls> {
    match (mode, failure) {
        (_, Failure::Refused { code, .. }) if code == CANNOT_CONNECT_NOW => None,
        // libpq's second try under allow asks for TLS; PostgreSQL 17's libpq fails it when
        // the server answers 'N' (the clear was already refused).
        (SslMode::Allow, Failure::Refused { tls: false, .. }) => Some(Tls::Required),
        (SslMode::Prefer, Failure::Refused { tls: true, .. } | Failure::Handshake) => {
            Some(Tls::Off)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: &str, tls: bool) -> Failure {
        Failure::Refused {
            code: code.into(),
            tls,
        }
    }

    const NO_HBA_ENTRY: &str = "28000";
    const INVALID_PASSWORD: &str = "28P01";

    #[test]
    fn allow_tries_tls_after_a_refusal_in_the_clear() {
        assert_eq!(first_try(SslMode::Allow), Tls::Off);
        for code in [NO_HBA_ENTRY, INVALID_PASSWORD, "53300"] {
            let f = refused(code, false);
            assert_eq!(
                second_try(SslMode::Allow, &f),
                Some(Tls::Required),
                "{code}"
            );
        }
    }

    #[test]
    fn prefer_tries_the_clear_after_a_refusal_with_tls_or_a_failed_handshake() {
        assert_eq!(first_try(SslMode::Prefer), Tls::IfOffered);
        let tls_refused = refused(NO_HBA_ENTRY, true);
        assert_eq!(second_try(SslMode::Prefer, &tls_refused), Some(Tls::Off));
        assert_eq!(
            second_try(SslMode::Prefer, &Failure::Handshake),
            Some(Tls::Off)
        );
        // The server answered 'N' and refused the connection in the clear: nothing else to try.
        assert_eq!(
            second_try(SslMode::Prefer, &refused(NO_HBA_ENTRY, false)),
            None
        );
    }

    #[test]
    fn cannot_connect_now_and_other_failures_earn_no_second_try() {
        for mode in [SslMode::Allow, SslMode::Prefer] {
            let tls = mode == SslMode::Prefer;
            assert_eq!(second_try(mode, &refused(CANNOT_CONNECT_NOW, tls)), None);
            assert_eq!(second_try(mode, &Failure::Other), None);
        }
        assert_eq!(second_try(SslMode::Allow, &Failure::Handshake), None);
    }

    #[test]
    fn other_modes_have_one_try() {
        assert_eq!(first_try(SslMode::Disable), Tls::Off);
        for mode in [SslMode::Require, SslMode::VerifyCa, SslMode::VerifyFull] {
            assert_eq!(first_try(mode), Tls::Required);
        }
        for mode in [
            SslMode::Disable,
            SslMode::Require,
            SslMode::VerifyCa,
            SslMode::VerifyFull,
        ] {
            for f in [
                Failure::Handshake,
                refused(NO_HBA_ENTRY, false),
                refused(NO_HBA_ENTRY, true),
                Failure::Other,
            ] {
                assert_eq!(second_try(mode, &f), None, "{mode:?} {f:?}");
            }
        }
    }
}
