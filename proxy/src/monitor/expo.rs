//! What `/metrics` and `/status.json` serve, rendered from the process's counters (sans-IO).
//!
//! `/metrics` is the Prometheus text exposition format, version 0.0.4: for every family a
//! `# HELP` and a `# TYPE` line, then its samples `name{label="value",...} value`, one per line,
//! label values escaped (`\\`, `\"`, `\n`). Every metric is listed with its meaning in
//! README.md ("Monitoring").
//!
//! `/status.json` is [`StatusDoc`] as JSON; `walrelay status` and the status page read it.

use std::fmt::Write;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use serde::{Deserialize, Serialize};

use super::codec_totals::{InOut, KINDS};
use super::standbys::StandbyRow;
use super::ProcessStats;
use crate::metrics::Metrics;
use walrelay_wal::walcodec::rmgr::RmgrBytes;

/// Which halves this process runs.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Halves {
    pub upstream: bool,
    pub downstream: bool,
}

/// One point of the bandwidth chart: rates over the preceding sampling interval.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the epoch.
    pub t: f64,
    /// WAL bytes per second (from the primary at the upstream; delivered at a downstream-only
    /// process).
    pub wal_bps: f64,
    /// Link bytes per second (socket bytes sent at the upstream; socket bytes received at a
    /// downstream-only process), framing included.
    pub link_bps: f64,
}

/// Totals over the life of the process.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StatusTotals {
    pub wal_received_bytes: u64,
    pub wal_delivered_bytes: u64,
    pub link_sent_bytes: u64,
    pub link_received_bytes: u64,
    pub link_payload_bytes: u64,
    /// WAL bytes / link bytes, as in [`Sample`]; None before any link byte.
    pub ratio: Option<f64>,
    pub integrity_failures: u64,
    pub block_cache_bytes: u64,
    pub fpis: u64,
    pub fpi_cache_hits: u64,
    pub sessions_upstream: u64,
    pub sessions_downstream: u64,
}

/// The `/status.json` document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusDoc {
    pub version: String,
    pub halves: Halves,
    pub uptime_seconds: f64,
    pub totals: StatusTotals,
    pub standbys: Vec<StandbyRow>,
    /// Oldest first, one per second at most.
    pub history: Vec<Sample>,
}

/// (WAL bytes, link bytes) as charted: see [`Sample`].
pub fn chart_counters(m: &Metrics, halves: Halves) -> (u64, u64) {
    if halves.upstream {
        (
            m.wal_bytes_in.load(Relaxed),
            m.link_socket_bytes_out.load(Relaxed),
        )
    } else {
        (
            m.wal_bytes_delivered.load(Relaxed),
            m.ops.link_socket_bytes_in_downstream.load(Relaxed),
        )
    }
}

pub fn status(m: &Metrics, halves: Halves, uptime_seconds: f64, history: Vec<Sample>) -> StatusDoc {
    let codec = m.ops.codec.snapshot();
    let (wal, link) = chart_counters(m, halves);
    // The link's sockets as seen by the upstream half if this process runs it.
    let (link_in, link_out) = match halves.upstream {
        true => (&m.link_socket_bytes_in, &m.link_socket_bytes_out),
        false => (
            &m.ops.link_socket_bytes_in_downstream,
            &m.ops.link_socket_bytes_out_downstream,
        ),
    };
    let totals = StatusTotals {
        wal_received_bytes: m.wal_bytes_in.load(Relaxed),
        wal_delivered_bytes: m.wal_bytes_delivered.load(Relaxed),
        link_sent_bytes: link_out.load(Relaxed),
        link_received_bytes: link_in.load(Relaxed),
        link_payload_bytes: if halves.upstream {
            m.wal_payload_bytes_out.load(Relaxed)
        } else {
            m.ops.link_payload_bytes_received.load(Relaxed)
        },
        ratio: (link > 0).then(|| wal as f64 / link as f64),
        integrity_failures: m.integrity_failures.load(Relaxed),
        block_cache_bytes: m.ops.codec.cache_bytes(),
        fpis: codec.fpis,
        fpi_cache_hits: codec.fpi_cache_hits,
        sessions_upstream: m.sessions_active_upstream.load(Relaxed),
        sessions_downstream: m.sessions_active_downstream.load(Relaxed),
    };
    StatusDoc {
        version: env!("CARGO_PKG_VERSION").into(),
        halves,
        uptime_seconds,
        totals,
        standbys: m.ops.standbys.rows(),
        history,
    }
}

