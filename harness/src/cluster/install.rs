//! Finding the PostgreSQL server binaries.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{run_sync, ClusterError};

const INSTALL_HINT: &str =
    "install PostgreSQL server binaries (Debian: apt-get install postgresql) \
     or set PG_BIN to their bin directory";

/// A PostgreSQL installation: the directory holding `postgres`, `initdb`, `pg_ctl`, ...
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgInstall {
    pub bindir: PathBuf,
    /// Major version (15 for 15.18).
    pub major: u32,
}

impl PgInstall {
    /// Finds the server binaries, in order: `$PG_BIN`, `pg_config --bindir`, the directory of
    /// `pg_ctl` found on `PATH` (symlinks resolved), the highest `/usr/lib/postgresql/*/bin`.
    pub fn discover() -> Result<PgInstall, ClusterError> {
        if let Some(dir) = std::env::var_os("PG_BIN").filter(|d| !d.is_empty()) {
            // An explicit choice that doesn't work is an error, not a reason to look elsewhere.
            return PgInstall::from_bindir(dir).map_err(|e| {
                ClusterError::NotFound(format!("PG_BIN does not point at usable binaries: {e}"))
            });
        }
        let mut tried = Vec::new();
        if let Some(pg_config) = find_on_path("pg_config") {
            if let Ok(out) = Command::new(&pg_config).arg("--bindir").output() {
                let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
                if out.status.success() && !dir.is_empty() {
                    match PgInstall::from_bindir(&dir) {
                        Ok(i) => return Ok(i),
                        Err(e) => tried.push(format!("pg_config --bindir ({dir}): {e}")),
                    }
                }
            }
        }
        if let Some(pg_ctl) = find_on_path("pg_ctl") {
            let real = std::fs::canonicalize(&pg_ctl).unwrap_or(pg_ctl);
            if let Some(dir) = real.parent() {
                match PgInstall::from_bindir(dir) {
                    Ok(i) => return Ok(i),
                    Err(e) => tried.push(format!("pg_ctl on PATH ({}): {e}", real.display())),
                }
            }
        }
        for dir in debian_bindirs(Path::new("/usr/lib/postgresql")) {
            match PgInstall::from_bindir(&dir) {
                Ok(i) => return Ok(i),
                Err(e) => tried.push(e.to_string()),
            }
        }
        let mut msg = format!("no PostgreSQL server binaries found: {INSTALL_HINT}");
        if !tried.is_empty() {
            msg.push_str(&format!(" (tried: {})", tried.join("; ")));
        }
        Err(ClusterError::NotFound(msg))
    }

    /// Uses the binaries in `bindir`, which must contain `postgres` and `initdb`.
    pub fn from_bindir(bindir: impl AsRef<Path>) -> Result<PgInstall, ClusterError> {
        let bindir = bindir.as_ref();
        let bindir = std::fs::canonicalize(bindir).unwrap_or_else(|_| bindir.to_path_buf());
        for tool in ["postgres", "initdb"] {
            if !bindir.join(tool).is_file() {
                return Err(ClusterError::NotFound(format!(
                    "{} has no `{tool}`: {INSTALL_HINT}",
                    bindir.display()
                )));
            }
        }
        // `postgres --version` is answered before the refuse-to-run-as-root check.
        let mut cmd = Command::new(bindir.join("postgres"));
        cmd.arg("--version");
        let out = run_sync(cmd)?;
        let text = String::from_utf8_lossy(&out.stdout);
        let major = parse_major(&text).ok_or_else(|| {
            ClusterError::Other(format!("cannot parse `postgres --version` output {text:?}"))
        })?;
        Ok(PgInstall { bindir, major })
    }

    /// Path of a program in the bin directory.
    pub fn bin(&self, name: &str) -> PathBuf {
        self.bindir.join(name)
    }
}

/// Major version from `postgres --version` output: "postgres (PostgreSQL) 15.18 (Debian ...)"
/// → 15, "16.2" → 16, "17devel" → 17.
pub(crate) fn parse_major(version_output: &str) -> Option<u32> {
    let rest = match version_output.find("PostgreSQL)") {
        Some(i) => &version_output[i + "PostgreSQL)".len()..],
        None => version_output,
    };
    let token = rest.split_whitespace().next()?;
    let digits: String = token.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// `<base>/<N>/bin` directories, highest version first.
fn debian_bindirs(base: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(base) else {
        return Vec::new();
    };
    let mut found: Vec<(Vec<u32>, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let key: Vec<u32> = name
                .split('.')
                .map(|p| p.parse().ok())
                .collect::<Option<_>>()?;
            let bin = e.path().join("bin");
            (bin.join("postgres").is_file() && bin.join("initdb").is_file()).then_some((key, bin))
        })
        .collect();
    found.sort();
    found.into_iter().rev().map(|(_, p)| p).collect()
}
