//! The cancellation-safe I/O adapter that owns a socket's read side.
//!
//! [`MsgReader::read`] keeps partially received bytes in its own buffer, so dropping the
//! future (for example when another branch of a `select!` wins) loses nothing: the next call
//! continues where the last left off. Writes go straight to the write half with `write_all`.
//!
//! A reader may be told to skip bytes of the stream it has not received yet
//! ([`MsgReader::skip`]): they are dropped from the front of what each later read brings,
//! or, by the caller, in the kernel before they are read ([`MsgReader::skipped`]).

use bytes::BytesMut;
use futures::FutureExt;
use tokio::io::{AsyncRead, AsyncReadExt};
use walrelay_pgwire::WireError;

/// Initial capacity of the read buffer; parsers grow it up to their per-message cap.
const INITIAL_BUF: usize = 16 * 1024;

/// Reads whole messages from `R` with a sans-IO parser.
pub struct MsgReader<R> {
    io: R,
    buf: BytesMut,
    /// Bytes of the stream still to drop as they arrive ([`MsgReader::skip`]).
    skip: usize,
}

impl<R: AsyncRead + Unpin> MsgReader<R> {
    pub fn new(io: R) -> Self {
        MsgReader {
            io,
            buf: BytesMut::with_capacity(INITIAL_BUF),
            skip: 0,
        }
    }

    /// Wraps `io` with bytes already read from it.
    pub fn with_buffer(io: R, buf: BytesMut) -> Self {
        MsgReader { io, buf, skip: 0 }
    }

    /// Reads until `parse` yields a message. Cancellation-safe. EOF is `WireError::Closed`.
    pub async fn read<T>(
        &mut self,
        mut parse: impl FnMut(&mut BytesMut) -> Result<Option<T>, WireError>,
    ) -> Result<T, WireError> {
        loop {
            if let Some(msg) = parse(&mut self.buf)? {
                return Ok(msg);
            }
            self.read_once(4096, INITIAL_BUF).await?;
        }
    }

    /// One read from the socket into the buffer, with room for at least `room` more bytes;
    /// returns how many came (never 0). Cancellation-safe (nothing is read unless the call
    /// completes). EOF is `WireError::Closed`.
    pub async fn fill(&mut self, room: usize) -> Result<usize, WireError> {
        self.read_once(room, room).await
    }

    /// One read of at most `max` bytes (and at least one; a smaller `max` than the buffer's
    /// room keeps the rest in the socket, for [`MsgReader::skip`] to drop there); how many
    /// came (never 0). Cancellation-safe. EOF is `WireError::Closed`.
    pub async fn fill_at_most(&mut self, max: usize) -> Result<usize, WireError> {
        use bytes::BufMut;
        let max = max.max(1);
        if self.buf.capacity() - self.buf.len() < max {
            self.buf.reserve(max);
        }
        let n = self.io.read_buf(&mut (&mut self.buf).limit(max)).await?;
        self.received(n)
    }

    /// [`MsgReader::fill_at_most`] only if bytes are there now: `None` when the read would
    /// wait (polled once; nothing read).
    pub fn fill_at_most_ready(&mut self, max: usize) -> Option<Result<usize, WireError>> {
        self.fill_at_most(max).now_or_never()
    }

    /// One read into the buffer, after reserving `grow` more bytes if it has less than
    /// `min_room` free; how many came (never 0; EOF is `WireError::Closed`).
    async fn read_once(&mut self, min_room: usize, grow: usize) -> Result<usize, WireError> {
        if self.buf.capacity() - self.buf.len() < min_room {
            self.buf.reserve(grow);
        }
        let n = self.io.read_buf(&mut self.buf).await?;
        self.received(n)
    }

    /// After a read of `n` bytes: EOF when 0, else the bytes still to skip dropped from the
    /// front of the new ones.
    fn received(&mut self, n: usize) -> Result<usize, WireError> {
        if n == 0 {
            return Err(WireError::Closed);
        }
        if self.skip > 0 {
            let d = self.skip.min(self.buf.len());
            bytes::Buf::advance(&mut self.buf, d);
            self.skip -= d;
        }
        Ok(n)
    }

    /// Drops the next `n` bytes of the stream: those buffered now, then the rest from the
    /// front of what later reads bring (which must not be parsed meanwhile: the buffer is
    /// empty until they are all gone, or holds what follows them).
    pub fn skip(&mut self, n: usize) {
        let d = n.min(self.buf.len());
        bytes::Buf::advance(&mut self.buf, d);
        self.skip += n - d;
    }

    /// Bytes [`MsgReader::skip`] still has to drop.
    pub fn skipping(&self) -> usize {
        self.skip
    }

    /// The caller dropped `n` (at most [`MsgReader::skipping`]) of the bytes to skip before
    /// they were read (`tcp::Discard`).
    pub fn skipped(&mut self, n: usize) {
        debug_assert!(n <= self.skip, "{n} skipped of {}", self.skip);
        self.skip -= n.min(self.skip);
    }

