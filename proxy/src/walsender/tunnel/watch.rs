//! What a tunnel learns from the primary's answers, to hold its client to them:
//!
//! - how far the primary has sent it WAL on this connection (XLogData and keepalive ends):
//!   the client's status updates are lowered to that before they go up, as the spool path
//!   lowers a standby's, so a lying client can neither release a synchronous commit nor move
//!   a slot past what it was sent;
//! - which temporary slots this session created (the primary answered CommandComplete to the
//!   CREATE_REPLICATION_SLOT … TEMPORARY), reported to the session's policy: without
//!   `downstream.allow_slot_commands` a physical START_REPLICATION may name only those, so it
//!   cannot move another client's permanent slot.

use walrelay_pgwire::repl::clamp_status_update;
use walrelay_wal::lsn::Lsn;

#[derive(Debug, Default)]
pub(crate) struct PrimaryWatch {
    /// Logical replication: XLogData positions are LSNs of changes, not of the payload.
    logical: bool,
    /// The highest WAL end the primary sent this client.
    sent: u64,
    /// In COPY BOTH (streaming): client CopyData are status updates and feedback.
    streaming: bool,
    /// A temporary slot's creation in flight, and how many ReadyForQuery come before its answer.
    creating: Option<(String, u32)>,
}

impl PrimaryWatch {
    pub fn new(logical: bool) -> PrimaryWatch {
        PrimaryWatch {
            logical,
            ..Default::default()
        }
    }

    /// CREATE_REPLICATION_SLOT `slot` TEMPORARY goes to the primary behind `ahead` commands
    /// still unanswered (one creation is followed at a time; a second is not remembered).
    pub fn creating(&mut self, slot: String, ahead: u32) {
        if self.creating.is_none() {
            self.creating = Some((slot, ahead));
        }
    }

    /// A message of the primary's begins. Returns the temporary slot in creation when this
    /// message is the primary's CommandComplete to it: the slot exists now, and is this
    /// session's.
    pub fn tag(&mut self, tag: u8) -> Option<String> {
        match tag {
            b'W' => self.streaming = true,
            b'Z' => self.streaming = false,
            _ => {}
        }
        let (_, ahead) = self.creating.as_mut()?;
        match tag {
            b'Z' if *ahead > 0 => *ahead -= 1,
            b'C' if *ahead == 0 => return self.creating.take().map(|(slot, _)| slot),
            b'E' if *ahead == 0 => self.creating = None,
            _ => {}
        }
        None
    }

    /// The first bytes (`head`) of a message of the primary's whose body is `len` bytes.
    pub fn head(&mut self, tag: u8, head: &[u8], len: u64) {
        if tag != b'd' || head.len() < 9 {
            return;
        }
        let at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&head[i..i + 8]);
            u64::from_be_bytes(b)
        };
        let end = match head[0] {
            // XLogData: start, the server's end, send time, then the data.
            b'w' if head.len() >= 17 => match self.logical {
                true => at(1).max(at(9)),
                false => at(1).saturating_add(len.saturating_sub(25)),
            },
            b'k' => at(1),
            _ => return,
        };
        self.sent = self.sent.max(end);
    }

    /// A client CopyData `body`, lowered to what was sent if it is a status update while
    /// streaming; None when it goes as it is.
    pub fn clamp(&self, body: &[u8]) -> Option<Vec<u8>> {
        if !self.streaming {
            return None;
        }
        match clamp_status_update(body, Lsn(self.sent)) {
            (b, true) => Some(b.into_owned()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xlogdata(start: u64, end: u64) -> Vec<u8> {
        let mut h = vec![b'w'];
        h.extend_from_slice(&start.to_be_bytes());
        h.extend_from_slice(&end.to_be_bytes());
        h
    }

    fn status(lsn: u64) -> Vec<u8> {
        let mut b = vec![b'r'];
        for _ in 0..3 {
            b.extend_from_slice(&lsn.to_be_bytes());
        }
        b.extend_from_slice(&[0; 9]);
        b
    }

    #[test]
    fn status_updates_are_lowered_to_what_was_sent_while_streaming() {
        let mut w = PrimaryWatch::new(false);
        assert_eq!(w.clamp(&status(u64::MAX)), None, "not streaming: COPY data");
        w.tag(b'W');
        // 100 bytes of WAL from 0x1000 (the server's end, 0x9000, does not count).
        w.head(b'd', &xlogdata(0x1000, 0x9000), 25 + 100);
        let lowered = w.clamp(&status(u64::MAX)).unwrap();
        assert_eq!(lowered, status(0x1064));
        assert_eq!(w.clamp(&status(0x1000)), None, "within what was sent");
        w.head(b'd', &[b'k', 0, 0, 0, 0, 0, 0, 0x20, 0], 18);
        assert_eq!(w.clamp(&status(u64::MAX)).unwrap(), status(0x2000));
        w.tag(b'Z');
        assert_eq!(w.clamp(&status(u64::MAX)), None, "streaming ended");
        // Logical: the positions are the changes' LSNs.
        let mut l = PrimaryWatch::new(true);
        l.tag(b'W');
        l.head(b'd', &xlogdata(0x5000, 0x5100), 25 + 3);
        assert_eq!(l.clamp(&status(u64::MAX)).unwrap(), status(0x5100));
    }

    #[test]
    fn a_temporary_slot_counts_once_the_primary_created_it() {
        let mut w = PrimaryWatch::new(false);
        // Behind one unanswered command: its CommandComplete is not the creation's.
        w.creating("tmp".into(), 1);
        let created = |w: &mut PrimaryWatch, tags: &[u8]| -> Vec<String> {
            tags.iter().filter_map(|&t| w.tag(t)).collect()
        };
        assert!(created(&mut w, b"TDCZ").is_empty());
        assert_eq!(created(&mut w, b"TDC"), ["tmp"]);
        // Refused by the primary (a slot of that name exists): not ours.
        assert!(created(&mut w, b"Z").is_empty());
        w.creating("victim".into(), 0);
        assert!(created(&mut w, b"EZ").is_empty());
    }
}
