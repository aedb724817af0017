//! The spool (downstream half): the verified, restored WAL of the primary in segment files,
//! served to every standby at its own pace, including while the link is down. Blocking file
//! I/O; the session layer calls it from a thread of its own.
//!
//! # On disk (`downstream.spool_dir`)
//!
//! ```text
//! 000000010000000000000003            complete segments: the primary's pg_wal files, byte for byte
//! 000000010000000000000004.partial    the segment being written: the primary's bytes up to `end`
//! 00000002.history                    timeline history files, as the primary serves them
//! spool.state                         what is durable (written after every sync; [`state`])
//!
//! spool.state = two slots of 4 KiB, each "walrelay-spool 1 system=<id> segsize=<bytes> tli=<n>
//!               end=<X/X> tail=<hex> seq=<n> check=<hex>\n" (the newer whole one counts)
//! ```
//!
//! `end` is where the WAL of timeline `tli` is durable up to; `tail` is the xxh3-64 of the
//! last (at most [`TAIL_CHECK`]) bytes before `end` in the partial segment (0 when `end` is at
//! a segment start). Only WAL verified against the link's checksum is ever appended.
//!
//! A segment is fsynced before it is renamed from `.partial` to its name, and the directory
//! after; `spool.state`'s older slot is written in place and fdatasynced (a process's first
//! write replaces the file: a temporary file, fsynced, renamed). So after a crash:
//! complete segments are whole; the partial segment holds at least `end` unless something
//! else damaged it. (With durability deferred to a sync thread, `durable`, a filled segment
//! can wait as `.partial` for its fsync while the next one is written; recovery treats the
//! later one as any bytes past `end`.) [`Spool::open`] checks: a partial segment shorter
//! than `end` or whose tail does not match is discarded whole (it is fetched again from its start); bytes past `end`
//! (written, never synced) are cut off; a segment completed (fsynced, renamed) after the last
//! `spool.state` is kept whole when its bytes before `end` match `tail`. The spool never serves bytes past `end`... of what it
//! has written in this run, and never anything of a discarded segment.
//!
//! A timeline switch (the primary was promoted elsewhere) writes the new timeline's history
//! file; the new timeline's first segment starts with the old timeline's bytes up to the
//! switchpoint (as on a promoted primary), so every file is what PostgreSQL's pg_wal holds
//! and an operator can point a standby's `restore_command` at the spool.
//!
//! The newest [`RECENT_BYTES`] appended are also kept in memory ([`recent`]): a read they
//! hold all of is answered from there, with no file I/O.
//!
//! Retention: complete segments beyond `downstream.spool_bytes` go, oldest first; a standby
//! that asks for them later gets PostgreSQL's "requested WAL segment … has already been
//! removed". Up to two of them are kept as `recycled.<n>` and written over as new segments
//! ([`recycle`]).

mod dir;
mod durable;
mod files;
mod reader;
mod recent;
mod recover;
mod recycle;
mod state;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_recycle;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use walrelay_wal::lsn::{Lsn, TimeLineId};
use walrelay_wal::segment::{history_file_name, WalSegSize};
use walrelay_wal::timeline;

pub use durable::Durability;
pub use files::{write_atomically, SegmentFile};
pub use reader::SpoolFiles;
pub use recent::{Recent, RECENT_BYTES};
pub use state::{read as read_state, SpoolState, StateFile};

/// Bytes before `end` whose checksum `spool.state` keeps.
pub const TAIL_CHECK: u64 = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    /// The cause is in the message, and so not also the error's `source()`: anyhow's `{:#}`
    /// printed it twice ("…: Permission denied (os error 13): Permission denied (os error 13)").
    /// The same holds for every error type of this crate.
    #[error("spool {path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("spool {0}: {1}")]
    Invalid(PathBuf, String),
    #[error("the spool holds WAL of another cluster or segment size ({0}); point downstream.spool_dir at an empty directory")]
    OtherCluster(String),
    #[error("WAL at {got} does not continue the spool, which ends at {end} on timeline {tli}")]
    Gap { got: Lsn, end: Lsn, tli: TimeLineId },
    #[error("requested WAL segment {0} has already been removed")]
    Removed(String),
    #[error("requested starting point {want} is ahead of the WAL of this server ({end})")]
    Ahead { want: Lsn, end: Lsn },
    #[error("timeline {0} is not in the spool's history")]
    UnknownTimeline(TimeLineId),
}

