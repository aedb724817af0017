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
    /// A temporary slot's creation in flight, and the session's count of ReadyForQuery
    /// received at which its answer begins (`Answers::answer_mark` when it was sent).
    creating: Option<(String, u64)>,
}

impl PrimaryWatch {
    pub fn new(logical: bool) -> PrimaryWatch {
        PrimaryWatch {
            logical,
            ..Default::default()
        }
    }

    /// CREATE_REPLICATION_SLOT `slot` TEMPORARY goes to the primary; its answer begins once
    /// `mark` ReadyForQuery have come in the session (one creation is followed at a time; a
    /// second is not remembered).
    pub fn creating(&mut self, slot: String, mark: u64) {
        if self.creating.is_none() {
            self.creating = Some((slot, mark));
        }
    }

    /// A message of the primary's begins, `answered` ReadyForQuery having come before it
    /// (this one included). Returns the temporary slot in creation when this message is the
    /// primary's CommandComplete to it: the slot exists now, and is this session's. Once the
    /// creation's answer has ended without one, nothing later is taken for it.
    pub fn tag(&mut self, tag: u8, answered: u64) -> Option<String> {
        match tag {
            b'W' => self.streaming = true,
            b'Z' => self.streaming = false,
            _ => {}
        }
        let (_, mark) = self.creating.as_ref()?;
        match answered.cmp(mark) {
            std::cmp::Ordering::Less => {}
            std::cmp::Ordering::Greater => self.creating = None,
            std::cmp::Ordering::Equal => match tag {
                b'C' => return self.creating.take().map(|(slot, _)| slot),
                b'E' => self.creating = None,
                _ => {}
            },
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
        w.tag(b'W', 0);
        // 100 bytes of WAL from 0x1000 (the server's end, 0x9000, does not count).
        w.head(b'd', &xlogdata(0x1000, 0x9000), 25 + 100);
        let lowered = w.clamp(&status(u64::MAX)).unwrap();
        assert_eq!(lowered, status(0x1064));
        assert_eq!(w.clamp(&status(0x1000)), None, "within what was sent");
        w.head(b'd', &[b'k', 0, 0, 0, 0, 0, 0, 0x20, 0], 18);
        assert_eq!(w.clamp(&status(u64::MAX)).unwrap(), status(0x2000));
        w.tag(b'Z', 1);
        assert_eq!(w.clamp(&status(u64::MAX)), None, "streaming ended");
        // Logical: the positions are the changes' LSNs.
        let mut l = PrimaryWatch::new(true);
        l.tag(b'W', 0);
        l.head(b'd', &xlogdata(0x5000, 0x5100), 25 + 3);
        assert_eq!(l.clamp(&status(u64::MAX)).unwrap(), status(0x5100));
    }

    /// The primary's messages `tags`, counting ReadyForQuery on from `*answered` as the
    /// session's `Answers` does; the temporary slots they show created.
    fn created(w: &mut PrimaryWatch, answered: &mut u64, tags: &[u8]) -> Vec<String> {
        let mut slots = Vec::new();
        for &t in tags {
            *answered += u64::from(t == b'Z');
            slots.extend(w.tag(t, *answered));
        }
        slots
    }

    #[test]
    fn a_temporary_slot_counts_once_the_primary_created_it() {
        let mut w = PrimaryWatch::new(false);
        let mut n = 4;
        // Behind one unanswered command: its CommandComplete is not the creation's.
        w.creating("tmp".into(), 5);
        assert!(created(&mut w, &mut n, b"TDCZ").is_empty());
        assert_eq!(created(&mut w, &mut n, b"TDC"), ["tmp"]);
        // Refused by the primary (a slot of that name exists): not ours.
        assert!(created(&mut w, &mut n, b"Z").is_empty());
        w.creating("victim".into(), n);
        assert!(created(&mut w, &mut n, b"EZ").is_empty());
        assert!(
            created(&mut w, &mut n, b"CZ").is_empty(),
            "forgotten after its error"
        );
    }

    #[test]
    fn a_creation_answered_without_command_complete_takes_no_later_one() {
        // Should the creation's answer end (ReadyForQuery) with neither CommandComplete nor
        // ErrorResponse, the next command's CommandComplete is not the slot's.
        let mut w = PrimaryWatch::new(false);
        let mut n = 0;
        w.creating("tmp".into(), 0);
        assert!(created(&mut w, &mut n, b"NZ").is_empty());
        assert!(created(&mut w, &mut n, b"CZ").is_empty());
        assert!(w.creating.is_none());
    }
}
