//! A standby's session after authentication: the startup reply, then its replication
//! commands, strictly in turn, as a walsender serves them.
//!
//! | command | answered by |
//! |---|---|
//! | IDENTIFY_SYSTEM | the downstream: the primary's system id, the spool's timeline and end |
//! | TIMELINE_HISTORY | the downstream: the history file in the spool |
//! | SHOW wal_segment_size, data_directory_mode | the downstream when the link is down, else as below |
//! | SHOW, READ_REPLICATION_SLOT | the standby's own connection to the primary (needs the link) |
//! | START_REPLICATION | the downstream, from the spool ([`super::streamer`]) |
//! | BASE_BACKUP, slot commands | the primary: the session continues in a tunnel ([`super::tunnel`]) |

use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tracing::{debug, info};

use prost::Message;
use walrelay_pgwire::replcmd::{self, ReplCommand};
use walrelay_pgwire::{encode, results, ErrorFields, FrontendMsg, WireError};
use walrelay_proto::frame::MAX_CONTROL_ITEM;
use walrelay_proto::link::StandbyInfo;
use walrelay_wal::segment::{history_file_name, WalSegSize};

use super::session::Session;
use super::{shutting_down, streamer, Downstream, End, Reader, Standby, Writer};
use crate::link;
use crate::metrics::Metrics;
use crate::monitor::Half;
use crate::spooler::ChanEvent;

/// Longest a standby waits for the primary's answer to a relayed command.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs a standby's session until it leaves or something ends it.
pub(super) async fn run(
    ds: &Downstream,
    reader: &mut Reader,
    writer: &mut Writer,
    standby: &Standby,
) -> End {
    let params = match startup_params(ds).await {
        Ok(p) => p,
        Err(end) => return end,
    };
    let mut out = BytesMut::new();
    encode::auth_ok(&mut out);
    for (k, v) in &params {
        encode::parameter_status(&mut out, k, v);
    }
    // Its cancel requests reach the primary once the session continues in a tunnel.
    let (pid, key) = standby.cancel_key;
    encode::backend_key_data(&mut out, pid, key);
    encode::ready_for_query(&mut out);
    if writer.write_all(&out).await.is_err() {
        return End::Quiet;
    }
    info!(peer = %standby.peer, application_name = %standby.application_name, "standby session open (served from the spool)");
    Metrics::add(&ds.metrics.ops.sessions_started_downstream, 1);
    let Some((chan, events)) = ds.spooler.open_channel(open_info(standby)) else {
        return End::Fatal(ErrorFields::fatal(
            "53300",
            format!(
                "walrelay: the link stream carries at most {} standby sessions and has no room \
                 for another; lower limits.max_sessions or run another downstream",
                walrelay_proto::frame::MAX_CHANNELS
            ),
        ));
    };
    let entry = ds.metrics.ops.standbys.register(
        Half::Downstream,
        &standby.application_name,
        &standby.peer.to_string(),
    );
    let mut s = Session {
        ds,
        reader,
        writer,
        standby,
        chan,
        events,
        entry,
        reported: false,
        chan_open: true,
    };
    let end = s.commands().await;
    if s.chan_open {
        ds.spooler.close_channel(chan);
    }
    end
}

/// The primary's parameters: known from a stream or the spool; if never, wait for the link.
async fn startup_params(ds: &Downstream) -> Result<Vec<(String, String)>, End> {
    let params = ds.spooler.params();
    if !params.is_empty() {
        return Ok(params);
    }
    let mut link = ds.spooler.link.clone();
    let wait = Duration::from_secs(ds.link_cfg.connect_timeout_secs.max(1));
    let up = tokio::time::timeout(wait, link.wait_for(|w| w.is_some())).await;
    match up {
        Ok(Ok(_)) => Ok(ds.spooler.params()),
        _ => Err(End::Fatal(
            ErrorFields::fatal(
                "08006",
                format!(
                    "walrelay cannot reach the primary through the upstream at {}: {}",
                    ds.cfg.upstream,
                    ds.spooler.last_error().unwrap_or_else(|| "not connected yet".into())
                ),
            )
            .with_hint("check that the upstream half runs and can connect to the primary; the standby retries by itself"),
        )),
    }
}

/// What the session's OPEN item tells the upstream. `startup` bounds its names so that it
/// always fits in `frame::MAX_CONTROL_ITEM` (its test checks the largest): a longer item would
/// end the link's stream.
pub(super) fn open_info(standby: &Standby) -> StandbyInfo {
    StandbyInfo {
        application_name: standby.application_name.clone(),
        user: standby.user.clone(),
        addr: standby.peer.to_string(),
    }
}

