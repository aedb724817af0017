//! The link's rustls configurations: the upstream's server (client certificates required when
//! `link.tls_ca` is set) and the downstream's client; on both ends, with `link.peer_names`,
//! the peer's certificate must also carry one of those names (DNS subject alternative names),
//! not only chain to the CA.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use super::LinkError;
use crate::config::LinkConfig;
use crate::tls::{load_certs, load_key, provider};

fn tls_err(e: impl std::fmt::Display) -> LinkError {
    LinkError::Tls(e.to_string())
}

/// The CA certificates of `link.tls_ca`.
fn roots(link: &LinkConfig) -> Result<Option<Arc<rustls::RootCertStore>>, LinkError> {
    let Some(ca) = &link.tls_ca else {
        return Ok(None);
    };
    let mut roots = rustls::RootCertStore::empty();
    for c in load_certs(ca).map_err(tls_err)? {
        roots
            .add(c)
            .map_err(|e| tls_err(format!("{}: {e}", ca.display())))?;
    }
    Ok(Some(Arc::new(roots)))
}

/// The upstream's TLS server on the link (ALPN h2). With `link.tls_ca` a client certificate
/// chaining to it is required (and, with `link.peer_names`, carrying one of them).
pub fn server_config(link: &LinkConfig) -> Result<Arc<rustls::ServerConfig>, LinkError> {
    let (Some(cert), Some(key)) = (&link.tls_cert, &link.tls_key) else {
        return Err(LinkError::Tls(
            "link.tls_cert and link.tls_key are required unless link.plaintext = true".into(),
        ));
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(tls_err)?;
    let builder = match roots(link)? {
        Some(roots) => {
            let inner =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider())
                    .build()
                    .map_err(tls_err)?;
            builder.with_client_cert_verifier(Arc::new(ClientNames {
                inner,
                names: link.peer_names.clone(),
            }))
        }
        None => builder.with_no_client_auth(),
    };
    let certs = load_certs(cert).map_err(tls_err)?;
    let key = load_key(key).map_err(tls_err)?;
    let mut cfg = builder.with_single_cert(certs, key).map_err(tls_err)?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}

/// The downstream's TLS client on the link (ALPN h2): the upstream's certificate must chain
/// to `link.tls_ca` and name the address (or `link.tls_server_name`), and with
/// `link.peer_names` carry one of them; our own certificate is presented for mutual TLS.
pub fn client_config(link: &LinkConfig) -> Result<Arc<rustls::ClientConfig>, LinkError> {
    let roots = roots(link)?.ok_or_else(|| {
        LinkError::Tls("link.tls_ca is required to verify the upstream's certificate".into())
    })?;
    let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider())
        .build()
        .map_err(tls_err)?;
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(tls_err)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ServerNames {
            inner,
            names: link.peer_names.clone(),
        }));
    let mut cfg = match (&link.tls_cert, &link.tls_key) {
        (Some(c), Some(k)) => {
            let certs = load_certs(c).map_err(tls_err)?;
            let key = load_key(k).map_err(tls_err)?;
            builder.with_client_auth_cert(certs, key).map_err(tls_err)?
        }
        _ => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}

/// Part of the error when a certificate carries none of `link.peer_names` (the link
/// listener counts these under their own reason).
pub const PEER_NAMES_ERROR: &str = "carries none of link.peer_names";

/// Ok when `names` is empty or the certificate is valid for one of them.
fn check_names(end_entity: &CertificateDer<'_>, names: &[String]) -> Result<(), rustls::Error> {
    if names.is_empty() {
        return Ok(());
    }
    let ee = webpki::EndEntityCert::try_from(end_entity)
        .map_err(|e| rustls::Error::General(format!("cannot parse the peer's certificate: {e}")))?;
    let carries = |n: &String| {
        ServerName::try_from(n.as_str())
            .is_ok_and(|sn| ee.verify_is_valid_for_subject_name(&sn).is_ok())
    };
    if names.iter().any(carries) {
        return Ok(());
    }
    Err(rustls::Error::General(format!(
        "the peer's certificate {PEER_NAMES_ERROR} ({}): give it one of these names, or add its name there",
        names.join(", ")
    )))
}

/// The upstream's check of a downstream's certificate: the chain, then the names.
#[derive(Debug)]
struct ClientNames {
    inner: Arc<dyn ClientCertVerifier>,
    names: Vec<String>,
}

impl ClientCertVerifier for ClientNames {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }
    fn verify_client_cert(
        &self,
        end: &CertificateDer<'_>,
        inter: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let ok = self.inner.verify_client_cert(end, inter, now)?;
        check_names(end, &self.names)?;
        Ok(ok)
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(m, c, d)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(m, c, d)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The downstream's check of the upstream's certificate: chain and address name, then the
/// names.
#[derive(Debug)]
struct ServerNames {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    names: Vec<String>,
}

impl ServerCertVerifier for ServerNames {
    fn verify_server_cert(
        &self,
        end: &CertificateDer<'_>,
        inter: &[CertificateDer<'_>],
        name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let ok = self.inner.verify_server_cert(end, inter, name, ocsp, now)?;
        check_names(end, &self.names)?;
        Ok(ok)
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(m, c, d)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(m, c, d)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
