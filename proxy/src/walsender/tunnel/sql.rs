//! The SQL a tunnel lets through without `downstream.allow_sql`, as pure predicates.
//!
//! - SQL sessions (no `replication`): exactly the queries of PostgreSQL 17/18's slot
//!   synchronization worker (`slotsync.c`: `validate_remote_info`, `synchronize_slots`) and
//!   the secure search path every libpqwalreceiver connection sets first.
//! - Logical replication sessions (`replication=database`): read-only statements of the kinds
//!   subscriptions run there (SELECT on the catalogs at CREATE SUBSCRIPTION and in table
//!   synchronization, `COPY ... TO STDOUT`, read-only transactions), one statement per query,
//!   calling none of the functions that change state even in a read-only transaction. The
//!   primary connection itself is read-only too (`default_transaction_read_only = on`).

/// `ALWAYS_SECURE_SEARCH_PATH_SQL` of PostgreSQL's `libpq/libpq-be-fe-helpers`/walreceiver.
const SECURE_SEARCH_PATH: &str = "SELECT pg_catalog.set_config('search_path', '', false)";
/// `validate_remote_info` before the slot name literal.
const VALIDATE_PREFIX: &str = "SELECT pg_is_in_recovery(), count(*) = 1 FROM pg_catalog.pg_replication_slots WHERE slot_type='physical' AND slot_name=";
/// `synchronize_slots` after its column list.
const SYNC_SUFFIX: &str = " FROM pg_catalog.pg_replication_slots WHERE failover and NOT temporary";
/// Columns `synchronize_slots` selects in PostgreSQL 17 and 18.
const SYNC_COLUMNS: &[&str] = &[
    "slot_name",
    "plugin",
    "confirmed_flush_lsn",
    "restart_lsn",
    "catalog_xmin",
    "two_phase",
    "two_phase_at",
    "failover",
    "database",
    "conflict_reason",
    "invalidation_reason",
];
/// Functions (or prefixes of them) that change state, refused in logical sessions.
const STATEFUL_FUNCTIONS: &[&str] = &[
    "set_config",
    "pg_terminate_backend",
    "pg_cancel_backend",
    "pg_drop_replication_slot",
    "pg_create_",
    "pg_copy_",
    "pg_replication_origin",
    "pg_replication_slot_advance",
    "pg_logical_slot_",
    "pg_logical_emit_message",
    "pg_sync_replication_slots",
    "pg_reload_conf",
    "pg_promote",
    "pg_switch_wal",
    "pg_rotate_logfile",
    "pg_log_backend_memory_contexts",
    "pg_read_file",
    "pg_read_binary_file",
    "pg_ls_",
    "pg_stat_file",
    "pg_stat_reset",
    "pg_advisory",
    "pg_try_advisory",
    "pg_notify",
    "pg_log_",
    "pg_file_",
    // These run the SQL text they are given: the words of that text are not seen here.
    "query_to_xml",
    "cursor_to_xml",
    "ts_stat",
    "pg_backup_",
    "pg_wal_replay_",
    "pg_sleep",
    "lo_",
    "dblink",
    "nextval",
    "setval",
];

/// Whitespace runs collapsed to one space, trimmed, one trailing `;` dropped.
fn normalize(text: &str) -> String {
    let t = text.split_whitespace().collect::<Vec<_>>().join(" ");
    t.strip_suffix(';').unwrap_or(&t).trim_end().to_string()
}

/// One SQL string literal as `quote_literal_cstr` writes it: `'...'` with `''`, or `E'...'`
/// with `\\` as well.
fn is_literal(s: &str) -> bool {
    let body = match s.strip_prefix("E'").or_else(|| s.strip_prefix('\'')) {
        Some(b) => b,
        None => return false,
    };
    let Some(inner) = body.strip_suffix('\'') else {
        return false;
    };
    let escaped_backslashes = s.starts_with('E');
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' if chars.peek() == Some(&'\'') => {
                chars.next();
            }
            '\'' => return false,
            '\\' if escaped_backslashes && chars.peek() == Some(&'\\') => {
                chars.next();
            }
            '\\' if escaped_backslashes => return false,
            _ => {}
        }
    }
    true
}

/// A query of slot synchronization (see the module docs).
pub fn is_slot_sync_query(text: &str) -> bool {
    let q = normalize(text);
    if q == SECURE_SEARCH_PATH {
        return true;
    }
    if let Some(lit) = q.strip_prefix(VALIDATE_PREFIX) {
        return is_literal(lit);
    }
    if let Some(cols) = q
        .strip_prefix("SELECT ")
        .and_then(|r| r.strip_suffix(SYNC_SUFFIX))
    {
        return cols.split(',').all(|c| SYNC_COLUMNS.contains(&c.trim()));
    }
    false
}

