//! TCP options of the relay's PostgreSQL connections, both ways: keepalive as PostgreSQL sets
//! it on its clients' sockets (and libpq on its connections), so that a peer whose host went
//! away while the connection waits for it is found gone in about two minutes, not never.

use std::time::Duration;

use tokio::net::TcpStream;
use tracing::warn;

use crate::logging::Repeats;

/// Idle time before the first keepalive probe.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
/// Between probes.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered probes before the connection is given up.
pub const KEEPALIVE_PROBES: u32 = 6;

/// Turns TCP keepalive on for `sock` ([`KEEPALIVE_IDLE`], then [`KEEPALIVE_PROBES`] probes
/// [`KEEPALIVE_INTERVAL`] apart). With `user_timeout`, also bounds how long data written to it
/// may stay unacknowledged (`TCP_USER_TIMEOUT`, Linux) by the same two minutes: keepalive only
/// probes an idle connection, and a write to a host that vanished is retried for about a
/// quarter of an hour otherwise.
pub fn keep_alive(sock: &TcpStream, user_timeout: bool) -> std::io::Result<()> {
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    let s = socket2::SockRef::from(sock);
    s.set_tcp_keepalive(&keepalive)?;
    #[cfg(target_os = "linux")]
    if user_timeout {
        s.set_tcp_user_timeout(Some(KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_PROBES))?;
    }
    #[cfg(not(target_os = "linux"))]
    let _ = user_timeout;
    Ok(())
}

/// Pause after a failed `accept` before the next one, so that the loop does not spin.
pub const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// A listener's failed accepts: a process out of file descriptors (EMFILE) fails every accept,
/// ten a second with [`ACCEPT_RETRY`]; the same error is logged once a minute with a count.
pub struct AcceptErrors {
    listener: &'static str,
    repeats: Repeats,
}

impl AcceptErrors {
    /// For the listener named `listener` in the log ("standby", "link", "metrics").
    pub fn new(listener: &'static str) -> AcceptErrors {
        AcceptErrors {
            listener,
            repeats: Repeats::default(),
        }
    }

    /// Logs `e` (unless the same error was logged within the minute) and waits
    /// [`ACCEPT_RETRY`]; true when it logged.
    pub async fn failed(&mut self, e: std::io::Error) -> bool {
        let logged = self.repeats.report(&e.to_string());
        if let Some(n) = logged {
            let again = Repeats::since_text(n);
            warn!(
                "accept on the {} listener failed: {e}{again}",
                self.listener
            );
        }
        tokio::time::sleep(ACCEPT_RETRY).await;
        logged.is_some()
    }
}

#[cfg(test)]
#[tokio::test]
async fn a_repeated_accept_error_is_logged_once() {
    let mut errors = AcceptErrors::new("standby");
    let emfile = || std::io::Error::from_raw_os_error(libc::EMFILE);
    assert!(errors.failed(emfile()).await);
    assert!(!errors.failed(emfile()).await);
    assert!(!errors.failed(emfile()).await);
    assert!(
        errors
            .failed(std::io::Error::from_raw_os_error(libc::ENOBUFS))
            .await
    );
}
