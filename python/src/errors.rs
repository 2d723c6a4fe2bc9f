//! Set-up errors of the core as Python exceptions.

use std::path::Path;

use edgemark::{AttachError, CreateError, SweepError};
use pyo3::exceptions::{PyFileExistsError, PyOSError, PyPermissionError, PyValueError};
use pyo3::{create_exception, PyErr};

create_exception!(
    _edgemark,
    RegionShrunkError,
    PyOSError,
    "The region file was truncated under this process after it was attached: a sweep stopped rather than return what it read from the lost pages. Attach the file again once it is whole."
);

create_exception!(
    _edgemark,
    RegionNoSpaceError,
    PyOSError,
    "A page of a sparse region could not be allocated when this process wrote it: its file system was full. What this process wrote to that page reached no other process, so a sweep stopped. Free space, then attach the file again (regions created without sparse=True reserve their space and cannot meet this)."
);

/// `OSError(errno, strerror, filename)`: Python picks the subclass
/// (`FileNotFoundError`, `PermissionError`, ...) from the errno.
fn os_error(e: &std::io::Error, msg: String, path: &Path) -> PyErr {
    PyOSError::new_err((e.raw_os_error().unwrap_or(0), msg, path_text(path)))
}

/// A path as Python shows it: `os.fsdecode` of its bytes (non-UTF-8 bytes
/// as surrogate escapes, so the text encodes back to the same path).
fn path_text(path: &Path) -> std::ffi::OsString {
    path.as_os_str().to_owned()
}

pub(crate) fn create_error(e: CreateError) -> PyErr {
    let msg = e.to_string();
    match &e {
        CreateError::Exists(p) => PyFileExistsError::new_err((libc::EEXIST, msg, path_text(p))),
        CreateError::Io(p, io) => os_error(io, msg, p),
        CreateError::NoSpace { path, .. } => {
            PyOSError::new_err((libc::ENOSPC, msg, path_text(path)))
        }
        _ => PyValueError::new_err(msg),
    }
}

/// The error of a sweep (``open_requests``, ``snapshot_open``,
/// ``reclaim_dead_owners``): the file was found shrunk, before or during it,
/// or a page of a sparse region found no space.
pub(crate) fn sweep_error(e: SweepError) -> PyErr {
    let msg = e.to_string();
    match &e {
        SweepError::NoSpace => RegionNoSpaceError::new_err(msg),
        SweepError::Io(io) => PyOSError::new_err((io.raw_os_error().unwrap_or(0), msg)),
        // Shrunk, found by an access or by the file's length.
        _ => RegionShrunkError::new_err(msg),
    }
}

pub(crate) fn attach_error(e: AttachError) -> PyErr {
    let msg = e.to_string();
    match &e {
        AttachError::Io(p, io) => os_error(io, msg, p),
        AttachError::NotRegularFile(_) => PyOSError::new_err(msg),
        AttachError::ForeignOwner { .. } => PyPermissionError::new_err(msg),
        // Everything about the file's content: not a region, not published
        // yet, another version, a bad geometry or schema, another clock.
        _ => PyValueError::new_err(msg),
    }
}
