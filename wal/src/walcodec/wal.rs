//! PostgreSQL WAL format facts (majors 14..=18, little-endian, MAXALIGN 8) and the parsers the
//! codec needs: page headers (validation and prediction) and the block-header area of records.
//!
//! What differs between majors (XLOG_PAGE_MAGIC, image flags) is [`crate::pg::PgMajor`]; segment
//! sizes and file names are [`crate::segment`].
//!
//! Sources: `src/include/access/xlog_internal.h` (page headers),
//! `src/include/access/xlogrecord.h` (record and block headers) and `DecodeXLogRecord` in
//! `src/backend/access/transam/xlogreader.c` (the cross-checks mirrored in [`parse_area`]).

use crate::lsn::Lsn;
use crate::segment::WalSegSize;

/// XLOG_BLCKSZ: size of a WAL page. Anything else is passed raw.
pub const WAL_PAGE: u64 = 8192;
/// BLCKSZ: size of a data page (full-page images).
pub const PAGE_SIZE: usize = 8192;
/// SizeOfPageHeaderData: a data page's line pointers start here.
pub const PAGE_HEADER: usize = 24;

/// (pd_lower, pd_upper, pd_special) of data page `p` if they describe a standard layout: the
/// line pointers (4 bytes each) from [`PAGE_HEADER`] to pd_lower, free space to pd_upper, the
/// tuples to pd_special, the special space to the page's end. (PageHeaderData holds them at
/// 12, 14 and 16.)
pub fn page_bounds(p: &[u8; PAGE_SIZE]) -> Option<(usize, usize, usize)> {
    let at = |o: usize| le16(p, o).map(usize::from);
    let (lower, upper, special) = (at(12)?, at(14)?, at(16)?);
    let ok = PAGE_HEADER <= lower
        && lower <= upper
        && upper <= special
        && special <= PAGE_SIZE
        && (lower - PAGE_HEADER) % 4 == 0;
    ok.then_some((lower, upper, special))
}

/// lp_flags of a line pointer (itemid.h).
pub const LP_UNUSED: u32 = 0;
pub const LP_NORMAL: u32 = 1;
pub const LP_REDIRECT: u32 = 2;
pub const LP_DEAD: u32 = 3;

/// SizeofHeapTupleHeader.
pub const TUPLE_HEADER: usize = 23;
/// MaxHeapTuplesPerPage of 8 KiB pages.
pub const MAX_HEAP_TUPLES: usize = 291;

/// t_infomask bits (htup_details.h).
pub const HEAP_XMAX_KEYSHR_LOCK: u16 = 0x0010;
pub const HEAP_COMBOCID: u16 = 0x0020;
pub const HEAP_XMAX_EXCL_LOCK: u16 = 0x0040;
pub const HEAP_XMAX_LOCK_ONLY: u16 = 0x0080;
pub const HEAP_XMIN_COMMITTED: u16 = 0x0100;
pub const HEAP_XMIN_INVALID: u16 = 0x0200;
pub const HEAP_XMAX_COMMITTED: u16 = 0x0400;
pub const HEAP_XMAX_INVALID: u16 = 0x0800;
pub const HEAP_XMAX_IS_MULTI: u16 = 0x1000;
/// t_infomask2 bits.
pub const HEAP_KEYS_UPDATED: u16 = 0x2000;
pub const HEAP_HOT_UPDATED: u16 = 0x4000;
pub const HEAP_ONLY_TUPLE: u16 = 0x8000;

/// A line pointer's 4-byte word (ItemIdData): (lp_off, lp_flags, lp_len).
pub fn item_id(v: u32) -> (usize, u32, usize) {
    ((v & 0x7fff) as usize, (v >> 15) & 3, (v >> 17) as usize)
}

/// Line pointer `off` (1-based) of page `p`, if the page has it: (lp_off, lp_flags, lp_len).
pub fn line_pointer(p: &[u8; PAGE_SIZE], off: usize) -> Option<(usize, u32, usize)> {
    if off == 0 || off > max_offset(p)? {
        return None;
    }
    le32(p, PAGE_HEADER + 4 * (off - 1)).map(item_id)
}

