//! [`LoggedTuple`]: a heap record's new tuple, as PostgreSQL logs it.

use super::super::wal::le16;
use super::SIZE_HEAP_HEADER;
use super::TUPLE_HEADER;

/// The new tuple of a heap INSERT or UPDATE as its block data carries it: PostgreSQL's
/// prefix and suffix lengths (each there when its flag is set), the xl_heap_header
/// (infomask2, infomask, t_hoff), then from t_bits on without the user data the tuple shares
/// with the old one. The encoder's tuple cache and both ends' page replay (`redo.rs`) read it
/// the same way.
pub(in crate::walcodec) struct LoggedTuple<'a> {
    pub prefix: usize,
    pub suffix: usize,
    /// The xl_heap_header, SIZE_HEAP_HEADER bytes.
    pub hdr: &'a [u8],
    pub body: &'a [u8],
}

impl<'a> LoggedTuple<'a> {
    pub fn parse(d: &'a [u8], has_prefix: bool, has_suffix: bool) -> Option<LoggedTuple<'a>> {
        let mut p = 0;
        let mut field = |on: bool| -> Option<usize> {
            if !on {
                return Some(0);
            }
            let v = le16(d, p)?;
            p += 2;
            Some(usize::from(v))
        };
        let prefix = field(has_prefix)?;
        let suffix = field(has_suffix)?;
        let hdr = d.get(p..p + SIZE_HEAP_HEADER)?;
        Some(LoggedTuple {
            prefix,
            suffix,
            hdr,
            body: &d[p + SIZE_HEAP_HEADER..],
        })
    }

    /// Appends to `out` the tuple from t_bits on with the shared prefix and suffix taken
    /// from the old tuple's user data: bitmap (t_hoff - 23 bytes) ++ prefix ++ the logged
    /// rest ++ suffix. False (`out` as it was) when the lengths do not fit.
    pub fn expand_onto(&self, old_user: &[u8], out: &mut Vec<u8>) -> bool {
        let body = self.body;
        let Some(bitmap) = usize::from(self.hdr[4])
            .checked_sub(TUPLE_HEADER)
            .filter(|&b| b <= body.len())
        else {
            return false;
        };
        let (prefix, suffix) = (self.prefix, self.suffix);
        if prefix + suffix > old_user.len() {
            return false;
        }
        out.reserve(body.len() + prefix + suffix);
        out.extend_from_slice(&body[..bitmap]);
        out.extend_from_slice(&old_user[..prefix]);
        out.extend_from_slice(&body[bitmap..]);
        out.extend_from_slice(&old_user[old_user.len() - suffix..]);
        true
    }
}
