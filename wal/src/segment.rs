//! WAL segments: their size, the names of their files and of timeline history files, as
//! PostgreSQL 14..=18 computes them (`src/include/access/xlog_internal.h`: XLogFileName,
//! XLogFromFileName, TLHistoryFileName, IsValidWalSegSize).
//!
//! ```text
//! segment file:  TTTTTTTTXXXXXXXXYYYYYYYY   24 upper-case hex digits
//!                T = timeline, X = segno / segments per 4 GiB, Y = segno % segments per 4 GiB
//!                e.g. 000000010000000000000003 (16 MiB segments: segno 3, LSN 0/3000000)
//! history file:  TTTTTTTT.history          e.g. 00000002.history
//! ```
//!
//! What a history file says is read by [`crate::timeline`].

use crate::lsn::{Lsn, TimeLineId};

/// A WAL segment size (`wal_segment_size`, set by `initdb --wal-segsize`): a power of two
/// from 1 MiB to 1 GiB. Invalid sizes cannot be built, so the arithmetic below cannot divide by
/// zero or mask wrongly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WalSegSize(u64);

/// 4 GiB: the span of one "xlogid", the middle 8 digits of a segment file name.
const XLOG_ID_SPAN: u64 = 0x1_0000_0000;

impl WalSegSize {
    /// initdb's default, 16 MiB.
    pub const DEFAULT: WalSegSize = WalSegSize(16 << 20);
    /// Smallest valid size (WalSegMinSize).
    pub const MIN_BYTES: u64 = 1 << 20;
    /// Largest valid size (WalSegMaxSize).
    pub const MAX_BYTES: u64 = 1 << 30;

    /// `bytes` as a segment size, if PostgreSQL accepts it (IsValidWalSegSize).
    pub const fn new(bytes: u64) -> Option<WalSegSize> {
        if bytes.is_power_of_two() && bytes >= Self::MIN_BYTES && bytes <= Self::MAX_BYTES {
            Some(WalSegSize(bytes))
        } else {
            None
        }
    }

    pub const fn bytes(self) -> u64 {
        self.0
    }

    /// The number of the segment holding `lsn` (XLByteToSeg).
    pub const fn segment_of(self, lsn: Lsn) -> u64 {
        lsn.0 / self.0
    }

    /// Where segment `segno` starts; `None` past the end of the WAL address space.
    pub const fn segment_start(self, segno: u64) -> Option<Lsn> {
        match segno.checked_mul(self.0) {
            Some(at) => Some(Lsn(at)),
            None => None,
        }
    }

    /// Offset of `lsn` inside its segment (XLogSegmentOffset).
    pub const fn offset_in_segment(self, lsn: Lsn) -> u64 {
        lsn.0 & (self.0 - 1)
    }

    /// Segments per 4 GiB (XLogSegmentsPerXLogId).
    const fn per_xlog_id(self) -> u64 {
        XLOG_ID_SPAN / self.0
    }

    /// The size as PostgreSQL's `SHOW wal_segment_size` prints it: "16MB", "1GB" (a memory
    /// setting in its largest unit that divides it).
    pub fn shown(self) -> String {
        match self.0 % (1 << 30) {
            0 => format!("{}GB", self.0 >> 30),
            _ => format!("{}MB", self.0 >> 20),
        }
    }

    /// The file name of segment `segno` of timeline `tli` (XLogFileName).
    pub fn file_name(self, tli: TimeLineId, segno: u64) -> String {
        let per_id = self.per_xlog_id();
        format!("{:08X}{:08X}{:08X}", tli.0, segno / per_id, segno % per_id)
    }

    /// The timeline and segment number of a segment file name (XLogFromFileName), if `name`
    /// is one for this segment size: 24 upper-case hex digits (IsXLogFileName), the last 8
    /// below the segments per 4 GiB.
    pub fn parse_file_name(self, name: &str) -> Option<(TimeLineId, u64)> {
        if name.len() != 24 || !name.bytes().all(is_upper_hex) {
            return None;
        }
        let tli = u32::from_str_radix(&name[..8], 16).ok()?;
        let log = u64::from_str_radix(&name[8..16], 16).ok()?;
        let seg = u64::from_str_radix(&name[16..], 16).ok()?;
        let per_id = self.per_xlog_id();
        if seg >= per_id {
            return None;
        }
        Some((TimeLineId(tli), log.checked_mul(per_id)?.checked_add(seg)?))
    }
}

