//! Timeline history files as PostgreSQL writes and reads them (`src/backend/access/transam/
//! timeline.c`: writeTimeLineHistory, readTimeLineHistory, tliSwitchPoint).
//!
//! ```text
//! history file of timeline N (00000000N.history): one line per ancestor, oldest first
//!   <parent tli>\t<switchpoint X/X>\t<reason>\n      e.g. "1\t0/3000000\tno recovery target specified"
//! blank lines and lines starting with '#' are ignored
//! ```
//!
//! A line says: timeline `parent` ended at `switchpoint`, where the next timeline of the file
//! (the next line's parent, or N itself for the last line) begins.

use crate::lsn::{Lsn, TimeLineId};

/// Where one timeline of a history ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryEntry {
    pub tli: TimeLineId,
    pub end: Lsn,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HistoryError {
    #[error("timeline history line {line}: {why}")]
    Line { line: usize, why: &'static str },
    #[error("timeline history: timeline ids must increase, {0} after {1}")]
    Order(TimeLineId, TimeLineId),
}

/// Parses the content of a history file (the ancestors of the timeline it belongs to).
pub fn parse(text: &str) -> Result<Vec<HistoryEntry>, HistoryError> {
    let mut out: Vec<HistoryEntry> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let t = line.trim_start();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let bad = |why| HistoryError::Line { line: line_no, why };
        let mut fields = t
            .split(|c: char| c.is_ascii_whitespace())
            .filter(|f| !f.is_empty());
        let tli: u32 = fields
            .next()
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| bad("expected a timeline id"))?;
        let end: Lsn = fields
            .next()
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| bad("expected a switchpoint like 0/3000000"))?;
        let tli = TimeLineId(tli);
        if let Some(prev) = out.last() {
            if tli <= prev.tli {
                return Err(HistoryError::Order(tli, prev.tli));
            }
        }
        out.push(HistoryEntry { tli, end });
    }
    Ok(out)
}

/// The point where timeline `tli` ends in the history of `target` (`history` is the content
/// of the target's history file): `None` when `tli` is the target itself (it has no end yet)
/// or is not in its history.
pub fn switchpoint(history: &[HistoryEntry], tli: TimeLineId) -> Option<Lsn> {
    history.iter().find(|e| e.tli == tli).map(|e| e.end)
}

/// The timeline that follows `tli` in the history of `target`.
pub fn next_timeline(
    history: &[HistoryEntry],
    target: TimeLineId,
    tli: TimeLineId,
) -> Option<TimeLineId> {
    let i = history.iter().position(|e| e.tli == tli)?;
    Some(history.get(i + 1).map(|e| e.tli).unwrap_or(target))
}

/// The timeline of `target`'s history that `lsn` lies on: the first whose end is after it.
pub fn timeline_of(history: &[HistoryEntry], target: TimeLineId, lsn: Lsn) -> TimeLineId {
    history
        .iter()
        .find(|e| lsn < e.end)
        .map(|e| e.tli)
        .unwrap_or(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H3: &str =
        "1\t0/3000000\tno recovery target specified\n\n# comment\n2\t0/5000A28\tat promotion\n";

    #[test]
    fn parses_like_postgres() {
        let h = parse(H3).unwrap();
        assert_eq!(
            h,
            vec![
                HistoryEntry {
                    tli: TimeLineId(1),
                    end: Lsn(0x3000000)
                },
                HistoryEntry {
                    tli: TimeLineId(2),
                    end: Lsn(0x5000A28)
                },
            ]
        );
        assert_eq!(switchpoint(&h, TimeLineId(2)), Some(Lsn(0x5000A28)));
        assert_eq!(switchpoint(&h, TimeLineId(3)), None);
        assert_eq!(
            next_timeline(&h, TimeLineId(3), TimeLineId(1)),
            Some(TimeLineId(2))
        );
        assert_eq!(
            next_timeline(&h, TimeLineId(3), TimeLineId(2)),
            Some(TimeLineId(3))
        );
        assert_eq!(
            timeline_of(&h, TimeLineId(3), Lsn(0x2FFFFFF)),
            TimeLineId(1)
        );
        assert_eq!(
            timeline_of(&h, TimeLineId(3), Lsn(0x3000000)),
            TimeLineId(2)
        );
        assert_eq!(
            timeline_of(&h, TimeLineId(3), Lsn(0x6000000)),
            TimeLineId(3)
        );
        assert_eq!(parse("").unwrap(), vec![]);
    }

    #[test]
    fn refuses_what_postgres_would_not_write() {
        assert!(parse("x\t0/1\n").is_err());
        assert!(parse("1\t01\n").is_err());
        assert!(parse("1\n").is_err());
        assert!(matches!(
            parse("2\t0/1\tx\n1\t0/2\ty\n"),
            Err(HistoryError::Order(..))
        ));
    }
}
