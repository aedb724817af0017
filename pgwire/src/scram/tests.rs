use super::*;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use proptest::prelude::*;

/// Runs a full exchange with the postgres-protocol client; returns the server's verdict and
/// whether the client accepted the server-final-message.
fn exchange(
    server: &mut ScramServer,
    password: &str,
    cb: ChannelBinding,
) -> Result<bool, ScramError> {
    let mut client = ScramSha256::new(password.as_bytes(), cb);
    let first = server.client_first(SCRAM_SHA_256, client.message())?;
    client.update(&first).expect("client accepts server-first");
    let last = server.client_final(client.message())?;
    Ok(client.finish(&last).is_ok())
}

fn test_verifier() -> ScramVerifier {
    ScramVerifier::from_password("foobar", b"walrelay-salt-16", 4096)
}

#[test]
fn known_vectors_match_postgresql() {
    // Written by PostgreSQL 15 (CREATE ROLE r PASSWORD 'foobar'), and by postgres-protocol
    // (as libpq) for "secret" with salt 1..=16.
    let foobar = "SCRAM-SHA-256$4096:c7Wr9koccIRJZLnFqhHv7Q==$mL+Hs2pcaay2xciC7MSudyTFZX+V0c3ON/+oiu/Ouw8=:5YgwdmlYAcuxvGM0yDBYX+LS/og/ZeIIWCJ2i3jMek8=";
    let secret = "SCRAM-SHA-256$4096:AQIDBAUGBwgJCgsMDQ4PEA==$8rrDg00OqaiWXJ7p+sCgHEIaBSHY89ZJl3mfIsf32oY=:05L1f+yZbiN8O0AnO40Og85NNRhvzTS57naKRWCcsIA=";
    for (password, pg) in [("foobar", foobar), ("secret", secret)] {
        let parsed: ScramVerifier = pg.parse().unwrap();
        let v = ScramVerifier::from_password(password, &parsed.salt, 4096);
        assert_eq!(v.to_pg_string(), pg);
        assert_eq!(parsed, v);
        let mut server = ScramServer::new(Some(parsed), "r");
        assert!(exchange(&mut server, password, ChannelBinding::unsupported()).unwrap());
    }
}

#[test]
fn verifier_round_trip_and_new_verifier() {
    let v = test_verifier();
    assert_eq!(v.to_pg_string().parse::<ScramVerifier>().unwrap(), v);
    let s = new_verifier("foobar");
    let parsed: ScramVerifier = s.parse().unwrap();
    assert_eq!(parsed.iterations, 4096);
    assert_eq!(parsed.salt.len(), 16);
    assert_eq!(parsed.to_pg_string(), s);
    assert_eq!(
        ScramVerifier::from_password("foobar", &parsed.salt, 4096),
        parsed
    );
    // new_verifier applies SASLprep like the client: a fullwidth password still works.
    let mut server = ScramServer::new(Some(new_verifier("ｆｏｏ").parse().unwrap()), "u");
    assert!(exchange(&mut server, "ｆｏｏ", ChannelBinding::unsupported()).unwrap());
    assert!(!format!("{parsed:?}").contains(&B64.encode(parsed.stored_key)));
}

#[test]
fn bad_verifiers_rejected() {
    let good = test_verifier().to_pg_string();
    let (head, keys) = good.rsplit_once('$').unwrap();
    let (stored, _) = keys.split_once(':').unwrap();
    for bad in [
        String::new(),
        "md5abcdef".to_string(),
        "SCRAM-SHA-256$".to_string(),
        good.replace("4096", "0"),
        good.replace("4096", "-1"),
        good.replace("4096", "99999999999"),
        good.replace('$', "#"),
        format!("{head}${stored}"),
        format!("{head}${stored}:AAAA"),
        format!("{head}${stored}:!!!!"),
        good.replacen(":", ":$", 1),
    ] {
        let err = bad.parse::<ScramVerifier>().unwrap_err();
        assert!(matches!(err, ScramError::BadVerifier(_)), "{bad:?}: {err}");
    }
}

#[test]
fn full_exchange_succeeds_with_both_gs2_headers() {
    for cb in [ChannelBinding::unsupported(), ChannelBinding::unrequested()] {
        let mut server = ScramServer::new(Some(test_verifier()), "alice");
        assert!(exchange(&mut server, "foobar", cb).unwrap());
        // Finished: nothing more is accepted.
        assert!(matches!(
            server.client_final(b"c=biws"),
            Err(ScramError::Protocol(_))
        ));
    }
}

