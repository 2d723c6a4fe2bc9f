//! What a region is and has counted: `report()`, and its two parts
//! `info()` and `counters()`, each the core's encoding of the core's
//! report (`edgemark::report::RegionReport`), as `inspect --json` prints it.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;

use super::PyRegion;
use crate::errors::sweep_error;

/// A serializable report as a Python dict, keys in the core's order.
fn to_dict<'py>(py: Python<'py>, value: &impl serde::Serialize) -> PyResult<Bound<'py, PyDict>> {
    Ok(pythonize::pythonize(py, value)?.cast_into::<PyDict>()?)
}

/// `d` as `edgemark._report.InfoDict`: the same dict, which also answers
/// the keys `info()` had before the report's names (with a
/// `DeprecationWarning`).
fn with_former_keys<'py>(d: Bound<'py, PyDict>) -> PyResult<Bound<'py, PyDict>> {
    let py = d.py();
    static INFO_DICT: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let cls = INFO_DICT.import(py, "edgemark._report", "InfoDict")?;
    Ok(cls.call1((d,))?.cast_into::<PyDict>()?)
}

#[pymethods]
impl PyRegion {
    /// Everything the region says about itself now, as ``edgemark inspect
    /// --json`` prints it (without its ``"open"`` list): ``info()``'s keys
    /// but ``path``, then ``counters()``'s, then the gauges of the same
    /// table (docs/cli.md, "The report's counters and gauges"), from one
    /// sweep of the slots and one pass over the ring of closed requests
    /// (taken without the GIL). ``None`` when disabled. Raises
    /// ``RegionShrunkError`` (or ``RegionNoSpaceError``) when the sweep
    /// finds the file shrunk.
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let view = self.view();
        let report = py.detach(|| view.report()).map_err(sweep_error)?;
        report.map(|r| to_dict(py, &r)).transpose()
    }

    /// The region's metrics now as Prometheus text, as ``edgemark export
    /// --listen`` serves them (the same families, names and labels): the
    /// classic text format 0.0.4, or OpenMetrics 1.0 (with its ``# EOF``)
    /// when ``openmetrics``. Read without the GIL. A region that cannot be
    /// read says so in the text (``edgemark_region_ok 0``), never raises.
    #[pyo3(signature = (openmetrics=false))]
    fn prometheus_text(&self, py: Python<'_>, openmetrics: bool) -> String {
        let view = self.view();
        let format = if openmetrics {
            edgemark::prometheus::Format::OpenMetrics
        } else {
            edgemark::prometheus::Format::Text
        };
        py.detach(|| edgemark::prometheus::render(view, format))
    }

    /// The region's counters, one key per counter of the core's table of
    /// the report's counters and gauges (``edgemark::report::METRICS``,
    /// listed with what each counts in docs/cli.md, "The report's counters
    /// and gauges"): ``refused`` (by outcome, in the core's counter order)
    /// and ``closed_given_up`` (by reason) as dicts, the others ints.
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        to_dict(py, &self.view().counters())
    }

    /// The region's geometry, identity and schema as a dict, ``None`` when
    /// disabled: ``path``, then ``region_id``, ``bytes``, ``slots``,
    /// ``segments``, ``slot_stride``, ``slots_offset``, ``edges``
    /// (``"0->1"``), ``events`` (``{"name", "domain",
    /// "keeps_chunk_seq"}``), ``domains``, ``clock`` (``{"kind",
    /// "boot_id", "time_namespace", "shared_with_this_process"}``),
    /// ``created_unix_ns``, ``creator_pid``, ``group_access``,
    /// ``pid_namespaces`` (``{"mixed", "pids_judged", "why_not_judged"}``)
    /// and ``closed_ring`` (``{"entries", "entry_bytes"}``).
    ///
    /// The keys of the previous release that moved into those objects
    /// (``shares_clock``, ``mixed_pid_namespaces``, ``pids_unjudged``)
    /// still answer, with a ``DeprecationWarning``, until the next one.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(info) = self.view().info() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("path", self.path())?;
        for (k, v) in to_dict(py, &info)? {
            d.set_item(k, v)?;
        }
        with_former_keys(d).map(Some)
    }
}
