use super::*;

fn load(text: &str) -> Result<Resolved, ConfigError> {
    Config::from_toml(text, Path::new("test.toml"))?.resolve()
}

const BOTH: &str = r#"
[upstream]
primary = "host=127.0.0.1 port=5432 user=replicator password=secret sslmode=disable"
listen = "127.0.0.1:7433"
[downstream]
listen = "127.0.0.1:5433"
upstream = "127.0.0.1:7433"
auth = "trust"
spool_dir = "/tmp/walrelay-config-test-spool"
[link]
plaintext = true
"#;

#[test]
fn minimal_plaintext_config_resolves() {
    let r = load(BOTH).unwrap();
    let u = r.upstream.unwrap();
    assert_eq!(u.primary.password.as_deref(), Some("secret"));
    assert_eq!(r.downstream.unwrap().auth, AuthMethod::Trust);
    assert_eq!(r.link.codec, CodecKind::Wal);
}

fn key_of(e: ConfigError) -> String {
    match e {
        ConfigError::Key { key, .. } | ConfigError::Value { key, .. } => key,
        other => panic!("expected a key error, got {other}"),
    }
}

#[test]
fn errors_name_the_key() {
    let e = load(&BOTH.replace("plaintext = true", "plaintext = false")).unwrap_err();
    assert_eq!(key_of(e), "link.tls_cert");
    let e = load(&BOTH.replace("127.0.0.1:5433", "nowhere")).unwrap_err();
    assert_eq!(key_of(e), "downstream.listen");
    let e = load(&BOTH.replace("auth = \"trust\"", "auth = \"scram-sha-256\"")).unwrap_err();
    assert_eq!(key_of(e), "downstream.users");
    let e = load(&BOTH.replace("sslmode=disable", "sslmode=maybe")).unwrap_err();
    assert_eq!(key_of(e), "upstream.primary");
    let e = load(&format!("{BOTH}\n[limits]\nqueue_messages = 0\n")).unwrap_err();
    assert_eq!(key_of(e), "limits.queue_messages");
    let e = load("[link]\nplaintext = true\n").unwrap_err();
    assert_eq!(key_of(e), "upstream/downstream");
}

#[test]
fn unknown_keys_are_syntax_errors_naming_the_key() {
    let e = load(&BOTH.replace("listen = \"127.0.0.1:7433\"", "lisen = \"127.0.0.1:7433\""))
        .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("lisen"), "{msg}");
}

#[test]
fn secrets_from_env_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("pw");
    std::fs::write(&f, "from-file\n").unwrap();
    std::env::set_var("WALRELAY_TEST_PW", "from-env");
    let text = BOTH.replace(
        "listen = \"127.0.0.1:7433\"",
        &format!(
            "listen = \"127.0.0.1:7433\"\nprimary_password = {{ file = \"{}\" }}",
            f.display()
        ),
    );
    assert_eq!(
        load(&text)
            .unwrap()
            .upstream
            .unwrap()
            .primary
            .password
            .as_deref(),
        Some("from-file")
    );
    let text = BOTH.replace(
        "listen = \"127.0.0.1:7433\"",
        "listen = \"127.0.0.1:7433\"\nprimary_password = { env = \"WALRELAY_TEST_PW\" }",
    );
    assert_eq!(
        load(&text)
            .unwrap()
            .upstream
            .unwrap()
            .primary
            .password
            .as_deref(),
        Some("from-env")
    );
    let text = BOTH.replace(
        "listen = \"127.0.0.1:7433\"",
        "listen = \"127.0.0.1:7433\"\nprimary_password = { env = \"WALRELAY_NO_SUCH_VAR\" }",
    );
    assert_eq!(
        key_of(load(&text).unwrap_err()),
        "upstream.primary_password"
    );
}

#[test]
fn metrics_section_is_optional_and_checked() {
    assert_eq!(load(BOTH).unwrap().metrics, None);
    let r = load(&format!("{BOTH}[metrics]\nlisten = \"127.0.0.1:9187\"\n")).unwrap();
    assert_eq!(r.metrics, Some("127.0.0.1:9187".parse().unwrap()));
    let e = load(&format!("{BOTH}[metrics]\nlisten = \"localhost\"\n")).unwrap_err();
    assert_eq!(key_of(e), "metrics.listen");
    assert!(load(&format!(
        "{BOTH}[metrics]\nlisten = \"127.0.0.1:1\"\npath = \"/x\"\n"
    ))
    .is_err());
}