#[test]
fn wrong_password_and_unknown_user_fail() {
    let mut server = ScramServer::new(Some(test_verifier()), "alice");
    let r = exchange(&mut server, "foobaz", ChannelBinding::unsupported());
    assert!(matches!(r, Err(ScramError::AuthenticationFailed)), "{r:?}");

    let mut server = ScramServer::new(None, "mallory");
    let r = exchange(&mut server, "foobar", ChannelBinding::unsupported());
    assert!(matches!(r, Err(ScramError::AuthenticationFailed)), "{r:?}");
}

#[test]
fn mock_salt_is_stable_per_user() {
    let salt_of = |user: &str| {
        let mut s = ScramServer::new(None, user);
        let first = s.client_first(SCRAM_SHA_256, b"n,,n=,r=abc").unwrap();
        let first = String::from_utf8(first).unwrap();
        first.split(',').nth(1).unwrap().to_string()
    };
    assert_eq!(salt_of("bob"), salt_of("bob"));
    assert_ne!(salt_of("bob"), salt_of("carol"));
    // From the configured verifiers: the same for the same configuration (across restarts),
    // another for another, with the iteration count most of them use.
    let v = |pw: &str, iterations: u32| ScramVerifier::from_password(pw, b"salt", iterations);
    let mock = |vs: &[ScramVerifier]| MockParams::from_verifiers(vs);
    let (k1, k2) = ([v("a", 4096), v("b", 4096)], [v("a", 4096), v("c", 4096)]);
    let a = ScramServer::with_mock(None, "bob", &mock(&k1)).verifier;
    let again = ScramServer::with_mock(None, "bob", &mock(&k1)).verifier;
    let b = ScramServer::with_mock(None, "bob", &mock(&k2)).verifier;
    assert_eq!(a.salt, again.salt);
    assert_ne!(a.salt, b.salt);
    assert_eq!(a.iterations, DEFAULT_ITERATIONS);
    let many = [v("a", 10_000), v("b", 10_000), v("c", 4096)];
    assert_eq!(mock(&many).iterations, 10_000);
    assert_eq!(mock(&[]).iterations, DEFAULT_ITERATIONS);
}

#[test]
fn server_first_format() {
    let mut server = ScramServer::new(Some(test_verifier()), "alice");
    let first = server
        .client_first(SCRAM_SHA_256, b"y,,n=*,r=cn0nce,x=ext")
        .unwrap();
    let first = String::from_utf8(first).unwrap();
    let rest = first.strip_prefix("r=cn0nce").unwrap();
    let (snonce, rest) = rest.split_once(',').unwrap();
    assert_eq!(B64.decode(snonce).unwrap().len(), 18);
    assert_eq!(
        rest,
        format!("s={},i=4096", B64.encode(b"walrelay-salt-16"))
    );
}

#[test]
fn client_first_rejections() {
    let cases: &[(&str, &[u8])] = &[
        ("SCRAM-SHA-256-PLUS", b"p=tls-server-end-point,,n=,r=abc"),
        ("SCRAM-SHA-1", b"n,,n=,r=abc"),
    ];
    for (mech, data) in cases {
        let mut s = ScramServer::new(Some(test_verifier()), "u");
        let e = s.client_first(mech, data).unwrap_err();
        assert!(matches!(e, ScramError::UnsupportedMechanism(_)), "{e}");
    }
    let long = [b'a'; 2000];
    for data in [
        &b"p=tls-server-end-point,,n=,r=abc"[..],
        b"n,a=bob,n=,r=abc",
        b"n,,m=ext,n=,r=abc",
        b"n,,r=abc",
        b"n,,n=,r=",
        b"n,,n=,r=a b",
        b"n,,n=,x=abc",
        b"n,,n=,r=abc,bogus",
        b"x,,n=,r=abc",
        b"n,n=,r=abc",
        b"",
        b"n",
        b"\xff\xfe",
        &long[..],
    ] {
        let mut s = ScramServer::new(Some(test_verifier()), "u");
        let e = s.client_first(SCRAM_SHA_256, data).unwrap_err();
        assert!(matches!(e, ScramError::Protocol(_)), "{data:?}: {e}");
    }
    let mut s = ScramServer::new(Some(test_verifier()), "u");
    let e = s
        .client_first(SCRAM_SHA_256, b"p=tls-server-end-point,,n=,r=a")
        .unwrap_err();
    assert!(e.to_string().contains("channel binding"), "{e}");
}

