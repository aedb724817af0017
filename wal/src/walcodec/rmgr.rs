//! Bytes in and out per resource manager (the `xl_rmid` of a record), for metrics and the bench.
//!
//! Bytes in are the record's physical WAL bytes (page headers it crosses and its alignment
//! padding included). Bytes out are an attribution: the streams are compressed per message, not
//! per record, so each record is charged its share of every stream it wrote to
//! (`uncompressed bytes it wrote × compressed size / uncompressed size` of that stream in that
//! message) plus its page frames exactly. Bytes outside encoded records (raw passes, page headers
//! between records, padding) are not attributed to any resource manager; see the by-kind
//! counters of [`super::CodecStats`].

use super::STREAMS;

/// Resource manager names, by id, as `pg_waldump --stats` prints them (the same ids in
/// PostgreSQL 14–18; 22..127 are unused, 128..255 are custom resource managers).
const NAMES: [&str; 22] = [
    "XLOG",
    "Transaction",
    "Storage",
    "CLOG",
    "Database",
    "Tablespace",
    "MultiXact",
    "RelMap",
    "Standby",
    "Heap2",
    "Heap",
    "Btree",
    "Hash",
    "Gin",
    "Gist",
    "Sequence",
    "SPGist",
    "BRIN",
    "CommitTs",
    "ReplicationOrigin",
    "Generic",
    "LogicalMessage",
];

/// The name of resource manager `rmid` ("custom" for 128..=255, "unknown" otherwise).
pub fn rmgr_name(rmid: u8) -> &'static str {
    match NAMES.get(usize::from(rmid)) {
        Some(n) => n,
        None if rmid >= 128 => "custom",
        None => "unknown",
    }
}

/// Totals per resource manager over the life of an encoder.
#[derive(Clone, Default)]
pub struct RmgrTotals {
    /// Indexed by rmid; empty until the first record.
    totals: Vec<RmgrBytes>,
}

impl std::fmt::Debug for RmgrTotals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.iter().map(|(id, t)| (rmgr_name(id), t)))
            .finish()
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RmgrBytes {
    pub records: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

impl RmgrTotals {
    /// The totals of resource manager `rmid` (zero if none seen).
    pub fn get(&self, rmid: u8) -> RmgrBytes {
        self.totals
            .get(usize::from(rmid))
            .copied()
            .unwrap_or_default()
    }

    /// `(rmid, totals)` of every resource manager seen so far, by id.
    pub fn iter(&self) -> impl Iterator<Item = (u8, RmgrBytes)> + '_ {
        self.totals
            .iter()
            .enumerate()
            .filter(|(_, t)| t.records > 0)
            .map(|(id, t)| (id as u8, *t))
    }
}

/// One message's tally, folded into [`RmgrTotals`] once the streams' sizes are known.
#[derive(Debug)]
pub(crate) struct RmgrTally {
    /// Per rmid: bytes written into each stream this message, then page-frame bytes.
    msg: Vec<[u64; STREAMS + 1]>,
    touched: Vec<u8>,
}

impl Default for RmgrTally {
    fn default() -> Self {
        RmgrTally {
            msg: vec![[0; STREAMS + 1]; 256],
            touched: Vec::new(),
        }
    }
}

/// Lengths of the streams' input buffers and of the page frames at some point of a message.
pub(crate) type Marks = [usize; STREAMS + 1];

impl RmgrTally {
    /// Charges `rmid` with what was written between `before` and `after`, and `bytes_in`.
    pub fn charge(
        &mut self,
        totals: &mut RmgrTotals,
        rmid: u8,
        bytes_in: u64,
        before: &Marks,
        after: &Marks,
    ) {
        if totals.totals.is_empty() {
            totals.totals = vec![RmgrBytes::default(); 256];
        }
        let t = &mut totals.totals[usize::from(rmid)];
        t.records += 1;
        t.bytes_in += bytes_in;
        let m = &mut self.msg[usize::from(rmid)];
        if m.iter().all(|&x| x == 0) {
            self.touched.push(rmid);
        }
        for (acc, (a, b)) in m.iter_mut().zip(after.iter().zip(before)) {
            *acc += a.saturating_sub(*b) as u64;
        }
    }

    /// Ends the message: its rows move to `into` (emptied first), to be settled once the
    /// streams are compressed.
    pub fn end(&mut self, into: &mut MsgTally) {
        into.rows.clear();
        for rmid in self.touched.drain(..) {
            let m = &mut self.msg[usize::from(rmid)];
            into.rows.push((rmid, *m));
            *m = [0; STREAMS + 1];
        }
    }
}

/// One ended message's bytes per resource manager (see [`RmgrTally::end`]).
#[derive(Debug, Default)]
pub(crate) struct MsgTally {
    rows: Vec<(u8, [u64; STREAMS + 1])>,
}

impl MsgTally {
    /// Adds the message's bytes out to `totals`: `ulen`/`clen` are each stream's input and
    /// compressed sizes.
    pub fn settle(&mut self, totals: &mut RmgrTotals, ulen: &[usize], clen: &[usize]) {
        for (rmid, m) in self.rows.drain(..) {
            let mut out = m[STREAMS];
            for s in 0..STREAMS {
                if ulen[s] > 0 {
                    out += (u128::from(m[s]) * clen[s] as u128 / ulen[s] as u128) as u64;
                }
            }
            totals.totals[usize::from(rmid)].bytes_out += out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(rmgr_name(10), "Heap");
        assert_eq!(rmgr_name(21), "LogicalMessage");
        assert_eq!(rmgr_name(22), "unknown");
        assert_eq!(rmgr_name(200), "custom");
    }

    #[test]
    fn attribution_is_proportional_and_frames_exact() {
        let mut totals = RmgrTotals::default();
        let mut t = RmgrTally::default();
        let z = [0usize; STREAMS + 1];
        let mut a = z;
        a[0] = 30; // 30 bytes of stream 0
        a[STREAMS] = 100; // 100 bytes of page frames
        t.charge(&mut totals, 10, 8000, &z, &a);
        let mut b = a;
        b[0] = 40; // 10 more bytes of stream 0
        t.charge(&mut totals, 11, 50, &a, &b);
        let mut ulen = [0usize; STREAMS];
        let mut clen = [0usize; STREAMS];
        ulen[0] = 40;
        clen[0] = 20;
        let mut m = MsgTally::default();
        t.end(&mut m);
        m.settle(&mut totals, &ulen, &clen);
        let got: Vec<_> = totals.iter().collect();
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[0],
            (
                10,
                RmgrBytes {
                    records: 1,
                    bytes_in: 8000,
                    bytes_out: 115
                }
            )
        );
        assert_eq!(
            got[1],
            (
                11,
                RmgrBytes {
                    records: 1,
                    bytes_in: 50,
                    bytes_out: 5
                }
            )
        );
        // The next message starts from zero.
        t.charge(&mut totals, 10, 10, &z, &z);
        t.end(&mut m);
        m.settle(&mut totals, &ulen, &clen);
        assert_eq!(totals.iter().next().unwrap().1.bytes_out, 115);
    }
}
