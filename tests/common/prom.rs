//! Parsers for the metrics tests: the Prometheus text exposition format 0.0.4 (strict) and
//! the metric names of a PromQL expression.

use std::collections::{BTreeMap, BTreeSet};

/// One sample of the exposition: name, labels, value.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

fn is_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

/// Parses the text format 0.0.4 strictly: every line is `# HELP name text`, `# TYPE name
/// type`, or `name{label="value",...} value`; a family's TYPE precedes its samples.
pub fn parse_exposition(text: &str) -> Vec<Sample> {
    let mut typed = BTreeSet::new();
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            assert!(is_name(name), "bad HELP line {line:?}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE line");
            assert!(is_name(name), "bad TYPE line {line:?}");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "bad TYPE {line:?}"
            );
            assert!(typed.insert(name.to_string()), "family {name} typed twice");
            continue;
        }
        assert!(!line.starts_with('#'), "unexpected comment {line:?}");
        let (name, rest) = match line.find(['{', ' ']) {
            Some(i) => line.split_at(i),
            None => panic!("no value on {line:?}"),
        };
        assert!(is_name(name), "bad metric name in {line:?}");
        assert!(typed.contains(name), "{name} has no TYPE before it");
        let mut labels = BTreeMap::new();
        let mut rest = rest;
        if let Some(r) = rest.strip_prefix('{') {
            let mut chars = r.char_indices().peekable();
            let end = loop {
                let Some((i, c)) = chars.next() else {
                    panic!("unterminated labels in {line:?}")
                };
                if c == '}' {
                    break i;
                }
                let start = i;
                let mut key_end = i;
                while let Some(&(j, c)) = chars.peek() {
                    if c == '=' {
                        key_end = j;
                        break;
                    }
                    chars.next();
                }
                let key = &r[start..key_end];
                assert!(is_name(key), "bad label name {key:?} in {line:?}");
                assert_eq!(chars.next().map(|x| x.1), Some('='), "{line:?}");
                assert_eq!(chars.next().map(|x| x.1), Some('"'), "{line:?}");
                let mut value = String::new();
                loop {
                    match chars.next().map(|x| x.1) {
                        Some('\\') => match chars.next().map(|x| x.1) {
                            Some('\\') => value.push('\\'),
                            Some('"') => value.push('"'),
                            Some('n') => value.push('\n'),
                            other => panic!("bad escape {other:?} in {line:?}"),
                        },
                        Some('"') => break,
                        Some(c) => value.push(c),
                        None => panic!("unterminated label value in {line:?}"),
                    }
                }
                assert!(labels.insert(key.to_string(), value).is_none(), "{line:?}");
                if chars.peek().map(|x| x.1) == Some(',') {
                    chars.next();
                }
            };
            rest = &r[end + 1..];
        }
        let value = rest.strip_prefix(' ').expect("one space before the value");
        let value: f64 = match value {
            "NaN" => f64::NAN,
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value {v:?} in {line:?}")),
        };
        out.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    out
}

/// Metric names in a PromQL expression: identifiers outside label matchers (`{...}`), range
/// selectors (`[...]`), strings and `by`/`without`/`on`/`ignoring` lists, that are neither
/// functions (followed by `(`), aggregation operators nor keywords.
pub fn promql_metric_names(expr: &str) -> BTreeSet<String> {
    const KEYWORDS: &[&str] = &[
        "bool",
        "and",
        "or",
        "unless",
        "offset",
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    ];
    const LISTS: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let b = expr.as_bytes();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let mut skip_list = false; // the next '(' opens a label list
                               // Skips from an opening delimiter to its closing one, stepping over quoted strings.
    let skip = |mut i: usize, close: u8| {
        i += 1;
        while i < b.len() && b[i] != close {
            if b[i] == b'"' && close != b'"' {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += 1 + usize::from(b[i] == b'\\');
                }
            }
            i += 1;
        }
        i + 1
    };
    while i < b.len() {
        match b[i] {
            b'{' => i = skip(i, b'}'),
            b'[' => i = skip(i, b']'),
            b'"' => i = skip(i, b'"'),
            b'(' if skip_list => {
                i = skip(i, b')');
                skip_list = false;
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c == b':' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':')
                {
                    i += 1;
                }
                let word = &expr[start..i];
                let next = expr[i..].trim_start().chars().next();
                if LISTS.contains(&word) {
                    skip_list = true;
                } else if next != Some('(') && !KEYWORDS.contains(&word) {
                    names.insert(word.to_string());
                }
            }
            _ => i += 1,
        }
    }
    names
}
