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
fn down_frame(st: &mut DownState, items: &[Down<'_>]) -> Vec<u8> {
    let (mut out, mut d) = (Vec::new(), Digest::default());
    for it in items {
        st.put(&mut out, it);
        let raw = match it {
            Down::Wal { payload, .. } => payload,
            _ => &[][..],
        };
        it.digest(&mut d, raw);
    }
    finish(&mut out, &d);
    out
}

/// Parses and verifies a down frame (WAL payloads are the raw bytes); owned copies.
fn restore_down(st: &mut DownState, frame: &[u8]) -> Result<Vec<String>, String> {
    let (items, sum) = st
        .parse(frame, 1 << 20, 1 << 20)
        .map_err(|e| e.to_string())?;
    let mut d = Digest::default();
    for it in &items {
        if let Down::Wal { header, payload } = it {
            if payload.len() != header.raw_len as usize {
                return Err("length".into());
            }
        }
        let raw = match it {
            Down::Wal { payload, .. } => payload,
            _ => &[][..],
        };
        it.digest(&mut d, raw);
    }
    if d.finish() != sum {
        return Err("checksum".into());
    }
    Ok(items.iter().map(|i| format!("{i:?}")).collect())
}

fn up_frame(st: &mut UpState, items: &[Up<'_>]) -> Vec<u8> {
    let (mut out, mut d) = (Vec::new(), Digest::default());
    for it in items {
        st.put(&mut out, it);
        it.digest(&mut d);
    }
    finish(&mut out, &d);
    out
}

fn restore_up(st: &mut UpState, frame: &[u8]) -> Result<Vec<String>, String> {
    let (items, sum) = st.parse(frame, 1000).map_err(|e| e.to_string())?;
    let mut d = Digest::default();
    for it in &items {
        it.digest(&mut d);
    }
    if d.finish() != sum {
        return Err("checksum".into());
    }
    Ok(items.iter().map(|i| format!("{i:?}")).collect())
}

fn wal_item(start: u64, end: u64, send_time: i64, raw: &[u8]) -> Down<'_> {
    Down::Wal {
        header: WalHeader {
            start,
            end,
            send_time,
            raw_len: raw.len() as u32,
        },
        payload: raw,
    }
}

#[test]
fn contiguous_wal_costs_a_few_bytes_of_header() {
    let mut st = DownState::default();
    let raw = vec![7u8; 0x100];
    let f1 = down_frame(
        &mut st,
        &[wal_item(0x3000000, 0x3000100, 800_000_000_000_000, &raw)],
    );
    let f2 = down_frame(
        &mut st,
        &[wal_item(0x3000100, 0x3000200, 800_000_000_010_000, &raw)],
    );
    // item byte, start 0, end 0, time +10 ms (3 bytes), raw_len (2), payload_len (2), checksum 8.
    assert_eq!(f2.len() - raw.len(), 1 + 1 + 1 + 3 + 2 + 2 + 8);
    let mut rx = DownState::default();
    assert!(restore_down(&mut rx, &f1).unwrap()[0].contains("start: 50331648"));
    assert!(restore_down(&mut rx, &f2).unwrap()[0].contains("start: 50331904, end: 50332160"));
}

#[test]
fn every_flipped_bit_is_caught() {
    let raw: Vec<u8> = (0..40).collect();
    let items = [
        wal_item(0x3000000, 0x3000100, 5, &raw),
        Down::Backend {
            chan: 3,
            bytes: b"d\0\0\0\x05k",
        },
        Down::Keepalive {
            end: 0x3000200,
            send_time: 9,
        },
        Down::Timeline {
            tli: 2,
            history: b"1\t0/3000000\tx\n",
        },
        Down::Started {
            chan: 3,
            synchronous: true,
        },
    ];
    let frame = down_frame(&mut DownState::default(), &items);
    assert!(restore_down(&mut DownState::default(), &frame).is_ok());
    for bit in 0..frame.len() * 8 {
        let mut bad = frame.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        assert!(
            restore_down(&mut DownState::default(), &bad).is_err(),
            "bit {bit}"
        );
    }
    let fb = Feedback::new(&status(1, 2, 3, 4, 0)).unwrap();
    let up = up_frame(
        &mut UpState::default(),
        &[
            Up::Feedback { chan: 1, msg: fb },
            Up::Durable { tli: 1, end: 77 },
            Up::Alive,
        ],
    );
    for bit in 0..up.len() * 8 {
        let mut bad = up.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        assert!(
            restore_up(&mut UpState::default(), &bad).is_err(),
            "up bit {bit}"
        );
    }
}

#[test]
fn lengths_and_channels_are_capped_before_use() {
    let mut out = vec![ITEM_WAL, 0, 0, 0];
    put_varint(&mut out, 1 << 40);
    put_varint(&mut out, 0);
    out.extend_from_slice(&[0; 8]);
    assert!(matches!(
        DownState::default().parse(&out, 1 << 20, 1 << 20),
        Err(FrameError::TooLong { .. })
    ));
    let mut out = vec![ITEM_BACKEND, 0];
    put_varint(&mut out, u64::MAX);
    out.extend_from_slice(&[0; 8]);
    assert!(matches!(
        DownState::default().parse(&out, 1 << 20, 1 << 20),
        Err(FrameError::TooLong { .. })
    ));
    let mut out = vec![ITEM_CLOSE];
    put_varint(&mut out, u64::from(MAX_CHANNELS));
    out.extend_from_slice(&[0; 8]);
    assert!(matches!(
        UpState::default().parse(&out, 10),
        Err(FrameError::Channel(_))
    ));
    assert_eq!(
        DownState::default().parse(&[0; 8], 1, 1),
        Err(FrameError::Empty)
    );
    assert!(DownState::default().parse(&[0x7f; 20], 1, 1).is_err());
    // A downstream item in an upstream frame and the other way round.
    assert!(UpState::default()
        .parse(&[ITEM_WAL, 0, 0, 0, 0, 0, 0, 0, 0, 0], 10)
        .is_err());
    assert!(DownState::default()
        .parse(&[ITEM_DURABLE, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0], 10, 10)
        .is_err());
}

/// A down frame of WAL items with these raw lengths and a few bytes of payload each (the
/// parser never looks into payloads: the caller restores them after it).
fn wal_lengths_frame(lens: &[u32]) -> Vec<u8> {
    let (mut st, mut out, mut d) = (DownState::default(), Vec::new(), Digest::default());
    let mut start = 0x3000000;
    for &raw_len in lens {
        let h = WalHeader {
            start,
            end: start + u64::from(raw_len),
            send_time: 5,
            raw_len,
        };
        st.put_wal(&mut out, &h, b"payload");
        d.wal(&h, b"payload");
        start += u64::from(raw_len);
    }
    finish(&mut out, &d);
    out
}

#[test]
fn wal_items_of_a_frame_restore_at_most_twice_max_raw_together() {
    let max_raw = 1000;
    assert_eq!(wal_frame_max(max_raw), 2000);
    // At the bound, in any split, with other items between: parses.
    for lens in [&[1000, 1000][..], &[700, 700, 600], &[1, 999, 0, 1000]] {
        let f = wal_lengths_frame(lens);
        let (items, _) = DownState::default().parse(&f, max_raw, 100).unwrap();
        assert_eq!(items.len(), lens.len());
    }
    let mut f = Vec::new();
    let mut st = DownState::default();
    for it in [
        wal_item(0, 1000, 1, &[7; 1000]),
        Down::Keepalive {
            end: 1000,
            send_time: 2,
        },
        wal_item(1000, 2000, 3, &[8; 1000]),
    ] {
        st.put(&mut f, &it);
    }
    f.extend_from_slice(&[0; 8]);
    assert_eq!(
        DownState::default()
            .parse(&f, max_raw, 1000)
            .unwrap()
            .0
            .len(),
        3
    );
    // One byte past it: refused, naming what and the numbers.
    let f = wal_lengths_frame(&[1000, 1000, 1]);
    let e = DownState::default().parse(&f, max_raw, 100).unwrap_err();
    assert_eq!(
        e,
        FrameError::TotalTooLong {
            what: "WAL items",
            total: 2001,
            max: 2000
        }
    );
    let msg = e.to_string();
    assert!(
        msg.contains("WAL items") && msg.contains("2000") && msg.contains("2001"),
        "{msg}"
    );
    // The per-item cap still comes first.
    assert!(matches!(
        DownState::default().parse(&wal_lengths_frame(&[1001]), max_raw, 100),
        Err(FrameError::TooLong { .. })
    ));
}

#[test]
fn many_compressible_wal_items_are_refused_before_any_is_restored() {
    // The audit's frame: tiny payloads announcing max_raw (4 MiB) each, 64 of them (256 MiB
    // once restored) in under 2 kB. The parse, which the receiver runs before restoring
    // anything, stops at the third item.
    let max_raw = 4 << 20;
    let f = wal_lengths_frame(&[max_raw as u32; 64]);
    assert!(f.len() < 2048, "{} bytes", f.len());
    assert_eq!(
        DownState::default().parse(&f, max_raw, max_raw + (64 << 10)),
        Err(FrameError::TotalTooLong {
            what: "WAL items",
            total: 3 * max_raw as u64,
            max: 2 * max_raw as u64
        })
    );
}

#[test]
fn status_updates_are_small_and_exact_per_channel() {
    let (mut tx, mut rx) = (UpState::default(), UpState::default());
    let msgs = [
        (
            1,
            status(0x3000000, 0x3000000, 0x2000000, 800_000_000_000_000, 0),
        ),
        (
            2,
            status(0x5000000, 0x5000000, 0x5000000, 800_000_000_000_500, 0),
        ),
        (
            1,
            status(0x3000400, 0x3000400, 0x3000000, 800_000_000_001_000, 0),
        ),
        (
            2,
            status(0x5000400, 0x5000400, 0x5000400, 800_000_000_001_500, 1),
        ),
        // Positions going back (a new START_REPLICATION), odd reply byte.
        (1, status(5, u64::MAX, 7, 0, 0xff)),
        (1, hsfeed(800_000_000_003_000, [1, 2, u32::MAX, 0])),
    ];
    let mut sizes = Vec::new();
    for (chan, m) in &msgs {
        let item = Up::Feedback {
            chan: *chan,
            msg: Feedback::new(m).unwrap(),
        };
        let frame = up_frame(&mut tx, std::slice::from_ref(&item));
        sizes.push(frame.len() - 8);
        let (items, _) = rx.parse(&frame, 10).unwrap();
        assert_eq!(items, vec![item]);
    }
    // Each channel's second update: a handful of bytes instead of 34.
    assert!(sizes[2] <= 10 && sizes[3] <= 10, "{sizes:?}");
    // CLOSE forgets the channel on both ends: the next update is against zero again.
    let close = up_frame(&mut tx, &[Up::Close { chan: 2 }]);
    rx.parse(&close, 10).unwrap();
    let again = Up::Feedback {
        chan: 2,
        msg: Feedback::new(&msgs[3].1).unwrap(),
    };
    let f = up_frame(&mut tx, std::slice::from_ref(&again));
    assert_eq!(rx.parse(&f, 10).unwrap().0, vec![again]);
}

#[test]
fn malformed_feedback_is_refused() {
    assert_eq!(Feedback::new(b"r123"), Err(FrameError::BadFeedback('r')));
    assert_eq!(Feedback::new(&[b'h'; 3]), Err(FrameError::BadFeedback('h')));
    assert_eq!(Feedback::new(b""), Err(FrameError::BadFeedback('?')));
    // An xid above u32 is refused when parsed.
    let mut f = vec![ITEM_HSFEED, 0, 0];
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
                              backend in proptest::collection::vec(any::<u8>(), 0..50),
                              chan in 0u32..MAX_CHANNELS, end in any::<u64>(), t in any::<i64>()) {
        let (mut tx, mut rx) = (DownState::default(), DownState::default());
        let mut items: Vec<Down> = runs.iter().map(|(s, e, t, raw)| wal_item(*s, *e, *t, raw)).collect();
        items.push(Down::Backend { chan, bytes: &backend });
        items.push(Down::Keepalive { end, send_time: t });
        items.push(Down::Started { chan, synchronous: end % 2 == 0 });
        items.push(Down::Timeline { tli: chan, history: &backend });
        let want: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
        let f = down_frame(&mut tx, &items);
        prop_assert_eq!(restore_down(&mut rx, &f).unwrap(), want);
        // One frame per item: the state carries over.
        for it in &items {
            let f = down_frame(&mut tx, std::slice::from_ref(it));
            prop_assert_eq!(restore_down(&mut rx, &f).unwrap(), vec![format!("{it:?}")]);
        }
    }

    #[test]
    fn up_frames_round_trip(fields in proptest::collection::vec((0u32..4, any::<[u64; 4]>(), any::<u8>(), any::<bool>(), any::<[u32; 4]>()), 1..8),
                            command in proptest::collection::vec(any::<u8>(), 0..40), end in any::<u64>()) {
        let (mut tx, mut rx) = (UpState::default(), UpState::default());
        let mut items = Vec::new();
        for (chan, [w, f, a, t], reply, hs, x) in fields {
            let m = if hs { hsfeed(t, x) } else { status(w, f, a, t, reply) };
            items.push(Up::Feedback { chan, msg: Feedback::new(&m).unwrap() });
        }
        items.push(Up::Command { chan: 1, bytes: &command });
        items.push(Up::Open { chan: 2, info: &command });
        items.push(Up::Start { chan: 2, cmd: &command });
        items.push(Up::Durable { tli: 3, end });
        items.push(Up::Alive);
        items.push(Up::Close { chan: 1 });
        let f = up_frame(&mut tx, &items);
        let want: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
        prop_assert_eq!(restore_up(&mut rx, &f).unwrap(), want);
    }

    #[test]
    fn garbage_never_panics(frame in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = DownState::default().parse(&frame, 1000, 1000);
        let _ = UpState::default().parse(&frame, 1000);
    }
}

