//! A standby's session after authentication, as the downstream holds it: the connection, its
//! channel on the stream, its entry in the metrics. [`super::commands`] serves its replication
//! commands; [`super::streamer`] its START_REPLICATION.

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use walrelay_pgwire::{encode, ErrorFields};
use walrelay_proto::link::Welcome;
use walrelay_wal::lsn::{Lsn, TimeLineId};

use super::{Downstream, End, Reader, Standby, Writer};
use crate::monitor::standbys::StandbyHandle;
use crate::spooler::writer::SpoolView;
use crate::spooler::ChanEvent;

/// A standby's session.
pub(super) struct Session<'a> {
    pub ds: &'a Downstream,
    pub reader: &'a mut Reader,
    pub writer: &'a mut Writer,
    pub standby: &'a Standby,
    pub chan: u32,
    pub events: mpsc::Receiver<ChanEvent>,
    pub entry: StandbyHandle,
    /// A status update of the standby's current stream has gone up already.
    pub reported: bool,
    /// `chan` is still open (a session that continued in a tunnel closed it).
    pub chan_open: bool,
}

impl Session<'_> {
    pub(super) async fn write(&mut self, out: &[u8]) -> Result<(), End> {
        self.writer.write_all(out).await.map_err(|_| End::Quiet)
    }

    /// An error for the standby's command, then ReadyForQuery (the session goes on).
    pub(super) async fn error(&mut self, e: ErrorFields) -> Result<(), End> {
        let mut out = BytesMut::new();
        encode::error_response(&mut out, &e);
        encode::ready_for_query(&mut out);
        self.write(&out).await
    }
}

/// The system, timeline and WAL end this server reports: the spool's, or, before its first
/// WAL, those of the stream the link opened (a brand-new spool has no timeline of its own
/// yet). System 0: neither is known.
pub(super) fn served(view: &SpoolView, link: Option<&Welcome>) -> (u64, TimeLineId, Lsn) {
    match (view.extent.end, link) {
        (Lsn(0), Some(w)) => (w.system_id, TimeLineId(w.timeline), Lsn(w.start)),
        (Lsn(0), None) => (0, view.extent.tli, view.extent.end),
        _ => (view.system_id, view.extent.tli, view.extent.end),
    }
}

impl Session<'_> {
    /// [`served`] now.
    pub(super) fn served(&self) -> (u64, TimeLineId, Lsn) {
        let spooler = &self.ds.spooler;
        served(&spooler.view.borrow(), spooler.link.borrow().as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spool::Extent;

    #[test]
    fn a_spool_without_wal_serves_the_timeline_of_the_stream_the_link_opened() {
        // A brand-new spool: timeline 1 by default, whatever the primary's.
        let mut view = SpoolView::empty(7, TimeLineId(1));
        let w = Welcome {
            system_id: 7,
            timeline: 3,
            start: 0x5000000,
            ..Default::default()
        };
        assert_eq!(served(&view, None), (0, TimeLineId(1), Lsn(0)));
        assert_eq!(served(&view, Some(&w)), (7, TimeLineId(3), Lsn(0x5000000)));
        // Once the spool holds WAL, its own.
        view.extent = Extent {
            tli: TimeLineId(3),
            start: Lsn(0x5000000),
            end: Lsn(0x5001000),
            durable: Lsn(0x5001000),
        };
        assert_eq!(served(&view, Some(&w)), (7, TimeLineId(3), Lsn(0x5001000)));
    }
}
