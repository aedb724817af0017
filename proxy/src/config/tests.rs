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
        ConfigError::Key { key, .. } => key,
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
