//! A standby's session after authentication, as the downstream holds it: the connection, its
//! channel on the stream, its entry in the metrics. [`super::commands`] serves its replication
//! commands; [`super::streamer`] its START_REPLICATION.

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use walrelay_pgwire::{encode, ErrorFields};

use super::{Downstream, End, Reader, Standby, Writer};
use crate::monitor::standbys::StandbyHandle;
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
