//! Durability off the write path: with [`Spool::set_deferred`], `append` leaves a filled
//! segment's fsync and rename to whoever takes [`Spool::take_filled`], and the periodic sync
//! is a [`Durability`] job made by [`Spool::sync_job`], so that the thread that appends (and
//! the standbys waiting for what it appends) never waits for the disk's fsync.
//!
//! A job is done in three steps, in the order the jobs were made (one thread does them):
//! 1. [`Durability::perform`], without the spool: the fsync of the segment (and for a filled
//!    one its rename to the complete name and the directory's fsync: a complete segment is
//!    whole, as before);
//! 2. [`Spool::state_at`] gives the `spool.state` that says so, written by
//!    [`super::write_state_file`] (again without the spool);
//! 3. [`Spool::made_durable`] moves the durable end, which is published only now: the
//!    upstream lets the primary's slot advance to it, so it must survive a crash.
//!
//! The spool's own `sync`, `switch_timeline` and `bind` must not run while jobs are pending
//! (the caller drains them first): `sync` would call durable a filled segment not yet fsynced.

use std::fs::File;
use std::path::Path;

use walrelay_wal::lsn::{Lsn, TimeLineId};
use walrelay_wal::segment::WalSegSize;

use super::files::{self, SegmentFile};
use super::state::SpoolState;
use super::{io, Spool, SpoolError};

/// One piece of durability work, made by the spool and done without it.
#[derive(Debug)]
pub enum Durability {
    /// The partial segment holds WAL up to `end`: fdatasync it, and fsync the directory
    /// when `name` (the segment's name is new since the last).
    Data {
        file: File,
        tli: TimeLineId,
        end: Lsn,
        name: bool,
    },
    /// Segment `segno` is full (its end is `end`): fsync it, rename it from `.partial` to
    /// its name, fsync the directory.
    Filled {
        file: File,
        tli: TimeLineId,
        segno: u64,
        end: Lsn,
    },
}

impl Durability {
    /// Whether this is the periodic sync (not a filled segment).
    pub fn is_data(&self) -> bool {
        matches!(self, Durability::Data { .. })
    }

    /// The fsyncs (and rename) of the job; returns the timeline and end now durable.
    pub fn perform(self, dir: &Path, seg: WalSegSize) -> Result<(TimeLineId, Lsn), SpoolError> {
        match self {
            Durability::Data {
                file,
                tli,
                end,
                name,
            } => {
                file.sync_data().map_err(io(dir))?;
                if name {
                    files::sync_dir(dir)?;
                }
                Ok((tli, end))
            }
            Durability::Filled {
                file,
                tli,
                segno,
                end,
            } => {
                finish_segment(dir, seg, Some(file), tli, segno)?;
                Ok((tli, end))
            }
        }
    }
}

/// A full segment: fsync `file` (its `.partial`), give it its complete name, fsync the
/// directory.
pub(super) fn finish_segment(
    dir: &Path,
    seg: WalSegSize,
    file: Option<File>,
    tli: TimeLineId,
    segno: u64,
) -> Result<(), SpoolError> {
    if let Some(file) = file {
        file.sync_all().map_err(io(dir))?;
    }
    let from = SegmentFile::partial(tli, segno).path(dir, seg);
    let to = SegmentFile::complete(tli, segno).path(dir, seg);
    std::fs::rename(&from, &to).map_err(io(&from))?;
    files::sync_dir(dir)
}

impl Spool {
    /// Deferred (see the module docs) or not: `append` completes filled segments itself.
    pub fn set_deferred(&mut self, on: bool) {
        self.deferred = on;
    }

    /// The filled segments `append` left for a sync thread, oldest first.
    pub fn take_filled(&mut self) -> Vec<Durability> {
        std::mem::take(&mut self.filled)
    }

    /// The periodic sync of everything written to the partial segment, if any of it is not
    /// durable yet (a filled segment's WAL is its own job's). The first job of a segment also
    /// makes its name durable: a new file's, or a recycled one's new name.
    pub fn sync_job(&mut self) -> Result<Option<Durability>, SpoolError> {
        let Some((_, file)) = &self.current else {
            return Ok(None);
        };
        if self.ext.durable >= self.ext.end {
            return Ok(None);
        }
        let job = Durability::Data {
            file: file.try_clone().map_err(io(&self.dir))?,
            tli: self.ext.tli,
            end: self.ext.end,
            name: !self.named,
        };
        self.named = true;
        Ok(Some(job))
    }

    /// The `spool.state` saying WAL of `tli` is durable up to `end` (None: another timeline
    /// by now, or nothing new).
    pub fn state_at(&self, tli: TimeLineId, end: Lsn) -> Result<Option<SpoolState>, SpoolError> {
        if tli != self.ext.tli || end <= self.ext.durable || end > self.ext.end {
            return Ok(None);
        }
        self.state(end).map(Some)
    }

    /// `spool.state` says WAL of `tli` is durable up to `end`: the durable end moves there
    /// (and, after a filled segment, the oldest segments beyond the cap go).
    pub fn made_durable(
        &mut self,
        tli: TimeLineId,
        end: Lsn,
        filled: bool,
    ) -> Result<(), SpoolError> {
        if tli == self.ext.tli && end <= self.ext.end {
            self.ext.durable = self.ext.durable.max(end);
        }
        if filled {
            self.retain()?;
        }
        Ok(())
    }

    /// `append` reached the end of segment `segno`: complete it now, or leave it to the
    /// sync thread when deferred (the next append opens the next segment meanwhile).
    pub(super) fn segment_filled(&mut self, segno: u64) -> Result<(), SpoolError> {
        if !self.deferred {
            return self.complete(segno);
        }
        if let Some((_, file)) = self.current.take() {
            self.filled.push(Durability::Filled {
                file,
                tli: self.ext.tli,
                segno,
                end: self.ext.end,
            });
        }
        Ok(())
    }
}
