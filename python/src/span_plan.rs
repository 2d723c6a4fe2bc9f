//! `span_plan`: the core's span plan (`edgemark::span_plan`) of one edge
//! segment, for `edgemark.otel.add_snapshot`, which keeps no arithmetic of
//! its own.

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The span plan of one edge segment: ``events`` is its recorded events in
/// schema order, each ``(name, elapsed_ms, clock_domain)`` as a snapshot
/// shows them; ``origin_unix_ns`` the request's origin on the wall clock.
/// Returns ``{"events": [...], "start_unix_ns", "end_unix_ns",
/// "clock_domains"}``, each event ``{"name", "elapsed_ms", "clock_domain",
/// "at_unix_ns", "placed_at_origin", "previous_event", "since_previous_ms"}``
/// (the last two ``None`` where no delta is given), in time order.
#[pyfunction]
pub(crate) fn span_plan<'py>(
    py: Python<'py>,
    events: Vec<(String, f64, String)>,
    origin_unix_ns: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let plan = edgemark::span_plan::plan_events(
        events
            .iter()
            .map(|(n, ms, d)| (n.as_str(), *ms, d.as_str())),
        origin_unix_ns,
    );
    let out = PyDict::new(py);
    let mut list = Vec::with_capacity(plan.events.len());
    for e in &plan.events {
        let d = PyDict::new(py);
        d.set_item("name", &e.name)?;
        d.set_item("elapsed_ms", e.elapsed_ms)?;
        d.set_item("clock_domain", &e.clock_domain)?;
        d.set_item("at_unix_ns", e.at_unix_ns)?;
        d.set_item("placed_at_origin", e.placed_at_origin)?;
        d.set_item("previous_event", e.since_previous.as_ref().map(|p| &p.0))?;
        d.set_item("since_previous_ms", e.since_previous.as_ref().map(|p| p.1))?;
        list.push(d);
    }
    out.set_item("events", list)?;
    out.set_item("start_unix_ns", plan.start_unix_ns)?;
    out.set_item("end_unix_ns", plan.end_unix_ns)?;
    out.set_item("clock_domains", plan.clock_domains)?;
    Ok(out)
}
