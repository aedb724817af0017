//! The cancellation-safe I/O adapter that owns a socket's read side.
//!
//! [`MsgReader::read`] keeps partially received bytes in its own buffer, so dropping the
//! future (for example when another branch of a `select!` wins) loses nothing: the next call
//! continues where the last left off. Writes go straight to the write half with `write_all`.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt};
use walrelay_pgwire::WireError;

/// Initial capacity of the read buffer; parsers grow it up to their per-message cap.
const INITIAL_BUF: usize = 16 * 1024;

/// Reads whole messages from `R` with a sans-IO parser.
pub struct MsgReader<R> {
    io: R,
    buf: BytesMut,
}

impl<R: AsyncRead + Unpin> MsgReader<R> {
    pub fn new(io: R) -> Self {
        MsgReader {
            io,
            buf: BytesMut::with_capacity(INITIAL_BUF),
        }
    }

    /// Wraps `io` with bytes already read from it.
    pub fn with_buffer(io: R, buf: BytesMut) -> Self {
        MsgReader { io, buf }
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
            if self.buf.capacity() - self.buf.len() < 4096 {
                self.buf.reserve(INITIAL_BUF);
            }
            if self.io.read_buf(&mut self.buf).await? == 0 {
                return Err(WireError::Closed);
            }
        }
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