/// A Prometheus text exposition being written.
struct Expo(String);

impl Expo {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let v = v
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                let _ = write!(self.0, "{k}=\"{v}\"");
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {}", fmt_value(value));
    }

    /// A family with a single unlabelled sample.
    fn one(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// A family with a sample per half (`half="upstream"`, then `"downstream"`), each if any.
    fn halves(&mut self, name: &str, kind: &str, help: &str, values: [Option<f64>; 2]) {
        self.family(name, kind, help);
        for (half, value) in ["upstream", "downstream"].into_iter().zip(values) {
            if let Some(v) = value {
                self.sample(name, &[("half", half)], v);
            }
        }
    }
}

fn fmt_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// Renders every metric of the process, family by family in the order of README.md.
pub fn render(m: &Metrics, p: &ProcessStats) -> String {
    let mut e = Expo(String::with_capacity(16 * 1024));
    wal_and_link_families(&mut e, m);
    codec_time_families(&mut e, m);
    codec_families(&mut e, m);
    session_families(&mut e, m);
    tunnel_families(&mut e, m);
    refusal_families(&mut e, m);
    standby_families(&mut e, &m.ops.standbys.rows());
    spool_and_slot_families(&mut e, m);
    process_families(&mut e, p);
    e.0
}

fn count(a: &AtomicU64) -> f64 {
    a.load(Relaxed) as f64
}

/// The values of a counter kept per half ([upstream, downstream]), for [`Expo::halves`].
fn per_half(a: &[AtomicU64; 2]) -> [Option<f64>; 2] {
    a.each_ref().map(|x| Some(count(x)))
}

/// Tunnels: open now, bytes relayed per direction, messages refused, cancel requests.
fn tunnel_families(e: &mut Expo, m: &Metrics) {
    e.halves(
        "walrelay_tunnels",
        "gauge",
        "Tunnels open now (base backups, logical replication and SQL sessions carried to the primary).",
        per_half(&m.tunnels_active),
    );
    let name = "walrelay_tunnel_bytes_total";
    e.family(
        name,
        "counter",
        "Protocol bytes tunnels relayed (uncompressed), from or to the primary.",
    );
    for (i, half) in ["upstream", "downstream"].into_iter().enumerate() {
        for (dir, c) in [
            ("from_primary", &m.tunnel_bytes_from_primary[i]),
            ("to_primary", &m.tunnel_bytes_to_primary[i]),
        ] {
            e.sample(name, &[("half", half), ("direction", dir)], count(c));
        }
    }
    e.one(
        "walrelay_tunnel_refused_total",
        "counter",
        "Client messages the downstream's tunnel allowlist refused (none reached the primary).",
        count(&m.tunnel_refused),
    );
    let name = "walrelay_tunnel_cancels_total";
    e.family(
        name,
        "counter",
        "Cancel requests the downstream received, by outcome: relayed to the primary, naming no live tunnel, failed on the way.",
    );
    for (result, c) in ["relayed", "no_tunnel", "failed"]
        .into_iter()
        .zip(&m.tunnel_cancels)
    {
        e.sample(name, &[("result", result)], count(c));
    }
}

