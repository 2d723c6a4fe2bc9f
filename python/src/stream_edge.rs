//! `StreamEdgeRecorder`: the handle of `edgemark.stream_edge`, resolved once
//! to one request, one directed edge and one segment, so that a record is
//! one native call with the upstream module's arguments.
//!
//! It keeps the upstream module's contract rather than the plain binding's:
//! an empty payload, a closed request and a stale segment return `False`
//! before any argument is looked at; on an open request an unknown event, a
//! negative or non-finite elapsed time, a clock domain that is no name
//! (blank, say) and a negative chunk sequence raise `ValueError`
//! (upstream's messages), and leave no value recorded. The core decides
//! which elapsed times and names it takes (its `invalid` and
//! `unknown_domain` refusals are what raise); every other refusal of the
//! core (duplicate, stale, closed, full region, unknown edge, ...) is
//! `False`.

use edgemark::schema::{EventId, SchemaError};
use edgemark::{Edge, Mark, Outcome, Recorder, RequestState, Token};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyString;

use crate::args::{chunk_arg, when, ChunkArg, When};
use crate::region::PyRegion;
use crate::token::{token_arg, PyToken};

/// Where a handle records: an open request of a region, one edge, one
/// segment.
struct Target {
    region: Py<PyRegion>,
    token: Token,
    edge: Edge,
    segment: u32,
    /// The schema position of each `StreamEdgeEvent` member, in the enum's
    /// order (`None` for one the region's schema lacks), resolved once so
    /// that a record passing a member compares pointers instead of names.
    members: Vec<Option<EventId>>,
}

/// The members of `edgemark.stream_edge.StreamEdgeEvent`, in order.
static MEMBERS: PyOnceLock<Vec<Py<PyAny>>> = PyOnceLock::new();

fn members(py: Python<'_>) -> PyResult<&Vec<Py<PyAny>>> {
    MEMBERS.get_or_try_init(py, || {
        let cls = py
            .import("edgemark.stream_edge")?
            .getattr("StreamEdgeEvent")?;
        cls.try_iter()?
            .map(|m| m.map(Bound::unbind))
            .collect::<PyResult<Vec<_>>>()
    })
}

/// A handle on one segment of one directed stage edge of one request, as
/// ``RequestStreamEdgeEvents.start_segment`` returns it.
///
/// ``record(event, *, elapsed_ms=None, clock_domain=None, meaningful,
/// chunk_seq=None)`` records the first ``event`` and returns ``True`` only if
/// this call recorded it. Without ``elapsed_ms`` the value is read from the
/// region's shared clock.
///
/// A handle pickles to the region's path, the request's token and the key
/// (a couple of hundred bytes), so it can travel inside a dispatch message;
/// the process that unpickles it attaches the region by path (once per
/// process) and records straight into it. A handle whose request runs
/// unrecorded (full or disabled region) records nothing anywhere.
#[pyclass(module = "edgemark.stream_edge", name = "StreamEdgeRecorder", frozen)]
pub(crate) struct PyStreamEdgeRecorder {
    /// `None`: the request runs unrecorded, every record returns `False`.
    target: Option<Target>,
    /// The `StreamEdgeKey` the handle was started for.
    key: Py<PyAny>,
}

impl Target {
    fn rec(&self) -> &Recorder {
        &self.region.get().rec
    }

    /// The schema position `event` names, through the region's resolver.
    fn event_id(&self, event: &Bound<'_, PyAny>) -> Option<EventId> {
        self.region.get().events.resolve(event).ok()
    }

    /// A bad argument: `ValueError` if the request is open, as upstream
    /// raises once a record got past its empty, closed and stale checks;
    /// `False` for a request that is gone, as upstream returns for a closed
    /// one. (The segment check cannot be made without recording; see
    /// docs/vllm-omni.md.)
    fn refuse(&self, msg: impl FnOnce() -> String) -> PyResult<Outcome> {
        if self.region.get().view().snapshot(self.token).state() == RequestState::Open {
            Err(PyValueError::new_err(msg()))
        } else {
            Ok(Outcome::Closed)
        }
    }
}

