//! Replication commands a physical standby may send to walrelay's walsender, parsed from the
//! text of a simple `Query` message on a `replication=true` connection.
//!
//! # Grammar (a subset of PostgreSQL's `repl_gram.y`)
//!
//! ```text
//! IDENTIFY_SYSTEM
//! SHOW name                                   name = ident { "." ident }
//! TIMELINE_HISTORY n                          n = decimal u32 > 0
//! START_REPLICATION [SLOT ident] [PHYSICAL] X/X [TIMELINE n]
//! READ_REPLICATION_SLOT ident
//! ```
//!
//! Each command may be followed by one `;`. Keywords are in capitals, as `repl_scanner.l` matches
//! them (`identify_system` is SQL to PostgreSQL, refused on a physical connection); tokens are separated by
//! any of space, `\t`, `\n`, `\r`, `\v`, `\f`. Identifiers are either plain,
//! `[A-Za-z_\x80-\xff][A-Za-z0-9_$\x80-\xff]*` (bytes: any non-ASCII character counts as a
//! letter), their ASCII letters folded to lower case like PostgreSQL's `repl_scanner.l` does, or
//! double-quoted with `""` standing for `"`, kept as written. An LSN is `hex/hex` with no spaces
//! (`0/3000000`); like the flex scanner, `abc/1` lexes as an LSN, not an identifier.
//!
//! Slot names are limited to 63 bytes (NAMEDATALEN-1); `SHOW` names are lower-cased and may
//! contain only `[a-z0-9_.]`. Keywords are recognised by position, so `SLOT slot` names a slot
//! "slot"; [`ReplCommand::to_sql`] always quotes slot names, so the primary sees them unambiguously.
//!
//! `START_REPLICATION ... LOGICAL`, `BASE_BACKUP`, the slot-management commands and any SQL are
//! refused by [`parse`] with [`ReplCmdError::Unsupported`]: the downstream does not serve them
//! from its spool. [`classify`] sorts every command (and SQL) for the downstream's tunnel
//! allowlist instead.

use walrelay_wal::lsn::{Lsn, TimeLineId};

mod classify;
pub use classify::{classify, TunnelCmd};

/// Longest command text accepted, in bytes.
pub const MAX_COMMAND_LEN: usize = 8192;
/// Longest identifier (slot name, `SHOW` name component), in bytes: NAMEDATALEN-1.
pub const MAX_IDENT_LEN: usize = 63;
/// The `Unsupported` payload for logical replication.
pub const LOGICAL_REPLICATION: &str = "START_REPLICATION ... LOGICAL";

/// Replication commands that walrelay answers or relays to the primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplCommand {
    IdentifySystem,
    /// Parameter name, lower-cased; only `[a-z0-9_.]`.
    Show(String),
    TimelineHistory(TimeLineId),
    /// Physical replication only.
    StartReplication {
        slot: Option<String>,
        start: Lsn,
        timeline: Option<TimeLineId>,
    },
    ReadReplicationSlot(String),
}

/// Why a command was refused. `Display` is suitable as the message of an `ErrorResponse`.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ReplCmdError {
    /// A command walrelay does not relay; holds the command keyword(s), upper-cased.
    #[error("{}", unsupported_message(.0))]
    Unsupported(String),
    #[error("syntax error in replication command: {0}")]
    Syntax(String),
    /// Only whitespace (and possibly a `;`): SQL to PostgreSQL 15+, which a physical walsender refuses.
    #[error(
        "empty replication command: expected IDENTIFY_SYSTEM, SHOW, TIMELINE_HISTORY, \
         START_REPLICATION or READ_REPLICATION_SLOT"
    )]
    Empty,
}

/// PostgreSQL replication commands that exist but are not relayed.
const KNOWN_UNRELAYED: &[&str] = &[
    "BASE_BACKUP",
    "CREATE_REPLICATION_SLOT",
    "DROP_REPLICATION_SLOT",
    "ALTER_REPLICATION_SLOT",
    "UPLOAD_MANIFEST",
];

