//! Outcomes as Python strings, derived from the core's own list.

use edgemark::Outcome;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyString, PyTuple};

/// The name of every outcome of [`Outcome::ALL`], interned once, in the same
/// order: the record path looks its outcome up without allocating.
static NAMES: PyOnceLock<Vec<Py<PyString>>> = PyOnceLock::new();

fn names(py: Python<'_>) -> &Vec<Py<PyString>> {
    NAMES.get_or_init(py, || {
        Outcome::ALL
            .iter()
            .map(|o| PyString::intern(py, o.name()).unbind())
            .collect()
    })
}

/// The outcome's name as a Python string (``edgemark.Outcome`` members
/// compare equal to it).
pub(crate) fn outcome_str<'py>(py: Python<'py>, o: Outcome) -> Bound<'py, PyString> {
    match Outcome::ALL.iter().position(|x| *x == o) {
        Some(i) => names(py)[i].bind(py).clone(),
        // Not reachable while `ALL` lists every variant; a name all the same.
        None => PyString::intern(py, o.name()),
    }
}

/// Every outcome's name, in the core's declaration order.
pub(crate) fn outcome_names(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
    PyTuple::new(py, names(py).iter().map(|n| n.bind(py)))
}
