//! rustls configurations (ring provider): TLS toward standbys, TLS toward the primary per the
//! conninfo's sslmode. The link's TLS is configured through tonic in [`crate::link`].

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::conninfo::{ConnInfo, SslMode};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The cause is in the message, so not also the `source()` (see `SpoolError::Io`);
    /// likewise for `Rustls`.
    #[error("cannot read {path}: {cause}")]
    Read { path: String, cause: std::io::Error },
    #[error("{path} holds no PEM certificate")]
    NoCert { path: String },
    #[error("{path} holds a PEM certificate that does not parse ({why}): is the file whole?")]
    BadPem { path: String, why: String },
    #[error("{path} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)")]
    NoKey { path: String },
    #[error("TLS configuration: {0}")]
    Rustls(rustls::Error),
    #[error("invalid CA certificates in {path}: {why}")]
    BadCa { path: String, why: String },
}

impl From<rustls::Error> for TlsError {
    fn from(e: rustls::Error) -> Self {
        TlsError::Rustls(e)
    }
}

/// The crypto provider walrelay uses everywhere.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Installs ring as the process-wide default provider (needed by libraries that use the
/// default, such as tonic). Safe to call more than once.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let p = path.display().to_string();
    let data = std::fs::read(path).map_err(|cause| TlsError::Read {
        path: p.clone(),
        cause,
    })?;
    // A block that does not parse (a truncated intermediate, say) is an error: left out, or
    // sent as it is, the chain would pass here and fail at peers with an unknown issuer.
    let bad = |why: String| TlsError::BadPem {
        path: p.clone(),
        why,
    };
    let certs = rustls_pemfile::certs(&mut &data[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    for (i, c) in certs.iter().enumerate() {
        x509_parser::parse_x509_certificate(c.as_ref())
            .map_err(|e| bad(format!("certificate {} of the file: {e}", i + 1)))?;
    }
    if certs.is_empty() {
        return Err(TlsError::NoCert { path: p });
    }
    Ok(certs)
}

pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let p = path.display().to_string();
    let data = std::fs::read(path).map_err(|cause| TlsError::Read {
        path: p.clone(),
        cause,
    })?;
    rustls_pemfile::private_key(&mut &data[..])
        .ok()
        .flatten()
        .ok_or(TlsError::NoKey { path: p })
}

/// Which file of a certificate and key pair is wrong.
#[derive(Debug, thiserror::Error)]
pub enum PairError {
    #[error("{0}")]
    Cert(TlsError),
    #[error("{0}")]
    Key(TlsError),
}

/// Reads and parses a certificate chain and its private key, and checks that the key is the
/// certificate's (what a TLS configuration built from them would refuse at run time).
pub fn check_pair(cert: &Path, key: &Path) -> Result<(), PairError> {
    let certs = load_certs(cert).map_err(PairError::Cert)?;
    let k = load_key(key).map_err(PairError::Key)?;
    rustls::sign::CertifiedKey::from_der(certs, k, &provider())
        .map(|_| ())
        .map_err(|e| match e {
            rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented => {
                PairError::Cert(TlsError::Rustls(e))
            }
            // The key does not parse, or is not the certificate's.
            e => PairError::Key(TlsError::Rustls(e)),
        })
}

/// Reads and parses a file of CA certificates.
pub fn check_ca(path: &Path) -> Result<(), TlsError> {
    root_store(path).map(|_| ())
}

fn root_store(path: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in load_certs(path)? {
        roots.add(c).map_err(|e| TlsError::BadCa {
            path: path.display().to_string(),
            why: e.to_string(),
        })?;
    }
    Ok(roots)
}

/// Server config for standbys connecting to the downstream (ALPN "postgresql" for PG 17+
/// direct TLS negotiation).
pub fn standby_server_config(
    cert: &Path,
    key: &Path,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(load_certs(cert)?, load_key(key)?)?;
    cfg.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(Arc::new(cfg))
}

/// Client config for the upstream's connection to the primary, following libpq's sslmode:
/// require, prefer and allow (when they use TLS) encrypt without verifying unless
/// `sslrootcert` is given; then they check the chain as verify-ca does (libpq's
/// `initialize_SSL` verifies the chain whenever the root file exists: "if a root CA file is
/// present, the behavior of sslmode=require will be the same as that of verify-ca", and under
/// prefer a failed check is a failed handshake, after which it tries in the clear).
/// verify-ca checks the chain, verify-full the chain and the host name.
pub fn primary_client_config(ci: &ConnInfo) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?;
    let builder = match (ci.sslmode, &ci.sslrootcert) {
        (SslMode::VerifyFull, Some(ca)) => builder.with_root_certificates(root_store(ca)?),
        (SslMode::VerifyCa | SslMode::Require | SslMode::Prefer | SslMode::Allow, Some(ca)) => {
            let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(root_store(ca)?),
                provider(),
            )
            .build()
            .map_err(|e| TlsError::BadCa {
                path: ca.display().to_string(),
                why: e.to_string(),
            })?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly(inner)))
        }
        _ => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider()))),
    };
    let cfg = match (&ci.sslcert, &ci.sslkey) {
        (Some(c), Some(k)) => builder.with_client_auth_cert(load_certs(c)?, load_key(k)?)?,
        _ => builder.with_no_client_auth(),
    };
    Ok(Arc::new(cfg))
}

/// sslmode=require: encryption without authentication of the server, as libpq does.
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// sslmode=verify-ca: the chain must lead to the CA; the name is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end: &CertificateDer<'_>,
        inter: &[CertificateDer<'_>],
        name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end, inter, name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(m, c, d)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(m, c, d)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests;
