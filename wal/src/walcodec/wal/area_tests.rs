//! `parse_area` against hand-built block-header areas: what it reads, and each of
//! `DecodeXLogRecord`'s checks it mirrors, in both its modes (the encoder's, which knows the
//! record's length, and the decoder's, which has exactly the area).

use super::*;

/// PG 15's compressed-image flags (pglz, lz4, zstd).
const COMPRESSED: u8 = 0x04 | 0x08 | 0x10;

/// A block-header area built field by field, and the bytes that follow it.
#[derive(Default)]
struct AreaBuf {
    area: Vec<u8>,
    after: usize,
}

impl AreaBuf {
    fn block(mut self, id: u8, flags: u8, data_len: u16) -> Self {
        self.area.push(id);
        self.area.push(flags);
        self.area.extend_from_slice(&data_len.to_le_bytes());
        self.after += usize::from(data_len);
        self
    }

    /// `XLogRecordBlockImageHeader`; `hole_len` only goes in for a compressed image with a
    /// hole, as PostgreSQL writes it.
    fn image(mut self, len: u16, hole_offset: u16, info: u8, hole_len: u16) -> Self {
        self.area.extend_from_slice(&len.to_le_bytes());
        self.area.extend_from_slice(&hole_offset.to_le_bytes());
        self.area.push(info);
        if info & COMPRESSED != 0 && info & BKPIMAGE_HAS_HOLE != 0 {
            self.area.extend_from_slice(&hole_len.to_le_bytes());
        }
        self.after += usize::from(len);
        self
    }

    fn rel(mut self, spc: u32, db: u32, rel: u32) -> Self {
        for v in [spc, db, rel] {
            self.area.extend_from_slice(&v.to_le_bytes());
        }
        self
    }

    fn blkno(mut self, b: u32) -> Self {
        self.area.extend_from_slice(&b.to_le_bytes());
        self
    }

    fn main_short(mut self, len: u8) -> Self {
        self.area.extend_from_slice(&[XLR_BLOCK_ID_DATA_SHORT, len]);
        self.after += usize::from(len);
        self
    }

    /// Parsed as the decoder does (exactly the area) and as the encoder does (the record's
    /// body length known); both must agree.
    fn parse(&self) -> Result<Area, AreaError> {
        let mut dec = Area::default();
        let by_decoder = parse_area(&self.area, None, COMPRESSED, &mut dec);
        let mut body = self.area.clone();
        body.resize(self.area.len() + self.after, 0xAB);
        let mut enc = Area::default();
        let by_encoder = parse_area(&body, Some(body.len()), COMPRESSED, &mut enc);
        assert_eq!(by_decoder, by_encoder, "the two modes disagree");
        if by_decoder.is_ok() {
            assert_eq!(dec.blocks, enc.blocks);
            assert_eq!(
                (dec.len, dec.main_len, dec.data_total),
                (enc.len, enc.main_len, enc.data_total)
            );
        }
        by_decoder.map(|()| dec)
    }
}

#[test]
fn blocks_images_and_main_data_are_read() {
    let a = AreaBuf::default()
        .block(0, BKPBLOCK_HAS_IMAGE | BKPBLOCK_HAS_DATA, 30)
        .image(8000, 100, BKPIMAGE_HAS_HOLE, 0)
        .rel(1663, 5, 16390)
        .blkno(7)
        .block(1, BKPBLOCK_SAME_REL | 2, 0)
        .blkno(9)
        .block(2, BKPBLOCK_HAS_IMAGE, 0)
        .image(900, 300, BKPIMAGE_HAS_HOLE | 0x08, 4000)
        .rel(1663, 5, 16400)
        .blkno(1)
        .main_short(12);
    let area = a.parse().unwrap();
    assert_eq!(area.len, a.area.len());
    assert_eq!(area.main_len, 12);
    assert_eq!(area.data_total, 30 + 8000 + 900 + 12);
    let [b0, b1, b2] = &area.blocks[..] else {
        panic!("three blocks, got {:?}", area.blocks)
    };
    assert_eq!(
        (b0.id, b0.data_len, b0.key.blkno, b0.key.rel),
        (0, 30, 7, 16390)
    );
    let i0 = b0.image.unwrap();
    // Uncompressed: the hole is what the page lacks.
    assert_eq!(
        (i0.len, i0.hole_offset, i0.hole_len, i0.compressed),
        (8000, 100, 192, false)
    );
    assert!(i0.reconstructible());
    // The same relation as the block before, another fork.
    assert_eq!(
        (b1.key.rel, b1.key.fork, b1.key.blkno, b1.image),
        (16390, 2, 9, None)
    );
    let i2 = b2.image.unwrap();
    // Compressed with a hole: its length comes from the header.
    assert_eq!(
        (i2.len, i2.hole_offset, i2.hole_len, i2.compressed),
        (900, 300, 4000, true)
    );
    assert!(!i2.reconstructible());
}

#[test]
fn origin_toplevel_xid_and_long_main_data_are_skipped_or_read() {
    let mut a = AreaBuf::default().block(0, 0, 0).rel(1, 2, 3).blkno(4);
    a.area.extend_from_slice(&[XLR_BLOCK_ID_ORIGIN, 1, 0]);
    a.area
        .extend_from_slice(&[XLR_BLOCK_ID_TOPLEVEL_XID, 9, 9, 9, 9]);
    a.area.push(XLR_BLOCK_ID_DATA_LONG);
    a.area.extend_from_slice(&300u32.to_le_bytes());
    a.after += 300;
    let area = a.parse().unwrap();
    assert_eq!(
        (area.blocks.len(), area.main_len, area.data_total),
        (1, 300, 300)
    );
}

