//! `Region`: a handle on a region, the binding of the core's [`Recorder`].
//!
//! Split as the core's `recorder/` is: this file holds the type and a
//! request's life (begin, start segment, snapshot, close) with what the
//! region declares; `create.rs` makes a `Region`, `record.rs` records,
//! `sweep.rs` reads every slot, `drain.rs` drains the ring of closed
//! requests, `report.rs` says what the region is and has counted.

mod create;
mod drain;
mod record;
mod report;
mod sweep;

use edgemark::schema::EventId;
use edgemark::trace::TraceparentError;
use edgemark::{Edge, Outcome, Recorder, RequestState, Snapshot, TraceContext, Viewer};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::args::{Segment, Stage};
use crate::events::Events;
use crate::outcome::outcome_str;
use crate::snapshot;
use crate::token::{token_arg, PyToken};

/// A handle on a region: a memory-mapped file that holds, for every open
/// request, the first time each event happened on each directed stage edge.
///
/// The orchestrator creates the region (``Region.create``) and begins each
/// request (``begin``); the ``Token`` goes to the stage workers inside the
/// dispatch message; each worker attaches by path once (``Region.attach``)
/// and records what it observes (``record``), straight into the region: one
/// compare-and-swap, no message to the orchestrator. Any process may
/// ``snapshot``; every removal path calls ``close``, which returns the final
/// snapshot.
///
/// Recording never raises for runtime conditions: ``record`` returns
/// ``False`` (``record_outcome`` tells why) for a duplicate, a heartbeat, a
/// stale segment, a closed or reused token, a full or disabled region, a bad
/// elapsed time. A ``Region`` may be shared between threads.
#[pyclass(module = "edgemark", name = "Region", frozen)]
pub(crate) struct PyRegion {
    /// The region's writer: disabled for a region attached read-only.
    pub(crate) rec: Recorder,
    /// The region of a read-only attach (`rec` is then disabled); `None`
    /// otherwise, when `rec` is read through its own viewer.
    viewer: Option<Viewer>,
    /// The schema's events as arguments name them.
    pub(crate) events: Events,
}

impl PyRegion {
    pub(super) fn wrap(
        py: Python<'_>,
        rec: Recorder,
        viewer: Option<Viewer>,
    ) -> PyResult<PyRegion> {
        Ok(PyRegion {
            events: Events::of(py, viewer.as_ref().unwrap_or(&rec))?,
            rec,
            viewer,
        })
    }

    /// The region to read: the read-only attach's, or the writer's own.
    pub(crate) fn view(&self) -> &Viewer {
        self.viewer.as_ref().unwrap_or(&self.rec)
    }

    /// What a writing call answers when `rec` is disabled: `read_only` for
    /// a region attached read-only, else `disabled`.
    pub(crate) fn off(&self) -> Outcome {
        if self.viewer.is_some() {
            Outcome::ReadOnly
        } else {
            Outcome::Disabled
        }
    }

    /// The schema position of `event`: an `Event` (an int) or its name.
    /// An event the schema does not declare is a programmer error.
    #[inline(always)]
    pub(super) fn event_id(&self, event: &Bound<'_, PyAny>) -> PyResult<EventId> {
        self.events
            .resolve(event)
            .map_err(|why| self.events.error(event, why))
    }

    pub(super) fn event_names(&self) -> Vec<String> {
        self.events.names().to_vec()
    }

    fn do_start_segment(
        &self,
        token: &Bound<'_, PyAny>,
        from_stage: Stage,
        to_stage: Stage,
        segment: Segment,
    ) -> Outcome {
        if !self.rec.is_enabled() {
            return self.off();
        }
        let (from, to, segment) = match (from_stage.0, to_stage.0, segment.0) {
            (Ok(f), Ok(t), Ok(s)) => (f, t, s),
            (Err(why), _, _) | (_, Err(why), _) | (_, _, Err(why)) => return why,
        };
        match token_arg(token) {
            Ok(t) => self.rec.start_segment(t, Edge::new(from, to), segment),
            Err(why) => why,
        }
    }

    /// The request's snapshot; `None` for a value that is no token.
    fn snap(&self, token: &Bound<'_, PyAny>) -> Option<Snapshot> {
        token_arg(token).ok().map(|t| self.view().snapshot(t))
    }

