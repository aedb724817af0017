//! Free disk for a run, checked before it starts ([`check_free_space`]), and for the largest
//! of a bench's workloads before the first starts ([`most_needed`]).

use std::path::Path;

use anyhow::{Context, Result};

use super::workloads::Workload;

/// The workload of `workloads` whose run of `secs` seconds needs the most free disk, and that
/// many GB (`Workload::disk_needed_gb`). Checked before the first workload starts: the report
/// is printed once every workload has run, so a later one that stopped for want of space
/// would lose the results of those before it.
pub fn most_needed(workloads: &[Workload], secs: u64) -> Option<(Workload, u64)> {
    workloads
        .iter()
        .map(|&w| (w, w.disk_needed_gb(secs)))
        .max_by_key(|&(_, gb)| gb)
}

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
    fn the_largest_need_is_the_bulk_load_s() {
        let ws = [Workload::Pgbench, Workload::Bulk, Workload::Toast];
        let (w, gb) = most_needed(&ws, 160).unwrap();
        assert_eq!(w, Workload::Bulk);
        assert_eq!(gb, Workload::Bulk.disk_needed_gb(160));
        assert!(gb > Workload::Toast.disk_needed_gb(160));
        assert_eq!(most_needed(&[], 160), None);
    }

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
