use super::*;
use futures::FutureExt;
use tonic::codegen::Service;

fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn plaintext_dialer(ports: &[u16]) -> Dialer {
    let link = LinkConfig {
        plaintext: true,
        connect_timeout_secs: 2,
        ..Default::default()
    };
    let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let tls = crate::link::client_tls(&link).unwrap();
    Dialer::new(&link, &UpstreamAddrs::parse(&addrs).unwrap(), None, tls)
}

/// Whether a connection arrived on `l` (the dial that made it has returned).
async fn accepted(l: &tokio::net::TcpListener) -> bool {
    let wait = std::time::Duration::from_secs(10);
    matches!(tokio::time::timeout(wait, l.accept()).await, Ok(Ok(_)))
}

/// Whether a connection is waiting on `l` right now: for listeners no dial went to.
fn dialed(l: &tokio::net::TcpListener) -> bool {
    l.accept().now_or_never().is_some_and(|r| r.is_ok())
}

#[tokio::test]
async fn each_connection_tries_the_addresses_from_the_first() {
    let a = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let b = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    // After a and b are bound, so that the port released here cannot be one of theirs.
    let closed = closed_port();
    let (pa, pb) = (
        a.local_addr().unwrap().port(),
        b.local_addr().unwrap().port(),
    );
    let mut dialer = plaintext_dialer(&[closed, pa, pb]);
    let uri = http::Uri::from_static("http://ignored:1");

    // The first address refuses: the second takes the connection, the third is not tried.
    for _ in 0..2 {
        dialer.call(uri.clone()).await.unwrap();
        assert!(accepted(&a).await, "the second address was not used");
        assert!(!dialed(&b), "the third address was dialed too");
    }
    // With the second gone, the third; with it back, the second again (from the first).
    drop(a);
    dialer.call(uri.clone()).await.unwrap();
    assert!(accepted(&b).await);
    let a = tokio::net::TcpListener::bind(("127.0.0.1", pa))
        .await
        .unwrap();
    dialer.call(uri.clone()).await.unwrap();
    assert!(accepted(&a).await && !dialed(&b));

    // None reachable: every address is named, in order.
    drop((a, b));
    let e = dialer.call(uri).await.map(|_| ()).unwrap_err();
    assert_eq!(e.0.len(), 3);
    let msg = e.to_string();
    let at = |p: u16| msg.find(&format!("127.0.0.1:{p} (")).unwrap_or(usize::MAX);
    assert!(
        at(closed) < at(pa) && at(pa) < at(pb) && at(pb) < usize::MAX,
        "{msg}"
    );
    assert!(
        msg.starts_with("cannot connect to the upstream half at any of"),
        "{msg}"
    );
}

#[test]
fn tls_needs_the_ca() {
    let link = LinkConfig::default();
    let e = crate::link::client_tls(&link).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("link.tls_ca"), "{e}");
}

/// While every address is down, the stream dials them all every second: an address that
/// keeps failing for the same reason is logged once a minute (with its count), as the
/// stream's own reason is, not at every attempt.
#[tokio::test]
async fn an_address_that_keeps_failing_is_logged_once_a_minute() {
    let (a, b) = (closed_port(), closed_port());
    let uri = http::Uri::from_static("http://ignored:1");
    let mut dialer = plaintext_dialer(&[a, b]);
    let e = dialer.call(uri.clone()).await.map(|_| ()).unwrap_err();
    let why = e.0[0].1.clone();
    // The first failure was logged: the same one again is not, however often it comes.
    for _ in 0..4 {
        dialer.call(uri.clone()).await.map(|_| ()).unwrap_err();
    }
    assert_eq!(dialer.failure_to_log(0, &why), None);
    // A dialer that has not seen it logs it; a new reason is logged at once.
    assert_eq!(
        plaintext_dialer(&[a, b]).failure_to_log(0, &why),
        Some(String::new())
    );
    assert!(dialer.failure_to_log(0, "timed out").is_some());
}