    /// Closes without the GIL: a close can wait (about a second at most)
    /// for another control operation on the same request.
    fn close_snap(&self, py: Python<'_>, token: &Bound<'_, PyAny>) -> Option<Snapshot> {
        let t = token_arg(token).ok()?;
        let rec = &self.rec;
        Some(py.detach(|| rec.close(t)))
    }
}

/// Whether a close left the request as it was: busy, or refused on a
/// mapping that lost a page.
fn not_closed(s: &Snapshot) -> bool {
    matches!(s.state(), RequestState::Busy | RequestState::Faulted)
}

#[pymethods]
impl PyRegion {
    /// Begins a request: claims a free slot, sets the request's origin to
    /// now on the shared clock, and returns its ``Token``.
    ///
    /// ``traceparent`` is the W3C trace context the request runs under (a
    /// ``traceparent`` header value: the caller's span, or
    /// ``Region.traceparent`` of the request's part on another host); the
    /// region keeps it for the spans its closed requests become. Without
    /// it the request starts a new trace. A malformed value raises
    /// ``ValueError``; with ``strict=False`` (a record path that must not
    /// fail) it is ignored and counted (``counters()["bad_trace_contexts"]``).
    ///
    /// Fails open: ``None`` when the region is full or disabled; the request
    /// then runs unrecorded (every call with a ``None`` token is a no-op).
    #[pyo3(signature = (traceparent=None, strict=true))]
    fn begin(&self, traceparent: Option<&str>, strict: bool) -> PyResult<Option<PyToken>> {
        let begun = match traceparent {
            None => self.rec.begin(),
            Some(tp) if !strict => self.rec.begin_with_traceparent(tp),
            Some(tp) => {
                let parent: TraceContext = tp.parse().map_err(|e: TraceparentError| {
                    PyValueError::new_err(format!("invalid traceparent {tp:?}: {e}"))
                })?;
                self.rec.begin_traced(Some(parent))
            }
        };
        Ok(begun.ok().map(PyToken))
    }

    /// The W3C ``traceparent`` to hand the request's next stage on another
    /// host with its token: the request's trace, with its own span as the
    /// parent. ``None`` if the token names no open request.
    fn traceparent(&self, token: &Bound<'_, PyAny>) -> Option<String> {
        let t = token_arg(token).ok()?;
        self.view().trace_context(t).map(|c| c.to_string())
    }

    /// Starts segment ``segment`` on the edge ``from_stage -> to_stage`` of
    /// the request: a control operation of the edge's owner (recording never
    /// advances a segment). Later records for older segments are refused as
    /// stale. Returns ``True`` if it started; ``False`` if the segment is not
    /// newer than the current one, or for any runtime condition.
    fn start_segment(
        &self,
        token: &Bound<'_, PyAny>,
        from_stage: Stage,
        to_stage: Stage,
        segment: Segment,
    ) -> bool {
        self.do_start_segment(token, from_stage, to_stage, segment)
            .is_success()
    }

