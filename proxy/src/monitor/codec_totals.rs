//! The WAL-aware codec's statistics summed over every session of the process.
//!
//! Each encoder keeps its own [`CodecStats`]; after every message the session's
//! [`SessionCodecStats`] adds what changed since the previous message to the process totals,
//! so the totals keep counting after a session ends. The cache gauge is the sum of the live
//! encoders' block and tuple caches (a session takes its share back when it ends).
//!
//! Only the `wal` codec has these statistics; with `zstd` or `none` they stay at zero.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use walrelay_wal::linkcodec::WalEncoder;
use walrelay_wal::walcodec::rmgr::{rmgr_name, RmgrBytes};
use walrelay_wal::walcodec::CodecStats;

/// The `kind` label values, in the order of [`Totals::kinds`].
pub const KINDS: [&str; 6] = [
    "fpi",
    "record_header",
    "data",
    "page_header",
    "raw",
    "zeros",
];

/// Raw WAL bytes in and link bytes out for one kind (see [`CodecStats`] for what they cover).
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct InOut {
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// Process totals.
#[derive(Debug, Default, Clone)]
pub struct Totals {
    /// By kind, in [`KINDS`] order. Zero padding is sent as a count: its `bytes_out` stays 0.
    pub kinds: [InOut; 6],
    pub records: u64,
    /// Images sent as page frames through the block cache, and of those, cache hits.
    pub fpis: u64,
    pub fpi_cache_hits: u64,
    /// Per resource manager id (only ids seen so far).
    pub rmgr: std::collections::BTreeMap<u8, RmgrBytes>,
    /// Heap tuples sent as deltas, the bytes that saved, and tuples that had no reference.
    pub tuple_deltas: u64,
    pub tuple_delta_saved: u64,
    pub tuple_misses: u64,
    /// Records a link message's end cut (passed raw), and records held back for the next
    /// message instead (`walcodec::Encoder::encode_held`).
    pub records_cut: u64,
    pub records_held: u64,
}

impl Totals {
    /// `(rmgr name, totals)`, by id: one name per id, so that each is its own series. A
    /// custom resource manager (ids 128..=255, whose names only its extension knows) is
    /// `custom<id>`, as `pg_waldump --stats` names one it has not loaded (`custom128`); an id
    /// PostgreSQL does not use, `unknown<id>`.
    pub fn by_rmgr_name(&self) -> impl Iterator<Item = (Cow<'static, str>, RmgrBytes)> + '_ {
        self.rmgr.iter().map(|(&id, t)| {
            let name = match rmgr_name(id) {
                n @ ("custom" | "unknown") => Cow::Owned(format!("{n}{id:03}")),
                n => Cow::Borrowed(n),
            };
            (name, *t)
        })
    }
}

/// The process-wide sums.
#[derive(Debug, Default)]
pub struct CodecTotals {
    totals: Mutex<Totals>,
    cache_bytes: Arc<AtomicU64>,
}

impl CodecTotals {
    pub fn snapshot(&self) -> Totals {
        self.totals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Block cache memory of the live encoders (upstream), bytes.
    pub fn cache_bytes(&self) -> u64 {
        self.cache_bytes.load(Relaxed)
    }

    /// A tracker for one session's encoder.
    pub fn session(&self) -> SessionCodecStats {
        SessionCodecStats {
            prev: CodecStats::default(),
            cache_bytes: 0,
            gauge: self.cache_bytes.clone(),
        }
    }

    fn add(&self, prev: &CodecStats, cur: &CodecStats) {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let mut t = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        let pairs = [
            (cur.fpi_in, prev.fpi_in, cur.fpi_out, prev.fpi_out),
            (
                cur.record_header_in,
                prev.record_header_in,
                cur.record_header_out,
                prev.record_header_out,
            ),
            (cur.data_in, prev.data_in, cur.data_out, prev.data_out),
            (
                cur.page_header_in,
                prev.page_header_in,
                cur.page_header_out,
                prev.page_header_out,
            ),
            (cur.raw_in, prev.raw_in, cur.raw_out, prev.raw_out),
            (cur.zeros_in, prev.zeros_in, 0, 0),
        ];
        for (k, (ci, pi, co, po)) in t.kinds.iter_mut().zip(pairs) {
            k.bytes_in += d(ci, pi);
            k.bytes_out += d(co, po);
        }
        t.records += d(cur.records, prev.records);
        t.fpis += d(cur.fpis, prev.fpis);
        t.fpi_cache_hits += d(cur.fpi_cache_hits, prev.fpi_cache_hits);
        t.tuple_deltas += d(cur.tuple_deltas, prev.tuple_deltas);
        t.tuple_delta_saved += d(cur.tuple_delta_saved, prev.tuple_delta_saved);
        t.tuple_misses += d(cur.tuple_misses, prev.tuple_misses);
        t.records_cut += d(cur.records_split, prev.records_split);
        t.records_held += d(cur.records_held, prev.records_held);
        for (id, now) in cur.by_rmgr.iter() {
            let was = prev.by_rmgr.get(id);
            let e = t.rmgr.entry(id).or_default();
            e.records += d(now.records, was.records);
            e.bytes_in += d(now.bytes_in, was.bytes_in);
            e.bytes_out += d(now.bytes_out, was.bytes_out);
        }
    }
}

/// One session's contribution; gives its block cache share back when dropped.
#[derive(Debug)]
pub struct SessionCodecStats {
    prev: CodecStats,
    cache_bytes: u64,
    gauge: Arc<AtomicU64>,
}

impl SessionCodecStats {
    /// Adds what `encoder` counted since the last call to `totals`.
    pub fn observe(&mut self, encoder: &WalEncoder, totals: &CodecTotals) {
        let Some(e) = encoder.wal() else { return };
        let cur = e.stats();
        if cur.messages != self.prev.messages {
            totals.add(&self.prev, cur);
            self.prev.clone_from(cur);
        }
        let cache = (e.cache_bytes() + e.tuple_cache_bytes()) as u64;
        if cache != self.cache_bytes {
            self.gauge
                .fetch_add(cache.wrapping_sub(self.cache_bytes), Relaxed);
            self.cache_bytes = cache;
        }
    }
}

impl Drop for SessionCodecStats {
    fn drop(&mut self) {
        self.gauge.fetch_sub(self.cache_bytes, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use walrelay_wal::lsn::Lsn;

    /// Two custom resource managers were both `rmgr="custom"`: two series of one name and
    /// labels in one exposition, of which Prometheus keeps one and drops the other.
    #[test]
    fn each_resource_manager_id_has_its_own_name() {
        let mut t = Totals::default();
        for id in [10, 11, 22, 128, 129, 200] {
            t.rmgr.insert(id, RmgrBytes::default());
        }
        let names: Vec<String> = t.by_rmgr_name().map(|(n, _)| n.into_owned()).collect();
        assert_eq!(
            names,
            [
                "Heap",
                "Btree",
                "unknown022",
                "custom128",
                "custom129",
                "custom200"
            ]
        );
    }

    /// Two sessions' deltas add up, and stay counted after a session ends.
    #[test]
    fn totals_survive_sessions() {
        let setup = crate::testwal::wal_setup();
        let totals = CodecTotals::default();
        let mut out = Vec::new();
        for _ in 0..2 {
            let mut enc = WalEncoder::new(&setup).unwrap();
            let mut s = totals.session();
            // Not WAL the codec can lock on: it passes raw, and is counted as raw.
            enc.encode(Lsn(0x100_0000), &[7u8; 1000], &mut out).unwrap();
            s.observe(&enc, &totals);
            enc.encode(Lsn(0x100_0000 + 1000), &[7u8; 500], &mut out)
                .unwrap();
            s.observe(&enc, &totals);
        }
        let t = totals.snapshot();
        // Every byte is counted under some kind (here: the segment's page header, then raw).
        assert_eq!(t.kinds.iter().map(|k| k.bytes_in).sum::<u64>(), 3000);
        let raw = t.kinds[KINDS.iter().position(|k| *k == "raw").unwrap()];
        assert!(raw.bytes_in > 2800 && raw.bytes_out > 0, "{raw:?}");
        assert_eq!(totals.cache_bytes(), 0);
    }
}
