//! Where a replay keeps what a codec produced until the decoding pass reads it back.
//!
//! A relay sends each frame and reuses its memory for the next, so it does not pay the kernel
//! for fresh pages per frame. A replay that kept each payload in an allocation of its own
//! would: every payload lands in memory never touched before, which the kernel zeroes first
//! (~3 s per GiB on this repository's VM). On 320 MB of recorded bulk-load WAL those copies
//! took 10 % of the encoding pass's samples (`perf record --call-graph dwarf` of
//! `codec_profile`), a cost of the harness that fell on each codec in proportion to its
//! output. So the payloads go one after another into one buffer whose memory is written
//! before the timer starts.

/// Payloads in order, in one buffer.
pub struct Payloads {
    bytes: Vec<u8>,
    /// Where each payload ends in `bytes`.
    ends: Vec<usize>,
}

impl Payloads {
    /// Room for the payloads of `input` bytes, with its memory touched now: `input` and a
    /// sixteenth (a codec that cannot shrink the bytes adds its framing) and `slack`. More
    /// than that still works; the excess then lands in fresh memory again.
    pub fn with_room(input: usize, slack: usize) -> Payloads {
        let room = input.saturating_add(input / 16).saturating_add(slack);
        let mut bytes = Vec::with_capacity(room);
        // Written, not only reserved: the allocator hands out pages the kernel has yet to
        // supply, and a zeroed allocation can skip the writes that would fault them in.
        bytes.resize(room, 0xA5);
        bytes.clear();
        Payloads {
            bytes,
            ends: Vec::new(),
        }
    }

    /// Appends one payload.
    pub fn push(&mut self, payload: &[u8]) {
        self.bytes.extend_from_slice(payload);
        self.ends.push(self.bytes.len());
    }

    /// How many payloads there are.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Payload `i`.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)?;
        let start = i.checked_sub(1).map_or(0, |j| self.ends[j]);
        Some(&self.bytes[start..end])
    }

    /// The payloads in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// Their bytes together.
    pub fn total(&self) -> usize {
        self.bytes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::Payloads;

    #[test]
    fn payloads_come_back_in_order_past_the_room() {
        let mut p = Payloads::with_room(16, 0);
        let items: Vec<Vec<u8>> = (0u8..20).map(|i| vec![i; usize::from(i) % 7]).collect();
        for it in &items {
            p.push(it);
        }
        assert_eq!(p.len(), items.len());
        assert!(p.iter().eq(items.iter().map(Vec::as_slice)));
        assert_eq!(p.total(), items.iter().map(Vec::len).sum::<usize>());
        assert_eq!(p.get(items.len()), None);
        assert!(Payloads::with_room(0, 0).is_empty());
    }
}
