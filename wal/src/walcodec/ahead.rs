//! Prefetching the caches' memory for the records a few places ahead of the encoder's walk.
//!
//! Replaying a record touches memory that is seldom in the CPU's caches: the block cache's
//! page of each block the record references (a prune reads the page header, then moves half
//! the page), and the tuple cache's index slot and ring record of each heap tuple it reads
//! or writes. Each is a miss the walk waits for, one after another. [`Ahead`] scans the
//! message's records ahead of the walk, [`CHUNK`] at a time (their block references and
//! heap TIDs), asks for the tuple index's slots, then looks up where their pages and ring
//! records are in one loop of lookups that do not depend on each other, so that the CPU
//! overlaps their misses; as the walk reaches a record it asks for the lines of the record
//! [`DISTANCE`] places ahead. On recorded pgbench WAL the encoder spends 5–9 % less CPU
//! (`docs/keeping-up.md`, fifty-fifth round). The decoder learns a record's blocks only as
//! it restores it: asking for them then measured slower, not faster.
//!
//! Prefetches are hints: what they ask for changes no byte of the output. An address looked
//! up ahead may be stale by the time it is asked for (the page evicted, the tuple put again);
//! the line asked for is then only useless, never wrong. A scan that loses its way (a
//! length it cannot follow) stops; it starts again at the next record start the walk
//! reaches that it has not scanned, so it reads each message at most once over. Where the
//! caches hold little of what a chunk looked up (a bulk load's inserts into new pages), the
//! scan pauses for a while ([`worth_it`]).

use super::cache::EncCache;
use super::prefetch::prefetch;
use super::tuples::{HeapRec, Tid, TupleCache};
use super::wal::{le16, le32, parse_area, phd_len, Area, BlockKey, REC_HDR, WAL_PAGE};

/// Records scanned at a time: bounds the hints held (about 150 bytes each) whatever the
/// message's size.
const CHUNK: usize = 256;
/// How many records ahead of the walk the lines are asked for.
const DISTANCE: usize = 16;
/// Cache lines of a page asked for: the header and the first 58 line pointers.
const PAGE_LINES: usize = 4;
/// Most records the scan pauses for when chunks find too little in the caches.
const PAUSE: usize = 4096;
/// Lookups a chunk must make before its findings decide anything.
const MIN_ASKED: usize = 64;

/// Pages and ring records remembered per record (heap records reference at most two blocks).
const MAX_KEYS: usize = 2;

/// Asks for the first lines of the page at `addr` (0: none): its header and first line
/// pointers.
#[inline(always)]
fn prefetch_page(addr: usize) {
    if addr != 0 {
        for line in 0..PAGE_LINES {
            prefetch(addr + line * 64);
        }
    }
}

/// What the scan knew of the record the walk reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    /// Scanned ahead: its lines were asked for.
    Scanned,
    /// Not scanned: the scan is paused ([`worth_it`]).
    Paused,
    /// Not scanned: the scan lost its way before it.
    Missed,
}

/// Where one record's memory is.
#[derive(Clone, Copy, Default)]
struct Hint {
    /// The record's offset in the message.
    at: usize,
    /// Its first blocks, and where their cached pages are (0: none).
    blocks: [Option<BlockKey>; MAX_KEYS],
    pages: [usize; MAX_KEYS],
    /// A heap record's TIDs (the new tuple's, the old one's), and where their ring records
    /// are (0: none).
    tids: [Option<Tid>; MAX_KEYS],
    tuples: [usize; MAX_KEYS],
}

/// The message's records, scanned ahead of the walk.
#[derive(Default)]
pub(super) struct Ahead {
    hints: Vec<Hint>,
    /// The first hint not behind the walk.
    next: usize,
    /// Where the scan goes on: offset in the message and WAL position, a record start or a
    /// page boundary; `None` before the message's first record and after the scan stopped
    /// (the message's end, or something it does not understand).
    cursor: Option<(usize, u64)>,
    /// Records to let pass before scanning again: the caches held too little of what the
    /// last chunk looked up (see [`worth_it`]). Kept from message to message.
    paused: usize,
    /// The last pause's length (0: the last chunk found enough).
    pause: usize,
    area: Area,
}

impl Ahead {
    /// Forgets the last message's records.
    pub(super) fn clear(&mut self) {
        self.hints.clear();
        self.next = 0;
        self.cursor = None;
    }