/// Keywords of PostgreSQL's replication grammar (all versions since 10); identifiers equal to one
/// of these are quoted when rendered.
const PG_KEYWORDS: &[&str] = &[
    "ALTER_REPLICATION_SLOT",
    "BASE_BACKUP",
    "CREATE_REPLICATION_SLOT",
    "DROP_REPLICATION_SLOT",
    "EXPORT_SNAPSHOT",
    "FAST",
    "IDENTIFY_SYSTEM",
    "LABEL",
    "LOGICAL",
    "MANIFEST",
    "MANIFEST_CHECKSUMS",
    "MAX_RATE",
    "NOEXPORT_SNAPSHOT",
    "NOWAIT",
    "PHYSICAL",
    "PROGRESS",
    "READ_REPLICATION_SLOT",
    "RESERVE_WAL",
    "SHOW",
    "SLOT",
    "START_REPLICATION",
    "TABLESPACE_MAP",
    "TEMPORARY",
    "TIMELINE",
    "TIMELINE_HISTORY",
    "TWO_PHASE",
    "UPLOAD_MANIFEST",
    "USE_SNAPSHOT",
    "WAIT",
    "WAL",
];

fn unsupported_message(what: &str) -> String {
    if what == LOGICAL_REPLICATION {
        "walrelay relays physical replication only: START_REPLICATION ... LOGICAL \
         (logical decoding) must connect to the primary directly"
            .to_string()
    } else if KNOWN_UNRELAYED.contains(&what) {
        format!("walrelay does not relay {what}: run it on the primary directly")
    } else {
        format!(
            "walrelay does not relay {what}: a physical replication connection to walrelay \
             accepts only IDENTIFY_SYSTEM, SHOW, TIMELINE_HISTORY, START_REPLICATION and \
             READ_REPLICATION_SLOT; run it on the primary directly"
        )
    }
}

fn syntax(msg: impl Into<String>) -> ReplCmdError {
    ReplCmdError::Syntax(msg.into())
}

