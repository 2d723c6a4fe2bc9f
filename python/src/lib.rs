//! Python bindings of edgemark (built with maturin; see python/README.md).
//!
//! The native module `edgemark._edgemark` holds two classes, `Region` (a
//! [`Recorder`]) and `Token`; the pure-Python package `edgemark` around it
//! adds the `Event` and `Outcome` enums and `elapsed_between`.
//!
//! The binding keeps the core's contract (brief S10): runtime conditions are
//! outcomes, never exceptions. Only programmer and configuration errors
//! raise, and they raise where they are made: a bad path or file at
//! `create`/`attach` (`OSError`, `ValueError`), an event name that is not in
//! the region's schema (`ValueError`), an argument of the wrong type
//! (`TypeError`, `OverflowError`, from PyO3's argument conversion).

use std::path::PathBuf;

use edgemark::{
    AttachError, AttachOptions, CreateError, Edge, EventId, Mark, Outcome, Recorder, RequestState,
    Snapshot, Token, HOST_MONOTONIC,
};
use pyo3::exceptions::{
    PyFileExistsError, PyOSError, PyPermissionError, PyTypeError, PyValueError,
};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::Value;

// ---------------------------------------------------------------------------
// Outcomes.

/// Every outcome, in the core's declaration order.
const OUTCOMES: [Outcome; 19] = Outcome::ALL;

/// The outcome's name as an interned Python string: one static lookup per
/// call site, no allocation on the record path.
fn outcome_str<'py>(py: Python<'py>, o: Outcome) -> Bound<'py, PyString> {
    macro_rules! names {
        ($($variant:ident => $name:literal),* $(,)?) => {
            match o {
                $(Outcome::$variant => intern!(py, $name).clone(),)*
                // The core's enum is non-exhaustive: a newer outcome still
                // has a name.
                other => PyString::intern(py, other.name()),
            }
        };
    }
    names!(
        Recorded => "recorded",
        Started => "started",
        Duplicate => "duplicate",
        NotMeaningful => "not_meaningful",
        StaleSegment => "stale_segment",
        SegmentNotStarted => "segment_not_started",
        Closed => "closed",
        Reused => "reused",
        ClockMismatch => "clock_mismatch",
        Invalid => "invalid",
        OutOfRange => "out_of_range",
        UnknownEdge => "unknown_edge",
        UnknownEvent => "unknown_event",
        UnknownDomain => "unknown_domain",
        ForeignToken => "foreign_token",
        RegionFull => "region_full",
        Busy => "busy",
        Corrupt => "corrupt",
        Disabled => "disabled",
    )
}

// ---------------------------------------------------------------------------
// Errors at set-up.

fn os_error(e: &std::io::Error, msg: String, path: &std::path::Path) -> PyErr {
    // OSError(errno, strerror, filename): Python picks the subclass
    // (FileNotFoundError, PermissionError, ...) from the errno.
    PyOSError::new_err((
        e.raw_os_error().unwrap_or(0),
        msg,
        path.to_string_lossy().into_owned(),
    ))
}

fn create_error(e: CreateError) -> PyErr {
    let msg = e.to_string();
    match &e {
        CreateError::Exists(p) => {
            PyFileExistsError::new_err((libc_eexist(), msg, p.to_string_lossy().into_owned()))
        }
        CreateError::Io(p, io) => os_error(io, msg, p),
        _ => PyValueError::new_err(msg),
    }
}

fn attach_error(e: AttachError) -> PyErr {
    let msg = e.to_string();
    match &e {
        AttachError::Io(p, io) => os_error(io, msg, p),
        AttachError::NotRegularFile(_) => PyOSError::new_err(msg),
        AttachError::ForeignOwner { .. } => PyPermissionError::new_err(msg),
        // Everything about the file's content: not a region, not published
        // yet, another version, a bad geometry or schema, another clock.
        _ => PyValueError::new_err(msg),
    }
}

/// EEXIST on Linux (the only platform edgemark supports).
const fn libc_eexist() -> i32 {
    17
}

// ---------------------------------------------------------------------------
// Token.

