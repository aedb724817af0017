//! Commands on the replication connection before streaming starts: `SHOW`, slot creation,
//! the server's role (the `target_session_attrs` check), `IDENTIFY_SYSTEM` and
//! `TIMELINE_HISTORY`. Replies are bounded and parsed strictly: a reply that is not what
//! PostgreSQL sends is an error naming the command, never a guess.

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;

use super::{read_msg, PgClientError, PrimaryConn};
use walrelay_pgwire::{encode, ErrorFields, RawMsg, WireError};
use walrelay_wal::lsn::{Lsn, TimeLineId};
use walrelay_wal::segment::history_file_name;
use walrelay_wal::timeline::{self, HistoryEntry};

/// Most messages one command may answer with (row description, rows, notices, completion).
pub const MAX_REPLY_MESSAGES: usize = 256;

/// What a server is, as far as a replication connection can tell (PostgreSQL 14+ reports
/// `in_hot_standby`; before, a read-only server counts as a standby).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerRole {
    /// Not in recovery, `transaction_read_only` off.
    ReadWrite,
    /// Not in recovery, but `default_transaction_read_only` makes it read-only.
    ReadOnly,
    /// In recovery: a hot standby.
    HotStandby,
}

impl std::fmt::Display for ServerRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ServerRole::ReadWrite => "a read-write primary",
            ServerRole::ReadOnly => "read-only (a primary with default_transaction_read_only = on)",
            ServerRole::HotStandby => "read-only (hot standby)",
        })
    }
}

/// The answer to `IDENTIFY_SYSTEM`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemIdentity {
    /// The database system identifier: the same on a primary and all its standbys.
    pub system_id: u64,
    /// The server's current timeline.
    pub timeline: TimeLineId,
    /// Its current WAL flush position.
    pub xlogpos: Lsn,
    /// NULL (None) on a physical replication connection.
    pub dbname: Option<String>,
}

/// How a server found after a reconnection relates to the one streamed from before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Continuity {
    /// Same system, same timeline.
    SameTimeline,
    /// Same system, a later timeline: a standby was promoted. Fetch the history of `to` with
    /// [`PrimaryConn::timeline_history`] to learn where `from` ended.
    Promoted { from: TimeLineId, to: TimeLineId },
    /// Same system on an earlier timeline: this server has not followed a promotion.
    EarlierTimeline { before: TimeLineId, now: TimeLineId },
    /// Another database system: its WAL does not belong to these standbys.
    OtherSystem { before: u64, now: u64 },
}

impl SystemIdentity {
    /// How this identity (found now) follows `before`.
    pub fn continuity_from(&self, before: &SystemIdentity) -> Continuity {
        if self.system_id != before.system_id {
            return Continuity::OtherSystem {
                before: before.system_id,
                now: self.system_id,
            };
        }
        match self.timeline.cmp(&before.timeline) {
            std::cmp::Ordering::Equal => Continuity::SameTimeline,
            std::cmp::Ordering::Greater => Continuity::Promoted {
                from: before.timeline,
                to: self.timeline,
            },
            std::cmp::Ordering::Less => Continuity::EarlierTimeline {
                before: before.timeline,
                now: self.timeline,
            },
        }
    }
}

/// The answer to `TIMELINE_HISTORY n`: the history file of timeline n, as the server has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineHistoryFile {
    /// `0000000N.history` (checked to be the file of the timeline asked for).
    pub file_name: String,
    /// The file's bytes, verbatim (what a standby writes into its pg_wal).
    pub content: Bytes,
}

impl TimelineHistoryFile {
    /// The ancestors the file lists, oldest first.
    pub fn entries(&self) -> Result<Vec<HistoryEntry>, PgClientError> {
        let text = std::str::from_utf8(&self.content).map_err(|_| bad_history("not UTF-8"))?;
        timeline::parse(text).map_err(|e| bad_history(&e.to_string()))
    }
}

fn bad_history(why: &str) -> PgClientError {
    PgClientError::BadReply {
        command: "TIMELINE_HISTORY",
        why: why.to_string(),
    }
}

fn bad_identify(why: &str) -> PgClientError {
    PgClientError::BadReply {
        command: "IDENTIFY_SYSTEM",
        why: why.to_string(),
    }
}

