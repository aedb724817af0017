//! `spool.state`: its line, its two slots, a torn write, the format before slots.

use super::*;

fn st(end: u64) -> SpoolState {
    SpoolState {
        system_id: 7_312_345_678_901_234_567,
        seg_size: 16 << 20,
        tli: TimeLineId(3),
        end: Lsn(end),
        tail: 0xdead_beef,
    }
}

#[test]
fn state_round_trips_and_refuses_garbage() {
    let st = st(0x5_0000_1234);
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

/// Every write is read back; after the first (both slots, the file replaced) each goes to
/// the slot of the one before the last, in place, so the file stays the same inode.
#[test]
fn each_write_is_read_back_and_later_ones_go_in_place() {
    use std::os::unix::fs::MetadataExt;
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join(STATE_FILE);
    let f = StateFile::new(d.path());
    assert_eq!(read(d.path()).unwrap(), None);
    f.write(&st(100)).unwrap();
    assert_eq!(read(d.path()).unwrap(), Some(st(100)));
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), 2 * SLOT);
    assert_eq!(parse_slot(&bytes[..SLOT]), Some((0, st(100))));
    assert_eq!(parse_slot(&bytes[SLOT..]), Some((1, st(100))));
    let inode = std::fs::metadata(&path).unwrap().ino();
    for end in [200, 300, 400] {
        f.write(&st(end)).unwrap();
        assert_eq!(read(d.path()).unwrap(), Some(st(end)));
    }
    assert_eq!(std::fs::metadata(&path).unwrap().ino(), inode);
    let bytes = std::fs::read(&path).unwrap();
    // Writes 2, 3, 4: slot 0 holds the last (4), slot 1 the one before (3).
    assert_eq!(parse_slot(&bytes[..SLOT]), Some((4, st(400))));
    assert_eq!(parse_slot(&bytes[SLOT..]), Some((3, st(300))));
    // A new process (a new writer) replaces the file first, then writes in place again.
    let again = StateFile::new(d.path());
    again.write(&st(500)).unwrap();
    assert_ne!(std::fs::metadata(&path).unwrap().ino(), inode);
    again.write(&st(600)).unwrap();
    assert_eq!(read(d.path()).unwrap(), Some(st(600)));
}

/// A crash that tears the write in place leaves a slot whose check fails: the other slot,
/// the state before, is read. Both torn: an error that says what to do.
#[test]
fn a_torn_slot_leaves_the_state_before_it() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join(STATE_FILE);
    let f = StateFile::new(d.path());
    f.write(&st(100)).unwrap();
    f.write(&st(200)).unwrap();
    // Write 2 is in slot 0; tear it halfway through its line.
    let mut bytes = std::fs::read(&path).unwrap();
    let good = bytes.clone();
    bytes[30..SLOT].fill(0);
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(read(d.path()).unwrap(), Some(st(100)));
    // One changed byte of the line is as torn as a cut one.
    let mut flipped = good.clone();
    let at = flipped.iter().position(|b| *b == b'=').unwrap() + 1;
    flipped[at] ^= 1;
    std::fs::write(&path, &flipped).unwrap();
    assert_eq!(read(d.path()).unwrap(), Some(st(100)));
    // Both torn.
    bytes[SLOT + 30..].fill(0);
    std::fs::write(&path, &bytes).unwrap();
    let e = read(d.path()).unwrap_err().to_string();
    assert!(e.contains("remove the spool directory's contents"), "{e}");
    assert!(!e.contains('\0'), "{e:?}");
}

/// A spool written before slots (one line, replaced atomically) is read, and the next write
/// replaces it with the slotted file.
#[test]
fn the_one_line_file_of_earlier_versions_is_read_and_replaced() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join(STATE_FILE);
    std::fs::write(&path, format!("{}\n", st(100).render())).unwrap();
    assert_eq!(read(d.path()).unwrap(), Some(st(100)));
    StateFile::new(d.path()).write(&st(200)).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * SLOT as u64);
    assert_eq!(read(d.path()).unwrap(), Some(st(200)));
}