impl Session<'_> {
    async fn commands(&mut self) -> End {
        loop {
            let msg = tokio::select! {
                m = self.reader.read(walrelay_pgwire::parse_frontend) => m,
                _ = self.ds.shutdown.cancelled() => return shutting_down(),
            };
            let msg = match msg {
                Ok(m) => m,
                Err(WireError::Closed) => return End::Quiet,
                Err(WireError::Io(e)) => {
                    debug!("standby socket: {e}");
                    return End::Quiet;
                }
                Err(e) => {
                    return End::fatal("08P01", format!("invalid message from the standby: {e}"))
                }
            };
            let r = match msg {
                FrontendMsg::Query(q) => self.query(&q).await,
                FrontendMsg::Terminate => return End::Quiet,
                // As PostgresMain: accepted and ignored outside COPY. A client's COPY can end
                // before it knows: pg_receivewal sends a status update as soon as a
                // START_REPLICATION's CopyBothResponse arrives, before the ERROR after it.
                FrontendMsg::CopyData(_) | FrontendMsg::CopyDone | FrontendMsg::CopyFail(_) => {
                    continue
                }
                FrontendMsg::Password(_) => Err(End::fatal(
                    "08P01",
                    "unexpected password message after authentication",
                )),
                FrontendMsg::Other(tag) => Err(End::fatal(
                    "08P01",
                    format!("unexpected message type '{}' (walrelay serves the replication protocol's simple queries only)", tag.escape_ascii()),
                )),
            };
            if let Err(end) = r {
                return end;
            }
        }
    }

    async fn query(&mut self, q: &str) -> Result<(), End> {
        let cmd = match replcmd::parse(q) {
            Ok(c) => c,
            Err(replcmd::ReplCmdError::Unsupported(_)) if super::tunnel::hands_over(q) => {
                return match super::tunnel::hand_over(
                    self.ds,
                    self.reader,
                    self.writer,
                    self.standby,
                    q,
                    self.chan,
                )
                .await
                {
                    Ok(end) => {
                        self.chan_open = false;
                        Err(end)
                    }
                    Err(refused) => self.error(refused).await,
                };
            }
            Err(e) => {
                let mut out = BytesMut::new();
                match e {
                    // PostgreSQL 15+ hands a query with no replication keyword to SQL, which a
                    // physical connection refuses: also an empty one.
                    replcmd::ReplCmdError::Empty => encode::error_response(
                        &mut out,
                        &ErrorFields::error(
                            "0A000",
                            "cannot execute SQL commands in WAL sender for physical replication",
                        ),
                    ),
                    replcmd::ReplCmdError::Unsupported(_) => encode::error_response(
                        &mut out,
                        &ErrorFields::error("0A000", e.to_string()),
                    ),
                    _ => encode::error_response(
                        &mut out,
                        &ErrorFields::error("42601", e.to_string()),
                    ),
                }
                encode::ready_for_query(&mut out);
                return self.write(&out).await;
            }
        };
        debug!(command = %q.trim(), "replication command");
        match cmd {
            ReplCommand::IdentifySystem => self.identify_system().await,
            ReplCommand::TimelineHistory(tli) => self.timeline_history(tli).await,
            ReplCommand::Show(name) => self.show(name).await,
            ReplCommand::StartReplication {
                slot,
                start,
                timeline,
            } => {
                self.entry.set_slot(slot.as_deref());
                self.reported = false;
                streamer::stream(self, slot, start, timeline).await
            }
            other => self.relay(other).await,
        }
    }

    /// SHOW: the primary's answer; while the link is down, [`offline_setting`]'s.
    async fn show(&mut self, name: String) -> Result<(), End> {
        let down = self.ds.spooler.link.borrow().is_none();
        if down {
            let seg = self.ds.spooler.view.borrow().files.seg;
            let mode = self.ds.spooler.data_directory_mode();
            if let Some(value) = offline_setting(&name, seg, mode) {
                let mut out = BytesMut::new();
                results::show(&mut out, &name, &value);
                encode::ready_for_query(&mut out);
                return self.write(&out).await;
            }
        }
        self.relay(ReplCommand::Show(name)).await
    }

    async fn identify_system(&mut self) -> Result<(), End> {
        let (system, tli, pos) = self.served();
        if system == 0 {
            return self
                .error(ErrorFields::error(
                    "55000",
                    "walrelay has not received any WAL from the primary yet; the standby retries by itself",
                ))
                .await;
        }
        let mut out = BytesMut::new();
        results::identify_system(&mut out, system, tli, pos);
        encode::ready_for_query(&mut out);
        self.write(&out).await
    }

    async fn timeline_history(&mut self, tli: walrelay_wal::lsn::TimeLineId) -> Result<(), End> {
        let name = history_file_name(tli);
        let files = self.ds.spooler.view.borrow().files.clone();
        match files.history(tli) {
            Some(content) => {
                let mut out = BytesMut::new();
                results::timeline_history(&mut out, &name, &content);
                encode::ready_for_query(&mut out);
                self.write(&out).await
            }
            None => {
                self.error(ErrorFields::error(
                    "58P01",
                    format!("could not open file \"pg_wal/{name}\": No such file or directory"),
                ))
                .await
            }
        }
    }

    /// A command the primary answers, through the standby's own connection.
    async fn relay(&mut self, cmd: ReplCommand) -> Result<(), End> {
        // What is pending is old: an answer that came after an earlier command timed out
        // belongs to that command, and the link's state is looked at here and now.
        while self.events.try_recv().is_ok() {}
        if self.ds.spooler.link.borrow().is_none() {
            return self
                .error(ErrorFields::error(
                    "08006",
                    format!("walrelay cannot reach the primary for {}: the link to the upstream is down; try again", cmd.to_sql()),
                ))
                .await;
        }
        let relayed = link::command_to_proto(&cmd);
        if relayed.encoded_len() > MAX_CONTROL_ITEM {
            return self
                .error(ErrorFields::error(
                    "54000",
                    format!(
                        "walrelay passes on commands of at most {MAX_CONTROL_ITEM} bytes, and this \
                         one takes {}: {} was not sent to the primary",
                        relayed.encoded_len(),
                        walrelay_pgwire::clip(&cmd.to_sql(), 80)
                    ),
                ))
                .await;
        }
        self.ds.spooler.command(self.chan, relayed);
        let answer = tokio::time::timeout(COMMAND_TIMEOUT, async {
            loop {
                match self.events.recv().await {
                    Some(ChanEvent::Backend(b)) => return Some(b),
                    Some(ChanEvent::LinkDown) | None => return None,
                    Some(ChanEvent::Started { .. }) => continue,
                }
            }
        })
        .await;
        let why = match answer {
            Ok(Some(b)) => {
                if matches!(&cmd, ReplCommand::Show(n) if n == "data_directory_mode") {
                    if let Some(mode) = shown_mode(&b) {
                        self.ds.spooler.saw_data_directory_mode(mode);
                    }
                }
                return self.write(&b).await;
            }
            Ok(None) => "the link to the upstream went down".to_string(),
            Err(_) => format!(
                "it did not come within {} s (the primary, or the upstream's connection to it, \
                 is slow or stuck)",
                COMMAND_TIMEOUT.as_secs()
            ),
        };
        self.error(ErrorFields::error(
            "08006",
            format!("walrelay: the primary's answer did not arrive: {why}; try again"),
        ))
        .await
    }
}

