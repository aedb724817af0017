//! Segment files kept for reuse, as PostgreSQL recycles its pg_wal segments.
//!
//! When retention takes the oldest complete segment out of a full spool, up to [`KEEP`] such
//! files are renamed `recycled.<n>` instead of deleted, and the next new segment is one of
//! them renamed to its `.partial` name and written over from its start. Its blocks are
//! allocated already, so the appends allocate none and an fdatasync has no metadata to write;
//! its pages are often still in the page cache. (Measured on this project's VM, ext4: 1 GiB
//! written in 256 kB appends with an fdatasync every megabyte took 0.5 s of system time in new
//! files against 0.3 s in recycled ones whose pages were cached and 0.4 s in ones whose pages were not,
//! and half the wall time; `docs/keeping-up.md`, thirty-eighth round.)
//!
//! On disk: `recycled.<n>` (`n` a counter), each exactly one segment long; a spool that opens
//! keeps up to [`KEEP`] such files and removes any other. The spool holds up to [`KEEP`]
//! segments beyond `downstream.spool_bytes` this way.
//!
//! A recycled file holds an old segment's bytes beyond the spool's end until they are written
//! over. Nothing reads there: standbys read below the end, and recovery after a crash cuts the
//! partial segment at its synced end (see the spool's module docs). A reader that opened the
//! old segment before it was recycled finds out after its read (`SpoolFiles::read`), as
//! PostgreSQL's walsender does.

use std::fs::File;
use std::path::{Path, PathBuf};

use walrelay_wal::segment::WalSegSize;

use super::{io, SpoolError};

/// Most segment files kept for reuse.
pub const KEEP: usize = 2;

const PREFIX: &str = "recycled.";

/// The files kept for reuse in a spool directory.
#[derive(Debug, Default)]
pub struct Pool {
    files: Vec<PathBuf>,
    next: u64,
}

impl Pool {
    /// The files a spool directory already keeps for reuse: up to [`KEEP`] of exactly
    /// `seg`'s length stay, the others go.
    pub fn scan(dir: &Path, seg: WalSegSize) -> Result<Pool, SpoolError> {
        let mut pool = Pool::default();
        let mut found = Vec::new();
        for e in std::fs::read_dir(dir).map_err(io(dir))? {
            let e = e.map_err(io(dir))?;
            let name = e.file_name();
            let Some(n) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else {
                continue;
            };
            let n: Option<u64> = n.parse().ok();
            let len = e.metadata().map_err(io(&e.path()))?.len();
            found.push((n, len, e.path()));
        }
        found.sort();
        for (n, len, path) in found {
            match n {
                Some(n) if len == seg.bytes() && pool.files.len() < KEEP => {
                    pool.next = pool.next.max(n + 1);
                    pool.files.push(path);
                }
                _ => std::fs::remove_file(&path).map_err(io(&path))?,
            }
        }
        Ok(pool)
    }

    /// Files kept now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Takes the segment file at `path` (retention is done with it) for reuse if the pool has
    /// room and the file is a whole segment long; false: the caller removes it.
    pub fn offer(&mut self, dir: &Path, path: &Path, seg: WalSegSize) -> Result<bool, SpoolError> {
        if self.files.len() >= KEEP {
            return Ok(false);
        }
        let len = std::fs::metadata(path).map_err(io(path))?.len();
        if len != seg.bytes() {
            return Ok(false);
        }
        let to = dir.join(format!("{PREFIX}{}", self.next));
        self.next += 1;
        std::fs::rename(path, &to).map_err(io(path))?;
        self.files.push(to);
        Ok(true)
    }

    /// A kept file renamed to `to` and opened for writing at its start, if the pool has one
    /// (a kept file someone removed meanwhile is passed over).
    ///
    /// The directory is fsynced before the file is handed out, as PostgreSQL's `durable_rename`
    /// does when it recycles a segment: else a power loss could bring back the file's old name
    /// (a complete segment the spool may still list) over the new segment's first bytes.
    pub fn take(&mut self, to: &Path) -> Result<Option<File>, SpoolError> {
        loop {
            let Some(from) = self.files.pop() else {
                return Ok(None);
            };
            match std::fs::rename(&from, to) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io(&from)(e)),
            }
        }
        if let Some(dir) = to.parent() {
            super::files::sync_dir(dir)?;
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(to)
            .map_err(io(to))?;
        Ok(Some(file))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spool::tests::names;

    fn seg() -> WalSegSize {
        WalSegSize::new(1 << 20).unwrap()
    }

    fn file(dir: &Path, name: &str, len: u64) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, vec![7u8; len as usize]).unwrap();
        p
    }

    #[test]
    fn keeps_whole_segments_up_to_its_size_and_hands_them_out() {
        let d = tempfile::tempdir().unwrap();
        let (dir, seg) = (d.path(), seg());
        let mut pool = Pool::default();
        let short = file(dir, "000000010000000000000001.partial", 100);
        assert!(
            !pool.offer(dir, &short, seg).unwrap(),
            "a short file is no segment to reuse"
        );
        for i in 2..5 {
            let p = file(dir, &format!("00000001000000000000000{i}"), seg.bytes());
            assert_eq!(pool.offer(dir, &p, seg).unwrap(), i < 2 + KEEP as u64);
        }
        assert_eq!(pool.len(), KEEP);
        let to = dir.join("000000010000000000000009.partial");
        let mut f = pool.take(&to).unwrap().expect("a kept file");
        std::io::Write::write_all(&mut f, b"new").unwrap();
        drop(f);
        let got = std::fs::read(&to).unwrap();
        assert_eq!(got.len() as u64, seg.bytes(), "written over, not truncated");
        assert_eq!((&got[..3], got[3]), (&b"new"[..], 7));
        assert_eq!(pool.len(), KEEP - 1);
        // A kept file removed behind the pool's back: passed over, no error.
        for name in names(dir).iter().filter(|n| n.starts_with(PREFIX)) {
            std::fs::remove_file(dir.join(name)).unwrap();
        }
        assert!(pool.take(&dir.join("x")).unwrap().is_none());
        assert_eq!(pool.len(), 0);
    }

    #[test]
    fn a_reopened_spool_keeps_what_it_kept_and_removes_the_rest() {
        let d = tempfile::tempdir().unwrap();
        let (dir, seg) = (d.path(), seg());
        file(dir, "recycled.4", seg.bytes());
        file(dir, "recycled.9", seg.bytes());
        file(dir, "recycled.11", seg.bytes());
        file(dir, "recycled.5", 10);
        file(dir, "recycled.x", seg.bytes());
        let mut pool = Pool::scan(dir, seg).unwrap();
        assert_eq!(pool.len(), KEEP);
        assert_eq!(names(dir), ["recycled.4", "recycled.9"]);
        // New names do not collide with the kept ones.
        pool.take(&dir.join("a")).unwrap().unwrap();
        let p = file(dir, "b", seg.bytes());
        assert!(pool.offer(dir, &p, seg).unwrap());
        assert!(dir.join("recycled.10").exists());
    }
}
