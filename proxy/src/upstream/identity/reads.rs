//! How an identity reads the primary: in batches ([`READ_PACE`], [`paced_fill`]), and the
//! WAL dropped in the kernel rather than read where it can be ([`Skipper`]).
//!
//! The identity needs of each XLogData only its header (where the primary's WAL ends); the
//! WAL itself crossed the link in the stream. On a plain TCP connection (not TLS, which must
//! decrypt every record, nor a Unix socket) a message still arriving when the read's whole
//! messages are handled is noted by its header, and its rest is dropped with
//! [`crate::tcp::Discard`] as it comes, never copied into the upstream. While the messages
//! that end a read are large ([`LARGE`]) the reads are small ones ([`PROBE`]): on a bulk
//! load, whose messages are the walsender's largest (128 kB), each holds the next message's
//! header and little more, so most of each message is dropped unread. Where messages are
//! small (a commit each), a probe ends in a small one and reads go back to their full
//! size.

use std::time::Duration;

use walrelay_pgwire::repl::{xlogdata_start, XLOGDATA_START};
use walrelay_pgwire::WireError;
use walrelay_wal::lsn::Lsn;

use crate::pgclient::PrimaryConn;
use crate::pgio::MsgReader;
use crate::tcp::RecvWake;

/// How long the identity waits, once it has read all the primary sent on its connection,
/// before it reads again. The WAL on this connection is dropped, so nothing waits on it; a
/// busy primary sends each commit's WAL on its own, and reading each as it came woke the
/// upstream as often again as the stream's own connection does. Whatever has arrived is read
/// before the wait (`Identity::drain_primary`), so the wait never limits how fast the
/// connection drains (a walsender that fell behind on it could come to need WAL it has
/// removed); the standby's feedback goes to the primary as soon as it comes.
pub(super) const READ_PACE: Duration = Duration::from_millis(20);

/// Room for each read on the identity's connection: two of the walsender's largest
/// messages (128 kB of WAL each).
pub(super) const READ_ROOM: usize = 256 * 1024;

/// Most bytes read in one go before the identity turns to its other work (the standby's
/// feedback); it comes back to the connection at once.
pub(super) const READ_BURST: usize = 4 << 20;

/// While an identity waits [`READ_PACE`], the runtime is told of the primary's bytes on its
/// connection only once this many wait ([`RecvWake`], TCP): each commit's WAL arriving
/// meanwhile woke the upstream for nothing. Reaching it, the connection is read at once.
pub(super) const PACE_MARK: usize = 1 << 20;

/// One read of at most `room` of the primary's bytes on an identity's connection, not
/// before `at`; how many came. Cancellation-safe. The socket's wake-ups deferred for the
/// pace are set back when it is over, or when [`PACE_MARK`] bytes came first.
pub(super) async fn paced_fill<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut MsgReader<R>,
    wake: &mut Option<RecvWake>,
    at: Option<tokio::time::Instant>,
    room: usize,
) -> Result<usize, WireError> {
    let paced = async {
        if let Some(at) = at {
            tokio::time::sleep_until(at).await;
        }
    };
    let deferred = wake.as_ref().is_some_and(|w| w.deferred());
    let early = tokio::select! {
        biased;
        // Kernel-deferred: ready only at the mark.
        n = reader.fill_at_most(room), if deferred => Some(n),
        _ = paced => None,
    };
    if let Some(w) = wake.as_mut() {
        w.restore();
    }
    match early {
        Some(n) => n,
        None => reader.fill_at_most(room).await,
    }
}

/// A message still arriving is dropped only when at least this much of it is to come.
pub(super) const SKIP_MIN: usize = 16 * 1024;
/// Room of a read while messages are large.
pub(super) const PROBE: usize = 4 * 1024;
/// A message at least this long makes the next read a probe.
pub(super) const LARGE: usize = 2 * SKIP_MIN;

/// Whether the identity's reads are probes: its last read ended in the start of a large
/// message.
#[derive(Debug, Default)]
pub(super) struct Skipper {
    probing: bool,
}

impl Skipper {
    /// After the buffer's whole messages were handled: when what remains is the start of
    /// an XLogData with its header and at least [`SKIP_MIN`] still to come, and the
    /// connection can drop bytes unread, the reader skips the message; its `walEnd`. The
    /// next reads are probes while the messages that remain this way are large ([`LARGE`]).
    pub fn after_messages(&mut self, conn: &mut PrimaryConn) -> Option<Lsn> {
        if conn.discard.is_none() || conn.reader.skipping() > 0 {
            return None;
        }
        let buffered = conn.reader.buffered();
        let Some((end, len)) = xlogdata_start(buffered) else {
            // A header not all there yet tells nothing; another message does.
            if buffered.len() >= XLOGDATA_START {
                self.probing = false;
            }
            return None;
        };
        // Never beyond the reader's cap on a message's body (its parser failed already).
        let capped = len <= conn.max_message_bytes.saturating_add(5);
        self.probing = capped && len >= LARGE;
        if !capped || len.saturating_sub(buffered.len()) < SKIP_MIN {
            return None;
        }
        conn.reader.skip(len);
        Some(end)
    }

    /// Drops what waits in the kernel of the bytes the reader skips; how many went.
    pub fn drop_waiting(&self, conn: &mut PrimaryConn) -> Result<usize, WireError> {
        let (Some(d), n) = (conn.discard.as_ref(), conn.reader.skipping()) else {
            return Ok(0);
        };
        let dropped = d.drop_waiting(n).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => WireError::Closed,
            _ => WireError::Io(e),
        })?;
        conn.reader.skipped(dropped);
        Ok(dropped)
    }

    /// The most the next read takes: [`PROBE`] while messages are large, else `room`.
    pub fn room(&self, room: usize) -> usize {
        match self.probing {
            true => PROBE,
            false => room,
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests;
