//! Arguments shared by several methods, converted once.

use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyInt;

/// A `chunk_seq` argument.
pub(crate) enum ChunkArg {
    /// `None` or left out.
    Absent,
    /// A sequence number; one beyond 64 bits is `u64::MAX`, which is beyond
    /// the cell's range too, so the core answers it as `out_of_range` for
    /// the event that keeps it (and ignores it for the others) instead of
    /// Python raising `OverflowError`.
    Seq(u64),
    /// A negative int: the caller decides how to refuse it.
    Negative,
}

/// Converts `chunk_seq`: `None`, or an int of any size.
pub(crate) fn chunk_arg(c: Option<&Bound<'_, PyAny>>) -> PyResult<ChunkArg> {
    let Some(c) = c.filter(|c| !c.is_none()) else {
        return Ok(ChunkArg::Absent);
    };
    if let Ok(v) = c.extract::<u64>() {
        return Ok(ChunkArg::Seq(v));
    }
    let c = c
        .cast::<PyInt>()
        .map_err(|_| PyTypeError::new_err("chunk_seq is an int or None"))?;
    Ok(if c.lt(0)? {
        ChunkArg::Negative
    } else {
        ChunkArg::Seq(u64::MAX)
    })
}

/// A region path: refuses a NUL byte with a `ValueError` that says so
/// (the system call would only say "invalid argument").
pub(crate) fn path_arg(path: PathBuf) -> PyResult<PathBuf> {
    if path.as_os_str().as_bytes().contains(&0) {
        return Err(PyValueError::new_err(format!(
            "a region path cannot contain a NUL byte: {:?}",
            path.as_os_str()
        )));
    }
    Ok(path)
}
