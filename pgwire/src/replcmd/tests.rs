use super::*;
use proptest::prelude::*;

fn start(slot: Option<&str>, lsn: u64, tli: Option<u32>) -> ReplCommand {
    ReplCommand::StartReplication {
        slot: slot.map(str::to_string),
        start: Lsn(lsn),
        timeline: tli.map(TimeLineId),
    }
}

#[test]
fn real_client_commands() {
    let cases = [
        ("IDENTIFY_SYSTEM", ReplCommand::IdentifySystem),
        (
            "SHOW wal_segment_size",
            ReplCommand::Show("wal_segment_size".into()),
        ),
        (
            "SHOW data_directory_mode",
            ReplCommand::Show("data_directory_mode".into()),
        ),
        (
            "TIMELINE_HISTORY 2",
            ReplCommand::TimelineHistory(TimeLineId(2)),
        ),
        (
            "READ_REPLICATION_SLOT x",
            ReplCommand::ReadReplicationSlot("x".into()),
        ),
        (
            "START_REPLICATION 0/3000000 TIMELINE 1",
            start(None, 0x300_0000, Some(1)),
        ),
        (
            "START_REPLICATION SLOT \"s1\" 0/3000000 TIMELINE 1",
            start(Some("s1"), 0x300_0000, Some(1)),
        ),
        // libpqwalreceiver leaves two spaces after the slot name.
        (
            "START_REPLICATION SLOT \"s1\"  0/3000000 TIMELINE 1",
            start(Some("s1"), 0x300_0000, Some(1)),
        ),
        (
            "START_REPLICATION SLOT \"x\" 0/1000000 TIMELINE 1",
            start(Some("x"), 0x100_0000, Some(1)),
        ),
    ];
    for (sql, want) in cases {
        assert_eq!(parse(sql), Ok(want), "{sql}");
    }
}

#[test]
fn lexical_variants() {
    let cases = [
        ("  IDENTIFY_SYSTEM ;\n", ReplCommand::IdentifySystem),
        ("IDENTIFY_SYSTEM;", ReplCommand::IdentifySystem),
        (
            "SHOW\n\tWAL_Segment_Size",
            ReplCommand::Show("wal_segment_size".into()),
        ),
        ("SHOW \"Foo\".bar", ReplCommand::Show("foo.bar".into())),
        ("SHOW foo . \"b.c\"", ReplCommand::Show("foo.b.c".into())),
        ("SHOW timeline", ReplCommand::Show("timeline".into())),
        (
            "READ_REPLICATION_SLOT MySlot",
            ReplCommand::ReadReplicationSlot("myslot".into()),
        ),
        (
            "READ_REPLICATION_SLOT \"My\"\"Slot\"",
            ReplCommand::ReadReplicationSlot("My\"Slot".into()),
        ),
        ("START_REPLICATION PHYSICAL 0/0", start(None, 0, None)),
        (
            "START_REPLICATION SLOT a$1 PHYSICAL ABC/DEF0 TIMELINE 4294967295",
            start(Some("a$1"), 0xABC_0000_DEF0, Some(u32::MAX)),
        ),
        (
            "START_REPLICATION SLOT slot\n0/1",
            start(Some("slot"), 1, None),
        ),
        (
            "START_REPLICATION SLOT physical FFFFFFFF/FFFFFFFF;",
            start(Some("physical"), u64::MAX, None),
        ),
    ];
    for (sql, want) in cases {
        assert_eq!(parse(sql), Ok(want), "{sql}");
    }
}

/// `repl_scanner.l` matches keywords in capitals only: any other spelling is an identifier, so
/// as a command's first word it is SQL (refused on a physical connection), and in the middle
/// of one a syntax error, as PostgreSQL answers.
#[test]
fn keywords_count_in_capitals_only() {
    for (sql, word) in [
        ("identify_system", "identify_system"),
        ("Identify_System;", "Identify_System"),
        ("show wal_segment_size", "show"),
        ("start_replication 0/0", "start_replication"),
    ] {
        assert_eq!(
            parse(sql),
            Err(ReplCmdError::Unsupported(word.into())),
            "{sql}"
        );
    }
    for sql in [
        "START_REPLICATION slot s 0/0",
        "START_REPLICATION 0/0 timeline 1",
    ] {
        assert!(matches!(parse(sql), Err(ReplCmdError::Syntax(_))), "{sql}");
    }
}

