use super::*;

/// A CA: its certificate (PEM) and what signs with it.
fn ca(name: &str) -> (String, rcgen::Issuer<'static, rcgen::KeyPair>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(rcgen::DnType::CommonName, name);
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let pem = p.self_signed(&key).unwrap().pem();
    (pem, rcgen::Issuer::new(p, key))
}

/// A server configuration presenting a certificate for `name` signed by `issuer`.
fn server(
    name: &str,
    issuer: &rcgen::Issuer<'static, rcgen::KeyPair>,
) -> Arc<rustls::ServerConfig> {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec![name.to_string()])
        .unwrap()
        .signed_by(&key, issuer)
        .unwrap();
    let der = PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], der)
        .unwrap();
    Arc::new(cfg)
}

/// Moves what `from` has to send into `to`.
fn transfer(
    from: &mut rustls::Connection,
    to: &mut rustls::Connection,
) -> Result<usize, rustls::Error> {
    let mut buf = Vec::new();
    while from.wants_write() {
        from.write_tls(&mut buf).unwrap();
    }
    let mut rd = &buf[..];
    while !rd.is_empty() {
        to.read_tls(&mut rd).unwrap();
        to.process_new_packets()?;
    }
    Ok(buf.len())
}

/// A handshake in memory between the upstream's client configuration for `conninfo` and
/// `server`; the client's error if it refuses the server.
fn handshake(conninfo: &str, server: Arc<rustls::ServerConfig>) -> Result<(), rustls::Error> {
    let ci = ConnInfo::parse(conninfo).unwrap();
    let cfg = primary_client_config(&ci).unwrap();
    let name = ServerName::try_from(ci.hosts[0].host.clone()).unwrap();
    let mut c = rustls::Connection::Client(rustls::ClientConnection::new(cfg, name).unwrap());
    let mut s = rustls::Connection::Server(rustls::ServerConnection::new(server).unwrap());
    for _ in 0..10 {
        let sent = transfer(&mut c, &mut s)?;
        let answered = transfer(&mut s, &mut c)?;
        if !c.is_handshaking() && !s.is_handshaking() {
            return Ok(());
        }
        assert!(sent + answered > 0, "the handshake stalled");
    }
    panic!("the handshake did not end");
}

/// As libpq: "if a root CA file is present, the behavior of sslmode=require will be the same
/// as that of verify-ca", and libpq's `initialize_SSL` verifies the chain whenever the root
/// file exists, so `prefer` and `allow` (when they use TLS) check it too. A server whose
/// certificate another CA signed is refused; one of the CA given passes whatever its name.
#[test]
fn a_root_certificate_makes_every_tls_mode_check_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let (ours_pem, ours) = ca("our CA");
    let (_, theirs) = ca("their CA");
    let root = dir.path().join("root.crt");
    std::fs::write(&root, ours_pem).unwrap();
    for mode in ["require", "prefer", "allow"] {
        let with_root = format!(
            "host=db.example user=u sslmode={mode} sslrootcert={}",
            root.display()
        );
        let e = handshake(&with_root, server("db.example", &theirs)).unwrap_err();
        assert!(
            matches!(
                e,
                rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)
            ),
            "{mode}: {e}"
        );
        handshake(&with_root, server("elsewhere.example", &ours)).unwrap();
        // Without a root certificate they encrypt only, as libpq's do.
        handshake(
            &format!("host=db.example user=u sslmode={mode}"),
            server("db.example", &theirs),
        )
        .unwrap();
    }
}
