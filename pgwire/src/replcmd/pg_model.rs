//! A model of PostgreSQL's own rule for what is a replication command, shared by the
//! allowlist's property test (`classify.rs`) and the `replcmd` fuzz target (which includes
//! this file by path): test code only, never built into the library.

/// The keyword that makes `text` a replication command to PostgreSQL, if any: its first token
/// as `repl_scanner.l` reads it (after `[ \t\n\r\f\v]*`, the longest run of
/// `[A-Za-z\200-\377_][A-Za-z\200-\377_0-9$]*`), if that is one of the keywords
/// `replication_scanner_is_replication_command` takes.
pub fn pg_keyword(text: &str) -> Option<&str> {
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
