use super::*;
use proptest::prelude::*;

fn status(w: u64, f: u64, a: u64, t: u64, reply: u8) -> Vec<u8> {
    let mut b = vec![b'r'];
    for v in [w, f, a, t] {
        b.extend_from_slice(&v.to_be_bytes());
    }
    b.push(reply);
    b
}

fn hsfeed(t: u64, x: [u32; 4]) -> Vec<u8> {
    let mut b = vec![b'h'];
    b.extend_from_slice(&t.to_be_bytes());
    for v in x {
        b.extend_from_slice(&v.to_be_bytes());
    }
    b
}

/// Builds a down frame whose WAL "payload" is the raw bytes (the `none` codec).
fn down_frame(st: &mut DownState, items: &[(WalHeader, Vec<u8>)], backend: &[u8]) -> Vec<u8> {
    let (mut out, mut d) = (Vec::new(), Digest::default());
    for (h, raw) in items {
        st.put_wal(&mut out, h, raw);
        d.wal(h, raw);
    }
    if !backend.is_empty() {
        put_backend(&mut out, backend);
        d.backend(backend);
    }
    finish(&mut out, &d);
    out
}

/// Parses and restores a down frame; Err if it does not parse or verify.
fn restore_down(st: &mut DownState, frame: &[u8]) -> Result<Vec<DownItem<'static>>, String> {
    let (items, sum) = st
        .parse(frame, 1 << 20, 1 << 20)
        .map_err(|e| e.to_string())?;
    let mut d = Digest::default();
    let mut owned = Vec::new();
    for it in items {
        match it {
            DownItem::Wal { header, payload } => {
                if payload.len() != header.raw_len as usize {
                    return Err("length".into());
                }
                d.wal(&header, payload);
                owned.push(DownItem::Wal {
                    header,
                    payload: Box::leak(payload.to_vec().into_boxed_slice()),
                });
            }
            DownItem::Backend(b) => {
                d.backend(b);
                owned.push(DownItem::Backend(Box::leak(b.to_vec().into_boxed_slice())));
            }
        }
    }
    if d.finish() != sum {
        return Err("checksum".into());
    }
    Ok(owned)
}

