//! Replication commands the upstream runs on its own connections to the primary before they
//! stream (besides `PrimaryConn`'s own IDENTIFY_SYSTEM and TIMELINE_HISTORY): the segment size,
//! where a slot holds WAL from, and START_REPLICATION itself.

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;

use walrelay_pgwire::{encode, ErrorFields, RawMsg, WireError};
use walrelay_wal::lsn::{Lsn, TimeLineId};
use walrelay_wal::segment::WalSegSize;

use crate::pgclient::{PgClientError, PrimaryConn};
use tonic::Status;

fn malformed(what: &'static str) -> PgClientError {
    PgClientError::Wire(WireError::Malformed { tag: 'D', what })
}

/// The first row of a result, as text columns.
fn first_row(msgs: &[RawMsg]) -> Result<Vec<Option<String>>, PgClientError> {
    let row = msgs
        .iter()
        .find(|m| m.tag == b'D')
        .ok_or(malformed("the command returned no row"))?;
    Ok(row
        .data_row()?
        .into_iter()
        .map(|c| c.map(|v| String::from_utf8_lossy(v).into_owned()))
        .collect())
}

/// `SHOW wal_segment_size` ("16MB", "1GB", ...).
pub async fn segment_size(conn: &mut PrimaryConn) -> Result<WalSegSize, PgClientError> {
    let v = conn.show("wal_segment_size").await?;
    parse_size(&v)
        .and_then(WalSegSize::new)
        .ok_or(malformed("wal_segment_size is not a valid segment size"))
}

/// A PostgreSQL memory setting as SHOW prints it ("16MB", "1GB", "512kB", "8192").
pub fn parse_size(v: &str) -> Option<u64> {
    const UNITS: &[(&str, u64)] = &[
        ("", 1),
        ("B", 1),
        ("kB", 1 << 10),
        ("MB", 1 << 20),
        ("GB", 1 << 30),
        ("TB", 1 << 40),
    ];
    parse_setting(v, UNITS)
}

/// A PostgreSQL time setting in milliseconds as SHOW prints it ("60s", "1min", "500ms", "0";
/// a bare number is milliseconds, the unit of `wal_sender_timeout`).
pub fn parse_millis(v: &str) -> Option<u64> {
    const UNITS: &[(&str, u64)] = &[
        ("", 1),
        ("ms", 1),
        ("s", 1000),
        ("min", 60_000),
        ("h", 3_600_000),
        ("d", 86_400_000),
    ];
    parse_setting(v, UNITS)
}

/// A number followed by one of `units`' names, times that unit; None for anything else or a
/// product past u64.
fn parse_setting(v: &str, units: &[(&str, u64)]) -> Option<u64> {
    let v = v.trim();
    let digits = v.bytes().take_while(u8::is_ascii_digit).count();
    let n: u64 = v[..digits].parse().ok()?;
    let (_, unit) = units.iter().find(|(name, _)| *name == &v[digits..])?;
    n.checked_mul(*unit)
}

/// Where `slot` holds WAL from, and on which timeline (READ_REPLICATION_SLOT, PostgreSQL
/// 15+: `restart_lsn`, `restart_tli`); None when the primary cannot say (older majors) or the
/// slot holds nothing yet. The timeline is older than the primary's when the slot was made on
/// a promoted server before its first checkpoint (it reserves WAL from the last restartpoint).
pub async fn slot_restart(conn: &mut PrimaryConn, slot: &str) -> Option<(Lsn, Option<TimeLineId>)> {
    let sql = format!("READ_REPLICATION_SLOT \"{}\"", slot.replace('"', "\"\""));
    let msgs = conn.simple_query(&sql).await.ok()?;
    let row = first_row(&msgs).ok()?;
    let lsn = row.get(1).cloned().flatten()?.parse().ok()?;
    let tli = row
        .get(2)
        .cloned()
        .flatten()
        .and_then(|t| t.parse::<u32>().ok())
        .map(TimeLineId);
    Some((lsn, tli))
}

/// How START_REPLICATION answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Started {
    /// CopyBothResponse: WAL follows.
    Streaming,
    /// The timeline asked for ended at or before the start: where the next one starts (no
    /// COPY; the connection is ready for the next command).
    TimelineEnded { next: TimeLineId, at: Lsn },
}

