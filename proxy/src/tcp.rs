//! TCP options of the relay's PostgreSQL connections, both ways: keepalive as PostgreSQL sets
//! it on its clients' sockets (and libpq on its connections), so that a peer whose host went
//! away while the connection waits for it is found gone in about two minutes, not never;
//! and the receive low-water mark ([`RecvWake`]), with which a reader that batches is not
//! woken by each arrival it will not read yet; and [`Discard`], with which a reader drops
//! bytes it does not need without copying them.

use std::time::Duration;

use tokio::net::TcpStream;
use tracing::warn;

use crate::logging::Repeats;

mod discard;
pub use discard::Discard;

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

/// When the runtime hears of bytes arriving on a TCP connection: at every arrival (the
/// kernel's default), or, while [`RecvWake::defer`] holds, only once a number of bytes wait
/// (`SO_RCVLOWAT`, Linux). A busy primary sends each commit's WAL on its own; a reader that
/// takes them once per batch window was still woken by each (the runtime's I/O driver
/// returns from `epoll_wait` for every arrival on a registered socket), and those wake-ups
/// were much of a live upstream's CPU on a commit-heavy load.
///
/// It holds its own descriptor of the socket (a `dup`), closed with it: the connection's
/// reads and writes go through the runtime's boxed I/O, which does not lend its descriptor.
/// The kernel caps the mark at half the most a receive buffer may grow to, and grows the
/// buffer to hold it if needed; it still wakes the reader when the buffer runs short of room
/// (no deadlock on a full buffer), and when the mark goes back to one byte with bytes already
/// waiting ([`RecvWake::restore`]). Reads themselves are not changed: a read that does not
/// wait returns what is there, however little.
pub struct RecvWake {
    /// Shared with the connection's [`Discard`], if it has one: one descriptor each.
    sock: std::sync::Arc<socket2::Socket>,
    deferred: bool,
}

impl RecvWake {
    /// For `tcp` (None where the system has no such option, or the descriptor could not be
    /// duplicated: then the reader is woken at every arrival, as before).
    pub fn of(tcp: &TcpStream) -> Option<RecvWake> {
        if !cfg!(target_os = "linux") {
            return None;
        }
        let sock = socket2::SockRef::from(tcp).try_clone().ok()?;
        Some(RecvWake {
            sock: std::sync::Arc::new(sock),
            deferred: false,
        })
    }

    /// The connection's [`Discard`], on this handle's descriptor (for a plain connection
    /// only: with TLS the bytes on the socket are records to decrypt).
    pub fn discard(&self) -> Discard {
        Discard::on(self.sock.clone())
    }

    /// The reader is woken only once `bytes` wait (or the buffer runs short of room, or the
    /// connection ends). False when the option could not be set (nothing changed).
    pub fn defer(&mut self, bytes: usize) -> bool {
        let mark = bytes.clamp(1, i32::MAX as usize) as libc::c_int;
        self.deferred = set_rcvlowat(&self.sock, mark).is_ok();
        self.deferred
    }

    /// Whether [`RecvWake::defer`] holds.
    pub fn deferred(&self) -> bool {
        self.deferred
    }

    /// Back to waking the reader at every arrival (when bytes wait already, the kernel tells
    /// the runtime at once); true when [`RecvWake::defer`] held until now. When the option
    /// cannot be set back, the handle no longer counts it deferred either.
    pub fn restore(&mut self) -> bool {
        let was = std::mem::take(&mut self.deferred);
        if was {
            if let Err(e) = set_rcvlowat(&self.sock, 1) {
                tracing::warn!("the receive low-water mark of a connection to the primary could not be set back ({e}): its reader may be woken late");
            }
        }
        was
    }

    /// How many bytes wait unread in the socket (`FIONREAD`; None when it cannot be asked).
    pub fn unread(&self) -> Option<usize> {
        unread(&self.sock).ok()
    }
}

/// `setsockopt(SO_RCVLOWAT)` on `sock`.
#[cfg(target_os = "linux")]
fn set_rcvlowat(sock: &socket2::Socket, mark: libc::c_int) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is `sock`'s own, open for the whole call; the option value is a
    // live `c_int` whose size is passed with it.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&mark as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(not(target_os = "linux"))]
