//! Throw-away certificates (rcgen): a CA, certificates it signs, and the mutual-TLS material of
//! a link ([`LinkCerts`]). For tests, the bench and the demo; never for production.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// Generating or writing certificates failed.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("generating a certificate for {what}: {source}")]
    Generate {
        what: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("writing {path}: {source} (is the directory writable?)")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A certificate authority that signs certificates.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pub cert_pem: String,
}

/// PEM files of one certificate and its key.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn generate(what: &str) -> impl Fn(rcgen::Error) -> CertError + '_ {
    move |source| CertError::Generate {
        what: what.to_string(),
        source,
    }
}

fn write(path: &Path, text: &str) -> Result<(), CertError> {
    std::fs::write(path, text).map_err(|source| CertError::Write {
        path: path.to_path_buf(),
        source,
    })
}

impl Ca {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Result<Ca, CertError> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(generate(name))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().map_err(generate(name))?;
        let cert = params.self_signed(&key).map_err(generate(name))?;
        Ok(Ca {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// Writes the CA certificate to `<dir>/<name>.pem` and returns its path.
    pub fn write_ca(&self, dir: &Path, name: &str) -> Result<PathBuf, CertError> {
        let p = dir.join(format!("{name}.pem"));
        write(&p, &self.cert_pem)?;
        Ok(p)
    }

    /// A certificate for `names` (DNS names or IPs) signed by this CA, written to
    /// `<dir>/<file>.crt` and `<dir>/<file>.key`.
    pub fn issue(&self, dir: &Path, file: &str, names: &[&str]) -> Result<CertFiles, CertError> {
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .map_err(generate(file))?;
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("walrelay"),
        );
        let key = KeyPair::generate().map_err(generate(file))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(generate(file))?;
        let files = CertFiles {
            cert: dir.join(format!("{file}.crt")),
            key: dir.join(format!("{file}.key")),
        };
        write(&files.cert, &cert.pem())?;
        write(&files.key, &key.serialize_pem())?;
        Ok(files)
    }
}

/// Mutual TLS for one link: a CA, the upstream's certificate (for `localhost` and `127.0.0.1`)
/// and the downstream's client certificate.
#[derive(Debug, Clone)]
pub struct LinkCerts {
    pub ca: PathBuf,
    pub upstream: CertFiles,
    pub downstream: CertFiles,
}

impl LinkCerts {
    /// Generates the files in `dir` (which must exist).
    pub fn generate(dir: &Path) -> Result<LinkCerts, CertError> {
        let ca = Ca::new("walrelay throw-away link CA")?;
        Ok(LinkCerts {
            ca: ca.write_ca(dir, "link-ca")?,
            upstream: ca.issue(dir, "link-upstream", &["localhost", "127.0.0.1"])?,
            downstream: ca.issue(dir, "link-downstream", &["walrelay-downstream"])?,
        })
    }

    /// The `[link]` keys of the upstream half (`tls_cert`, `tls_key`, `tls_ca`), TOML lines.
    pub fn upstream_toml(&self) -> String {
        tls_toml(&self.upstream, &self.ca)
    }

    /// The `[link]` keys of the downstream half, TOML lines; the downstream must dial the
    /// upstream as `localhost:PORT` (or set `tls_server_name = "localhost"`).
    pub fn downstream_toml(&self) -> String {
        tls_toml(&self.downstream, &self.ca)
    }
}

fn tls_toml(files: &CertFiles, ca: &Path) -> String {
    format!(
        "tls_cert = {}\ntls_key = {}\ntls_ca = {}\n",
        toml_str(&files.cert.to_string_lossy()),
        toml_str(&files.key.to_string_lossy()),
        toml_str(&ca.to_string_lossy())
    )
}

/// A TOML basic string holding `s` (quotes, backslashes and control characters escaped).
pub fn toml_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
