//! README.md's reference tables and the Grafana dashboard against the code, with no cluster:
//! every key of "Configuration reference" is a key of the parser, with the stated default and
//! range; every metric of "Monitoring" is exported with the stated type, labels and label
//! values; every PromQL expression (the dashboard's and the README's) uses exported metrics
//! as their types allow (rate() and increase() on counters only, never on gauges), selects
//! and groups by labels they carry, and divides operands whose labels match.
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use walrelay::config::Config;
use walrelay::metrics::Metrics;
use walrelay::monitor::{expo, Half, ProcessStats, SlotState};
use walrelay_wal::lsn::Lsn;

use common::promql;

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap()
}

/// The cells of each row of the README table whose header row is `header`.
fn table(readme: &str, header: &str) -> Vec<Vec<String>> {
    let start = readme
        .find(header)
        .unwrap_or_else(|| panic!("README.md has no table {header:?}"));
    readme[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            // (No cell the checks read holds a `|`.)
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// A backticked word and the backticked words in parentheses after it: a label and its
/// values.
type Ticked = (String, Vec<String>);

/// The `backticked` words of `cell` outside parentheses, and for each the backticked words in
/// the parentheses right after it.
fn ticked(cell: &str) -> Vec<Ticked> {
    let mut out: Vec<Ticked> = Vec::new();
    let mut depth = 0;
    for (i, part) in cell.split('`').enumerate() {
        if i % 2 == 1 {
            match (depth, out.last_mut()) {
                (0, _) => out.push((part.to_string(), Vec::new())),
                (_, Some(last)) => last.1.push(part.to_string()),
                (_, None) => {}
            }
        } else {
            depth += part.matches('(').count() as i32 - part.matches(')').count() as i32;
        }
    }
    out
}

// ---- Configuration reference -------------------------------------------------------------

/// The keys of the configuration table (`downstream.tls_cert`, `tls_key` is two keys).
fn reference_keys(readme: &str) -> Vec<(String, String)> {
    let mut keys = Vec::new();
    for row in table(readme, "| key | default | meaning |") {
        let names = ticked(&row[0]);
        let section = names[0].0.split('.').next().unwrap().to_string();
        for (n, _) in names {
            let key = match n.contains('.') {
                true => n,
                false => format!("{section}.{n}"),
            };
            keys.push((key, row[1].clone()));
        }
    }
    keys
}

#[test]
fn the_configuration_reference_lists_every_key() {
    let documented: BTreeSet<String> = reference_keys(&readme())
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let parsed: BTreeSet<String> = Config::keys().map(|k| k.name.to_string()).collect();
    assert_eq!(
        documented, parsed,
        "README's configuration reference and the parser's keys differ"
    );
}

/// A configuration of both halves that resolves, as TOML, with no files.
fn base() -> toml::Table {
    toml::from_str(
        "[upstream]\nprimary = \"host=127.0.0.1 user=u\"\nlisten = \"127.0.0.1:1\"\n\
         [downstream]\nlisten = \"127.0.0.1:2\"\nupstream = \"127.0.0.1:3\"\nauth = \"trust\"\n\
         spool_dir = \"/nonexistent/spool\"\n[link]\nplaintext = true\n",
    )
    .unwrap()
}

/// `base()` with `key` set to `value`, resolved: the key the error names if it fails.
fn resolve_with(key: &str, value: i128) -> Result<(), String> {
    let mut t = base();
    let (section, name) = key.split_once('.').unwrap();
    let v = i64::try_from(value).map_or(toml::Value::Float(value as f64), toml::Value::Integer);
    // The failure delay must also stay below the authentication's timeout (the config's unit
    // tests check that): each one's range is checked with the other out of its way.
    let other = match key {
        "limits.auth_failure_delay_ms" => Some(("auth_timeout_secs", 3600)),
        "limits.auth_timeout_secs" => Some(("auth_failure_delay_ms", 0)),
        _ => None,
    };
    if let Some((name, v)) = other {
        let limits = t
            .entry("limits")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        limits
            .as_table_mut()
            .unwrap()
            .insert(name.into(), toml::Value::Integer(v));
    }
    t.entry(section)
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .unwrap()
        .insert(name.to_string(), v);
    let text = toml::to_string(&t).unwrap();
    match Config::from_toml(&text, Path::new("x.toml")).and_then(Config::resolve) {
        Ok(_) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// The default of each numeric key, as the parser gives it for a file without the key.
fn numeric_defaults() -> BTreeMap<&'static str, i128> {
    let c = Config::from_toml(&toml::to_string(&base()).unwrap(), Path::new("x.toml")).unwrap();
    let (l, m, d) = (&c.link, &c.limits, c.downstream.as_ref().unwrap());
    let n = |v: usize| v as i128;
    BTreeMap::from([
        ("downstream.spool_bytes", d.spool_bytes.into()),
        ("link.zstd_level", l.zstd_level.into()),
        ("link.zstd_window_log", l.zstd_window_log.into()),
        ("link.block_cache_bytes", l.block_cache_bytes.into()),
        ("link.keepalive_secs", l.keepalive_secs.into()),
        ("link.connect_timeout_secs", l.connect_timeout_secs.into()),
        ("link.batch_window_ms", l.batch_window_ms.into()),
        ("limits.queue_messages", n(m.queue_messages)),
        ("limits.max_message_bytes", n(m.max_message_bytes)),
        ("limits.max_sessions", n(m.max_sessions)),
        ("limits.max_startups", n(m.max_startups)),
        (
            "limits.max_startups_per_address",
            n(m.max_startups_per_address),
        ),
        ("limits.startup_timeout_secs", m.startup_timeout_secs.into()),
        ("limits.auth_timeout_secs", m.auth_timeout_secs.into()),
        (
            "limits.auth_failure_delay_ms",
            m.auth_failure_delay_ms.into(),
        ),
        ("limits.drain_timeout_secs", m.drain_timeout_secs.into()),
        ("limits.standby_timeout_secs", m.standby_timeout_secs.into()),
    ])
}

/// `4 MiB`, `10`, `1 PiB` as a number.
fn amount(s: &str) -> i128 {
    let s = s.trim();
    let units = [
        ("KiB", 10),
        ("MiB", 20),
        ("GiB", 30),
        ("TiB", 40),
        ("PiB", 50),
    ];
    let (num, shift) = units
        .iter()
        .find_map(|(u, sh)| s.strip_suffix(u).map(|n| (n.trim(), *sh)))
        .unwrap_or((s, 0));
    let v: i128 = num
        .parse()
        .unwrap_or_else(|e| panic!("{s:?} is no amount: {e}"));
    v << shift
}

/// A default cell: `10 (1..=3600)`, `1 GiB (at most 64 GiB)`, `60 (0..=3600; 0: never)`.
fn default_and_range(cell: &str) -> (i128, Option<i128>, i128) {
    let (default, rest) = cell.split_once(" (").unwrap_or_else(|| panic!("{cell:?}"));
    let range = rest.split([';', ')']).next().unwrap();
    let (min, max) = match range.strip_prefix("at most ") {
        Some(max) => (None, max),
        None => {
            let (a, b) = range
                .split_once("..=")
                .unwrap_or_else(|| panic!("{cell:?}"));
            (Some(amount(a)), b)
        }
    };
    (amount(default), min, amount(max))
}

#[test]
fn the_configuration_reference_states_each_numbers_default_and_range() {
    let defaults = numeric_defaults();
    let documented: BTreeMap<String, String> = reference_keys(&readme()).into_iter().collect();
    for (key, default) in &defaults {
        let cell = &documented[*key];
        let (doc_default, min, max) = default_and_range(cell);
        assert_eq!(doc_default, *default, "{key}: README says {cell:?}");
        let refused = |v: i128| match resolve_with(key, v) {
            Ok(()) => panic!("{key} = {v} is accepted; README says {cell:?}"),
            Err(e) => assert!(
                e.contains(key),
                "{key} = {v}: the error names another key: {e}"
            ),
        };
        let accepted = |v: i128| {
            resolve_with(key, v).unwrap_or_else(|e| panic!("{key} = {v}: {e}; README {cell:?}"))
        };
        accepted(max);
        refused(max + 1);
        if let Some(min) = min {
            accepted(min);
            refused(min - 1);
        }
    }
    // Every default with a range in the table is one of the numbers checked above.
    for (key, cell) in &documented {
        if cell.contains("..=") || cell.contains("at most") {
            assert!(
                defaults.contains_key(key.as_str()),
                "{key}: {cell:?} unchecked"
            );
        }
    }
}

// ---- Monitoring ---------------------------------------------------------------------------

/// One family of the exposition: its type, and each label's values over its samples.
#[derive(Debug, Default)]
struct Family {
    kind: String,
    labels: BTreeMap<String, BTreeSet<String>>,
    samples: usize,
}

/// Encodes synthetic WAL with the `wal` codec into `m`'s totals (the rmgr and kind series).
fn encode_some_wal(m: &Metrics) {
    use walrelay_wal::linkcodec::{CodecKind, Setup, WalEncoder};
    use walrelay_wal::walcodec::testgen::WalGen;
    let setup = Setup {
        kind: CodecKind::Wal,
        zstd_level: 3,
        window_log: 20,
        wal: walrelay_wal::walcodec::CodecParams {
            pg_major: Some(walrelay_wal::pg::PgMajor::V15),
            block_cache_bytes: 1 << 20,
            zstd_level: 3,
            max_message_bytes: 1 << 20,
        },
    };
    let mut g = WalGen::new(walrelay_wal::pg::PgMajor::V15, 16 << 20, 16 << 20, 7);
    for _ in 0..200 {
        g.random_record(16);
    }
    let mut enc = WalEncoder::new(&setup).unwrap();
    let mut stats = m.ops.codec.session();
    let mut out = Vec::new();
    enc.encode(Lsn(g.start), &g.buf, &mut out).unwrap();
    stats.observe(&enc, &m.ops.codec);
}

/// The exposition of a process with every family populated: both halves, a standby of each,
/// a spool, a slot, codec totals, the process's numbers.
fn exposition() -> BTreeMap<String, Family> {
    let m = Metrics::default();
    for (a, b) in [
        (&m.wal_bytes_in, &m.wal_payload_bytes_out),
        (&m.wal_bytes_delivered, &m.ops.link_payload_bytes_received),
    ] {
        Metrics::add(a, 1000);
        Metrics::add(b, 100);
    }
    Metrics::add(&m.ops.spool.capacity, 64 << 20);
    m.ops
        .slots
        .lock()
        .unwrap()
        .insert("walrelay".into(), SlotState::default());
    let standbys: Vec<_> = [Half::Upstream, Half::Downstream]
        .into_iter()
        .map(|h| {
            let s = m.ops.standbys.register(h, "dc2_a", "10.0.2.7:5000");
            s.set_slot(Some("dc2"));
            s.wal(Lsn(0x100_0000));
            s.reply(Lsn(1), Lsn(1), Lsn(1));
            s
        })
        .collect();
    encode_some_wal(&m);
    let p = ProcessStats {
        cpu_seconds: 1.0,
        resident_bytes: 1,
        start_time_seconds: Some(1.0),
    };
    let text = expo::render(&m, &p);
    drop(standbys);
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let (name, kind) = t.split_once(' ').unwrap();
            families.entry(name.into()).or_default().kind = kind.into();
        }
    }
    for s in walrelay_harness::prom::parse_exposition(&text).unwrap() {
        let f = families
            .get_mut(&s.name)
            .unwrap_or_else(|| panic!("{} has no # TYPE", s.name));
        f.samples += 1;
        for (k, v) in s.labels {
            f.labels.entry(k).or_default().insert(v);
        }
    }
    families
}

/// The metrics table: name → (type, labels with the values the README lists for them).
fn metrics_table(readme: &str) -> BTreeMap<String, (String, Vec<Ticked>)> {
    let mut out = BTreeMap::new();
    let mut previous = Vec::new();
    for row in table(readme, "| metric | type | labels | meaning |") {
        let names = ticked(&row[0]);
        let labels = match row[2].as_str() {
            "same" => previous.clone(),
            cell => ticked(cell),
        };
        previous = labels.clone();
        let first = names[0].0.clone();
        for (n, _) in &names {
            // `_flush_lsn_bytes` after `walrelay_standby_write_lsn_bytes`: the first name with
            // as many of its last words replaced.
            let name = match n.strip_prefix('_') {
                Some(tail) => {
                    let words: Vec<&str> = first.split('_').collect();
                    let keep = words.len() - tail.split('_').count();
                    format!("{}_{tail}", words[..keep].join("_"))
                }
                None => n.clone(),
            };
            out.insert(name, (row[1].clone(), labels.clone()));
        }
    }
    out
}

#[test]
fn the_metrics_table_matches_the_exposition() {
    let families = exposition();
    let documented = metrics_table(&readme());
    let (d, e): (BTreeSet<&String>, BTreeSet<&String>) =
        (documented.keys().collect(), families.keys().collect());
    assert_eq!(d, e, "README's metrics and the exposition's differ");
    for (name, (kind, labels)) in &documented {
        let f = &families[name];
        assert_eq!(&f.kind, kind, "{name}: type");
        assert!(f.samples > 0, "{name}: no sample to check its labels on");
        let names: BTreeSet<&String> = labels.iter().map(|(l, _)| l).collect();
        assert_eq!(
            names,
            f.labels.keys().collect(),
            "{name}: labels (README against the exposition)"
        );
        for (label, values) in labels.iter().filter(|(_, v)| !v.is_empty()) {
            let values: BTreeSet<&String> = values.iter().collect();
            assert_eq!(values, f.labels[label].iter().collect(), "{name}: {label}");
        }
    }
}

/// The PromQL expressions of the dashboard, each with its legend's `{{label}}`s.
fn dashboard() -> Vec<(String, Vec<String>)> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/walrelay-dashboard.json");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut out = Vec::new();
    fn walk(v: &serde_json::Value, out: &mut Vec<(String, Vec<String>)>) {
        match v {
            serde_json::Value::Object(m) => match m.get("expr").and_then(|e| e.as_str()) {
                Some(expr) => {
                    let legend = m.get("legendFormat").and_then(|l| l.as_str()).unwrap_or("");
                    let labels = legend
                        .split("{{")
                        .skip(1)
                        .filter_map(|p| p.split_once("}}").map(|(l, _)| l.trim().to_string()))
                        .collect();
                    out.push((expr.to_string(), labels));
                }
                None => m.values().for_each(|v| walk(v, out)),
            },
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    walk(&json, &mut out);
    out
}

/// The README's PromQL (backticked, with a range function in it).
fn readme_promql(readme: &str) -> Vec<String> {
    readme
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.contains("walrelay_") && (s.contains("rate(") || s.contains("increase(")))
        .map(str::to_string)
        .collect()
}

#[test]
fn promql_uses_metrics_as_their_types_and_labels_allow() {
    let families = exposition();
    let labels_of = |name: &str| -> BTreeSet<String> {
        let f = families
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not exported"));
        f.labels.keys().cloned().collect()
    };
    let mut exprs = dashboard();
    assert!(exprs.len() >= 10, "only {} expressions", exprs.len());
    let readme = readme_promql(&readme());
    assert!(!readme.is_empty(), "no PromQL found in README.md");
    exprs.extend(readme.into_iter().map(|e| (e, Vec::new())));
    for (expr, legend) in &exprs {
        let parsed = promql::parse(expr);
        assert!(!parsed.refs.is_empty(), "no metric in {expr}");
        let mut all = BTreeSet::new();
        for r in &parsed.refs {
            let kind = &families
                .get(&r.name)
                .unwrap_or_else(|| panic!("{expr}: {} is not exported", r.name))
                .kind;
            match (kind.as_str(), r.in_range_function) {
                ("counter", false) => {
                    panic!("{expr}: counter {} outside rate()/increase()", r.name)
                }
                ("gauge", true) => panic!("{expr}: gauge {} inside rate()/increase()", r.name),
                _ => {}
            }
            let own = labels_of(&r.name);
            for l in &r.selected {
                assert!(
                    own.contains(l) || promql::TARGET_LABELS.contains(&l.as_str()),
                    "{expr}: {} has no label {l}",
                    r.name
                );
            }
            all.extend(own);
        }
        all.extend(promql::TARGET_LABELS.iter().map(|l| l.to_string()));
        for l in parsed.grouped.iter().chain(legend) {
            assert!(all.contains(l), "{expr}: no metric in it has the label {l}");
        }
        if let Some(d) = promql::division(expr) {
            let sides = [d.left, d.right].map(|side| {
                promql::result_labels(side, &labels_of)
                    .into_iter()
                    .filter(|l| !d.ignoring.contains(l))
                    .filter(|l| d.on.as_ref().is_none_or(|on| on.contains(l)))
                    .collect::<BTreeSet<String>>()
            });
            assert_eq!(
                sides[0], sides[1],
                "{expr}: the operands' labels differ, so no series match and the result is empty \
                 (use on()/ignoring() or aggregate both sides by the same labels)"
            );
        }
    }
}

/// The parser reads what the checks above rely on.
#[test]
fn promql_is_read_as_the_checks_need() {
    let p = promql::parse(
        r#"sum by (instance, half) (rate(walrelay_a_total{x="y}",half!~"a"}[$__rate_interval])) / on (i) group_left walrelay_b"#,
    );
    let names: Vec<(&str, bool)> = p
        .refs
        .iter()
        .map(|r| (r.name.as_str(), r.in_range_function))
        .collect();
    assert_eq!(names, [("walrelay_a_total", true), ("walrelay_b", false)]);
    assert_eq!(p.refs[0].selected, ["x", "half"]);
    assert_eq!(p.grouped, ["instance", "half", "i"]);
    let d = promql::division("rate(a[5m]) / ignoring(half) rate(b{half=\"u\"}[5m])").unwrap();
    assert_eq!(
        (d.left, d.right),
        ("rate(a[5m])", "rate(b{half=\"u\"}[5m])")
    );
    assert_eq!(d.ignoring, ["half"]);
    let labels = |m: &str| -> BTreeSet<String> {
        match m {
            "b" => BTreeSet::from(["half".to_string()]),
            _ => BTreeSet::new(),
        }
    };
    let of = |e: &str| {
        promql::result_labels(e, &labels)
            .into_iter()
            .collect::<Vec<_>>()
    };
    assert_eq!(of("rate(b[5m])"), ["half", "instance", "job"]);
    assert_eq!(of("sum by (instance) (rate(b[5m]))"), ["instance"]);
    assert_eq!(of("sum without (half) (rate(b[5m]))"), ["instance", "job"]);
}