fn set_rcvlowat(_: &socket2::Socket, _: libc::c_int) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// Bytes received on `sock` and not yet read (`FIONREAD`).
fn unread(sock: &socket2::Socket) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: the descriptor is `sock`'s own, open for the whole call; FIONREAD writes one
    // `c_int` through the pointer, which points at a live one.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::FIONREAD, &mut n as *mut libc::c_int) };
    match rc {
        0 => Ok(usize::try_from(n).unwrap_or(0)),
        _ => Err(std::io::Error::last_os_error()),
    }
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

#[cfg(all(test, target_os = "linux"))]
pub(crate) mod recv_wake_tests {
    use super::RecvWake;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    /// A connected pair: (the reading end, the writing end), after 16 MB went across. The
    /// kernel wakes a reader below its mark while the receive window is down to one segment
    /// (on loopback, 64 kB: a new connection's), and the window opens as data is read, as
    /// on a replication connection that has streamed a while.
    pub(crate) async fn pair() -> (TcpStream, TcpStream) {
        use tokio::io::AsyncReadExt;
        let (mut reader, mut writer) = new_pair().await;
        const WARM: usize = 16 << 20;
        let send = tokio::spawn(async move {
            writer.write_all(&vec![0u8; WARM]).await.unwrap();
            writer
        });
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0;
        while got < WARM {
            got += reader.read(&mut buf).await.unwrap();
        }
        (reader, send.await.unwrap())
    }

    /// A connected pair as it is new: (the reading end, the writing end).
    pub(crate) async fn new_pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let writer = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (reader, _) = l.accept().await.unwrap();
        (reader, writer)
    }

    async fn readable_within(s: &TcpStream, ms: u64) -> bool {
        tokio::time::timeout(Duration::from_millis(ms), s.readable())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn deferred_arrivals_wake_no_one_until_the_mark_or_the_restore() {
        let (reader, mut writer) = pair().await;
        let mut wake = RecvWake::of(&reader).expect("Linux has SO_RCVLOWAT");
        assert!(wake.defer(1000));
        assert!(wake.deferred());
        writer.write_all(&[7u8; 100]).await.unwrap();
        // Below the mark: the runtime is not told.
        assert!(!readable_within(&reader, 200).await);
        // Back to one byte: the kernel tells at once of the 100 bytes waiting.
        assert!(wake.restore());
        assert!(!wake.deferred());
        assert_eq!(wake.unread(), Some(100));
        assert!(readable_within(&reader, 5000).await);
        let mut buf = [0u8; 200];
        assert_eq!(reader.try_read(&mut buf).unwrap(), 100);
    }

    #[tokio::test]
    async fn reaching_the_mark_wakes_the_reader() {
        let (reader, mut writer) = pair().await;
        let mut wake = RecvWake::of(&reader).unwrap();
        assert!(wake.defer(1000));
        writer.write_all(&[1u8; 600]).await.unwrap();
        assert!(!readable_within(&reader, 200).await);
        writer.write_all(&[2u8; 600]).await.unwrap();
        assert!(readable_within(&reader, 5000).await);
        assert!(wake.deferred());
        assert_eq!(wake.unread(), Some(1200));
    }

    #[tokio::test]
    async fn a_closed_peer_wakes_a_deferred_reader() {
        let (reader, writer) = pair().await;
        let mut wake = RecvWake::of(&reader).unwrap();
        assert!(wake.defer(1 << 20));
        drop(writer);
        assert!(readable_within(&reader, 5000).await);
        let mut buf = [0u8; 16];
        assert_eq!(reader.try_read(&mut buf).unwrap(), 0);
    }

    #[tokio::test]
    async fn an_undeferred_socket_wakes_at_once_and_counts_what_waits() {
        let (reader, mut writer) = pair().await;
        let mut wake = RecvWake::of(&reader).unwrap();
        assert!(!wake.restore());
        assert_eq!(wake.unread(), Some(0));
        writer.write_all(b"abc").await.unwrap();
        assert!(readable_within(&reader, 5000).await);
        assert_eq!(wake.unread(), Some(3));
    }
}
