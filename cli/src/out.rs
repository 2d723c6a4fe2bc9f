//! Standard output for what the commands print. A write that fails is an
//! error the command returns, never a panic (`println!` panics): a closed
//! pipe (`edgemark inspect P | head -1`) ends the command quietly with
//! status 0, as the reader asked for no more; any other failure (a full
//! disk, `> /dev/full`) is one line on standard error and status 1.

use std::fmt;
use std::io::Write;

/// A failed write to standard output.
#[derive(Debug)]
pub(crate) struct StdoutError(pub(crate) std::io::Error);

impl fmt::Display for StdoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot write to standard output: {}", self.0)
    }
}

// No `source`: the message already holds the system's reason.
impl std::error::Error for StdoutError {}

impl StdoutError {
    /// Whether the reader of the pipe went away: the command stops quietly.
    pub(crate) fn is_closed_pipe(&self) -> bool {
        self.0.kind() == std::io::ErrorKind::BrokenPipe
    }
}

/// Writes `text` to standard output.
pub(crate) fn write(text: &str) -> Result<(), StdoutError> {
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(StdoutError)
}

/// Flushes standard output.
pub(crate) fn flush() -> Result<(), StdoutError> {
    std::io::stdout().lock().flush().map_err(StdoutError)
}

/// `println!` that returns a [`StdoutError`] from the enclosing function
/// (through `?`) instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::out::write(&format!("{}\n", format_args!($($arg)*)))?
    };
}
pub(crate) use outln;