/// Truncates peer-supplied text quoted in an error message.
fn clip(s: &str) -> String {
    crate::clip(s, MAX_IDENT_LEN)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok<'a> {
    /// Plain identifier or keyword, as written.
    Word(&'a str),
    /// Double-quoted identifier, unescaped.
    Quoted(String),
    /// `hex/hex`.
    Lsn(&'a str),
    /// Decimal digits.
    Number(&'a str),
    Dot,
    Semicolon,
}

fn describe(tok: Option<&Tok<'_>>) -> String {
    match tok {
        None => "the end of the command".to_string(),
        Some(Tok::Word(w)) => format!("{:?}", clip(w)),
        Some(Tok::Quoted(q)) => format!("quoted identifier {:?}", clip(q)),
        Some(Tok::Lsn(l)) => format!("LSN {}", clip(l)),
        Some(Tok::Number(n)) => format!("number {}", clip(n)),
        Some(Tok::Dot) => "\".\"".to_string(),
        Some(Tok::Semicolon) => "\";\"".to_string(),
    }
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// `ident_start` of `repl_scanner.l`: `[A-Za-z\200-\377_]`. Bytes from 0x80 up (every byte
/// of a non-ASCII character) belong to identifiers, so `SHOWé` is one identifier there, not the
/// keyword SHOW followed by something: SQL to PostgreSQL, and so to [`classify`] too.
fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b >= 0x80
}

/// `ident_cont` of `repl_scanner.l`: `[A-Za-z\200-\377_0-9\$]`.
fn is_ident_cont(b: u8) -> bool {
    is_ident_start(b) || b.is_ascii_digit() || b == b'$'
}

/// On-demand lexer with one token of look-ahead, so that an unsupported command is reported as
/// such even when the rest of it (SQL, option lists) is not lexable here.
struct Lexer<'a> {
    src: &'a str,
    pos: usize,
    peeked: Option<Option<Tok<'a>>>,
}

impl<'a> Lexer<'a> {
    fn new(src: &'a str) -> Self {
        Lexer {
            src,
            pos: 0,
            peeked: None,
        }
    }

    fn next(&mut self) -> Result<Option<Tok<'a>>, ReplCmdError> {
        match self.peeked.take() {
            Some(t) => Ok(t),
            None => self.lex(),
        }
    }

    fn peek(&mut self) -> Result<Option<&Tok<'a>>, ReplCmdError> {
        if self.peeked.is_none() {
            self.peeked = Some(self.lex()?);
        }
        Ok(self.peeked.as_ref().and_then(|t| t.as_ref()))
    }

    /// Consumes the next token if it is the keyword `kw` (in capitals, as `repl_scanner.l`
    /// matches keywords; other spellings are identifiers there).
    fn eat_keyword(&mut self, kw: &str) -> Result<bool, ReplCmdError> {
        let hit = matches!(self.peek()?, Some(Tok::Word(w)) if *w == kw);
        if hit {
            self.peeked = None;
        }
        Ok(hit)
    }

    fn byte(&self, i: usize) -> Option<u8> {
        self.src.as_bytes().get(i).copied()
    }

    /// Length of the run of bytes from `i` satisfying `f`.
    fn run(&self, i: usize, f: impl Fn(u8) -> bool) -> usize {
        self.src
            .as_bytes()
            .get(i..)
            .map_or(0, |rest| rest.iter().take_while(|&&b| f(b)).count())
    }

    fn take(&mut self, len: usize) -> &'a str {
        let start = self.pos;
        self.pos += len;
        self.src.get(start..self.pos).unwrap_or_default()
    }

    fn lex(&mut self) -> Result<Option<Tok<'a>>, ReplCmdError> {
        self.pos += self.run(self.pos, is_space);
        let Some(b) = self.byte(self.pos) else {
            return Ok(None);
        };
        // `hex+ / hex+` wins over identifiers and numbers (longest match, as in flex).
        let hi = self.run(self.pos, |b| b.is_ascii_hexdigit());
        if hi > 0 && self.byte(self.pos + hi) == Some(b'/') {
            let lo = self.run(self.pos + hi + 1, |b| b.is_ascii_hexdigit());
            if lo > 0 {
                return Ok(Some(Tok::Lsn(self.take(hi + 1 + lo))));
            }
        }
        if b.is_ascii_digit() {
            let n = self.run(self.pos, |b| b.is_ascii_digit());
            return Ok(Some(Tok::Number(self.take(n))));
        }
        if is_ident_start(b) {
            let n = self.run(self.pos, is_ident_cont);
            return Ok(Some(Tok::Word(self.take(n))));
        }
        match b {
            b'"' => self.lex_quoted().map(|q| Some(Tok::Quoted(q))),
            b'.' => {
                self.pos += 1;
                Ok(Some(Tok::Dot))
            }
            b';' => {
                self.pos += 1;
                Ok(Some(Tok::Semicolon))
            }
            _ => {
                let c = self.src.get(self.pos..).and_then(|s| s.chars().next());
                Err(syntax(format!(
                    "unexpected character {:?}",
                    c.unwrap_or('?')
                )))
            }
        }
    }

    /// Lexes `"..."` with `""` escapes, starting at the opening quote.
    fn lex_quoted(&mut self) -> Result<String, ReplCmdError> {
        let mut out = String::new();
        let mut i = self.pos + 1;
        loop {
            let n = self.run(i, |b| b != b'"' && b != 0);
            out.push_str(self.src.get(i..i + n).unwrap_or_default());
            i += n;
            match (self.byte(i), self.byte(i + 1)) {
                (Some(b'"'), Some(b'"')) => {
                    out.push('"');
                    i += 2;
                }
                (Some(b'"'), _) => break,
                (Some(_), _) => return Err(syntax("NUL character in quoted identifier")),
                (None, _) => return Err(syntax("unterminated quoted identifier")),
            }
        }
        self.pos = i + 1;
        if out.is_empty() {
            return Err(syntax("zero-length quoted identifier \"\""));
        }
        Ok(out)
    }
}