#[test]
fn downstream_upstream_is_one_address_or_a_list() {
    let with = |v: &str| BOTH.replace("upstream = \"127.0.0.1:7433\"", &format!("upstream = {v}"));
    let d = load(BOTH).unwrap().downstream.unwrap();
    assert_eq!(d.upstream.to_string(), "127.0.0.1:7433");
    let d = load(&with(r#"["relay-up-a:7433", "[::1]:7434"]"#))
        .unwrap()
        .downstream
        .unwrap();
    assert_eq!(d.upstream.len(), 2);
    assert_eq!(d.upstream[0].host, "relay-up-a");
    assert_eq!(d.upstream[1].host, "::1");
    assert_eq!(d.upstream[1].port, 7434);
    for bad in [r#"[]"#, r#"["a:1", "b"]"#, r#""a""#, r#""::1:7433""#] {
        let e = load(&with(bad)).unwrap_err();
        let msg = e.to_string();
        assert_eq!(key_of(e), "downstream.upstream", "{bad}");
        assert!(msg.contains("host:port"), "{msg}");
    }
    // Neither a string nor a list of strings: a syntax error that says what is expected.
    let e = load(&with("7433")).unwrap_err().to_string();
    assert!(e.contains("\"host:port\" or a list of them"), "{e}");
    assert!(load(&with("[1, 2]")).is_err());
}

#[test]
fn upstream_primary_takes_host_lists() {
    let text = BOTH.replace(
        "host=127.0.0.1 port=5432",
        "host=pg-a,pg-b port=5432,5433 target_session_attrs=read-write",
    );
    let u = load(&text).unwrap().upstream.unwrap();
    assert_eq!(u.primary.hosts_display(), "pg-a:5432, pg-b:5433");
    let e = load(&BOTH.replace("port=5432", "port=5432,5433")).unwrap_err();
    let msg = e.to_string();
    assert_eq!(key_of(e), "upstream.primary");
    assert!(msg.contains("port lists 2 ports but host lists 1"), "{msg}");
}

#[test]
fn every_number_has_a_maximum() {
    let huge = "9223372036854775807";
    for (section, key) in [
        ("limits", "queue_messages"),
        ("limits", "max_sessions"),
        ("limits", "max_startups"),
        ("limits", "max_startups_per_address"),
        ("limits", "startup_timeout_secs"),
        ("limits", "auth_timeout_secs"),
        ("limits", "auth_failure_delay_ms"),
        ("limits", "drain_timeout_secs"),
        ("limits", "standby_timeout_secs"),
        ("limits", "max_message_bytes"),
        ("link", "keepalive_secs"),
        ("link", "connect_timeout_secs"),
        ("link", "batch_window_ms"),
        ("link", "block_cache_bytes"),
        ("link", "zstd_window_log"),
    ] {
        let text = if section == "link" {
            BOTH.replace("[link]\n", &format!("[link]\n{key} = {huge}\n"))
        } else {
            format!("{BOTH}\n[{section}]\n{key} = {huge}\n")
        };
        let e = load(&text).unwrap_err();
        let msg = e.to_string();
        assert_eq!(key_of(e), format!("{section}.{key}"), "{msg}");
        // (A u32 key refuses it as a type error, naming the key all the same.)
        assert!(
            msg.contains("must be between") || msg.contains("expected u32"),
            "{msg}"
        );
    }
    let e = load(&BOTH.replace("[link]\n", "[link]\nzstd_level = -3\n")).unwrap_err();
    assert_eq!(key_of(e), "link.zstd_level");
    let e = load(&format!("{BOTH}\n[downstream.x]\n")).unwrap_err();
    assert!(e.to_string().contains("downstream"), "{e}");
}

#[test]
fn type_errors_name_the_dotted_key() {
    let e = load(&format!("{BOTH}\n[limits]\nqueue_messages = \"many\"\n")).unwrap_err();
    let msg = e.to_string();
    assert_eq!(key_of(e), "limits.queue_messages", "{msg}");
    assert!(msg.contains("key `limits.queue_messages`"), "{msg}");
    let e = load(&BOTH.replace("plaintext = true", "plaintext = \"yes\"")).unwrap_err();
    assert_eq!(key_of(e), "link.plaintext");
    let e = load(&format!("{BOTH}\n[limits]\nmax_sessions = -1\n")).unwrap_err();
    assert_eq!(key_of(e), "limits.max_sessions");
}

/// A CA, a certificate for "up.example" with its key, another key, in `dir`.
fn tls_files(dir: &Path) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["up.example".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let w = |name: &str, text: String| std::fs::write(dir.join(name), text).unwrap();
    w("ca.pem", ca_cert.pem());
    w("up.crt", cert.pem());
    w("up.key", key.serialize_pem());
    w(
        "other.key",
        rcgen::KeyPair::generate().unwrap().serialize_pem(),
    );
    w(
        "garbage.pem",
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n".into(),
    );
    w("text.pem", "hello\n".into());
}

#[test]
fn tls_files_are_parsed_and_the_key_matched() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    tls_files(d);
    let tls = |cert: &str, key: &str, ca: &str| {
        BOTH.replace(
            "plaintext = true",
            &format!(
                "tls_cert = \"{}\"\ntls_key = \"{}\"\ntls_ca = \"{}\"",
                d.join(cert).display(),
                d.join(key).display(),
                d.join(ca).display()
            ),
        )
    };
    load(&tls("up.crt", "up.key", "ca.pem")).unwrap();
    for (cert, key, ca, bad) in [
        ("garbage.pem", "up.key", "ca.pem", "link.tls_cert"),
        ("text.pem", "up.key", "ca.pem", "link.tls_cert"),
        (".", "up.key", "ca.pem", "link.tls_cert"),
        ("up.crt", "text.pem", "ca.pem", "link.tls_key"),
        ("up.crt", "other.key", "ca.pem", "link.tls_key"),
        ("up.crt", "up.key", "garbage.pem", "link.tls_ca"),
        ("up.crt", "up.key", ".", "link.tls_ca"),
    ] {
        let e = load(&tls(cert, key, ca)).unwrap_err();
        let msg = e.to_string();
        assert_eq!(key_of(e), bad, "{cert} {key} {ca}: {msg}");
    }
    // An upstream alone needs tls_ca too: without it any TLS client could stream the WAL.
    let up_only = |with_ca: bool| {
        let mut t = tls("up.crt", "up.key", "ca.pem");
        let down = t.find("[downstream]").unwrap();
        let link = t.find("[link]").unwrap();
        t.replace_range(down..link, "");
        if !with_ca {
            t = t.replace(&format!("tls_ca = \"{}\"", d.join("ca.pem").display()), "");
        }
        t
    };
    load(&up_only(true)).unwrap();
    let e = load(&up_only(false)).unwrap_err();
    assert!(e.to_string().contains("stream the primary's WAL"), "{e}");
    assert_eq!(key_of(e), "link.tls_ca");
    // The standby-facing pair too.
    let standby = |cert: &str, key: &str| {
        BOTH.replace(
            "auth = \"trust\"",
            &format!(
                "auth = \"trust\"\ntls_cert = \"{}\"\ntls_key = \"{}\"",
                d.join(cert).display(),
                d.join(key).display()
            ),
        )
    };
    load(&standby("up.crt", "up.key")).unwrap();
    let e = load(&standby("up.crt", "other.key")).unwrap_err();
    assert!(e.to_string().contains("up.crt"), "{e}");
    assert_eq!(key_of(e), "downstream.tls_key");
    let e = load(&standby("garbage.pem", "up.key")).unwrap_err();
    assert_eq!(key_of(e), "downstream.tls_cert");
    // Names in link.peer_names must be DNS names.
    let e = load(&BOTH.replace(
        "plaintext = true",
        "plaintext = true\npeer_names = [\"not a name\"]",
    ))
    .unwrap_err();
    assert_eq!(key_of(e), "link.peer_names");
}

#[test]
fn the_failure_delay_is_below_the_authentication_timeout() {
    let limits = |delay: u64, timeout: u64| {
        format!(
            "{BOTH}\n[limits]\nauth_failure_delay_ms = {delay}\nauth_timeout_secs = {timeout}\n"
        )
    };
    assert!(load(&limits(4_999, 5)).is_ok());
    let e = load(&limits(5_000, 5)).unwrap_err();
    let msg = e.to_string();
    assert_eq!(key_of(e), "limits.auth_failure_delay_ms", "{msg}");
    assert!(msg.contains("limits.auth_timeout_secs (5 s)"), "{msg}");
}
