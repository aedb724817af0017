use super::*;
use std::path::PathBuf;

fn resolve(toml: &str) -> Resolved {
    Config::from_toml(toml, &PathBuf::from("t.toml"))
        .unwrap()
        .resolve()
        .unwrap()
}

fn both(users: &str, extra: &str) -> Resolved {
    resolve(&format!(
        "[upstream]\nprimary = \"host=h user=u\"\nlisten = \"127.0.0.1:7433\"\n\
         [downstream]\nlisten = \"127.0.0.1:5433\"\nupstream = \"h:7433\"\nspool_dir = \"/tmp/s\"\nusers = {{ {users} }}\n\
         [link]\nplaintext = true\n{extra}"
    ))
}

#[test]
fn restart_keys_name_each_changed_setting() {
    let v = walrelay_pgwire::scram::new_verifier("a");
    let old = both(&format!("r = \"{v}\""), "");
    assert!(restart_keys(&old, &old).is_empty());
    let new = resolve(
        &format!(
            "[upstream]\nprimary = \"host=h user=u\"\nlisten = \"127.0.0.1:7434\"\n\
             [downstream]\nlisten = \"127.0.0.1:5433\"\nupstream = \"h2:7433\"\nspool_dir = \"/tmp/s\"\nusers = {{ r = \"{v}\" }}\n\
             [link]\nplaintext = true\ncodec = \"zstd\"\n[limits]\nmax_message_bytes = 300000\nmax_sessions = 3\n\
             [log]\nformat = \"json\"\nlevel = \"debug\"\n"
        ),
    );
    assert_eq!(
        restart_keys(&old, &new),
        [
            "upstream.listen",
            "downstream.upstream",
            "link.codec",
            "limits.max_message_bytes",
            "log.format"
        ]
    );
    // The live part of the same change, as the process would run it.
    let eff = effective(&old, &new);
    assert_eq!(live_keys(&old, &eff), ["log.level", "limits.max_sessions"]);
    assert_eq!(eff.limits.max_message_bytes, old.limits.max_message_bytes);
    assert_eq!(eff.log.format, "text");
    assert_eq!(
        eff.downstream.as_ref().unwrap().upstream.to_string(),
        "h:7433"
    );
}

/// Every key of every section: (key, a value, another value), TOML. A new key fails
/// `every_key_reloads_as_declared` until it has a row here. `users`: verifiers for a
/// password; `f`: a readable file.
fn key_values(users: &dyn Fn(&str) -> String, f: &dyn Fn(&str) -> String) -> Vec<Row> {
    let s = |v: &str| v.to_string();
    let q = |v: &str| format!("\"{v}\"");
    vec![
        ("upstream.primary", q("host=h user=u"), q("host=h2 user=u")),
        ("upstream.primary_password", q("pw"), q("pw2")),
        ("upstream.slot", q("s"), q("s2")),
        ("upstream.listen", q("127.0.0.1:7433"), q("127.0.0.1:7434")),
        (
            "downstream.listen",
            q("127.0.0.1:5433"),
            q("127.0.0.1:5434"),
        ),
        ("downstream.upstream", q("h:7433"), q("h2:7433")),
        ("downstream.auth", q("scram-sha-256"), q("trust")),
        ("downstream.users", users("a"), users("b")),
        ("downstream.tls_cert", f("a.crt"), f("b.crt")),
        ("downstream.tls_key", f("a.key"), f("b.key")),
        ("downstream.spool_dir", q("/tmp/spool-a"), q("/tmp/spool-b")),
        ("downstream.spool_bytes", s("1000000000"), s("2000000000")),
        ("downstream.name", q("a"), q("b")),
        ("downstream.allow_slot_commands", s("false"), s("true")),
        ("downstream.allow_sql", s("false"), s("true")),
        ("link.tls_cert", f("a.crt"), f("b.crt")),
        ("link.tls_key", f("a.key"), f("b.key")),
        ("link.tls_ca", f("a.crt"), f("b.crt")),
        ("link.tls_server_name", q("relay"), q("other")),
        ("link.peer_names", s("[]"), s("[\"relay-b\"]")),
        ("link.plaintext", s("true"), s("false")),
        ("link.codec", q("wal"), q("zstd")),
        ("link.zstd_level", s("3"), s("5")),
        ("link.zstd_window_log", s("23"), s("20")),
        ("link.block_cache_bytes", s("1000000"), s("2000000")),
        ("link.keepalive_secs", s("10"), s("3")),
        ("link.connect_timeout_secs", s("10"), s("3")),
        ("link.batch_window_ms", s("10"), s("0")),
        ("link.catch_up", s("true"), s("false")),
        ("limits.queue_messages", s("64"), s("7")),
        ("limits.max_message_bytes", s("4194304"), s("300000")),
        ("limits.max_sessions", s("64"), s("3")),
        ("limits.max_startups", s("32"), s("5")),
        ("limits.max_startups_per_address", s("8"), s("2")),
        ("limits.startup_timeout_secs", s("10"), s("3")),
        ("limits.auth_timeout_secs", s("60"), s("9")),
        ("limits.auth_failure_delay_ms", s("1000"), s("0")),
        ("limits.drain_timeout_secs", s("10"), s("9")),
        ("limits.standby_timeout_secs", s("60"), s("30")),
        ("log.level", q("info"), q("debug")),
        ("log.format", q("text"), q("json")),
        ("metrics.listen", q("127.0.0.1:9187"), q("127.0.0.1:9188")),
    ]
}