/// PageGetMaxOffsetNumber: how many line pointers page `p` has, if its layout is standard
/// ([`page_bounds`]).
pub fn max_offset(p: &[u8; PAGE_SIZE]) -> Option<usize> {
    page_bounds(p).map(|(lower, _, _)| (lower - PAGE_HEADER) / 4)
}

/// SizeOfXLogShortPHD: MAXALIGN(sizeof(XLogPageHeaderData)).
pub const SHORT_PHD: usize = 24;
/// SizeOfXLogLongPHD: MAXALIGN(sizeof(XLogLongPageHeaderData)).
pub const LONG_PHD: usize = 40;
/// SizeOfXLogRecord.
pub const REC_HDR: usize = 24;

pub const XLP_FIRST_IS_CONTRECORD: u16 = 0x0001;
pub const XLP_LONG_HEADER: u16 = 0x0002;
pub const XLP_BKP_REMOVABLE: u16 = 0x0004;
/// Every flag bit known to PostgreSQL 14..=18 (0x0008 is XLP_FIRST_IS_OVERWRITE_CONTRECORD).
pub const XLP_ALL_FLAGS: u16 = 0x000F;

pub const RM_XLOG_ID: u8 = 0;
/// `xl_rmid` of heap2 and heap records (`rmgrlist.h`), and the bits of `xl_info` that name
/// their op (`heapam_xlog.h`; 0x80 is the init-page flag).
pub const RM_HEAP2_ID: u8 = 9;
pub const RM_HEAP_ID: u8 = 10;
pub const XLOG_HEAP_OPMASK: u8 = 0x70;
/// XLOG_HEAP_INIT_PAGE: the record's block 0 starts as an empty page.
pub const XLOG_HEAP_INIT_PAGE: u8 = 0x80;
pub const XLOG_SWITCH: u8 = 0x40;
/// XLOG_FPI (`log_newpage`: a page written whole, e.g. by an index build), all majors.
pub const XLOG_FPI: u8 = 0xB0;
/// XLOG_FPI_FOR_HINT: a page logged whole when a hint bit is first set on it after a
/// checkpoint (data checksums or `wal_log_hints` on), all majors.
pub const XLOG_FPI_FOR_HINT: u8 = 0xA0;

pub const XLR_MAX_BLOCK_ID: u8 = 32;
pub const XLR_BLOCK_ID_DATA_SHORT: u8 = 255;
pub const XLR_BLOCK_ID_DATA_LONG: u8 = 254;
pub const XLR_BLOCK_ID_ORIGIN: u8 = 253;
pub const XLR_BLOCK_ID_TOPLEVEL_XID: u8 = 252;

pub const BKPBLOCK_FORK_MASK: u8 = 0x0F;
pub const BKPBLOCK_HAS_IMAGE: u8 = 0x10;
pub const BKPBLOCK_HAS_DATA: u8 = 0x20;
pub const BKPBLOCK_SAME_REL: u8 = 0x80;

pub const BKPIMAGE_HAS_HOLE: u8 = 0x01;

pub fn le16(b: &[u8], off: usize) -> Option<u16> {
    b.get(off..off.checked_add(2)?)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
}

pub fn le32(b: &[u8], off: usize) -> Option<u32> {
    b.get(off..off.checked_add(4)?)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_le_bytes)
}

pub fn le64(b: &[u8], off: usize) -> Option<u64> {
    b.get(off..off.checked_add(8)?)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_le_bytes)
}

/// Length of a page header given its xlp_info.
pub fn phd_len(info: u16) -> usize {
    if info & XLP_LONG_HEADER != 0 {
        LONG_PHD
    } else {
        SHORT_PHD
    }
}

/// A page header that passed [`validate_page_header`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageHeader {
    pub info: u16,
    pub tli: u32,
    pub rem_len: u32,
    /// (xlp_sysid, xlp_seg_size) of a long header.
    pub long: Option<(u64, u64)>,
}

