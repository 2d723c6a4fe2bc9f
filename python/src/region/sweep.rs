//! Reads of every slot: the open requests, their snapshots, and the
//! reclaim of dead owners' slots.

use pyo3::exceptions::PyPermissionError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::PyRegion;
use crate::errors::sweep_error;
use crate::snapshot;
use crate::token::PyToken;

#[pymethods]
impl PyRegion {
    /// The tokens of every open request (one sweep of the region, without
    /// the GIL).
    fn open_requests(&self, py: Python<'_>) -> PyResult<Vec<PyToken>> {
        let view = self.view();
        let all = py.detach(|| view.open_requests()).map_err(sweep_error)?;
        Ok(all.into_iter().map(PyToken).collect())
    }

    /// ``(token, snapshot)`` for every open request: one sweep of the
    /// region, taken without the GIL.
    fn snapshot_open<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let view = self.view();
        let all = py.detach(|| view.snapshot_open()).map_err(sweep_error)?;
        let out = PyList::empty(py);
        for (t, s) in &all {
            let t = Bound::new(py, PyToken(*t))?.into_any();
            out.append(PyTuple::new(py, [t, snapshot::to_py(py, Some(s))?])?)?;
        }
        Ok(out)
    }

    /// Frees the slots of dead processes (open requests whose owner is gone,
    /// slots left locked by a process that died); live owners' slots are
    /// left alone. Returns ``{"dead_owners": n, "dead_holders": m,
    /// "unjudged": why, "live_owners_locked": k}``: ``why`` is ``None``, or
    /// ``"mixed_pid_namespaces"`` / ``"other_pid_namespace"`` when no pid
    /// could be judged and nothing was freed (docs/limitations.md);
    /// ``live_owners_locked`` counts the requests of live owners, locked
    /// by a process that died inside ``start_segment``, that were freed.
    fn reclaim_dead_owners<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if self.viewer.is_some() {
            return Err(PyPermissionError::new_err(
                "the region was attached read-only and this call writes it",
            ));
        }
        let rec = &self.rec;
        let r = py
            .detach(|| rec.reclaim_dead_owners())
            .map_err(sweep_error)?;
        // The core's encoding of its report.
        Ok(pythonize::pythonize(py, &r)?.cast_into::<PyDict>()?)
    }
}