/// Non-ASCII characters are identifier letters, as in `repl_scanner.l`: they extend a word
/// (a keyword run into one is another word) and may appear in plain identifiers, which keep
/// them as written (only ASCII letters are folded).
#[test]
fn non_ascii_letters_belong_to_identifiers() {
    assert_eq!(
        parse("SHOWé wal_segment_size"),
        Err(ReplCmdError::Unsupported("SHOWé".into()))
    );
    assert_eq!(
        parse("IDENTIFY_SYSTEM\u{85}"),
        Err(ReplCmdError::Unsupported("IDENTIFY_SYSTEM\u{85}".into()))
    );
    assert_eq!(
        parse("START_REPLICATION SLOT ÉtÉ_A 0/1"),
        Ok(start(Some("ÉtÉ_a"), 1, None))
    );
    assert_eq!(
        parse("READ_REPLICATION_SLOT s\u{e9}1"),
        Ok(ReplCommand::ReadReplicationSlot("s\u{e9}1".into()))
    );
}

#[test]
fn unsupported_commands() {
    for (sql, kw) in [
        ("BASE_BACKUP (LABEL 'x')", "BASE_BACKUP"),
        (
            "CREATE_REPLICATION_SLOT s PHYSICAL RESERVE_WAL",
            "CREATE_REPLICATION_SLOT",
        ),
        ("DROP_REPLICATION_SLOT s WAIT", "DROP_REPLICATION_SLOT"),
        (
            "ALTER_REPLICATION_SLOT s (FAILOVER true)",
            "ALTER_REPLICATION_SLOT",
        ),
        ("UPLOAD_MANIFEST", "UPLOAD_MANIFEST"),
        ("select * from pg_stat_replication", "select"),
        (
            "START_REPLICATION SLOT s LOGICAL 0/0 (\"proto_version\" '1')",
            LOGICAL_REPLICATION,
        ),
    ] {
        assert_eq!(
            parse(sql),
            Err(ReplCmdError::Unsupported(kw.into())),
            "{sql}"
        );
    }
    let msg = parse("CREATE_REPLICATION_SLOT s PHYSICAL")
        .unwrap_err()
        .to_string();
    assert_eq!(
        msg,
        "walrelay does not relay CREATE_REPLICATION_SLOT: run it on the primary directly"
    );
    let msg = parse("START_REPLICATION SLOT s LOGICAL 0/0")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("physical replication only"), "{msg}");
    assert!(parse("SELECT 1")
        .unwrap_err()
        .to_string()
        .contains("run it on the primary"));
}

#[test]
fn syntax_errors() {
    for sql in [
        "IDENTIFY_SYSTEM now",
        "SHOW",
        "SHOW a.",
        "SHOW \"a-b\"",
        "SHOW \"é\"",
        "SHOW \"\"",
        "TIMELINE_HISTORY",
        "TIMELINE_HISTORY 0",
        "TIMELINE_HISTORY 4294967296",
        "TIMELINE_HISTORY -1",
        "TIMELINE_HISTORY 1.5",
        "START_REPLICATION",
        "START_REPLICATION SLOT 0/0",
        "START_REPLICATION 0/",
        "START_REPLICATION 0 / 1",
        "START_REPLICATION 123456789/0",
        "START_REPLICATION 0/0 TIMELINE 0",
        "START_REPLICATION 0/0 TIMELINE",
        "START_REPLICATION PHYSICAL PHYSICAL 0/0",
        "READ_REPLICATION_SLOT \"unterminated",
        "READ_REPLICATION_SLOT \"nul\0\"",
        "READ_REPLICATION_SLOT a.b",
        "IDENTIFY_SYSTEM;;",
        "\"IDENTIFY_SYSTEM\"",
        "0/0",
        "(SELECT 1)",
        "IDENTIFY_SYSTEM -- comment",
    ] {
        assert!(
            matches!(parse(sql), Err(ReplCmdError::Syntax(_))),
            "{sql:?}: {:?}",
            parse(sql)
        );
    }
    let long_slot = format!("READ_REPLICATION_SLOT {}", "a".repeat(64));
    assert!(matches!(parse(&long_slot), Err(ReplCmdError::Syntax(_))));
    let ok_slot = format!("READ_REPLICATION_SLOT {}", "a".repeat(63));
    assert!(parse(&ok_slot).is_ok());
    let huge = format!("IDENTIFY_SYSTEM{}", " ".repeat(MAX_COMMAND_LEN));
    assert!(matches!(parse(&huge), Err(ReplCmdError::Syntax(_))));
    for sql in ["", "  \n ", ";", " ; "] {
        assert_eq!(parse(sql), Err(ReplCmdError::Empty), "{sql:?}");
    }
}

