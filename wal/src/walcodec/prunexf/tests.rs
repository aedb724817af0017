//! The prune prediction on pages built here, as `heap_page_prune` would log their prunes.

use super::*;

/// One line pointer of a test page.
#[derive(Clone, Copy)]
enum Item {
    /// A tuple: xmin, xmax, infomask, infomask2, t_ctid's offset.
    Tuple(u32, u32, u16, u16, u16),
    Redirect(u16),
}

const LIVE: u16 = HEAP_XMAX_INVALID;

/// A live tuple, inserted by 100.
fn live() -> Item {
    Item::Tuple(100, 0, LIVE, 0, 0)
}

/// A heap page with `items` at offsets 1, 2, …: tuples of 32 bytes from the end.
fn page(items: &[Item]) -> Box<[u8; PAGE_SIZE]> {
    let mut p = Box::new([0u8; PAGE_SIZE]);
    let mut upper = PAGE_SIZE;
    for (i, item) in items.iter().enumerate() {
        let lp = match *item {
            Item::Tuple(xmin, xmax, infomask, infomask2, ctid) => {
                upper -= 32;
                let t = &mut p[upper..upper + 32];
                t[0..4].copy_from_slice(&xmin.to_le_bytes());
                t[4..8].copy_from_slice(&xmax.to_le_bytes());
                t[16..18].copy_from_slice(&ctid.to_le_bytes());
                t[18..20].copy_from_slice(&infomask2.to_le_bytes());
                t[20..22].copy_from_slice(&infomask.to_le_bytes());
                t[22] = 24;
                (upper as u32) | (LP_NORMAL << 15) | (32 << 17)
            }
            Item::Redirect(to) => u32::from(to) | (LP_REDIRECT << 15),
        };
        p[24 + 4 * i..28 + 4 * i].copy_from_slice(&lp.to_le_bytes());
    }
    p[12..14].copy_from_slice(&((24 + 4 * items.len()) as u16).to_le_bytes());
    p[14..16].copy_from_slice(&(upper as u16).to_le_bytes());
    p[16..18].copy_from_slice(&(PAGE_SIZE as u16).to_le_bytes());
    p[18..20].copy_from_slice(&(PAGE_SIZE as u16 | 4).to_le_bytes());
    p
}

type Lists = (u32, Vec<u16>, Vec<u16>, Vec<u16>);

