//! What a command on a connection the downstream tunnels to the primary is, for its
//! allowlist: every replication command of `repl_gram.y` by its keyword and the few tokens
//! that decide whether it may pass (slot names, TEMPORARY, PHYSICAL/LOGICAL), or SQL. The
//! primary parses the rest; nothing here is re-rendered.

use super::{clip, describe, ident, syntax, Lexer, ReplCmdError, Tok};

/// A command as the tunnel's allowlist sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TunnelCmd {
    IdentifySystem,
    Show,
    TimelineHistory,
    ReadReplicationSlot,
    StartPhysical {
        slot: Option<String>,
    },
    StartLogical {
        slot: String,
    },
    BaseBackup,
    UploadManifest,
    CreateSlot {
        slot: String,
        temporary: bool,
        logical: bool,
    },
    DropSlot {
        slot: String,
    },
    AlterSlot {
        slot: String,
    },
    /// Not a replication command: SQL (PostgreSQL runs it only on `replication=database`
    /// connections and ordinary sessions).
    Sql,
}

/// Classifies the text of a simple Query. `Err(Empty)` for an empty query.
pub fn classify(text: &str) -> Result<TunnelCmd, ReplCmdError> {
    let mut lx = Lexer::new(text);
    let keyword = match lx.next() {
        Ok(None) => return Err(ReplCmdError::Empty),
        Ok(Some(Tok::Semicolon)) if matches!(lx.next(), Ok(None)) => {
            return Err(ReplCmdError::Empty)
        }
        // `repl_scanner.l` matches its keywords as written, in capitals: `show x; ...` is SQL
        // to the primary, so it must be SQL here too (the allowlist checks SQL, not SHOW).
        Ok(Some(Tok::Word(w))) => w.to_string(),
        // Anything else starts no replication command: the scanner hands it to SQL.
        _ => return Ok(TunnelCmd::Sql),
    };
    Ok(match keyword.as_str() {
        "IDENTIFY_SYSTEM" => TunnelCmd::IdentifySystem,
        "SHOW" => TunnelCmd::Show,
        "TIMELINE_HISTORY" => TunnelCmd::TimelineHistory,
        "READ_REPLICATION_SLOT" => TunnelCmd::ReadReplicationSlot,
        "BASE_BACKUP" => TunnelCmd::BaseBackup,
        "UPLOAD_MANIFEST" => TunnelCmd::UploadManifest,
        "START_REPLICATION" => start(&mut lx)?,
        "CREATE_REPLICATION_SLOT" => create(&mut lx)?,
        "DROP_REPLICATION_SLOT" => TunnelCmd::DropSlot {
            slot: ident(&mut lx, "a slot name after DROP_REPLICATION_SLOT")?,
        },
        "ALTER_REPLICATION_SLOT" => TunnelCmd::AlterSlot {
            slot: ident(&mut lx, "a slot name after ALTER_REPLICATION_SLOT")?,
        },
        _ => TunnelCmd::Sql,
    })
}

/// `START_REPLICATION [SLOT name] [LOGICAL | PHYSICAL] ...`
fn start(lx: &mut Lexer<'_>) -> Result<TunnelCmd, ReplCmdError> {
    let slot = match lx.eat_keyword("SLOT")? {
        true => Some(ident(lx, "a slot name after SLOT")?),
        false => None,
    };
    if lx.eat_keyword("LOGICAL")? {
        return match slot {
            Some(slot) => Ok(TunnelCmd::StartLogical { slot }),
            None => Err(syntax("START_REPLICATION ... LOGICAL needs SLOT name")),
        };
    }
    Ok(TunnelCmd::StartPhysical { slot })
}

/// `CREATE_REPLICATION_SLOT name [TEMPORARY] { PHYSICAL | LOGICAL plugin } ...`
fn create(lx: &mut Lexer<'_>) -> Result<TunnelCmd, ReplCmdError> {
    let slot = ident(lx, "a slot name after CREATE_REPLICATION_SLOT")?;
    let temporary = lx.eat_keyword("TEMPORARY")?;
    let logical = if lx.eat_keyword("LOGICAL")? {
        true
    } else if lx.eat_keyword("PHYSICAL")? {
        false
    } else {
        let next = lx.next()?;
        return Err(syntax(format!(
            "CREATE_REPLICATION_SLOT {} needs PHYSICAL or LOGICAL, found {}",
            clip(&slot),
            describe(next.as_ref())
        )));
    };
    Ok(TunnelCmd::CreateSlot {
        slot,
        temporary,
        logical,
    })
}

#[cfg(test)]
mod tests {
    use super::super::pg_model::pg_keyword;
    use super::*;