/// What `SHOW name` answers while the link is down: the settings a replication client reads
/// before it streams, which cannot change while the primary runs. `wal_segment_size`
/// (pg_receivewal) as PostgreSQL shows it; `data_directory_mode` (pg_receivewal and
/// pg_basebackup, on every connection: `GetConnection`) as the primary last showed it, else
/// `0700`, PostgreSQL's default: the client then creates its files owner-only, as for a
/// primary without group access. None for any other setting (the primary must answer).
fn offline_setting(name: &str, seg: WalSegSize, dir_mode: Option<String>) -> Option<String> {
    match name {
        "wal_segment_size" => Some(seg.shown()),
        "data_directory_mode" => Some(dir_mode.unwrap_or_else(|| "0700".into())),
        _ => None,
    }
}

/// The mode in the primary's answer `b` to `SHOW data_directory_mode` (an octal number such as
/// `0750`), if it holds one.
fn shown_mode(b: &[u8]) -> Option<String> {
    let mut buf = BytesMut::from(b);
    while let Ok(Some(m)) = walrelay_pgwire::parse_tagged(&mut buf, |_| b.len()) {
        if m.tag != b'D' {
            continue;
        }
        let v = m.data_row().ok()?.first().copied().flatten()?;
        let octal = !v.is_empty() && v.len() <= 5 && v.iter().all(|c| (b'0'..=b'7').contains(c));
        return octal.then(|| String::from_utf8_lossy(v).into_owned());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_a_client_reads_before_streaming_are_answered_while_the_link_is_down() {
        let seg = WalSegSize::DEFAULT;
        let show = |n: &str| offline_setting(n, seg, None);
        assert_eq!(show("wal_segment_size").as_deref(), Some("16MB"));
        let gib = WalSegSize::new(1 << 30).unwrap();
        assert_eq!(
            offline_setting("wal_segment_size", gib, None).as_deref(),
            Some("1GB"),
            "as PostgreSQL shows it"
        );
        // pg_receivewal's and pg_basebackup's GetConnection ask it before anything else.
        assert_eq!(show("data_directory_mode").as_deref(), Some("0700"));
        assert_eq!(
            offline_setting("data_directory_mode", seg, Some("0750".into())).as_deref(),
            Some("0750"),
            "as the primary last showed it"
        );
        assert_eq!(show("max_connections"), None, "the primary's to answer");
    }

    #[test]
    fn the_primarys_data_directory_mode_is_read_from_its_answer() {
        let answer = |v: &str| {
            let mut b = BytesMut::new();
            results::show(&mut b, "data_directory_mode", v);
            encode::ready_for_query(&mut b);
            b
        };
        assert_eq!(shown_mode(&answer("0750")).as_deref(), Some("0750"));
        assert_eq!(shown_mode(&answer("0700")).as_deref(), Some("0700"));
        assert_eq!(shown_mode(&answer("rwx")), None);
        assert_eq!(shown_mode(&answer("")), None);
        let mut refusal = BytesMut::new();
        encode::error_response(
            &mut refusal,
            &ErrorFields::error("42704", "no such setting"),
        );
        assert_eq!(shown_mode(&refusal), None);
        assert_eq!(shown_mode(b"garbage"), None);
    }
}
