//! Standard page primitives as PostgreSQL's `bufpage.c` does them (`PageAddItemExtended` with
//! an explicit offset, `PageRepairFragmentation`, `PageTruncateLinePointerArray`), on 8 KiB
//! pages that may hold anything: every step checks its bounds and gives up quietly, leaving
//! the page as it is or partly changed (the result is only a prediction).

/// Line pointer `off` (1-based): (lp_off, lp_flags, lp_len).
pub use crate::walcodec::wal::line_pointer as lp;
use crate::walcodec::wal::{item_id, le32, max_offset, page_bounds, PAGE_HEADER, PAGE_SIZE};
pub use crate::walcodec::wal::{
    LP_DEAD, LP_NORMAL, LP_REDIRECT, LP_UNUSED, MAX_HEAP_TUPLES, TUPLE_HEADER,
};

pub type PageBuf = [u8; PAGE_SIZE];

pub(super) const PD_HAS_FREE_LINES: u16 = 0x0001;
pub const PD_PAGE_FULL: u16 = 0x0002;
pub const PD_ALL_VISIBLE: u16 = 0x0004;

// (One bounds check and one load each: byte by byte, the line pointer reads were a fifth of
// PageRepairFragmentation's instructions.)
pub fn u16_at(p: &PageBuf, at: usize) -> u16 {
    let b: [u8; 2] = p[at..at + 2].try_into().expect("two bytes");
    u16::from_le_bytes(b)
}

