//! `spool.state`: what the spool had made durable (see the module docs of `spool` for the
//! format). Written through a temporary file and a rename, so it is always whole.

use std::path::Path;

use walrelay_wal::lsn::{Lsn, TimeLineId};

use super::files::write_atomically;
use super::SpoolError;

pub const STATE_FILE: &str = "spool.state";
const MAGIC: &str = "walrelay-spool 1";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpoolState {
    pub system_id: u64,
    pub seg_size: u64,
    pub tli: TimeLineId,
    pub end: Lsn,
    pub tail: u64,
}

impl SpoolState {
    fn render(&self) -> String {
        format!(
            "{MAGIC} system={} segsize={} tli={} end={} tail={:016x}\n",
            self.system_id, self.seg_size, self.tli.0, self.end, self.tail
        )
    }

    fn parse(s: &str) -> Option<SpoolState> {
        let rest = s.trim_end().strip_prefix(MAGIC)?;
        let mut st = SpoolState {
            system_id: 0,
            seg_size: 0,
            tli: TimeLineId(0),
            end: Lsn(0),
            tail: 0,
        };
        let mut seen = 0;
        for kv in rest.split_whitespace() {
            let (k, v) = kv.split_once('=')?;
            match k {
                "system" => st.system_id = v.parse().ok()?,
                "segsize" => st.seg_size = v.parse().ok()?,
                "tli" => st.tli = TimeLineId(v.parse().ok()?),
                "end" => st.end = v.parse().ok()?,
                "tail" => st.tail = u64::from_str_radix(v, 16).ok()?,
                _ => return None,
            }
            seen += 1;
        }
        (seen == 5).then_some(st)
    }
}

/// The state in `dir`, or None for a new spool.
pub fn read(dir: &Path) -> Result<Option<SpoolState>, SpoolError> {
    let path = dir.join(STATE_FILE);
    match std::fs::read(&path) {
        Ok(b) => {
            let s = String::from_utf8_lossy(&b);
            SpoolState::parse(&s).map(Some).ok_or_else(|| {
                SpoolError::Invalid(
                    path,
                    format!(
                        "unreadable state {:?}; remove the spool directory's contents to start over",
                        walrelay_pgwire::clip(&s, 200)
                    ),
                )
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(cause) => Err(SpoolError::Io { path, cause }),
    }
}

pub fn write(dir: &Path, st: &SpoolState) -> Result<(), SpoolError> {
    write_atomically(dir, STATE_FILE, st.render().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_and_refuses_garbage() {
        let st = SpoolState {
            system_id: 7_312_345_678_901_234_567,
            seg_size: 16 << 20,
            tli: TimeLineId(3),
            end: Lsn(0x5_0000_1234),
            tail: 0xdead_beef,
        };
        assert_eq!(SpoolState::parse(&st.render()), Some(st.clone()));
        for bad in [
            "",
            "walrelay-spool 1",
            "walrelay-spool 2 system=1 segsize=1 tli=1 end=0/0 tail=0",
            &st.render().replace("tli=3", "tli=x"),
        ] {
            assert_eq!(SpoolState::parse(bad), None, "{bad:?}");
        }
        // A file that is not even text: the same advice as for garbage text.
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(STATE_FILE), [0xff, 0xfe, 0, 1]).unwrap();
        let e = read(d.path()).unwrap_err().to_string();
        assert!(e.contains("remove the spool directory's contents"), "{e}");
    }
}
