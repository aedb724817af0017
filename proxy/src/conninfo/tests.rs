use super::*;

fn hosts(s: &str) -> Vec<String> {
    ConnInfo::parse(s)
        .unwrap()
        .hosts
        .iter()
        .map(|h| h.to_string())
        .collect()
}

#[test]
fn parses_quoted_values() {
    let ci = ConnInfo::parse("host=db1 port = 6543 user=rep password='a b\\'c' sslmode=require")
        .unwrap();
    assert_eq!(ci.hosts.len(), 1);
    assert_eq!(ci.hosts[0].host, "db1");
    assert_eq!(ci.hosts[0].port, 6543);
    assert_eq!(ci.password.as_deref(), Some("a b'c"));
    assert_eq!(ci.sslmode, SslMode::Require);
    assert_eq!(ci.target_session_attrs, TargetSessionAttrs::Any);
    assert!(!format!("{ci:?}").contains("a b"));
}

#[test]
fn defaults_are_libpqs() {
    let ci = ConnInfo::parse("user=u").unwrap();
    assert_eq!(hosts("user=u"), ["localhost:5432"]);
    assert_eq!(ci.connect_timeout_secs, 10);
    assert_eq!(ci.sslmode, SslMode::Prefer);
}

#[test]
fn one_port_serves_every_host() {
    assert_eq!(
        hosts("host=a,b,c port=6000 user=u"),
        ["a:6000", "b:6000", "c:6000"]
    );
    assert_eq!(hosts("host=a,b,c user=u"), ["a:5432", "b:5432", "c:5432"]);
}

#[test]
fn one_port_per_host_and_empty_entries_default() {
    assert_eq!(
        hosts("host=a,b,c port=5432,5433,5434 user=u"),
        ["a:5432", "b:5433", "c:5434"]
    );
    assert_eq!(
        hosts("host=a,,c port=,5433, user=u"),
        ["a:5432", "localhost:5433", "c:5432"]
    );
    // Quoted, with spaces after the commas.
    assert_eq!(hosts("host='a, b' port='1, 2' user=u"), ["a:1", "b:2"]);
}

#[test]
fn ipv6_bare_or_in_brackets() {
    assert_eq!(
        hosts("host=::1,[fe80::2],10.0.0.1 port=5432 user=u"),
        ["[::1]:5432", "[fe80::2]:5432", "10.0.0.1:5432"]
    );
    assert_eq!(hosts("host=fe80::1%eth0 user=u"), ["[fe80::1%eth0]:5432"]);
    let ci = ConnInfo::parse("host=[::1] user=u").unwrap();
    assert_eq!(ci.hosts[0].host, "::1");
    assert_eq!(ci.hosts[0].dial_host(), "::1");
}

#[test]
fn hostaddr_pairs_with_host() {
    let ci = ConnInfo::parse("host=db1,db2 hostaddr=10.0.0.1,::2 port=1,2 user=u").unwrap();
    assert_eq!(ci.hosts[0].host, "db1");
    assert_eq!(ci.hosts[0].dial_host(), "10.0.0.1");
    assert_eq!(ci.hosts[1].dial_host(), "::2");
    assert_eq!(ci.hosts[1].to_string(), "db2 ([::2]):2");
    // hostaddr alone: the address is also the name.
    assert_eq!(
        hosts("hostaddr=10.0.0.1,10.0.0.2 user=u"),
        ["10.0.0.1:5432", "10.0.0.2:5432"]
    );
    // An empty hostaddr entry resolves the host name.
    let ci = ConnInfo::parse("host=db1,db2 hostaddr=,10.0.0.2 user=u").unwrap();
    assert_eq!(ci.hosts[0].dial_host(), "db1");
}

#[test]
fn unix_socket_directories() {
    let ci = ConnInfo::parse("host=/run/postgresql,db2 port=5433 user=u").unwrap();
    assert!(ci.hosts[0].is_unix_socket());
    assert!(!ci.hosts[1].is_unix_socket());
    assert_eq!(ci.hosts[0].to_string(), "/run/postgresql/.s.PGSQL.5433");
}

#[test]
fn target_session_attrs_values() {
    for (v, want) in [
        ("any", TargetSessionAttrs::Any),
        ("read-write", TargetSessionAttrs::ReadWrite),
        ("primary", TargetSessionAttrs::Primary),
    ] {
        let ci = ConnInfo::parse(&format!("host=a,b user=u target_session_attrs={v}")).unwrap();
        assert_eq!(ci.target_session_attrs, want);
        assert_eq!(want.as_str(), v);
    }
    for v in ["standby", "read-only", "prefer-standby", "READ-WRITE", ""] {
        assert!(
            matches!(
                ConnInfo::parse(&format!("user=u target_session_attrs='{v}'")),
                Err(ConnInfoError::BadValue { ref key, .. }) if key == "target_session_attrs"
            ),
            "{v:?} was accepted"
        );
    }
}

