//! Every PostgreSQL major on this machine: the system one plus those that
//! `scripts/install-pg-majors.sh` unpacked into the cache directory (see [`pg_cache_dir`]).

use std::path::{Path, PathBuf};

use super::PgInstall;

/// Where `scripts/install-pg-majors.sh` puts extra majors (`<dir>/<major>/bin/postgres`):
/// `$WALRELAY_PG_CACHE` if set and non-empty; else, as root, `/var/cache/walrelay/pg` (root's
/// home is not traversable by the `postgres` OS user that runs the servers); else
/// `$HOME/.cache/walrelay/pg`. Keep in step with the script.
pub fn pg_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("WALRELAY_PG_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/cache/walrelay/pg");
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    home.join(".cache/walrelay/pg")
}

/// Every usable installation, sorted by major, one per major: [`PgInstall::discover`] (which
/// honours `$PG_BIN`), then Debian's `/usr/lib/postgresql/<N>/bin`, then `<cache>/<N>/bin`
/// ([`pg_cache_dir`]). For a major found more than once the first of these wins. Directories
/// whose `postgres --version` fails are left out.
pub fn installed_majors() -> Vec<PgInstall> {
    let mut found: Vec<PgInstall> = Vec::new();
    let mut add = |install: PgInstall| {
        if !found.iter().any(|i| i.major == install.major) {
            found.push(install);
        }
    };
    if let Ok(install) = PgInstall::discover() {
        add(install);
    }
    for bindir in numbered_bindirs(Path::new("/usr/lib/postgresql"))
        .into_iter()
        .chain(numbered_bindirs(&pg_cache_dir()))
    {
        match PgInstall::from_bindir(&bindir) {
            Ok(install) => add(install),
            Err(e) => {
                tracing::debug!(bindir = %bindir.display(), "skipping unusable PostgreSQL: {e}")
            }
        }
    }
    found.sort_by_key(|i| i.major);
    found
}

/// The installation of `major` among [`installed_majors`], if any.
pub fn install_for_major(major: u32) -> Option<PgInstall> {
    installed_majors().into_iter().find(|i| i.major == major)
}

/// `<base>/<N>/bin` for every directory named by a number N that has `postgres` and `initdb`,
/// lowest N first.
fn numbered_bindirs(base: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(base) else {
        return Vec::new();
    };
    let mut dirs: Vec<(u32, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let n: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            (bin.join("postgres").is_file() && bin.join("initdb").is_file()).then_some((n, bin))
        })
        .collect();
    dirs.sort();
    dirs.into_iter().map(|(_, d)| d).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_bindirs_takes_numeric_dirs_with_server_binaries() {
        let tmp = tempfile::tempdir().unwrap();
        for (name, complete) in [("16", true), ("14", true), ("17", false), ("x", true)] {
            let bin = tmp.path().join(name).join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            std::fs::write(bin.join("postgres"), "").unwrap();
            if complete {
                std::fs::write(bin.join("initdb"), "").unwrap();
            }
        }
        let dirs = numbered_bindirs(tmp.path());
        assert_eq!(
            dirs,
            vec![
                tmp.path().join("14").join("bin"),
                tmp.path().join("16").join("bin")
            ]
        );
        assert!(numbered_bindirs(&tmp.path().join("missing")).is_empty());
    }

    #[test]
    fn installed_majors_are_sorted_and_unique() {
        let majors: Vec<u32> = installed_majors().iter().map(|i| i.major).collect();
        let mut sorted = majors.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(majors, sorted);
        for m in majors {
            assert_eq!(install_for_major(m).map(|i| i.major), Some(m));
        }
        assert_eq!(install_for_major(3), None);
    }
}