impl PageHeader {
    /// Whether the page starts with the continuation of a record (XLP_FIRST_IS_CONTRECORD with
    /// a non-zero xlp_rem_len); PostgreSQL ignores xlp_rem_len without the flag.
    pub fn continues(&self) -> Option<u32> {
        (self.info & XLP_FIRST_IS_CONTRECORD != 0 && self.rem_len > 0).then_some(self.rem_len)
    }
}

/// Checks a complete page header found at `pos` (a multiple of [`WAL_PAGE`]): magic, known
/// flags, xlp_pageaddr, and for a long header a sane segment size that `pos` is a multiple of
/// and xlp_xlog_blcksz 8192. `h` is exactly 24 or 40 bytes as its own flag says.
pub fn validate_page_header(h: &[u8], pos: u64, magic: u16) -> Option<PageHeader> {
    let info = le16(h, 2)?;
    if le16(h, 0)? != magic || info & !XLP_ALL_FLAGS != 0 || le64(h, 8)? != pos {
        return None;
    }
    if h.len() != phd_len(info) {
        return None;
    }
    let long = if info & XLP_LONG_HEADER != 0 {
        let seg = WalSegSize::new(u64::from(le32(h, 32)?))?;
        if le32(h, 36)? != 8192 || seg.offset_in_segment(Lsn(pos)) != 0 {
            return None;
        }
        Some((le64(h, 24)?, seg.bytes()))
    } else {
        None
    };
    Some(PageHeader {
        info,
        tli: le32(h, 4)?,
        rem_len: le32(h, 16)?,
        long,
    })
}

/// What the next page header is expected to repeat from the last one seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageTemplate {
    pub magic: u16,
    pub tli: u32,
    pub bkp_removable: bool,
    /// xlp_sysid of the last long header seen.
    pub sysid: Option<u64>,
}

impl PageTemplate {
    /// The header PostgreSQL writes at `pos` when `rem` bytes of a record continue there
    /// (0: a record starts after the header). Returns the bytes and the header length.
    pub fn build(
        &self,
        pos: u64,
        rem: u32,
        long: bool,
        seg_size: u64,
    ) -> Option<([u8; 40], usize)> {
        let mut info = 0u16;
        if rem > 0 {
            info |= XLP_FIRST_IS_CONTRECORD;
        }
        if self.bkp_removable {
            info |= XLP_BKP_REMOVABLE;
        }
        let mut h = [0u8; 40];
        let len = if long {
            info |= XLP_LONG_HEADER;
            h[24..32].copy_from_slice(&self.sysid?.to_le_bytes());
            h[32..36].copy_from_slice(&u32::try_from(seg_size).ok()?.to_le_bytes());
            h[36..40].copy_from_slice(&8192u32.to_le_bytes());
            LONG_PHD
        } else {
            SHORT_PHD
        };
        h[0..2].copy_from_slice(&self.magic.to_le_bytes());
        h[2..4].copy_from_slice(&info.to_le_bytes());
        h[4..8].copy_from_slice(&self.tli.to_le_bytes());
        h[8..16].copy_from_slice(&pos.to_le_bytes());
        h[16..20].copy_from_slice(&rem.to_le_bytes());
        Some((h, len))
    }
}

/// Identity of a data page: RelFileLocator (spcOid, dbOid, relNumber), fork and block number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct BlockKey {
    pub spc: u32,
    pub db: u32,
    pub rel: u32,
    pub fork: u8,
    pub blkno: u32,
}

/// The full-page image of a block reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageRef {
    /// Bytes of the image in the record.
    pub len: u16,
    pub hole_offset: u16,
    /// Bytes of the hole: BLCKSZ - len for uncompressed images, from the header otherwise.
    pub hole_len: u16,
    pub compressed: bool,
    /// bimg_info as in the record (method flags of a compressed image).
    pub info: u8,
}