fn u16s(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

/// The prediction of 14–16: (horizon, redirected pairs, dead, unused), read from its bytes.
fn predicted(p: &[u8; PAGE_SIZE], touched: Option<&[u16]>) -> Lists {
    let mut out = Prediction::default();
    assert!(predict(p, touched, Layout::V14, &mut out));
    assert_eq!(out.main_len, 8);
    let nred = usize::from(u16::from_le_bytes([out.main[4], out.main[5]]));
    let ndead = usize::from(u16::from_le_bytes([out.main[6], out.main[7]]));
    let o = u16s(&out.data);
    (
        u32::from_le_bytes([out.main[0], out.main[1], out.main[2], out.main[3]]),
        o[..2 * nred].to_vec(),
        o[2 * nred..2 * nred + ndead].to_vec(),
        o[2 * nred + ndead..].to_vec(),
    )
}

/// The prediction of 17–18 read from its bytes as `heap_xlog_prune_freeze` reads a record
/// (reason, flags, the horizon when flagged; each flagged array's count and offsets), with
/// its flags.
fn predicted17(p: &[u8; PAGE_SIZE], touched: Option<&[u16]>) -> (u8, Lists) {
    let mut out = Prediction::default();
    assert!(predict(p, touched, Layout::V17, &mut out));
    let flags = out.main[1];
    assert_eq!(out.main[0], 0, "PRUNE_ON_ACCESS");
    assert_eq!(flags & XLHP_CLEANUP_LOCK, XLHP_CLEANUP_LOCK);
    let with_horizon = flags & XLHP_HAS_CONFLICT_HORIZON != 0;
    assert_eq!(out.main_len, if with_horizon { 6 } else { 2 });
    assert!(out.main[out.main_len..].iter().all(|&b| b == 0));
    let horizon = u32::from_le_bytes([out.main[2], out.main[3], out.main[4], out.main[5]]);
    let mut at = 0;
    let mut lists: [Vec<u16>; 3] = Default::default();
    for ((bit, per), list) in [
        (XLHP_HAS_REDIRECTIONS, 2),
        (XLHP_HAS_DEAD_ITEMS, 1),
        (XLHP_HAS_NOW_UNUSED_ITEMS, 1),
    ]
    .into_iter()
    .zip(lists.iter_mut())
    {
        if flags & bit != 0 {
            let n = usize::from(u16::from_le_bytes([out.data[at], out.data[at + 1]]));
            assert!(n > 0, "an array flagged is not empty");
            *list = u16s(&out.data[at + 2..at + 2 + 2 * per * n]);
            at += 2 + 2 * per * n;
        }
    }
    assert_eq!(at, out.data.len());
    let [red, dead, unused] = lists;
    (flags, (horizon, red, dead, unused))
}

/// A root HOT-updated by 200 to a live heap-only version: redirected to it, the horizon the
/// updater; the live tuple beside it untouched.
#[test]
fn a_hot_chain_is_redirected_to_its_live_version() {
    let p = page(&[
        live(),
        Item::Tuple(100, 200, 0, HEAP_HOT_UPDATED, 3),
        Item::Tuple(200, 0, LIVE, HEAP_ONLY_TUPLE, 3),
    ]);
    assert_eq!(predicted(&p, None), (200, vec![2, 3], vec![], vec![]));
}

/// A redirect whose first member was HOT-updated again (by 300): that member freed, the
/// redirect moved on to the live one.
#[test]
fn a_redirected_chain_frees_its_dead_members() {
    let p = page(&[
        Item::Redirect(2),
        Item::Tuple(200, 300, 0, HEAP_ONLY_TUPLE | HEAP_HOT_UPDATED, 3),
        Item::Tuple(300, 0, LIVE, HEAP_ONLY_TUPLE, 3),
    ]);
    assert_eq!(predicted(&p, None), (300, vec![1, 3], vec![], vec![2]));
}

/// A deleted row's line pointer dies; a locked one, one whose xmax is a multixact and one
/// whose deleter aborted stay; the horizon is the latest deleter.
#[test]
fn deleted_rows_die_and_locked_rows_stay() {
    let p = page(&[
        Item::Tuple(100, 150, 0, 0, 1),
        Item::Tuple(100, 170, HEAP_XMAX_LOCK_ONLY, 0, 2),
        Item::Tuple(100, 171, HEAP_XMAX_IS_MULTI, 0, 3),
        Item::Tuple(100, 172, HEAP_XMAX_INVALID, 0, 4),
        Item::Tuple(100, 160, 0, 0, 5),
    ]);
    assert_eq!(predicted(&p, None), (160, vec![], vec![1, 5], vec![]));
}

/// A chain ends where the next tuple was not inserted by the updater (t_ctid points at a
/// line pointer reused since): the root dies alone, the other tuple stays.
#[test]
fn a_chain_ends_where_xmin_does_not_follow() {
    let p = page(&[
        Item::Tuple(100, 200, 0, HEAP_HOT_UPDATED, 2),
        Item::Tuple(999, 0, LIVE, HEAP_ONLY_TUPLE, 2),
    ]);
    assert_eq!(predicted(&p, None), (200, vec![], vec![1], vec![]));
}

/// Given the line pointers touched since the last prune, only their chains are looked at:
/// a row deleted before (left by the last prune, its deleter too recent then) is not.
#[test]
fn touched_line_pointers_limit_the_chains_looked_at() {
    let p = page(&[
        Item::Redirect(2),
        Item::Tuple(200, 300, 0, HEAP_ONLY_TUPLE | HEAP_HOT_UPDATED, 3),
        Item::Tuple(300, 0, LIVE, HEAP_ONLY_TUPLE, 3),
        Item::Tuple(100, 150, 0, 0, 4),
        live(),
    ]);
    assert_eq!(predicted(&p, None), (300, vec![1, 3], vec![4], vec![2]));
    assert_eq!(
        predicted(&p, Some(&[2])),
        (300, vec![1, 3], vec![], vec![2])
    );
    assert_eq!(
        predicted(&p, Some(&[4, 2])),
        (300, vec![1, 3], vec![4], vec![2])
    );
    assert_eq!(predicted(&p, Some(&[])), (0, vec![], vec![], vec![]));
}

/// A page that claims more line pointers than a heap page holds gets no prediction.
#[test]
fn no_prediction_for_what_is_not_a_heap_page() {
    let mut p = page(&[live()]);
    p[12..14].copy_from_slice(&(24u16 + 4 * 300).to_le_bytes());
    assert!(!predict(&p, None, Layout::V14, &mut Prediction::default()));
    let mut zero = Box::new([0u8; PAGE_SIZE]);
    assert!(!predict(
        &zero,
        None,
        Layout::V14,
        &mut Prediction::default()
    ));
    zero[0] = 1;
    assert!(!predict(
        &zero,
        Some(&[1]),
        Layout::V14,
        &mut Prediction::default()
    ));
}

/// The record's bytes XOR the prediction's: zeros where it holds, the same bytes again after
/// a second XOR; main data shorter than 8 bytes and an odd data byte are left as they are.
#[test]
fn a_prune_goes_as_its_difference_and_comes_back() {
    let p = page(&[
        Item::Redirect(2),
        Item::Tuple(200, 300, 0, HEAP_ONLY_TUPLE | HEAP_HOT_UPDATED, 3),
        Item::Tuple(300, 0, LIVE, HEAP_ONLY_TUPLE, 3),
    ]);
    let mut pred = Prediction::default();
    assert!(predict(&p, None, Layout::V14, &mut pred));
    let mut main = [44, 1, 0, 0, 1, 0, 0, 0];
    let mut data = [1u8, 0, 3, 0, 2, 0];
    apply_main(&mut main, &pred);
    apply_data(&mut data, &pred);
    assert_eq!((main, data), ([0; 8], [0; 6]));
    apply_main(&mut main, &pred);
    apply_data(&mut data, &pred);
    assert_eq!(
        (main, data),
        ([44, 1, 0, 0, 1, 0, 0, 0], [1, 0, 3, 0, 2, 0])
    );
    // Another prune than predicted: not zeros, and back again.
    let mut data = [1u8, 0, 4, 0, 2, 0, 9, 0, 7];
    apply_data(&mut data, &pred);
    assert_eq!(data, [0, 0, 7, 0, 0, 0, 9, 0, 7]);
    apply_data(&mut data, &pred);
    assert_eq!(data, [1, 0, 4, 0, 2, 0, 9, 0, 7]);
    let mut short = [44, 1, 0];
    apply_main(&mut short, &pred);
    assert_eq!(short, [0, 0, 0]);
}

/// Prunes on access are predicted (14–16: PRUNE, 17–18: PRUNE_ON_ACCESS, the same info);
/// VACUUM's prunes of 17–18, 14–16's VACUUM and other resource managers are not. Candidates
/// start again at every record that prunes the page.
#[test]
fn prunes_on_access_are_predicted() {
    for (major, rmid, info, want) in [
        (PgMajor::V14, RM_HEAP2_ID, 0x10, true),
        (PgMajor::V16, RM_HEAP2_ID, 0x90, true),
        (PgMajor::V17, RM_HEAP2_ID, 0x10, true),
        (PgMajor::V18, RM_HEAP2_ID, 0x10, true),
        (PgMajor::V17, RM_HEAP2_ID, 0x20, false),
        (PgMajor::V18, RM_HEAP2_ID, 0x30, false),
        (PgMajor::V15, RM_HEAP2_ID, 0x20, false),
        (PgMajor::V15, 10, 0x10, false),
    ] {
        assert_eq!(
            applies(Some(major), rmid, info),
            want,
            "{major:?} {rmid} {info:#x}"
        );
    }
    assert!(!applies(None, RM_HEAP2_ID, 0x10));
    for (major, op, want) in [
        (PgMajor::V15, 0x10, true),
        (PgMajor::V16, 0x20, false),
        (PgMajor::V17, 0x10, true),
        (PgMajor::V17, 0x20, true),
        (PgMajor::V18, 0x30, true),
        (PgMajor::V18, 0x40, false),
    ] {
        assert_eq!(prunes_page(Some(major), op), want, "{major:?} {op:#x}");
    }
    assert!(!prunes_page(None, 0x10));
}

/// 17–18 log the same chains with counts and flags: a redirect, a dead root and freed
/// members, the horizon flagged; a dead heap-only tuple no chain reaches comes after every
/// chain's members in the unused array, where 14–16 have it in line pointer order.
#[test]
fn prunes_of_17_have_counts_flags_and_orphans_last() {
    let p = page(&[
        Item::Tuple(250, 260, 0, HEAP_ONLY_TUPLE, 1),
        Item::Redirect(3),
        Item::Tuple(200, 300, 0, HEAP_ONLY_TUPLE | HEAP_HOT_UPDATED, 4),
        Item::Tuple(300, 0, LIVE, HEAP_ONLY_TUPLE, 4),
        Item::Tuple(100, 150, 0, 0, 5),
    ]);
    let lists = (300, vec![2, 4], vec![5], vec![3, 1]);
    let all = XLHP_CLEANUP_LOCK
        | XLHP_HAS_CONFLICT_HORIZON
        | XLHP_HAS_REDIRECTIONS
        | XLHP_HAS_DEAD_ITEMS
        | XLHP_HAS_NOW_UNUSED_ITEMS;
    assert_eq!(predicted17(&p, None), (all, lists.clone()));
    assert_eq!(predicted17(&p, Some(&[5, 3, 1])), (all, lists));
    assert_eq!(predicted(&p, None), (300, vec![2, 4], vec![5], vec![1, 3]));
    // A redirect past the last line pointer dies; nothing removed sets no horizon.
    let p = page(&[Item::Redirect(3), live()]);
    let flags = XLHP_CLEANUP_LOCK | XLHP_HAS_DEAD_ITEMS;
    assert_eq!(predicted17(&p, None), (flags, (0, vec![], vec![1], vec![])));
    assert_eq!(predicted17(&page(&[live()]), None).0, XLHP_CLEANUP_LOCK);
}

fn key(blkno: u32) -> BlockKey {
    BlockKey {
        spc: 1663,
        db: 5,
        rel: 16396,
        fork: 0,
        blkno,
    }
}

/// A block gets an entry at a prune; updates and deletes add to it; it keeps what is still a
/// tuple after the next prune; too many touches, an image or a prune of an uncached page
/// forget it.
#[test]
fn candidates_follow_the_records() {
    let mut c = Candidates::default();
    let (a, b) = (key(1), key(2));
    c.touched(&a, 3);
    assert_eq!(c.get(&a), None, "no entry before a prune");
    let p = page(&[Item::Redirect(2), live(), live()]);
    c.pruned(&a, Some(&p));
    assert_eq!(c.get(&a), Some(&[][..]));
    c.touched(&a, 1);
    c.touched(&a, 3);
    c.touched(&a, 9);
    assert_eq!(c.get(&a), Some(&[1, 3, 9][..]));
    // After the next prune: 1 is a redirect, 9 no line pointer; 3 is still a tuple.
    c.pruned(&a, Some(&p));
    assert_eq!(c.get(&a), Some(&[3][..]));
    for off in 0..MAX_TOUCHED as u16 {
        c.touched(&a, off + 1);
    }
    assert_eq!(c.get(&a), None, "more than an entry holds");
    c.pruned(&a, Some(&p));
    c.pruned(&b, Some(&p));
    c.forget(&a);
    assert_eq!((c.get(&a), c.get(&b)), (None, Some(&[][..])));
    c.pruned(&b, None);
    assert_eq!(c.get(&b), None);
}