impl PrimaryConn {
    /// Runs one command before streaming starts and returns its messages up to ReadyForQuery
    /// (notices left out; ParameterStatus messages update [`PrimaryConn::params`] instead). An
    /// ErrorResponse is returned as `Err(PgClientError::Server)` after ReadyForQuery. At most
    /// 256 messages and `max_message_bytes` (+64 KiB) in all.
    pub async fn simple_query(&mut self, sql: &str) -> Result<Vec<RawMsg>, PgClientError> {
        let mut out = BytesMut::new();
        encode::query(&mut out, sql);
        self.writer.write_all(&out).await.map_err(WireError::Io)?;
        let (mut msgs, mut err) = (Vec::new(), None);
        for m in self.read_reply("a command before streaming").await? {
            match m.tag {
                b'Z' => {}
                b'E' => err = Some(ErrorFields::parse(&m.body)?),
                b'N' => {}
                b'S' => self.parameter_changed(&m.body),
                _ => msgs.push(m),
            }
        }
        match err {
            Some(e) => Err(PgClientError::Server(e)),
            None => Ok(msgs),
        }
    }

    /// A ParameterStatus after startup (`body`): a command changed a setting the server
    /// reports, such as the `SET default_transaction_read_only = on` that makes a tunnel's
    /// session read-only. `params` holds the new value from then on, so that a startup reply
    /// replayed from them (a tunnel's greeting) tells the client what is true now, not what
    /// was before: libpq's `target_session_attrs` decides on these values. A malformed one is
    /// left out, as during startup.
    fn parameter_changed(&mut self, body: &Bytes) {
        let mut b = body.clone();
        let (Some(name), Some(value)) = (super::take_cstr(&mut b), super::take_cstr(&mut b)) else {
            return;
        };
        match self.params.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => *v = value,
            None => self.params.push((name, value)),
        }
    }

    /// The messages answering one command (of `command`, for the error), as the server sent
    /// them, up to and including its ReadyForQuery: at most [`MAX_REPLY_MESSAGES`], and
    /// `max_message_bytes` + 64 KiB in all, so that a server (or someone in the middle of a
    /// connection without TLS) cannot grow an answer without end.
    pub async fn read_reply(
        &mut self,
        command: &'static str,
    ) -> Result<Vec<RawMsg>, PgClientError> {
        let budget = self.max_message_bytes.saturating_add(64 * 1024);
        let (mut msgs, mut bytes) = (Vec::new(), 0usize);
        loop {
            let m = read_msg(&mut self.reader, self.max_message_bytes).await?;
            bytes = bytes.saturating_add(5 + m.body.len());
            let last = m.tag == b'Z';
            msgs.push(m);
            if msgs.len() > MAX_REPLY_MESSAGES || bytes > budget {
                return Err(PgClientError::BadReply {
                    command,
                    why: format!("more than {MAX_REPLY_MESSAGES} messages or {budget} bytes"),
                });
            }
            if last {
                return Ok(msgs);
            }
        }
    }

    /// The value of a setting of the primary (`SHOW name`), before streaming starts.
    pub async fn show(&mut self, name: &str) -> Result<String, PgClientError> {
        let msgs = self
            .simple_query(&format!("SHOW \"{}\"", name.replace('"', "\"\"")))
            .await?;
        let row = msgs
            .iter()
            .find(|m| m.tag == b'D')
            .ok_or(WireError::Malformed {
                tag: 'D',
                what: "SHOW returned no row",
            })?;
        match row.data_row()?.first() {
            Some(Some(v)) => Ok(String::from_utf8_lossy(v).into_owned()),
            _ => Err(WireError::Malformed {
                tag: 'D',
                what: "SHOW returned no value",
            }
            .into()),
        }
    }

    /// Makes sure a physical slot exists (creates it reserving WAL when missing).
    pub async fn ensure_physical_slot(&mut self, slot: &str) -> Result<bool, PgClientError> {
        match self
            .simple_query(&format!(
                "CREATE_REPLICATION_SLOT \"{}\" PHYSICAL RESERVE_WAL",
                slot.replace('"', "\"\"")
            ))
            .await
        {
            Ok(_) => Ok(true),
            Err(PgClientError::Server(e)) if e.code == "42710" => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether the server is a read-write primary, a read-only one, or a hot standby, now:
    /// `SHOW in_hot_standby` (PostgreSQL 14+), then `SHOW transaction_read_only`.
    pub async fn role(&mut self) -> Result<ServerRole, PgClientError> {
        let in_recovery = match self.show("in_hot_standby").await {
            Ok(v) => Some(on_off("in_hot_standby", &v)?),
            // 42704 undefined_object: a server older than 14.
            Err(PgClientError::Server(e)) if e.code == "42704" => None,
            Err(e) => return Err(e),
        };
        if in_recovery == Some(true) {
            return Ok(ServerRole::HotStandby);
        }
        let read_only = on_off(
            "transaction_read_only",
            &self.show("transaction_read_only").await?,
        )?;
        Ok(match (read_only, in_recovery) {
            (false, _) => ServerRole::ReadWrite,
            (true, Some(false)) => ServerRole::ReadOnly,
            (true, _) => ServerRole::HotStandby,
        })
    }

    /// `IDENTIFY_SYSTEM`: the system identifier, timeline and WAL position of the server.
    /// One row of exactly four columns, each checked.
    pub async fn identify_system(&mut self) -> Result<SystemIdentity, PgClientError> {
        parse_identify(&self.simple_query("IDENTIFY_SYSTEM").await?)
    }

    /// `TIMELINE_HISTORY tli`: the history file of timeline `tli` (2 or later; timeline 1
    /// has none). The file name must be that timeline's; the content is returned verbatim.
    pub async fn timeline_history(
        &mut self,
        tli: TimeLineId,
    ) -> Result<TimelineHistoryFile, PgClientError> {
        if tli.0 < 2 {
            return Err(bad_history(
                "timeline 1 has no history file: ask for 2 or later",
            ));
        }
        let msgs = self
            .simple_query(&format!("TIMELINE_HISTORY {}", tli.0))
            .await?;
        parse_history(&msgs, tli)
    }

    /// Ends the connection politely (bounded: 1 s).
    pub async fn terminate(&mut self) {
        let mut out = BytesMut::new();
        encode::terminate(&mut out);
        let write = self.writer.write_all(&out);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), write).await;
    }
}

