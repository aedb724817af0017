//! Messages whose last record waits for the next ([`Encoder::encode_held`]): the relay's
//! batches while the primary writes faster than one is sent, each after what the one before
//! held back. Every byte still restores, in order, and the records a message's end would cut
//! are encoded whole in the next message.

use proptest::prelude::*;

use super::tests::{params, synthetic};
use super::*;
use crate::lsn::Lsn;

/// Sends `wal` as the relay does: each message is what the last held back and the next
/// `chunk` bytes; `hold` bytes may be held (none from the last). Checks each message
/// restores its bytes and that they follow on; returns the encoder's counters and payload
/// bytes. `staged`: through [`Encoder::stage_held`] two at a time.
fn relay(start: u64, wal: &[u8], chunk: usize, hold: usize, staged: bool) -> (CodecStats, usize) {
    let p = params(200);
    let mut enc = Encoder::new(&p).unwrap();
    enc.threaded_checks(staged);
    // Each message's offset, length and payload, in order; and those staged, not collected.
    let (mut msgs, mut waiting) = (Vec::new(), std::collections::VecDeque::new());
    let (mut from, mut end) = (0usize, 0usize);
    while from < wal.len() {
        end = (end + chunk).min(wal.len());
        let h = if end == wal.len() { 0 } else { hold };
        let (lsn, msg) = (Lsn(start + from as u64), &wal[from..end]);
        let mut out = Vec::new();
        let n = match staged {
            true => enc.stage_held(lsn, msg, h).unwrap(),
            false => enc.encode_held(lsn, msg, h, &mut out).unwrap(),
        };
        assert!(
            n > 0 && n <= msg.len() && n + h >= msg.len(),
            "{n} of {}",
            msg.len()
        );
        waiting.push_back((from, n));
        if !staged || waiting.len() == 2 {
            let (at, n) = waiting.pop_front().unwrap();
            if staged {
                assert!(enc.collect(&mut out).unwrap());
            }
            msgs.push((at, n, out));
        }
        from += n;
    }
    for (at, n) in waiting {
        let mut out = Vec::new();
        assert!(enc.collect(&mut out).unwrap());
        msgs.push((at, n, out));
    }
    let mut dec = Decoder::new(&p).unwrap();
    let (mut restored, mut sent, mut total) = (Vec::new(), Vec::new(), 0);
    for (at, n, payload) in &msgs {
        let lsn = Lsn(start + *at as u64);
        dec.decode(lsn, payload, *n, &mut restored).unwrap();
        assert!(
            restored == wal[*at..*at + *n],
            "message at {lsn} restored differently"
        );
        sent.extend_from_slice(&restored);
        total += payload.len();
    }
    assert!(sent == wal, "the messages together differ from the WAL");
    (enc.stats().clone(), total)
}

#[test]
fn a_record_the_end_would_cut_goes_whole_in_the_next_message() {
    let g = synthetic(11, 700_000, 40);
    for staged in [false, true] {
        let (cut, cut_bytes) = relay(g.start, &g.buf, 20_000, 0, staged);
        let (held, held_bytes) = relay(g.start, &g.buf, 20_000, 16 * 1024, staged);
        assert!(cut.records_split > 20, "{cut:?}");
        assert_eq!(cut.records_held, 0);
        // Every record is smaller than the hold: none is cut, none passes raw.
        assert_eq!(held.records_split, 0, "{held:?}");
        assert!(held.records_held >= cut.records_split / 2, "{held:?}");
        assert_eq!(held.records as usize, g.records, "{held:?}");
        assert!(held.raw_in < cut.raw_in, "{held:?}");
        assert!(
            held_bytes < cut_bytes,
            "{held_bytes} ≥ {cut_bytes} without holding"
        );
        assert_eq!(held.resyncs, 0);
    }
}

#[test]
fn staged_and_encoded_messages_hold_the_same_bytes() {
    let g = synthetic(12, 400_000, 40);
    let (one, one_bytes) = relay(g.start, &g.buf, 30_000, 8192, false);
    let (two, two_bytes) = relay(g.start, &g.buf, 30_000, 8192, true);
    assert_eq!(one_bytes, two_bytes);
    assert_eq!(format!("{one:?}"), format!("{two:?}"));
}

#[test]
fn nothing_is_held_from_a_message_that_is_one_cut_record() {
    let g = synthetic(13, 200_000, 40);
    let mut enc = Encoder::new(&params(50)).unwrap();
    let mut out = Vec::new();
    // The segment's long page header, then the first record's start: that much is sent.
    let n = enc
        .encode_held(Lsn(g.start), &g.buf[..100], 100, &mut out)
        .unwrap();
    assert_eq!(n, 40, "the long page header alone");
    assert_eq!(enc.stats().records_held, 1);
    // A message that starts with the record and ends in it: nothing before it to send, so
    // all of it goes (an empty message would not move the stream on).
    let n = enc
        .encode_held(Lsn(g.start + 40), &g.buf[40..100], 60, &mut out)
        .unwrap();
    assert_eq!(n, 60);
    assert_eq!(enc.stats().records_split, 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn any_chunks_and_holds_restore_the_wal(
        seed in 0u64..1000,
        chunk in 300usize..40_000,
        hold in 0usize..20_000,
    ) {
        let g = synthetic(seed, 120_000, 20);
        relay(g.start, &g.buf, chunk, hold, false);
    }
}