/// Parses the text of a replication command.
pub fn parse(sql: &str) -> Result<ReplCommand, ReplCmdError> {
    if sql.len() > MAX_COMMAND_LEN {
        return Err(syntax(format!(
            "the command is {} bytes, more than the {MAX_COMMAND_LEN} accepted",
            sql.len()
        )));
    }
    let mut lx = Lexer::new(sql);
    let keyword = match lx.next()? {
        None => return Err(ReplCmdError::Empty),
        Some(Tok::Semicolon) if lx.next()?.is_none() => return Err(ReplCmdError::Empty),
        Some(Tok::Word(w)) => w.to_string(),
        other => {
            return Err(syntax(format!(
                "expected a command keyword such as IDENTIFY_SYSTEM or START_REPLICATION, found {}",
                describe(other.as_ref())
            )))
        }
    };
    let cmd = match keyword.as_str() {
        "IDENTIFY_SYSTEM" => ReplCommand::IdentifySystem,
        "SHOW" => ReplCommand::Show(show_name(&mut lx)?),
        "TIMELINE_HISTORY" => ReplCommand::TimelineHistory(timeline(&mut lx, "TIMELINE_HISTORY")?),
        "START_REPLICATION" => start_replication(&mut lx)?,
        "READ_REPLICATION_SLOT" => {
            ReplCommand::ReadReplicationSlot(slot_name(&mut lx, "READ_REPLICATION_SLOT")?)
        }
        _ => return Err(ReplCmdError::Unsupported(clip(&keyword))),
    };
    if matches!(lx.peek()?, Some(Tok::Semicolon)) {
        lx.next()?;
    }
    match lx.next()? {
        None => Ok(cmd),
        other => Err(syntax(format!(
            "unexpected {} after a complete {keyword} command",
            describe(other.as_ref())
        ))),
    }
}

/// `[SLOT ident] [PHYSICAL] X/X [TIMELINE n]`, after START_REPLICATION.
fn start_replication(lx: &mut Lexer<'_>) -> Result<ReplCommand, ReplCmdError> {
    let slot = if lx.eat_keyword("SLOT")? {
        Some(slot_name(lx, "SLOT")?)
    } else {
        None
    };
    if lx.eat_keyword("LOGICAL")? {
        return Err(ReplCmdError::Unsupported(LOGICAL_REPLICATION.to_string()));
    }
    lx.eat_keyword("PHYSICAL")?;
    let start = match lx.next()? {
        Some(Tok::Lsn(s)) => s.parse::<Lsn>().map_err(|e| syntax(e.to_string()))?,
        other => {
            return Err(syntax(format!(
                "START_REPLICATION needs the start position as an LSN like 0/3000000, found {}",
                describe(other.as_ref())
            )))
        }
    };
    let timeline = if lx.eat_keyword("TIMELINE")? {
        Some(timeline(lx, "TIMELINE")?)
    } else {
        None
    };
    Ok(ReplCommand::StartReplication {
        slot,
        start,
        timeline,
    })
}

/// A timeline id after `after`: decimal, 1..=u32::MAX.
fn timeline(lx: &mut Lexer<'_>, after: &str) -> Result<TimeLineId, ReplCmdError> {
    match lx.next()? {
        Some(Tok::Number(n)) => match n.parse::<u32>() {
            Ok(0) => Err(syntax(format!(
                "invalid timeline 0 after {after}: timelines start at 1"
            ))),
            Ok(t) => Ok(TimeLineId(t)),
            Err(_) => Err(syntax(format!(
                "timeline {} after {after} is out of range (at most {})",
                clip(n),
                u32::MAX
            ))),
        },
        other => Err(syntax(format!(
            "{after} needs a timeline number, found {}",
            describe(other.as_ref())
        ))),
    }
}

/// One identifier: plain ones folded to lower case, quoted ones as written.
fn ident(lx: &mut Lexer<'_>, what: &str) -> Result<String, ReplCmdError> {
    let name = match lx.next()? {
        Some(Tok::Word(w)) => w.to_ascii_lowercase(),
        Some(Tok::Quoted(q)) => q,
        other => {
            return Err(syntax(format!(
                "expected {what}, found {}",
                describe(other.as_ref())
            )))
        }
    };
    if name.len() > MAX_IDENT_LEN {
        return Err(syntax(format!(
            "{what} {:?} is {} bytes long, more than the {MAX_IDENT_LEN} PostgreSQL allows",
            clip(&name),
            name.len()
        )));
    }
    Ok(name)
}