type Row = (&'static str, String, String);

/// a.crt and b.crt: two self-signed certificates of one key, which a.key and b.key both
/// hold (so that each TLS key can change alone and the pair still matches).
fn tls_files() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    for name in ["a", "b"] {
        let cert = rcgen::CertificateParams::new(vec![format!("{name}.example")])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.path().join(format!("{name}.crt")), cert.pem()).unwrap();
        std::fs::write(dir.path().join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
    dir
}

/// A file of sections with `values` (key, TOML value), in order.
fn render<'a>(values: impl Iterator<Item = (&'a str, &'a String)>) -> String {
    let mut text = String::new();
    let mut section = "";
    for (key, value) in values {
        let (s, name) = key.split_once('.').unwrap();
        if s != section {
            text += &format!("[{s}]\n");
            section = s;
        }
        text += &format!("{name} = {value}\n");
    }
    text
}

#[test]
fn every_key_reloads_as_declared() {
    let users = |pw: &str| {
        let v = walrelay_pgwire::scram::new_verifier(pw);
        format!("{{ r = \"{v}\" }}")
    };
    let dir = tls_files();
    let f = |name: &str| format!("\"{}\"", dir.path().join(name).display());
    let rows = key_values(&users, &f);
    let declared: Vec<&str> = Config::keys().map(|k| k.name).collect();
    let tested: Vec<&str> = rows.iter().map(|r| r.0).collect();
    assert_eq!(
        tested, declared,
        "each key of config.rs needs a row in key_values"
    );
    let live: Vec<&str> = Config::keys()
        .filter(|k| k.reload == Reload::Live)
        .map(|k| k.name)
        .collect();
    assert_eq!(
        live,
        [
            "upstream.primary",
            "upstream.primary_password",
            "upstream.slot",
            "downstream.auth",
            "downstream.users",
            "downstream.allow_slot_commands",
            "downstream.allow_sql",
            "limits.queue_messages",
            "limits.max_sessions",
            "limits.max_startups",
            "limits.max_startups_per_address",
            "limits.startup_timeout_secs",
            "limits.auth_timeout_secs",
            "limits.auth_failure_delay_ms",
            "limits.drain_timeout_secs",
            "limits.standby_timeout_secs",
            "log.level",
        ],
        "README.md (Signals) and the table above name the live keys: change them together"
    );

    let old = resolve(&render(rows.iter().map(|r| (r.0, &r.1))));
    assert!(restart_keys(&old, &old).is_empty() && live_keys(&old, &old).is_empty());
    for (key, _, other) in &rows {
        let values = rows
            .iter()
            .map(|r| (r.0, if r.0 == *key { other } else { &r.1 }));
        let new = resolve(&render(values));
        let eff = effective(&old, &new);
        match Config::keys().find(|k| k.name == *key).unwrap().reload {
            Reload::Restart => {
                assert_eq!(restart_keys(&old, &new), [*key]);
                assert!(live_keys(&old, &eff).is_empty(), "{key}");
                // The running value stays: the same file warns again at the next reload.
                assert_eq!(restart_keys(&eff, &new), [*key]);
            }
            Reload::Live => {
                assert!(restart_keys(&old, &new).is_empty(), "{key}");
                // The password is part of the primary's conninfo.
                let named = key.replace("primary_password", "primary");
                assert_eq!(live_keys(&old, &eff), [named.as_str()]);
                // Applied: reloading the same file changes nothing more.
                assert!(live_keys(&eff, &effective(&eff, &new)).is_empty(), "{key}");
                assert!(restart_keys(&eff, &new).is_empty(), "{key}");
            }
        }
    }
}

