//! The TLS files a running process read: which they are, what they held (a reload that finds
//! them changed on disk reads them again: `lifecycle::reload`), and whether their certificates
//! are valid now (a certificate that expired fails every handshake with peers that check it,
//! and nothing else would say why); and [`Swap`], where a configuration built from them is
//! replaced for the connections made afterwards.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::warn;

use crate::config::Resolved;

/// A TLS configuration a reload may replace: each connection takes the one current when it
/// is made (a connection keeps what it was made with).
pub struct Swap<T>(Arc<RwLock<T>>);

impl<T: Clone> Swap<T> {
    pub fn new(v: T) -> Swap<T> {
        Swap(Arc::new(RwLock::new(v)))
    }

    pub fn get(&self) -> T {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn set(&self, v: T) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = v;
    }
}

impl<T> Clone for Swap<T> {
    fn clone(&self) -> Swap<T> {
        Swap(self.0.clone())
    }
}

/// A certificate that expires within this long is warned about at start and at each reload.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 24 * 3600);

/// The TLS files of `cfg` by their keys, and a digest of what each held when read.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles(Vec<(&'static str, PathBuf, Option<u64>)>);

impl TlsFiles {
    /// Reads the files `cfg` names now.
    pub fn read(cfg: &Resolved) -> TlsFiles {
        let mut files = Vec::new();
        if !cfg.link.plaintext {
            for (key, path) in [
                ("link.tls_cert", &cfg.link.tls_cert),
                ("link.tls_key", &cfg.link.tls_key),
                ("link.tls_ca", &cfg.link.tls_ca),
            ] {
                if let Some(p) = path {
                    files.push((key, p.clone()));
                }
            }
        }
        if let Some((c, k)) = cfg.downstream.as_ref().and_then(|d| d.tls.clone()) {
            files.push(("downstream.tls_cert", c));
            files.push(("downstream.tls_key", k));
        }
        TlsFiles(
            files
                .into_iter()
                .map(|(k, p)| {
                    let d = digest(&p);
                    (k, p, d)
                })
                .collect(),
        )
    }

    /// The keys whose file (at the same path in `now`) holds something other than it did.
    pub fn changed(&self, now: &TlsFiles) -> Vec<&'static str> {
        self.0
            .iter()
            .filter(|(k, p, d)| {
                now.0
                    .iter()
                    .any(|(k2, p2, d2)| k2 == k && p2 == p && d2 != d)
            })
            .map(|(k, _, _)| *k)
            .collect()
    }

    /// Logs a warning for each certificate that is not valid now, or expires within
    /// [`EXPIRY_WARNING`].
    pub fn warn_validity(&self, now: SystemTime) {
        for (key, path, _) in self.0.iter().filter(|(k, _, _)| k.ends_with("_cert")) {
            if let Some(w) = validity_warning(path, now) {
                warn!("{key} {}: {w}", path.display());
            }
        }
    }
}

fn digest(path: &Path) -> Option<u64> {
    std::fs::read(path)
        .ok()
        .map(|b| twox_hash::XxHash3_64::oneshot(&b))
}

/// What is wrong with the validity of the first certificate of the PEM file at `path` at
/// `now`, if anything (None too when it does not parse: the configuration's check says so).
pub fn validity_warning(path: &Path, now: SystemTime) -> Option<String> {
    let certs = crate::tls::load_certs(path).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(certs.first()?.as_ref()).ok()?;
    let v = cert.validity();
    let secs = |t: &x509_parser::time::ASN1Time| t.timestamp();
    let now_s = i64::try_from(now.duration_since(UNIX_EPOCH).ok()?.as_secs()).ok()?;
    let (from, to) = (secs(&v.not_before), secs(&v.not_after));
    let when = |t: i64| format_date(t);
    if now_s < from {
        return Some(format!(
            "the certificate is not valid before {}: peers that check it refuse it until then",
            when(from)
        ));
    }
    if now_s > to {
        return Some(format!(
            "the certificate expired on {}: peers that check it refuse it; renew it (SIGHUP reads renewed files)",
            when(to)
        ));
    }
    let left = u64::try_from(to - now_s).ok()?;
    (left < EXPIRY_WARNING.as_secs()).then(|| {
        format!(
            "the certificate expires on {} (in {} days): renew it before then (SIGHUP reads renewed files)",
            when(to),
            left / 86_400
        )
    })
}

/// A UTC time as `YYYY-MM-DD HH:MM:SS UTC`.
fn format_date(unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(format_date(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(format_date(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(format_date(1_796_169_599), "2026-12-01 23:59:59 UTC");
    }

    fn cert_valid(from: time::OffsetDateTime, to: time::OffsetDateTime) -> tempfile::NamedTempFile {
        let mut p = rcgen::CertificateParams::new(vec!["relay".into()]).unwrap();
        p.not_before = from;
        p.not_after = to;
        let key = rcgen::KeyPair::generate().unwrap();
        let pem = p.self_signed(&key).unwrap().pem();
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), pem).unwrap();
        f
    }

    /// A chain whose second block is cut short is refused with the file's name, not read as
    /// the first certificate alone (peers would then fail it with an unknown issuer).
    #[test]
    fn a_truncated_pem_block_is_an_error() {
        let t = time::OffsetDateTime::now_utc();
        let f = cert_valid(t, t + time::Duration::days(300));
        assert!(crate::tls::load_certs(f.path()).is_ok());
        let mut pem = std::fs::read_to_string(f.path()).unwrap();
        let whole = pem.clone();
        pem.push_str(&whole[..whole.len() / 2]);
        pem.push_str("\n-----END CERTIFICATE-----\n");
        std::fs::write(f.path(), pem).unwrap();
        let e = crate::tls::load_certs(f.path()).unwrap_err().to_string();
        assert!(
            e.contains("does not parse") && e.contains(&f.path().display().to_string()),
            "{e}"
        );
    }

    #[test]
    fn expired_early_and_expiring_certificates_are_named() {
        let now = SystemTime::now();
        let t = time::OffsetDateTime::now_utc();
        let day = time::Duration::days(1);
        let expired = cert_valid(t - 30 * day, t - day);
        let w = validity_warning(expired.path(), now).unwrap();
        assert!(w.contains("expired on"), "{w}");
        let early = cert_valid(t + day, t + 300 * day);
        let w = validity_warning(early.path(), now).unwrap();
        assert!(w.contains("not valid before"), "{w}");
        let soon = cert_valid(t - day, t + 3 * day);
        let w = validity_warning(soon.path(), now).unwrap();
        assert!(w.contains("expires on") && w.contains("days)"), "{w}");
        let fine = cert_valid(t - day, t + 300 * day);
        assert_eq!(validity_warning(fine.path(), now), None);
    }
}