/// The reply to `IDENTIFY_SYSTEM` (messages before ReadyForQuery).
pub(crate) fn parse_identify(msgs: &[RawMsg]) -> Result<SystemIdentity, PgClientError> {
    let cols = single_row(msgs, 4).map_err(|why| bad_identify(&why))?;
    let text = |i: usize, what: &str| -> Result<&str, PgClientError> {
        let v = cols[i].ok_or_else(|| bad_identify(&format!("{what} is NULL")))?;
        std::str::from_utf8(v).map_err(|_| bad_identify(&format!("{what} is not UTF-8")))
    };
    let sysid = text(0, "systemid")?;
    let system_id = decimal(sysid, 20)
        .ok_or_else(|| bad_identify(&format!("systemid {sysid:?} is not a 64-bit number")))?;
    let tli = text(1, "timeline")?;
    let timeline = decimal(tli, 10)
        .and_then(|t| u32::try_from(t).ok())
        .filter(|&t| t >= 1)
        .map(TimeLineId)
        .ok_or_else(|| bad_identify(&format!("timeline {tli:?} is not a timeline id")))?;
    let xlogpos = text(2, "xlogpos")?
        .parse()
        .map_err(|e| bad_identify(&format!("xlogpos: {e}")))?;
    let dbname = match cols[3] {
        None => None,
        Some(_) => Some(text(3, "dbname")?.to_string()),
    };
    Ok(SystemIdentity {
        system_id,
        timeline,
        xlogpos,
        dbname,
    })
}

/// Only ASCII digits, at most `max_len` of them, within u64.
fn decimal(s: &str, max_len: usize) -> Option<u64> {
    if s.is_empty() || s.len() > max_len || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The reply to `TIMELINE_HISTORY tli` (messages before ReadyForQuery).
pub(crate) fn parse_history(
    msgs: &[RawMsg],
    tli: TimeLineId,
) -> Result<TimelineHistoryFile, PgClientError> {
    let cols = single_row(msgs, 2).map_err(|why| bad_history(&why))?;
    let (Some(name), Some(content)) = (cols[0], cols[1]) else {
        return Err(bad_history("a column is NULL"));
    };
    let expected = history_file_name(tli);
    if name != expected.as_bytes() {
        return Err(bad_history(&format!(
            "file name {:?} is not {expected:?}",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(TimelineHistoryFile {
        file_name: expected,
        content: Bytes::copy_from_slice(content),
    })
}

fn on_off(name: &str, v: &str) -> Result<bool, PgClientError> {
    match v {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(PgClientError::BadReply {
            command: "SHOW",
            why: format!("{name} is {other:?}, expected on or off"),
        }),
    }
}

/// The columns of the one DataRow of a reply, which must have exactly `n` columns (and a
/// RowDescription announcing as many).
fn single_row(msgs: &[RawMsg], n: usize) -> Result<Vec<Option<&[u8]>>, String> {
    let rows: Vec<&RawMsg> = msgs.iter().filter(|m| m.tag == b'D').collect();
    let [row] = rows[..] else {
        return Err(format!("{} rows, expected 1", rows.len()));
    };
    let described = msgs
        .iter()
        .find(|m| m.tag == b'T')
        .and_then(|t| t.body.get(..2))
        .map(|c| usize::from(u16::from_be_bytes([c[0], c[1]])));
    if described != Some(n) {
        return Err(format!(
            "row description of {described:?} columns, expected {n}"
        ));
    }
    let cols = row.data_row().map_err(|e| e.to_string())?;
    if cols.len() != n {
        return Err(format!("{} columns, expected {n}", cols.len()));
    }
    Ok(cols)
}

#[cfg(test)]
mod tests;
