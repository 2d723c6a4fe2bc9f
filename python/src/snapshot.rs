//! Snapshots as Python values and as JSON text.

use edgemark::Snapshot;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A snapshot as the value `json.loads` of its JSON gives: dicts in the
/// core's key order, integers as int, floats as float (10.0 stays a float),
/// null as None. Serialised straight from the core's `Serialize`, so it is
/// the core's JSON form by construction.
pub(crate) fn to_py<'py>(py: Python<'py>, s: Option<&Snapshot>) -> PyResult<Bound<'py, PyAny>> {
    match s {
        Some(s) => Ok(pythonize::pythonize(py, s)?),
        None => Ok(PyDict::new(py).into_any()),
    }
}

/// A snapshot as the core's JSON text; `{}` for none.
pub(crate) fn to_text(s: Option<&Snapshot>) -> String {
    s.and_then(|s| serde_json::to_string(s).ok())
        .unwrap_or_else(|| "{}".to_owned())
}