/// Build info, WAL in and out, the link's bytes and messages.
fn wal_and_link_families(e: &mut Expo, m: &Metrics) {
    e.family(
        "walrelay_build_info",
        "gauge",
        "Always 1; the version is a label.",
    );
    e.sample(
        "walrelay_build_info",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1.0,
    );
    e.one(
        "walrelay_wal_received_bytes_total",
        "counter",
        "WAL bytes received from the primary (XLogData payloads, upstream half).",
        count(&m.wal_bytes_in),
    );
    e.one(
        "walrelay_wal_delivered_bytes_total",
        "counter",
        "WAL bytes verified and spooled by the downstream (downstream half).",
        count(&m.wal_bytes_delivered),
    );
    e.halves(
        "walrelay_link_sent_bytes_total",
        "counter",
        "Bytes written to link sockets (TLS and HTTP/2 framing included).",
        [
            Some(count(&m.link_socket_bytes_out)),
            Some(count(&m.ops.link_socket_bytes_out_downstream)),
        ],
    );
    e.halves(
        "walrelay_link_received_bytes_total",
        "counter",
        "Bytes read from link sockets (TLS and HTTP/2 framing included).",
        [
            Some(count(&m.link_socket_bytes_in)),
            Some(count(&m.ops.link_socket_bytes_in_downstream)),
        ],
    );
    e.halves(
        "walrelay_link_payload_bytes_total",
        "counter",
        "Encoded WAL payload bytes sent (upstream) or received (downstream) on the link, framing excluded.",
        [Some(count(&m.wal_payload_bytes_out)), Some(count(&m.ops.link_payload_bytes_received))],
    );
    e.halves(
        "walrelay_link_messages_sent_total",
        "counter",
        "Link messages (frames) each half sent: upstream WAL and answers, downstream feedback and commands.",
        [
            Some(count(&m.link_messages_out)),
            Some(count(&m.ops.link_messages_out_downstream)),
        ],
    );
}

/// The codec's ratio, its CPU time and how often its extra threads ran.
fn codec_time_families(e: &mut Expo, m: &Metrics) {
    let ratio = |wal: &AtomicU64, link: &AtomicU64| {
        let (wal, link) = (wal.load(Relaxed), link.load(Relaxed));
        (link > 0).then(|| wal as f64 / link as f64)
    };
    e.halves(
        "walrelay_compression_ratio",
        "gauge",
        "WAL bytes / encoded WAL payload bytes since start (upstream: received / sent; downstream: delivered / received); absent before any WAL.",
        [
            ratio(&m.wal_bytes_in, &m.wal_payload_bytes_out),
            ratio(&m.wal_bytes_delivered, &m.ops.link_payload_bytes_received),
        ],
    );
    e.halves(
        "walrelay_codec_cpu_seconds_total",
        "counter",
        "CPU time spent in the link codec (encode at the upstream, decode and verify at the downstream), on the stage's own thread (not its image worker's or section threads').",
        [Some(count(&m.encode_ns) / 1e9), Some(count(&m.decode_ns) / 1e9)],
    );
    e.halves(
        "walrelay_codec_parallel_messages_total",
        "counter",
        "Batches encoded (upstream) and frames restored (downstream) while the stage's queue was full and its thread not short of CPU, with the codec's extra threads allowed.",
        per_half(&m.codec_parallel_messages),
    );
    e.halves(
        "walrelay_codec_staged_messages_total",
        "counter",
        "WAL runs staged one batch ahead while behind: compressed on the codec's section thread while the next was transformed (upstream), sections decompressed while the run before was restored (downstream).",
        per_half(&m.codec_staged_messages),
    );
    e.halves(
        "walrelay_codec_short_of_cpu_messages_total",
        "counter",
        "Batches encoded (upstream) and frames restored (downstream) while the stage's queue was full, on one core because the stage's thread waited for a CPU at least a quarter as long as it ran: a second thread would only have shared its CPU time.",
        per_half(&m.codec_short_of_cpu_messages),
    );
    e.halves(
        "walrelay_codec_fast_messages_total",
        "counter",
        "Batches the upstream encoded with a fast zstd level for its bulk streams while it fell behind the primary on CPU (link.catch_up): more bytes, less lag.",
        [Some(count(&m.codec_fast_messages)), None],
    );
    e.halves(
        "walrelay_codec_fast_spells_total",
        "counter",
        "Times the upstream turned the fast zstd level on (link.catch_up). Each time, and again when it turns it off, the bulk streams start new zstd frames: the history built so far no longer counts for matches.",
        [Some(count(&m.codec_fast_spells)), None],
    );
}