/// One request instance in one region: the region's ID, a slot and the
/// slot's generation when the request began.
///
/// A token travels inside the dispatch message a stage worker already gets,
/// in one of its stable forms: ``str(token)`` (``"em1.<region>.<slot>.<gen>"``,
/// at most 38 ASCII characters), ``bytes(token)`` (16 bytes) or ``int(token)``
/// (a 128-bit integer). ``Token(value)`` and ``Token.parse`` /
/// ``Token.from_bytes`` / ``Token.from_int`` read them back. Tokens pickle,
/// compare equal by value and hash.
#[pyclass(module = "edgemark", name = "Token", frozen, eq, hash)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct PyToken(Token);

fn parse_token(s: &str) -> PyResult<Token> {
    s.parse::<Token>()
        .map_err(|e| PyValueError::new_err(format!("{e}: {s:?}")))
}

fn token_from_bytes(b: &[u8]) -> PyResult<Token> {
    let arr: [u8; 16] = b
        .try_into()
        .map_err(|_| PyValueError::new_err(format!("a token is 16 bytes, not {}", b.len())))?;
    Ok(Token::from_bytes(arr))
}

#[pymethods]
impl PyToken {
    /// ``Token(value)``: a token from any of its forms (a ``Token``, its
    /// text, its 16 bytes or its integer). Raises ``ValueError`` for a value
    /// that is no token's form, ``TypeError`` for another type.
    #[new]
    fn new(value: &Bound<'_, PyAny>) -> PyResult<PyToken> {
        if let Ok(t) = value.cast::<PyToken>() {
            return Ok(*t.get());
        }
        if let Ok(s) = value.cast::<PyString>() {
            return Ok(PyToken(parse_token(&s.to_cow()?)?));
        }
        if let Ok(b) = value.cast::<PyBytes>() {
            return Ok(PyToken(token_from_bytes(b.as_bytes())?));
        }
        if value.cast::<PyInt>().is_ok() {
            let v: u128 = value
                .extract()
                .map_err(|_| PyValueError::new_err("a token's integer is 0 <= n < 2**128"))?;
            return Ok(PyToken(Token::from_u128(v)));
        }
        Err(PyTypeError::new_err(format!(
            "a token is made from a Token, str, bytes or int, not {}",
            value.get_type().name()?
        )))
    }

    /// The token written as ``str(token)``. Raises ``ValueError`` if ``s``
    /// is not one.
    #[staticmethod]
    fn parse(s: String) -> PyResult<PyToken> {
        Ok(PyToken(parse_token(&s)?))
    }

    /// The token written as ``bytes(token)`` (16 little-endian bytes).
    /// Raises ``ValueError`` for any other length.
    #[staticmethod]
    fn from_bytes(b: &[u8]) -> PyResult<PyToken> {
        Ok(PyToken(token_from_bytes(b)?))
    }

    /// The token written as ``int(token)``.
    #[staticmethod]
    fn from_int(v: u128) -> PyToken {
        PyToken(Token::from_u128(v))
    }

    /// The slot index.
    #[getter]
    fn slot(&self) -> u32 {
        self.0.slot()
    }

    /// The slot's generation when the request began (never 0).
    #[getter]
    fn generation(&self) -> u32 {
        self.0.generation()
    }

    /// The ID of the region the token belongs to.
    #[getter]
    fn region_id(&self) -> u64 {
        self.0.region_id()
    }

    fn __str__(&self) -> String {
        self.0.to_string()
    }

    fn __repr__(&self) -> String {
        format!("Token('{}')", self.0)
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.0.to_bytes())
    }

    fn __int__(&self) -> u128 {
        self.0.to_u128()
    }

    /// Pickles as ``Token(str(token))``.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let text = slf.get().0.to_string();
        PyTuple::new(
            py,
            [
                slf.get_type().into_any(),
                PyTuple::new(py, [text])?.into_any(),
            ],
        )
    }
}