/// The `tail` of `spool.state`: the xxh3-64 of the last (at most [`TAIL_CHECK`]) bytes before
/// offset `off` of the segment file at `path`, read from there alone (a segment can be 1 GiB).
/// An error when the file is missing or shorter than `off`.
fn tail_hash(path: &Path, off: u64) -> std::io::Result<u64> {
    let from = off.saturating_sub(TAIL_CHECK);
    let len = usize::try_from(off - from).expect("at most TAIL_CHECK bytes");
    let mut buf = vec![0u8; len];
    let mut file = File::open(path)?;
    file.seek(SeekFrom::Start(from))?;
    file.read_exact(&mut buf)?;
    Ok(twox_hash::XxHash3_64::oneshot(&buf))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SpoolError + '_ {
    move |cause| SpoolError::Io {
        path: path.to_path_buf(),
        cause,
    }
}

/// Where the spool's WAL is and how far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub tli: TimeLineId,
    /// Oldest WAL still held (start of the oldest segment of the current timeline's history).
    pub start: Lsn,
    /// End of the WAL written (readable by standbys).
    pub end: Lsn,
    /// End of the WAL fsynced (the upstream's slot may advance to here).
    pub durable: Lsn,
}

/// The spool of one downstream.
pub struct Spool {
    dir: PathBuf,
    seg: WalSegSize,
    system_id: u64,
    /// Most bytes of complete segments kept.
    cap: u64,
    ext: Extent,
    /// The partial segment being written, if any.
    current: Option<(u64, File)>,
    /// The current partial segment's name is durable (its directory was fsynced since it got
    /// it); until then the next sync fsyncs the directory too.
    named: bool,
    /// Segment files kept for reuse, and how many segments were written over one.
    pool: recycle::Pool,
    reused: u64,
    /// Filled segments are left in `filled` for a sync thread ([`Spool::set_deferred`]).
    deferred: bool,
    filled: Vec<Durability>,
    /// The newest WAL appended, for the readers ([`SpoolFiles::read`]).
    recent: Arc<Recent>,
    /// `spool.state`'s writer, shared with the sync thread ([`Spool::state_file`]).
    state_file: Arc<StateFile>,
}

impl Spool {
    /// What opening the spool in `dir` needs of it, checked without changing anything on disk
    /// (for `walrelay check-config`): `dir` is a directory this process can list, read and
    /// write, or does not exist and can be created; its `spool.state`, if any, is one this
    /// version reads. [`open`](Self::open) checks the same before it changes anything. Not
    /// checked here: the segment files (a damaged partial segment is discarded and fetched
    /// again when the spool opens), the free space, and whether the WAL is of the configured
    /// primary (checked when the link comes up).
    pub fn check(dir: &Path) -> Result<(), SpoolError> {
        match dir::missing(dir) {
            true => dir::creatable(dir),
            false => dir::usable(dir).map(drop),
        }
    }

