use super::*;
use crate::walcodec::testgen::block_key;
use crate::walcodec::wal::BlockRef;

fn key(blkno: u32) -> BlockKey {
    block_key(16384, blkno)
}

fn tid(blkno: u32, off: u16) -> Tid {
    Tid {
        block: key(blkno),
        off,
    }
}

struct NoPages;
impl PageLookup for NoPages {
    fn page_of(&self, _: &BlockKey) -> Option<&[u8; PAGE_SIZE]> {
        None
    }
}

struct OnePage(BlockKey, Box<[u8; PAGE_SIZE]>);
impl PageLookup for OnePage {
    fn page_of(&self, k: &BlockKey) -> Option<&[u8; PAGE_SIZE]> {
        (*k == self.0).then_some(&*self.1)
    }
}

/// A heap page with the given tuples (bytes from t_bits on, t_hoff 24) at offsets 1...
fn heap_page(tuples: &[&[u8]]) -> Box<[u8; PAGE_SIZE]> {
    let mut p = Box::new([0u8; PAGE_SIZE]);
    let mut upper = PAGE_SIZE;
    for (i, t) in tuples.iter().enumerate() {
        let len = TUPLE_HEADER + t.len();
        upper -= len;
        p[upper + 22] = 24;
        p[upper + TUPLE_HEADER..upper + len].copy_from_slice(t);
        let lp = (upper as u32) | (1 << 15) | ((len as u32) << 17);
        p[24 + 4 * i..28 + 4 * i].copy_from_slice(&lp.to_le_bytes());
    }
    let lower = 24 + 4 * tuples.len();
    p[12..14].copy_from_slice(&(lower as u16).to_le_bytes());
    p[14..16].copy_from_slice(&(upper as u16).to_le_bytes());
    p
}

#[test]
fn tuples_are_found_in_pages_by_line_pointer() {
    let page = heap_page(&[b"first tuple", b"second tuple"]);
    assert_eq!(tuple_in_page(&page, 1), Some((24, &b"first tuple"[..])));
    assert_eq!(tuple_in_page(&page, 2), Some((24, &b"second tuple"[..])));
    assert_eq!(tuple_in_page(&page, 0), None);
    assert_eq!(tuple_in_page(&page, 3), None);
    // Garbage pages give nothing, never a panic.
    let mut g = Box::new([0xffu8; PAGE_SIZE]);
    for off in [1u16, 2, 100, 2000, u16::MAX] {
        let _ = tuple_in_page(&g, off);
    }
    g[12..14].copy_from_slice(&28u16.to_le_bytes());
    assert_eq!(tuple_in_page(&g, 1), None);
}

#[test]
fn prefix_and_suffix_never_overlap() {
    assert_eq!(prefix_suffix(b"abcdef", b"abcdef"), (6, 0));
    assert_eq!(prefix_suffix(b"abXdef", b"abcdef"), (2, 3));
    assert_eq!(prefix_suffix(b"aaaa", b"aa"), (2, 0));
    assert_eq!(prefix_suffix(b"xaa", b"aa"), (0, 2));
    assert_eq!(prefix_suffix(b"", b"abc"), (0, 0));
}

fn block(id: u8, blkno: u32, data_len: u16) -> BlockRef {
    BlockRef {
        id,
        key: key(blkno),
        data_len,
        image: None,
    }
}

fn update_main(old_off: u16, flags: u8, new_off: u16) -> Vec<u8> {
    let mut m = vec![0u8; SIZE_UPDATE];
    m[4..6].copy_from_slice(&old_off.to_le_bytes());
    m[7] = flags;
    m[12..14].copy_from_slice(&new_off.to_le_bytes());
    m
}

#[test]
fn update_to_another_page_uses_the_old_tuple_of_the_cached_page() {
    let old = b"0123456789abcdefghijklmnopqrstuvwxyz-old-row";
    let pages = OnePage(key(7), heap_page(&[b"other", old]));
    let blocks = [block(0, 9, 60), block(1, 7, 0)];
    let main = update_main(2, 0, 4);
    let h = HeapRec::parse(RM_HEAP_ID, XLOG_HEAP_UPDATE, &blocks, &main).unwrap();
    let site = h.block0_site(60).unwrap();
    assert_eq!(site.old, Some(tid(7, 2)));
    assert_eq!(site.new, Some(tid(9, 4)));
    let mut new = old.to_vec();
    new[20] = b'!';
    let tuples = TupleCache::new(1 << 20);
    let (c, p, s) = choose(&new, &site, &tuples, &pages).unwrap();
    assert_eq!((c, p, s), (2, 20, new.len() - 21));
    // PostgreSQL's own prefix/suffix: no site; other rmgrs: no record.
    let cut = update_main(2, XLH_UPDATE_PREFIX_FROM_OLD, 4);
    let h2 = HeapRec::parse(RM_HEAP_ID, XLOG_HEAP_HOT_UPDATE, &blocks, &cut).unwrap();
    assert!(h2.block0_site(60).is_none());
    assert!(HeapRec::parse(11, XLOG_HEAP_UPDATE, &blocks, &main).is_none());
    assert!(HeapRec::parse(RM_HEAP_ID, XLOG_HEAP_UPDATE, &blocks, &main[..10]).is_none());
}

