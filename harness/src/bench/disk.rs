//! Free disk for a run, checked before it starts ([`check_free_space`]).

use std::path::Path;

use anyhow::{Context, Result};

/// Fails, naming the directory and what to do, unless the file system of `dir` has `need_gb`
/// GB free (`df`'s count for unprivileged users): a run that fills the disk fails only after
/// minutes of load, and leaves PostgreSQL failing in odd places on the way.
pub fn check_free_space(dir: &Path, need_gb: u64, workload: &str) -> Result<()> {
    let out = std::process::Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(dir)
        .output()
        .context("running df to check free disk space")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let avail: u64 = text
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .with_context(|| format!("reading df's free space for {}: {text:?}", dir.display()))?;
    if avail < need_gb.saturating_mul(1_000_000_000) {
        anyhow::bail!(
            "the {workload} workload needs about {need_gb} GB free where its temporary directory is \
             ({}), and {:.1} GB are: free some space (a run interrupted earlier leaves a \
             walrelay-* directory behind) or point TMPDIR at a larger file system",
            dir.display(),
            avail as f64 / 1e9
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_space_check_names_the_directory_when_short() {
        let dir = tempfile::tempdir().unwrap();
        check_free_space(dir.path(), 0, "pgbench").unwrap();
        let e = check_free_space(dir.path(), 1 << 40, "bulk")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&dir.path().display().to_string()) && e.contains("TMPDIR"),
            "{e}"
        );
    }
}
