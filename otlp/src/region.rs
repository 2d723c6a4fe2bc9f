//! The region the exporter reads: the file at a path, attached (and
//! attached again when another file takes its place or a drain fails) by
//! the exporter itself.

use std::path::{Path, PathBuf};

use edgemark::{AttachError, AttachOptions, Recorder};

/// A region file and how far its owner is trusted.
#[derive(Clone, Debug)]
pub(crate) struct RegionFile {
    path: PathBuf,
    allow_foreign_owner: bool,
}

impl RegionFile {
    pub(crate) fn new(path: PathBuf, allow_foreign_owner: bool) -> RegionFile {
        RegionFile {
            path,
            allow_foreign_owner,
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Attaches the file at the path now. To write without the clock:
    /// taking from the ring writes its read cursor, its entries' states and
    /// its reader table, and the exporter neither begins a request nor
    /// records a value, so a region of another boot or time namespace is
    /// no reason to refuse.
    pub(crate) fn attach(&self) -> Result<Recorder, AttachError> {
        AttachOptions::new()
            .allow_foreign_owner(self.allow_foreign_owner)
            .allow_foreign_clock(true)
            .attach(&self.path)
    }

    /// An attach error as one line that names the file once.
    pub(crate) fn describe(&self, e: &AttachError) -> String {
        match e {
            // These name the path themselves.
            AttachError::Io(..) | AttachError::NotRegularFile(_) => e.to_string(),
            other => format!("{}: {other}", self.path.display()),
        }
    }
}
