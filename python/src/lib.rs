//! Python bindings of edgemark (built with maturin; see python/README.md).
//!
//! The native module `edgemark._edgemark` holds four classes, one module
//! each: `Region` (a [`edgemark::Recorder`], `region`), `Token` (`token`),
//! `Handle` (one request, edge and event resolved once, `handle`) and
//! `StreamEdgeRecorder` (a handle pre-resolved to one request, edge and
//! segment, `stream_edge`). The pure-Python package `edgemark` around it adds
//! the `Event` and `Outcome` enums and `elapsed_between`, and
//! `edgemark.stream_edge` the drop-in for the upstream stream-edge module.
//!
//! The binding keeps the core's contract (brief S10): runtime conditions are
//! outcomes, never exceptions. Only programmer and configuration errors
//! raise, and they raise where they are made: a bad path or file at
//! `create`/`attach` (`OSError`, `ValueError`), an event name that is not in
//! the region's schema (`ValueError`), a negative stage, segment or chunk
//! sequence (`ValueError`), an argument of the wrong type (`TypeError`).
//! An int too large for its field is a refusal, as the core's own limits
//! are (`out_of_range`, or `unknown_edge` for a stage no edge can have).

mod args;
mod errors;
mod handle;
mod outcome;
mod region;
mod snapshot;
mod stream_edge;
mod token;

use edgemark::schema::HOST_MONOTONIC;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::handle::PyHandle;
use crate::region::PyRegion;
use crate::stream_edge::PyStreamEdgeRecorder;
use crate::token::PyToken;

/// The default directory for region files: ``/dev/shm`` where it exists (a
/// memory-backed filesystem), else the system's temporary directory.
#[pyfunction]
fn default_dir() -> String {
    edgemark::default_dir().to_string_lossy().into_owned()
}

/// ``CLOCK_MONOTONIC`` now, in nanoseconds: the shared clock ``record``
/// reads.
#[pyfunction]
fn monotonic_ns() -> u64 {
    edgemark::clock::monotonic_ns()
}

/// The native part of the ``edgemark`` package.
#[pymodule(name = "_edgemark")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<PyRegion>()?;
    m.add_class::<PyToken>()?;
    m.add_class::<PyHandle>()?;
    m.add_class::<PyStreamEdgeRecorder>()?;
    m.add(
        "RegionShrunkError",
        py.get_type::<errors::RegionShrunkError>(),
    )?;
    m.add(
        "RegionNoSpaceError",
        py.get_type::<errors::RegionNoSpaceError>(),
    )?;
    m.add_function(wrap_pyfunction!(default_dir, m)?)?;
    m.add_function(wrap_pyfunction!(monotonic_ns, m)?)?;
    m.add("HOST_MONOTONIC", HOST_MONOTONIC)?;
    m.add("MAX_ELAPSED_MS", edgemark::limits::MAX_ELAPSED_MS)?;
    m.add("MAX_CHUNK_SEQ", edgemark::limits::MAX_CHUNK_SEQ)?;
    m.add("OUTCOME_NAMES", outcome::outcome_names(py)?)?;
    m.add(
        "EVENT_NAMES",
        PyTuple::new(py, edgemark::Event::ALL.iter().map(|e| e.name()))?,
    )?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
