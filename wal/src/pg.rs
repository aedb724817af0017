//! The PostgreSQL majors walrelay understands, and the WAL format facts that differ between
//! them, written once.
//!
//! | major | XLOG_PAGE_MAGIC | bimg_info: compressed                          | bimg_info: BKPIMAGE_APPLY |
//! |-------|-----------------|------------------------------------------------|---------------------------|
//! | 14    | 0xD10D          | BKPIMAGE_IS_COMPRESSED 0x02 (pglz only)        | 0x04                      |
//! | 15    | 0xD110          | BKPIMAGE_COMPRESS_PGLZ 0x04, _LZ4 0x08, _ZSTD 0x10 | 0x02                  |
//! | 16    | 0xD113          | as 15                                          | 0x02                      |
//! | 17    | 0xD116          | as 15                                          | 0x02                      |
//! | 18    | 0xD118          | as 15                                          | 0x02                      |
//!
//! Sources: `src/include/access/xlog_internal.h` (XLOG_PAGE_MAGIC) and
//! `src/include/access/xlogrecord.h` (bimg_info) on each release branch, REL_14 to REL_18.
//!
//! Where a major is not known (an older or newer primary, no `server_version`), walrelay has an
//! `Option<PgMajor>` that is `None`: the WAL codec then passes every byte through raw. On the
//! link (`Welcome.pg_major`) the major travels as a `u32`, 0 meaning unknown
//! ([`PgMajor::from_wire`], [`PgMajor::to_wire`]).

use std::fmt;

/// A PostgreSQL major version whose WAL format walrelay knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PgMajor {
    V14,
    V15,
    V16,
    V17,
    V18,
}

/// A major version number outside the supported range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "PostgreSQL {0} is not supported: walrelay knows the WAL format of PostgreSQL 14 to 18 \
     (other majors replicate with their WAL passed through unencoded)"
)]
pub struct UnsupportedMajor(pub u32);

impl PgMajor {
    /// Every supported major, oldest first.
    pub const ALL: [PgMajor; 5] = [
        PgMajor::V14,
        PgMajor::V15,
        PgMajor::V16,
        PgMajor::V17,
        PgMajor::V18,
    ];
    /// The oldest and newest supported majors.
    pub const OLDEST: PgMajor = PgMajor::V14;
    pub const NEWEST: PgMajor = PgMajor::V18;

    /// The major's number: 14 for PostgreSQL 14.x.
    pub const fn number(self) -> u32 {
        match self {
            PgMajor::V14 => 14,
            PgMajor::V15 => 15,
            PgMajor::V16 => 16,
            PgMajor::V17 => 17,
            PgMajor::V18 => 18,
        }
    }

    /// The supported major numbered `n`, if any.
    pub const fn from_number(n: u32) -> Option<PgMajor> {
        match n {
            14 => Some(PgMajor::V14),
            15 => Some(PgMajor::V15),
            16 => Some(PgMajor::V16),
            17 => Some(PgMajor::V17),
            18 => Some(PgMajor::V18),
            _ => None,
        }
    }

    /// The major of a `server_version` as the server reports it: "15.18 (Debian
    /// 15.18-0+deb12u1)", "18beta1", "17devel", "16rc1". `None` for an unsupported major
    /// ("13.4", "9.6.2") or a string that does not start with a number.
    pub fn from_server_version(v: &str) -> Option<PgMajor> {
        let digits = v
            .trim_start()
            .bytes()
            .take_while(u8::is_ascii_digit)
            .count();
        let n: u32 = v.trim_start().get(..digits)?.parse().ok()?;
        PgMajor::from_number(n)
    }

    /// The major as `Welcome.pg_major` carries it on the link: 0 (or any unsupported number)
    /// means unknown.
    pub const fn from_wire(n: u32) -> Option<PgMajor> {
        PgMajor::from_number(n)
    }

    /// `Welcome.pg_major` for an optional major: its number, or 0 for unknown.
    pub const fn to_wire(m: Option<PgMajor>) -> u32 {
        match m {
            Some(m) => m.number(),
            None => 0,
        }
    }

    /// XLOG_PAGE_MAGIC: the first two bytes of every WAL page header of this major.
    pub const fn page_magic(self) -> u16 {
        match self {
            PgMajor::V14 => 0xD10D,
            PgMajor::V15 => 0xD110,
            PgMajor::V16 => 0xD113,
            PgMajor::V17 => 0xD116,
            PgMajor::V18 => 0xD118,
        }
    }

    /// Mask of the bimg_info bits that mean "compressed": PG 14 has one flag
    /// (BKPIMAGE_IS_COMPRESSED 0x02), PG 15+ one per method (PGLZ 0x04, LZ4 0x08, ZSTD 0x10).
    pub const fn bimg_compressed_mask(self) -> u8 {
        match (self.bimg_lz4(), self.bimg_zstd()) {
            (Some(lz4), Some(zstd)) => self.bimg_pglz() | lz4 | zstd,
            _ => self.bimg_pglz(),
        }
    }