#[test]
fn users_and_primary_are_live() {
    let old = both(
        &format!("r = \"{}\"", walrelay_pgwire::scram::new_verifier("a")),
        "",
    );
    let new = resolve(&format!(
        "[upstream]\nprimary = \"host=h user=u password=p2\"\nlisten = \"127.0.0.1:7433\"\nslot = \"s\"\n\
         [downstream]\nlisten = \"127.0.0.1:5433\"\nupstream = \"h:7433\"\nspool_dir = \"/tmp/s\"\nusers = {{ r = \"{}\", s = \"{}\" }}\n\
         [link]\nplaintext = true\n",
        walrelay_pgwire::scram::new_verifier("b"),
        walrelay_pgwire::scram::new_verifier("c")
    ));
    assert!(restart_keys(&old, &new).is_empty());
    let eff = effective(&old, &new);
    assert_eq!(
        live_keys(&old, &eff),
        ["upstream.primary", "upstream.slot", "downstream.users"]
    );
    assert_eq!(eff.downstream.as_ref().unwrap().users.len(), 2);
    // The old slot is named, with how to drop it; a reload that keeps the slot says nothing.
    let w = slot_left_behind(&old, &eff).expect("the slot changed");
    assert!(
        w.contains("from \"walrelay\" to \"s\"")
            && w.contains("pg_drop_replication_slot('walrelay')"),
        "{w}"
    );
    assert_eq!(slot_left_behind(&eff, &eff), None);
}

/// After [`huge_pages_off`] the kernel reports THP off for the process
/// (`THP_enabled: 0` in /proc/self/status, Linux 5.0+).
#[test]
#[cfg(target_os = "linux")]
fn huge_pages_off_sets_the_process_flag() {
    assert!(huge_pages_off(), "prctl(PR_SET_THP_DISABLE) failed");
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("THP_enabled:"));
    assert_eq!(
        line.map(|l| l.split_whitespace().nth(1)),
        Some(Some("0")),
        "{line:?}"
    );
}

/// The TLS files a reload compares are the ones the process runs with: a path changed in the
/// file (which needs a restart) does not replace them, so the running file renewed in place
/// afterwards is still found changed by the next reload.
#[tokio::test]
async fn a_reload_tracks_the_tls_files_in_use() {
    let dir = tls_files();
    let p = |name: &str| dir.path().join(name).display().to_string();
    std::fs::copy(p("a.crt"), p("ca.crt")).unwrap();
    let path = dir.path().join("up.toml");
    let write = |cert: &str| {
        let toml = format!(
            "[upstream]\nprimary = \"host=127.0.0.1 port=1 user=u\"\nlisten = \"127.0.0.1:0\"\n\
             [link]\ntls_cert = \"{}\"\ntls_key = \"{}\"\ntls_ca = \"{}\"\n",
            p(cert),
            p("a.key"),
            p("ca.crt")
        );
        std::fs::write(&path, toml).unwrap();
    };
    write("a.crt");
    let metrics = crate::metrics::Metrics::new();
    let mut running = crate::relay::start(Config::load(&path).unwrap(), metrics)
        .await
        .unwrap();
    let log = crate::logging::init("info", "text");
    // link.tls_cert moves to b.crt (a restart-only change), and the CA file is rewritten.
    write("b.crt");
    std::fs::copy(p("b.crt"), p("ca.crt")).unwrap();
    reload(&mut running, &path, Config::load(&path), &log);
    let in_use = |r: &Running| TlsFiles::read(&r.config);
    assert!(running.tls_files.changed(&in_use(&running)).is_empty());
    // The certificate in use, a.crt, renewed in place.
    std::fs::copy(p("b.crt"), p("a.crt")).unwrap();
    assert_eq!(
        running.tls_files.changed(&in_use(&running)),
        ["link.tls_cert"]
    );
    running.shutdown().await;
}
