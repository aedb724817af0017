//! A TCP forwarder standing for the WAN link between the halves: it counts the bytes crossing
//! it in each direction (what a user's link carries: TLS, HTTP/2 and gRPC framing, feedback),
//! and for the tests it can cut the link, freeze it, or flip one byte.
//!
//! One thread per connection and direction, `TCP_NODELAY` on both sockets so small messages
//! (feedback, synchronous commits) are not held back by the forwarder.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cluster::free_port;

/// Starting the forwarder failed.
#[derive(Debug, thiserror::Error)]
#[error("starting the link forwarder: {0}")]
pub struct ForwardError(#[from] std::io::Error);

#[derive(Default)]
struct Shared {
    /// New connections are accepted (cleared by `cut`).
    up: AtomicBool,
    frozen: AtomicBool,
    stopped: AtomicBool,
    conns: Mutex<Vec<TcpStream>>,
    /// Flip one byte toward the target (upward) / from it (downward) once this many more
    /// bytes passed; -1 = not armed.
    corrupt_toward: AtomicI64,
    corrupt_from: AtomicI64,
    toward_target: AtomicU64,
    from_target: AtomicU64,
    /// Bytes per second from the target (0: as fast as it goes).
    rate_from: AtomicU64,
}

/// A forwarder from `127.0.0.1:port` to a target port on 127.0.0.1. Dropping it closes the
/// listener and every connection.
pub struct Forwarder {
    pub port: u16,
    shared: Arc<Shared>,
}

impl Forwarder {
    /// Listens on a free port of 127.0.0.1 and forwards each connection to `target`. The port
    /// comes from [`free_port`], so it is never one handed out (and released) for a process
    /// that has not started listening yet.
    pub fn start(target: u16) -> Result<Forwarder, ForwardError> {
        let listener = TcpListener::bind(("127.0.0.1", free_port()))?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            up: AtomicBool::new(true),
            corrupt_toward: AtomicI64::new(-1),
            corrupt_from: AtomicI64::new(-1),
            ..Default::default()
        });
        let sh = shared.clone();
        std::thread::Builder::new()
            .name(format!("forward-{port}"))
            .spawn(move || accept_loop(listener, target, sh))?;
        Ok(Forwarder { port, shared })
    }

    /// Bytes forwarded from clients to the target so far (downstream half → upstream half).
    pub fn bytes_toward_target(&self) -> u64 {
        self.shared.toward_target.load(SeqCst)
    }

    /// Bytes forwarded from the target to clients so far (upstream half → downstream half).
    pub fn bytes_from_target(&self) -> u64 {
        self.shared.from_target.load(SeqCst)
    }

    /// Flips one bit of the byte that crosses toward the downstream (from the target) after
    /// `n` more bytes.
    pub fn corrupt_once_after(&self, n: i64) {
        self.shared.corrupt_from.store(n, SeqCst);
    }

    /// Flips one bit of the byte that crosses toward the upstream (the target) after `n` more
    /// bytes.
    pub fn corrupt_up_once_after(&self, n: i64) {
        self.shared.corrupt_toward.store(n, SeqCst);
    }

    pub fn corruption_pending(&self) -> bool {
        self.shared.corrupt_from.load(SeqCst) >= 0 || self.shared.corrupt_toward.load(SeqCst) >= 0
    }

    /// Drops every connection and refuses new ones until [`Forwarder::restore`].
    pub fn cut(&self) {
        self.shared.up.store(false, SeqCst);
        self.close_all();
    }

    pub fn restore(&self) {
        self.shared.up.store(true, SeqCst);
    }

    /// Keeps connections open but stops moving bytes (a link that hangs) until `thaw`.
    pub fn freeze(&self) {
        self.shared.frozen.store(true, SeqCst);
    }

    pub fn thaw(&self) {
        self.shared.frozen.store(false, SeqCst);
    }

    /// Passes at most `bytes_per_sec` from the target (a slow line to the client; 0 lifts the
    /// limit), in pieces of a hundredth of a second's worth.
    pub fn limit_from_target(&self, bytes_per_sec: u64) {
        self.shared.rate_from.store(bytes_per_sec, SeqCst);
    }

    fn close_all(&self) {
        let mut conns = self.shared.conns.lock().unwrap_or_else(|e| e.into_inner());
        for c in conns.drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.shared.stopped.store(true, SeqCst);
        self.shared.frozen.store(false, SeqCst);
        // Wake the accept loop so it sees `stopped`.
        let _ = TcpStream::connect_timeout(
            &SocketAddr::from(([127, 0, 0, 1], self.port)),
            Duration::from_secs(1),
        );
        self.close_all();
    }
}

fn accept_loop(listener: TcpListener, target: u16, sh: Arc<Shared>) {
    for s in listener.incoming() {
        if sh.stopped.load(SeqCst) {
            return;
        }
        let Ok(client) = s else { continue };
        if !sh.up.load(SeqCst) {
            continue;
        }
        let Ok(server) = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], target))) else {
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (Ok(c2), Ok(s2), Ok(c3), Ok(s3)) = (
            client.try_clone(),
            server.try_clone(),
            client.try_clone(),
            server.try_clone(),
        ) else {
            continue;
        };
        sh.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend([c2, s2]);
        for (from, to, toward) in [(c3, s3, true), (server, client, false)] {
            let sh = sh.clone();
            let _ = std::thread::Builder::new()
                .name("forward-copy".into())
                .spawn(move || copy(from, to, toward, &sh));
        }
    }
}

/// Copies `from` to `to` until either side closes, counting, corrupting and freezing.
fn copy(mut from: TcpStream, mut to: TcpStream, toward: bool, sh: &Shared) {
    let (corrupt, count) = if toward {
        (&sh.corrupt_toward, &sh.toward_target)
    } else {
        (&sh.corrupt_from, &sh.from_target)
    };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let rate = if toward { 0 } else { sh.rate_from.load(SeqCst) };
        let cap = match rate {
            0 => buf.len(),
            r => ((r / 100) as usize).clamp(1, buf.len()),
        };
        let n = match from.read(&mut buf[..cap]) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let left = corrupt.load(SeqCst);
        if left >= 0 && (left as usize) < n {
            buf[left as usize] ^= 0x20;
            corrupt.store(-1, SeqCst);
        } else if left >= 0 {
            corrupt.store(left - n as i64, SeqCst);
        }
        while sh.frozen.load(SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        count.fetch_add(n as u64, SeqCst);
        if rate > 0 {
            std::thread::sleep(Duration::from_secs_f64(n as f64 / rate as f64));
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwards_and_counts_both_directions() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = echo.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut s, _) = echo.accept().unwrap();
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).unwrap();
            s.write_all(b"hello world").unwrap();
        });
        let f = Forwarder::start(target).unwrap();
        let mut c = TcpStream::connect(("127.0.0.1", f.port)).unwrap();
        c.write_all(b"hello").unwrap();
        let mut got = [0u8; 11];
        c.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello world");
        // The copy threads count after their writes return.
        for _ in 0..200 {
            if (f.bytes_toward_target(), f.bytes_from_target()) == (5, 11) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!((f.bytes_toward_target(), f.bytes_from_target()), (5, 11));
    }
}