/// Sends START_REPLICATION and waits for CopyBothResponse (or the next timeline, when the one
/// asked for ends at the start); the primary's ErrorResponse comes back as `Err(Server)`.
pub async fn start_replication(
    conn: &mut PrimaryConn,
    slot: Option<&str>,
    at: Lsn,
    tli: TimeLineId,
) -> Result<Started, PgClientError> {
    let slot = slot
        .map(|s| format!("SLOT \"{}\" ", s.replace('"', "\"\"")))
        .unwrap_or_default();
    let sql = format!("START_REPLICATION {slot}PHYSICAL {at} TIMELINE {}", tli.0);
    let mut out = BytesMut::new();
    encode::query(&mut out, &sql);
    conn.writer.write_all(&out).await.map_err(WireError::Io)?;
    let max = conn.max_message_bytes;
    let mut next = None;
    loop {
        let m = conn
            .reader
            .read(|b| walrelay_pgwire::parse_tagged(b, |_| max))
            .await?;
        match m.tag {
            b'W' => return Ok(Started::Streaming),
            // The next timeline's row, CommandComplete, then ReadyForQuery.
            b'T' | b'C' => continue,
            b'D' => next = Some(next_timeline_row(&m)?),
            b'Z' => {
                let (next, at) =
                    next.ok_or(malformed("START_REPLICATION ended without a next timeline"))?;
                return Ok(Started::TimelineEnded { next, at });
            }
            b'E' => {
                let e = ErrorFields::parse(&m.body)?;
                // The primary follows an error with ReadyForQuery; read it so the connection
                // can be used again.
                let _ = conn
                    .reader
                    .read(|b| walrelay_pgwire::parse_tagged(b, |_| max))
                    .await;
                return Err(PgClientError::Server(e));
            }
            // Notices and parameter changes may come first.
            b'N' | b'S' => continue,
            t => return Err(PgClientError::Unexpected(t as char, "START_REPLICATION")),
        }
    }
}

/// (next_tli, next_tli_startpos) of the row that ends an older timeline's streaming.
pub fn next_timeline_row(m: &RawMsg) -> Result<(TimeLineId, Lsn), PgClientError> {
    let row = m.data_row()?;
    let col = |i: usize| {
        row.get(i)
            .copied()
            .flatten()
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    let next = col(0)
        .and_then(|s| s.parse::<u32>().ok())
        .ok_or(malformed("next_tli"))?;
    let at = col(1)
        .and_then(|s| s.parse::<Lsn>().ok())
        .ok_or(malformed("next_tli_startpos"))?;
    Ok((TimeLineId(next), at))
}

/// The primary's error `e` on the stream's replication connection, when it says that the
/// WAL the spool continues from is gone: removed (`requested WAL segment … has already been
/// removed`, which PostgreSQL sends after CopyBothResponse, in the middle of the copy) or
/// the stream's slot invalidated (PostgreSQL 18 refuses START_REPLICATION on it: `can no
/// longer access replication slot`). Waiting does not bring it back, so the status says what
/// to do. None for any other error.
pub fn wal_gone(slot: &str, e: &ErrorFields) -> Option<Status> {
    let removed = e.code == "58P01" || e.message.contains("has already been removed");
    let invalidated = e.message.contains("can no longer access replication slot");
    if !removed && !invalidated {
        return None;
    }
    Some(Status::failed_precondition(format!(
        "the primary no longer has the WAL the spool continues from ({e}). The spool and the \
         standbys behind it cannot catch up from this primary (was slot {slot:?} dropped, or \
         invalidated by max_slot_wal_keep_size?): drop the slot on the primary if \
         pg_replication_slots still lists it (SELECT pg_drop_replication_slot('{slot}')), \
         empty downstream.spool_dir, restart the downstream and seed the standbys again \
         (pg_basebackup through it)"
    )))
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_as_show_prints_them() {
        use super::parse_size;
        assert_eq!(parse_size("16MB"), Some(16 << 20));
        assert_eq!(parse_size("1GB"), Some(1 << 30));
        assert_eq!(parse_size("512kB"), Some(512 << 10));
        assert_eq!(parse_size("8192"), Some(8192));
        assert_eq!(parse_size("16 MB"), None);
        assert_eq!(parse_size("MB"), None);
        assert_eq!(parse_size("99999999999999TB"), None);
    }

    #[test]
    fn times_as_show_prints_them() {
        use super::parse_millis;
        assert_eq!(parse_millis("60s"), Some(60_000));
        assert_eq!(parse_millis("1min"), Some(60_000));
        assert_eq!(parse_millis("500ms"), Some(500));
        assert_eq!(parse_millis("0"), Some(0));
        assert_eq!(parse_millis("2h"), Some(7_200_000));
        assert_eq!(parse_millis("5 s"), None);
        assert_eq!(parse_millis("s"), None);
        assert_eq!(parse_millis("99999999999999999d"), None);
    }
}