    #[test]
    fn the_commands_clients_send_are_classified() {
        let c = |s| classify(s).unwrap();
        assert_eq!(c("IDENTIFY_SYSTEM"), TunnelCmd::IdentifySystem);
        assert_eq!(c("SHOW wal_segment_size"), TunnelCmd::Show);
        assert_eq!(
            c("BASE_BACKUP ( LABEL 'pg_basebackup base backup', PROGRESS, CHECKPOINT 'fast', WAIT false, MANIFEST 'yes', TARGET 'client')"),
            TunnelCmd::BaseBackup
        );
        assert_eq!(
            c("CREATE_REPLICATION_SLOT \"pg_basebackup_4242\" TEMPORARY PHYSICAL ( RESERVE_WAL)"),
            TunnelCmd::CreateSlot {
                slot: "pg_basebackup_4242".into(),
                temporary: true,
                logical: false
            }
        );
        assert_eq!(
            c("CREATE_REPLICATION_SLOT \"sub\" LOGICAL pgoutput (SNAPSHOT 'nothing')"),
            TunnelCmd::CreateSlot {
                slot: "sub".into(),
                temporary: false,
                logical: true
            }
        );
        assert_eq!(
            c("START_REPLICATION SLOT \"sub\" LOGICAL 0/0 (proto_version '4', publication_names '\"pub\"')"),
            TunnelCmd::StartLogical { slot: "sub".into() }
        );
        assert_eq!(
            c("START_REPLICATION SLOT \"pg_basebackup_1\" 0/3000000 TIMELINE 1"),
            TunnelCmd::StartPhysical {
                slot: Some("pg_basebackup_1".into())
            }
        );
        assert_eq!(
            c("DROP_REPLICATION_SLOT s1 WAIT"),
            TunnelCmd::DropSlot { slot: "s1".into() }
        );
        assert_eq!(
            c("ALTER_REPLICATION_SLOT s1 ( FAILOVER true )"),
            TunnelCmd::AlterSlot { slot: "s1".into() }
        );
        assert_eq!(c("SELECT 1"), TunnelCmd::Sql);
        assert_eq!(c("(SELECT 1)"), TunnelCmd::Sql);
        // Keywords count in capitals only, as PostgreSQL's scanner reads them.
        assert_eq!(
            c("  create_replication_slot x temporary physical"),
            TunnelCmd::Sql
        );
        assert_eq!(
            c("show x; SET default_transaction_read_only = off"),
            TunnelCmd::Sql
        );
        assert_eq!(c("Show x"), TunnelCmd::Sql);
    }

    /// `repl_scanner.l` reads bytes 0x80-0xff as letters of an identifier: a keyword followed
    /// at once by a non-ASCII character is one identifier, so the query is SQL to PostgreSQL
    /// (its allowlist applies), not the replication command it starts like.
    #[test]
    fn a_keyword_run_into_a_non_ascii_letter_is_sql() {
        for q in [
            "SHOWé x",
            "SHOW\u{85}x",
            "IDENTIFY_SYSTEMß",
            "START_REPLICATIONé SLOT s 0/0",
            "CREATE_REPLICATION_SLOTé s TEMPORARY PHYSICAL",
            "DROP_REPLICATION_SLOTü s",
            "BASE_BACKUPé",
        ] {
            assert_eq!(classify(q), Ok(TunnelCmd::Sql), "{q:?}");
        }
        assert_eq!(
            classify("DROP_REPLICATION_SLOT sé"),
            Ok(TunnelCmd::DropSlot { slot: "sé".into() })
        );
    }

    proptest::proptest! {
        /// A query is SQL to the allowlist exactly when it is SQL to PostgreSQL (or empty); a
        /// replication command may still be refused as malformed, never passed as SQL.
        #[test]
        fn sql_exactly_when_postgresql_reads_sql(
            space in "[ \t\n]{0,2}",
            word in "SHOW|IDENTIFY_SYSTEM|BASE_BACKUP|START_REPLICATION|DROP_REPLICATION_SLOT|show|SELECT|[A-Z_]{1,6}",
            next in "[ -~]|\\PC|[\u{80}-\u{10ffff}]",
            rest in "(?s).{0,12}",
        ) {
            let text = format!("{space}{word}{next}{rest}");
            let class = classify(&text);
            match pg_keyword(&text) {
                Some(_) => proptest::prop_assert!(!matches!(class, Ok(TunnelCmd::Sql)), "{text:?}: {class:?}"),
                None => proptest::prop_assert!(matches!(class, Ok(TunnelCmd::Sql) | Err(ReplCmdError::Empty)), "{text:?}: {class:?}"),
            }
        }
    }

    #[test]
    fn broken_commands_are_errors_not_sql() {
        assert_eq!(classify("   ;  "), Err(ReplCmdError::Empty));
        assert!(matches!(
            classify("CREATE_REPLICATION_SLOT"),
            Err(ReplCmdError::Syntax(_))
        ));
        assert!(matches!(
            classify("CREATE_REPLICATION_SLOT s TEMPORARY"),
            Err(ReplCmdError::Syntax(_))
        ));
        assert!(matches!(
            classify("START_REPLICATION LOGICAL 0/0"),
            Err(ReplCmdError::Syntax(_))
        ));
        assert!(matches!(
            classify("DROP_REPLICATION_SLOT \"unterminated"),
            Err(ReplCmdError::Syntax(_))
        ));
    }
}
