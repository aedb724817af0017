//! Protocol quantities as newtypes: WAL positions and timeline ids.

use std::fmt;
use std::str::FromStr;

/// A WAL position (XLogRecPtr). Displays and parses as PostgreSQL's `X/X` hex form.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

/// A timeline id (TimeLineID).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TimeLineId(pub u32);

/// Error parsing an `X/X` LSN.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid LSN {0:?}: expected two hex numbers separated by '/', like 0/16B3748")]
pub struct LsnParseError(pub String);

impl Lsn {
    pub const INVALID: Lsn = Lsn(0);

    /// Checked addition of a byte count.
    pub fn checked_add(self, n: u64) -> Option<Lsn> {
        self.0.checked_add(n).map(Lsn)
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 as u32)
    }
}

impl FromStr for Lsn {
    type Err = LsnParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || LsnParseError(s.to_string());
        let (hi, lo) = s.split_once('/').ok_or_else(err)?;
        if hi.is_empty() || lo.is_empty() || hi.len() > 8 || lo.len() > 8 {
            return Err(err());
        }
        let hi = u32::from_str_radix(hi, 16).map_err(|_| err())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| err())?;
        Ok(Lsn(((hi as u64) << 32) | lo as u64))
    }
}

impl fmt::Display for TimeLineId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_parse_round_trip() {
        for v in [0u64, 1, 0x16B3748, 0x1_0000_0000, u64::MAX] {
            let s = Lsn(v).to_string();
            assert_eq!(s.parse::<Lsn>().unwrap(), Lsn(v), "{s}");
        }
        assert_eq!(Lsn(0x3_0000_0028).to_string(), "3/28");
    }

    #[test]
    fn rejects_malformed() {
        for s in ["", "0", "/0", "0/", "g/0", "0/123456789", "0/1/2", " 0/1"] {
            assert!(s.parse::<Lsn>().is_err(), "{s:?} should not parse");
        }
    }
}