/// What the wal codec did: bytes by kind and by resource manager, images, caches, tuples.
fn codec_families(e: &mut Expo, m: &Metrics) {
    let t = m.ops.codec.snapshot();
    let by_kind = |e: &mut Expo, name: &str, help: &str, get: fn(&InOut) -> u64| {
        e.family(name, "counter", help);
        for (k, v) in KINDS.iter().zip(&t.kinds) {
            e.sample(name, &[("kind", k)], get(v) as f64);
        }
    };
    by_kind(
        e,
        "walrelay_codec_input_bytes_total",
        "WAL bytes given to the wal codec, by kind of bytes.",
        |v| v.bytes_in,
    );
    by_kind(e, "walrelay_codec_output_bytes_total", "Link payload bytes the wal codec produced, by kind of bytes (compressed stream sizes attributed; zeros travel as counts).", |v| v.bytes_out);
    let by_rmgr = |e: &mut Expo, name: &str, help: &str, get: fn(&RmgrBytes) -> u64| {
        e.family(name, "counter", help);
        for (r, v) in t.by_rmgr_name() {
            e.sample(name, &[("rmgr", &r)], get(&v) as f64);
        }
    };
    by_rmgr(
        e,
        "walrelay_codec_rmgr_input_bytes_total",
        "WAL bytes of records encoded by the wal codec, by resource manager.",
        |v| v.bytes_in,
    );
    by_rmgr(
        e,
        "walrelay_codec_rmgr_output_bytes_total",
        "Link payload bytes attributed to records of each resource manager.",
        |v| v.bytes_out,
    );
    by_rmgr(
        e,
        "walrelay_codec_rmgr_records_total",
        "WAL records encoded by the wal codec, by resource manager.",
        |v| v.records,
    );
    let ones: [(&str, &str, &str, f64); 9] = [
        ("walrelay_codec_records_total", "counter", "WAL records encoded field by field by the wal codec.", t.records as f64),
        ("walrelay_codec_fpis_total", "counter", "Full-page images sent as page frames through the block cache.", t.fpis as f64),
        ("walrelay_codec_fpi_cache_hits_total", "counter", "Full-page images whose block was in the block cache (hit rate = hits / fpis).", t.fpi_cache_hits as f64),
        ("walrelay_block_cache_bytes", "gauge", "Block and tuple cache memory in use by the upstream's live sessions (the downstream mirrors it).", m.ops.codec.cache_bytes() as f64),
        ("walrelay_codec_tuple_deltas_total", "counter", "Heap tuples sent as a delta against a version both ends hold (tuple cache or cached page).", t.tuple_deltas as f64),
        ("walrelay_codec_tuple_delta_saved_bytes_total", "counter", "Tuple bytes the deltas left out (taken from the reference at the downstream).", t.tuple_delta_saved as f64),
        ("walrelay_codec_tuple_misses_total", "counter", "Heap tuples that could have gone as a delta but had no reference saving enough (hit rate = deltas / (deltas + misses)).", t.tuple_misses as f64),
        ("walrelay_codec_records_cut_total", "counter", "WAL records a link message's end cut: passed raw, in two pieces.", t.records_cut as f64),
        ("walrelay_codec_records_held_total", "counter", "WAL records a link message's end would have cut, held back to go whole in the next message.", t.records_held as f64),
    ];
    for (name, kind, help, value) in ones {
        e.one(name, kind, help, value);
    }
}