/// A token argument of a recording call, read without raising: a `Token`,
/// its text, bytes or integer, or `None` (the request runs unrecorded).
///
/// This is runtime data (it arrives inside a message), so a value that is no
/// token is an outcome, not an exception: `None` is `disabled` (recording is
/// off for this request, as when `begin` returned `None`), anything else that
/// is not a token is `invalid`.
fn token_arg(value: &Bound<'_, PyAny>) -> Result<Token, Outcome> {
    if let Ok(t) = value.cast::<PyToken>() {
        return Ok(t.get().0);
    }
    if value.is_none() {
        return Err(Outcome::Disabled);
    }
    if let Ok(s) = value.cast::<PyString>() {
        return s
            .to_cow()
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or(Outcome::Invalid);
    }
    if let Ok(b) = value.cast::<PyBytes>() {
        return token_from_bytes(b.as_bytes()).map_err(|_| Outcome::Invalid);
    }
    if value.cast::<PyInt>().is_ok() {
        return value
            .extract::<u128>()
            .map(Token::from_u128)
            .map_err(|_| Outcome::Invalid);
    }
    Err(Outcome::Invalid)
}

// ---------------------------------------------------------------------------
// Snapshots as Python values.

/// A JSON value as the Python value `json.loads` would give for it: objects
/// as dicts in the same key order, integers as int, floats as float (10.0
/// stays a float), null as None.
fn json_to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else {
                PyFloat::new(py, n.as_f64().unwrap_or(f64::NAN)).into_any()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(a) => {
            let list = PyList::empty(py);
            for x in a {
                list.append(json_to_py(py, x)?)?;
            }
            list.into_any()
        }
        Value::Object(m) => {
            let dict = PyDict::new(py);
            for (k, x) in m {
                dict.set_item(PyString::intern(py, k), json_to_py(py, x)?)?;
            }
            dict.into_any()
        }
    })
}

fn snapshot_to_py<'py>(py: Python<'py>, s: &Snapshot) -> PyResult<Bound<'py, PyAny>> {
    json_to_py(py, &s.to_json())
}

fn snapshot_text(s: &Snapshot) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "{}".to_owned())
}

// ---------------------------------------------------------------------------
// Region.

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
struct PyRegion {
    rec: Recorder,
    /// Event name (str) to schema position (int), looked up by the string's
    /// cached hash: no UTF-8 conversion on the record path.
    events: Py<PyDict>,
    /// How many events the schema declares (0 when disabled).
    n_events: usize,
}

impl PyRegion {
    fn wrap(py: Python<'_>, rec: Recorder) -> PyResult<PyRegion> {
        let events = PyDict::new(py);
        if let Some(schema) = rec.schema() {
            for (i, e) in schema.events().iter().enumerate() {
                events.set_item(PyString::intern(py, e.name()), i)?;
            }
        }
        Ok(PyRegion {
            n_events: events.len(),
            rec,
            events: events.unbind(),
        })
    }

    /// The schema position of `event`: an `Event` (an int) or its name.
    /// An event the schema does not declare is a programmer error.
    fn event_id(&self, py: Python<'_>, event: &Bound<'_, PyAny>) -> PyResult<EventId> {
        let n = self.n_events;
        if let Ok(i) = event.cast::<PyInt>() {
            return match i.extract::<usize>() {
                Ok(i) if i < n => Ok(EventId(i as u8)),
                _ => Err(PyValueError::new_err(format!(
                    "event {i} is not in the region's schema ({n} events)"
                ))),
            };
        }
        if event.cast::<PyString>().is_ok() {
            return match self.events.bind(py).get_item(event)? {
                Some(i) => Ok(EventId(i.extract::<u8>()?)),
                None => Err(PyValueError::new_err(format!(
                    "unknown event {event}; the region's events are {}",
                    self.event_names().join(", ")
                ))),
            };
        }
        Err(PyTypeError::new_err(format!(
            "an event is an edgemark.Event or its name, not {}",
            event.get_type().name()?
        )))
    }

