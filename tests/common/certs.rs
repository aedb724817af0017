//! Throw-away certificates for TLS tests (rcgen): a CA, certificates it signs, and a rogue CA.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pub cert_pem: String,
}

/// PEM files of one certificate and its key.
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    pub fn write_ca(&self, dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(format!("{name}.pem"));
        std::fs::write(&p, &self.cert_pem).unwrap();
        p
    }

    /// A certificate for `names` (DNS names or IPs) signed by this CA.
    pub fn issue(&self, dir: &Path, file: &str, names: &[&str]) -> CertFiles {
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("walrelay"),
        );
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let files = CertFiles {
            cert: dir.join(format!("{file}.crt")),
            key: dir.join(format!("{file}.key")),
        };
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    }
}