impl PyStreamEdgeRecorder {
    fn do_record(
        &self,
        event: &Bound<'_, PyAny>,
        elapsed_ms: Option<&Bound<'_, PyAny>>,
        clock_domain: Option<&Bound<'_, PyAny>>,
        meaningful: &Bound<'_, PyAny>,
        chunk_seq: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Outcome> {
        // Upstream's order: an empty payload (and, below, a closed request)
        // returns False before any argument is checked.
        if !meaningful.is_truthy()? {
            return Ok(Outcome::NotMeaningful);
        }
        let Some(t) = &self.target else {
            return Ok(Outcome::Disabled);
        };
        let rec = t.rec();
        let py = event.py();
        // A member of `StreamEdgeEvent`, the common call: found by identity.
        let member = members(py)?
            .iter()
            .position(|m| event.is(m))
            .map(|i| t.members[i]);
        let Some(event) = member.unwrap_or_else(|| t.event_id(event)) else {
            return t.refuse(|| format!("Unknown stream-edge event {event}"));
        };
        let ms = match elapsed_ms {
            Some(v) => Some(v.extract::<f64>()?),
            None => None,
        };
        let domain = match clock_domain {
            Some(d) => Some(
                d.cast::<PyString>()
                    .map_err(|_| PyTypeError::new_err("clock_domain is a str"))?
                    .to_str()?,
            ),
            None => None,
        };
        // Upstream's rule: a value measured elsewhere names its domain.
        if ms.is_some() && domain.is_none() {
            return t.refuse(|| "Event clock domain must be declared with elapsed_ms".into());
        }
        let when = match when(ms, domain) {
            Ok(w) => w,
            Err(msg) => return t.refuse(|| msg),
        };
        let chunk = match chunk_arg(chunk_seq)? {
            ChunkArg::Absent => None,
            ChunkArg::Seq(c) => Some(c),
            ChunkArg::Negative => return t.refuse(|| "Chunk sequence must be non-negative".into()),
        };
        let mut mark = Mark::new(t.edge, event).segment(t.segment);
        if let Some(c) = chunk {
            mark = mark.chunk_seq(c);
        }
        match when {
            When::Now => Ok(rec.record(t.token, mark)),
            // The two refusals of the core that upstream raises for: an
            // elapsed time that is no time, a name that names no domain.
            When::Elapsed(ms, domain) => match rec.record_elapsed(t.token, mark, ms, domain) {
                Outcome::Invalid => t.refuse(|| {
                    format!("Event elapsed time must be finite and non-negative, not {ms}")
                }),
                Outcome::UnknownDomain => t.refuse(|| {
                    let why = SchemaError::BadName(domain.to_owned());
                    format!("Event clock domain must be declared: {why}")
                }),
                o => Ok(o),
            },
        }
    }
}

#[pymethods]
impl PyStreamEdgeRecorder {
    /// ``StreamEdgeRecorder(region, token, key)``: the handle of ``key`` (a
    /// ``StreamEdgeKey``) for the request ``token`` of ``region``.
    /// ``RequestStreamEdgeEvents.start_segment`` makes them; a ``None``
    /// region or token, or stages beyond 32 bits, give a handle that records
    /// nothing.
    #[new]
    fn new(
        region: Option<Py<PyRegion>>,
        token: &Bound<'_, PyAny>,
        key: &Bound<'_, PyAny>,
    ) -> PyResult<PyStreamEdgeRecorder> {
        let field =
            |name: &str| -> PyResult<Option<u32>> { Ok(key.getattr(name)?.extract::<u32>().ok()) };
        let (from, to, seg) = (
            field("from_stage")?,
            field("to_stage")?,
            field("segment_index")?,
        );
        let target = match (region, token_arg(token), from, to, seg) {
            (Some(region), Ok(token), Some(from), Some(to), Some(segment))
                if region.get().rec.is_enabled() =>
            {
                let events = &region.get().events;
                let members = members(key.py())?
                    .iter()
                    .map(|m| events.resolve(m.bind(key.py())).ok())
                    .collect();
                Some(Target {
                    region,
                    token,
                    edge: Edge::new(from, to),
                    segment,
                    members,
                })
            }
            _ => None,
        };
        Ok(PyStreamEdgeRecorder {
            target,
            key: key.clone().unbind(),
        })
    }

