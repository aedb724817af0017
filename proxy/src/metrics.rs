//! Process-wide counters: what came from the primary, what crossed the link, sessions.
//! `[metrics] listen` exports them (see [`crate::monitor`]).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

#[derive(Debug, Default)]
pub struct Metrics {
    /// WAL bytes received from the primary (XLogData payloads).
    pub wal_bytes_in: AtomicU64,
    /// Encoded WAL payload bytes sent on the link.
    pub wal_payload_bytes_out: AtomicU64,
    /// Link messages sent by the upstream (WAL and other).
    pub link_messages_out: AtomicU64,
    /// Bytes read from / written to link sockets by the upstream (TLS and HTTP/2 framing included).
    pub link_socket_bytes_in: AtomicU64,
    pub link_socket_bytes_out: AtomicU64,
    /// WAL bytes delivered to standbys by the downstream.
    pub wal_bytes_delivered: AtomicU64,
    pub sessions_active_upstream: AtomicU64,
    pub sessions_active_downstream: AtomicU64,
    pub sessions_total: AtomicU64,
    pub integrity_failures: AtomicU64,
    /// Time spent in the link codec, nanoseconds (encode at the upstream, decode at the downstream).
    pub encode_ns: AtomicU64,
    pub decode_ns: AtomicU64,
    /// Batches encoded (upstream) and frames restored (downstream) with the codec's extra
    /// threads allowed (the stage's queue was full and its thread not short of CPU:
    /// `WalEncoder::set_parallel`).
    pub codec_parallel_messages: [AtomicU64; 2],
    /// WAL runs staged ahead: encoded in two halves (upstream, `WalEncoder::stage`) or their
    /// sections decompressed ahead (downstream, `WalDecoder::stage`).
    pub codec_staged_messages: [AtomicU64; 2],
    /// Batches (upstream) and frames (downstream) found behind that the stage kept on one
    /// core because its thread was short of CPU (`crate::coreshare`).
    pub codec_short_of_cpu_messages: [AtomicU64; 2],
    /// Batches encoded with the codec's fast settings while the upstream fell behind on CPU
    /// (`link.catch_up`).
    pub codec_fast_messages: AtomicU64,
    /// Times the upstream turned the fast settings on (`link.catch_up`): each time, and again
    /// when it turns them off, the bulk streams start new zstd frames and lose their history.
    pub codec_fast_spells: AtomicU64,
    pub auth_failures: AtomicU64,
    pub protocol_errors: AtomicU64,
    /// Tunnels (`crate::walsender::tunnel`), per half ([upstream, downstream]): open now, and protocol
    /// bytes relayed from and to the primary (uncompressed).
    pub tunnels_active: [AtomicU64; 2],
    pub tunnel_bytes_from_primary: [AtomicU64; 2],
    pub tunnel_bytes_to_primary: [AtomicU64; 2],
    /// Client messages the downstream's tunnel allowlist refused.
    pub tunnel_refused: AtomicU64,
    /// Cancel requests at the downstream, by outcome: [relayed to the primary, naming no
    /// live tunnel, failed on the way (link, upstream, primary)].
    pub tunnel_cancels: [AtomicU64; 3],
    /// Standby status updates whose positions went beyond the WAL sent, lowered to it.
    pub positions_clamped: AtomicU64,
    /// Connections refused or cut before a session, by reason (see [`Refusals`]).
    pub refusals: Refusals,
    /// Per-standby state, codec totals and session counters (see [`crate::monitor`]).
    pub ops: crate::monitor::Ops,
}

/// Connections the standby listener and the link listener refused or cut before a session.
#[derive(Debug, Default)]
pub struct Refusals {
    /// Standby listener: `limits.max_startups` reached.
    pub max_startups: AtomicU64,
    /// Standby listener: `limits.max_startups_per_address` reached.
    pub max_startups_per_address: AtomicU64,
    /// Standby listener: authenticated, but `limits.max_sessions` reached.
    pub max_sessions: AtomicU64,
    /// Standby listener: no startup packet within `limits.startup_timeout_secs`, or startup
    /// and authentication not done within `limits.auth_timeout_secs`.
    pub startup_timeout: AtomicU64,
    /// Standby listener: TLS handshakes that failed or were refused.
    pub tls_handshake: AtomicU64,
    /// Link listener: TLS handshakes that failed, by reason.
    pub link_handshake_timeout: AtomicU64,
    pub link_handshake_tls: AtomicU64,
    pub link_handshake_busy: AtomicU64,
    pub link_handshake_peer_name: AtomicU64,
}

/// A snapshot of the counters.
#[derive(Debug, Default, Clone, Copy)]
pub struct Snapshot {
    pub wal_bytes_in: u64,
    pub wal_payload_bytes_out: u64,
    pub link_messages_out: u64,
    pub link_socket_bytes_in: u64,
    pub link_socket_bytes_out: u64,
    pub wal_bytes_delivered: u64,
    pub integrity_failures: u64,
    pub encode_ns: u64,
    pub decode_ns: u64,
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        Arc::new(Metrics::default())
    }

    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            wal_bytes_in: self.wal_bytes_in.load(Relaxed),
            wal_payload_bytes_out: self.wal_payload_bytes_out.load(Relaxed),
            link_messages_out: self.link_messages_out.load(Relaxed),
            link_socket_bytes_in: self.link_socket_bytes_in.load(Relaxed),
            link_socket_bytes_out: self.link_socket_bytes_out.load(Relaxed),
            wal_bytes_delivered: self.wal_bytes_delivered.load(Relaxed),
            integrity_failures: self.integrity_failures.load(Relaxed),
            encode_ns: self.encode_ns.load(Relaxed),
            decode_ns: self.decode_ns.load(Relaxed),
        }
    }
}

/// Runs `f`, adding the CPU time this thread spent in it to `counter` (nanoseconds). CPU
/// time, not wall time: on a busy machine a descheduled thread would inflate wall time.
pub fn timed<T>(counter: &AtomicU64, f: impl FnOnce() -> T) -> T {
    let t = thread_cpu_ns();
    let r = f();
    counter.fetch_add(thread_cpu_ns().saturating_sub(t), Relaxed);
    r
}

/// Runs `f`, adding the wall-clock time it took (waiting for the disk included) to `counter`,
/// in nanoseconds.
pub fn timed_wall<T>(counter: &AtomicU64, f: impl FnOnce() -> T) -> T {
    let t = std::time::Instant::now();
    let r = f();
    let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
    counter.fetch_add(ns, Relaxed);
    r
}

/// CPU time of the calling thread, nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Decrements a gauge when dropped.
pub struct GaugeGuard<'a>(&'a AtomicU64);

impl<'a> GaugeGuard<'a> {
    pub fn inc(g: &'a AtomicU64) -> Self {
        g.fetch_add(1, Relaxed);
        GaugeGuard(g)
    }
}

impl Drop for GaugeGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}
