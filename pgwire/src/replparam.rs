//! The `replication` startup parameter, read as PostgreSQL's `ProcessStartupPacket`
//! (`src/backend/tcop/backend_startup.c`) reads it: exactly `database` (case-sensitive) asks
//! for a logical replication walsender; otherwise the value must be a boolean as
//! `parse_bool` (`src/backend/utils/adt/bool.c`) accepts one, or the connection ends with
//! FATAL 22023 before authentication.

use crate::ErrorFields;

/// What a startup packet's `replication` parameter asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// No `replication` parameter, or a false boolean: an ordinary SQL session.
    Off,
    /// A true boolean: a physical replication walsender.
    Physical,
    /// `database`: a logical replication walsender connected to a database.
    Database,
}

/// The session `value` (the parameter, if the startup packet has one) asks for, or the
/// FATAL PostgreSQL sends for a value it does not accept.
pub fn parse_replication(value: Option<&str>) -> Result<Replication, ErrorFields> {
    let Some(v) = value else {
        return Ok(Replication::Off);
    };
    if v == "database" {
        return Ok(Replication::Database);
    }
    match parse_bool(v) {
        Some(true) => Ok(Replication::Physical),
        Some(false) => Ok(Replication::Off),
        None => Err(ErrorFields::fatal(
            "22023",
            format!("invalid value for parameter \"replication\": \"{v}\""),
        )
        .with_hint("Valid values are: \"false\", 0, \"true\", 1, \"database\".")),
    }
}

/// The session a startup packet's parameters ask for: PostgreSQL checks every `replication`
/// value in order (the first it refuses ends the connection) and the last one counts.
pub fn replication_of(params: &[(String, String)]) -> Result<Replication, ErrorFields> {
    params
        .iter()
        .filter(|(k, _)| k == "replication")
        .try_fold(Replication::Off, |_, (_, v)| parse_replication(Some(v)))
}

/// A boolean as PostgreSQL's `parse_bool` reads one: `true`, `false`, `yes`, `no` or a
/// prefix of one of them, `on`, `off` or `of`, `1`, `0`; ASCII case-insensitive, nothing
/// else around it (no whitespace).
pub fn parse_bool(value: &str) -> Option<bool> {
    let v = value.as_bytes();
    // A non-empty case-insensitive prefix of `word` (at least `min` bytes long).
    let prefix_of = |word: &str, min: usize| {
        v.len() >= min
            && v.len() <= word.len()
            && word.as_bytes()[..v.len()].eq_ignore_ascii_case(v)
    };
    match v.first()?.to_ascii_lowercase() {
        b't' if prefix_of("true", 1) => Some(true),
        b'f' if prefix_of("false", 1) => Some(false),
        b'y' if prefix_of("yes", 1) => Some(true),
        b'n' if prefix_of("no", 1) => Some(false),
        // "o" alone could be either: PostgreSQL compares at least two characters.
        b'o' if prefix_of("on", 2) => Some(true),
        b'o' if prefix_of("off", 2) => Some(false),
        b'1' if v.len() == 1 => Some(true),
        b'0' if v.len() == 1 => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any value is read or refused, never a panic; a boolean is a short ASCII word read
        /// the same in any case, and a refusal quotes the value.
        #[test]
        fn any_value_is_read_or_refused(v in "\\PC{0,8}|[tTfFyYnNoO01][a-zA-Z]{0,5}") {
            match parse_replication(Some(&v)) {
                Ok(Replication::Database) => prop_assert_eq!(v.as_str(), "database"),
                Ok(_) => {
                    prop_assert!(v.is_ascii() && (1..=5).contains(&v.len()));
                    prop_assert_eq!(parse_bool(&v), parse_bool(&v.to_ascii_uppercase()));
                }
                Err(e) => {
                    let quoted = format!("\"{}\"", v);
                    prop_assert!(e.message.contains(&quoted), "{}", e.message);
                }
            }
        }
    }

    #[test]
    fn booleans_as_postgresql_reads_them() {
        for t in [
            "true", "TRUE", "t", "tr", "TrU", "yes", "y", "YE", "on", "ON", "1",
        ] {
            assert_eq!(parse_bool(t), Some(true), "{t}");
        }
        for f in [
            "false", "f", "FALS", "no", "n", "NO", "off", "of", "OFF", "0",
        ] {
            assert_eq!(parse_bool(f), Some(false), "{f}");
        }
        for bad in [
            "", "o", "O", "truex", "true ", " true", "yess", "nope", "offf", "onn", "10", "01",
            "2", "database", "maybe", "tRuE\0", "ö",
        ] {
            assert_eq!(parse_bool(bad), None, "{bad:?}");
        }
    }

    /// A packet naming `replication` twice: every value is checked, the last one counts.
    #[test]
    fn every_replication_value_is_checked_and_the_last_counts() {
        let p = |vs: &[&str]| -> Vec<(String, String)> {
            let mut p = vec![("user".to_string(), "u".to_string())];
            p.extend(
                vs.iter()
                    .map(|v| ("replication".to_string(), v.to_string())),
            );
            p
        };
        assert_eq!(replication_of(&p(&[])), Ok(Replication::Off));
        assert_eq!(
            replication_of(&p(&["true", "database"])),
            Ok(Replication::Database)
        );
        assert_eq!(replication_of(&p(&["database", "0"])), Ok(Replication::Off));
        for bad in [&["true", "bogus"][..], &["bogus", "true"][..]] {
            let e = replication_of(&p(bad)).unwrap_err();
            assert_eq!(e.code, "22023");
            assert!(e.message.contains("\"bogus\""), "{}", e.message);
        }
    }

    #[test]
    fn replication_values_as_postgresql_reads_them() {
        use Replication::*;
        assert_eq!(parse_replication(None), Ok(Off));
        for (v, want) in [
            ("true", Physical),
            ("on", Physical),
            ("1", Physical),
            ("yes", Physical),
            ("false", Off),
            ("0", Off),
            ("off", Off),
            ("database", Database),
        ] {
            assert_eq!(parse_replication(Some(v)), Ok(want), "{v}");
        }
        // "database" is compared case-sensitively, and is no boolean.
        for bad in [
            "Database", "DATABASE", "db", "", "maybe", "physical", "logical",
        ] {
            let e = parse_replication(Some(bad)).unwrap_err();
            assert_eq!(e.severity, "FATAL");
            assert_eq!(e.code, "22023");
            assert_eq!(
                e.message,
                format!("invalid value for parameter \"replication\": \"{bad}\"")
            );
            assert_eq!(
                e.hint.as_deref(),
                Some("Valid values are: \"false\", 0, \"true\", 1, \"database\".")
            );
        }
    }
}
