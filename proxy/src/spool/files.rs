//! Names and listing of the spool's files (segment names as in pg_wal; see `walrelay_wal::segment`).

use std::path::{Path, PathBuf};

use walrelay_wal::lsn::{Lsn, TimeLineId};
use walrelay_wal::segment::WalSegSize;

use super::{io, SpoolError};

/// A segment file of the spool: complete, or `.partial` while being written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentFile {
    pub tli: TimeLineId,
    pub segno: u64,
    pub partial: bool,
}

impl SegmentFile {
    pub fn complete(tli: TimeLineId, segno: u64) -> SegmentFile {
        SegmentFile {
            tli,
            segno,
            partial: false,
        }
    }

    pub fn partial(tli: TimeLineId, segno: u64) -> SegmentFile {
        SegmentFile {
            tli,
            segno,
            partial: true,
        }
    }

    /// The file name, as in pg_wal (plus `.partial` while incomplete).
    pub fn name(&self, seg: WalSegSize) -> String {
        let base = seg.file_name(self.tli, self.segno);
        match self.partial {
            true => format!("{base}.partial"),
            false => base,
        }
    }

    pub fn path(&self, dir: &Path, seg: WalSegSize) -> PathBuf {
        dir.join(self.name(seg))
    }

    /// The segment file `name` names, if it is one.
    pub fn parse(name: &str, seg: WalSegSize) -> Option<SegmentFile> {
        let (base, partial) = match name.strip_suffix(".partial") {
            Some(b) => (b, true),
            None => (name, false),
        };
        let (tli, segno) = seg.parse_file_name(base)?;
        Some(SegmentFile {
            tli,
            segno,
            partial,
        })
    }
}

/// Every segment file in `dir`.
pub fn segments(dir: &Path, seg: WalSegSize) -> Result<Vec<(SegmentFile, PathBuf)>, SpoolError> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io(dir))? {
        let e = e.map_err(io(dir))?;
        if let Some(f) = e
            .file_name()
            .to_str()
            .and_then(|n| SegmentFile::parse(n, seg))
        {
            out.push((f, e.path()));
        }
    }
    Ok(out)
}

/// Start of the oldest segment of timelines up to `tli`, if any.
pub fn oldest_start(
    dir: &Path,
    seg: WalSegSize,
    tli: TimeLineId,
) -> Result<Option<Lsn>, SpoolError> {
    Ok(segments(dir, seg)?
        .iter()
        .filter(|(f, _)| f.tli <= tli)
        .map(|(f, _)| f.segno)
        .min()
        .and_then(|s| seg.segment_start(s)))
}

/// The file holding segment `segno` of timeline `tli`: complete, else partial.
pub fn find(dir: &Path, seg: WalSegSize, tli: TimeLineId, segno: u64) -> Option<PathBuf> {
    [
        SegmentFile::complete(tli, segno),
        SegmentFile::partial(tli, segno),
    ]
    .iter()
    .map(|f| f.path(dir, seg))
    .find(|p| p.exists())
}

/// fsync of a directory, so renames and new files in it survive a crash.
pub fn sync_dir(dir: &Path) -> Result<(), SpoolError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

/// Writes `name` in `dir` through a temporary file: write, fsync, rename, fsync the directory.
pub fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), SpoolError> {
    use std::io::Write;
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(bytes).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    let to = dir.join(name);
    std::fs::rename(&tmp, &to).map_err(io(&to))?;
    sync_dir(dir)
}
