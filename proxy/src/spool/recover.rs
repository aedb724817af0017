//! Opening a spool after a crash (see the module docs of [`super`]): where its WAL ends, from
//! `spool.state` and the partial (or completed) segment at that end.

use std::io::{Seek, SeekFrom};

use walrelay_wal::lsn::Lsn;

use super::files::{self, SegmentFile};
use super::state::SpoolState;
use super::{io, tail_hash, Extent, Spool, SpoolError};

impl Spool {
    pub(super) fn recover(&mut self, st: &SpoolState) -> Result<(), SpoolError> {
        let segno = self.seg.segment_of(st.end);
        let seg_start = self.seg.segment_start(segno).unwrap_or(Lsn(0));
        let end = match st.end == seg_start {
            true => st.end,
            false => self.recover_partial(st, segno, seg_start),
        };
        let segno = self.seg.segment_of(end);
        let seg_start = self.seg.segment_start(segno).unwrap_or(Lsn(0));
        self.ext = Extent {
            tli: st.tli,
            start: files::oldest_start(&self.dir, self.seg, st.tli)?.unwrap_or(end),
            end,
            durable: end,
        };
        if end != seg_start {
            let f = SegmentFile::partial(st.tli, segno);
            let path = f.path(&self.dir, self.seg);
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(io(&path))?;
            file.set_len(end.0 - seg_start.0).map_err(io(&path))?;
            file.seek(SeekFrom::End(0)).map_err(io(&path))?;
            self.current = Some((segno, file));
            self.named = false;
        }
        self.write_state()
    }

    /// Where the spool's WAL ends when `spool.state` ends inside segment `segno`: at the
    /// state's end if the partial segment holds what was synced; past the segment if the
    /// segment was completed (fsynced, then renamed) after the state was written, which a
    /// crash between the rename and the next state leaves; else at the segment's start, the
    /// partial segment discarded and its WAL fetched again.
    fn recover_partial(&self, st: &SpoolState, segno: u64, seg_start: Lsn) -> Lsn {
        let off = st.end.0 - seg_start.0;
        let partial = SegmentFile::partial(st.tli, segno).path(&self.dir, self.seg);
        let complete = SegmentFile::complete(st.tli, segno).path(&self.dir, self.seg);
        let completed =
            !partial.exists() && matches!(tail_hash(&complete, off), Ok(h) if h == st.tail);
        if let Some(next) = self.seg.segment_start(segno + 1).filter(|_| completed) {
            tracing::info!(file = %complete.display(), "the spool's segment was completed after its last state: the spool continues at {next}");
            return next;
        }
        // Missing, too short, unreadable or different: discarded all the same, with the reason.
        let damage = match tail_hash(&partial, off) {
            Ok(h) if h == st.tail => return st.end,
            Ok(_) => "its last bytes differ from what was synced".to_string(),
            Err(e) => match e.kind() {
                std::io::ErrorKind::UnexpectedEof => "it is shorter than what was synced".into(),
                std::io::ErrorKind::NotFound => "it is missing".into(),
                _ => format!("it cannot be read: {e}"),
            },
        };
        tracing::warn!(file = %partial.display(), "the spool's partial segment is discarded and its WAL fetched again: {damage}");
        let _ = std::fs::remove_file(&partial);
        seg_start
    }
}
