//! Reads of every slot: the open requests, their snapshots, the reclaim
//! of dead owners' slots and the expiry of requests open too long.

use std::time::Duration;

use pyo3::exceptions::{PyPermissionError, PyValueError};
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
        self.writable()?;
        let rec = &self.rec;
        let r = py
            .detach(|| rec.reclaim_dead_owners())
            .map_err(sweep_error)?;
        // The core's encoding of its report.
        Ok(pythonize::pythonize(py, &r)?.cast_into::<PyDict>()?)
    }

    /// Closes every open request that has been open for at least
    /// ``older_than_s`` seconds (a bound on how long a request can stay
    /// open, for requests whose closer died or never saw them) and
    /// returns how many this call closed. Each is closed as ``close``
    /// closes: its final values reach ``drain_closed`` and the exporters,
    /// the events it lacks ``None``; and counted once in
    /// ``counters()["expired_requests"]``. Whoever begins requests calls
    /// it now and then, with a bound well above the longest request;
    /// nothing calls it by itself.
    ///
    /// Requests whose age this process cannot judge (it does not share the
    /// region's clock, or they were begun from another time namespace) are
    /// left open. ``ValueError`` for a negative or NaN bound (``inf``
    /// closes nothing); ``PermissionError`` on a region attached
    /// read-only; ``RegionShrunkError`` (or ``RegionNoSpaceError``) when
    /// the sweep finds the file shrunk. The sweep runs without the GIL.
    fn expire(&self, py: Python<'_>, older_than_s: f64) -> PyResult<u32> {
        if older_than_s.is_nan() || older_than_s < 0.0 {
            return Err(PyValueError::new_err(format!(
                "older_than_s is a non-negative number of seconds, not {older_than_s}"
            )));
        }
        self.writable()?;
        // Beyond what a Duration holds (inf included): older than any
        // request can be.
        let bound = Duration::try_from_secs_f64(older_than_s).unwrap_or(Duration::MAX);
        let rec = &self.rec;
        let r = py.detach(|| rec.expire_open(bound)).map_err(sweep_error)?;
        Ok(r.expired)
    }
}

impl PyRegion {
    /// `PermissionError` for a call that writes a region attached
    /// read-only.
    fn writable(&self) -> PyResult<()> {
        if self.viewer.is_some() {
            return Err(PyPermissionError::new_err(
                "the region was attached read-only and this call writes it",
            ));
        }
        Ok(())
    }
}
