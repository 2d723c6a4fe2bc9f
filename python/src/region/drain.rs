//! Draining the region's ring of closed requests.

use pyo3::exceptions::PyPermissionError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::PyRegion;
use crate::errors::sweep_error;
use crate::snapshot;
use crate::token::PyToken;

#[pymethods]
impl PyRegion {
    /// Takes up to ``max`` closed requests from the region's ring of closed
    /// requests, oldest first; each reaches exactly one reader of all the
    /// processes that drain. Returns a list of dicts: ``token``,
    /// ``trace_id`` and ``span_id`` (hex; the request's own span),
    /// ``parent_span_id`` (hex, or ``None`` when its trace started here),
    /// ``trace_flags``, ``origin_unix_ns``, ``closed_unix_ns`` and
    /// ``snapshot`` (as ``close`` returned it), each done with as it is
    /// taken (nothing to acknowledge). Losses (requests the ring overwrote
    /// before any reader took them, counted as they are overwritten) are in
    /// ``counters()["closed_lost"]``.
    #[pyo3(signature = (max=256))]
    fn drain_closed<'py>(&self, py: Python<'py>, max: usize) -> PyResult<Bound<'py, PyList>> {
        if self.viewer.is_some() {
            return Err(PyPermissionError::new_err(
                "the region is attached read-only: draining closed requests moves the readers' shared cursor",
            ));
        }
        let mut out = Vec::new();
        py.detach(|| self.rec.drain_closed(max, &mut out))
            .map_err(sweep_error)?;
        let list = PyList::empty(py);
        for c in &out {
            let d = PyDict::new(py);
            let ctx = c.context();
            d.set_item("token", PyToken(c.token()))?;
            d.set_item("trace_id", ctx.trace_id_hex())?;
            d.set_item("span_id", ctx.span_id_hex())?;
            d.set_item(
                "parent_span_id",
                c.parent_context().map(|p| p.span_id_hex()),
            )?;
            d.set_item("trace_flags", c.trace_flags())?;
            d.set_item("origin_unix_ns", c.origin_unix_ns())?;
            d.set_item("closed_unix_ns", c.closed_unix_ns())?;
            d.set_item("snapshot", snapshot::to_py(py, Some(c.snapshot()))?)?;
            list.append(d)?;
        }
        Ok(list)
    }
}