/// Whether `text` is one statement whose words this module can read: no `;` before its end
/// outside string literals and quoted identifiers, and nothing a simple scan could misread
/// where one starts or ends: comments, dollar quotes (any `$` outside a string), backslashes
/// anywhere (escape strings `E'\''`, and every string once `standard_conforming_strings` is
/// off), Unicode escapes (`U&'…'`, `U&"…"`, which also spell identifiers the word checks would
/// not see), NUL bytes and unterminated quotes. The subscriptions' and slot synchronization's
/// queries use none of these.
fn is_one_plain_statement(text: &str) -> bool {
    let t = text.trim_end();
    let b = t.strip_suffix(';').unwrap_or(t).as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            q @ (b'\'' | b'"') => {
                // A literal or quoted identifier; the quote doubled stands for itself.
                i += 1;
                loop {
                    match b.get(i) {
                        None => return false,
                        Some(&c) if c == q && b.get(i + 1) == Some(&q) => i += 2,
                        Some(&c) if c == q => break,
                        Some(b'\\' | 0) => return false,
                        Some(_) => i += 1,
                    }
                }
            }
            b';' | b'$' | b'\\' | 0 => return false,
            b'-' if b.get(i + 1) == Some(&b'-') => return false,
            b'/' if b.get(i + 1) == Some(&b'*') => return false,
            b'&' if matches!(b.get(i + 1), Some(b'\'' | b'"')) => return false,
            _ => {}
        }
        i += 1;
    }
    true
}