    /// The bimg_info flag of an image compressed with pglz (BKPIMAGE_IS_COMPRESSED 0x02 in
    /// PG 14, BKPIMAGE_COMPRESS_PGLZ 0x04 after).
    pub const fn bimg_pglz(self) -> u8 {
        match self {
            PgMajor::V14 => 0x02,
            _ => 0x04,
        }
    }

    /// The bimg_info flag of an image compressed with lz4 (BKPIMAGE_COMPRESS_LZ4), from PG 15.
    pub const fn bimg_lz4(self) -> Option<u8> {
        match self {
            PgMajor::V14 => None,
            _ => Some(0x08),
        }
    }

    /// The bimg_info flag of an image compressed with zstd (BKPIMAGE_COMPRESS_ZSTD), from
    /// PG 15.
    pub const fn bimg_zstd(self) -> Option<u8> {
        match self {
            PgMajor::V14 => None,
            _ => Some(0x10),
        }
    }

    /// BKPIMAGE_APPLY: the image is to be restored at replay (0x04 in PG 14, 0x02 after).
    pub const fn bimg_apply(self) -> u8 {
        match self {
            PgMajor::V14 => 0x04,
            _ => 0x02,
        }
    }
}

impl TryFrom<u32> for PgMajor {
    type Error = UnsupportedMajor;
    fn try_from(n: u32) -> Result<PgMajor, UnsupportedMajor> {
        PgMajor::from_number(n).ok_or(UnsupportedMajor(n))
    }
}

impl From<PgMajor> for u32 {
    fn from(m: PgMajor) -> u32 {
        m.number()
    }
}

/// The number, as PostgreSQL writes a major: "15".
impl fmt::Display for PgMajor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.number())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_round_trip_and_only_14_to_18_are_known() {
        for m in PgMajor::ALL {
            assert_eq!(PgMajor::from_number(m.number()), Some(m));
            assert_eq!(PgMajor::try_from(m.number()), Ok(m));
            assert_eq!(PgMajor::from_wire(PgMajor::to_wire(Some(m))), Some(m));
            assert_eq!(m.to_string(), m.number().to_string());
        }
        for n in [0, 9, 13, 19, 140, u32::MAX] {
            assert_eq!(PgMajor::from_number(n), None, "{n}");
            assert_eq!(PgMajor::try_from(n), Err(UnsupportedMajor(n)));
        }
        assert_eq!(PgMajor::to_wire(None), 0);
        assert_eq!(PgMajor::from_wire(0), None);
        assert!(PgMajor::V14 < PgMajor::V15 && PgMajor::V17 < PgMajor::NEWEST);
        assert_eq!(PgMajor::ALL[0], PgMajor::OLDEST);
    }

    #[test]
    fn server_versions_as_servers_report_them() {
        for (v, want) in [
            ("15.18 (Debian 15.18-0+deb12u1)", Some(PgMajor::V15)),
            ("14.0", Some(PgMajor::V14)),
            ("16.4", Some(PgMajor::V16)),
            ("17devel", Some(PgMajor::V17)),
            ("18beta1", Some(PgMajor::V18)),
            ("18rc1", Some(PgMajor::V18)),
            ("13.16", None),
            ("9.6.24", None),
            ("19devel", None),
            ("", None),
            ("beta", None),
            ("99999999999999999999", None),
        ] {
            assert_eq!(PgMajor::from_server_version(v), want, "{v:?}");
        }
    }

    #[test]
    fn page_magics_differ_per_major() {
        let magics: Vec<u16> = PgMajor::ALL.iter().map(|m| m.page_magic()).collect();
        assert_eq!(magics, [0xD10D, 0xD110, 0xD113, 0xD116, 0xD118]);
        let v14 = PgMajor::V14;
        assert_eq!(v14.bimg_compressed_mask(), 0x02);
        assert_eq!(
            (v14.bimg_pglz(), v14.bimg_lz4(), v14.bimg_zstd()),
            (0x02, None, None)
        );
        assert_eq!(v14.bimg_apply(), 0x04);
        for m in &PgMajor::ALL[1..] {
            assert_eq!(m.bimg_compressed_mask(), 0x1C);
            assert_eq!(
                (m.bimg_pglz(), m.bimg_lz4(), m.bimg_zstd()),
                (0x04, Some(0x08), Some(0x10))
            );
            assert_eq!(m.bimg_apply(), 0x02);
            assert_eq!(m.bimg_apply() & m.bimg_compressed_mask(), 0);
        }
    }
}