    /// A message already buffered, without reading from the socket.
    pub fn try_read<T>(
        &mut self,
        parse: impl FnOnce(&mut BytesMut) -> Result<Option<T>, WireError>,
    ) -> Result<Option<T>, WireError> {
        parse(&mut self.buf)
    }

    /// Bytes received but not yet parsed.
    pub fn buffered(&self) -> &[u8] {
        &self.buf
    }

    pub fn get_mut(&mut self) -> &mut R {
        &mut self.io
    }

    /// The socket and any unparsed bytes.
    pub fn into_parts(self) -> (R, BytesMut) {
        (self.io, self.buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use walrelay_pgwire::parse_tagged;

    fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[tokio::test]
    async fn fill_keeps_what_it_read_for_the_parser() {
        // Two whole messages and part of a third, all available at once.
        let mut bytes = msg(b'd', &[7; 100]);
        bytes.extend(msg(b'd', &[8; 200]));
        let third = msg(b'd', &[9; 50_000]);
        bytes.extend_from_slice(&third[..20_000]);
        let total = bytes.len();
        let mut r = MsgReader::new(&bytes[..]);
        assert_eq!(r.fill(64 * 1024).await.unwrap(), total);
        let cap = |_| 1 << 20;
        let a = r.try_read(|b| parse_tagged(b, cap)).unwrap().unwrap();
        let b = r.try_read(|b| parse_tagged(b, cap)).unwrap().unwrap();
        assert_eq!((a.body.len(), b.body.len()), (100, 200));
        assert!(r.try_read(|b| parse_tagged(b, cap)).unwrap().is_none());
        // The partial message stays buffered; the end of the input is an error.
        assert_eq!(r.buffered().len(), 20_000);
        assert!(matches!(r.fill(1024).await, Err(WireError::Closed)));
    }

    #[tokio::test]
    async fn fill_at_most_ready_reads_what_is_there_and_never_waits() {
        use tokio::io::AsyncWriteExt;
        let (mut tx, rx) = tokio::io::duplex(1 << 20);
        let mut r = MsgReader::new(rx);
        // Nothing sent yet: no read, nothing buffered.
        assert!(r.fill_at_most_ready(4096).is_none());
        tx.write_all(&msg(b'd', &[1; 300])).await.unwrap();
        tx.write_all(&msg(b'd', &[2; 300])).await.unwrap();
        assert_eq!(r.fill_at_most_ready(4096).unwrap().unwrap(), 610);
        assert!(r.fill_at_most_ready(4096).is_none());
        assert_eq!(r.buffered().len(), 610);
        // The peer gone: the error, not a wait.
        drop(tx);
        assert!(matches!(
            r.fill_at_most_ready(4096),
            Some(Err(WireError::Closed))
        ));
    }

    /// A skip drops what is buffered, then the front of later reads, and nothing more;
    /// reads take at most what they are allowed; bytes the caller dropped before they were
    /// read are counted off.
    #[tokio::test]
    async fn skip_drops_exactly_the_bytes_asked_as_they_come() {
        let mut bytes = msg(b'd', &[1; 100]);
        bytes.extend(msg(b'd', &[2; 30_000]));
        bytes.extend(msg(b'd', &[3; 10]));
        let mut r = MsgReader::new(&bytes[..]);
        assert_eq!(r.fill_at_most(1000).await.unwrap(), 1000);
        let cap = |_| 1 << 20;
        let a = r.try_read(|b| parse_tagged(b, cap)).unwrap().unwrap();
        assert_eq!(a.body.len(), 100);
        // The second message has begun: skip all of it.
        assert_eq!(r.buffered().len(), 1000 - 105);
        r.skip(30_005);
        assert!(r.buffered().is_empty());
        assert_eq!(r.skipping(), 30_005 - 895);
        // The caller dropped 20,000 of them itself (as `tcp::Discard` does).
        r.skipped(20_000);
        assert_eq!(r.skipping(), 30_005 - 895 - 20_000);
        // Reads bring the rest and drop it from their front.
        let mut r = MsgReader::with_buffer(&bytes[105 + 895 + 20_000..], BytesMut::new());
        r.skip(30_005 - 895 - 20_000);
        while r.skipping() > 0 {
            r.fill_at_most(4096).await.unwrap();
        }
        let c = loop {
            if let Some(m) = r.try_read(|b| parse_tagged(b, cap)).unwrap() {
                break m;
            }
            r.fill_at_most(4096).await.unwrap();
        };
        assert_eq!(&c.body[..], &[3; 10]);
        assert!(matches!(r.fill_at_most(4096).await, Err(WireError::Closed)));
    }

    #[tokio::test]
    async fn fill_reads_at_least_its_room_when_more_waits() {
        let bytes = vec![0u8; 1 << 20];
        let mut r = MsgReader::new(&bytes[..]);
        let n = r.fill(4096).await.unwrap();
        assert!((4096..1 << 20).contains(&n), "{n}");
        assert_eq!(r.buffered().len(), n);
    }
}
