//! Replication commands from a standby's Query messages.
//!
//! Properties: no panic on any text; every accepted command renders (`to_sql`) to text that
//! parses back to the same command; a command `parse` serves is classified (for a tunnel's
//! allowlist) as neither SQL nor a slot command; `classify` says SQL (or empty) exactly when
//! PostgreSQL's replication scanner does not see a replication keyword first ([`pg_keyword`]);
//! the scanner of a tunnel's backend stream finds the same tags whatever the chunking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use walrelay_pgwire::replcmd;

fuzz_target!(|data: &[u8]| {
    let sql = String::from_utf8_lossy(data);
    let class = replcmd::classify(&sql);
    match pg_keyword(&sql) {
        Some(kw) => assert!(
            !matches!(class, Ok(replcmd::TunnelCmd::Sql)),
            "{sql:?} starts with {kw} to PostgreSQL, classified as SQL"
        ),
        None => assert!(
            matches!(
                class,
                Ok(replcmd::TunnelCmd::Sql) | Err(replcmd::ReplCmdError::Empty)
            ),
            "{sql:?} is SQL to PostgreSQL, classified as {class:?}"
        ),
    }
    scan_any_chunking(data);
    match replcmd::parse(&sql) {
        Ok(cmd) => {
            assert!(
                !matches!(
                    class,
                    Ok(replcmd::TunnelCmd::Sql
                        | replcmd::TunnelCmd::CreateSlot { .. }
                        | replcmd::TunnelCmd::DropSlot { .. }
                        | replcmd::TunnelCmd::AlterSlot { .. })
                ),
                "{cmd:?} classified as {class:?}"
            );
            let text = cmd.to_sql();
            assert_eq!(
                replcmd::parse(&text),
                Ok(cmd.clone()),
                "to_sql of {cmd:?} is {text:?}, which does not parse back"
            );
        }
        Err(e) => {
            // The error text goes into an ErrorResponse: it must render, and stay bounded.
            let msg = e.to_string();
            assert!(
                msg.len() <= 4 * replcmd::MAX_COMMAND_LEN + 1024,
                "error message of {} bytes",
                msg.len()
            );
        }
    }
});

/// The keyword that makes `text` a replication command to PostgreSQL, if any: its first token
/// as `repl_scanner.l` reads it (after `[ \t\n\r\f\v]*`, the longest run of
/// `[A-Za-z\200-\377_][A-Za-z\200-\377_0-9$]*`), if that is one of the keywords
/// `replication_scanner_is_replication_command` takes.
fn pg_keyword(text: &str) -> Option<&str> {
    const KEYWORDS: [&str; 10] = [
        "IDENTIFY_SYSTEM",
        "BASE_BACKUP",
        "START_REPLICATION",
        "CREATE_REPLICATION_SLOT",
        "DROP_REPLICATION_SLOT",
        "ALTER_REPLICATION_SLOT",
        "READ_REPLICATION_SLOT",
        "TIMELINE_HISTORY",
        "UPLOAD_MANIFEST",
        "SHOW",
    ];
    let text = text.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let start = |b: u8| b.is_ascii_alphabetic() || b == b'_' || b >= 0x80;
    let len = match text.bytes().next() {
        Some(b) if start(b) => text
            .bytes()
            .take_while(|&b| start(b) || b.is_ascii_digit() || b == b'$')
            .count(),
        _ => return None,
    };
    let word = text.get(..len)?;
    KEYWORDS.contains(&word).then_some(word)
}

fn scan_any_chunking(data: &[u8]) {
    use walrelay_pgwire::scan::Scanner;
    let mut whole = Vec::new();
    let r1 = Scanner::default().feed(data, |t| whole.push(t));
    let cut = data.first().map_or(0, |&b| usize::from(b)).min(data.len());
    let mut parts = Vec::new();
    let mut sc = Scanner::default();
    let r2 = sc
        .feed(&data[..cut], |t| parts.push(t))
        .and_then(|_| sc.feed(&data[cut..], |t| parts.push(t)));
    if r1.is_ok() && r2.is_ok() {
        assert_eq!(whole, parts, "tags depend on the chunking (cut at {cut})");
    }
}
