//! The WAL stream tracker: follows raw WAL bytes, in any chunking, and knows at every position
//! what comes next (a page header, a record, padding, the zero tail after XLOG_SWITCH, or
//! unknown bytes).
//!
//! Both halves run one over the same bytes: the encoder over its input, the decoder over what it
//! has restored so far. Every prediction the codec makes (page headers, xl_prev, where records
//! start) is a function of the tracker's state only, so both sides predict the same thing. A
//! prediction is only a hint: the encoder checks it against the real bytes and sends the real
//! bytes when it is wrong, so correctness never depends on the tracker understanding the WAL.
//!
//! Lock-on: the tracker starts [`RecState::Unknown`]; at each page boundary it reads the page
//! header, and a valid one (right magic for the major, xlp_pageaddr equal to the position, known
//! flags) tells where the next record starts (after xlp_rem_len bytes of a continued record).
//! A header that is invalid, or disagrees with the record being followed, re-locks from that
//! header (or unlocks, when invalid).

use super::wal::{
    le16, le32, le64, phd_len, validate_page_header, PageTemplate, LONG_PHD, REC_HDR, RM_XLOG_ID,
    SHORT_PHD, WAL_PAGE, XLOG_SWITCH, XLP_BKP_REMOVABLE, XLP_LONG_HEADER,
};
use crate::segment::WalSegSize;

/// Where the tracker is relative to the record structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecState {
    /// Not locked on: bytes are opaque until the next valid page header.
    Unknown,
    /// Between records: zero padding up to the next MAXALIGN position, where a record starts.
    Between,
    /// Collecting the 24-byte header of the record that started at `start` (`have` bytes so
    /// far, in `Tracker::rec_hdr`).
    Header { start: u64, have: u8 },
    /// Inside a record's body: `remaining` bytes to go (page headers not counted).
    Body { remaining: u32, switch: bool },
    /// After XLOG_SWITCH: the rest of the segment (to `end`) is zero filled, page headers too.
    SwitchTail { end: u64 },
}

#[derive(Clone, Debug)]
pub struct Tracker {
    /// XLOG_PAGE_MAGIC of the major; `None` disables tracking (everything is opaque).
    magic: Option<u16>,
    /// LSN of the next byte.
    pub pos: u64,
    hdr: [u8; LONG_PHD],
    hdr_have: usize,
    rec_hdr: [u8; REC_HDR],
    pub state: RecState,
    pub template: Option<PageTemplate>,
    pub seg_size: u64,
    /// Start of the most recent record seen: xl_prev of the next one.
    pub last_rec: Option<u64>,
    /// Times the tracker lost or changed its lock because the WAL disagreed with it.
    pub resyncs: u64,
}

impl Tracker {
    pub fn new(magic: Option<u16>, pos: u64) -> Tracker {
        Tracker {
            magic,
            pos,
            hdr: [0; LONG_PHD],
            hdr_have: 0,
            rec_hdr: [0; REC_HDR],
            state: RecState::Unknown,
            template: None,
            // Assumed until a long page header tells otherwise (only used for predictions).
            seg_size: WalSegSize::DEFAULT.bytes(),
            last_rec: None,
            resyncs: 0,
        }
    }

    pub fn enabled(&self) -> bool {
        self.magic.is_some()
    }

    /// Bytes to the next WAL page boundary (8192 at a boundary).
    pub fn to_page_end(&self) -> usize {
        (WAL_PAGE - self.pos % WAL_PAGE) as usize
    }

    /// Whether the next bytes are (the rest of) a page header the tracker will read.
    pub fn at_page_header(&self) -> bool {
        self.enabled()
            && !matches!(self.state, RecState::SwitchTail { .. })
            && (self.hdr_have > 0 || self.pos % WAL_PAGE == 0)
    }

    /// Bytes of a page header already collected (a header cut by a message boundary).
    pub fn partial_header(&self) -> usize {
        self.hdr_have
    }

    /// Length of the page header being collected, as far as its bytes so far tell.
    fn hdr_target(&self) -> usize {
        if self.hdr_have >= 4 {
            phd_len(u16::from_le_bytes([self.hdr[2], self.hdr[3]]))
        } else {
            SHORT_PHD
        }
    }