/// Block 4 of relation (1, 2, 3), block id 0, with an image of these header fields, no data.
fn image_block(len: u16, hole_offset: u16, info: u8, hole_len: u16) -> AreaBuf {
    AreaBuf::default()
        .block(0, BKPBLOCK_HAS_IMAGE, 0)
        .image(len, hole_offset, info, hole_len)
        .rel(1, 2, 3)
        .blkno(4)
}

#[test]
fn every_check_refuses_its_case() {
    let ok_block = || AreaBuf::default().block(0, 0, 0).rel(1, 2, 3).blkno(4);
    let cases: Vec<(&str, AreaBuf, AreaError)> = vec![
        (
            "block ids not ascending",
            ok_block().block(0, BKPBLOCK_SAME_REL, 0).blkno(5),
            AreaError::OutOfOrder,
        ),
        (
            "HAS_DATA without data",
            AreaBuf::default()
                .block(0, BKPBLOCK_HAS_DATA, 0)
                .rel(1, 2, 3)
                .blkno(4),
            AreaError::DataLenMismatch,
        ),
        (
            "data without HAS_DATA",
            AreaBuf::default().block(0, 0, 8).rel(1, 2, 3).blkno(4),
            AreaError::DataLenMismatch,
        ),
        (
            "a hole at offset 0",
            image_block(8000, 0, BKPIMAGE_HAS_HOLE, 0),
            AreaError::BadImage,
        ),
        (
            "a hole in a whole page",
            image_block(8192, 100, BKPIMAGE_HAS_HOLE, 0),
            AreaError::BadImage,
        ),
        (
            "no hole, but an offset",
            image_block(8192, 100, 0, 0),
            AreaError::BadImage,
        ),
        (
            "no hole, uncompressed, short",
            image_block(8000, 0, 0, 0),
            AreaError::BadImage,
        ),
        (
            "compressed to a whole page",
            image_block(8192, 0, 0x04, 0),
            AreaError::BadImage,
        ),
        (
            "compressed with a hole of 0 bytes",
            image_block(900, 300, BKPIMAGE_HAS_HOLE | 0x04, 0),
            AreaError::BadImage,
        ),
        (
            "SAME_REL on the first block",
            AreaBuf::default().block(0, BKPBLOCK_SAME_REL, 0).blkno(4),
            AreaError::NoPreviousRel,
        ),
        (
            "a block id above XLR_MAX_BLOCK_ID",
            AreaBuf::default()
                .block(XLR_MAX_BLOCK_ID + 1, 0, 0)
                .rel(1, 2, 3)
                .blkno(4),
            AreaError::BadBlockId,
        ),
    ];
    for (what, a, want) in cases {
        assert_eq!(a.parse().map(|_| ()), Err(want), "{what}");
    }
}

#[test]
fn short_areas_and_lengths_that_do_not_add_up_are_refused() {
    let a = AreaBuf::default()
        .block(0, 0, 0)
        .rel(1, 2, 3)
        .blkno(4)
        .main_short(10);
    // The block ends at 20 bytes: a record without main data. Anywhere else the area ends
    // inside a field.
    for cut in 1..a.area.len() {
        let mut out = Area::default();
        let r = parse_area(&a.area[..cut], None, COMPRESSED, &mut out);
        let want = if cut == 20 {
            Ok(())
        } else {
            Err(AreaError::Short)
        };
        assert_eq!(r, want, "{cut} bytes of the area");
    }
    // The decoder's area with bytes after its main data length.
    let mut trailing = a.area.clone();
    trailing.push(0);
    let mut out = Area::default();
    assert_eq!(
        parse_area(&trailing, None, COMPRESSED, &mut out),
        Err(AreaError::TrailingBytes)
    );
    // The encoder's body one byte longer than the area announces.
    let mut body = a.area.clone();
    body.resize(a.area.len() + 11, 0);
    assert_eq!(
        parse_area(&body, Some(body.len()), COMPRESSED, &mut out),
        Err(AreaError::LengthMismatch)
    );
    // One byte shorter: the body ends inside what the area announced.
    body.truncate(a.area.len() + 9);
    assert!(parse_area(&body, Some(body.len()), COMPRESSED, &mut out).is_err());
}

/// CRC-32C bit by bit (reflected, polynomial 0x82F63B78): `COMP_CRC32C` as
/// `pg_crc32c_sb8.c` defines it, without tables or SIMD.
fn crc32c_bitwise(crc: u32, bytes: &[u8]) -> u32 {
    bytes.iter().fold(crc, |mut c, &b| {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82F6_3B78
            } else {
                c >> 1
            };
        }
        c
    })
}

#[test]
fn record_crc_is_postgres_crc32c_over_the_body_then_the_header() {
    use crate::walcodec::testgen::{Entropy, Rng};
    // The reference itself gives CRC-32C's check value.
    assert_eq!(!crc32c_bitwise(!0, b"123456789"), 0xE306_9283);
    let mut rng = Rng::new(12);
    // Lengths on both sides of the carry-less multiplication paths' block sizes, up to a
    // record of several pages.
    for body in [
        0, 1, 7, 8, 9, 15, 16, 31, 63, 64, 127, 128, 200, 255, 256, 1000, 8168, 40_000,
    ] {
        let rec = rng.bytes(REC_HDR + body);
        // INIT_CRC32C, COMP_CRC32C over the body, then over the header to xl_crc, FIN_CRC32C.
        let want = !crc32c_bitwise(crc32c_bitwise(!0, &rec[REC_HDR..]), &rec[..20]);
        assert_eq!(record_crc(&rec), want, "record of {} bytes", rec.len());
    }
}