    fn event_names(&self) -> Vec<String> {
        self.rec.schema().map_or_else(Vec::new, |s| {
            s.events().iter().map(|e| e.name().to_owned()).collect()
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn do_record(
        &self,
        py: Python<'_>,
        token: &Bound<'_, PyAny>,
        from_stage: u32,
        to_stage: u32,
        event: &Bound<'_, PyAny>,
        meaningful: bool,
        chunk_seq: Option<u64>,
        segment: u32,
        elapsed_ms: Option<f64>,
        clock_domain: Option<&Bound<'_, PyString>>,
    ) -> PyResult<Outcome> {
        // Off by default: a disabled region costs a branch.
        if !self.rec.is_enabled() {
            return Ok(Outcome::Disabled);
        }
        let event = self.event_id(py, event)?;
        let domain = match clock_domain {
            Some(d) => Some(d.to_cow()?),
            None => None,
        };
        if elapsed_ms.is_none() {
            if let Some(d) = &domain {
                if d != HOST_MONOTONIC {
                    return Err(PyValueError::new_err(format!(
                        "clock_domain={d:?} needs elapsed_ms: without it, record reads the shared clock ({HOST_MONOTONIC})"
                    )));
                }
            }
        }
        let token = match token_arg(token) {
            Ok(t) => t,
            Err(why) => return Ok(why),
        };
        let mut mark = Mark::new(Edge::new(from_stage, to_stage), event)
            .segment(segment)
            .meaningful(meaningful);
        if let Some(c) = chunk_seq {
            mark = mark.chunk_seq(c);
        }
        Ok(match elapsed_ms {
            Some(ms) => self.rec.record_elapsed(
                token,
                mark,
                ms,
                domain.as_deref().unwrap_or(HOST_MONOTONIC),
            ),
            None => self.rec.record(token, mark),
        })
    }

    fn do_start_segment(
        &self,
        token: &Bound<'_, PyAny>,
        from_stage: u32,
        to_stage: u32,
        segment: u32,
    ) -> Outcome {
        if !self.rec.is_enabled() {
            return Outcome::Disabled;
        }
        match token_arg(token) {
            Ok(t) => self
                .rec
                .start_segment(t, Edge::new(from_stage, to_stage), segment),
            Err(why) => why,
        }
    }

    fn snap(&self, token: &Bound<'_, PyAny>) -> Snapshot {
        match token_arg(token) {
            Ok(t) => self.rec.snapshot(t),
            Err(_) => Recorder::disabled().snapshot(Token::from_u128(0)),
        }
    }

    /// Closes without the GIL: a close can wait (about a second at most)
    /// for another control operation on the same request.
    fn close_snap(&self, py: Python<'_>, token: &Bound<'_, PyAny>) -> Snapshot {
        match token_arg(token) {
            Ok(t) => {
                let rec = &self.rec;
                py.detach(|| rec.close(t))
            }
            Err(_) => Recorder::disabled().snapshot(Token::from_u128(0)),
        }
    }
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

fn builder(
    edges: Option<&Bound<'_, PyAny>>,
    slots: u32,
    segments: u32,
    domains: Vec<String>,
    group_access: bool,
) -> PyResult<edgemark::RegionBuilder> {
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
    /// Raises ``FileExistsError`` or another ``OSError`` for the path, and
    /// ``ValueError`` for no edges, a duplicate or self edge, a bad geometry
    /// or a bad domain name.
    #[staticmethod]
    #[pyo3(
        signature = (path, edges = None, slots = 4096, segments = 4, domains = Vec::new(), group_access = false),
        text_signature = "(path, edges=[(0, 1), (1, 2)], slots=4096, segments=4, domains=(), group_access=False)"
    )]
    fn create(
        py: Python<'_>,
        path: PathBuf,
        edges: Option<&Bound<'_, PyAny>>,
        slots: u32,
        segments: u32,
        domains: Vec<String>,
        group_access: bool,
    ) -> PyResult<PyRegion> {
        let b = builder(edges, slots, segments, domains, group_access)?;
        let rec = py.detach(|| b.create(&path)).map_err(create_error)?;
        PyRegion::wrap(py, rec)
    }

    /// A region on the heap, private to this process: the same protocol
    /// without a file (tests, single-process use). Same arguments as
    /// ``create`` but the path.
    #[staticmethod]
    #[pyo3(
        signature = (edges = None, slots = 4096, segments = 4, domains = Vec::new()),
        text_signature = "(edges=[(0, 1), (1, 2)], slots=4096, segments=4, domains=())"
    )]
    fn in_memory(
        py: Python<'_>,
        edges: Option<&Bound<'_, PyAny>>,
        slots: u32,
        segments: u32,
        domains: Vec<String>,
    ) -> PyResult<PyRegion> {
        let b = builder(edges, slots, segments, domains, false)?;
        let rec = b.create_in_memory().map_err(create_error)?;
        PyRegion::wrap(py, rec)
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
    #[staticmethod]
    #[pyo3(signature = (path, allow_foreign_clock = false, allow_foreign_owner = false))]
    fn attach(
        py: Python<'_>,
        path: PathBuf,
        allow_foreign_clock: bool,
        allow_foreign_owner: bool,
    ) -> PyResult<PyRegion> {
        let opts = AttachOptions::new()
            .allow_foreign_clock(allow_foreign_clock)
            .allow_foreign_owner(allow_foreign_owner);
        let rec = py.detach(|| opts.attach(&path)).map_err(attach_error)?;
        PyRegion::wrap(py, rec)
    }

    /// A region that records nothing, for collection that is off by default:
    /// ``begin`` returns ``None``, ``record`` ``False`` (outcome
    /// ``"disabled"``), snapshots are ``{}``. Its calls cost about a branch.
    #[staticmethod]
    fn disabled(py: Python<'_>) -> PyResult<PyRegion> {
        PyRegion::wrap(py, Recorder::disabled())
    }

    /// Begins a request: claims a free slot, sets the request's origin to
    /// now on the shared clock, and returns its ``Token``.
    ///
    /// Fails open: ``None`` when the region is full or disabled; the request
    /// then runs unrecorded (every call with a ``None`` token is a no-op).
    fn begin(&self) -> Option<PyToken> {
        self.rec.begin().ok().map(PyToken)
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
    /// Never raises for runtime conditions (see ``record_outcome``); raises
    /// ``ValueError`` for an event the region's schema lacks.
    #[pyo3(signature = (token, from_stage, to_stage, event, meaningful = true, chunk_seq = None, segment = 0, elapsed_ms = None, clock_domain = None))]
    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        py: Python<'_>,
        token: &Bound<'_, PyAny>,
        from_stage: u32,
        to_stage: u32,
        event: &Bound<'_, PyAny>,
        meaningful: bool,
        chunk_seq: Option<u64>,
        segment: u32,
        elapsed_ms: Option<f64>,
        clock_domain: Option<&Bound<'_, PyString>>,
    ) -> PyResult<bool> {
        Ok(self
            .do_record(
                py,
                token,
                from_stage,
                to_stage,
                event,
                meaningful,
                chunk_seq,
                segment,
                elapsed_ms,
                clock_domain,
            )?
            .is_success())
    }

    /// ``record`` that returns the outcome's name: ``"recorded"``,
    /// ``"duplicate"``, ``"not_meaningful"``, ``"stale_segment"``,
    /// ``"segment_not_started"``, ``"closed"``, ``"reused"``,
    /// ``"clock_mismatch"``, ``"invalid"``, ``"out_of_range"``,
    /// ``"unknown_edge"``, ``"unknown_domain"``, ``"foreign_token"``,
    /// ``"busy"``, ``"corrupt"`` or ``"disabled"`` (``edgemark.Outcome``
    /// members compare equal to these strings).
    #[pyo3(signature = (token, from_stage, to_stage, event, meaningful = true, chunk_seq = None, segment = 0, elapsed_ms = None, clock_domain = None))]
    #[allow(clippy::too_many_arguments)]
    fn record_outcome<'py>(
        &self,
        py: Python<'py>,
        token: &Bound<'_, PyAny>,
        from_stage: u32,
        to_stage: u32,
        event: &Bound<'_, PyAny>,
        meaningful: bool,
        chunk_seq: Option<u64>,
        segment: u32,
        elapsed_ms: Option<f64>,
        clock_domain: Option<&Bound<'_, PyString>>,
    ) -> PyResult<Bound<'py, PyString>> {
        let o = self.do_record(
            py,
            token,
            from_stage,
            to_stage,
            event,
            meaningful,
            chunk_seq,
            segment,
            elapsed_ms,
            clock_domain,
        )?;
        Ok(outcome_str(py, o))
    }

    /// Starts segment ``segment`` on the edge ``from_stage -> to_stage`` of
    /// the request: a control operation of the edge's owner (recording never
    /// advances a segment). Later records for older segments are refused as
    /// stale. Returns ``True`` if it started; ``False`` if the segment is not
    /// newer than the current one, or for any runtime condition.
    fn start_segment(
        &self,
        token: &Bound<'_, PyAny>,
        from_stage: u32,
        to_stage: u32,
        segment: u32,
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
        from_stage: u32,
        to_stage: u32,
        segment: u32,
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
        snapshot_to_py(py, &self.snap(token))
    }

    /// ``snapshot`` as JSON text (the core's serialisation).
    fn snapshot_json(&self, token: &Bound<'_, PyAny>) -> String {
        snapshot_text(&self.snap(token))
    }

    /// Closes the request and returns its final snapshot (as ``snapshot``).
    ///
    /// Idempotent and never raising: every removal path (completion, abort,
    /// client disconnect, timeout, stage error) calls it. Closing a closed,
    /// reused or foreign token returns ``{}``. Later records are refused.
    /// ``None`` if another control operation of a live process held the
    /// request for the whole bounded wait (about a second): the request is
    /// still open, so close it again.
    fn close<'py>(
        &self,
        py: Python<'py>,
        token: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let snap = self.close_snap(py, token);
        if snap.state() == RequestState::Busy {
            return Ok(None);
        }
        snapshot_to_py(py, &snap).map(Some)
    }

    /// ``close`` that returns the final snapshot as JSON text (``None`` when
    /// busy, as ``close``).
    fn close_json(&self, py: Python<'_>, token: &Bound<'_, PyAny>) -> Option<String> {
        let snap = self.close_snap(py, token);
        (snap.state() != RequestState::Busy).then(|| snapshot_text(&snap))
    }

    /// Whether ``token`` names a request that is open in this region.
    fn is_open(&self, token: &Bound<'_, PyAny>) -> bool {
        self.snap(token).state() == RequestState::Open
    }

    /// The tokens of every open request (one sweep of the region, without
    /// the GIL).
    fn open_requests(&self, py: Python<'_>) -> Vec<PyToken> {
        let rec = &self.rec;
        py.detach(|| rec.open_requests())
            .into_iter()
            .map(PyToken)
            .collect()
    }

    /// ``(token, snapshot)`` for every open request: one sweep of the
    /// region, taken without the GIL.
    fn snapshot_open<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let rec = &self.rec;
        let all: Vec<(Token, Value)> = py.detach(|| {
            rec.snapshot_open()
                .into_iter()
                .map(|(t, s)| (t, s.to_json()))
                .collect()
        });
        let out = PyList::empty(py);
        for (t, v) in all {
            let t = Bound::new(py, PyToken(t))?.into_any();
            out.append(PyTuple::new(py, [t, json_to_py(py, &v)?])?)?;
        }
        Ok(out)
    }

    /// Frees the slots of dead processes (open requests whose owner is gone,
    /// slots left locked by a process that died); live owners' slots are
    /// left alone. Returns ``{"dead_owners": n, "dead_holders": m}``.
    fn reclaim_dead_owners<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let rec = &self.rec;
        let r = py.detach(|| rec.reclaim_dead_owners());
        let d = PyDict::new(py);
        d.set_item("dead_owners", r.dead_owners)?;
        d.set_item("dead_holders", r.dead_holders)?;
        Ok(d)
    }

    /// The region's counters: ``{"refused": {outcome: n, ...},
    /// "dropped_segments": n, "closed_requests": n, "reclaimed_requests":
    /// n}``.
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.rec.counters();
        let refused = PyDict::new(py);
        for (o, n) in &c.refused {
            refused.set_item(o.name(), n)?;
        }
        let d = PyDict::new(py);
        d.set_item("refused", refused)?;
        d.set_item("dropped_segments", c.dropped_segments)?;
        d.set_item("closed_requests", c.closed_requests)?;
        d.set_item("reclaimed_requests", c.reclaimed_requests)?;
        Ok(d)
    }

    /// The region's geometry and identity as a dict, ``None`` when disabled.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(i) = self.rec.info() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("path", self.path())?;
        d.set_item("region_id", format!("{:016x}", i.region_id))?;
        d.set_item("slots", i.slots)?;
        d.set_item("segments", i.segments)?;
        d.set_item("bytes", i.bytes)?;
        d.set_item("edges", self.edges())?;
        d.set_item("events", self.event_names())?;
        d.set_item("domains", self.domains())?;
        d.set_item("shares_clock", i.shares_clock)?;
        d.set_item("created_unix_ns", i.created_unix_ns)?;
        d.set_item("creator_pid", i.creator_pid)?;
        d.set_item("group_access", i.group_access)?;
        Ok(Some(d))
    }

    /// Whether the region records (it is not ``Region.disabled()``).
    #[getter]
    fn enabled(&self) -> bool {
        self.rec.is_enabled()
    }

    /// The region file's path (``None`` in memory or disabled).
    #[getter]
    fn path(&self) -> Option<String> {
        self.rec.path().map(|p| p.to_string_lossy().into_owned())
    }

    /// The declared edges, ``[(from_stage, to_stage), ...]`` in order.
    #[getter]
    fn edges(&self) -> Vec<(u32, u32)> {
        self.rec.edges().iter().map(|e| (e.from, e.to)).collect()
    }

    /// The schema's event names, in schema order.
    #[getter]
    fn events(&self) -> Vec<String> {
        self.event_names()
    }

    /// The clock domains; the first is always ``"host_monotonic"``.
    #[getter]
    fn domains(&self) -> Vec<String> {
        self.rec
            .schema()
            .map_or_else(Vec::new, |s| s.domains().to_vec())
    }

    fn __repr__(&self) -> String {
        match (self.rec.is_enabled(), self.path()) {
            (false, _) => "Region.disabled()".to_owned(),
            (true, Some(p)) => format!("Region({p:?}, edges={:?})", self.edges()),
            (true, None) => format!("Region(<in memory>, edges={:?})", self.edges()),
        }
    }
}