/// A sender and a receiver with the budget of a downstream at the default 4 MiB limit.
fn tunnel_pair(dir: Dir) -> (TunnelTx, TunnelRx) {
    (
        TunnelTx::new(dir, 3, 23).unwrap(),
        TunnelRx::new(dir, tunnel_frame_max(4 << 20)).unwrap(),
    )
}

#[test]
fn tunnel_frames_round_trip_across_frames_with_one_context() {
    let (mut tx, mut rx) = tunnel_pair(Dir::Up);
    tx.open(b"open-info");
    tx.data(b"Q\0\0\0\x0eBASE_BACKUP\0").unwrap();
    let f1 = tx.finish();
    assert_eq!(
        rx.parse(&f1).unwrap(),
        vec![
            TunnelItem::Open(b"open-info".to_vec()),
            TunnelItem::Data(b"Q\0\0\0\x0eBASE_BACKUP\0".to_vec())
        ]
    );
    // Larger than one item, repetitive: split, and the shared context compresses it.
    let big: Vec<u8> = (0..(TUNNEL_DATA_MAX * 2 + 17))
        .map(|i| (i % 251) as u8)
        .collect();
    tx.data(&big).unwrap();
    tx.end("");
    let f2 = tx.finish();
    assert!(f2.len() < big.len() / 10, "{} bytes", f2.len());
    let items = rx.parse(&f2).unwrap();
    let restored: Vec<u8> = items
        .iter()
        .filter_map(|i| match i {
            TunnelItem::Data(d) => Some(d.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(restored, big);
    assert_eq!(items.last(), Some(&TunnelItem::End(String::new())));
    // The same bytes again cost next to nothing: the window spans frames.
    tx.data(&big[..1000]).unwrap();
    let f3 = tx.finish();
    assert!(f3.len() < 100, "{} bytes", f3.len());
    assert_eq!(
        rx.parse(&f3).unwrap(),
        vec![TunnelItem::Data(big[..1000].to_vec())]
    );
}

#[test]
fn tunnel_items_are_refused_in_the_wrong_direction() {
    let (mut tx, _) = tunnel_pair(Dir::Down);
    tx.data(b"Z\0\0\0\x05I").unwrap();
    let f = tx.finish();
    let (_, mut up_rx) = tunnel_pair(Dir::Up);
    assert_eq!(
        up_rx.parse(&f),
        Err(FrameError::UnknownItem(ITEM_TUNNEL_DATA_DOWN))
    );
    let (mut tx, _) = tunnel_pair(Dir::Up);
    tx.open(b"x");
    let (_, mut down_rx) = tunnel_pair(Dir::Down);
    assert_eq!(
        down_rx.parse(&tx.finish()),
        Err(FrameError::UnknownItem(ITEM_TUNNEL_OPEN))
    );
}

#[test]
fn tunnel_frames_with_flipped_bytes_or_lying_lengths_are_refused() {
    let (mut tx, _) = tunnel_pair(Dir::Down);
    tx.data(b"some protocol bytes from the primary").unwrap();
    tx.end("primary closed");
    let f = tx.finish();
    let (_, mut rx) = tunnel_pair(Dir::Down);
    let want = rx.parse(&f).unwrap();
    for i in 0..f.len() {
        let mut g = f.clone();
        g[i] ^= 0x40;
        let (_, mut rx) = tunnel_pair(Dir::Down);
        // Refused, or (a bit of the zstd framing that does not change the content) restored
        // exactly: what a frame restores is what its checksum covers.
        match rx.parse(&g) {
            Err(_) => {}
            Ok(items) => assert_eq!(items, want, "flip at {i} changed the content unnoticed"),
        }
    }
    // Every truncation is refused too.
    for n in 0..f.len() {
        let (_, mut rx) = tunnel_pair(Dir::Down);
        assert!(rx.parse(&f[..n]).is_err(), "truncated to {n}");
    }
    // An announced raw length beyond the cap is refused before anything is decompressed.
    let mut g = vec![ITEM_TUNNEL_DATA_DOWN];
    put_varint(&mut g, TUNNEL_DATA_MAX as u64 + 1);
    put_bytes(&mut g, b"zz");
    g.extend_from_slice(&[0; 8]);
    let (_, mut rx) = tunnel_pair(Dir::Down);
    assert!(matches!(rx.parse(&g), Err(FrameError::TooLong { .. })));
}

proptest! {
    #[test]
    fn tunnel_parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let (_, mut rx) = tunnel_pair(Dir::Up);
        let _ = rx.parse(&bytes);
        let (_, mut rx) = tunnel_pair(Dir::Down);
        let _ = rx.parse(&bytes);
    }
}

#[test]
fn tunnel_data_of_a_frame_is_capped_together() {
    let budget = 3000;
    let tx_rx = |dir| {
        (
            TunnelTx::new(dir, 3, 23).unwrap(),
            TunnelRx::new(dir, budget).unwrap(),
        )
    };
    let (mut tx, mut rx) = tx_rx(Dir::Up);
    // At the budget, in three items: parses.
    tx.open(b"open-info");
    for i in 0..3u8 {
        tx.data(&[i; 1000]).unwrap();
    }
    let items = rx.parse(&tx.finish()).unwrap();
    assert_eq!(items.len(), 4);
    assert_eq!(items[3], TunnelItem::Data(vec![2; 1000]));
    // The budget is per frame: the next frame starts again from zero.
    tx.data(&[9; 3000]).unwrap();
    tx.end("");
    assert_eq!(rx.parse(&tx.finish()).unwrap().len(), 2);
    // One byte past it: refused, before the item that passes it is decompressed (its
    // payload here is not zstd at all, which decompressing would have reported instead).
    let (mut tx, mut rx) = tx_rx(Dir::Down);
    tx.data(&[1; 2000]).unwrap();
    let mut f = tx.finish();
    f.truncate(f.len() - 8);
    f.push(ITEM_TUNNEL_DATA_DOWN);
    put_varint(&mut f, 1001);
    put_bytes(&mut f, b"not zstd");
    f.extend_from_slice(&[0; 8]);
    let e = rx.parse(&f).unwrap_err();
    assert_eq!(
        e,
        FrameError::TotalTooLong {
            what: "tunnel data items",
            total: 3001,
            max: 3000
        }
    );
    let msg = e.to_string();
    assert!(msg.contains("3000") && msg.contains("3001"), "{msg}");
    // The budget can change between frames (the upstream learns the downstream's limit from
    // the OPEN): the same kind of frame within the new one parses.
    let (mut tx, mut rx) = tx_rx(Dir::Up);
    rx.set_max_data(4000);
    tx.data(&[3; 4000]).unwrap();
    assert_eq!(
        rx.parse(&tx.finish()).unwrap(),
        vec![TunnelItem::Data(vec![3; 4000])]
    );
    assert_eq!(tunnel_frame_max(4 << 20), (4 << 20) + TUNNEL_DATA_MAX);
}

#[test]
fn many_compressible_tunnel_items_are_refused_at_the_budget() {
    // The audit's frame: 64 DATA items of 1 MiB of zeros (64 MiB restored) in a few kB. The
    // receiver of a downstream at the default 4 MiB limit restores 5 MiB of it, then refuses
    // the sixth item without decompressing it or anything after.
    let (mut tx, mut rx) = tunnel_pair(Dir::Down);
    let zeros = vec![0u8; TUNNEL_DATA_MAX];
    for _ in 0..64 {
        tx.data(&zeros).unwrap();
    }
    let f = tx.finish();
    assert!(f.len() < 16 << 10, "{} bytes", f.len());
    assert_eq!(
        rx.parse(&f),
        Err(FrameError::TotalTooLong {
            what: "tunnel data items",
            total: 6 * TUNNEL_DATA_MAX as u64,
            max: tunnel_frame_max(4 << 20) as u64
        })
    );
}

#[test]
fn a_frame_of_more_items_than_any_sender_makes_is_refused() {
    // One-byte ALIVE items up, three-byte keepalives down: MAX_FRAME_ITEMS of them parse, one
    // more does not (before the receiver holds ~56 bytes for each).
    let up = |n: usize| {
        let mut out = vec![ITEM_ALIVE; n];
        out.extend_from_slice(&[0; 8]);
        UpState::default()
            .parse(&out, 4096)
            .map(|(items, _)| items.len())
    };
    assert_eq!(up(MAX_FRAME_ITEMS).unwrap(), MAX_FRAME_ITEMS);
    assert!(matches!(
        up(MAX_FRAME_ITEMS + 1),
        Err(FrameError::TooManyItems)
    ));
    let down = |n: usize| {
        let mut out = [ITEM_KEEPALIVE, 0, 0].repeat(n);
        out.extend_from_slice(&[0; 8]);
        DownState::default()
            .parse(&out, 1 << 20, 1 << 20)
            .map(|(items, _)| items.len())
    };
    assert_eq!(down(MAX_FRAME_ITEMS).unwrap(), MAX_FRAME_ITEMS);
    assert!(matches!(
        down(MAX_FRAME_ITEMS + 1),
        Err(FrameError::TooManyItems)
    ));
}
