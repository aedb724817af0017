//! Result sets a walsender sends, byte for byte as PostgreSQL's `walsender.c` builds them:
//! RowDescription, DataRow (text format), CommandComplete. The downstream answers these
//! commands itself, from its spool.
//!
//! ```text
//! IDENTIFY_SYSTEM    systemid text, timeline int4, xlogpos text, dbname text (NULL)
//! TIMELINE_HISTORY   filename text, content bytea (the file's raw bytes)
//! end of a timeline  next_tli int8, next_tli_startpos text   then CommandComplete START_STREAMING
//! SHOW name          name text
//! ```

use bytes::{BufMut, BytesMut};

use crate::encode;
use walrelay_wal::lsn::{Lsn, TimeLineId};

/// Type oids and lengths of the columns walsender uses.
pub const TEXT: (u32, i16) = (25, -1);
pub const INT4: (u32, i16) = (23, 4);
pub const INT8: (u32, i16) = (20, 8);
pub const BYTEA: (u32, i16) = (17, -1);

/// RowDescription of columns `(name, (type oid, typlen))`.
pub fn row_description(out: &mut BytesMut, cols: &[(&str, (u32, i16))]) {
    encode::tagged(out, b'T', |b| {
        b.put_u16(cols.len() as u16);
        for (name, (oid, len)) in cols {
            b.put_slice(name.as_bytes());
            b.put_u8(0);
            b.put_u32(0); // table oid
            b.put_u16(0); // attnum
            b.put_u32(*oid);
            b.put_i16(*len);
            b.put_i32(-1); // typmod
            b.put_u16(0); // text format
        }
    });
}

/// DataRow of values (None: NULL).
pub fn data_row(out: &mut BytesMut, values: &[Option<&[u8]>]) {
    encode::tagged(out, b'D', |b| {
        b.put_u16(values.len() as u16);
        for v in values {
            match v {
                Some(v) => {
                    b.put_u32(v.len() as u32);
                    b.put_slice(v);
                }
                None => b.put_i32(-1),
            }
        }
    });
}

pub fn command_complete(out: &mut BytesMut, tag: &str) {
    encode::tagged(out, b'C', |b| {
        b.put_slice(tag.as_bytes());
        b.put_u8(0);
    });
}

/// IDENTIFY_SYSTEM's answer (without ReadyForQuery).
pub fn identify_system(out: &mut BytesMut, system_id: u64, tli: TimeLineId, xlogpos: Lsn) {
    row_description(
        out,
        &[
            ("systemid", TEXT),
            ("timeline", INT4),
            ("xlogpos", TEXT),
            ("dbname", TEXT),
        ],
    );
    let (s, t, x) = (
        system_id.to_string(),
        tli.0.to_string(),
        xlogpos.to_string(),
    );
    data_row(
        out,
        &[
            Some(s.as_bytes()),
            Some(t.as_bytes()),
            Some(x.as_bytes()),
            None,
        ],
    );
    command_complete(out, "IDENTIFY_SYSTEM");
}

/// TIMELINE_HISTORY's answer (without ReadyForQuery).
pub fn timeline_history(out: &mut BytesMut, file_name: &str, content: &[u8]) {
    row_description(out, &[("filename", TEXT), ("content", BYTEA)]);
    data_row(out, &[Some(file_name.as_bytes()), Some(content)]);
    command_complete(out, "TIMELINE_HISTORY");
}

/// What ends START_REPLICATION of an older timeline: where the next one starts, then
/// CommandComplete (without ReadyForQuery).
pub fn next_timeline(out: &mut BytesMut, next: TimeLineId, start: Lsn) {
    row_description(out, &[("next_tli", INT8), ("next_tli_startpos", TEXT)]);
    let (t, s) = (next.0.to_string(), start.to_string());
    data_row(out, &[Some(t.as_bytes()), Some(s.as_bytes())]);
    command_complete(out, "START_STREAMING");
}

/// SHOW's answer (without ReadyForQuery).
pub fn show(out: &mut BytesMut, name: &str, value: &str) {
    row_description(out, &[(name, TEXT)]);
    data_row(out, &[Some(value.as_bytes())]);
    command_complete(out, "SHOW");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse_tagged, RawMsg};

    fn msgs(mut b: BytesMut) -> Vec<RawMsg> {
        let mut v = Vec::new();
        while let Some(m) = parse_tagged(&mut b, |_| 1 << 20).unwrap() {
            v.push(m);
        }
        assert!(b.is_empty());
        v
    }

    #[test]
    fn identify_system_reads_back() {
        let mut out = BytesMut::new();
        identify_system(
            &mut out,
            7_300_000_000_000_000_001,
            TimeLineId(3),
            Lsn(0x1_0000_0028),
        );
        let m = msgs(out);
        assert_eq!(m.iter().map(|m| m.tag).collect::<Vec<_>>(), b"TDC");
        let row = m[1].data_row().unwrap();
        assert_eq!(row[0], Some(&b"7300000000000000001"[..]));
        assert_eq!(row[1], Some(&b"3"[..]));
        assert_eq!(row[2], Some(&b"1/28"[..]));
        assert_eq!(row[3], None);
        assert_eq!(&m[2].body[..], b"IDENTIFY_SYSTEM\0");
        // RowDescription: 4 columns, the second an int4 of 4 bytes.
        assert_eq!(&m[0].body[..2], &[0, 4]);
    }

    #[test]
    fn history_and_next_timeline() {
        let mut out = BytesMut::new();
        timeline_history(&mut out, "00000002.history", b"1\t0/3000000\tx\n");
        next_timeline(&mut out, TimeLineId(2), Lsn(0x3000000));
        show(&mut out, "wal_segment_size", "16MB");
        let m = msgs(out);
        assert_eq!(m.iter().map(|m| m.tag).collect::<Vec<_>>(), b"TDCTDCTDC");
        assert_eq!(m[1].data_row().unwrap()[1], Some(&b"1\t0/3000000\tx\n"[..]));
        assert_eq!(
            m[4].data_row().unwrap(),
            vec![Some(&b"2"[..]), Some(&b"0/3000000"[..])]
        );
        assert_eq!(&m[5].body[..], b"START_STREAMING\0");
        assert_eq!(m[7].data_row().unwrap(), vec![Some(&b"16MB"[..])]);
    }
}