// ---------------------------------------------------------------------------
// Module functions.

/// The default directory for region files: ``/dev/shm`` where it exists (a
/// memory-backed filesystem), else the system's temporary directory.
#[pyfunction]
fn default_dir() -> String {
    edgemark::default_dir().to_string_lossy().into_owned()
}

/// ``CLOCK_MONOTONIC`` now, in nanoseconds: the shared clock ``record``
/// reads.
#[pyfunction]
fn monotonic_ns() -> u64 {
    edgemark::monotonic_ns()
}

/// The native part of the ``edgemark`` package.
#[pymodule(name = "_edgemark")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<PyRegion>()?;
    m.add_class::<PyToken>()?;
    m.add_function(wrap_pyfunction!(default_dir, m)?)?;
    m.add_function(wrap_pyfunction!(monotonic_ns, m)?)?;
    m.add("HOST_MONOTONIC", HOST_MONOTONIC)?;
    m.add("MAX_ELAPSED_MS", edgemark::MAX_ELAPSED_MS)?;
    m.add("MAX_CHUNK_SEQ", edgemark::MAX_CHUNK_SEQ)?;
    m.add(
        "OUTCOME_NAMES",
        PyTuple::new(py, OUTCOMES.iter().map(|o| o.name()))?,
    )?;
    m.add(
        "EVENT_NAMES",
        PyTuple::new(py, edgemark::Event::ALL.iter().map(|e| e.name()))?,
    )?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
