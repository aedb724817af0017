//! Just enough PromQL for checking the expressions walrelay ships (the Grafana dashboard's,
//! the README's) against its exposition: which metrics an expression reads, whether inside a
//! range function, by which labels it selects and groups, and what a division's operands
//! keep as labels.

use std::collections::BTreeSet;

/// Labels Prometheus adds to every scraped series.
pub const TARGET_LABELS: &[&str] = &["instance", "job"];

/// Functions that need a counter (a gauge's rate means nothing, a counter's value little).
const RANGE_FUNCTIONS: &[&str] = &["rate", "irate", "increase"];
/// Aggregations: their `(` may come after a `by (...)`.
const AGGREGATIONS: &[&str] = &[
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
/// Words followed by a list of labels.
const LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
const KEYWORDS: &[&str] = &["bool", "and", "or", "unless", "offset"];

/// A metric an expression reads.
#[derive(Debug)]
pub struct MetricRef {
    pub name: String,
    /// Inside rate(), irate() or increase().
    pub in_range_function: bool,
    /// The labels its selector `{...}` matches on.
    pub selected: Vec<String>,
}

/// What [`parse`] finds.
#[derive(Debug, Default)]
pub struct Parsed {
    pub refs: Vec<MetricRef>,
    /// The labels of every `by`, `without`, `on`, `ignoring`, `group_left/right` list.
    pub grouped: Vec<String>,
}

/// The index just past the delimited run starting at `b[i]` (a string, `[...]`, `{...}`,
/// `(...)`), stepping over quoted strings.
fn skip(b: &[u8], mut i: usize, close: u8) -> usize {
    let open = b[i];
    i += 1;
    while i < b.len() && b[i] != close {
        if b[i] == b'"' && open != b'"' {
            i = skip(b, i, b'"');
            continue;
        }
        i += 1 + usize::from(open == b'"' && b[i] == b'\\');
    }
    i + 1
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

/// The label names of the list or selector from `b[i]` to its closing `close`.
fn label_names(expr: &str, i: usize, close: u8) -> (Vec<String>, usize) {
    let end = skip(expr.as_bytes(), i, close);
    let inner = &expr[i + 1..end - 1];
    let mut names = Vec::new();
    let mut rest = inner;
    while let Some(start) = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_') {
        rest = &rest[start..];
        let len = rest.find(|c: char| !is_word(c as u8)).unwrap_or(rest.len());
        names.push(rest[..len].to_string());
        // Past the matcher's value, if any.
        rest = &rest[len..];
        if let Some(q) = rest.find('"').filter(|_| close == b'}') {
            let after = skip(rest.as_bytes(), q, b'"');
            rest = &rest[after.min(rest.len())..];
        }
    }
    (names, end)
}

/// The metrics, selectors and label lists of `expr`.
pub fn parse(expr: &str) -> Parsed {
    let b = expr.as_bytes();
    let mut out = Parsed::default();
    let mut stack: Vec<String> = Vec::new();
    let mut pending: Option<String> = None;
    let mut ref_end = None; // where the last metric's name ended
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => i = skip(b, i, b'"'),
            b'[' => i = skip(b, i, b']'),
            b'{' => {
                let (names, end) = label_names(expr, i, b'}');
                let attached = ref_end.is_some_and(|e: usize| expr[e..i].trim().is_empty());
                if let (true, Some(r)) = (attached, out.refs.last_mut()) {
                    r.selected.extend(names);
                }
                i = end;
            }
            b'(' => {
                stack.push(pending.take().unwrap_or_default());
                i += 1;
            }
            b')' => {
                stack.pop();
                i += 1;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < b.len() && is_word(b[i]) {
                    i += 1;
                }
                let word = &expr[start..i];
                let next = expr[i..].trim_start();
                if LISTS.contains(&word) {
                    if next.starts_with('(') {
                        let (names, end) = label_names(expr, b.len() - next.len(), b')');
                        out.grouped.extend(names);
                        i = end;
                    }
                } else if AGGREGATIONS.contains(&word) || next.starts_with('(') {
                    pending = Some(word.to_string());
                } else if !KEYWORDS.contains(&word) {
                    out.refs.push(MetricRef {
                        name: word.to_string(),
                        in_range_function: stack
                            .iter()
                            .any(|f| RANGE_FUNCTIONS.contains(&f.as_str())),
                        selected: Vec::new(),
                    });
                    ref_end = Some(i);
                }
            }
            c if c.is_ascii_digit() => {
                while i < b.len() && (is_word(b[i]) || b[i] == b'.') {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    out
}

/// A division at the top level of an expression.
#[derive(Debug)]
pub struct Division<'a> {
    pub left: &'a str,
    pub right: &'a str,
    /// `on (...)`: only these labels are matched.
    pub on: Option<Vec<String>>,
    /// `ignoring (...)`: these labels are not.
    pub ignoring: Vec<String>,
}

/// The top-level `/` of `expr`, if any, with its matching clause.
pub fn division(expr: &str) -> Option<Division<'_>> {
    let b = expr.as_bytes();
    let (mut i, mut depth) = (0, 0);
    let at = loop {
        match *b.get(i)? {
            b'"' => i = skip(b, i, b'"'),
            b'[' => i = skip(b, i, b']'),
            b'{' => i = skip(b, i, b'}'),
            b'(' => (depth, i) = (depth + 1, i + 1),
            b')' => (depth, i) = (depth - 1, i + 1),
            b'/' if depth == 0 => break i,
            _ => i += 1,
        }
    };
    let mut d = Division {
        left: expr[..at].trim(),
        right: expr[at + 1..].trim(),
        on: None,
        ignoring: Vec::new(),
    };
    loop {
        let word: String = d.right.chars().take_while(|c| is_word(*c as u8)).collect();
        let rest = d.right[word.len()..].trim_start();
        if !LISTS.contains(&word.as_str()) {
            return Some(d);
        }
        let (names, end) = match rest.starts_with('(') {
            true => label_names(rest, 0, b')'),
            false => (Vec::new(), 0),
        };
        match word.as_str() {
            "on" => d.on = Some(names),
            "ignoring" => d.ignoring = names,
            _ => {}
        }
        d.right = rest[end..].trim_start();
    }
}

/// The labels of the series an operand yields: an aggregation's `by` list (or its input's
/// labels less its `without` list), else its one metric's labels with the target's.
pub fn result_labels(
    operand: &str,
    labels_of: &dyn Fn(&str) -> BTreeSet<String>,
) -> BTreeSet<String> {
    let p = parse(operand);
    let word: String = operand.chars().take_while(|c| is_word(*c as u8)).collect();
    let inputs = || -> BTreeSet<String> {
        let mut all: BTreeSet<String> = TARGET_LABELS.iter().map(|l| l.to_string()).collect();
        for r in &p.refs {
            all.extend(labels_of(&r.name));
        }
        all
    };
    if !AGGREGATIONS.contains(&word.as_str()) {
        return inputs();
    }
    // The outermost aggregation's list: the first list word at depth 0 or right after it.
    let lists = |kw: &str| -> Option<Vec<String>> {
        let idx = operand
            .find(&format!(" {kw} "))
            .or_else(|| operand.find(&format!(" {kw}(")))?;
        let open = idx + operand[idx..].find('(')?;
        Some(label_names(operand, open, b')').0)
    };
    match (lists("by"), lists("without")) {
        (Some(by), _) => by.into_iter().collect(),
        (None, Some(without)) => inputs()
            .into_iter()
            .filter(|l| !without.contains(l))
            .collect(),
        (None, None) => BTreeSet::new(),
    }
}
