//! How many ReadyForQuery the primary still owes a tunnelled client: a refusal the downstream
//! answers itself waits for them, so that its ErrorResponse and ReadyForQuery come in the
//! order the client sent its messages.
//!
//! Each Query and each Sync the client sent is answered by one ReadyForQuery, except the
//! Syncs the primary reads in copy-in mode, which it ignores (protocol docs, "COPY
//! Operations"; `CopyGetData` in `copyfromparse.c`). libpq sends one there whenever a
//! `COPY ... FROM STDIN` runs through the extended protocol: its Sync goes with the Execute,
//! before the primary enters copy-in, and another follows the CopyDone. So when the client
//! ends a copy-in (CopyDone or CopyFail) that the primary started (CopyInResponse), the
//! Syncs it sent since the Query or Execute that started it are not answered.
//!
//! A client that sends other messages inside a copy-in, which PostgreSQL refuses, can still
//! leave the count off; only its own refusals are then answered late or early.

/// The client's side of the count (pure; the tunnel feeds it both directions' tags).
#[derive(Debug, Default)]
pub(crate) struct Answers {
    /// Queries and Syncs sent whose ReadyForQuery has not come back.
    outstanding: u32,
    /// Syncs sent since the last Query or Execute.
    syncs_since_command: u32,
    /// The primary answered a CopyInResponse the client has not ended yet.
    copy_in: bool,
    /// ReadyForQuery received from the primary over the session.
    answered: u64,
}

impl Answers {
    /// A session whose startup reply (ending with a ReadyForQuery) is still to come.
    pub fn awaiting_startup() -> Answers {
        Answers {
            outstanding: 1,
            ..Answers::default()
        }
    }

    /// The client sent a message with `tag` to the primary.
    pub fn client_sent(&mut self, tag: u8) {
        match tag {
            b'Q' | b'E' => {
                self.syncs_since_command = 0;
                self.outstanding = self.outstanding.saturating_add(u32::from(tag == b'Q'));
            }
            b'S' => {
                self.syncs_since_command = self.syncs_since_command.saturating_add(1);
                self.outstanding = self.outstanding.saturating_add(1);
            }
            b'c' | b'f' if self.copy_in => {
                self.copy_in = false;
                self.outstanding = self.outstanding.saturating_sub(self.syncs_since_command);
                self.syncs_since_command = 0;
            }
            _ => {}
        }
    }

    /// The primary started a message with `tag`.
    pub fn primary_sent(&mut self, tag: u8) {
        match tag {
            b'G' => self.copy_in = true,
            b'Z' => {
                self.outstanding = self.outstanding.saturating_sub(1);
                self.answered = self.answered.wrapping_add(1);
            }
            _ => {}
        }
    }

    /// Whether answers to messages sent are still to come.
    pub fn pending(&self) -> bool {
        self.outstanding > 0
    }

    /// ReadyForQuery still owed.
    #[cfg(test)]
    pub fn outstanding(&self) -> u32 {
        self.outstanding
    }

    /// ReadyForQuery received so far.
    pub fn answered(&self) -> u64 {
        self.answered
    }

    /// How many ReadyForQuery will have come when the answer to a command sent now begins:
    /// those received and those still owed (to tell a temporary slot's creation from the
    /// answers to earlier commands).
    pub fn answer_mark(&self) -> u64 {
        self.answered.wrapping_add(u64::from(self.outstanding))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(a: &mut Answers, client: &[u8], primary: &[u8]) {
        client.iter().for_each(|&t| a.client_sent(t));
        primary.iter().for_each(|&t| a.primary_sent(t));
    }

    #[test]
    fn queries_and_syncs_are_answered_once_each() {
        let mut a = Answers::awaiting_startup();
        run(&mut a, b"", b"RSKZ");
        assert!(!a.pending());
        run(&mut a, b"QPBDES", b"TDCZ1");
        assert_eq!(a.outstanding(), 1);
        assert_eq!(a.answer_mark(), 3);
        run(&mut a, b"", b"2TDCZ");
        assert!(!a.pending());
        assert_eq!((a.answered(), a.answer_mark()), (3, 3));
        // A Flush or CopyData is not answered with ReadyForQuery.
        run(&mut a, b"Hd", b"");
        assert!(!a.pending());
    }

    #[test]
    fn the_sync_sent_with_an_extended_copy_in_is_not_answered() {
        // libpq: Parse Bind Describe Execute Sync; CopyInResponse; CopyData CopyDone Sync;
        // CommandComplete ReadyForQuery (one for two Syncs).
        let mut a = Answers::default();
        run(&mut a, b"PBDES", b"12G");
        run(&mut a, b"ddcS", b"CZ");
        assert!(!a.pending(), "{a:?}");
        // The same with CopyFail: ErrorResponse, then the Sync after it is answered.
        run(&mut a, b"PBDES", b"12G");
        run(&mut a, b"dfS", b"EZ");
        assert!(!a.pending(), "{a:?}");
    }

    #[test]
    fn a_simple_copy_in_counts_its_query_only() {
        let mut a = Answers::default();
        run(&mut a, b"Q", b"G");
        run(&mut a, b"dc", b"CZ");
        assert!(!a.pending());
    }

    #[test]
    fn copy_messages_outside_copy_in_change_nothing() {
        // PostgreSQL ignores CopyDone and CopyFail outside copy-in: the Sync is answered.
        let mut a = Answers::default();
        run(&mut a, b"PBES", b"");
        run(&mut a, b"c", b"");
        assert_eq!(a.outstanding(), 1);
        run(&mut a, b"", b"12CZ");
        assert!(!a.pending());
    }
}