impl ImageRef {
    /// Whether the image can go through the page cache: uncompressed and the hole (if any)
    /// inside the page, so that page = image[..off] ++ zeros(hole) ++ image[off..].
    pub fn reconstructible(&self) -> bool {
        !self.compressed
            && usize::from(self.len) + usize::from(self.hole_len) == PAGE_SIZE
            && usize::from(self.hole_offset) <= usize::from(self.len)
    }
}

/// One block reference of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRef {
    /// block_id (0..=XLR_MAX_BLOCK_ID).
    pub id: u8,
    pub key: BlockKey,
    pub data_len: u16,
    pub image: Option<ImageRef>,
}

/// The block-header area of a record (everything between the 24-byte header and the first
/// image/data byte), parsed.
#[derive(Debug, Default)]
pub struct Area {
    /// Bytes of the area.
    pub len: usize,
    pub blocks: Vec<BlockRef>,
    pub main_len: u32,
    /// Images + block data + main data: the bytes that follow the area.
    pub data_total: u64,
}

/// Why a record body is not understood (the record then passes raw).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AreaError {
    Short,
    BadBlockId,
    OutOfOrder,
    DataLenMismatch,
    BadImage,
    NoPreviousRel,
    LengthMismatch,
    TrailingBytes,
}

/// Parses block headers the way `DecodeXLogRecord` does, with all of its cross-checks.
///
/// With `body_len = Some(n)` (the encoder: `b` is the record after its 24-byte header, `n`
/// bytes) the loop runs while the bytes left exceed the data announced so far, and the
/// lengths must add up exactly. With `None` (the decoder: `b` is exactly the area the encoder
/// sent) the loop runs until `b` is used up. Both take the same steps on the same bytes.
pub fn parse_area(
    b: &[u8],
    body_len: Option<usize>,
    compressed_mask: u8,
    out: &mut Area,
) -> Result<(), AreaError> {
    out.blocks.clear();
    out.main_len = 0;
    out.data_total = 0;
    let mut c = Cursor { b, p: 0 };
    let mut max_block: i32 = -1;
    let mut rel: Option<(u32, u32, u32)> = None;
    let mut total: u64 = 0;
    let more = |p: usize, total: u64| match body_len {
        Some(n) => (n as u64).saturating_sub(p as u64) > total,
        None => p < b.len(),
    };
    while more(c.p, total) {
        let id = c.u8()?;
        match id {
            XLR_BLOCK_ID_DATA_SHORT => {
                out.main_len = u32::from(c.u8()?);
                total += u64::from(out.main_len);
                break;
            }
            XLR_BLOCK_ID_DATA_LONG => {
                out.main_len = c.u32()?;
                total += u64::from(out.main_len);
                break;
            }
            XLR_BLOCK_ID_ORIGIN => {
                c.take(2)?;
            }
            XLR_BLOCK_ID_TOPLEVEL_XID => {
                c.take(4)?;
            }
            id if id <= XLR_MAX_BLOCK_ID => {
                if i32::from(id) <= max_block {
                    return Err(AreaError::OutOfOrder);
                }
                max_block = i32::from(id);
                let block = block_ref(&mut c, id, compressed_mask, &mut rel)?;
                total += u64::from(block.data_len) + block.image.map_or(0, |i| u64::from(i.len));
                out.blocks.push(block);
            }
            _ => return Err(AreaError::BadBlockId),
        }
    }
    out.len = c.p;
    out.data_total = total;
    let exact = match body_len {
        Some(n) => (n as u64).checked_sub(c.p as u64) == Some(total),
        None => c.p == b.len(),
    };
    match (exact, body_len) {
        (true, _) => Ok(()),
        (false, Some(_)) => Err(AreaError::LengthMismatch),
        (false, None) => Err(AreaError::TrailingBytes),
    }
}

/// Bytes of a record's block-header area read in order; running out is [`AreaError::Short`].
struct Cursor<'a> {
    b: &'a [u8],
    p: usize,
}

