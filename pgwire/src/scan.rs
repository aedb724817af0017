//! Message boundaries in a byte stream that is passed on as it arrives (a tunnel's backend
//! direction), sans-IO: which messages start, without buffering any of them, so that a large
//! message (a 1 GB row in logical replication) costs nothing here.

use crate::WireError;

/// Most body bytes of a message [`Scanner::feed_heads`] shows: a replication CopyData's type
/// and its two positions (`w`/`k`, 8-byte LSNs).
pub const BODY_HEAD: usize = 17;

/// What [`Scanner::feed_seen`] reports, in stream order.
#[derive(Debug, PartialEq, Eq)]
pub enum Seen<'a> {
    /// A message with this tag begins (its header is complete).
    Start(u8),
    /// The first [`BODY_HEAD`] bytes of its body (or all of a shorter one), and its length.
    Head { tag: u8, head: &'a [u8], len: u64 },
}

/// Tracks where tagged messages (`tag len body`) begin in a stream fed chunk by chunk.
#[derive(Debug, Default, Clone)]
pub struct Scanner {
    /// Header bytes of the message being started (tag and length), fewer than 5.
    head: [u8; 5],
    have: usize,
    /// Body bytes of the current message still to skip.
    skip: u64,
    /// The current message's tag, body length, and its first body bytes gathered so far.
    tag: u8,
    body_len: u64,
    body: [u8; BODY_HEAD],
    body_have: usize,
}

impl Scanner {
    /// Feeds the next bytes of the stream; calls `on` with the tag of every message whose
    /// header completes in `chunk`, in order.
    pub fn feed(&mut self, chunk: &[u8], mut on: impl FnMut(u8)) -> Result<(), WireError> {
        self.feed_seen(chunk, |s| {
            if let Seen::Start(t) = s {
                on(t)
            }
        })
    }

    /// [`Scanner::feed`], also reporting the first body bytes of each message ([`Seen`]).
    pub fn feed_seen(
        &mut self,
        mut chunk: &[u8],
        mut on: impl FnMut(Seen<'_>),
    ) -> Result<(), WireError> {
        while !chunk.is_empty() {
            if self.skip > 0 {
                let n = (self.skip.min(chunk.len() as u64)) as usize;
                let want = (self.body_len.min(BODY_HEAD as u64)) as usize;
                if self.body_have < want {
                    let k = (want - self.body_have).min(n);
                    self.body[self.body_have..self.body_have + k].copy_from_slice(&chunk[..k]);
                    self.body_have += k;
                    if self.body_have == want {
                        let (tag, len) = (self.tag, self.body_len);
                        on(Seen::Head {
                            tag,
                            head: &self.body[..want],
                            len,
                        });
                    }
                }
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
                (self.tag, self.body_len, self.body_have) = (tag, self.skip, 0);
                on(Seen::Start(tag));
                if self.skip == 0 {
                    on(Seen::Head {
                        tag,
                        head: &[],
                        len: 0,
                    });
                }
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
    fn heads_come_out_whatever_the_chunking() {
        let mut b = BytesMut::new();
        let mut w = vec![b'w'];
        w.extend_from_slice(&7u64.to_be_bytes());
        w.extend_from_slice(&9u64.to_be_bytes());
        w.extend_from_slice(&[1; 100]);
        encode::copy_data(&mut b, &w);
        encode::copy_data(&mut b, b"k");
        encode::ready_for_query(&mut b);
        let s = b.to_vec();
        for size in [1, 2, 3, 5, 17, 18, s.len()] {
            let mut sc = Scanner::default();
            let mut heads = Vec::new();
            for c in s.chunks(size) {
                sc.feed_seen(c, |s| {
                    if let Seen::Head { tag, head, len } = s {
                        heads.push((tag, head.to_vec(), len))
                    }
                })
                .unwrap();
            }
            assert_eq!(
                heads,
                [
                    (b'd', w[..BODY_HEAD].to_vec(), w.len() as u64),
                    (b'd', b"k".to_vec(), 1),
                    (b'Z', b"I".to_vec(), 1)
                ],
                "chunks of {size}"
            );
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