impl Default for WalSegSize {
    fn default() -> Self {
        WalSegSize::DEFAULT
    }
}

fn is_upper_hex(b: u8) -> bool {
    b.is_ascii_digit() || (b'A'..=b'F').contains(&b)
}

/// The history file of timeline `tli` (TLHistoryFileName), e.g. `00000002.history`.
pub fn history_file_name(tli: TimeLineId) -> String {
    format!("{:08X}.history", tli.0)
}

/// The timeline of a history file name (IsTLHistoryFileName), if `name` is one.
pub fn parse_history_file_name(name: &str) -> Option<TimeLineId> {
    let hex = name.strip_suffix(".history")?;
    if hex.len() != 8 || !hex.bytes().all(is_upper_hex) {
        return None;
    }
    u32::from_str_radix(hex, 16).ok().map(TimeLineId)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_powers_of_two_from_1_mib_to_1_gib_are_sizes() {
        for ok in [1 << 20, 2 << 20, 16 << 20, 64 << 20, 1 << 30] {
            assert_eq!(WalSegSize::new(ok).map(WalSegSize::bytes), Some(ok));
        }
        for bad in [0, 1, 8192, (1 << 20) - 1, 3 << 20, 2 << 30, u64::MAX] {
            assert_eq!(WalSegSize::new(bad), None, "{bad}");
        }
        assert_eq!(WalSegSize::default().bytes(), 16 * 1024 * 1024);
    }

    #[test]
    fn names_segments_like_postgres() {
        let s = WalSegSize::DEFAULT;
        let tli = TimeLineId(1);
        assert_eq!(s.file_name(tli, 1), "000000010000000000000001");
        assert_eq!(s.file_name(tli, 0x1FF), "0000000100000001000000FF");
        assert_eq!(
            s.file_name(TimeLineId(0xA), 0x300),
            "0000000A0000000300000000"
        );
        // 1 GiB segments: 4 per xlogid; 1 MiB: 4096.
        let g = WalSegSize::new(1 << 30).unwrap();
        assert_eq!(g.file_name(tli, 5), "000000010000000100000001");
        let m = WalSegSize::new(1 << 20).unwrap();
        assert_eq!(m.file_name(tli, 4097), "000000010000000100000001");
        assert_eq!(s.segment_of(Lsn(0x3_0000_0028)), 0x300);
        assert_eq!(s.segment_start(0x300), Some(Lsn(0x3_0000_0000)));
        assert_eq!(s.segment_start(u64::MAX), None);
        assert_eq!(s.offset_in_segment(Lsn(0x3_0100_0028)), 0x28);
    }

    #[test]
    fn segment_names_parse_back() {
        for size in [1u64 << 20, 16 << 20, 1 << 30] {
            let s = WalSegSize::new(size).unwrap();
            for segno in [0, 1, 255, 256, 4095, 4096, 1 << 20, (u64::MAX / size) >> 8] {
                let name = s.file_name(TimeLineId(7), segno);
                assert_eq!(
                    s.parse_file_name(&name),
                    Some((TimeLineId(7), segno)),
                    "{name}"
                );
            }
        }
        let s = WalSegSize::DEFAULT;
        for bad in [
            "",
            "00000001000000000000000",
            "0000000100000000000000001",
            "00000001000000000000000g",
            "00000001000000000000000a",
            "000000010000000000000100", // segment 256 of 16 MiB does not exist in an xlogid
            "00000001.history",
        ] {
            assert_eq!(s.parse_file_name(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn history_files() {
        assert_eq!(history_file_name(TimeLineId(2)), "00000002.history");
        assert_eq!(history_file_name(TimeLineId(0xABCD)), "0000ABCD.history");
        assert_eq!(
            parse_history_file_name("0000ABCD.history"),
            Some(TimeLineId(0xABCD))
        );
        for bad in [
            "00000002",
            "0000002.history",
            "0000abcd.history",
            "00000002.historyx",
        ] {
            assert_eq!(parse_history_file_name(bad), None, "{bad:?}");
        }
    }
}