    /// ``start_segment`` that returns the outcome's name (``"started"``,
    /// ``"stale_segment"``, ``"closed"``, ...).
    fn start_segment_outcome<'py>(
        &self,
        py: Python<'py>,
        token: &Bound<'_, PyAny>,
        from_stage: Stage,
        to_stage: Stage,
        segment: Segment,
    ) -> Bound<'py, PyString> {
        outcome_str(
            py,
            self.do_start_segment(token, from_stage, to_stage, segment),
        )
    }

    /// A detached snapshot of the request as it is now, as the upstream
    /// ``metrics["stream_edge_metrics"]`` dict: ``"from->to:segment"`` to
    /// ``{from_stage, to_stage, segment_index, first_chunk_seq,
    /// clock_domains, <event>_ms...}``, missing values ``None``. ``{}`` for
    /// a request that recorded nothing, or a token of no open request.
    fn snapshot<'py>(
        &self,
        py: Python<'py>,
        token: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        snapshot::to_py(py, self.snap(token).as_ref())
    }

    /// ``snapshot`` as JSON text (the core's serialisation).
    fn snapshot_json(&self, token: &Bound<'_, PyAny>) -> String {
        snapshot::to_text(self.snap(token).as_ref())
    }

    /// Closes the request and returns its final snapshot (as ``snapshot``).
    ///
    /// Idempotent and never raising: every removal path (completion, abort,
    /// client disconnect, timeout, stage error) calls it. Closing a closed,
    /// reused or foreign token returns ``{}``. Later records are refused.
    /// ``None`` if another control operation of a live process held the
    /// request for the whole bounded wait (about a second): the request is
    /// still open, so close it again. ``None`` also when this process's
    /// mapping lost a page (the file was truncated under it, or a sparse
    /// region found no space): close then changes nothing, and a process
    /// that attaches the region again can close the request.
    fn close<'py>(
        &self,
        py: Python<'py>,
        token: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let snap = self.close_snap(py, token);
        if snap.as_ref().is_some_and(not_closed) {
            return Ok(None);
        }
        snapshot::to_py(py, snap.as_ref()).map(Some)
    }

    /// ``close`` that returns the final snapshot as JSON text (``None`` when
    /// busy or on a mapping that lost a page, as ``close``).
    fn close_json(&self, py: Python<'_>, token: &Bound<'_, PyAny>) -> Option<String> {
        let snap = self.close_snap(py, token);
        match &snap {
            Some(s) if not_closed(s) => None,
            _ => Some(snapshot::to_text(snap.as_ref())),
        }
    }

    /// Whether ``token`` names a request that is open in this region.
    fn is_open(&self, token: &Bound<'_, PyAny>) -> bool {
        self.snap(token)
            .is_some_and(|s| s.state() == RequestState::Open)
    }

    /// Whether ``event`` of segment ``segment`` of the edge ``from_stage ->
    /// to_stage`` is recorded for the open request ``token``, read after a
    /// full memory fence: the read of a close decision two parties make
    /// from each other's records. When party A records event X and then
    /// asks whether Y is in, and party B records Y and then asks whether X
    /// is in, at least one of them sees the other's event (without the
    /// fence, on Arm, both could miss, and nobody would close); both may
    /// see both, and ``close`` is idempotent.
    ///
    /// ``False`` for a closed, reused or foreign token, a value that is no
    /// token, an undeclared edge, a segment not started or no longer kept,
    /// an event not recorded yet, a disabled region: never raises for a
    /// runtime condition. Raises as ``record`` does for arguments of the
    /// wrong type (``TypeError``), a negative stage or segment or an event
    /// the schema lacks (``ValueError``).
    #[pyo3(
        signature = (token, from_stage, to_stage, event, segment = Segment(Ok(0))),
        text_signature = "($self, token, from_stage, to_stage, event, segment=0)"
    )]
    fn recorded(
        &self,
        token: &Bound<'_, PyAny>,
        from_stage: Stage,
        to_stage: Stage,
        event: &Bound<'_, PyAny>,
        segment: Segment,
    ) -> PyResult<bool> {
        let view = self.view();
        if !view.is_enabled() {
            return Ok(false);
        }
        let event = self.event_id(event)?;
        let (Ok(from), Ok(to), Ok(segment)) = (from_stage.0, to_stage.0, segment.0) else {
            return Ok(false);
        };
        Ok(token_arg(token).is_ok_and(|t| view.recorded(t, Edge::new(from, to), event, segment)))
    }

    /// Whether the region records (it is not ``Region.disabled()``).
    #[getter]
    fn enabled(&self) -> bool {
        self.view().is_enabled()
    }

    /// The region file's path as a ``str`` (``None`` in memory or
    /// disabled). A path that is not UTF-8 comes back as ``os.fsdecode``
    /// gives it (surrogate escapes), which ``attach`` takes back unchanged.
    #[getter]
    fn path(&self) -> Option<std::ffi::OsString> {
        self.view().path().map(|p| p.as_os_str().to_owned())
    }

    /// The declared edges, ``[(from_stage, to_stage), ...]`` in order.
    #[getter]
    fn edges(&self) -> Vec<(u32, u32)> {
        self.view().edges().iter().map(|e| (e.from, e.to)).collect()
    }

    /// The schema's event names, in schema order.
    #[getter]
    fn events(&self) -> Vec<String> {
        self.event_names()
    }

    /// The clock domains, declared and registered at run time, in id
    /// order; the first is always ``"host_monotonic"``.
    #[getter]
    fn domains(&self) -> Vec<String> {
        self.view().domains()
    }

    fn __repr__(&self) -> String {
        match (self.view().is_enabled(), self.path()) {
            (false, _) => "Region.disabled()".to_owned(),
            (true, Some(p)) => format!(
                "Region({:?}, edges={:?})",
                p.to_string_lossy(),
                self.edges()
            ),
            (true, None) => format!("Region(<in memory>, edges={:?})", self.edges()),
        }
    }
}
