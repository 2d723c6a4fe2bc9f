//! The notes of the libraries the command runs (the OTLP exporter's,
//! through the `log` facade) on standard error, as the command's own lines:
//! `edgemark: <note>`. The libraries print nothing themselves.

use std::io::Write;

use log::{Level, LevelFilter, Log, Metadata, Record};

/// The logger: notes of `edgemark_otlp` at level info and above; no
/// other crate's (rustls logs through the same facade).
struct Notes;

impl Log for Notes {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        m.level() <= Level::Info && m.target().starts_with("edgemark_otlp")
    }

    fn log(&self, r: &Record<'_>) {
        if self.enabled(r.metadata()) {
            // A note that cannot be written is lost, never a panic.
            let _ = writeln!(std::io::stderr().lock(), "edgemark: {}", r.args());
        }
    }

    fn flush(&self) {}
}

static NOTES: Notes = Notes;

/// Shows the libraries' notes from now on.
pub(crate) fn install() {
    if log::set_logger(&NOTES).is_ok() {
        log::set_max_level(LevelFilter::Info);
    }
}