/// Integrity failures, sessions per half, refused standbys.
fn session_families(e: &mut Expo, m: &Metrics) {
    e.one(
        "walrelay_integrity_failures_total",
        "counter",
        "WAL messages that failed verification at the downstream (none of their bytes reached a standby).",
        count(&m.integrity_failures),
    );
    e.halves(
        "walrelay_sessions",
        "gauge",
        "Connected now (downstream: standby and tunnelled client sessions; upstream: link streams, one per downstream).",
        [Some(count(&m.sessions_active_upstream)), Some(count(&m.sessions_active_downstream))],
    );
    e.halves(
        "walrelay_sessions_started_total",
        "counter",
        "Downstream: standby sessions served from the spool opened; upstream: link streams opened.",
        [
            Some(count(&m.sessions_total)),
            Some(count(&m.ops.sessions_started_downstream)),
        ],
    );
    e.halves(
        "walrelay_sessions_failed_total",
        "counter",
        "Downstream: link streams lost (the stream reconnects, standbys are not cut) and standby sessions ended by an error; upstream: link streams ended by an error, and link streams and tunnels refused before they started.",
        [Some(count(&m.ops.sessions_failed_upstream)), Some(count(&m.ops.sessions_failed_downstream))],
    );
    e.one(
        "walrelay_auth_failures_total",
        "counter",
        "Standby authentication failures at the downstream.",
        count(&m.auth_failures),
    );
    e.one(
        "walrelay_protocol_errors_total",
        "counter",
        "Standby connections refused for protocol errors at the downstream.",
        count(&m.protocol_errors),
    );
}

/// Connections refused or cut before a session: the standby listener's pre-authentication
/// budget and the link listener's handshakes.
fn refusal_families(e: &mut Expo, m: &Metrics) {
    let r = &m.refusals;
    let name = "walrelay_connections_refused_total";
    e.family(name, "counter", "Standby connections refused or cut before a session, by reason (max_startups, max_startups_per_address, max_sessions, startup_timeout, tls_handshake).");
    for (reason, c) in [
        ("max_startups", &r.max_startups),
        ("max_startups_per_address", &r.max_startups_per_address),
        ("max_sessions", &r.max_sessions),
        ("startup_timeout", &r.startup_timeout),
        ("tls_handshake", &r.tls_handshake),
    ] {
        e.sample(name, &[("reason", reason)], count(c));
    }
    e.one(
        "walrelay_standby_positions_clamped_total",
        "counter",
        "Standby status updates claiming WAL beyond what the downstream sent that standby, lowered to what it sent before going to the primary.",
        count(&m.positions_clamped),
    );
    let name = "walrelay_link_handshake_failures_total";
    e.family(name, "counter", "Link connections that did not complete their TLS handshake, by reason (timeout, tls, peer_name, busy).");
    for (reason, c) in [
        ("timeout", &r.link_handshake_timeout),
        ("tls", &r.link_handshake_tls),
        ("peer_name", &r.link_handshake_peer_name),
        ("busy", &r.link_handshake_busy),
    ] {
        e.sample(name, &[("reason", reason)], count(c));
    }
}

