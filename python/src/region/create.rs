//! Making a `Region`: create a region file, one on the heap, attach to a
//! file, or a disabled region; and the arguments of `create`.

use edgemark::{AttachOptions, Edge, Recorder};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyString;

use super::PyRegion;
use crate::args::path_arg;
use crate::errors::{attach_error, create_error};

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
    /// ``CLOCK_MONOTONIC``, the default ``"monotonic"``; ``info()["clock"]["kind"]``
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
}
