//! Following a region file: the identity of the file at a path, to tell
//! when another file took its place (the exporter and `edgemark export`'s
//! `/metrics` server both attach again then).

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The device and inode of the file at `path`, or why there is none.
pub fn file_identity(path: &Path) -> std::io::Result<(u64, u64)> {
    std::fs::metadata(path).map(|m| (m.dev(), m.ino()))
}