impl<'a> Cursor<'a> {
    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8], AreaError> {
        let s = self.b.get(self.p..self.p + n).ok_or(AreaError::Short)?;
        self.p += n;
        Ok(s)
    }

    #[inline]
    fn u8(&mut self) -> Result<u8, AreaError> {
        Ok(self.take(1)?[0])
    }

    #[inline]
    fn u16(&mut self) -> Result<u16, AreaError> {
        let s = self.take(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }

    #[inline]
    fn u32(&mut self) -> Result<u32, AreaError> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
}

/// One block reference (`XLogRecordBlockHeader`, its image header, its relation unless
/// `BKPBLOCK_SAME_REL`, its block number) after its block id; `rel` is the previous block's
/// relation, updated.
#[inline]
fn block_ref(
    c: &mut Cursor<'_>,
    id: u8,
    compressed_mask: u8,
    rel: &mut Option<(u32, u32, u32)>,
) -> Result<BlockRef, AreaError> {
    let fork_flags = c.u8()?;
    let data_len = c.u16()?;
    if (fork_flags & BKPBLOCK_HAS_DATA != 0) != (data_len > 0) {
        return Err(AreaError::DataLenMismatch);
    }
    let image = match fork_flags & BKPBLOCK_HAS_IMAGE != 0 {
        true => Some(image_ref(c, compressed_mask)?),
        false => None,
    };
    let (spc, db, relno) = if fork_flags & BKPBLOCK_SAME_REL == 0 {
        let r = (c.u32()?, c.u32()?, c.u32()?);
        *rel = Some(r);
        r
    } else {
        rel.ok_or(AreaError::NoPreviousRel)?
    };
    let blkno = c.u32()?;
    Ok(BlockRef {
        id,
        key: BlockKey {
            spc,
            db,
            rel: relno,
            fork: fork_flags & BKPBLOCK_FORK_MASK,
            blkno,
        },
        data_len,
        image,
    })
}

/// `XLogRecordBlockImageHeader` (and the compressed hole's length), with
/// `DecodeXLogRecord`'s checks.
#[inline]
fn image_ref(c: &mut Cursor<'_>, compressed_mask: u8) -> Result<ImageRef, AreaError> {
    let len = c.u16()?;
    let hole_offset = c.u16()?;
    let info = c.u8()?;
    let compressed = info & compressed_mask != 0;
    let has_hole = info & BKPIMAGE_HAS_HOLE != 0;
    let hole_len = match (compressed, has_hole) {
        (true, true) => c.u16()?,
        (true, false) => 0,
        // BLCKSZ - bimg_len, as PostgreSQL computes it (bimg_len <= BLCKSZ is checked below
        // for images without a hole).
        (false, _) => (PAGE_SIZE as u16).wrapping_sub(len),
    };
    let whole = usize::from(len) == PAGE_SIZE;
    let bad = if has_hole {
        hole_offset == 0 || hole_len == 0 || whole
    } else {
        hole_offset != 0 || hole_len != 0
    };
    let bad = bad
        || (compressed && whole)
        || (!has_hole && !compressed && !whole)
        || (!compressed && usize::from(len) > PAGE_SIZE);
    if bad {
        return Err(AreaError::BadImage);
    }
    Ok(ImageRef {
        len,
        hole_offset,
        hole_len,
        compressed,
        info,
    })
}

/// PostgreSQL's record CRC: CRC-32C over the record after its header, then over the first 20
/// header bytes (up to xl_crc); `rec` is the whole record.
pub fn record_crc(rec: &[u8]) -> u32 {
    let body = rec.get(REC_HDR..).unwrap_or(&[]);
    let head = rec.get(..20).unwrap_or(rec);
    let mut crc = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    crc.update(body);
    crc.update(head);
    // CRC-32/ISCSI is a 32-bit CRC: the digest's upper half is zero.
    crc.finalize() as u32
}

/// Sets a whole record's xl_crc (bytes 20..24) to [`record_crc`]; `rec` holds at least the
/// header.
pub fn seal_record(rec: &mut [u8]) {
    let crc = record_crc(rec);
    rec[20..24].copy_from_slice(&crc.to_le_bytes());
}

#[cfg(test)]
mod area_tests;