#[test]
fn client_final_rejections() {
    let proof = B64.encode([0u8; 32]);
    let short = B64.encode([0u8; 31]);
    let start = |header: &str| {
        let mut s = ScramServer::new(Some(test_verifier()), "u");
        let first = s.client_first(SCRAM_SHA_256, format!("{header}n=,r=abc").as_bytes());
        let first = String::from_utf8(first.unwrap()).unwrap();
        let nonce = first
            .split(',')
            .next()
            .unwrap()
            .strip_prefix("r=")
            .unwrap()
            .to_string();
        (s, nonce)
    };
    let (mut s, nonce) = start("n,,");
    let ok = s.client_final(format!("c=biws,r={nonce},p={proof}").as_bytes());
    assert!(matches!(ok, Err(ScramError::AuthenticationFailed)));
    for tmpl in [
        "c=eSws,r={n},p={p}",       // gs2 header mismatch
        "c=biws,r={n}x,p={p}",      // nonce mismatch
        "c=biws,r={n},p={s}",       // short proof
        "c=biws,r={n},p=***",       // proof not base64
        "c=biws,r={n},p={p},x=1",   // p not last
        "c=biws,r={n},p={p},p={p}", // p twice
        "c=biws,p={p},r={n}",       // order
        "r={n},c=biws,p={p}",
        "c=biws,r={n}",
        "",
        "c=biws,r={n},bogus,p={p}",
    ] {
        let (mut s, nonce) = start("n,,");
        let msg = tmpl
            .replace("{n}", &nonce)
            .replace("{p}", &proof)
            .replace("{s}", &short);
        let e = s.client_final(msg.as_bytes()).unwrap_err();
        assert!(matches!(e, ScramError::Protocol(_)), "{msg}: {e}");
    }
    // Extensions before p are allowed (and then the password is simply wrong here).
    let (mut s, nonce) = start("y,,");
    let e = s.client_final(format!("c=eSws,r={nonce},x=1,p={proof}").as_bytes());
    assert!(matches!(e, Err(ScramError::AuthenticationFailed)));
}

#[test]
fn out_of_order_calls_are_protocol_errors() {
    let mut s = ScramServer::new(Some(test_verifier()), "u");
    assert!(matches!(
        s.client_final(b"c=biws,r=a,p=b"),
        Err(ScramError::Protocol(_))
    ));
    let mut s = ScramServer::new(Some(test_verifier()), "u");
    s.client_first(SCRAM_SHA_256, b"n,,n=,r=abc").unwrap();
    let e = s.client_first(SCRAM_SHA_256, b"n,,n=,r=abc").unwrap_err();
    assert!(matches!(e, ScramError::Protocol(_)));
    assert!(matches!(
        s.client_final(b"c=biws,r=a,p=b"),
        Err(ScramError::Protocol(_))
    ));
}

fn cheap_verifier() -> ScramVerifier {
    ScramVerifier::from_password("pw", b"salt", 2)
}

proptest! {
    #[test]
    fn arbitrary_client_first_never_panics(mech in ".{0,20}", data in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut s = ScramServer::new(Some(cheap_verifier()), "u");
        let _ = s.client_first(&mech, &data);
        let _ = s.client_first(SCRAM_SHA_256, &data);
        let mut s = ScramServer::new(Some(cheap_verifier()), "u");
        let _ = s.client_first(SCRAM_SHA_256, &data);
    }

    #[test]
    fn arbitrary_client_final_never_panics(data in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut s = ScramServer::new(None, "u");
        s.client_first(SCRAM_SHA_256, b"n,,n=,r=abc").unwrap();
        let r = s.client_final(&data);
        prop_assert!(r.is_err());
    }

    #[test]
    fn structured_client_final_never_panics(
        c in "[a-zA-Z0-9+/=,]{0,10}",
        ext in "[a-z=,]{0,8}",
        p in "[a-zA-Z0-9+/=]{0,60}",
    ) {
        let mut s = ScramServer::new(Some(cheap_verifier()), "u");
        let first = String::from_utf8(s.client_first(SCRAM_SHA_256, b"n,,n=,r=abc").unwrap()).unwrap();
        let nonce = first.split(',').next().unwrap().strip_prefix("r=").unwrap().to_string();
        let msg = format!("c={c},r={nonce}{ext},p={p}");
        let _ = s.client_final(msg.as_bytes());
    }

    #[test]
    fn arbitrary_verifier_strings_never_panic(s in ".{0,120}") {
        let _ = s.parse::<ScramVerifier>();
        let _ = format!("SCRAM-SHA-256${s}").parse::<ScramVerifier>();
    }
}
