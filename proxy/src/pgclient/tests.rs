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
