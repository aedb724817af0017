//! `synchronous_standby_names` as PostgreSQL reads it (`syncrep_gram.y`, `syncrep_scanner.l`,
//! `SyncRepGetCandidateStandbys`): which standbys a commit may wait for.
//!
//! ```text
//! setting      = ''                                   -- no synchronous replication
//!              | list                                 -- FIRST 1 (list), the pre-9.6 form
//!              | NUM '(' list ')'                     -- FIRST NUM (list)
//!              | FIRST NUM '(' list ')' | ANY NUM '(' list ')'
//! list         = name (',' name)*
//! name         = identifier | "double-quoted" | NUM | '*'
//! ```
//!
//! A walsender's `application_name` matches a listed name case-insensitively
//! (`pg_strcasecmp`); `*` matches every standby. Both FIRST and ANY make every listed standby a
//! candidate whose flush a commit may wait for, so the relay treats all of them alike.
//!
//! walrelay uses this to decide whether a standby's WAL may wait a few milliseconds to share a
//! link message with more WAL (see `walrelay::upstream`): never for a standby a commit may be
//! waiting on.

/// What `synchronous_standby_names` says about one standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncRole {
    /// Not listed (or the setting is empty): no commit waits for it.
    Async,
    /// Listed, or matched by `*`: a commit may wait for its flush.
    Candidate,
}

/// The setting could not be read; callers treat the standby as a candidate (the safe side).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot parse synchronous_standby_names {setting:?}: {why}")]
pub struct SyncRepParseError {
    pub setting: String,
    pub why: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Name(String),
    /// A number: the count of FIRST/ANY, or a standby's name.
    Num(String),
    Star,
    Comma,
    Open,
    Close,
}

fn tokens(s: &str) -> Result<Vec<Token>, &'static str> {
    let mut out = Vec::new();
    let mut it = s.chars().peekable();
    while let Some(&c) = it.peek() {
        match c {
            c if c.is_whitespace() => {
                it.next();
            }
            ',' | '(' | ')' | '*' => {
                it.next();
                out.push(match c {
                    ',' => Token::Comma,
                    '(' => Token::Open,
                    ')' => Token::Close,
                    _ => Token::Star,
                });
            }
            '"' => {
                it.next();
                let mut name = String::new();
                loop {
                    match it.next() {
                        Some('"') if it.peek() == Some(&'"') => {
                            it.next();
                            name.push('"');
                        }
                        Some('"') => break,
                        Some(c) => name.push(c),
                        None => return Err("unterminated quoted name"),
                    }
                }
                out.push(Token::Name(name));
            }
            _ => {
                let mut word = String::new();
                while let Some(&c) = it.peek() {
                    if c.is_alphanumeric() || c == '_' || c == '$' || c == '-' || c == '.' {
                        word.push(c);
                        it.next();
                    } else {
                        break;
                    }
                }
                if word.is_empty() {
                    return Err("unexpected character");
                }
                out.push(if word.bytes().all(|b| b.is_ascii_digit()) {
                    Token::Num(word)
                } else {
                    Token::Name(word)
                });
            }
        }
    }
    Ok(out)
}

/// The names listed (`None` stands for `*`), or an empty list for an empty setting.
fn listed(setting: &str) -> Result<Vec<Option<String>>, &'static str> {
    let toks = tokens(setting)?;
    if toks.is_empty() {
        return Ok(Vec::new());
    }
    // Strip "FIRST n (" / "ANY n (" / "n (" ... ")" around the list.
    let inner: &[Token] = match toks.as_slice() {
        [Token::Name(kw), Token::Num(_), Token::Open, rest @ .., Token::Close]
            if kw.eq_ignore_ascii_case("first") || kw.eq_ignore_ascii_case("any") =>
        {
            rest
        }
        [Token::Num(_), Token::Open, rest @ .., Token::Close] => rest,
        all => all,
    };
    let mut names = Vec::new();
    for (i, t) in inner.iter().enumerate() {
        let want_name = i % 2 == 0;
        match (want_name, t) {
            (true, Token::Name(n)) => names.push(Some(n.clone())),
            // A bare number is a valid standby name in the grammar.
            (true, Token::Num(n)) => names.push(Some(n.clone())),
            (true, Token::Star) => names.push(None),
            (false, Token::Comma) => {}
            _ => return Err("expected a list of standby names"),
        }
    }
    if inner.len() % 2 == 0 {
        return Err("the list ends with a comma or is empty");
    }
    Ok(names)
}

/// What `setting` (the primary's `synchronous_standby_names`) means for the standby named
/// `application_name`.
pub fn role(setting: &str, application_name: &str) -> Result<SyncRole, SyncRepParseError> {
    let names = listed(setting).map_err(|why| SyncRepParseError {
        setting: setting.to_string(),
        why,
    })?;
    // As syncrep.c: a name matches case-insensitively, and "*" (quoted too) matches all.
    let hit = names.iter().any(|n| match n {
        None => true,
        Some(n) => n == "*" || n.eq_ignore_ascii_case(application_name),
    });
    Ok(if hit {
        SyncRole::Candidate
    } else {
        SyncRole::Async
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str, app: &str) -> SyncRole {
        role(s, app).unwrap()
    }

    #[test]
    fn forms_of_the_setting() {
        assert_eq!(r("", "a"), SyncRole::Async);
        assert_eq!(r("   ", "a"), SyncRole::Async);
        assert_eq!(r("a", "a"), SyncRole::Candidate);
        assert_eq!(r("b", "a"), SyncRole::Async);
        assert_eq!(r("a, b", "b"), SyncRole::Candidate);
        assert_eq!(r("*", "anything"), SyncRole::Candidate);
        assert_eq!(r("FIRST 2 (a, b, c)", "c"), SyncRole::Candidate);
        assert_eq!(r("first 1 (a, b)", "x"), SyncRole::Async);
        assert_eq!(r("ANY 1 (dc2_a, dc2_b)", "DC2_B"), SyncRole::Candidate);
        assert_eq!(r("2 (a, b, c)", "a"), SyncRole::Candidate);
        assert_eq!(
            r("ANY 1 (\"Quoted Name\", b)", "quoted name"),
            SyncRole::Candidate
        );
        assert_eq!(r("\"a\"\"b\"", "a\"b"), SyncRole::Candidate);
        assert_eq!(r("ANY 1 (*)", "z"), SyncRole::Candidate);
        // A standby literally named FIRST is a list of one name.
        assert_eq!(r("first", "first"), SyncRole::Candidate);
        // A number is a name too; "*" matches all, quoted or not (syncrep.c's strcmp).
        assert_eq!(r("FIRST 1 (2, b)", "2"), SyncRole::Candidate);
        assert_eq!(r("FIRST 1 (2, b)", "3"), SyncRole::Async);
        assert_eq!(r("ANY 1 (\"*\")", "z"), SyncRole::Candidate);
    }

    #[test]
    fn unreadable_settings_are_errors() {
        for bad in ["a,", "(a)", "ANY 1 (a, b", "\"open", "a b", "ANY 1 ()", "#"] {
            assert!(role(bad, "a").is_err(), "{bad:?} should not parse");
        }
    }
}