#[test]
fn rendering() {
    assert_eq!(
        start(Some("s1"), 0x300_0000, Some(1)).to_sql(),
        "START_REPLICATION SLOT \"s1\" 0/3000000 TIMELINE 1"
    );
    assert_eq!(
        start(None, 0x300_0000, None).to_sql(),
        "START_REPLICATION 0/3000000"
    );
    assert_eq!(
        ReplCommand::ReadReplicationSlot("a\"b".into()).to_sql(),
        "READ_REPLICATION_SLOT \"a\"\"b\""
    );
    assert_eq!(
        ReplCommand::Show("wal_segment_size".into()).to_sql(),
        "SHOW wal_segment_size"
    );
    assert_eq!(
        ReplCommand::Show("timeline".into()).to_sql(),
        "SHOW \"timeline\""
    );
    assert_eq!(
        ReplCommand::Show("ext.9x".into()).to_sql(),
        "SHOW ext.\"9x\""
    );
    assert_eq!(ReplCommand::Show("a..b".into()).to_sql(), "SHOW \"a..b\"");
    assert_eq!(
        ReplCommand::TimelineHistory(TimeLineId(2)).to_sql(),
        "TIMELINE_HISTORY 2"
    );
}

fn show_name() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::collection::vec("[a-z0-9_$]{1,12}", 1..4).prop_map(|v| v.join(".")),
        "[a-z0-9_.]{1,63}",
    ]
    .prop_filter("$ is not allowed in SHOW", |s| !s.contains('$'))
    .prop_filter("every dot-separated part is a name", |s| {
        s.split('.').all(|p| !p.is_empty())
    })
}

fn slot() -> impl Strategy<Value = String> {
    "[^\\x00]{1,15}".prop_filter("at most 63 bytes", |s| s.len() <= MAX_IDENT_LEN)
}

fn command() -> impl Strategy<Value = ReplCommand> {
    prop_oneof![
        Just(ReplCommand::IdentifySystem),
        show_name().prop_map(ReplCommand::Show),
        (1..=u32::MAX).prop_map(|t| ReplCommand::TimelineHistory(TimeLineId(t))),
        (
            proptest::option::of(slot()),
            any::<u64>(),
            proptest::option::of(1..=u32::MAX)
        )
            .prop_map(|(slot, lsn, tli)| ReplCommand::StartReplication {
                slot,
                start: Lsn(lsn),
                timeline: tli.map(TimeLineId),
            }),
        slot().prop_map(ReplCommand::ReadReplicationSlot),
    ]
}

proptest! {
    #[test]
    fn round_trip(cmd in command()) {
        prop_assert_eq!(parse(&cmd.to_sql()), Ok(cmd));
    }

    #[test]
    fn arbitrary_text_never_panics(sql in "(?s).{0,200}") {
        let _ = parse(&sql);
    }

    #[test]
    fn token_soup_never_panics(words in proptest::collection::vec(prop_oneof![
        Just("START_REPLICATION"), Just("SLOT"), Just("PHYSICAL"), Just("LOGICAL"),
        Just("TIMELINE"), Just("SHOW"), Just("TIMELINE_HISTORY"), Just("READ_REPLICATION_SLOT"),
        Just("0/1"), Just("1"), Just("\""), Just("\"\""), Just("."), Just(";"), Just("x"),
        Just("\"a\"\"b\""), Just("ffffffffff/1"), Just("99999999999"), Just("é"),
    ], 0..8)) {
        let _ = parse(&words.join(" "));
        let _ = parse(&words.concat());
    }
}

/// Found by the replcmd fuzz target: a quoted part with an empty dotted component used to
/// parse but not round-trip.
#[test]
fn show_names_with_empty_components_are_refused() {
    let sql = format!("SHOW \"a..b\".{}", "c".repeat(60));
    assert!(matches!(parse(&sql), Err(ReplCmdError::Syntax(_))));
    assert!(matches!(parse("SHOW \".x\""), Err(ReplCmdError::Syntax(_))));
    assert_eq!(parse("SHOW \"a.b\""), Ok(ReplCommand::Show("a.b".into())));
    let cmd = parse("SHOW \"a.b\"").unwrap();
    assert_eq!(parse(&cmd.to_sql()), Ok(cmd));
}