    /// Records the first ``event`` (a ``StreamEdgeEvent``) of this handle's
    /// request, edge and segment; ``True`` only if this call recorded it.
    ///
    /// ``meaningful=False`` (a heartbeat, retry, metadata-only or empty
    /// terminal payload) records nothing. ``elapsed_ms`` with
    /// ``clock_domain`` is a value measured elsewhere, in milliseconds from
    /// the request's origin in that domain; without them the value is read
    /// from the region's shared clock. ``chunk_seq`` is kept by the producer
    /// event's winning write.
    ///
    /// ``False`` for a duplicate, an empty payload, a stale segment, a closed
    /// request, a full region and every other runtime refusal; ``ValueError``
    /// on an open request for an unknown event, a negative or non-finite
    /// ``elapsed_ms``, a ``clock_domain`` that names no domain (blank, over
    /// 32 bytes, with a control or invisible format character) or a
    /// negative ``chunk_seq`` (nothing is recorded).
    #[pyo3(signature = (event, *, elapsed_ms = None, clock_domain = None, meaningful, chunk_seq = None))]
    fn record(
        &self,
        event: &Bound<'_, PyAny>,
        elapsed_ms: Option<&Bound<'_, PyAny>>,
        clock_domain: Option<&Bound<'_, PyAny>>,
        meaningful: &Bound<'_, PyAny>,
        chunk_seq: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        Ok(self
            .do_record(event, elapsed_ms, clock_domain, meaningful, chunk_seq)?
            .is_success())
    }

    /// The ``StreamEdgeKey`` of the handle.
    #[getter]
    fn key(&self, py: Python<'_>) -> Py<PyAny> {
        self.key.clone_ref(py)
    }

    /// The request's ``Token``; ``None`` for a request that runs unrecorded.
    #[getter]
    fn token(&self) -> Option<PyToken> {
        self.target.as_ref().map(|t| PyToken(t.token))
    }

    /// Whether records through this handle can land (the request was
    /// recorded when it began; it may be closed since).
    #[getter]
    fn recording(&self) -> bool {
        self.target.is_some()
    }

    /// Pickles as ``_restore(path, token, from_stage, to_stage,
    /// segment_index)``. A handle on a region in one process's memory cannot
    /// cross processes: ``TypeError``.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        static RESTORE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        let py = slf.py();
        let me = slf.get();
        let restore = RESTORE
            .import(py, "edgemark.stream_edge", "_restore")?
            .clone();
        let (path, token) = match &me.target {
            None => (None, None),
            Some(t) => match t.region.get().view().path() {
                // A str (not a pathlib.Path): shorter, and what `Region.path` gives.
                Some(p) => (Some(p.as_os_str().to_owned()), Some(t.token.to_string())),
                None => {
                    return Err(PyTypeError::new_err(
                        "a handle on an in-memory region cannot leave its process: \
                         create the region with a path (Region.create) to send handles to other processes",
                    ))
                }
            },
        };
        let key = me.key.bind(py);
        let args = (
            path,
            token,
            key.getattr("from_stage")?,
            key.getattr("to_stage")?,
            key.getattr("segment_index")?,
        )
            .into_pyobject(py)?
            .into_any();
        Ok((restore, args))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let key = self.key.bind(py).repr()?;
        Ok(match &self.target {
            Some(t) => format!("StreamEdgeRecorder({key}, token='{}')", t.token),
            None => format!("StreamEdgeRecorder({key}, unrecorded)"),
        })
    }
}
