use super::*;

#[test]
fn xlogdata_ends_where_the_primary_ended_or_on_a_page_boundary() {
    let max = MAX_SEND as u64;
    // Within one message: up to the limit, wherever it is.
    assert_eq!(send_end(Lsn(0x100), Lsn(0x2345)), Lsn(0x2345));
    assert_eq!(send_end(Lsn(0x100), Lsn(0x100 + max)), Lsn(0x100 + max));
    // Further: the last page boundary within MAX_SEND, never an arbitrary cut.
    assert_eq!(send_end(Lsn(0x403_BD48), Lsn(0x500_0000)), Lsn(0x405_A000));
    assert_eq!(send_end(Lsn(0x2000), Lsn(0x100_0000)), Lsn(0x2000 + max));
    // Every cut is past the start, page-aligned, and at most MAX_SEND long.
    for pos in [0, 1, 0x1fff, 0x2000, 0x2001, 0x403_BD48, u64::MAX / 2] {
        let end = send_end(Lsn(pos), Lsn(pos + 3 * max));
        assert!(end.0 > pos && end.0 - pos <= max, "{pos:#x} -> {end}");
        assert_eq!(end.0 % WAL_PAGE, 0, "{pos:#x} -> {end}");
    }
    assert_eq!(send_end(Lsn(7), Lsn(7)), Lsn(7));
}

#[test]
fn the_current_timeline_is_never_sent_up_to_just_a_page_header() {
    let seg = WalSegSize::DEFAULT;
    let segment = seg.bytes();
    // A page's short header alone, or part of it: held back to the page's start.
    for at in [0x87F_E018, 0x87F_E001, 0x87F_E010] {
        assert_eq!(send_limit(None, Lsn(at), seg), Lsn(0x87F_E000), "{at:#x}");
    }
    // A segment's first page: its long header alone, or part of it.
    for k in [1, 24, 40] {
        let at = 9 * segment + k;
        assert_eq!(send_limit(None, Lsn(at), seg), Lsn(9 * segment), "{at:#x}");
    }
    // Anything else goes: a page boundary, bytes past a header, a record's end.
    for at in [
        0x87F_E000,
        0x87F_E019,
        0x87F_E030,
        0x87F_DFFA,
        9 * segment + 41,
        9 * segment + 0x2018 + 8,
    ] {
        assert_eq!(send_limit(None, Lsn(at), seg), Lsn(at), "{at:#x}");
    }
    // The page after a segment's first has a short header.
    assert_eq!(
        send_limit(None, Lsn(9 * segment + 0x2028), seg),
        Lsn(9 * segment + 0x2028)
    );
    assert_eq!(
        send_limit(None, Lsn(9 * segment + 0x2018), seg),
        Lsn(9 * segment + 0x2000)
    );
    // An older timeline ends at its switchpoint, wherever that is.
    let h = Historic {
        end: Lsn(0x87F_E018),
        next: TimeLineId(2),
    };
    assert_eq!(send_limit(Some(h), Lsn(0x900_0000), seg), Lsn(0x87F_E018));
}

#[test]
fn only_an_error_without_ready_for_query_is_a_start_refusal() {
    let refusal = {
        let mut b = BytesMut::new();
        encode::error_response(
            &mut b,
            &ErrorFields::error("42704", "replication slot \"x\" does not exist"),
        );
        b
    };
    let e = start_refused(&refusal).unwrap();
    assert_eq!(e.code, "42704");
    // A command's late answer ends with ReadyForQuery: not a refusal of the START.
    let mut answer = refusal.clone();
    encode::ready_for_query(&mut answer);
    assert!(start_refused(&answer).is_none());
    assert!(start_refused(b"").is_none());
    assert!(start_refused(b"garbage").is_none());
}
