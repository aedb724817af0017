//! Message boundaries in a byte stream that is passed on as it arrives (a tunnel's backend
//! direction), sans-IO: which messages start, without buffering any of them, so that a large
//! message (a 1 GB row in logical replication) costs nothing here.

use crate::WireError;

/// Tracks where tagged messages (`tag len body`) begin in a stream fed chunk by chunk.
#[derive(Debug, Default, Clone)]
pub struct Scanner {
    /// Header bytes of the message being started (tag and length), fewer than 5.
    head: [u8; 5],
    have: usize,
    /// Body bytes of the current message still to skip.
    skip: u64,
}

impl Scanner {
    /// Feeds the next bytes of the stream; calls `on` with the tag of every message whose
    /// header completes in `chunk`, in order.
    pub fn feed(&mut self, mut chunk: &[u8], mut on: impl FnMut(u8)) -> Result<(), WireError> {
        while !chunk.is_empty() {
            if self.skip > 0 {
                let n = (self.skip.min(chunk.len() as u64)) as usize;
                self.skip -= n as u64;
                chunk = &chunk[n..];
                continue;
            }
            let n = (5 - self.have).min(chunk.len());
            self.head[self.have..self.have + n].copy_from_slice(&chunk[..n]);
            self.have += n;
            chunk = &chunk[n..];
            if self.have == 5 {
                let tag = self.head[0];
                let len =
                    u32::from_be_bytes([self.head[1], self.head[2], self.head[3], self.head[4]]);
                if len < 4 {
                    return Err(WireError::BadLength {
                        tag: tag as char,
                        len,
                    });
                }
                self.skip = u64::from(len - 4);
                self.have = 0;
                on(tag);
            }
        }
        Ok(())
    }

    /// Whether the stream is at a message boundary.
    pub fn at_boundary(&self) -> bool {
        self.have == 0 && self.skip == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode;
    use bytes::BytesMut;
    use proptest::prelude::*;

    fn stream() -> Vec<u8> {
        let mut b = BytesMut::new();
        encode::parameter_status(&mut b, "server_version", "16.4");
        encode::copy_data(&mut b, &[7u8; 70_000]);
        encode::tagged(&mut b, b'C', |_| {});
        encode::ready_for_query(&mut b);
        b.to_vec()
    }

    #[test]
    fn tags_come_out_whatever_the_chunking() {
        let s = stream();
        for size in [1, 2, 3, 5, 7, 4096, s.len()] {
            let mut sc = Scanner::default();
            let mut tags = Vec::new();
            for c in s.chunks(size) {
                sc.feed(c, |t| tags.push(t)).unwrap();
            }
            assert_eq!(tags, b"SdCZ", "chunks of {size}");
            assert!(sc.at_boundary());
        }
    }

    #[test]
    fn a_length_below_four_is_an_error() {
        let mut sc = Scanner::default();
        assert!(sc.feed(&[b'Z', 0, 0, 0, 3], |_| {}).is_err());
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200), cut in 0usize..200) {
            let mut sc = Scanner::default();
            let cut = cut.min(bytes.len());
            let _ = sc.feed(&bytes[..cut], |_| {}).and_then(|_| sc.feed(&bytes[cut..], |_| {}));
        }
    }
}