#[test]
fn contiguous_wal_costs_a_few_bytes_of_header() {
    let mut st = DownState::default();
    let h1 = WalHeader {
        start: 0x3000000,
        end: 0x3000100,
        send_time: 800_000_000_000_000,
        raw_len: 0x100,
    };
    let h2 = WalHeader {
        start: 0x3000100,
        end: 0x3000200,
        send_time: 800_000_000_010_000,
        raw_len: 0x100,
    };
    let raw = vec![7u8; 0x100];
    let f1 = down_frame(&mut st, &[(h1, raw.clone())], b"");
    let f2 = down_frame(&mut st, &[(h2, raw.clone())], b"");
    // item byte, start 0, end 0, time +10 ms (3 bytes), raw_len (2), payload_len (2), checksum 8.
    assert_eq!(f2.len() - raw.len(), 1 + 1 + 1 + 3 + 2 + 2 + 8);
    assert!(f1.len() > f2.len());
    let mut rx = DownState::default();
    for (f, h) in [(f1, h1), (f2, h2)] {
        match restore_down(&mut rx, &f).unwrap().as_slice() {
            [DownItem::Wal { header, .. }] => assert_eq!(*header, h),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn every_flipped_bit_is_caught() {
    let mut st = DownState::default();
    let h = WalHeader {
        start: 0x3000000,
        end: 0x3000100,
        send_time: 5,
        raw_len: 40,
    };
    let frame = down_frame(&mut st, &[(h, (0..40).collect())], b"d\0\0\0\x05k");
    for bit in 0..frame.len() * 8 {
        let mut bad = frame.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        assert!(
            restore_down(&mut DownState::default(), &bad).is_err(),
            "bit {bit}"
        );
    }
    assert!(restore_down(&mut DownState::default(), &frame).is_ok());
}

#[test]
fn lengths_are_capped_before_use() {
    let mut out = vec![ITEM_WAL, 0, 0, 0];
    put_varint(&mut out, 1 << 40);
    put_varint(&mut out, 0);
    out.extend_from_slice(&[0; 8]);
    assert!(matches!(
        DownState::default().parse(&out, 1 << 20, 1 << 20),
        Err(FrameError::TooLong { .. })
    ));
    let mut out = vec![ITEM_BACKEND];
    put_varint(&mut out, u64::MAX);
    out.extend_from_slice(&[0; 8]);
    assert!(matches!(
        DownState::default().parse(&out, 1 << 20, 1 << 20),
        Err(FrameError::TooLong { .. })
    ));
    assert_eq!(
        DownState::default().parse(&[0; 8], 1, 1),
        Err(FrameError::Empty)
    );
    assert!(DownState::default().parse(&[0x7f; 20], 1, 1).is_err());
    assert!(UpState::default()
        .parse(&[ITEM_WAL, 0, 0, 0, 0, 0, 0, 0, 0, 0], 10)
        .is_err());
}

#[test]
fn status_updates_are_small_and_exact() {
    let (mut tx, mut rx) = (UpState::default(), UpState::default());
    let msgs = [
        status(0x3000000, 0x3000000, 0x2000000, 800_000_000_000_000, 0),
        status(0x3000400, 0x3000400, 0x3000000, 800_000_000_001_000, 0),
        status(0x3000400, 0x3000400, 0x3000400, 800_000_000_002_000, 1),
        // Positions going back (a new START_REPLICATION), odd reply byte.
        status(5, u64::MAX, 7, 0, 0xff),
        hsfeed(800_000_000_003_000, [1, 2, u32::MAX, 0]),
    ];
    let mut sizes = Vec::new();
    for m in &msgs {
        let (mut out, mut d) = (Vec::new(), Digest::default());
        tx.put_feedback(&mut out, m).unwrap();
        d.up(&UpItem::Feedback(pad(m), m.len()));
        finish(&mut out, &d);
        sizes.push(out.len() - 8);
        let (items, sum) = rx.parse(&out, 10).unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].feedback().unwrap(), &m[..]);
        let mut check = Digest::default();
        check.up(&items[0]);
        assert_eq!(check.finish(), sum);
    }
    // The second and third status updates: a handful of bytes instead of 34.
    assert!(sizes[1] <= 10 && sizes[2] <= 10, "{sizes:?}");
}

fn pad(m: &[u8]) -> [u8; STATUS_LEN] {
    let mut b = [0u8; STATUS_LEN];
    b[..m.len()].copy_from_slice(m);
    b
}

#[test]
fn malformed_feedback_is_refused() {
    let mut st = UpState::default();
    let mut out = Vec::new();
    assert_eq!(
        st.put_feedback(&mut out, b"r123"),
        Err(FrameError::BadFeedback('r'))
    );
    assert_eq!(
        st.put_feedback(&mut out, &[b'h'; 3]),
        Err(FrameError::BadFeedback('h'))
    );
    assert_eq!(
        st.put_feedback(&mut out, b""),
        Err(FrameError::BadFeedback('?'))
    );
    // An xid above u32 is refused when parsed.
    let mut f = vec![ITEM_HSFEED, 0];
    put_varint(&mut f, 1 << 33);
    f.extend_from_slice(&[0, 0, 0]);
    f.extend_from_slice(&[0; 8]);
    assert!(matches!(
        UpState::default().parse(&f, 10),
        Err(FrameError::TooLong { .. })
    ));
}

proptest! {
    #[test]
    fn down_frames_round_trip(runs in proptest::collection::vec((any::<u64>(), any::<u64>(), any::<i64>(), proptest::collection::vec(any::<u8>(), 0..300)), 1..6),
                              backend in proptest::collection::vec(any::<u8>(), 0..50)) {
        let (mut tx, mut rx) = (DownState::default(), DownState::default());
        let items: Vec<(WalHeader, Vec<u8>)> = runs.into_iter().map(|(s, e, t, raw)| (WalHeader { start: s, end: e, send_time: t, raw_len: raw.len() as u32 }, raw)).collect();
        // One frame with all runs, then one frame per run: the state carries over.
        let f = down_frame(&mut tx, &items, &backend);
        let got = restore_down(&mut rx, &f).unwrap();
        prop_assert_eq!(got.len(), items.len() + usize::from(!backend.is_empty()));
        for (g, (h, raw)) in got.iter().zip(&items) {
            prop_assert_eq!(g, &DownItem::Wal { header: *h, payload: raw.as_slice() });
        }
        for (h, raw) in &items {
            let f = down_frame(&mut tx, &[(*h, raw.clone())], b"");
            let got = restore_down(&mut rx, &f).unwrap();
            prop_assert_eq!(&got[0], &DownItem::Wal { header: *h, payload: raw.as_slice() });
        }
    }

    #[test]
    fn up_frames_round_trip(fields in proptest::collection::vec((any::<[u64; 4]>(), any::<u8>(), any::<bool>(), any::<[u32; 4]>()), 1..8),
                            command in proptest::collection::vec(any::<u8>(), 0..40)) {
        let (mut tx, mut rx) = (UpState::default(), UpState::default());
        let (mut out, mut d) = (Vec::new(), Digest::default());
        let mut sent = Vec::new();
        for ([w, f, a, t], reply, hs, x) in fields {
            let m = if hs { hsfeed(t, x) } else { status(w, f, a, t, reply) };
            tx.put_feedback(&mut out, &m).unwrap();
            d.up(&UpItem::Feedback(pad(&m), m.len()));
            sent.push(m);
        }
        put_command(&mut out, &command);
        d.up(&UpItem::Command(&command));
        put_copy_done(&mut out);
        d.up(&UpItem::CopyDone);
        finish(&mut out, &d);
        let (items, sum) = rx.parse(&out, 1000).unwrap();
        let mut check = Digest::default();
        for (i, it) in items.iter().enumerate() {
            check.up(it);
            if i < sent.len() {
                prop_assert_eq!(it.feedback().unwrap(), sent[i].as_slice());
            }
        }
        prop_assert_eq!(&items[sent.len()], &UpItem::Command(&command));
        prop_assert_eq!(&items[sent.len() + 1], &UpItem::CopyDone);
        prop_assert_eq!(check.finish(), sum);
    }

    #[test]
    fn garbage_never_panics(frame in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = DownState::default().parse(&frame, 1000, 1000);
        let _ = UpState::default().parse(&frame, 1000);
    }
}