    /// The walk is at the record at offset `at` of `raw` (WAL position `pos`): scans ahead
    /// when needed and asks for the memory of the record [`DISTANCE`] places ahead. Returns
    /// whether the scan had found this record (it keeps step with the walk) or paused.
    pub(super) fn at(&mut self, raw: &[u8], at: usize, pos: u64, caches: Caches) -> Seen {
        if self.paused > 0 {
            self.paused -= 1;
            return Seen::Paused;
        }
        while self.hints.get(self.next).is_some_and(|h| h.at < at) {
            self.next += 1;
        }
        // The message's first record, or the scan stopped (or fell behind) before this one:
        // (re)start it here. Each scan covers records past the last, so the scans of a
        // message read it at most once over.
        if self.next == self.hints.len() && self.cursor.is_none_or(|(o, _)| o < at) {
            self.cursor = Some((at, pos));
        }
        if self.next + DISTANCE >= self.hints.len() && self.cursor.is_some() {
            self.hints.drain(..self.next);
            self.next = 0;
            let from = self.hints.len();
            self.scan(raw, caches.compressed_mask);
            match worth_it(resolve(&mut self.hints[from..], caches)) {
                Some(true) => self.pause = 0,
                Some(false) => {
                    // Twice as long each time in a row, from a chunk's length to PAUSE.
                    self.pause = (2 * self.pause).clamp(CHUNK, PAUSE);
                    self.paused = self.pause;
                    self.clear();
                    return Seen::Paused;
                }
                None => {}
            }
        }
        if let Some(h) = self.hints.get(self.next + DISTANCE) {
            for &a in &h.pages {
                prefetch_page(a);
            }
            for &a in &h.tuples {
                prefetch(a);
            }
        }
        if self.hints.get(self.next).is_some_and(|h| h.at == at) {
            Seen::Scanned
        } else {
            Seen::Missed
        }
    }

    /// Scans up to [`CHUNK`] records from the cursor, to the message's end or the first
    /// thing that is not a record: a hint for each record start, with the keys of each
    /// record that lies whole in one page of the message.
    fn scan(&mut self, raw: &[u8], compressed_mask: u8) {
        let Some((mut o, mut pos)) = self.cursor.take() else {
            return;
        };
        for _ in 0..CHUNK {
            if pos % WAL_PAGE == 0 {
                // A page header between records: nothing of a record continues here.
                let (Some(info), Some(0)) = (le16(raw, o + 2), le32(raw, o + 16)) else {
                    return;
                };
                let hl = phd_len(info);
                o += hl;
                pos += hl as u64;
            }
            if o >= raw.len() {
                return;
            }
            let mut h = Hint {
                at: o,
                ..Hint::default()
            };
            let tot = le32(raw, o).map(|t| t as usize).filter(|&t| t >= REC_HDR);
            let span = match tot {
                Some(tot) if tot as u64 <= WAL_PAGE - pos % WAL_PAGE => {
                    if let Some(rec) = raw.get(o..o + tot) {
                        self.keys(&mut h, rec, compressed_mask);
                    }
                    Some(tot)
                }
                Some(tot) => crossing_span(raw, o, pos, tot),
                None => None,
            };
            self.hints.push(h);
            let Some(span) = span else { return };
            let pad = (8 - (pos + span as u64) % 8) % 8;
            o += span + pad as usize;
            pos += span as u64 + pad;
        }
        self.cursor = Some((o, pos));
    }

    /// The blocks and heap TIDs of the record `rec` (whole) into `h`.
    fn keys(&mut self, h: &mut Hint, rec: &[u8], compressed_mask: u8) {
        let body = &rec[REC_HDR..];
        if parse_area(body, Some(body.len()), compressed_mask, &mut self.area).is_err() {
            return;
        }
        for (k, b) in h.blocks.iter_mut().zip(&self.area.blocks) {
            *k = Some(b.key);
        }
        let main = &rec[rec.len() - self.area.main_len as usize..];
        if let Some(heap) = HeapRec::parse(rec[17], rec[16], &self.area.blocks, main) {
            h.tids = heap.tids();
        }
    }
}

/// What the scan looks addresses up in.
#[derive(Clone, Copy)]
pub(super) struct Caches<'a> {
    pub pages: &'a EncCache,
    pub tuples: &'a TupleCache,
    /// `bimg_compressed_mask` of the primary's major, for parsing block headers.
    pub compressed_mask: u8,
}

/// Bytes a record of `tot` bytes at offset `o` (WAL position `pos`) spans in the message
/// when it crosses a page boundary: its bytes and the page headers between them.
fn crossing_span(raw: &[u8], o: usize, mut pos: u64, tot: usize) -> Option<usize> {
    let (mut j, mut left) = (o, tot);
    loop {
        let take = left.min((WAL_PAGE - pos % WAL_PAGE) as usize);
        j += take;
        pos += take as u64;
        left -= take;
        if left == 0 {
            return Some(j - o);
        }
        let hl = phd_len(le16(raw, j + 2)?);
        j += hl;
        pos += hl as u64;
    }
}

/// Looks up where the scanned records' pages and ring records are: first asks for the tuple
/// index's slots the lookups start at, then looks everything up in a loop of independent
/// lookups. Returns the lookups made and how many found something.
fn resolve(hints: &mut [Hint], caches: Caches) -> (usize, usize) {
    for h in hints.iter() {
        for k in h.blocks.iter().flatten() {
            prefetch(caches.pages.map_addr(k));
        }
        for t in h.tids.iter().flatten() {
            prefetch(caches.tuples.slot_addr(t));
        }
    }
    let (mut asked, mut found) = (0, 0);
    for h in hints.iter_mut() {
        for (a, k) in h.pages.iter_mut().zip(&h.blocks) {
            *a = k.as_ref().map_or(0, |k| caches.pages.page_addr(k));
        }
        for (a, t) in h.tuples.iter_mut().zip(&h.tids) {
            *a = t.as_ref().map_or(0, |t| caches.tuples.record_addr(t));
        }
        asked += h.blocks.iter().flatten().count() + h.tids.iter().flatten().count();
        found += h.pages.iter().chain(&h.tuples).filter(|&&a| a != 0).count();
    }
    (asked, found)
}

