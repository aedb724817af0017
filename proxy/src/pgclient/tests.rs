use super::auth::{authenticate, MAX_SCRAM_ITERATIONS};
use super::*;

fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test]
async fn every_skipped_host_is_named_with_its_reason() {
    // A listener that accepts but never answers: the attempt times out.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let refused = closed_port();
    let ci = ConnInfo::parse(&format!(
        "host=127.0.0.1,::1 hostaddr=127.0.0.1,127.0.0.1 port={refused},{silent_port} \
         user=u sslmode=disable connect_timeout=1 target_session_attrs=read-write"
    ))
    .unwrap();
    let e = match connect(&ci, "t", 1 << 20).await {
        Err(e) => e,
        Ok(_) => panic!("connected to nothing"),
    };
    let PgClientError::NoHost { wanted, failures } = &e else {
        panic!("expected NoHost, got {e}");
    };
    assert_eq!(*wanted, TargetSessionAttrs::ReadWrite);
    assert_eq!(failures.len(), 2);
    assert!(matches!(failures[0].error, PgClientError::Connect { .. }));
    assert!(matches!(failures[1].error, PgClientError::Timeout(_)));
    let msg = e.to_string();
    assert!(
        msg.starts_with("no host of upstream.primary is a primary (read-write): "),
        "{msg}"
    );
    assert!(msg.contains(&format!("127.0.0.1:{refused}: ")), "{msg}");
    assert!(
        msg.contains(&format!("::1 (127.0.0.1):{silent_port}: timed out")),
        "{msg}"
    );
    held.abort();
}

#[tokio::test]
async fn one_host_keeps_its_own_error() {
    let port = closed_port();
    let ci = ConnInfo::parse(&format!("host=127.0.0.1 port={port} user=u")).unwrap();
    match connect(&ci, "t", 1 << 20).await {
        Err(PgClientError::Connect { addr, .. }) => {
            assert_eq!(addr, format!("127.0.0.1:{port}"))
        }
        Err(e) => panic!("expected a connect error, got {e}"),
        Ok(_) => panic!("connected to nothing"),
    }
}

/// A server that agrees to TLS, then answers the ClientHello with bytes that are not TLS;
/// on the next connection it reads the first packet and refuses with a pg_hba error.
/// Returns its port and the first packet's code of each connection (80877103: SSLRequest,
/// 196608: a protocol 3.0 startup).
async fn broken_tls_server() -> (u16, tokio::task::JoinHandle<Vec<u32>>) {
    use tokio::io::AsyncReadExt;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut codes = Vec::new();
        for conn in 0..2 {
            let (mut s, _) = l.accept().await.unwrap();
            let mut head = [0u8; 8];
            s.read_exact(&mut head).await.unwrap();
            codes.push(u32::from_be_bytes([head[4], head[5], head[6], head[7]]));
            if conn == 0 {
                s.write_all(b"S").await.unwrap();
                let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
            } else {
                let mut out = BytesMut::new();
                let e = ErrorFields::fatal("28000", "no pg_hba.conf entry for host, SSL off");
                walrelay_pgwire::encode::error_response(&mut out, &e);
                s.write_all(&out).await.unwrap();
            }
        }
        codes
    });
    (port, task)
}

#[tokio::test]
async fn prefer_tries_the_clear_after_a_failed_tls_handshake() {
    let (port, server) = broken_tls_server().await;
    let ci = ConnInfo::parse(&format!(
        "host=127.0.0.1 port={port} user=u sslmode=prefer connect_timeout=5"
    ))
    .unwrap();
    let e = match connect(&ci, "t", 1 << 20).await {
        Err(e) => e,
        Ok(_) => panic!("connected to a fake server"),
    };
    let PgClientError::Fallback {
        tls_first,
        first,
        second,
    } = &e
    else {
        panic!("expected both tries' errors, got {e}");
    };
    assert!(*tls_first);
    assert!(
        matches!(**first, PgClientError::TlsHandshake { .. }),
        "{first}"
    );
    assert!(matches!(**second, PgClientError::Server(_)), "{second}");
    // The second connection went straight to the startup packet, in the clear.
    assert_eq!(server.await.unwrap(), vec![80877103, 196608]);
    let msg = e.to_string();
    assert!(msg.starts_with("both tries of sslmode=prefer failed: with TLS, the TLS handshake with the primary at 127.0.0.1:"), "{msg}");
    assert!(
        msg.contains(
            "; then in the clear, the primary refused the connection: FATAL: no pg_hba.conf entry"
        ),
        "{msg}"
    );
}

#[tokio::test]
async fn require_makes_no_second_try_after_a_failed_tls_handshake() {
    let (port, server) = broken_tls_server().await;
    let ci = ConnInfo::parse(&format!(
        "host=127.0.0.1 port={port} user=u sslmode=require connect_timeout=5"
    ))
    .unwrap();
    match connect(&ci, "t", 1 << 20).await {
        Err(PgClientError::TlsHandshake { .. }) => {}
        Err(e) => panic!("expected the handshake's error, got {e}"),
        Ok(_) => panic!("connected to a fake server"),
    }
    server.abort();
}

