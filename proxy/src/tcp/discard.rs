//! Dropping bytes that wait on a plain TCP connection without copying them: `recv` with
//! `MSG_TRUNC` (Linux), with which TCP advances past the bytes and writes nothing.
//!
//! A standby's identity (its own replication connection to the primary, `upstream::identity`)
//! receives all the WAL the stream already carried, only to note where it ends. On a bulk
//! load that is a second copy of every byte into the upstream, about 4 % of its CPU per
//! standby (`perf`, the sixty-ninth round of `docs/keeping-up.md`). It reads each XLogData's
//! header and has the kernel drop the rest. Not for TLS: there the bytes on the socket are
//! records that must be decrypted in order.

use std::sync::Arc;

/// A plain TCP connection's descriptor (a `dup`, shared with its [`super::RecvWake`] and
/// closed with the last of them), for dropping the bytes that wait on it. The connection's
/// reads go through the runtime's boxed I/O, which does not lend its descriptor; bytes
/// dropped here simply never reach it.
pub struct Discard {
    sock: Arc<socket2::Socket>,
}

impl Discard {
    /// On `sock`, a TCP socket's descriptor ([`super::RecvWake::discard`]).
    pub(super) fn on(sock: Arc<socket2::Socket>) -> Discard {
        Discard { sock }
    }

    /// Drops up to `max` of the bytes that wait now, without waiting: how many went (0 when
    /// none waited or `max` is 0). The connection's end is an error (`UnexpectedEof`), as
    /// is any other failure of the `recv`.
    #[cfg(target_os = "linux")]
    pub fn drop_waiting(&self, max: usize) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        if max == 0 {
            return Ok(0);
        }
        let flags = libc::MSG_TRUNC | libc::MSG_DONTWAIT;
        // SAFETY: the descriptor is `sock`'s own, open for the whole call, and a TCP socket
        // (`RecvWake::of` takes only a `TcpStream`): with MSG_TRUNC, TCP's `recvmsg` skips the
        // copy to the buffer (`tcp_recvmsg_locked`) and returns how many bytes it passed, so
        // the null buffer is never written or read.
        let rc = unsafe { libc::recv(self.sock.as_raw_fd(), std::ptr::null_mut(), max, flags) };
        match rc {
            0 => Err(std::io::ErrorKind::UnexpectedEof.into()),
            n if n > 0 => Ok(n as usize),
            _ => match std::io::Error::last_os_error() {
                e if e.kind() == std::io::ErrorKind::WouldBlock => Ok(0),
                e if e.kind() == std::io::ErrorKind::Interrupted => Ok(0),
                e => Err(e),
            },
        }
    }

    #[cfg(not(target_os = "linux"))]
    pub fn drop_waiting(&self, _: usize) -> std::io::Result<usize> {
        Ok(0)
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::super::RecvWake;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = tokio::net::TcpStream::connect(l.local_addr().unwrap());
        let (a, b) = tokio::join!(a, l.accept());
        (a.unwrap(), b.unwrap().0)
    }

    /// What waits is dropped up to the bound, the next bytes are read as they were sent,
    /// nothing waiting is 0 (never a wait), and the peer's end is an error.
    #[tokio::test]
    async fn drops_what_waits_and_no_more() {
        let (mut tx, mut rx) = pair().await;
        let d = RecvWake::of(&rx).unwrap().discard();
        assert_eq!(d.drop_waiting(100).unwrap(), 0);
        let sent: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        tx.write_all(&sent).await.unwrap();
        tx.flush().await.unwrap();
        // Drop the first 150,000 bytes, as they arrive.
        let mut dropped = 0;
        while dropped < 150_000 {
            dropped += d.drop_waiting(150_000 - dropped).unwrap();
            tokio::task::yield_now().await;
        }
        assert_eq!(dropped, 150_000);
        let mut rest = vec![0u8; 50_000];
        rx.read_exact(&mut rest).await.unwrap();
        assert_eq!(rest, sent[150_000..]);
        assert_eq!(d.drop_waiting(100).unwrap(), 0);
        drop(tx);
        let mut eof = false;
        for _ in 0..1000 {
            match d.drop_waiting(100) {
                Ok(0) => tokio::time::sleep(std::time::Duration::from_millis(1)).await,
                Ok(n) => panic!("{n} bytes after the end"),
                Err(e) => {
                    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
                    eof = true;
                    break;
                }
            }
        }
        assert!(eof);
    }
}