/// Whether a chunk's lookups found enough to go on scanning: a quarter (`None`: too few
/// lookups to tell). A bulk load's inserts go to pages the block cache does not hold and
/// tuples it does not keep: scanning them cost the encoder 13 % more CPU for nothing on
/// recorded bulk WAL.
fn worth_it((asked, found): (usize, usize)) -> Option<bool> {
    (asked >= MIN_ASKED).then_some(found * 4 >= asked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lsn::Lsn;
    use crate::pg::PgMajor;
    use crate::walcodec::testgen::WalGen;
    use crate::walcodec::tests::{every, insert_row, params, round_trip, synthetic, SEG};
    use crate::walcodec::Encoder;

    /// Every record start the walk reaches was scanned ahead, however the stream is cut
    /// (records split by messages, headers split by pages, an XLOG_SWITCH and the zeros after
    /// it): a scan that lost its way would leave the walk's records without their lines.
    #[test]
    fn the_scan_keeps_step_with_the_walk() {
        let g = synthetic(7, 700_000, 40);
        assert!(g.split_headers > 0);
        for n in [900, 8192 + 13, 64 * 1024, 1 << 20] {
            let (st, _) = round_trip(&params(4096), g.start, &g.buf, &every(n, g.buf.len()));
            let visited = st.records + st.records_raw + st.records_split;
            assert!(st.records > 400 && st.records_ahead > 200, "{st:?}");
            assert_eq!(
                st.records_ahead + st.records_ahead_paused,
                visited,
                "messages of {n} bytes: {st:?}"
            );
        }
    }

    /// Where the caches hold nothing of what the records touch (inserts into pages never
    /// imaged, with no cache at all), the scan pauses after each chunk: the walk reaches
    /// every record unscanned (and still in step: a paused scan starts again where the
    /// walk is).
    #[test]
    fn the_scan_pauses_where_it_finds_nothing() {
        let mut g = WalGen::new(PgMajor::V15, SEG, 3 * SEG, 9);
        for i in 0..30_000u32 {
            insert_row(&mut g, 16_400, i / 40, &[7u8; 60]);
        }
        let (st, _) = round_trip(&params(0), g.start, &g.buf, &every(1 << 20, g.buf.len()));
        let visited = st.records + st.records_raw + st.records_split;
        assert_eq!(
            st.records_ahead + st.records_ahead_paused,
            visited,
            "{st:?}"
        );
        // Every chunk found nothing: its records count as paused too.
        assert_eq!(st.records_ahead, 0, "{st:?}");
    }

    #[test]
    fn a_chunk_goes_on_when_a_quarter_of_its_lookups_find_something() {
        assert_eq!(worth_it((MIN_ASKED - 1, 0)), None);
        assert_eq!(worth_it((100, 25)), Some(true));
        assert_eq!(worth_it((100, 24)), Some(false));
    }

    /// The scan finds the cached pages and ring records of the records ahead: tuples at the
    /// TIDs the heap records name, each address the start of that TID's ring record.
    #[test]
    fn the_scan_finds_cached_pages_and_tuples() {
        let mut g = WalGen::new(PgMajor::V15, SEG, 3 * SEG, 8);
        while g.buf.len() < 200_000 {
            g.random_record(12);
        }
        // A record start (or the page header before one): where the next message starts.
        let half = g.buf.len();
        while g.buf.len() < 400_000 {
            g.random_record(12);
        }
        let mut enc = Encoder::new(&params(4096)).unwrap();
        let mut out = Vec::new();
        enc.encode(Lsn(g.start), &g.buf[..half], &mut out).unwrap();
        // The scan of the second half, against the caches as its walk finds them first.
        let mut ahead = Ahead {
            cursor: Some((half, g.start + half as u64)),
            ..Ahead::default()
        };
        let caches = Caches {
            pages: &enc.cache,
            tuples: &enc.tuples,
            compressed_mask: PgMajor::V15.bimg_compressed_mask(),
        };
        let (mut pages, mut tuples) = (0, 0);
        while ahead.cursor.is_some() {
            let from = ahead.hints.len();
            ahead.scan(&g.buf, caches.compressed_mask);
            resolve(&mut ahead.hints[from..], caches);
        }
        for h in &ahead.hints {
            pages += h.pages.iter().filter(|&&a| a != 0).count();
            for (tid, &a) in h.tids.iter().zip(&h.tuples) {
                let Some(tid) = tid.filter(|_| a != 0) else {
                    continue;
                };
                let data = enc
                    .tuples
                    .get(&tid)
                    .expect("a tuple where the scan found one");
                assert_eq!(a + 32, data.as_ptr() as usize, "{tid:?}");
                tuples += 1;
            }
        }
        assert!(pages > 100 && tuples > 10, "pages {pages}, tuples {tuples}");
    }
}