/// A primary scripted on an in-memory pipe: asks for SCRAM-SHA-256, then answers the
/// client-first-message with `server_first(client nonce)`. Returns what `authenticate` says.
async fn scram_against(server_first: impl Fn(&str) -> String + Send + 'static) -> PgClientError {
    use tokio::io::AsyncReadExt;
    let (client, mut server) = tokio::io::duplex(1 << 16);
    let primary = tokio::spawn(async move {
        let mut out = BytesMut::new();
        walrelay_pgwire::encode::auth_sasl(&mut out, &["SCRAM-SHA-256"]);
        server.write_all(&out).await.unwrap();
        let mut buf = BytesMut::new();
        let initial = loop {
            if let Some(m) = parse_tagged(&mut buf, |_| 1 << 16).unwrap() {
                break m;
            }
            assert!(server.read_buf(&mut buf).await.unwrap() > 0);
        };
        let (_, first) = walrelay_pgwire::parse_sasl_initial(&initial.body).unwrap();
        let first = std::str::from_utf8(&first).unwrap();
        let nonce = first.rsplit_once("r=").unwrap().1;
        out.clear();
        walrelay_pgwire::encode::auth_sasl_continue(&mut out, server_first(nonce).as_bytes());
        server.write_all(&out).await.unwrap();
        server
    });
    let ci = ConnInfo::parse("host=primary user=replicator password=secret").unwrap();
    let (r, mut w) = tokio::io::split(client);
    let e = authenticate(&mut MsgReader::new(r), &mut w, &ci, 1 << 20)
        .await
        .expect_err("authenticated by a scripted primary");
    drop(primary.await.unwrap());
    e
}

/// postgres-protocol computes at most 100,000 iterations, where libpq takes any count: a
/// primary whose scram_iterations is higher is told apart, with what to change.
#[tokio::test]
async fn an_iteration_count_above_the_cap_says_what_to_change() {
    let e = scram_against(|nonce| format!("r={nonce}abc,s=c2FsdHNhbHQ=,i=100001")).await;
    let msg = e.to_string();
    assert!(msg.contains("takes 100001 iterations"), "{msg}");
    assert!(msg.contains("scram_iterations to at most 100000"), "{msg}");
    assert!(msg.contains("\"replicator\""), "{msg}");
    // Anything else wrong with the message is said as it is.
    let e = scram_against(|_| "r=someone-elses-nonce,s=c2FsdA==,i=4096".to_string()).await;
    let msg = e.to_string();
    assert!(
        msg.contains("invalid server-first-message: invalid nonce"),
        "{msg}"
    );
}

/// The cap the message names is postgres-protocol's: one iteration more is refused.
#[test]
fn the_iteration_cap_is_postgres_protocols() {
    use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
    let update = |i: u64| {
        let mut c = ScramSha256::new(b"pw", ChannelBinding::unsupported());
        let first = std::str::from_utf8(c.message()).unwrap().to_string();
        let nonce = first.rsplit_once("r=").unwrap().1.to_string();
        c.update(format!("r={nonce}x,s=c2FsdA==,i={i}").as_bytes())
    };
    assert!(update(MAX_SCRAM_ITERATIONS + 1).is_err());
    assert!(update(MAX_SCRAM_ITERATIONS).is_ok());
}

/// One message of a primary during authentication: mostly AuthenticationRequests of the
/// codes walrelay knows, with bodies that are garbage or a plausible start.
fn auth_msg() -> impl proptest::strategy::Strategy<Value = (u8, u32, Vec<u8>)> {
    use proptest::prelude::*;
    let tag = prop_oneof![8 => Just(b'R'), 1 => Just(b'E'), 1 => any::<u8>()];
    let code = prop_oneof![
        Just(0u32),
        Just(3),
        Just(5),
        Just(10),
        Just(11),
        Just(12),
        any::<u32>()
    ];
    let body = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..48),
        Just(b"SCRAM-SHA-256\0\0".to_vec()),
        Just(b"r=x,s=c2FsdA==,i=4096".to_vec()),
        Just(b"v=dmVyaWZpZXI=".to_vec()),
    ];
    (tag, code, body)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// Whatever a primary (or whoever answers in its place) sends during authentication,
    /// `authenticate` returns, never panics, and succeeds only on an AuthenticationOk.
    #[test]
    fn any_authentication_exchange_ends_without_panic(
        msgs in proptest::collection::vec(auth_msg(), 0..6)
    ) {
        use bytes::BufMut;
        let ok_sent = msgs.iter().any(|(tag, code, _)| *tag == b'R' && *code == 0);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let result = rt.block_on(async {
            let (client, mut server) = tokio::io::duplex(1 << 16);
            let mut out = BytesMut::new();
            for (tag, code, body) in &msgs {
                walrelay_pgwire::encode::tagged(&mut out, *tag, |b| {
                    b.put_u32(*code);
                    b.put_slice(body);
                });
            }
            server.write_all(&out).await.unwrap();
            server.shutdown().await.unwrap();
            let ci = ConnInfo::parse("host=primary user=replicator password=secret").unwrap();
            let (r, mut w) = tokio::io::split(client);
            let r = authenticate(&mut MsgReader::new(r), &mut w, &ci, 1 << 16).await;
            drop(server);
            r
        });
        proptest::prop_assert!(result.is_err() || ok_sent, "{msgs:?}");
    }
}
