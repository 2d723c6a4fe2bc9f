//! Attaching the region a command names, as much as the command needs:
//! to write, to look, or to write without the clock; errors as one line
//! that names the file.

use std::path::Path;

use anyhow::{Result, anyhow};
use edgemark::{Recorder, Viewer};

use crate::ops::Trust;

/// Attach to record and run control operations.
pub(crate) fn attach(path: &Path, trust: Trust) -> Result<Recorder> {
    trust.options().attach(path).map_err(|e| named(path, e))
}

/// An attach error as one line that names the file once.
pub(crate) fn named(path: &Path, e: edgemark::AttachError) -> anyhow::Error {
    match e {
        // These name the path themselves.
        edgemark::AttachError::Io(..) | edgemark::AttachError::NotRegularFile(_) => anyhow!(e),
        // The library's message ends with its own hint, in the library's
        // terms: say it once, as this command's option.
        edgemark::AttachError::ForeignOwner { uid } => anyhow!(
            "{}: the region file belongs to uid {uid}, not to this user; \
             pass --allow-foreign-owner if you trust that user",
            path.display()
        ),
        other => anyhow!("{}: {other}", path.display()),
    }
}

/// Attach to look only: read permission is enough (the file is opened and
/// mapped read-only), and neither a foreign clock nor a foreign owner is a
/// reason not to look: this process cannot write the region, and whatever
/// the owner puts in the file gives a clear error or a working region (a
/// file shrunk under the mapping included), never a crash.
pub(crate) fn attach_for_reading(path: &Path) -> Result<Viewer> {
    edgemark::AttachOptions::new()
        .allow_foreign_owner(true)
        .allow_foreign_clock(true)
        .view(path)
        .map_err(|e| named(path, e))
}

/// Attach to write without reading the clock: to reclaim, which neither
/// begins a request nor records in `host_monotonic`, so a region of another
/// boot or time namespace is no reason to refuse. (The OTLP exporter
/// attaches its region itself, the same way.)
pub(crate) fn attach_clockless(path: &Path, trust: Trust) -> Result<Recorder> {
    trust
        .options()
        .allow_foreign_clock(true)
        .attach(path)
        .map_err(|e| named(path, e))
}
