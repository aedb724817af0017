//! Replication commands from a standby's Query messages.
//!
//! Properties: no panic on any text; every accepted command renders (`to_sql`) to text that
//! parses back to the same command; a command `parse` serves is classified (for a tunnel's
//! allowlist) as neither SQL nor a slot command; `classify` says SQL (or empty) exactly when
//! PostgreSQL's replication scanner does not see a replication keyword first ([`pg_keyword`]);
//! the scanner of a tunnel's backend stream finds the same tags whatever the chunking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use walrelay_pgwire::replcmd;

#[path = "../../pgwire/src/replcmd/pg_model.rs"]
mod pg_model;
use pg_model::pg_keyword;

fuzz_target!(|data: &[u8]| {
    let sql = String::from_utf8_lossy(data);
    let class = replcmd::classify(&sql);
    match pg_keyword(&sql) {
        Some(kw) => assert!(
            !matches!(class, Ok(replcmd::TunnelCmd::Sql)),
            "{sql:?} starts with {kw} to PostgreSQL, classified as SQL"
        ),
        None => assert!(
            matches!(
                class,
                Ok(replcmd::TunnelCmd::Sql) | Err(replcmd::ReplCmdError::Empty)
            ),
            "{sql:?} is SQL to PostgreSQL, classified as {class:?}"
        ),
    }
    scan_any_chunking(data);
    match replcmd::parse(&sql) {
        Ok(cmd) => {
            assert!(
                !matches!(
                    class,
                    Ok(replcmd::TunnelCmd::Sql
                        | replcmd::TunnelCmd::CreateSlot { .. }
                        | replcmd::TunnelCmd::DropSlot { .. }
                        | replcmd::TunnelCmd::AlterSlot { .. })
                ),
                "{cmd:?} classified as {class:?}"
            );
            let text = cmd.to_sql();
            assert_eq!(
                replcmd::parse(&text),
                Ok(cmd.clone()),
                "to_sql of {cmd:?} is {text:?}, which does not parse back"
            );
        }
        Err(e) => {
            // The error text goes into an ErrorResponse: it must render, and stay bounded.
            let msg = e.to_string();
            assert!(
                msg.len() <= 4 * replcmd::MAX_COMMAND_LEN + 1024,
                "error message of {} bytes",
                msg.len()
            );
        }
    }
});

fn scan_any_chunking(data: &[u8]) {
    use walrelay_pgwire::scan::Scanner;
    let mut whole = Vec::new();
    let r1 = Scanner::default().feed(data, |t| whole.push(t));
    let cut = data.first().map_or(0, |&b| usize::from(b)).min(data.len());
    let mut parts = Vec::new();
    let mut sc = Scanner::default();
    let r2 = sc
        .feed(&data[..cut], |t| parts.push(t))
        .and_then(|_| sc.feed(&data[cut..], |t| parts.push(t)));
    if r1.is_ok() && r2.is_ok() {
        assert_eq!(whole, parts, "tags depend on the chunking (cut at {cut})");
    }
}
