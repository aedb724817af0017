//! The spool's directory before the spool opens: what [`Spool::open`](super::Spool::open)
//! needs of it, checked without changing anything on disk, so that `walrelay check-config`
//! ([`Spool::check`](super::Spool::check)) refuses what `walrelay run` would.

use std::path::{Path, PathBuf};

use walrelay_wal::segment::WalSegSize;

use super::state::{self, SpoolState};
use super::{io, SpoolError};

/// Nothing is at `dir` (a dangling symbolic link counts as something: creating the directory
/// there fails).
pub(super) fn missing(dir: &Path) -> bool {
    matches!(std::fs::symlink_metadata(dir), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

/// `dir` does not exist: it can be created if its nearest existing ancestor is a directory
/// this process may create entries in (what `create_dir_all` needs).
pub(super) fn creatable(dir: &Path) -> Result<(), SpoolError> {
    for parent in dir.ancestors().skip(1) {
        let parent = match parent.as_os_str().is_empty() {
            true => Path::new("."),
            false => parent,
        };
        match std::fs::metadata(parent) {
            Ok(m) if m.is_dir() => {
                return access(parent, libc::W_OK | libc::X_OK).map_err(|e| {
                    SpoolError::Invalid(
                        dir.to_path_buf(),
                        format!(
                            "does not exist, and this process ({}) cannot create it in {} ({e}): \
                             create it for the user walrelay runs as, or point \
                             downstream.spool_dir elsewhere",
                            user(),
                            parent.display()
                        ),
                    )
                });
            }
            Ok(_) => return Err(not_a_directory(parent.to_path_buf(), "is not a directory")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(parent)(e)),
        }
    }
    Ok(())
}

/// `dir` exists: a directory this process can list, read and write, whose `spool.state` (if
/// any) this version reads; returns that state and its segment size.
pub(super) fn usable(dir: &Path) -> Result<Option<(SpoolState, WalSegSize)>, SpoolError> {
    let m = std::fs::metadata(dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotADirectory => {
            not_a_directory(dir.to_path_buf(), "has a file as one of its parents")
        }
        std::io::ErrorKind::PermissionDenied => SpoolError::Invalid(
            dir.to_path_buf(),
            format!(
                "this process ({}) cannot reach it ({e}): give the user walrelay runs as \
                 access to its parent directories",
                user()
            ),
        ),
        _ => io(dir)(e),
    })?;
    if !m.is_dir() {
        return Err(not_a_directory(dir.to_path_buf(), "is not a directory"));
    }
    access(dir, libc::R_OK | libc::W_OK | libc::X_OK).map_err(|e| {
        SpoolError::Invalid(
            dir.to_path_buf(),
            format!(
                "this process ({}) cannot list, read and write in it ({e}), as the spool must: \
                 give the directory to the user walrelay runs as",
                user()
            ),
        )
    })?;
    let Some(st) = state::read(dir)? else {
        return Ok(None);
    };
    let seg = WalSegSize::new(st.seg_size).ok_or_else(|| {
        SpoolError::Invalid(
            dir.join(state::STATE_FILE),
            format!("segment size {}", st.seg_size),
        )
    })?;
    Ok(Some((st, seg)))
}

/// `path` (`what`: "is not a directory", "has a file as one of its parents") cannot be the
/// spool's directory.
fn not_a_directory(path: PathBuf, what: &str) -> SpoolError {
    SpoolError::Invalid(
        path,
        format!(
            "{what}: point downstream.spool_dir at a directory, or at a path where one can be \
             created"
        ),
    )
}

/// Whether this process may do `mode` (`R_OK`, `W_OK`, `X_OK`) on `path`, as its effective
/// user and groups (a read-only file system refuses `W_OK` too).
fn access(path: &Path, mode: libc::c_int) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `c` is a NUL-terminated string that lives across the call; faccessat reads it
    // and nothing else of this process's memory.
    let rc = unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), mode, libc::AT_EACCESS) };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// "uid N", the effective user this process checks as.
fn user() -> String {
    // SAFETY: geteuid has no preconditions and cannot fail.
    format!("uid {}", unsafe { libc::geteuid() })
}
