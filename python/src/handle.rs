//! `Handle`: one edge and event of one request, resolved once by
//! `Region.handle`, so that a record converts no argument.

use edgemark::{Mark, Outcome, Recorder, Token};
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::outcome::outcome_str;
use crate::token::PyToken;

/// One edge and event of one request of a region, resolved once by
/// ``Region.handle(token, from_stage, to_stage, event, segment=0,
/// chunk_seq=None)``.
///
/// ``handle.record()`` is ``region.record(token, from_stage, to_stage,
/// event, segment=segment, chunk_seq=chunk_seq)`` without the conversion of
/// its arguments: for a loop that records the same event of many requests,
/// or a connector thread that keeps one handle per request.
/// ``record_elapsed(ms, clock_domain)`` records a value measured elsewhere.
/// Like ``record``, they never raise for runtime conditions: they return
/// ``False``, and ``record_outcome`` says why.
#[pyclass(module = "edgemark", name = "Handle", frozen)]
pub(crate) struct PyHandle {
    /// The region's recorder (a shared handle on the same mapping as the
    /// `Region` that made this handle).
    rec: Recorder,
    /// The request, or why its records are refused without looking (a
    /// disabled region, a `None` token or a value that is no token).
    target: Result<Token, Outcome>,
    /// The edge, event, segment and chunk sequence, checked once.
    mark: Mark,
    /// `from->to:segment event` for `repr`.
    label: String,
}

impl PyHandle {
    pub(crate) fn new(
        rec: &Recorder,
        target: Result<Token, Outcome>,
        mark: Mark,
        label: String,
    ) -> PyHandle {
        PyHandle {
            rec: rec.clone(),
            target,
            mark,
            label,
        }
    }

    fn do_record(&self) -> Outcome {
        match self.target {
            Ok(t) => self.rec.record(t, self.mark),
            Err(why) => why,
        }
    }

    fn do_record_elapsed(&self, elapsed_ms: f64, clock_domain: &str) -> Outcome {
        match self.target {
            Ok(t) => self
                .rec
                .record_elapsed(t, self.mark, elapsed_ms, clock_domain),
            Err(why) => why,
        }
    }
}

#[pymethods]
impl PyHandle {
    /// Records the event now, on the shared clock; ``True`` only if this
    /// call recorded it.
    fn record(&self) -> bool {
        self.do_record().is_success()
    }

    /// ``record`` that returns the outcome's name (one of
    /// ``edgemark.OUTCOME_NAMES``).
    fn record_outcome<'py>(&self, py: Python<'py>) -> Bound<'py, PyString> {
        outcome_str(py, self.do_record())
    }

    /// Records ``elapsed_ms`` milliseconds from the request's origin,
    /// measured elsewhere in ``clock_domain``; ``True`` only if this call
    /// recorded it. A negative or non-finite value is refused (``False``).
    // The default domain is the core's `HOST_MONOTONIC`, written out so that
    // Python's signature shows it (pyo3 shows a Rust constant as `...`);
    // `test_core_handle.py` checks that the two agree.
    #[pyo3(signature = (elapsed_ms, clock_domain = "host_monotonic"))]
    fn record_elapsed(&self, elapsed_ms: f64, clock_domain: &str) -> bool {
        self.do_record_elapsed(elapsed_ms, clock_domain)
            .is_success()
    }

    /// ``record_elapsed`` that returns the outcome's name.
    #[pyo3(signature = (elapsed_ms, clock_domain = "host_monotonic"))]
    fn record_elapsed_outcome<'py>(
        &self,
        py: Python<'py>,
        elapsed_ms: f64,
        clock_domain: &str,
    ) -> Bound<'py, PyString> {
        outcome_str(py, self.do_record_elapsed(elapsed_ms, clock_domain))
    }

    /// The request's ``Token``; ``None`` when records are refused without
    /// looking (a disabled region, a ``None`` token, a value that is no
    /// token).
    #[getter]
    fn token(&self) -> Option<PyToken> {
        self.target.ok().map(PyToken)
    }

    fn __repr__(&self) -> String {
        match self.target {
            Ok(t) => format!("Handle('{}', token='{t}')", self.label),
            Err(why) => format!("Handle('{}', {})", self.label, why.name()),
        }
    }
}
