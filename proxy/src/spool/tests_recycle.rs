//! The spool's recycled segments ([`super::recycle`]): reused whole, written over with the
//! right bytes, cut at the synced end after a crash, and a read that raced a recycling fails.

use std::os::unix::fs::MetadataExt;

use super::tests::{fill, names, open, wal, MIB, T1};
use super::*;

fn inode(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().ino()
}

fn segment(n: u64) -> String {
    format!("0000000100000000000000{n:02X}")
}

#[test]
fn retention_hands_the_oldest_segments_on_to_be_written_over_as_new_ones() {
    let d = tempfile::tempdir().unwrap();
    let mut s = open(d.path(), 42, 2 * MIB);
    fill(&mut s, 0, 2 * MIB + 10);
    let old = [0, 1].map(|n| inode(&d.path().join(segment(n))));
    // Each segment beyond the cap went for reuse and came back as the next new one.
    fill(&mut s, 2 * MIB + 10, 4 * MIB + 10);
    let partial = d.path().join(format!("{}.partial", segment(4)));
    assert_eq!(
        names(d.path()),
        [
            segment(2),
            segment(3),
            format!("{}.partial", segment(4)),
            "spool.state".into()
        ]
    );
    assert_eq!([inode(&d.path().join(segment(3))), inode(&partial)], old);
    assert_eq!(
        std::fs::metadata(&partial).unwrap().len(),
        MIB,
        "written over, not cut"
    );
    assert_eq!(
        &std::fs::read(&partial).unwrap()[..10],
        &wal(4 * MIB, 10)[..]
    );
    let third = std::fs::read(d.path().join(segment(3))).unwrap();
    assert!(third == wal(3 * MIB, MIB as usize), "segment 3 differs");
    fill(&mut s, 4 * MIB + 10, 7 * MIB + 20);
    for n in [5, 6] {
        let got = std::fs::read(d.path().join(segment(n))).unwrap();
        assert!(got == wal(n * MIB, MIB as usize), "segment {n} differs");
    }
    assert_eq!(s.extent().start, Lsn(5 * MIB));
    let b = s.read(T1, Lsn(7 * MIB), Lsn(7 * MIB + 20), 100).unwrap();
    assert_eq!(b, wal(7 * MIB, 20));
}

/// A recycled segment holds an old segment's bytes past the spool's end. After a crash the
/// spool reopens at the synced end, cuts them off, and goes on with the right bytes.
#[test]
fn a_crash_in_a_recycled_segment_reopens_at_the_synced_end() {
    let d = tempfile::tempdir().unwrap();
    let mut s = open(d.path(), 42, 2 * MIB);
    fill(&mut s, 0, 5 * MIB + 300_000);
    let partial = d.path().join(format!("{}.partial", segment(5)));
    assert_eq!(
        std::fs::metadata(&partial).unwrap().len(),
        MIB,
        "a recycled file"
    );
    assert_eq!(s.sync().unwrap(), Lsn(5 * MIB + 300_000));
    // Written, never synced.
    fill(&mut s, 5 * MIB + 300_000, 5 * MIB + 700_000);
    drop(s);
    let mut s = open(d.path(), 42, 2 * MIB);
    assert_eq!(s.extent().end, Lsn(5 * MIB + 300_000));
    assert_eq!(std::fs::metadata(&partial).unwrap().len(), 300_000);
    fill(&mut s, 5 * MIB + 300_000, 6 * MIB + 5);
    assert!(std::fs::read(d.path().join(segment(5))).unwrap() == wal(5 * MIB, MIB as usize));
    // Segment 6 is again a recycled file.
    let sixth = d.path().join(format!("{}.partial", segment(6)));
    assert_eq!(std::fs::metadata(sixth).unwrap().len(), MIB);
}

/// A reader that opened a segment before it was recycled and written over learns that its
/// read may hold newer bytes: the segment counts as removed. A file that kept its name (a
/// `.partial` that became complete included) passes.
#[test]
fn a_read_from_a_segment_recycled_meanwhile_fails() {
    let d = tempfile::tempdir().unwrap();
    let mut s = open(d.path(), 42, 2 * MIB);
    fill(&mut s, 0, MIB + 100);
    let files = s.files();
    let first = File::open(d.path().join(segment(0))).unwrap();
    let second = File::open(d.path().join(format!("{}.partial", segment(1)))).unwrap();
    fill(&mut s, MIB + 100, 2 * MIB + 100);
    files.still_named(T1, 0, &first).unwrap();
    files.still_named(T1, 1, &second).unwrap();
    // Segment 0 goes for reuse and becomes segment 3.
    fill(&mut s, 2 * MIB + 100, 3 * MIB + 100);
    let third = d.path().join(format!("{}.partial", segment(3)));
    assert_eq!(first.metadata().unwrap().ino(), inode(&third));
    assert!(matches!(
        files.still_named(T1, 0, &first),
        Err(SpoolError::Removed(n)) if n == segment(0)
    ));
}

/// Every new segment's name is made durable by the first sync that covers it (a directory
/// fsync), and only by that one.
#[test]
fn the_first_sync_of_a_segment_makes_its_name_durable() {
    let d = tempfile::tempdir().unwrap();
    let mut s = open(d.path(), 42, 2 * MIB);
    s.set_deferred(true);
    let names_sync = |s: &mut Spool| match s.sync_job().unwrap() {
        Some(Durability::Data { name, .. }) => name,
        other => panic!("{other:?}"),
    };
    s.append(T1, Lsn(0), &wal(0, 10)).unwrap();
    assert!(names_sync(&mut s));
    s.append(T1, Lsn(10), &wal(10, 10)).unwrap();
    assert!(!names_sync(&mut s));
    s.append(T1, Lsn(20), &wal(20, MIB as usize)).unwrap();
    assert!(names_sync(&mut s), "a new segment");
}
