//! Set-up errors of the core as Python exceptions.

use std::path::Path;

use edgemark::{AttachError, CreateError};
use pyo3::exceptions::{PyFileExistsError, PyOSError, PyPermissionError, PyValueError};
use pyo3::{create_exception, PyErr};

create_exception!(
    _edgemark,
    RegionShrunkError,
    PyOSError,
    "The region file was truncated under this process after it was attached: a sweep stopped rather than return what it read from the lost pages. Attach the file again once it is whole."
);

/// `OSError(errno, strerror, filename)`: Python picks the subclass
/// (`FileNotFoundError`, `PermissionError`, ...) from the errno.
fn os_error(e: &std::io::Error, msg: String, path: &Path) -> PyErr {
    PyOSError::new_err((
        e.raw_os_error().unwrap_or(0),
        msg,
        path.to_string_lossy().into_owned(),
    ))
}

pub(crate) fn create_error(e: CreateError) -> PyErr {
    let msg = e.to_string();
    match &e {
        CreateError::Exists(p) => {
            PyFileExistsError::new_err((libc::EEXIST, msg, p.to_string_lossy().into_owned()))
        }
        CreateError::Io(p, io) => os_error(io, msg, p),
        _ => PyValueError::new_err(msg),
    }
}

/// The error of a sweep (``open_requests``, ``snapshot_open``,
/// ``reclaim_dead_owners``): the file was found shrunk, before or during it,
/// or the call writes and the region was attached read-only.
pub(crate) fn sweep_error(e: AttachError) -> PyErr {
    match &e {
        AttachError::Shrunk | AttachError::Length { .. } => {
            RegionShrunkError::new_err(e.to_string())
        }
        _ => attach_error(e),
    }
}

pub(crate) fn attach_error(e: AttachError) -> PyErr {
    let msg = e.to_string();
    match &e {
        AttachError::ReadOnly => PyPermissionError::new_err(msg),
        AttachError::Io(p, io) => os_error(io, msg, p),
        AttachError::NotRegularFile(_) => PyOSError::new_err(msg),
        AttachError::ForeignOwner { .. } => PyPermissionError::new_err(msg),
        // Everything about the file's content: not a region, not published
        // yet, another version, a bad geometry or schema, another clock.
        _ => PyValueError::new_err(msg),
    }
}
