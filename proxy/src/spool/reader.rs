//! The spool's read side ([`SpoolFiles`]): what standbys' sessions read, from memory when
//! the newest WAL holds it, else from the segment files.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;

use walrelay_wal::lsn::{Lsn, TimeLineId};
use walrelay_wal::segment::{history_file_name, WalSegSize};

use super::files::{self, SegmentFile};
use super::{io, Recent, SpoolError};

/// The read side of a spool, for the standbys' sessions (any number, concurrently with the
/// writer: they only read below the end the writer published).
#[derive(Debug, Clone)]
pub struct SpoolFiles {
    pub dir: PathBuf,
    pub seg: WalSegSize,
    /// The newest WAL, answered from memory when it holds all of a read.
    pub recent: Arc<Recent>,
}

impl SpoolFiles {
    /// The history file of timeline `tli`, if the spool has it.
    pub fn history(&self, tli: TimeLineId) -> Option<Vec<u8>> {
        std::fs::read(self.dir.join(history_file_name(tli))).ok()
    }

    /// Up to `max` bytes of timeline `tli` from `at`, no further than `limit` (the spool's end
    /// for the current timeline, the switchpoint for an older one), nor past `at`'s segment.
    fn span(&self, at: Lsn, limit: Lsn, max: usize) -> usize {
        let seg_end = self
            .seg
            .segment_start(self.seg.segment_of(at) + 1)
            .unwrap_or(Lsn(u64::MAX));
        (limit.min(seg_end).0.saturating_sub(at.0)).min(max as u64) as usize
    }

    /// What [`read`](Self::read) returns, when memory holds all of it (no I/O: fit for an
    /// async task).
    pub fn read_recent(&self, tli: TimeLineId, at: Lsn, limit: Lsn, max: usize) -> Option<Vec<u8>> {
        match self.span(at, limit, max) {
            0 => Some(Vec::new()),
            n => self.recent.read(tli, at, n),
        }
    }

    /// Up to `max` bytes of timeline `tli` from `at`, no further than `limit` (the spool's end
    /// for the current timeline, the switchpoint for an older one), nor past `at`'s segment:
    /// from memory when it holds them, else from the segment file.
    pub fn read(
        &self,
        tli: TimeLineId,
        at: Lsn,
        limit: Lsn,
        max: usize,
    ) -> Result<Vec<u8>, SpoolError> {
        if let Some(v) = self.read_recent(tli, at, limit, max) {
            return Ok(v);
        }
        let segno = self.seg.segment_of(at);
        let off = self.seg.offset_in_segment(at);
        let n = self.span(at, limit, max);
        let (path, mut f) = self.open_segment(tli, segno)?;
        f.seek(SeekFrom::Start(off)).map_err(io(&path))?;
        let mut buf = vec![0u8; n];
        f.read_exact(&mut buf).map_err(io(&path))?;
        self.still_named(tli, segno, &f)?;
        Ok(buf)
    }

    /// Checked after a read from `f`, segment `segno`'s file: it still has the segment's name.
    /// A segment the spool recycled meanwhile (renamed, then written over as a new one: see
    /// [`super::recycle`]) may have given the read newer bytes, so the read counts as one of a removed
    /// segment. A segment is written over only after it lost its name, so a file found under
    /// its name after the read was not written over before.
    pub(super) fn still_named(
        &self,
        tli: TimeLineId,
        segno: u64,
        f: &File,
    ) -> Result<(), SpoolError> {
        use std::os::unix::fs::MetadataExt;
        let ino = |m: std::fs::Metadata| (m.dev(), m.ino());
        let named = files::find(&self.dir, self.seg, tli, segno)
            .and_then(|p| std::fs::metadata(p).ok())
            .map(ino);
        match (named, f.metadata().map(ino)) {
            (Some(a), Ok(b)) if a == b => Ok(()),
            _ => Err(SpoolError::Removed(
                SegmentFile::complete(tli, segno).name(self.seg),
            )),
        }
    }

    /// Segment `segno` opened for reading. The writer renames `.partial` to its complete
    /// name when the segment fills, possibly between finding the file and opening it: then
    /// it is looked for again.
    fn open_segment(&self, tli: TimeLineId, segno: u64) -> Result<(PathBuf, File), SpoolError> {
        let mut tries = 2;
        loop {
            let path = files::find(&self.dir, self.seg, tli, segno).ok_or_else(|| {
                SpoolError::Removed(SegmentFile::complete(tli, segno).name(self.seg))
            })?;
            match File::open(&path) {
                Ok(f) => return Ok((path, f)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries > 1 => tries -= 1,
                Err(e) => return Err(io(&path)(e)),
            }
        }
    }
}
