//! Python bindings of edgemark (built with maturin; see python/README.md).
//!
//! The native module `edgemark._edgemark` holds four classes, one module
//! each: `Region` (a [`edgemark::Recorder`], `region`), `Token` (`token`),
//! `Handle` (one request, edge and event resolved once, `handle`) and
//! `StreamEdgeRecorder` (a handle pre-resolved to one request, edge and
//! segment, `stream_edge`), with `elapsed_between` and the core's tables of
//! events and outcomes. The pure-Python package `edgemark` around it makes
//! the `Event` and `Outcome` enums from those tables at import, and
//! `edgemark.stream_edge` is the drop-in for the upstream stream-edge
//! module.
//!
//! `Exporter` (`export`) is the OTLP exporter the command runs, on a native
//! thread of the process, for a server that exports its region itself.
//!
//! `_cli_main` runs the `edgemark` command (the `edgemark-cli` crate's
//! library) for the package's console script and `python -m edgemark`.
//!
//! The binding keeps the core's contract (fail open, as `edgemark::Outcome`
//! states it): runtime conditions are outcomes, never exceptions. Only
//! programmer and configuration errors raise, and they raise where they are
//! made: a bad path or file at
//! `create`/`attach` (`OSError`, `ValueError`), an event name that is not in
//! the region's schema (`ValueError`), a negative stage, segment or chunk
//! sequence (`ValueError`), an argument of the wrong type (`TypeError`).
//! An int too large for its field is a refusal, as the core's own limits
//! are (`out_of_range`, or `unknown_edge` for a stage no edge can have).

mod args;
mod errors;
mod events;
mod export;
mod handle;
mod outcome;
mod region;
mod snapshot;
mod span_plan;
mod stream_edge;
mod token;

use std::ffi::OsString;

use edgemark::schema::{DomainId, HOST_MONOTONIC};
use edgemark::snapshot::Observed;
use edgemark::{Event, Outcome};
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

/// Milliseconds from ``start_event`` to ``end_event`` in one edge segment
/// of a snapshot (the dict under a key such as ``"0->1:0"``): the core's
/// rule (`Observed::until`), applied to the snapshot's JSON form.
///
/// ``None`` unless both events were recorded, in the same clock domain
/// (hence from the same origin), and the end is not before the start.
/// ``segment`` may be ``None`` (``snapshot.get("0->1:0")`` of an edge with
/// no event yet). An event is an ``Event`` (or its int) or its name.
#[pyfunction]
fn elapsed_between(
    segment: Option<&Bound<'_, PyAny>>,
    start_event: &Bound<'_, PyAny>,
    end_event: &Bound<'_, PyAny>,
) -> PyResult<Option<f64>> {
    let (a, b) = (events::name_of(start_event)?, events::name_of(end_event)?);
    let Some(segment) = segment.filter(|s| s.is_truthy().unwrap_or(false)) else {
        return Ok(None);
    };
    let domains = segment.call_method1("get", ("clock_domains",))?;
    // The two values' domains by name: equal names are one domain, so the
    // ids given here need only tell the two apart.
    let (da, db) = match (domain_of(&domains, &a)?, domain_of(&domains, &b)?) {
        (Some(da), Some(db)) => (da, db),
        _ => return Ok(None),
    };
    let same = da.eq(&db)?;
    let (Some(va), Some(vb)) = (
        observed(segment, &a, DomainId(0))?,
        observed(segment, &b, DomainId(u8::from(!same)))?,
    ) else {
        return Ok(None);
    };
    Ok(va.until(vb))
}

/// The clock domain `clock_domains` names for event `name`, if any.
fn domain_of<'py>(domains: &Bound<'py, PyAny>, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    if domains.is_none() {
        return Ok(None);
    }
    let d = domains.call_method1("get", (name,))?;
    Ok((!d.is_none()).then_some(d))
}

/// Event `name`'s value in a segment dict as the core keeps it (whole
/// microseconds, as the snapshot's milliseconds were made from), if it has
/// one a cell can hold.
fn observed(
    segment: &Bound<'_, PyAny>,
    name: &str,
    domain: DomainId,
) -> PyResult<Option<Observed>> {
    let v = segment.call_method1("get", (format!("{name}_ms"),))?;
    if v.is_none() {
        return Ok(None);
    }
    let us = (v.extract::<f64>()? * 1000.0).round();
    Ok((us.is_finite() && us >= 0.0).then_some(Observed {
        elapsed_us: us as u64,
        domain,
    }))
}

/// Runs the ``edgemark`` command line ``argv`` (the first item is the
/// program's name) and returns its exit status: the command compiled into
/// this module, so that the wheel's ``edgemark`` console script needs no
/// separate binary. ``command`` is how to start the command again (the
/// demo's stage workers): the interpreter, ``-m``, ``edgemark``. Runs
/// without the GIL, until the command ends.
#[pyfunction]
fn _cli_main(py: Python<'_>, argv: Vec<OsString>, command: Vec<OsString>) -> i32 {
    py.detach(|| edgemark_cli::run_as(argv, command))
}

/// Every outcome of the core, in its declaration order, as ``(name,
/// is_success)``: ``edgemark.Outcome`` is made from it at import.
fn outcome_table(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
    PyTuple::new(py, Outcome::ALL.iter().map(|o| (o.name(), o.is_success())))
}

/// The native part of the ``edgemark`` package.
#[pymodule(name = "_edgemark")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<PyRegion>()?;
    m.add_class::<PyToken>()?;
    m.add_class::<PyHandle>()?;
    m.add_class::<PyStreamEdgeRecorder>()?;
    m.add_class::<export::PyExporter>()?;
    m.add("FLUSH_DEADLINE_S", export::flush_deadline_s())?;
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
    m.add_function(wrap_pyfunction!(elapsed_between, m)?)?;
    m.add_function(wrap_pyfunction!(span_plan::span_plan, m)?)?;
    m.add_function(wrap_pyfunction!(_cli_main, m)?)?;
    m.add("HOST_MONOTONIC", HOST_MONOTONIC)?;
    m.add("MAX_ELAPSED_MS", edgemark::limits::MAX_ELAPSED_MS)?;
    m.add("MAX_CHUNK_SEQ", edgemark::limits::MAX_CHUNK_SEQ)?;
    // The core's tables, from which the package makes its `Outcome` and
    // `Event` enums.
    m.add("OUTCOME_NAMES", outcome::outcome_names(py)?)?;
    m.add("_OUTCOMES", outcome_table(py)?)?;
    m.add(
        "EVENT_NAMES",
        PyTuple::new(py, Event::ALL.iter().map(|e| e.name()))?,
    )?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
