//! Every error type of this crate states its cause once: in its message (as they all do, since
//! most are printed with `{}`), and then not also as its `source()`, which anyhow's `{:#}`
//! (what `walrelay` prints on exit) appends after the message. Both made `walrelay run` say
//! "opening the spool in X: spool X: Not a directory (os error 20): Not a directory (os
//! error 20)".

use std::io;

use crate::config::Config;
use crate::monitor::client::StatusError;
use crate::pgclient::PgClientError;
use crate::spool::Spool;
use crate::tls::TlsError;

/// `e` as `walrelay` prints it (`{:#}`, under a context of its own) has `cause` once.
fn assert_once(e: impl std::error::Error + Send + Sync + 'static, cause: &str) {
    let text = format!("{:#}", anyhow::Error::new(e).context("doing it"));
    assert_eq!(text.matches(cause).count(), 1, "{text}");
}

#[test]
fn each_cause_is_printed_once() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let under_a_file = file.join("sub");
    let not_a_dir = "Not a directory (os error 20)";
    // The chain `run` printed: context, then the spool's error, then the OS's (a path under a
    // file is now refused before any OS error; a `spool.state` that is a directory is not).
    let spool = d.path().join("spool");
    std::fs::create_dir_all(spool.join("spool.state")).unwrap();
    let e = Spool::open(&spool, 1 << 30).err().unwrap();
    let text = format!(
        "{:#}",
        anyhow::Error::new(e).context(format!("opening the spool in {}", spool.display()))
    );
    assert_eq!(
        text.matches("Is a directory (os error 21)").count(),
        1,
        "{text}"
    );
    assert!(text.starts_with("opening the spool in "), "{text}");

    assert_once(Config::load(&under_a_file).err().unwrap(), not_a_dir);
    assert_once(
        crate::tls::load_certs(&under_a_file).err().unwrap(),
        not_a_dir,
    );
    assert_once(
        crate::tls::load_key(&under_a_file).err().unwrap(),
        not_a_dir,
    );
    let denied = || io::Error::from_raw_os_error(libc::EACCES);
    assert_once(
        PgClientError::Connect {
            addr: "db1:5432".into(),
            cause: denied(),
        },
        "Permission denied",
    );
    assert_once(
        PgClientError::from(walrelay_pgwire::WireError::Io(denied())),
        "Permission denied",
    );
    assert_once(
        walrelay_pgwire::WireError::from(denied()),
        "Permission denied",
    );
    assert_once(
        walrelay_wal::linkcodec::CodecError::from(denied()),
        "Permission denied",
    );
    assert_once(
        TlsError::from(rustls::Error::General("no good".into())),
        "no good",
    );
    assert_once(
        StatusError::Connect {
            addr: "127.0.0.1:9187".into(),
            cause: denied(),
        },
        "Permission denied",
    );
}