pub fn set_u16(p: &mut PageBuf, at: usize, v: u16) {
    p[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

pub fn set_u32(p: &mut PageBuf, at: usize, v: u32) {
    p[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn u32_at(p: &PageBuf, at: usize) -> u32 {
    le32(p, at).expect("four bytes")
}

pub fn set_lp(p: &mut PageBuf, off: usize, lp_off: usize, flags: u32, len: usize) {
    let v = (lp_off as u32 & 0x7fff) | (flags & 3) << 15 | (len as u32 & 0x7fff) << 17;
    set_u32(p, PAGE_HEADER + 4 * (off - 1), v);
}

/// The byte range of the tuple at `off` if it is LP_NORMAL with at least a tuple header.
pub fn tuple_range(p: &PageBuf, off: usize) -> Option<std::ops::Range<usize>> {
    let (at, flags, len) = lp(p, off)?;
    let end = at.checked_add(len)?;
    (flags == LP_NORMAL && len >= TUPLE_HEADER && end <= PAGE_SIZE && at >= PAGE_HEADER)
        .then_some(at..end)
}

pub fn set_flag(p: &mut PageBuf, flag: u16, on: bool) {
    let f = u16_at(p, 10);
    set_u16(p, 10, if on { f | flag } else { f & !flag });
}

/// PageInit of an 8 KiB page without special space.
pub fn init(p: &mut PageBuf) {
    p.fill(0);
    set_u16(p, 12, PAGE_HEADER as u16);
    set_u16(p, 14, PAGE_SIZE as u16);
    set_u16(p, 16, PAGE_SIZE as u16);
    set_u16(p, 18, PAGE_SIZE as u16 | 4);
}

/// PageAddItem(page, item, size, offnum, overwrite = true, is_heap = true): false (page
/// unchanged) where PostgreSQL would refuse.
pub fn add_item(p: &mut PageBuf, item: &[u8], offnum: usize) -> bool {
    let Some((lower, upper, _)) = page_bounds(p) else {
        return false;
    };
    let limit = (lower - PAGE_HEADER) / 4 + 1;
    if offnum == 0 || offnum > limit || offnum > MAX_HEAP_TUPLES {
        return false;
    }
    if offnum < limit {
        match lp(p, offnum) {
            Some((_, LP_UNUSED, 0)) => {}
            _ => return false,
        }
    }
    let new_lower = if offnum == limit { lower + 4 } else { lower };
    let Some(new_upper) = upper.checked_sub(item.len().next_multiple_of(8)) else {
        return false;
    };
    if new_lower > new_upper {
        return false;
    }
    set_lp(p, offnum, new_upper, LP_NORMAL, item.len());
    p[new_upper..new_upper + item.len()].copy_from_slice(item);
    set_u16(p, 12, new_lower as u16);
    set_u16(p, 14, new_upper as u16);
    true
}

/// The line pointer PageAddItem (no offset asked for, heap) fills on `p`: where the page
/// says it has free line pointers, the first unused one without storage, else the one after
/// the last; `None` past MaxHeapTuplesPerPage or on a page whose bounds are off.
pub fn next_item_offset(p: &PageBuf) -> Option<usize> {
    let n = max_offset(p)?;
    let free = if u16_at(p, 10) & PD_HAS_FREE_LINES != 0 {
        (1..=n).find(|&off| matches!(lp_raw(p, off), (_, LP_UNUSED, 0)))
    } else {
        None
    };
    Some(free.unwrap_or(n + 1)).filter(|&off| off <= MAX_HEAP_TUPLES)
}

/// Line pointer `off` (1-based, at most the number of line pointers) without checks.
fn lp_raw(p: &PageBuf, off: usize) -> (usize, u32, usize) {
    item_id(u32_at(p, PAGE_HEADER + 4 * (off - 1)))
}

/// PageRepairFragmentation (PostgreSQL 14+: tuples packed from pd_special down in line
/// pointer order; from 17 on also the trailing unused line pointers cut off when `truncate`).
pub fn repair_fragmentation(p: &mut PageBuf, truncate: bool, scratch: &mut PageBuf) {
    let Some((lower, upper, special)) = page_bounds(p) else {
        return;
    };
    if special % 8 != 0 {
        return;
    }
    let n = (lower - PAGE_HEADER) / 4;
    let Some(items) = scan_items(p, n, upper, special) else {
        return;
    };
    if items.total > special - lower {
        return;
    }
    if !items.presorted {
        let end = items.moved_end.min(PAGE_SIZE);
        scratch[upper..end].copy_from_slice(&p[upper..end]);
    }
    let (from, top) = items.first_moved;
    let top = compact(p, from..=n, top, items.presorted, scratch);
    set_u16(p, 14, top as u16);
    let mut nunused = items.nunused;
    if truncate && items.final_used < n {
        nunused -= n - items.final_used;
        set_u16(p, 12, (PAGE_HEADER + 4 * items.final_used) as u16);
    }
    set_flag(p, PD_HAS_FREE_LINES, nunused > 0);
}

/// The first pass of PageRepairFragmentation over the `n` line pointers.
struct Items {
    nunused: usize,
    /// The last line pointer in use (0: none).
    final_used: usize,
    /// Space the tuples take, each MAXALIGNed.
    total: usize,
    /// The tuples lie in descending order of offset, line pointer after line pointer.
    presorted: bool,
    /// The first line pointer whose tuple moves, and where the tuples before it end (every
    /// one of them already in place: packed against pd_special in line pointer order);
    /// (n + 1, where the last ends) when none moves.
    first_moved: (usize, usize),
    /// Where the tuples from the first moved one on end at most, MAXALIGNed (what
    /// [`compact`] reads from the scratch copy lies below).
    moved_end: usize,
}

/// Resets the unused line pointers of `p` to zero and measures the rest; None (the page
/// left as it is but for those) when a tuple lies outside `upper..special`.
fn scan_items(p: &mut PageBuf, n: usize, upper: usize, special: usize) -> Option<Items> {
    let mut items = Items {
        nunused: 0,
        final_used: 0,
        total: 0,
        presorted: true,
        first_moved: (n + 1, special),
        moved_end: upper,
    };
    // Where the last tuple with storage starts; while `in_place`, also where the tuples so
    // far, all in place, end.
    let mut last = special;
    let mut in_place = true;
    let lps = &mut p[PAGE_HEADER..PAGE_HEADER + 4 * n];
    for (i, raw) in lps.chunks_exact_mut(4).enumerate() {
        let v = le32(raw, 0).expect("four bytes");
        let (at, flags, len) = item_id(v);
        if flags == LP_UNUSED {
            raw.fill(0);
            items.nunused += 1;
            continue;
        }
        items.final_used = i + 1;
        if len == 0 {
            continue;
        }
        let aligned = len.next_multiple_of(8);
        if in_place {
            // In place, its tuple is in bounds and below the one before.
            if at >= upper && at + aligned == last {
                last = at;
                items.total += aligned;
                continue;
            }
            in_place = false;
            items.first_moved = (i + 1, last);
        }
        if at < upper || at >= special || at + len > PAGE_SIZE {
            return None;
        }
        items.presorted &= at < last;
        last = at;
        items.total += aligned;
        items.moved_end = items.moved_end.max(at + aligned);
    }
    if in_place {
        items.first_moved.1 = last;
    }
    Some(items)
}

/// Packs the tuples of line pointers `offs` of `p` below `top` (where the tuples before them
/// end), in line pointer order (from the copy in `scratch` unless `presorted`), and
/// points the line pointers at them; returns the new pd_upper.
fn compact(
    p: &mut PageBuf,
    offs: std::ops::RangeInclusive<usize>,
    mut top: usize,
    presorted: bool,
    scratch: &PageBuf,
) -> usize {
    // Presorted: runs of adjacent items that move up by the same amount, one copy each (the
    // runs below have not moved yet, the ones above are in place).
    let mut run: Option<(usize, usize, usize)> = None;
    let flush = |p: &mut PageBuf, run: Option<(usize, usize, usize)>| {
        if let Some((lo, hi, shift)) = run {
            p.copy_within(lo..hi, lo + shift);
        }
    };
    for off in offs {
        let (at, flags, len) = lp_raw(p, off);
        if flags == LP_UNUSED || len == 0 {
            continue;
        }
        let aligned = len.next_multiple_of(8);
        top -= aligned;
        if top == at {
            continue;
        }
        let end = (at + aligned).min(PAGE_SIZE);
        if presorted && top > at {
            let shift = top - at;
            run = match run {
                Some((lo, hi, s)) if s == shift && end == lo => Some((at, hi, s)),
                other => {
                    flush(p, other);
                    Some((at, end, shift))
                }
            };
        } else {
            flush(p, run.take());
            if presorted {
                // A damaged page whose items overlap moves down: one item at a time.
                p.copy_within(at..end, top);
            } else {
                p[top..top + (end - at)].copy_from_slice(&scratch[at..end]);
            }
        }
        set_lp(p, off, top, flags, len);
    }
    flush(p, run);
    top
}

/// PageTruncateLinePointerArray: trailing unused line pointers cut off (one always kept).
pub fn truncate_line_pointers(p: &mut PageBuf) {
    let Some(n) = max_offset(p) else {
        return;
    };
    // (lp_raw: 1..=n are line pointers; bounds were checked once above.)
    let mut keep = n;
    while keep > 1 && lp_raw(p, keep).1 == LP_UNUSED {
        keep -= 1;
    }
    let any_unused = (1..=keep).any(|off| lp_raw(p, off).1 == LP_UNUSED);
    set_u16(p, 12, (PAGE_HEADER + 4 * keep) as u16);
    set_flag(p, PD_HAS_FREE_LINES, any_unused);
}
