//! A TCP forwarder standing for the WAN link between the halves: it counts the bytes crossing
//! it in each direction (what a user's link carries: TLS, HTTP/2 and gRPC framing, feedback),
//! and for the tests it can cut the link, freeze it, or flip one byte (on a plaintext HTTP/2
//! link, one inside a DATA frame: see [`H2Scan`]).
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
    /// Which byte of a DATA payload to flip toward / from the target (-1: the first due).
    corrupt_toward_at: AtomicI64,
    corrupt_from_at: AtomicI64,
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
    /// that has not started listening yet. Between [`free_port`] releasing the port and the
    /// bind here, another process may take it (an outgoing connection's ephemeral port): then
    /// another port is tried, a few times.
    pub fn start(target: u16) -> Result<Forwarder, ForwardError> {
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(("127.0.0.1", free_port())) {
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && tries < 10 => tries += 1,
                r => break r?,
            }
        };
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            up: AtomicBool::new(true),
            corrupt_toward: AtomicI64::new(-1),
            corrupt_from: AtomicI64::new(-1),
            corrupt_toward_at: AtomicI64::new(-1),
            corrupt_from_at: AtomicI64::new(-1),
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
    /// `n` more bytes (on plaintext HTTP/2, of the first byte of a DATA frame's payload from
    /// there on).
    pub fn corrupt_once_after(&self, n: i64) {
        arm(
            &self.shared.corrupt_from,
            &self.shared.corrupt_from_at,
            n,
            None,
        );
    }

    /// Like [`Self::corrupt_once_after`], flipping byte `at` of a DATA frame's payload (see
    /// [`Self::corrupt_up_payload_byte_once_after`]).
    pub fn corrupt_down_payload_byte_once_after(&self, n: i64, at: usize) {
        arm(
            &self.shared.corrupt_from,
            &self.shared.corrupt_from_at,
            n,
            Some(at),
        );
    }

    /// Flips one bit of the byte that crosses toward the upstream (the target) after `n` more
    /// bytes (on plaintext HTTP/2, of the first byte of a DATA frame's payload from there on).
    pub fn corrupt_up_once_after(&self, n: i64) {
        arm(
            &self.shared.corrupt_toward,
            &self.shared.corrupt_toward_at,
            n,
            None,
        );
    }

    /// Like [`Self::corrupt_up_once_after`], flipping byte `at` of a DATA frame's payload (the
    /// first payload from there on that has it): with gRPC, byte 0 is the message's
    /// compression flag and bytes 1..=4 its length (big-endian).
    pub fn corrupt_up_payload_byte_once_after(&self, n: i64, at: usize) {
        arm(
            &self.shared.corrupt_toward,
            &self.shared.corrupt_toward_at,
            n,
            Some(at),
        );
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

/// Arms one direction's flip: after `n` more bytes, of payload byte `at` (None: the first due).
fn arm(after: &AtomicI64, payload_byte: &AtomicI64, n: i64, at: Option<usize>) {
    payload_byte.store(at.map_or(-1, |b| b as i64), SeqCst);
    after.store(n, SeqCst);
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
    let (corrupt, corrupt_at, count) = if toward {
        (&sh.corrupt_toward, &sh.corrupt_toward_at, &sh.toward_target)
    } else {
        (&sh.corrupt_from, &sh.corrupt_from_at, &sh.from_target)
    };
    let mut buf = vec![0u8; 64 * 1024];
    let mut scan = H2Scan::new(toward);
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
        scan.payload_byte = usize::try_from(corrupt_at.load(SeqCst)).ok();
        flip_due(&mut scan, corrupt, &mut buf[..n]);
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

/// Flips the bit due in `buf`, the next piece of the stream, if any: `corrupt` counts bytes
/// down to 0, then the first byte `scan` says must be noticed is flipped (-1: nothing armed,
/// or done).
fn flip_due(scan: &mut H2Scan, corrupt: &AtomicI64, buf: &mut [u8]) {
    let n = buf.len();
    let left = corrupt.load(SeqCst);
    let due = usize::try_from(left).ok().filter(|&l| l < n);
    match (scan.feed(buf, due), due) {
        (Some(i), _) => {
            buf[i] ^= 0x20;
            corrupt.store(-1, SeqCst);
        }
        // Due, but no DATA payload in this piece: the next one.
        (None, Some(_)) => corrupt.store(0, SeqCst),
        (None, None) if left >= 0 => corrupt.store(left - n as i64, SeqCst),
        (None, None) => {}
    }
}

/// HTTP/2's client connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Follows one direction of a connection through HTTP/2 framing (the client's preface, then
/// 9-byte frame headers and payloads), so that a bit is flipped where the relay must notice
/// it: in a DATA frame's payload (gRPC messages: WAL, feedback, their checksum). A bit
/// flipped in a WINDOW_UPDATE increment, a PING or a SETTINGS value changes nothing that a
/// checksum could see. A stream that does not start like plaintext HTTP/2 (TLS) is opaque:
/// any byte will do, since TLS notices every one.
struct H2Scan {
    /// Preface bytes still expected (toward the target only).
    preface: usize,
    /// Whether no frame has been seen yet: a server's first frame is SETTINGS, anything else
    /// (a TLS record) makes the stream opaque.
    first: bool,
    head: [u8; 9],
    have: usize,
    /// Payload bytes left in the current frame, its length, and whether it is a DATA frame.
    left: usize,
    len: usize,
    data: bool,
    opaque: bool,
    /// Flip this byte of a DATA payload rather than the first one due.
    payload_byte: Option<usize>,
}

impl H2Scan {
    fn new(toward_target: bool) -> H2Scan {
        H2Scan {
            preface: if toward_target { PREFACE.len() } else { 0 },
            first: true,
            head: [0; 9],
            have: 0,
            left: 0,
            len: 0,
            data: false,
            opaque: false,
            payload_byte: None,
        }
    }

    /// Follows the next bytes of the stream, `buf`; returns the first position at or after
    /// `from` (if any) where a flipped bit must be noticed.
    fn feed(&mut self, buf: &[u8], from: Option<usize>) -> Option<usize> {
        let mut hit = None;
        let take = |at: usize, end: usize, hit: &mut Option<usize>| {
            if let Some(f) = from.filter(|_| hit.is_none()) {
                *hit = Some(at.max(f)).filter(|&p| p < end);
            }
        };
        let mut i = 0;
        while i < buf.len() {
            if self.opaque {
                take(i, buf.len(), &mut hit);
                break;
            }
            if self.preface > 0 {
                let k = (buf.len() - i).min(self.preface);
                let at = PREFACE.len() - self.preface;
                self.opaque = buf[i..i + k] != PREFACE[at..at + k];
                self.preface -= k;
                i += if self.opaque { 0 } else { k };
                continue;
            }
            if self.left > 0 {
                let k = (buf.len() - i).min(self.left);
                match (self.data, self.payload_byte) {
                    (true, None) => take(i, i + k, &mut hit),
                    (true, Some(t)) => {
                        let off = self.len - self.left;
                        if (off..off + k).contains(&t) {
                            let at = i + t - off;
                            take(at, at + 1, &mut hit);
                        }
                    }
                    (false, _) => {}
                }
                self.left -= k;
                i += k;
                continue;
            }
            let k = (buf.len() - i).min(9 - self.have);
            self.head[self.have..self.have + k].copy_from_slice(&buf[i..i + k]);
            self.have += k;
            i += k;
            if self.have == 9 {
                let h = self.head;
                if std::mem::take(&mut self.first) && h[3] != 4 {
                    self.opaque = true;
                    self.have = 0;
                    take(i, buf.len(), &mut hit);
                    break;
                }
                self.left = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                self.len = self.left;
                self.data = h[3] == 0;
                self.have = 0;
            }
        }
        hit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame: 9-byte header (length, type, flags, stream 1) and payload.
    fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let n = payload.len();
        let mut f = vec![
            (n >> 16) as u8,
            (n >> 8) as u8,
            n as u8,
            kind,
            0,
            0,
            0,
            0,
            1,
        ];
        f.extend_from_slice(payload);
        f
    }

    /// The flip lands in the first byte of a DATA frame's payload at or after the byte that
    /// was due, however the stream is cut into reads; in the byte due on a stream that is
    /// not plaintext HTTP/2.
    #[test]
    fn flips_land_in_data_payloads() {
        let mut stream = PREFACE.to_vec();
        stream.extend(frame(4, &[0; 6])); // SETTINGS
        stream.extend(frame(8, &[0, 0, 1, 0])); // WINDOW_UPDATE
        let data_at = stream.len() + 9;
        stream.extend(frame(0, b"grpc message"));
        stream.extend(frame(6, &[7; 8])); // PING
        let flipped = |stream: &[u8], toward: bool, piece: usize, after: i64| {
            let (mut scan, corrupt) = (H2Scan::new(toward), AtomicI64::new(after));
            let mut out = stream.to_vec();
            for chunk in out.chunks_mut(piece) {
                flip_due(&mut scan, &corrupt, chunk);
            }
            let diff: Vec<usize> = (0..out.len()).filter(|&i| out[i] != stream[i]).collect();
            assert_eq!(corrupt.load(SeqCst), -1, "not flipped ({piece}, {after})");
            assert_eq!(diff.len(), 1, "{diff:?}");
            diff[0]
        };
        for piece in [1, 5, 9, 10, 64] {
            for after in [0, 30, data_at, data_at + 3] {
                let want = after.max(data_at);
                assert_eq!(
                    flipped(&stream, true, piece, after as i64),
                    want,
                    "{piece} {after}"
                );
            }
        }
        // From the server: no preface, SETTINGS first.
        let server = &stream[PREFACE.len()..];
        assert_eq!(flipped(server, false, 7, 0), data_at - PREFACE.len());
        // TLS (no preface, no SETTINGS): the byte that is due, or the first one after the
        // record header that told it apart.
        let tls = [0x16, 3, 3, 0, 90, 2, 0, 0, 86, 3, 3, 1, 2];
        for toward in [true, false] {
            assert_eq!(flipped(&tls, toward, 4, 10), 10);
        }
        assert_eq!(flipped(&tls, true, 4, 2), 2);
        assert_eq!(flipped(&tls, false, 4, 2), 9);
        // A chosen byte of a DATA payload: the first payload at or after the byte due that
        // reaches it.
        let mut two = PREFACE.to_vec();
        two.extend(frame(4, &[0; 6])); // SETTINGS
        let first = two.len() + 9;
        two.extend(frame(0, b"ab"));
        two.extend(frame(0, b"grpc message"));
        let second = two.len() - 12;
        for piece in [1, 3, 64] {
            for (after, want) in [
                (0, first + 1),
                (first + 1, first + 1),
                (first + 2, second + 1),
            ] {
                let (mut scan, corrupt) = (H2Scan::new(true), AtomicI64::new(after as i64));
                scan.payload_byte = Some(1);
                let mut out = two.clone();
                for chunk in out.chunks_mut(piece) {
                    flip_due(&mut scan, &corrupt, chunk);
                }
                let diff: Vec<usize> = (0..out.len()).filter(|&i| out[i] != two[i]).collect();
                assert_eq!(diff, [want], "{piece} {after}");
            }
        }
    }

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
