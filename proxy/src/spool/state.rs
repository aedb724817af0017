//! `spool.state`: what the spool had made durable (see the module docs of `spool` for the
//! line's fields).
//!
//! # On disk
//!
//! ```text
//! spool.state = slot 0 (4096 bytes) | slot 1 (4096 bytes)
//! slot        = "walrelay-spool 1 system=<id> segsize=<bytes> tli=<n> end=<X/X> tail=<hex> seq=<n> check=<hex>\n"
//!               then zero bytes up to 4096
//! ```
//!
//! `check` is the xxh3-64 of the line before ` check=`. Write number `seq` goes to slot
//! `seq % 2`, so it overwrites the one before the last, never the last. The first write of a
//! process (a [`StateFile`]) replaces the whole file atomically: both slots hold its state
//! (`seq` 0 and 1), through a temporary file that is fsynced and renamed, then the directory
//! is fsynced. Every later one writes its slot in place and fdatasyncs the file: one small
//! write and one fdatasync per periodic sync instead of a new file, its fsync, a rename and
//! the directory's fsync (the new file's inode and the rename are metadata the file system
//! journals; together about 7 % of a downstream's CPU samples on pgbench, docs/keeping-up.md,
//! seventy-first round). A write that a crash tears
//! leaves a slot whose check fails, and the other slot holds the state before it, which was
//! durable; each slot has a 4 KiB block of its own, so a block's read-modify-write cannot
//! tear both.
//!
//! A file of one line without `seq` and `check` (written by versions before this format, one
//! line replaced atomically) is read too; the next write replaces it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use walrelay_wal::lsn::{Lsn, TimeLineId};

use super::files::write_atomically;
use super::{io, SpoolError};

pub const STATE_FILE: &str = "spool.state";
const MAGIC: &str = "walrelay-spool 1";
/// Bytes of one slot: a block of its own on any file system and disk.
const SLOT: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpoolState {
    pub system_id: u64,
    pub seg_size: u64,
    pub tli: TimeLineId,
    pub end: Lsn,
    pub tail: u64,
}

impl SpoolState {
    fn render(&self) -> String {
        format!(
            "{MAGIC} system={} segsize={} tli={} end={} tail={:016x}",
            self.system_id, self.seg_size, self.tli.0, self.end, self.tail
        )
    }

    fn parse(s: &str) -> Option<SpoolState> {
        let rest = s.trim_end().strip_prefix(MAGIC)?;
        let mut st = SpoolState {
            system_id: 0,
            seg_size: 0,
            tli: TimeLineId(0),
            end: Lsn(0),
            tail: 0,
        };
        let mut seen = 0;
        for kv in rest.split_whitespace() {
            let (k, v) = kv.split_once('=')?;
            match k {
                "system" => st.system_id = v.parse().ok()?,
                "segsize" => st.seg_size = v.parse().ok()?,
                "tli" => st.tli = TimeLineId(v.parse().ok()?),
                "end" => st.end = v.parse().ok()?,
                "tail" => st.tail = u64::from_str_radix(v, 16).ok()?,
                _ => return None,
            }
            seen += 1;
        }
        (seen == 5).then_some(st)
    }
}

/// Slot `seq % 2`'s bytes for write number `seq`.
fn slot(st: &SpoolState, seq: u64) -> Vec<u8> {
    let body = format!("{} seq={seq}", st.render());
    let check = twox_hash::XxHash3_64::oneshot(body.as_bytes());
    let mut b = format!("{body} check={check:016x}\n").into_bytes();
    debug_assert!(b.len() < SLOT, "a state line fits its slot");
    b.resize(SLOT, 0);
    b
}

/// A slot's write number and state; None for a slot that is not whole (torn, or never
/// written).
fn parse_slot(b: &[u8]) -> Option<(u64, SpoolState)> {
    let line = b.split(|c| *c == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let (body, check) = line.rsplit_once(" check=")?;
    if u64::from_str_radix(check, 16).ok()? != twox_hash::XxHash3_64::oneshot(body.as_bytes()) {
        return None;
    }
    let (state, seq) = body.rsplit_once(" seq=")?;
    Some((seq.parse().ok()?, SpoolState::parse(state)?))
}

/// The state in `bytes` (a whole `spool.state`): the newer whole slot, or the one line of
/// the format before slots; None when there is none.
fn parse_file(bytes: &[u8]) -> Option<SpoolState> {
    if bytes.len() == 2 * SLOT {
        let (a, b) = bytes.split_at(SLOT);
        return [parse_slot(a), parse_slot(b)]
            .into_iter()
            .flatten()
            .max_by_key(|(seq, _)| *seq)
            .map(|(_, st)| st);
    }
    SpoolState::parse(std::str::from_utf8(bytes).ok()?)
}

/// The state in `dir`, or None for a new spool.
pub fn read(dir: &Path) -> Result<Option<SpoolState>, SpoolError> {
    let path = dir.join(STATE_FILE);
    match std::fs::read(&path) {
        Ok(b) => parse_file(&b).map(Some).ok_or_else(|| {
            let text = String::from_utf8_lossy(&b[..b.len().min(SLOT)]);
            SpoolError::Invalid(
                path,
                format!(
                    "unreadable state {:?}; remove the spool directory's contents to start over",
                    walrelay_pgwire::clip(text.trim_end_matches('\0'), 200)
                ),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(cause) => Err(SpoolError::Io { path, cause }),
    }
}

/// The spool's writer of `spool.state` (see the module docs). Its writes come one at a time:
/// the spool's own and its sync thread's never overlap (`super::durable`), and the lock
/// makes sure of it.
#[derive(Debug)]
pub struct StateFile {
    dir: PathBuf,
    /// The file as this process last wrote it, and the write number of its newer slot; None
    /// until the first write, and after a failed one (the next replaces the file again).
    open: Mutex<Option<(File, u64)>>,
}

impl StateFile {
    pub fn new(dir: &Path) -> StateFile {
        StateFile {
            dir: dir.to_path_buf(),
            open: Mutex::new(None),
        }
    }

    /// Makes `st` the durable state: when this returns Ok, a crash leaves `st` or a later
    /// state in the file.
    pub fn write(&self, st: &SpoolState) -> Result<(), SpoolError> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let r = match open.take() {
            Some((file, seq)) => self.overwrite(&file, st, seq + 1).map(|()| (file, seq + 1)),
            None => self.replace(st).map(|file| (file, 1)),
        };
        *open = Some(r?);
        Ok(())
    }

    /// Write number `seq` into its slot, in place.
    fn overwrite(&self, file: &File, st: &SpoolState, seq: u64) -> Result<(), SpoolError> {
        let path = self.dir.join(STATE_FILE);
        let at = (seq % 2) * SLOT as u64;
        file.write_all_at(&slot(st, seq), at).map_err(io(&path))?;
        file.sync_data().map_err(io(&path))
    }

    /// The whole file, both slots `st` (writes 0 and 1), replaced atomically; opened for the
    /// writes in place after it.
    fn replace(&self, st: &SpoolState) -> Result<File, SpoolError> {
        let mut bytes = slot(st, 0);
        bytes.extend_from_slice(&slot(st, 1));
        write_atomically(&self.dir, STATE_FILE, &bytes)?;
        let path = self.dir.join(STATE_FILE);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(io(&path))
    }
}

#[cfg(test)]
mod tests;