/// What both ends do with a heap record's block 0 data `d` once the record is written: a cut
/// update's new tuple expanded with the old one's known version, then the tuple cache fed.
fn feed(h: &HeapRec, d: Option<&[u8]>, xid: u32, tuples: &mut TupleCache) {
    let mut expanded = Vec::new();
    let ok = d
        .zip(h.cut_old(tuples, &NoPages))
        .is_some_and(|(d, old)| h.expand_cut(d, old, &mut expanded));
    h.feed(d, xid, tuples, ok.then_some(&expanded[..]));
}

#[test]
fn feed_expands_postgres_prefix_and_suffix_with_the_old_version() {
    let mut tuples = TupleCache::new(1 << 20);
    // INSERT at (3, 1): xl_heap_header (t_hoff 24: one bitmap byte) + bitmap + user data.
    let mut ins = vec![0u8, 0, 0, 0, 24, 0xAA];
    ins.extend_from_slice(b"hello, this is the user data");
    let blocks = [block(0, 3, ins.len() as u16)];
    let h = HeapRec::parse(RM_HEAP_ID, XLOG_HEAP_INSERT, &blocks, &[1, 0, 0]).unwrap();
    feed(&h, Some(&ins), 900, &mut tuples);
    assert_eq!(tuples.get(&tid(3, 1)), Some(&ins[5..]));
    // HOT UPDATE (3,1) -> (3,2) with prefix 7 ("hello, ") and suffix 9 ("user data").
    let mut upd = vec![7u8, 0, 9, 0, 0, 0, 0, 0, 24, 0xAA];
    upd.extend_from_slice(b"that was the ");
    let main = update_main(
        1,
        XLH_UPDATE_PREFIX_FROM_OLD | XLH_UPDATE_SUFFIX_FROM_OLD,
        2,
    );
    let h = HeapRec::parse(RM_HEAP_ID, XLOG_HEAP_HOT_UPDATE, &blocks, &main).unwrap();
    feed(&h, Some(&upd), 901, &mut tuples);
    let mut want = vec![0xAA];
    want.extend_from_slice(b"hello, that was the user data");
    assert_eq!(tuples.get(&tid(3, 2)), Some(&want[..]));
    // Without the old version the new TID is forgotten, not guessed.
    let main = update_main(
        5,
        XLH_UPDATE_PREFIX_FROM_OLD | XLH_UPDATE_SUFFIX_FROM_OLD,
        2,
    );
    let h = HeapRec::parse(RM_HEAP_ID, XLOG_HEAP_HOT_UPDATE, &blocks, &main).unwrap();
    feed(&h, Some(&upd), 901, &mut tuples);
    assert!(tuples.get(&tid(3, 2)).is_none());
    // A DELETE forgets the tuple.
    let mut del = vec![0u8; SIZE_DELETE];
    del[4] = 1;
    let h = HeapRec::parse(RM_HEAP_ID, XLOG_HEAP_DELETE, &blocks, &del).unwrap();
    feed(&h, None, 902, &mut tuples);
    assert!(tuples.get(&tid(3, 1)).is_none());
}

/// The known tuples of a block come with the header PostgreSQL puts on the page: xmin from
/// the record, t_ctid pointing at the tuple itself, the record's infomask with
/// HEAP_XMIN_COMMITTED, in line pointer order.
#[test]
fn page_prefix_rebuilds_tuple_headers() {
    let mut tuples = TupleCache::new(1 << 20);
    for (off, xid, data) in [(2u16, 901u32, &b"second"[..]), (1, 900, &b"first"[..])] {
        let mut ins = vec![0x03, 0x00, 0x02, 0x08, 24, 0xAA];
        ins.extend_from_slice(data);
        let blocks = [block(0, 0x1_0003, ins.len() as u16)];
        let main = [off as u8, 0, 0];
        let h = HeapRec::parse(RM_HEAP_ID, XLOG_HEAP_INSERT, &blocks, &main).unwrap();
        feed(&h, Some(&ins), xid, &mut tuples);
    }
    let mut out = Vec::new();
    // pd_lower 32: line pointers 1 and 2.
    page_prefix(&tuples, &key(0x1_0003), 32, &mut out);
    let header = |xmin: u32, off: u16| {
        let mut h = xmin.to_le_bytes().to_vec();
        h.extend_from_slice(&[0; 8]);
        h.extend_from_slice(&[1, 0, 3, 0]);
        h.extend_from_slice(&off.to_le_bytes());
        h.extend_from_slice(&[0x03, 0x00, 0x02, 0x09, 24]);
        h
    };
    let mut want = header(900, 1);
    want.extend_from_slice(b"\xAAfirst");
    want.extend(header(901, 2));
    want.extend_from_slice(b"\xAAsecond");
    assert_eq!(out, want);
    // Only the line pointers the image has: pd_lower 28 stops after the first.
    page_prefix(&tuples, &key(0x1_0003), 28, &mut out);
    assert_eq!(out.len(), TUPLE_HEADER + 6);
}