/// The downstream's spool and the upstream's slots on the primary.
fn spool_and_slot_families(e: &mut Expo, m: &Metrics) {
    let s = &m.ops.spool;
    if count(&s.capacity) > 0.0 {
        let ones: [(&str, &str, f64); 4] = [
            ("walrelay_spool_bytes", "WAL bytes the spool holds (its end minus its start).", (count(&s.end) - count(&s.start)).max(0.0)),
            ("walrelay_spool_capacity_bytes", "downstream.spool_bytes: beyond it the oldest segments go.", count(&s.capacity)),
            ("walrelay_spool_end_lsn_bytes", "End of the WAL in the spool (what standbys can get), as a byte position.", count(&s.end)),
            ("walrelay_spool_durable_lsn_bytes", "End of the WAL fsynced in the spool (where the primary's slot may advance to), as a byte position.", count(&s.durable)),
        ];
        for (name, help, v) in ones {
            e.one(name, "gauge", help, v);
        }
        let failed = f64::from(u8::from(s.failure().is_some()));
        e.one("walrelay_spool_failed", "gauge", "1 while the spool is failed (a write or fsync failed): it takes no WAL until it is opened again, which walrelay tries by itself every few seconds (GET /healthz answers 503 with the reason meanwhile).", failed);
        let io: [(&str, &str, f64); 4] = [
            ("walrelay_spool_write_seconds_total", "Time the downstream spent appending WAL to the spool (standbys get WAL once it is appended).", count(&s.write_ns) / 1e9),
            ("walrelay_spool_sync_seconds_total", "Time the spool's sync thread spent making WAL durable: the periodic fsync (at most every 100 ms while WAL arrives), each filled segment's fsync and rename, the state file (nobody waits for it but the primary's slot).", count(&s.sync_ns) / 1e9),
            ("walrelay_spool_syncs_total", "The spool's periodic fsyncs.", count(&s.syncs)),
            ("walrelay_spool_segments_reused_total", "Segments the spool wrote over a file its retention kept (as PostgreSQL recycles pg_wal segments) instead of a new file.", count(&s.reused)),
        ];
        for (name, help, v) in io {
            e.one(name, "counter", help, v);
        }
    }
    let slots = m
        .ops
        .slots
        .lock()
        .unwrap_or_else(|x| x.into_inner())
        .clone();
    if !slots.is_empty() {
        let name = "walrelay_slot_retained_bytes";
        e.family(name, "gauge", "WAL the stream's slot holds back on the primary: the primary's end minus what the downstream's spool has made durable (as last seen: while the link is down the slot keeps holding WAL).");
        for (slot, st) in &slots {
            let v = st.primary_end.saturating_sub(st.confirmed) as f64;
            e.sample(name, &[("slot", slot)], v);
        }
    }
}

/// The process's CPU, memory and start time, under the names Prometheus clients use.
fn process_families(e: &mut Expo, p: &ProcessStats) {
    e.one(
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time spent in seconds.",
        p.cpu_seconds,
    );
    e.one(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        p.resident_bytes as f64,
    );
    if let Some(s) = p.start_time_seconds {
        e.one(
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            s,
        );
    }
}

/// The per-standby gauges. Two sessions with the same labels (same half, application_name and
/// slot) would be one series: only the first of them (by registration order) is exported.
fn standby_families(e: &mut Expo, rows: &[StandbyRow]) {
    let mut seen = std::collections::BTreeSet::new();
    let rows: Vec<&StandbyRow> = rows
        .iter()
        .filter(|r| seen.insert((&r.half, &r.application_name, &r.slot)))
        .collect();
    type Get = fn(&StandbyRow) -> Option<f64>;
    let families: [(&str, &str, Get); 7] = [
        ("walrelay_standby_primary_lsn_bytes", "The primary's WAL end as last stated to this half (walEnd of XLogData and keepalives), as a byte position.", |r| Some(r.primary_lsn as f64)),
        ("walrelay_standby_sent_lsn_bytes", "End of the WAL this half passed on toward the standby, as a byte position.", |r| Some(r.sent_lsn as f64)),
        ("walrelay_standby_write_lsn_bytes", "Write position in the standby's latest status update, as a byte position.", |r| r.write_lsn.map(|v| v as f64)),
        ("walrelay_standby_flush_lsn_bytes", "Flush position in the standby's latest status update, as a byte position.", |r| r.flush_lsn.map(|v| v as f64)),
        ("walrelay_standby_replay_lsn_bytes", "Replay position in the standby's latest status update, as a byte position.", |r| r.replay_lsn.map(|v| v as f64)),
        ("walrelay_standby_lag_bytes", "Bytes of WAL between the primary's end and the standby's replay position.", |r| r.lag_bytes.map(|v| v as f64)),
        ("walrelay_standby_lag_seconds", "Seconds since this half received the oldest WAL the standby has not replayed yet (0 when caught up).", |r| r.lag_seconds),
    ];
    for (name, help, get) in families {
        e.family(name, "gauge", help);
        for r in &rows {
            if let Some(v) = get(r) {
                let slot = r.slot.as_deref().unwrap_or("");
                let labels = [
                    ("half", r.half.as_str()),
                    ("application_name", r.application_name.as_str()),
                    ("slot", slot),
                ];
                e.sample(name, &labels, v);
            }
        }
    }
}

#[cfg(test)]
mod tests;
