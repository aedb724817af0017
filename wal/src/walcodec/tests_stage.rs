//! The encoder in two halves ([`Encoder::stage`], [`Encoder::collect`]): a message's streams
//! compressed on the section thread while the next one is transformed give the bytes and the
//! counters of [`Encoder::encode`].

use super::tests::{every, params, synthetic};
use super::*;
use crate::lsn::Lsn;

/// Messages of `wal` cut at `cuts`, the third starting 8 kB further on than the second ended
/// (a resync while the second is being compressed).
fn messages<'a>(start: u64, wal: &'a [u8], cuts: &[usize]) -> Vec<(Lsn, &'a [u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    for (i, end) in cuts.iter().copied().chain([wal.len()]).enumerate() {
        let from = if i == 2 { (at + 8192).min(end) } else { at };
        out.push((Lsn(start + from as u64), &wal[from..end]));
        at = end;
    }
    out
}

/// `got` (the staged path's payloads) are `want` (those of `encode`), message by message.
pub(super) fn assert_same_payloads(got: &[Vec<u8>], want: &[Vec<u8>]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g == w,
            "message {i}: {} bytes, encode gave {}",
            g.len(),
            w.len()
        );
    }
}

#[test]
fn staged_one_ahead_gives_the_bytes_and_counters_of_encode() {
    let g = synthetic(7, 1_500_000, 40);
    let msgs = messages(g.start, &g.buf, &every(96 * 1024, g.buf.len()));
    let p = params(200);

    let mut one = Encoder::new(&p).unwrap();
    let mut want = Vec::new();
    for (lsn, m) in &msgs {
        let mut out = Vec::new();
        one.encode(*lsn, m, &mut out).unwrap();
        want.push(out);
    }

    // Threads allowed: large messages go to the section thread; the synthetic WAL has no
    // image the primary compressed, so the image checks take no other path.
    let mut two = Encoder::new(&p).unwrap();
    two.threaded_checks(true);
    let mut got = Vec::new();
    let mut out = Vec::new();
    for (lsn, m) in &msgs {
        two.stage(*lsn, m).unwrap();
        if two.staged() == 2 {
            assert!(two.collect(&mut out).unwrap());
            got.push(out.clone());
        }
    }
    while two.collect(&mut out).unwrap() {
        got.push(out.clone());
    }
    assert_same_payloads(&got, &want);
    assert_eq!(format!("{:?}", two.stats()), format!("{:?}", one.stats()));
    assert_eq!(two.stats().resyncs, 1);

    let mut dec = Decoder::new(&p).unwrap();
    let mut restored = Vec::new();
    for ((lsn, m), payload) in msgs.iter().zip(&got) {
        dec.decode(*lsn, payload, m.len(), &mut restored).unwrap();
        assert!(restored == *m, "message at {lsn} restored differently");
    }
}

#[test]
fn staging_is_bounded_and_encode_waits_for_collect() {
    let n = STAGED_MAX + 1;
    let g = synthetic(8, 100_000 * n, 20);
    let cut = g.buf.len() / n;
    let p = params(50);
    let mut enc = Encoder::new(&p).unwrap();
    enc.threaded_checks(true);
    let at = |i: usize| Lsn(g.start + (i * cut) as u64);
    let part = |i: usize| &g.buf[i * cut..(i + 1) * cut];
    for i in 0..STAGED_MAX {
        enc.stage(at(i), part(i)).unwrap();
    }
    let last = STAGED_MAX;
    let refused = enc.stage(at(last), part(last)).unwrap_err();
    assert!(refused.to_string().contains("collect one"), "{refused}");
    let mut out = Vec::new();
    let refused = enc.encode(at(last), part(last), &mut out).unwrap_err();
    assert!(refused.to_string().contains("collect them"), "{refused}");

    // Neither refusal cost the session anything.
    let mut dec = Decoder::new(&p).unwrap();
    let mut restored = Vec::new();
    for i in 0..n {
        if i == last {
            enc.encode(at(last), part(last), &mut out).unwrap();
        } else {
            assert!(enc.collect(&mut out).unwrap());
        }
        dec.decode(at(i), &out, cut, &mut restored).unwrap();
        assert!(restored == part(i), "message {i} restored differently");
    }
    assert!(!enc.collect(&mut out).unwrap());
    assert!(out.is_empty());
    assert_eq!(enc.stats().messages, n as u64);
}

#[test]
fn payloads_staged_ahead_restore_and_out_of_order_is_refused() {
    let g = synthetic(9, 1_200_000, 40);
    let msgs = messages(g.start, &g.buf, &every(80 * 1024, g.buf.len()));
    let p = params(200);
    let mut enc = Encoder::new(&p).unwrap();
    let payloads: Vec<Vec<u8>> = msgs
        .iter()
        .map(|(lsn, m)| {
            let mut out = Vec::new();
            enc.encode(*lsn, m, &mut out).unwrap();
            out
        })
        .collect();

    // Each payload staged while the one before is restored: its sections decompress on the
    // thread meanwhile.
    let mut dec = Decoder::new(&p).unwrap();
    dec.threaded_restores(true);
    let mut restored = Vec::new();
    dec.stage(msgs[0].0, &payloads[0], msgs[0].1.len()).unwrap();
    for (i, ((lsn, m), payload)) in msgs.iter().zip(&payloads).enumerate() {
        if let Some(((next, n), pl)) = msgs.get(i + 1).zip(payloads.get(i + 1)) {
            dec.stage(*next, pl, n.len()).unwrap();
        }
        assert_eq!(dec.staged(), if i + 1 < msgs.len() { 2 } else { 1 });
        dec.decode(*lsn, payload, m.len(), &mut restored).unwrap();
        assert!(restored == *m, "message {i} at {lsn} restored differently");
    }
    assert_eq!(dec.staged(), 0);

    // Decoding another message than the one staged first is refused.
    let mut dec = Decoder::new(&p).unwrap();
    dec.threaded_restores(true);
    dec.decode(msgs[0].0, &payloads[0], msgs[0].1.len(), &mut restored)
        .unwrap();
    dec.stage(msgs[2].0, &payloads[2], msgs[2].1.len()).unwrap();
    let err = dec
        .decode(msgs[1].0, &payloads[1], msgs[1].1.len(), &mut restored)
        .unwrap_err();
    assert!(err.to_string().contains("order they were staged"), "{err}");
}
