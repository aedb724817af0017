//! What a tunnelled client may send to the primary: a pure allowlist over its protocol
//! messages. Everything refused is answered by the downstream and never reaches the primary.
//!
//! | session | passes | refused unless |
//! |---|---|---|
//! | physical (`replication=true`) | replication commands, temporary slots | slot create/drop/alter: `allow_slot_commands`; SQL: never |
//! | logical (`replication=database`) | replication commands, temporary slots, read-only statements ([`super::sql`]) | slot create/drop/alter: `allow_slot_commands`; other SQL: `allow_sql` |
//! | SQL (no `replication`) | the queries of slot synchronization ([`super::sql`]) | other SQL: `allow_sql` |
//!
//! Only the simple query protocol passes (what walreceivers, pg_basebackup, subscriptions
//! and the slot-sync worker use), plus COPY data and Terminate; the extended query protocol
//! needs `allow_sql`.

use walrelay_pgwire::replcmd::{classify, ReplCmdError, TunnelCmd};
use walrelay_pgwire::{clip, ErrorFields};

use super::sql;

/// What kind of session a tunnel carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Physical,
    Logical,
    Sql,
}

impl Mode {
    /// The `replication` startup parameter of the primary connection.
    pub fn replication(self) -> &'static str {
        match self {
            Mode::Physical => "true",
            Mode::Logical => "database",
            Mode::Sql => "",
        }
    }
}

/// The downstream's allowlist for one session.
#[derive(Debug, Clone)]
pub struct Policy {
    pub mode: Mode,
    pub allow_slot_commands: bool,
    pub allow_sql: bool,
    /// Temporary slots this session created on the primary (see `watch`): the only ones a
    /// physical START_REPLICATION may name without `allow_slot_commands`.
    pub temp_slots: Vec<String>,
}

const EXTENDED: &[u8] = b"PBDECF";

/// What a message that passes asks of the primary, as far as the tunnel needs to know.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Passed {
    /// The temporary slot it creates (`CREATE_REPLICATION_SLOT ... TEMPORARY` on a replication
    /// session), which the tunnel watches the primary confirm.
    pub temp_slot: Option<String>,
}

/// Most temporary slots remembered per session (pg_basebackup makes one).
const MAX_TEMP_SLOTS: usize = 16;

impl Policy {
    /// The primary created temporary slot `slot` for this session (see `watch`).
    pub fn temp_slot_created(&mut self, slot: String) {
        if self.temp_slots.len() < MAX_TEMP_SLOTS {
            self.temp_slots.push(slot);
        }
    }

    /// Whether a client message (tag and body) may go to the primary.
    pub fn check(&self, tag: u8, body: &[u8]) -> Result<Passed, ErrorFields> {
        match tag {
            b'Q' => {
                let text = body.strip_suffix(b"\0").unwrap_or(body);
                let text = std::str::from_utf8(text).map_err(|_| {
                    ErrorFields::error("22021", "walrelay: the query is not valid UTF-8")
                })?;
                self.query(text)
            }
            b'd' | b'c' | b'f' | b'X' | b'S' | b'H' => Ok(Passed::default()),
            t if EXTENDED.contains(&t) && self.allow_sql && self.mode != Mode::Physical => {
                Ok(Passed::default())
            }
            t if EXTENDED.contains(&t) => Err(ErrorFields::error(
                "0A000",
                format!("walrelay relays the simple query protocol only (message '{}' is part of the extended protocol)", t as char),
            )
            .with_hint("set downstream.allow_sql = true on the downstream to let any SQL through")),
            t => Err(ErrorFields::fatal(
                "08P01",
                format!("unexpected message type '{}' on a tunnelled session", t.escape_ascii()),
            )),
        }
    }

    /// Whether the text of a simple Query may go to the primary.
    pub fn query(&self, text: &str) -> Result<Passed, ErrorFields> {
        let cmd = match classify(text) {
            Ok(c) => c,
            Err(ReplCmdError::Empty) => return Ok(Passed::default()),
            Err(e) if self.mode == Mode::Sql => {
                // Not a replication command at all in an SQL session: judged as SQL below.
                let _ = e;
                TunnelCmd::Sql
            }
            Err(e) => return Err(ErrorFields::error("42601", e.to_string())),
        };
        let checked = match cmd {
            TunnelCmd::Sql => self.sql(text),
            _ if self.mode == Mode::Sql => self.sql(text),
            TunnelCmd::CreateSlot {
                temporary: true,
                slot,
                ..
            } => {
                return Ok(Passed {
                    temp_slot: Some(slot),
                })
            }
            TunnelCmd::CreateSlot { slot, .. } => self.slot_command("create", &slot),
            // Streaming on a permanent slot moves it where the client says it flushed: another
            // client's (a backup tool's, a standby's of the primary) would lose its WAL.
            TunnelCmd::StartPhysical { slot: Some(slot) } if !self.temp_slots.contains(&slot) => {
                self.slot_command("stream from", &slot)
            }
            TunnelCmd::DropSlot { slot } => self.slot_command("drop", &slot),
            TunnelCmd::AlterSlot { slot } => self.slot_command("alter", &slot),
            _ => Ok(()),
        };
        checked.map(|()| Passed::default())
    }

    fn slot_command(&self, what: &str, slot: &str) -> Result<(), ErrorFields> {
        if self.allow_slot_commands {
            return Ok(());
        }
        Err(ErrorFields::error(
            "42501",
            format!(
                "walrelay does not {what} replication slot \"{}\" on the primary: downstream.allow_slot_commands is off",
                clip(slot, 63)
            ),
        )
        .with_hint(format!(
            "{what} the slot on the primary yourself (for a subscription: CREATE SUBSCRIPTION ... WITH (create_slot = false, slot_name = '...')), or set downstream.allow_slot_commands = true"
        )))
    }