    /// Bytes still missing from the page header being collected.
    pub fn header_missing(&self) -> usize {
        self.hdr_target().saturating_sub(self.hdr_have)
    }

    /// Whether a record starts exactly at the next byte.
    pub fn at_record_start(&self) -> bool {
        self.enabled()
            && self.state == RecState::Between
            && self.pos % 8 == 0
            && self.pos % WAL_PAGE != 0
            && self.hdr_have == 0
    }

    /// Padding bytes before the next record (inside the current page), when between records.
    pub fn padding(&self) -> usize {
        if self.state == RecState::Between && self.hdr_have == 0 && self.pos % WAL_PAGE != 0 {
            ((8 - self.pos % 8) % 8) as usize
        } else {
            0
        }
    }

    /// Record bytes (page headers not counted) left in the record being followed, if known.
    pub fn record_remaining(&self) -> Option<u32> {
        match self.state {
            RecState::Header { have, .. } if have >= 4 => {
                let tot = le32(&self.rec_hdr, 0)?;
                tot.checked_sub(u32::from(have)).filter(|r| *r > 0)
            }
            RecState::Body { remaining, .. } => Some(remaining),
            _ => None,
        }
    }

    /// Bytes of the record header still to come, when collecting one.
    pub fn header_bytes_missing(&self) -> Option<usize> {
        match self.state {
            RecState::Header { have, .. } => Some(REC_HDR - usize::from(have)),
            _ => None,
        }
    }

    /// The page header PostgreSQL would write at the current position (which must be a page
    /// boundary with nothing of the header seen yet), or `None` when nothing can be predicted.
    pub fn predict_header(&self) -> Option<([u8; 40], usize)> {
        if !self.enabled() || self.hdr_have != 0 || self.pos % WAL_PAGE != 0 {
            return None;
        }
        let t = self.template?;
        let rem = match self.state {
            RecState::Between => 0,
            RecState::Header { .. } | RecState::Body { .. } => self.record_remaining()?,
            _ => return None,
        };
        t.build(self.pos, rem, self.pos % self.seg_size == 0, self.seg_size)
    }

    /// Whether header `h` at `pos` would keep the tracker inside a record with `rem` bytes to
    /// go (the encoder's test before it encodes a record across a page boundary).
    pub fn header_continues(&self, h: &[u8], pos: u64, rem: u32) -> bool {
        let Some(magic) = self.magic else {
            return false;
        };
        validate_page_header(h, pos, magic).and_then(|ph| ph.continues()) == Some(rem)
    }

    /// Follows `b`, the next bytes of the stream.
    pub fn feed(&mut self, mut b: &[u8]) {
        while !b.is_empty() {
            if self.magic.is_none() {
                self.pos = self.pos.wrapping_add(b.len() as u64);
                return;
            }
            let n = if self.at_page_header() {
                self.feed_page_header(b)
            } else {
                self.feed_record(b)
            };
            b = &b[n..];
        }
    }

    /// Takes what `b` has of the page header being read; the bytes taken.
    fn feed_page_header(&mut self, b: &[u8]) -> usize {
        let take = self.header_missing().min(b.len());
        self.hdr[self.hdr_have..self.hdr_have + take].copy_from_slice(&b[..take]);
        self.hdr_have += take;
        self.advance(take);
        if self.hdr_have >= self.hdr_target() {
            let len = self.hdr_have;
            self.hdr_have = 0;
            let at = self.pos.wrapping_sub(len as u64);
            self.page_header(len, at);
        }
        take
    }

    /// Follows the records on this page with `b` (not empty, not at a page header): the
    /// bytes taken, 0 when only the state moved on (a record starts). Each step moves the
    /// position over its bytes before it looks at where that leaves the record.
    fn feed_record(&mut self, b: &[u8]) -> usize {
        let room = self.to_page_end();
        match self.state {
            RecState::Unknown => self.advance(room.min(b.len())),
            RecState::Between => {
                let pad = self.padding();
                if pad == 0 {
                    self.last_rec = Some(self.pos);
                    self.state = RecState::Header {
                        start: self.pos,
                        have: 0,
                    };
                }
                self.advance(pad.min(b.len()))
            }
            RecState::Header { start, have } => {
                self.feed_record_header(start, usize::from(have), room, b)
            }
            RecState::Body { remaining, switch } => {
                let n = self.advance((remaining as usize).min(room).min(b.len()));
                let remaining = remaining - n as u32;
                if remaining == 0 {
                    self.record_end(switch);
                } else {
                    self.state = RecState::Body { remaining, switch };
                }
                n
            }
            RecState::SwitchTail { end } => {
                let n = self.advance((end.wrapping_sub(self.pos)).min(b.len() as u64) as usize);
                if self.pos == end {
                    self.state = RecState::Between;
                }
                n
            }
        }
    }