#[test]
fn lists_that_do_not_match_up_are_errors() {
    assert_eq!(
        ConnInfo::parse("host=a,b,c port=1,2 user=u"),
        Err(ConnInfoError::CountMismatch {
            what: "port",
            items: "ports",
            n: 2,
            m: 3
        })
    );
    assert!(matches!(
        ConnInfo::parse("host=a,b hostaddr=10.0.0.1 user=u"),
        Err(ConnInfoError::CountMismatch {
            what: "hostaddr",
            ..
        })
    ));
    let msg = ConnInfo::parse("host=a,b,c port=1,2 user=u")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("port lists 2 ports but host lists 3"), "{msg}");
}

#[test]
fn bad_hosts_ports_and_addresses_are_errors() {
    let key_of = |s: &str| match ConnInfo::parse(s) {
        Err(ConnInfoError::BadValue { key, .. }) => key,
        other => panic!("{s}: expected a bad value, got {other:?}"),
    };
    assert_eq!(key_of("host=a,b port=5432,x user=u"), "port");
    assert_eq!(key_of("host=a port=0 user=u"), "port");
    assert_eq!(key_of("host=a port=65536 user=u"), "port");
    assert_eq!(key_of("host=db1:5432 user=u"), "host");
    assert_eq!(key_of("host=[db1] user=u"), "host");
    assert_eq!(key_of("host=[::1 user=u"), "host");
    assert_eq!(key_of("hostaddr=db1 user=u"), "hostaddr");
    assert_eq!(key_of("user=u connect_timeout=-1"), "connect_timeout");
    assert_eq!(key_of("user=u connect_timeout=3601"), "connect_timeout");
    assert_eq!(key_of("user=u connect_timeout=0"), "connect_timeout");
}

#[test]
fn errors_name_the_problem() {
    assert_eq!(
        ConnInfo::parse("host=x user=u sslmod=require"),
        Err(ConnInfoError::UnknownKey("sslmod".into()))
    );
    assert_eq!(
        ConnInfo::parse("host=x user=u load_balance_hosts=random"),
        Err(ConnInfoError::UnknownKey("load_balance_hosts".into()))
    );
    assert!(matches!(
        ConnInfo::parse("host=x user=u port=abc"),
        Err(ConnInfoError::BadValue { .. })
    ));
    assert_eq!(ConnInfo::parse("host=x"), Err(ConnInfoError::NoUser));
    assert_eq!(
        ConnInfo::parse("user=u password='x"),
        Err(ConnInfoError::Unterminated)
    );
    assert!(ConnInfo::parse("user=u sslmode=verify-full").is_err());
    assert_eq!(
        ConnInfo::parse("user"),
        Err(ConnInfoError::MissingEquals("user".into()))
    );
}

#[test]
fn never_panics_on_arbitrary_input() {
    for s in [
        "",
        "=",
        "==",
        "host=",
        "host=,",
        "port=,,,",
        "host=[",
        "host=]",
        "hostaddr=,",
        "host=a,b port=1,2,3,4 user=u",
        "'",
        "user='\\",
        "host=\u{0} user=u",
    ] {
        let _ = ConnInfo::parse(s);
    }
}

/// A client certificate without its key (or a key without its certificate) was accepted and
/// then left out of the TLS handshake without a word: the primary's pg_hba `cert` entry then
/// refused the connection, naming nothing walrelay was told.
#[test]
fn a_client_certificate_needs_its_key() {
    let key_of = |s: &str| match ConnInfo::parse(s) {
        Err(ConnInfoError::BadValue { key, why, .. }) => (key, why),
        other => panic!("{s}: expected a bad value, got {other:?}"),
    };
    let (key, why) = key_of("host=a user=u sslmode=require sslcert=/c.crt");
    assert_eq!(key, "sslkey");
    assert!(why.contains("add sslkey="), "{why}");
    let (key, why) = key_of("host=a user=u sslmode=require sslkey=/c.key");
    assert_eq!(key, "sslcert");
    assert!(why.contains("add sslcert="), "{why}");
    let ci = ConnInfo::parse("host=a user=u sslcert=/c.crt sslkey=/c.key").unwrap();
    assert!(ci.sslcert.is_some() && ci.sslkey.is_some());
}

/// libpq also takes URIs; walrelay does not, and its refusal quoted the whole URI (as the
/// "key" before a missing "=") into the log, password included.
#[test]
fn a_uri_is_refused_without_repeating_it() {
    for uri in [
        "postgresql://walrelay:s3cret@db1:5432/postgres",
        "  postgres://walrelay:s3cret@db1/postgres?sslmode=require",
        "POSTGRESQL://walrelay:s3cret@db1",
        "postgres://wé:s3cret@db1",
    ] {
        let e = ConnInfo::parse(uri).unwrap_err();
        assert_eq!(e, ConnInfoError::Uri, "{uri}");
        let msg = e.to_string();
        assert!(!msg.contains("s3cret"), "{msg}");
        assert!(msg.contains("key=value"), "{msg}");
    }
}