    fn sql(&self, text: &str) -> Result<(), ErrorFields> {
        if self.mode == Mode::Physical {
            return Err(ErrorFields::error(
                "0A000",
                "cannot execute SQL commands in WAL sender for physical replication",
            ));
        }
        if self.allow_sql {
            return Ok(());
        }
        let allowed = match self.mode {
            Mode::Logical => sql::is_read_only_statement(text),
            _ => sql::is_slot_sync_query(text),
        };
        if allowed {
            return Ok(());
        }
        let what = match self.mode {
            Mode::Logical => "the read-only statements a subscription runs (SELECT, COPY ... TO STDOUT, read-only transactions)",
            _ => "the read-only queries of slot synchronization (sync_replication_slots)",
        };
        Err(ErrorFields::error(
            "42501",
            format!("walrelay refused this statement: it lets only {what} through to the primary, and downstream.allow_sql is off: {}", clip(text.trim(), 200)),
        )
        .with_hint("connect to the primary directly, or set downstream.allow_sql = true on the downstream"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(mode: Mode, slots: bool, sql: bool) -> Policy {
        Policy {
            mode,
            allow_slot_commands: slots,
            allow_sql: sql,
            temp_slots: vec!["pg_basebackup_77".into()],
        }
    }

    fn q(text: &str) -> Vec<u8> {
        let mut b = text.as_bytes().to_vec();
        b.push(0);
        b
    }

    #[test]
    fn base_backups_and_temporary_slots_pass_by_default() {
        let pol = p(Mode::Physical, false, false);
        for ok in [
            "BASE_BACKUP ( LABEL 'x', PROGRESS, CHECKPOINT 'fast', WAIT false, MANIFEST 'yes')",
            "CREATE_REPLICATION_SLOT \"pg_basebackup_77\" TEMPORARY PHYSICAL ( RESERVE_WAL)",
            "START_REPLICATION SLOT \"pg_basebackup_77\" 0/2000000 TIMELINE 1",
            "IDENTIFY_SYSTEM",
            "SHOW data_directory_mode",
            "",
        ] {
            assert!(pol.check(b'Q', &q(ok)).is_ok(), "{ok}");
        }
        for tag in [b'X', b'd', b'c', b'f'] {
            assert!(pol.check(tag, b"").is_ok());
        }
        let created = |text: &str, p: &Policy| p.check(b'Q', &q(text)).unwrap().temp_slot;
        let temp = "CREATE_REPLICATION_SLOT \"pg_basebackup_78\" TEMPORARY PHYSICAL ( RESERVE_WAL)";
        assert_eq!(created(temp, &pol).as_deref(), Some("pg_basebackup_78"));
        assert_eq!(created("IDENTIFY_SYSTEM", &pol), None);
        // SQL to an SQL session's primary, which creates no slot.
        assert_eq!(created(temp, &p(Mode::Sql, false, true)), None);
    }

    #[test]
    fn slot_commands_need_the_key_and_say_so() {
        for mode in [Mode::Physical, Mode::Logical] {
            let off = p(mode, false, false);
            for cmd in [
                "START_REPLICATION SLOT \"someone_elses\" PHYSICAL 0/2000000",
                "CREATE_REPLICATION_SLOT \"sub\" LOGICAL pgoutput (SNAPSHOT 'nothing')",
                "CREATE_REPLICATION_SLOT s PHYSICAL",
                "DROP_REPLICATION_SLOT \"sub\" WAIT",
                "ALTER_REPLICATION_SLOT sub ( FAILOVER true )",
            ] {
                let e = off.check(b'Q', &q(cmd)).unwrap_err();
                assert!(e.message.contains("allow_slot_commands"), "{}", e.message);
                assert!(p(mode, true, false).check(b'Q', &q(cmd)).is_ok());
            }
        }
    }

    #[test]
    fn sql_depends_on_the_session() {
        let select = q("SELECT pg_catalog.set_config('search_path', '', false);");
        assert!(p(Mode::Physical, true, true).check(b'Q', &select).is_err());
        assert!(p(Mode::Logical, false, false).check(b'Q', &select).is_ok());
        assert!(p(Mode::Sql, false, false).check(b'Q', &select).is_ok());
        let write = q("DELETE FROM accounts");
        let e = p(Mode::Logical, false, false)
            .check(b'Q', &write)
            .unwrap_err();
        assert!(e.message.contains("allow_sql"), "{}", e.message);
        assert!(p(Mode::Sql, false, false).check(b'Q', &write).is_err());
        assert!(p(Mode::Sql, false, true).check(b'Q', &write).is_ok());
        // An SQL session runs no replication commands unless allow_sql lets everything pass.
        assert!(p(Mode::Sql, true, false)
            .check(b'Q', &q("DROP_REPLICATION_SLOT x"))
            .is_err());
    }

    #[test]
    fn the_extended_protocol_needs_allow_sql() {
        assert!(p(Mode::Sql, false, false).check(b'P', b"").is_err());
        assert!(p(Mode::Sql, false, true).check(b'P', b"").is_ok());
        assert!(p(Mode::Physical, true, true).check(b'B', b"").is_err());
        assert!(p(Mode::Sql, true, true).check(b'p', b"pw").is_err());
        assert!(p(Mode::Logical, false, false)
            .check(b'Q', b"\xff\0")
            .is_err());
    }
}
