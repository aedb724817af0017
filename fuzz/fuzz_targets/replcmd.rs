//! Replication commands from a standby's Query messages.
//!
//! Properties: no panic on any text; every accepted command renders (`to_sql`) to text that
//! parses back to the same command.
#![no_main]

use libfuzzer_sys::fuzz_target;
use walrelay_pgwire::replcmd;

fuzz_target!(|data: &[u8]| {
    let sql = String::from_utf8_lossy(data);
    match replcmd::parse(&sql) {
        Ok(cmd) => {
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