fn slot_name(lx: &mut Lexer<'_>, after: &str) -> Result<String, ReplCmdError> {
    ident(lx, &format!("a slot name after {after}"))
}

/// `ident { "." ident }`, lower-cased, only `[a-z0-9_.]`.
fn show_name(lx: &mut Lexer<'_>) -> Result<String, ReplCmdError> {
    const WHAT: &str = "a parameter name after SHOW";
    let mut name = ident(lx, WHAT)?;
    while matches!(lx.peek()?, Some(Tok::Dot)) {
        lx.next()?;
        name.push('.');
        name.push_str(&ident(lx, WHAT)?);
    }
    let name = name.to_ascii_lowercase();
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'.')
    {
        return Err(syntax(format!(
            "invalid parameter name {:?} after SHOW: only letters, digits, '_' and '.' are allowed",
            clip(&name)
        )));
    }
    // A quoted part may itself contain dots ("a..b".c): every dot-separated component must
    // still be a non-empty name of at most 63 bytes, or the name could not be rendered back
    // unambiguously (and names no parameter anyway).
    if name
        .split('.')
        .any(|p| p.is_empty() || p.len() > MAX_IDENT_LEN)
    {
        return Err(syntax(format!(
            "invalid parameter name {:?} after SHOW: each dot-separated part must have 1 to {MAX_IDENT_LEN} characters",
            clip(&name)
        )));
    }
    Ok(name)
}

/// Renders `s` as a double-quoted identifier, doubling embedded `"`.
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// A `SHOW` name component that PostgreSQL reads back unchanged without quotes.
fn is_plain_ident(s: &str) -> bool {
    s.as_bytes()
        .first()
        .is_some_and(|&b| b.is_ascii_lowercase() || b == b'_')
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'$')
        && !PG_KEYWORDS.iter().any(|k| k.eq_ignore_ascii_case(s))
}

fn render_show_name(name: &str) -> String {
    let parts: Vec<&str> = name.split('.').collect();
    if parts
        .iter()
        .all(|p| !p.is_empty() && p.len() <= MAX_IDENT_LEN)
    {
        parts
            .iter()
            .map(|p| {
                if is_plain_ident(p) {
                    p.to_string()
                } else {
                    quote_ident(p)
                }
            })
            .collect::<Vec<_>>()
            .join(".")
    } else {
        quote_ident(name)
    }
}

impl ReplCommand {
    /// Renders the command for the primary, in the form PostgreSQL's own clients send it
    /// (`START_REPLICATION SLOT "s1" 0/3000000 TIMELINE 1`). Slot names are always quoted.
    /// `parse(&cmd.to_sql()) == Ok(cmd)` for every command `parse` can return.
    pub fn to_sql(&self) -> String {
        match self {
            ReplCommand::IdentifySystem => "IDENTIFY_SYSTEM".to_string(),
            ReplCommand::Show(name) => format!("SHOW {}", render_show_name(name)),
            ReplCommand::TimelineHistory(tli) => format!("TIMELINE_HISTORY {}", tli.0),
            ReplCommand::StartReplication {
                slot,
                start,
                timeline,
            } => {
                let mut sql = "START_REPLICATION".to_string();
                if let Some(slot) = slot {
                    sql.push_str(" SLOT ");
                    sql.push_str(&quote_ident(slot));
                }
                sql.push(' ');
                sql.push_str(&start.to_string());
                if let Some(tli) = timeline {
                    sql.push_str(&format!(" TIMELINE {}", tli.0));
                }
                sql
            }
            ReplCommand::ReadReplicationSlot(slot) => {
                format!("READ_REPLICATION_SLOT {}", quote_ident(slot))
            }
        }
    }
}

#[cfg(test)]
mod pg_model;
#[cfg(test)]
mod tests;