/// A read-only statement of the kinds subscriptions run (see the module docs).
pub fn is_read_only_statement(text: &str) -> bool {
    if normalize(text) == SECURE_SEARCH_PATH {
        return true;
    }
    if !is_one_plain_statement(text) {
        return false;
    }
    let lower = text.to_ascii_lowercase();
    // Words as PostgreSQL's scanner sees identifiers and keywords: letters, digits, `_`,
    // `$`, and any non-ASCII character (`€€copy` is one identifier, not the word COPY).
    let words: Vec<&str> = lower
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$' || !c.is_ascii()))
        .filter(|w| !w.is_empty())
        .collect();
    let norm = normalize(&lower);
    let kind_ok = match words.first().copied() {
        Some("select") => true,
        // Table synchronization's `COPY t (cols) TO STDOUT` / `COPY (SELECT ...) TO STDOUT`:
        // to the client only, never to or from a server file, and a query inside only a
        // SELECT (`COPY (DELETE ... RETURNING *) TO STDOUT` writes).
        Some("copy") => {
            let query = norm
                .strip_prefix("copy")
                .is_some_and(|rest| rest.trim_start().starts_with('('));
            norm.ends_with(" to stdout")
                && words.get(1) != Some(&"to")
                && (!query || words.get(1) == Some(&"select"))
        }
        // The last transaction mode counts (`READ ONLY READ WRITE` is read-write): none may
        // say WRITE.
        Some("begin") | Some("start") => words.contains(&"only") && !words.contains(&"write"),
        Some("commit") | Some("rollback") | Some("end") | Some("abort") => {
            matches!(words[1..], [] | ["work"] | ["transaction"])
        }
        _ => false,
    };
    kind_ok
        && !words
            .iter()
            .any(|w| STATEFUL_FUNCTIONS.iter().any(|f| w.starts_with(f)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_sync_queries_of_17_and_18_pass() {
        for q in [
            "SELECT pg_catalog.set_config('search_path', '', false);",
            "SELECT pg_is_in_recovery(), count(*) = 1 FROM pg_catalog.pg_replication_slots WHERE slot_type='physical' AND slot_name='sb1_slot'",
            "SELECT pg_is_in_recovery(), count(*) = 1 FROM pg_catalog.pg_replication_slots WHERE slot_type='physical' AND slot_name=E'a''b\\\\c'",
            "SELECT slot_name, plugin, confirmed_flush_lsn, restart_lsn, catalog_xmin, two_phase, failover, database, conflict_reason FROM pg_catalog.pg_replication_slots WHERE failover and NOT temporary",
            "SELECT slot_name, plugin, confirmed_flush_lsn, restart_lsn, catalog_xmin, two_phase, failover, database, invalidation_reason FROM pg_catalog.pg_replication_slots WHERE failover and NOT temporary",
            "SELECT slot_name, plugin, confirmed_flush_lsn, restart_lsn, catalog_xmin, two_phase, two_phase_at, failover, database, invalidation_reason FROM pg_catalog.pg_replication_slots WHERE failover and NOT temporary",
        ] {
            assert!(is_slot_sync_query(q), "{q}");
        }
    }

    #[test]
    fn other_sql_is_not_slot_sync() {
        for q in [
            "SELECT 1",
            "SELECT pg_is_in_recovery(), count(*) = 1 FROM pg_catalog.pg_replication_slots WHERE slot_type='physical' AND slot_name='x' OR pg_terminate_backend(1)",
            "SELECT pg_is_in_recovery(), count(*) = 1 FROM pg_catalog.pg_replication_slots WHERE slot_type='physical' AND slot_name='x'; DROP TABLE t",
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_catalog.pg_replication_slots WHERE failover and NOT temporary",
            "SELECT pg_catalog.set_config('search_path', 'evil', false)",
            "DELETE FROM t",
        ] {
            assert!(!is_slot_sync_query(q), "{q}");
        }
    }

    /// Text around the words the checks look for: non-ASCII letters are part of an
    /// identifier (as PostgreSQL scans them), and no input makes the checks panic (a slice
    /// inside a character did, for `€€copy …`).
    #[test]
    fn non_ascii_text_is_refused_without_a_panic() {
        for q in [
            "€€copy t to stdout",
            "«€copy (select 1) to stdout",
            "äselect 1",
            "select€ 1",
        ] {
            assert!(!is_read_only_statement(q), "{q}");
            assert!(!is_slot_sync_query(q), "{q}");
        }
        assert!(is_read_only_statement("SELECT 'é€' FROM t"));
    }

    proptest::proptest! {
        #[test]
        fn any_text_is_judged_without_a_panic(q in "\\PC{0,80}", pre in "(copy|select|begin|commit|COPY \\(|)") {
            let text = format!("{pre}{q}");
            let _ = is_read_only_statement(&text);
            let _ = is_slot_sync_query(&text);
        }
    }

    #[test]
    fn read_only_statements_of_subscriptions_pass() {
        for q in [
            "SELECT DISTINCT t.schemaname, t.tablename \nFROM pg_catalog.pg_publication_tables t\n WHERE t.pubname IN ('pub')",
            "SELECT t.pubname FROM\n pg_catalog.pg_publication t WHERE\n t.pubname IN ('pub')",
            "BEGIN READ ONLY ISOLATION LEVEL REPEATABLE READ",
            "COPY public.items (id, v) TO STDOUT",
            "COPY (SELECT id, v FROM public.items WHERE (id > 1)) TO STDOUT",
            "COMMIT",
            "rollback work",
            "START TRANSACTION READ ONLY",
            "COPY ( SELECT 1 ) TO STDOUT",
            "SELECT pg_catalog.set_config('search_path', '', false);",
            "SELECT 'it''s; fine', \"a\"\"b;\" FROM t;",
        ] {
            assert!(is_read_only_statement(q), "{q}");
        }
    }

    #[test]
    fn writes_and_state_changes_are_not_read_only() {
        for q in [
            "DELETE FROM t",
            "SET default_transaction_read_only = off",
            "BEGIN READ WRITE",
            "BEGIN",
            "SELECT 1; DROP TABLE t",
            "SELECT pg_catalog.set_config('default_transaction_read_only', 'off', false)",
            "SELECT pg_drop_replication_slot('s')",
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity",
            "SELECT 1 -- ' ; drop table t",
            "COPY t FROM STDIN",
            "COPY (SELECT ' to stdout') TO '/tmp/x'",
            // What a scan that only toggles on quotes misreads (PostgreSQL sees two
            // statements, or a function these checks do not see by name).
            "SELECT E'\\''; SET default_transaction_read_only = off; --'",
            "SELECT $a$'$a$; CREATE TABLE t(x int); --'",
            "SELECT 1 AS \"a'b\"; DROP TABLE t; --'",
            "SELECT U&\"pg\\005fdrop_replication_slot\"('s')",
            "SELECT U&\"pg!005fdrop_replication_slot\" UESCAPE '!' ('s')",
            "SELECT 'a' /* ' */; DROP TABLE t",
            "SELECT query_to_xml('SELECT pg_'||'terminate_backend(1)', true, true, '')",
            "SELECT pg_try_advisory_lock(1)",
            "SELECT 'unterminated",
            // The last transaction mode counts, whatever the white space before it.
            "BEGIN READ ONLY READ  WRITE",
            "START TRANSACTION READ ONLY READ\nWRITE",
            "COPY (DELETE FROM t RETURNING *) TO STDOUT",
            "COPY ( UPDATE t SET x = 1 RETURNING x ) TO STDOUT",
            "COMMIT PREPARED '-'",
            "ROLLBACK PREPARED '-'",
            "SELECT \"unterminated",
            "WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d",
            "SELECT nextval('s')",
        ] {
            assert!(!is_read_only_statement(q), "{q}");
        }
    }
}