    /// Takes what `b` has of the record header begun at `start` (`have` bytes read, `room`
    /// left on the page); the bytes taken. A whole header tells the record's length.
    fn feed_record_header(&mut self, start: u64, have: usize, room: usize, b: &[u8]) -> usize {
        let n = (REC_HDR - have).min(room).min(b.len());
        self.rec_hdr[have..have + n].copy_from_slice(&b[..n]);
        self.advance(n);
        let have = have + n;
        if have < REC_HDR {
            self.state = RecState::Header {
                start,
                have: have as u8,
            };
            return n;
        }
        let tot = le32(&self.rec_hdr, 0).unwrap_or(0);
        let switch = self.rec_hdr[17] == RM_XLOG_ID && self.rec_hdr[16] & 0xF0 == XLOG_SWITCH;
        if (tot as usize) < REC_HDR {
            // Zero or garbage where a record should be: end of valid WAL.
            self.state = RecState::Unknown;
            self.resyncs += 1;
        } else if tot as usize == REC_HDR {
            self.record_end(switch);
        } else {
            self.state = RecState::Body {
                remaining: tot - REC_HDR as u32,
                switch,
            };
        }
        n
    }

    /// Moves the position over `n` bytes; returns `n`.
    fn advance(&mut self, n: usize) -> usize {
        self.pos = self.pos.wrapping_add(n as u64);
        n
    }

    fn record_end(&mut self, switch: bool) {
        self.state = RecState::Between;
        if switch && self.pos % self.seg_size != 0 {
            let end = (self.pos / self.seg_size + 1).wrapping_mul(self.seg_size);
            if end > self.pos {
                self.state = RecState::SwitchTail { end };
            }
        }
    }

    /// A complete page header of `len` bytes (in `self.hdr`) that started at `at`.
    fn page_header(&mut self, len: usize, at: u64) {
        let Some(magic) = self.magic else { return };
        let h = &self.hdr[..len];
        if le16(h, 0) == Some(magic)
            && le16(h, 2).is_some_and(|i| i & XLP_LONG_HEADER != 0)
            && le64(h, 8) == Some(at)
            && le32(h, 36).is_some_and(|b| b != 8192)
        {
            // A cluster with another XLOG_BLCKSZ: its pages are not where the tracker looks;
            // everything passes raw from here on (until the stream is restarted).
            self.magic = None;
            self.state = RecState::Unknown;
            self.resyncs += 1;
            return;
        }
        let Some(ph) = validate_page_header(&self.hdr[..len], at, magic) else {
            if self.state != RecState::Unknown {
                self.resyncs += 1;
            }
            self.state = RecState::Unknown;
            return;
        };
        let sysid = match ph.long {
            Some((sysid, seg)) => {
                self.seg_size = seg;
                Some(sysid)
            }
            None => self.template.and_then(|t| t.sysid),
        };
        self.template = Some(PageTemplate {
            magic,
            tli: ph.tli,
            bkp_removable: ph.info & XLP_BKP_REMOVABLE != 0,
            sysid,
        });
        let expected = match self.state {
            RecState::Between => None,
            RecState::Header { .. } | RecState::Body { .. } => match self.record_remaining() {
                Some(r) => Some(r),
                None => {
                    self.relock(ph.continues(), true);
                    return;
                }
            },
            _ => {
                self.relock(ph.continues(), false);
                return;
            }
        };
        if ph.continues() != expected {
            self.relock(ph.continues(), true);
        }
    }

    fn relock(&mut self, cont: Option<u32>, counts: bool) {
        if counts {
            self.resyncs += 1;
        }
        self.last_rec = None;
        self.state = match cont {
            Some(remaining) => RecState::Body {
                remaining,
                switch: false,
            },
            None => RecState::Between,
        };
    }
}
