//! `Region`: a handle on a region, the binding of the core's [`Recorder`].

use std::cell::Cell;

use edgemark::schema::EventId;
use edgemark::trace::TraceparentError;
use edgemark::{
    AttachOptions, Edge, Mark, Outcome, Recorder, RequestState, Snapshot, TraceContext, Viewer,
};
use pyo3::exceptions::{PyPermissionError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

use crate::args::{chunk_arg, path_arg, u32_field, when, ChunkArg, Segment, Stage, When};
use crate::errors::{attach_error, create_error, sweep_error};
use crate::events::Events;
use crate::handle::PyHandle;
use crate::outcome::outcome_str;
use crate::snapshot;
use crate::token::{token_arg, PyToken};

thread_local! {
    /// The outcome of this thread's last `Region.record`, which
    /// `record_outcome` reads back when it passes a call on to `record`.
    static LAST_OUTCOME: Cell<Outcome> = const { Cell::new(Outcome::Disabled) };
}

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
    fn wrap(py: Python<'_>, rec: Recorder, viewer: Option<Viewer>) -> PyResult<PyRegion> {
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
    fn event_id(&self, event: &Bound<'_, PyAny>) -> PyResult<EventId> {
        self.events
            .resolve(event)
            .map_err(|why| self.events.error(event, why))
    }

    fn event_names(&self) -> Vec<String> {
        self.events.names().to_vec()
    }

    /// `record` with its optional arguments at their defaults: the
    /// positional call, kept to the conversions it needs.
    #[inline(always)]
    fn record_now(
        &self,
        token: &Bound<'_, PyAny>,
        from_stage: u32,
        to_stage: u32,
        event: &Bound<'_, PyAny>,
    ) -> PyResult<Outcome> {
        // What `do_record` does for these arguments, in its order.
        if !self.rec.is_enabled() {
            return Ok(self.off());
        }
        let event = self.event_id(event)?;
        Ok(match token_arg(token) {
            Ok(t) => self
                .rec
                .record(t, Mark::new(Edge::new(from_stage, to_stage), event)),
            Err(why) => why,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn do_record(
        &self,
        token: &Bound<'_, PyAny>,
        from_stage: u32,
        to_stage: u32,
        event: &Bound<'_, PyAny>,
        meaningful: bool,
        chunk_seq: Option<&Bound<'_, PyAny>>,
        segment: u32,
        elapsed_ms: Option<f64>,
        clock_domain: Option<&Bound<'_, PyString>>,
    ) -> PyResult<Outcome> {
        // Off by default: a disabled region costs a branch.
        if !self.rec.is_enabled() {
            return Ok(self.off());
        }
        let event = self.event_id(event)?;
        let domain = match clock_domain {
            Some(d) => Some(d.to_cow()?),
            None => None,
        };
        let when = when(elapsed_ms, domain.as_deref()).map_err(PyValueError::new_err)?;
        let token = match token_arg(token) {
            Ok(t) => t,
            Err(why) => return Ok(why),
        };
        let mut mark = Mark::new(Edge::new(from_stage, to_stage), event)
            .segment(segment)
            .meaningful(meaningful);
        match chunk_arg(chunk_seq)? {
            ChunkArg::Absent => {}
            ChunkArg::Seq(c) => mark = mark.chunk_seq(c),
            ChunkArg::Negative => {
                return Err(PyValueError::new_err("chunk_seq must be non-negative"))
            }
        }
        Ok(match when {
            When::Elapsed(ms, domain) => self.rec.record_elapsed(token, mark, ms, domain),
            When::Now => self.rec.record(token, mark),
        })
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

/// The edges argument of `create`: pairs `(from, to)` (tuples or lists).
fn edge_list(edges: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<Edge>> {
    let Some(edges) = edges else {
        return Ok(vec![Edge::new(0, 1), Edge::new(1, 2)]);
    };
    if edges.cast::<PyString>().is_ok() {
        return Err(PyTypeError::new_err(
            "edges is a sequence of (from_stage, to_stage) pairs",
        ));
    }
    let mut out = Vec::new();
    for item in edges.try_iter()? {
        let item = item?;
        let pair: Vec<u32> = item.extract().map_err(|_| {
            PyValueError::new_err(format!(
                "an edge is a pair (from_stage, to_stage) of stage numbers, not {item}"
            ))
        })?;
        match pair[..] {
            [from, to] => out.push(Edge::new(from, to)),
            _ => {
                return Err(PyValueError::new_err(format!(
                    "an edge is a pair (from_stage, to_stage), not {item}"
                )))
            }
        }
    }
    Ok(out)
}

/// The domains argument of `create`: a sequence of names (not one name,
/// which would otherwise be read as a sequence of characters or bytes).
fn domain_list(domains: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
    let Some(domains) = domains.filter(|d| !d.is_none()) else {
        return Ok(Vec::new());
    };
    let type_error = || {
        PyTypeError::new_err(format!(
            "domains is a sequence of clock-domain names, such as [\"gpu\"], not {}",
            domains
                .get_type()
                .name()
                .map_or_else(|_| "?".to_owned(), |n| n.to_string())
        ))
    };
    // One name, as text or bytes, is no sequence of names.
    if domains.cast::<PyString>().is_ok()
        || domains.cast::<pyo3::types::PyBytes>().is_ok()
        || domains.cast::<pyo3::types::PyByteArray>().is_ok()
    {
        return Err(type_error());
    }
    let mut out = Vec::new();
    for item in domains.try_iter().map_err(|_| type_error())? {
        let item = item?;
        let name = item.cast::<PyString>().map_err(|_| {
            PyTypeError::new_err(format!(
                "a clock-domain name is a str, not {}",
                item.get_type()
                    .name()
                    .map_or_else(|_| "?".to_owned(), |n| n.to_string())
            ))
        })?;
        out.push(name.to_str()?.to_owned());
    }
    Ok(out)
}

fn builder(
    edges: Option<&Bound<'_, PyAny>>,
    slots: u32,
    segments: u32,
    domains: Option<&Bound<'_, PyAny>>,
    group_access: bool,
) -> PyResult<edgemark::RegionBuilder> {
    let domains = domain_list(domains)?;
    let mut b = Recorder::builder()
        .edges(edge_list(edges)?)
        .slots(slots)
        .segments(segments)
        .group_access(group_access);
    for d in &domains {
        b = b.domain(d);
    }
    Ok(b)
}

#[pymethods]
impl PyRegion {
    /// Creates a region file at ``path`` (a new file: never over an existing
    /// one, never through a symlink; owner-only unless ``group_access``) and
    /// returns a handle on it.
    ///
    /// ``edges`` declares the directed stage edges, default
    /// ``[(0, 1), (1, 2)]``; ``slots`` is how many requests can be open at
    /// once; ``segments`` how many of the newest segments each edge of a
    /// request keeps; ``domains`` names the clock domains of values measured
    /// elsewhere (``record(..., elapsed_ms=..., clock_domain=...)``) besides
    /// the shared ``"host_monotonic"``.
    ///
    /// ``clock="counter"`` asks for the time-stamp-counter shared clock
    /// where the kernel trusts the counter (else the region reads
    /// ``CLOCK_MONOTONIC``, the default ``"monotonic"``; ``info()["clock"]``
    /// says which it got; see docs/design.md, "The counter clock").
    ///
    /// The file's space is reserved at creation, so a full file system is
    /// found here: ``OSError`` with errno ``ENOSPC`` and a message naming
    /// the size and the file system. ``sparse=True`` leaves the file sparse
    /// instead (it takes memory only as requests use it), at a cost: a page
    /// that later finds no space is lost to the process that writes it
    /// (``begin`` returns ``None``, sweeps raise ``RegionNoSpaceError``).
    ///
    /// ``path`` is a ``str``, ``bytes`` (``os.fsencode``) or an
    /// ``os.PathLike``. Raises ``FileExistsError`` or another ``OSError``
    /// for the path, ``TypeError`` for arguments of the wrong type (such as
    /// one name for ``domains``), and ``ValueError`` for no edges, a
    /// duplicate or self edge, a bad geometry, a bad domain name or a clock
    /// that is neither.
    ///
    /// ``closed_entries`` sizes the ring of closed requests that
    /// ``drain_closed`` (and ``edgemark export --otlp``) reads: default the
    /// slot count, at most 4096; 0 keeps none.
    #[staticmethod]
    #[pyo3(
        signature = (path, edges = None, slots = 4096, segments = 4, domains = None, group_access = false, clock = "monotonic", sparse = false, closed_entries = None),
        text_signature = "(path, edges=[(0, 1), (1, 2)], slots=4096, segments=4, domains=(), group_access=False, clock='monotonic', sparse=False, closed_entries=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn create(
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        edges: Option<&Bound<'_, PyAny>>,
        slots: u32,
        segments: u32,
        domains: Option<&Bound<'_, PyAny>>,
        group_access: bool,
        clock: &str,
        sparse: bool,
        closed_entries: Option<u32>,
    ) -> PyResult<PyRegion> {
        // The core's own names (`Clock: FromStr`), and its message.
        let clock: edgemark::clock::Clock = clock.parse().map_err(PyValueError::new_err)?;
        let mut b = builder(edges, slots, segments, domains, group_access)?
            .clock(clock)
            .sparse(sparse);
        if let Some(n) = closed_entries {
            b = b.closed_entries(n);
        }
        let path = path_arg(path)?;
        let rec = py.detach(|| b.create(&path)).map_err(create_error)?;
        PyRegion::wrap(py, rec, None)
    }

    /// A region on the heap, private to this process: the same protocol
    /// without a file (tests, single-process use). Same arguments as
    /// ``create`` but the path.
    #[staticmethod]
    #[pyo3(
        signature = (edges = None, slots = 4096, segments = 4, domains = None),
        text_signature = "(edges=[(0, 1), (1, 2)], slots=4096, segments=4, domains=())"
    )]
    fn in_memory(
        py: Python<'_>,
        edges: Option<&Bound<'_, PyAny>>,
        slots: u32,
        segments: u32,
        domains: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyRegion> {
        let b = builder(edges, slots, segments, domains, false)?;
        let rec = b.create_in_memory().map_err(create_error)?;
        PyRegion::wrap(py, rec, None)
    }

    /// Attaches to the region file at ``path``, which every field of its
    /// header is checked against before use.
    ///
    /// Raises ``OSError`` (``FileNotFoundError``, ``PermissionError``, ...)
    /// for the path and ``ValueError`` for a file that is not a working
    /// region (bad magic, unpublished header, other version, bad geometry or
    /// schema) or whose clock is another boot's or time namespace's (unless
    /// ``allow_foreign_clock``: the clock-reading ``record`` then returns
    /// ``"clock_mismatch"``, values measured elsewhere still record).
    ///
    /// ``path`` is a ``str``, ``bytes`` (``os.fsencode``) or an
    /// ``os.PathLike``, as for ``create``.
    ///
    /// ``allow_foreign_owner`` attaches to a file that another user created
    /// (a region created with ``group_access=True`` and handed to a group):
    /// trust that user, since a writer can forge values and fill the region.
    /// ``read_only`` opens and maps the file for reading only, which read
    /// permission allows: snapshots, sweeps and counters work; ``begin``
    /// returns ``None`` and ``record`` ``False`` (outcome ``"read_only"``).
    #[staticmethod]
    #[pyo3(signature = (path, allow_foreign_clock = false, allow_foreign_owner = false, read_only = false))]
    fn attach(
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        allow_foreign_clock: bool,
        allow_foreign_owner: bool,
        read_only: bool,
    ) -> PyResult<PyRegion> {
        let opts = AttachOptions::new()
            .allow_foreign_clock(allow_foreign_clock)
            .allow_foreign_owner(allow_foreign_owner);
        let path = path_arg(path)?;
        if read_only {
            let viewer = py.detach(|| opts.view(&path)).map_err(attach_error)?;
            return PyRegion::wrap(py, Recorder::disabled(), Some(viewer));
        }
        let rec = py.detach(|| opts.attach(&path)).map_err(attach_error)?;
        PyRegion::wrap(py, rec, None)
    }

    /// A region that records nothing, for collection that is off by default:
    /// ``begin`` returns ``None``, ``record`` ``False`` (outcome
    /// ``"disabled"``), snapshots are ``{}``. Its calls cost about a branch.
    #[staticmethod]
    fn disabled(py: Python<'_>) -> PyResult<PyRegion> {
        PyRegion::wrap(py, Recorder::disabled(), None)
    }

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

    /// Takes up to ``max`` closed requests from the region's ring of closed
    /// requests, oldest first; each reaches exactly one reader of all the
    /// processes that drain. Returns a list of dicts: ``token``,
    /// ``trace_id`` and ``span_id`` (hex; the request's own span),
    /// ``parent_span_id`` (hex, or ``None`` when its trace started here),
    /// ``trace_flags``, ``origin_unix_ns``, ``closed_unix_ns`` and
    /// ``snapshot`` (as ``close`` returned it). Losses (a reader a ring
    /// behind) are counted in ``counters()["closed_lost"]``.
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

    /// Records the first ``event`` of the request ``token`` on segment
    /// ``segment`` of the edge ``from_stage -> to_stage``; returns ``True``
    /// only if this call recorded it.
    ///
    /// ``event`` is an ``edgemark.Event`` or its name. ``meaningful=False``
    /// (a heartbeat, retry, metadata-only or empty terminal payload) records
    /// nothing. ``chunk_seq`` is kept by the producer event's winning write.
    /// Without ``elapsed_ms`` the value is now on the shared clock, from the
    /// request's origin; with it, ``elapsed_ms`` milliseconds measured
    /// elsewhere in ``clock_domain`` (default ``"host_monotonic"``).
    ///
    /// Never raises for runtime conditions (``record_outcome`` says which
    /// one refused a call); raises ``ValueError`` for an event the region's
    /// schema lacks. A caller that records one edge and event of one request
    /// from a hot loop can resolve them once with ``handle``.
    #[pyo3(signature = (token, from_stage, to_stage, event, meaningful = true, chunk_seq = None, segment = Segment(Ok(0)), elapsed_ms = None, clock_domain = None))]
    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        token: &Bound<'_, PyAny>,
        from_stage: Stage,
        to_stage: Stage,
        event: &Bound<'_, PyAny>,
        meaningful: bool,
        chunk_seq: Option<&Bound<'_, PyAny>>,
        segment: Segment,
        elapsed_ms: Option<f64>,
        clock_domain: Option<&Bound<'_, PyString>>,
    ) -> PyResult<bool> {
        let (from, to, segment) = match (from_stage.0, to_stage.0, segment.0) {
            (Ok(f), Ok(t), Ok(s)) => (f, t, s),
            // An int too large for its field: a refusal, as a value beyond
            // a cell's range is (the event is still checked first).
            (Err(why), _, _) | (_, Err(why), _) | (_, _, Err(why)) => {
                let o = if self.rec.is_enabled() {
                    self.event_id(event)?;
                    why
                } else {
                    self.off()
                };
                LAST_OUTCOME.set(o);
                return Ok(false);
            }
        };
        let defaults = meaningful
            && chunk_seq.is_none()
            && segment == 0
            && elapsed_ms.is_none()
            && clock_domain.is_none();
        let o = if defaults {
            self.record_now(token, from, to, event)?
        } else {
            self.do_record(
                token,
                from,
                to,
                event,
                meaningful,
                chunk_seq,
                segment,
                elapsed_ms,
                clock_domain,
            )?
        };
        LAST_OUTCOME.set(o);
        Ok(o.is_success())
    }

    /// ``record`` with the same arguments, returning the outcome's name
    /// instead of a bool: one of ``edgemark.OUTCOME_NAMES`` (the core's
    /// list), to which ``edgemark.Outcome`` members compare equal.
    ///
    /// The positional call ``record_outcome(token, from_stage, to_stage,
    /// event)`` records directly; any other passes its arguments on to
    /// ``record``, which declares them, and costs a second call: for
    /// diagnosis, not for a hot path.
    #[pyo3(signature = (*args, **kwargs))]
    fn record_outcome<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyString>> {
        let py = slf.py();
        // The four required arguments alone, and stages that convert: what
        // `record`'s parser would accept, so the call is `record`'s own
        // body. Anything else, including every argument error, goes through
        // `record`, whose parser raises it as it declares it.
        if kwargs.is_none() && args.len() == 4 {
            let arg = |i| args.get_borrowed_item(i);
            let (token, from, to, event) = (arg(0)?, arg(1)?, arg(2)?, arg(3)?);
            if let (Ok(Stage(Ok(from))), Ok(Stage(Ok(to)))) =
                (from.extract::<Stage>(), to.extract::<Stage>())
            {
                let o = slf.get().record_now(&token, from, to, &event)?;
                return Ok(outcome_str(py, o));
            }
        }
        // `record` owns the signature: call it as Python would, through
        // the class's method (no bound method to make), then read the
        // outcome it left on this thread. Nothing runs on this thread
        // between its return and the read.
        static RECORD: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        let record = RECORD.get_or_try_init(py, || {
            Ok::<_, PyErr>(slf.get_type().getattr("record")?.unbind())
        })?;
        let mut all = Vec::with_capacity(args.len() + 1);
        all.push(slf.as_any().clone());
        all.extend(args.iter());
        let with_self = PyTuple::new(py, all)?;
        record.bind(py).call(with_self, kwargs)?;
        Ok(outcome_str(py, LAST_OUTCOME.get()))
    }

    /// A handle on one edge and event of the request ``token``, resolved
    /// once: ``handle.record()`` then records with no argument to convert,
    /// ``handle.record_elapsed(ms, clock_domain)`` a value measured
    /// elsewhere. Raises what ``record`` raises for the same arguments
    /// (``ValueError`` for an event the schema lacks); a token that is no
    /// token, ``None`` or a disabled region give a handle whose records
    /// return ``False`` (its ``outcome`` says why).
    #[pyo3(signature = (token, from_stage, to_stage, event, segment = None, chunk_seq = None))]
    #[allow(clippy::too_many_arguments)]
    fn handle(
        slf: &Bound<'_, Self>,
        token: &Bound<'_, PyAny>,
        from_stage: &Bound<'_, PyAny>,
        to_stage: &Bound<'_, PyAny>,
        event: &Bound<'_, PyAny>,
        segment: Option<&Bound<'_, PyAny>>,
        chunk_seq: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyHandle> {
        let me = slf.get();
        let from = u32_field(from_stage, "a stage number", Outcome::UnknownEdge)?;
        let to = u32_field(to_stage, "a stage number", Outcome::UnknownEdge)?;
        let seg = match segment {
            Some(s) => u32_field(s, "a segment index", Outcome::OutOfRange)?,
            None => Ok(0),
        };
        let seg_text = segment.map_or_else(|| "0".to_owned(), |s| s.to_string());
        let label = |e: &str| format!("{from_stage}->{to_stage}:{seg_text} {e}");
        // An int too large for its field makes a handle whose records are
        // refused with why (as `record` refuses them).
        let too_large = match (from, to, seg) {
            (Err(why), _, _) | (_, Err(why), _) | (_, _, Err(why)) => Some(why),
            _ => None,
        };
        let (edge, segment) = (
            Edge::new(from.unwrap_or(0), to.unwrap_or(0)),
            seg.unwrap_or(0),
        );
        if !me.rec.is_enabled() {
            let mark = Mark::new(edge, EventId(0));
            return Ok(PyHandle::new(
                &me.rec,
                Err(me.off()),
                mark,
                label(&event.to_string()),
            ));
        }
        let id = me.event_id(event)?;
        let mut mark = Mark::new(edge, id).segment(segment);
        match chunk_arg(chunk_seq)? {
            ChunkArg::Absent => {}
            ChunkArg::Seq(c) => mark = mark.chunk_seq(c),
            ChunkArg::Negative => {
                return Err(PyValueError::new_err("chunk_seq must be non-negative"))
            }
        }
        let name = &me.event_names()[usize::from(id.0)];
        let target = match too_large {
            Some(why) => Err(why),
            None => token_arg(token),
        };
        Ok(PyHandle::new(&me.rec, target, mark, label(name)))
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
    /// "unjudged": why}``: ``why`` is ``None``, or
    /// ``"mixed_pid_namespaces"`` / ``"other_pid_namespace"`` when no pid
    /// could be judged and nothing was freed (docs/limitations.md).
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
        let d = PyDict::new(py);
        d.set_item("dead_owners", r.dead_owners)?;
        d.set_item("dead_holders", r.dead_holders)?;
        d.set_item("unjudged", r.unjudged.map(|w| w.name()))?;
        Ok(d)
    }

    /// The region's counters: ``{"refused": {outcome: n, ...},
    /// "dropped_segments": n, "closed_requests": n, "reclaimed_requests":
    /// n, "closed_lost": n, "bad_trace_contexts": n}``.
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.view().counters();
        let refused = PyDict::new(py);
        for (o, n) in &c.refused {
            refused.set_item(o.name(), n)?;
        }
        let d = PyDict::new(py);
        d.set_item("refused", refused)?;
        d.set_item("dropped_segments", c.dropped_segments)?;
        d.set_item("closed_requests", c.closed_requests)?;
        d.set_item("reclaimed_requests", c.reclaimed_requests)?;
        d.set_item("closed_lost", c.closed_lost)?;
        d.set_item("bad_trace_contexts", c.bad_trace_contexts)?;
        Ok(d)
    }

    /// The region's geometry and identity as a dict, ``None`` when disabled.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(i) = self.view().info() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("path", self.path())?;
        d.set_item("region_id", i.region_id.to_string())?;
        d.set_item("slots", i.slots)?;
        d.set_item("segments", i.segments)?;
        d.set_item("bytes", i.bytes)?;
        d.set_item("slot_stride", i.slot_stride)?;
        d.set_item("slots_offset", i.slots_offset)?;
        d.set_item("edges", self.edges())?;
        d.set_item("events", self.event_names())?;
        d.set_item("domains", self.domains())?;
        d.set_item("shares_clock", i.shares_clock)?;
        d.set_item("clock", i.clock_kind.name())?;
        d.set_item("created_unix_ns", i.created_unix_ns)?;
        d.set_item("creator_pid", i.creator_pid)?;
        d.set_item("group_access", i.group_access)?;
        d.set_item("mixed_pid_namespaces", i.mixed_pid_namespaces)?;
        d.set_item("pids_unjudged", i.pids_unjudged.map(|w| w.name()))?;
        Ok(Some(d))
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

    /// Registers the clock domain ``name`` (any attached process may; a
    /// record naming a new domain does it too) and returns its id.
    /// Idempotent. ``ValueError`` for a name that cannot name a domain
    /// (empty or blank, over 32 bytes, a control or invisible format
    /// character such as a bidirectional control); a full table
    /// (32 domains) or a disabled region returns ``None``.
    fn register_domain(&self, name: &str) -> PyResult<Option<u8>> {
        match self.rec.register_domain(name) {
            Ok(d) => Ok(Some(d.0)),
            // The core's words for its rule of names.
            Err(edgemark::Outcome::UnknownDomain) => Err(PyValueError::new_err(
                edgemark::schema::SchemaError::BadName(name.to_owned()).to_string(),
            )),
            Err(_) => Ok(None),
        }
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