    /// Opens (creating) the spool in `dir`, recovering from a crash as described in the module
    /// docs. A spool that holds WAL knows its cluster and segment size; a new one learns them
    /// from [`bind`](Self::bind).
    pub fn open(dir: &Path, cap: u64) -> Result<Spool, SpoolError> {
        if dir::missing(dir) {
            dir::creatable(dir)?;
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        let st = dir::usable(dir)?;
        let mut spool = Spool {
            dir: dir.to_path_buf(),
            seg: WalSegSize::DEFAULT,
            system_id: 0,
            cap,
            ext: Extent {
                tli: TimeLineId(1),
                start: Lsn(0),
                end: Lsn(0),
                durable: Lsn(0),
            },
            current: None,
            named: false,
            pool: recycle::Pool::default(),
            reused: 0,
            deferred: false,
            filled: Vec::new(),
            recent: Arc::default(),
            state_file: Arc::new(StateFile::new(dir)),
        };
        if let Some((st, seg)) = st {
            spool.seg = seg;
            spool.system_id = st.system_id;
            spool.pool = recycle::Pool::scan(dir, spool.seg)?;
            spool.recover(&st)?;
        }
        Ok(spool)
    }

    /// This spool opened again from its files, as a restarted downstream opens it: what a write
    /// or fsync error left behind is recovered from (bytes past the durable end are cut), and
    /// its WAL fetched again. The same cluster as before, the same settings.
    pub fn reopen(&self) -> Result<Spool, SpoolError> {
        let mut s = Spool::open(&self.dir, self.cap)?;
        if self.system_id != 0 && s.system_id != 0 && s.system_id != self.system_id {
            return Err(SpoolError::OtherCluster(format!(
                "system {} in {}, where this run had system {}",
                s.system_id,
                self.dir.display(),
                self.system_id
            )));
        }
        s.deferred = self.deferred;
        s.reused = self.reused;
        Ok(s)
    }

    /// The primary's system identifier and segment size: a new spool takes them, a spool that
    /// holds WAL must have the same.
    pub fn bind(&mut self, system_id: u64, seg: WalSegSize) -> Result<(), SpoolError> {
        if self.system_id == 0 {
            self.system_id = system_id;
            self.seg = seg;
            self.pool = recycle::Pool::scan(&self.dir, seg)?;
            return Ok(());
        }
        if self.system_id != system_id || self.seg != seg {
            return Err(SpoolError::OtherCluster(format!(
                "system {} with {} byte segments, not system {system_id} with {}",
                self.system_id,
                self.seg.bytes(),
                seg.bytes()
            )));
        }
        Ok(())
    }

    /// The cluster this spool holds WAL of (0: not known yet).
    pub fn system_id(&self) -> u64 {
        self.system_id
    }

    pub fn extent(&self) -> Extent {
        self.ext
    }

    /// The most bytes of complete segments kept (`downstream.spool_bytes`).
    pub fn capacity(&self) -> u64 {
        self.cap
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn segment_size(&self) -> WalSegSize {
        self.seg
    }

    /// Segments written over a file kept for reuse since the spool opened.
    pub fn reused(&self) -> u64 {
        self.reused
    }

    /// True until the first WAL is appended.
    pub fn is_empty(&self) -> bool {
        self.ext.end == Lsn(0)
    }

    /// Appends verified WAL of timeline `tli` starting at `start` (= the spool's end, or a
    /// segment start for an empty spool).
    pub fn append(
        &mut self,
        tli: TimeLineId,
        start: Lsn,
        mut bytes: &[u8],
    ) -> Result<(), SpoolError> {
        // A position from the wire: WAL past the end of the 64-bit WAL space is no WAL.
        if start.0.checked_add(bytes.len() as u64).is_none() {
            return Err(SpoolError::Invalid(
                self.dir.clone(),
                format!(
                    "WAL at {start} of {} bytes runs past the largest WAL position",
                    bytes.len()
                ),
            ));
        }
        if self.is_empty() {
            if self.seg.offset_in_segment(start) != 0 {
                return Err(SpoolError::Gap {
                    got: start,
                    end: self.ext.end,
                    tli,
                });
            }
            self.ext = Extent {
                tli,
                start,
                end: start,
                durable: Lsn(0),
            };
        }
        if tli != self.ext.tli || start != self.ext.end {
            return Err(SpoolError::Gap {
                got: start,
                end: self.ext.end,
                tli: self.ext.tli,
            });
        }
        while !bytes.is_empty() {
            let segno = self.seg.segment_of(self.ext.end);
            let room = self.seg.bytes() - self.seg.offset_in_segment(self.ext.end);
            let n = room.min(bytes.len() as u64) as usize;
            let file = self.open_current(segno)?;
            if let Err(e) = file.write_all(&bytes[..n]) {
                let path = SegmentFile::partial(tli, segno).path(&self.dir, self.seg);
                return Err(io(&path)(e));
            }
            self.recent.append(tli, self.ext.end, &bytes[..n]);
            bytes = &bytes[n..];
            self.ext.end = Lsn(self.ext.end.0 + n as u64);
            if self.seg.offset_in_segment(self.ext.end) == 0 {
                self.segment_filled(segno)?;
            }
        }
        Ok(())
    }

    /// The partial segment `segno`, opened (created, or a kept file reused when it starts
    /// there) for appending at the spool's end.
    fn open_current(&mut self, segno: u64) -> Result<&mut File, SpoolError> {
        if self.current.as_ref().map(|(s, _)| *s) != Some(segno) {
            let f = SegmentFile::partial(self.ext.tli, segno);
            let path = f.path(&self.dir, self.seg);
            let at = self.seg.offset_in_segment(self.ext.end);
            let reused = match at == 0 && !path.exists() {
                true => self.pool.take(&path)?,
                false => None,
            };
            let file = match reused {
                Some(file) => {
                    self.reused += 1;
                    file
                }
                None => {
                    let mut file = std::fs::OpenOptions::new()
                        .create(true)
                        .truncate(false)
                        .write(true)
                        .open(&path)
                        .map_err(io(&path))?;
                    file.set_len(at).map_err(io(&path))?;
                    file.seek(SeekFrom::Start(at)).map_err(io(&path))?;
                    file
                }
            };
            self.current = Some((segno, file));
            self.named = false;
        }
        match &mut self.current {
            Some((_, f)) => Ok(f),
            None => Err(SpoolError::Invalid(
                self.dir.clone(),
                "no current segment".into(),
            )),
        }
    }

    /// A segment is full: fsync it, give it its name, fsync the directory.
    fn complete(&mut self, segno: u64) -> Result<(), SpoolError> {
        let file = self.current.take().map(|(_, f)| f);
        durable::finish_segment(&self.dir, self.seg, file, self.ext.tli, segno)?;
        self.state_file.write(&self.state(self.ext.end)?)?;
        self.ext.durable = self.ext.durable.max(self.ext.end);
        self.retain()
    }

    /// Makes everything written durable; returns the durable end.
    pub fn sync(&mut self) -> Result<Lsn, SpoolError> {
        if self.ext.durable == self.ext.end {
            return Ok(self.ext.durable);
        }
        if let Some((_, file)) = &self.current {
            file.sync_data().map_err(io(&self.dir))?;
            if !self.named {
                files::sync_dir(&self.dir)?;
                self.named = true;
            }
        }
        // The durable end moves only once `spool.state` says so: the upstream lets the
        // primary's slot advance to it, and a spool opened again starts from the file.
        self.state_file.write(&self.state(self.ext.end)?)?;
        self.ext.durable = self.ext.end;
        Ok(self.ext.durable)
    }

    fn write_state(&self) -> Result<(), SpoolError> {
        self.state_file
            .write(&self.state(self.ext.durable.min(self.ext.end))?)
    }

    /// The writer of `spool.state`, for a sync thread that writes it without the spool
    /// (`durable`).
    pub fn state_file(&self) -> Arc<StateFile> {
        self.state_file.clone()
    }

    /// The `spool.state` saying WAL of the spool's timeline is durable up to `end`.
    fn state(&self, end: Lsn) -> Result<SpoolState, SpoolError> {
        Ok(SpoolState {
            system_id: self.system_id,
            seg_size: self.seg.bytes(),
            tli: self.ext.tli,
            end,
            tail: self.tail_checksum(end)?,
        })
    }

    fn tail_checksum(&self, end: Lsn) -> Result<u64, SpoolError> {
        let off = self.seg.offset_in_segment(end);
        if off == 0 {
            return Ok(0);
        }
        let f = SegmentFile::partial(self.ext.tli, self.seg.segment_of(end));
        let path = f.path(&self.dir, self.seg);
        tail_hash(&path, off).map_err(io(&path))
    }

    /// Removes the oldest complete segments while the spool holds more than its cap. An older
    /// timeline's last, partial segment counts as complete: nothing more will be written to
    /// it (else it would stay for good and pin the spool's start).
    fn retain(&mut self) -> Result<(), SpoolError> {
        let tli = self.ext.tli;
        let mut segs: Vec<_> = files::segments(&self.dir, self.seg)?
            .into_iter()
            .filter(|(f, _)| !f.partial || f.tli < tli)
            .collect();
        let mut total: u64 = segs.len() as u64 * self.seg.bytes();
        segs.sort_by_key(|(f, _)| (f.segno, f.tli));
        for (f, path) in segs {
            if total <= self.cap {
                break;
            }
            let kept = self.pool.offer(&self.dir, &path, self.seg)?;
            if !kept {
                std::fs::remove_file(&path).map_err(io(&path))?;
            }
            total -= self.seg.bytes();
            match kept {
                true => {
                    tracing::info!(segment = %f.name(self.seg), "spool full (downstream.spool_bytes): removed the oldest segment, its file kept to be written over as a new one")
                }
                false => {
                    tracing::info!(segment = %f.name(self.seg), "spool full (downstream.spool_bytes): removed the oldest segment")
                }
            }
        }
        self.ext.start =
            files::oldest_start(&self.dir, self.seg, self.ext.tli)?.unwrap_or(self.ext.end);
        self.recent.forget_before(self.ext.start);
        Ok(())
    }

    /// Switches to timeline `tli`, whose history file is `history` (the primary's bytes) and
    /// which begins at its switchpoint from the spool's timeline: the history file is written,
    /// the new timeline's first segment starts with the old timeline's bytes up to the
    /// switchpoint. The spool's end moves to the switchpoint (WAL the old timeline had past
    /// it stays in the old timeline's files, as on any standby that was ahead).
    pub fn switch_timeline(&mut self, tli: TimeLineId, history: &[u8]) -> Result<(), SpoolError> {
        let text = String::from_utf8_lossy(history);
        let entries = timeline::parse(&text).map_err(|e| {
            SpoolError::Invalid(self.dir.join(history_file_name(tli)), e.to_string())
        })?;
        let at = timeline::switchpoint(&entries, self.ext.tli)
            .ok_or(SpoolError::UnknownTimeline(self.ext.tli))?;
        if at > self.ext.end {
            return Err(SpoolError::Gap {
                got: at,
                end: self.ext.end,
                tli: self.ext.tli,
            });
        }
        files::write_atomically(&self.dir, &history_file_name(tli), history)?;
        self.sync()?;
        let segno = self.seg.segment_of(at);
        let off = self.seg.offset_in_segment(at);
        // The old timeline's segment holding the switchpoint keeps its name (complete, or
        // .partial for ever: it may hold bytes past the switchpoint no standby should replay).
        self.current = None;
        if off != 0 {
            let old = files::find(&self.dir, self.seg, self.ext.tli, segno).ok_or_else(|| {
                SpoolError::Removed(SegmentFile::complete(self.ext.tli, segno).name(self.seg))
            })?;
            let f = File::open(&old).map_err(io(&old))?;
            let new = SegmentFile::partial(tli, segno).path(&self.dir, self.seg);
            let mut nf = File::create(&new).map_err(io(&new))?;
            // Copied through a small buffer: a segment can be 1 GiB.
            let copied = std::io::copy(&mut f.take(off), &mut nf).map_err(io(&new))?;
            if copied != off {
                return Err(io(&old)(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("{copied} bytes where the switch needs the first {off}"),
                )));
            }
            nf.sync_all().map_err(io(&new))?;
            self.current = Some((segno, nf));
            // The directory's fsync below makes the name durable.
            self.named = true;
        }
        self.recent.clear();
        self.ext.tli = tli;
        self.ext.end = at;
        self.ext.durable = at;
        files::sync_dir(&self.dir)?;
        self.write_state()
    }

    /// Keeps the history file of `tli` (for a spool that starts on that timeline).
    pub fn write_history(&mut self, tli: TimeLineId, history: &[u8]) -> Result<(), SpoolError> {
        files::write_atomically(&self.dir, &history_file_name(tli), history)
    }

    /// What readers need: the directory and the segment size.
    pub fn files(&self) -> SpoolFiles {
        SpoolFiles {
            dir: self.dir.clone(),
            seg: self.seg,
            recent: self.recent.clone(),
        }
    }

    pub fn history(&self, tli: TimeLineId) -> Option<Vec<u8>> {
        self.files().history(tli)
    }

    pub fn read(
        &self,
        tli: TimeLineId,
        at: Lsn,
        limit: Lsn,
        max: usize,
    ) -> Result<Vec<u8>, SpoolError> {
        self.files().read(tli, at, limit, max)
    }
}
