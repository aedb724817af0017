//! Standard output of the `walrelay` command (every subcommand's, the demo's live table, the
//! bench's tables) without `println!`, which panics when the output cannot be written: a
//! reader that went away (`walrelay status | head -1`, a pager quit) made every command exit
//! 101 with a panic message. Here a failed write is an error the caller returns, and the
//! command tells a reader that left ([`StdoutError::reader_left`], a broken pipe: nothing to
//! report) from output that was lost (a full disk: an error, exit 1); see [`printed`]. Its
//! messages go to standard error through [`errln!`](crate::errln), which never panics.

use std::io::Write;
use std::process::ExitCode;

/// Standard output could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write to standard output: {0}")]
pub struct StdoutError(pub std::io::Error);

impl StdoutError {
    /// The reader closed its end of the pipe (`head`, `grep -q`, a pager that quit): it has
    /// read what it wanted, so this is not a fault of the command.
    pub fn reader_left(&self) -> bool {
        self.0.kind() == std::io::ErrorKind::BrokenPipe
    }
}

/// Writes `text` to standard output, flushed, so that a failure shows here and not in the
/// flush at exit (whose errors the standard library drops).
pub fn write(text: &str) -> Result<(), StdoutError> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(StdoutError)
}

/// [`write`] of a formatted line: `outln!("{x}")?` where `println!("{x}")` would panic.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::out::write("\n")
    };
    ($($arg:tt)*) => {
        $crate::out::write(&format!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprintln!` without its panic when standard error cannot be written (a closed pipe):
/// there is nowhere left to say anything then, and the exit status still tells.
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// The exit status of a command that printed (or tried to print) its result, whose own
/// status is `status`. Standard output that failed because its reader left (`| head -1`,
/// `| grep -q`, a pager that quit) is no error: the reader took what it wanted, so the
/// command's status stands and nothing is said (with `set -o pipefail`, a script still learns
/// from `walrelay check-config … | head -1` whether the file is good). Output lost otherwise
/// (a full disk, an I/O error) is an error: said on standard error, exit 1.
pub fn printed(said: Result<(), StdoutError>, status: ExitCode) -> ExitCode {
    match said {
        Ok(()) => status,
        Err(e) if e.reader_left() => status,
        Err(e) => {
            errln!("walrelay: {e}");
            ExitCode::from(1)
        }
    }
}

/// A command stopped because standard output's reader left (see [`printed`]).
pub fn reader_left(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<StdoutError>()
            .is_some_and(StdoutError::reader_left)
    })
}
