//! A WAL byte range [from, to) read from a `pg_wal` directory (timeline 1, 16 MiB segments:
//! what the harness's initdb makes), read into memory or copied to a file, compared between
//! two directories, and compressed offline with the `zstd` command.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::AsyncReadExt;

use crate::cluster::walrec::{segment_file_name, WAL_SEGMENT_SIZE};

const PIECE: u64 = 1 << 20;

/// Calls `f` with consecutive pieces (≤ 1 MiB, never crossing a segment) of the WAL bytes
/// [from, to) in `dir`.
fn for_each_piece(
    dir: &Path,
    from: u64,
    to: u64,
    mut f: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    let mut buf = vec![0u8; PIECE as usize];
    let mut pos = from;
    while pos < to {
        let segno = pos / WAL_SEGMENT_SIZE;
        let path = dir.join(segment_file_name(1, segno));
        let mut file = File::open(&path).with_context(|| {
            format!(
                "opening {} (the WAL of the measured range must still be there: raise wal_keep_size)",
                path.display()
            )
        })?;
        let seg_end = ((segno + 1) * WAL_SEGMENT_SIZE).min(to);
        file.seek(SeekFrom::Start(pos % WAL_SEGMENT_SIZE))?;
        while pos < seg_end {
            let n = (seg_end - pos).min(PIECE) as usize;
            file.read_exact(&mut buf[..n])
                .with_context(|| format!("reading {}", path.display()))?;
            f(pos, &buf[..n])?;
            pos += n as u64;
        }
    }
    Ok(())
}

/// WAL bytes [from, to) of `dir`.
pub fn read_range(dir: &Path, from: u64, to: u64) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(to.saturating_sub(from) as usize);
    for_each_piece(dir, from, to, |_, b| {
        out.extend_from_slice(b);
        Ok(())
    })?;
    Ok(out)
}

/// Copies WAL bytes [from, to) of `dir` into the file `out`.
pub fn copy_range(dir: &Path, from: u64, to: u64, out: &Path) -> Result<()> {
    let mut file = File::create(out).with_context(|| format!("creating {}", out.display()))?;
    for_each_piece(dir, from, to, |_, b| Ok(file.write_all(b)?))?;
    Ok(file.flush()?)
}

/// Compares WAL bytes [from, to) of the file `copy` (made by [`copy_range`] from `from`) with
/// the segments in `dir`; errors at the first difference.
pub fn compare_range(copy: &Path, dir: &Path, from: u64, to: u64) -> Result<()> {
    let mut file = File::open(copy).with_context(|| format!("opening {}", copy.display()))?;
    let mut mine = vec![0u8; PIECE as usize];
    for_each_piece(dir, from, to, |pos, theirs| {
        let mine = &mut mine[..theirs.len()];
        file.read_exact(mine)?;
        if let Some(i) = mine.iter().zip(theirs).position(|(a, b)| a != b) {
            anyhow::bail!(
                "WAL in {} differs from the primary's at {}",
                dir.display(),
                walrelay_wal::lsn::Lsn(pos + i as u64)
            );
        }
        Ok(())
    })
}

/// Size of `zstd ARGS -c -q FILE`'s output (the CLI, fed the file, as a user would run it).
pub async fn zstd_size(file: &Path, args: &[&str]) -> Result<u64> {
    let len = std::fs::metadata(file)?.len();
    // zstd -19 runs at ~1-5 MB/s per core: allow 0.5 MB/s plus a minute.
    let timeout = Duration::from_secs(60 + len / 500_000);
    let mut child = tokio::process::Command::new("zstd")
        .args(args)
        .args(["-c", "-q"])
        .arg(file)
        .kill_on_drop(true)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running zstd: install it (apt-get install zstd, or scripts/install-deps.sh)")?;
    let mut out = child.stdout.take().context("zstd's stdout")?;
    let count = async {
        let mut n = 0u64;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let r = out.read(&mut buf).await?;
            if r == 0 {
                break;
            }
            n += r as u64;
        }
        let status = child.wait().await?;
        anyhow::ensure!(status.success(), "zstd {args:?} exited with {status}");
        Ok(n)
    };
    tokio::time::timeout(timeout, count)
        .await
        .with_context(|| format!("zstd {args:?} took more than {timeout:?}"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A range across a segment boundary comes back byte for byte, and ends where asked.
    #[test]
    fn a_range_across_segments_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        for segno in [3u64, 4] {
            let f = File::create(dir.path().join(segment_file_name(1, segno))).unwrap();
            f.set_len(WAL_SEGMENT_SIZE).unwrap();
        }
        let mut tail = File::options()
            .write(true)
            .open(dir.path().join(segment_file_name(1, 3)))
            .unwrap();
        tail.seek(SeekFrom::Start(WAL_SEGMENT_SIZE - 3)).unwrap();
        tail.write_all(&[1, 2, 3]).unwrap();
        let mut head = File::options()
            .write(true)
            .open(dir.path().join(segment_file_name(1, 4)))
            .unwrap();
        head.write_all(&[4, 5]).unwrap();
        let boundary = 4 * WAL_SEGMENT_SIZE;
        let got = read_range(dir.path(), boundary - 3, boundary + 2).unwrap();
        assert_eq!(got, [1, 2, 3, 4, 5]);
        assert!(read_range(dir.path(), boundary, 5 * WAL_SEGMENT_SIZE + 1).is_err());
    }
}
