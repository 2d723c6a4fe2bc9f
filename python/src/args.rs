//! Arguments shared by several methods, converted once.

use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use edgemark::schema::HOST_MONOTONIC;
use edgemark::Outcome;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyInt;

/// How many of the interpreter's small ints (`0..SMALL`) are recognised by
/// identity: every stage number and event position a pipeline uses.
const SMALL: usize = 256;

/// The interpreter's cached small ints, recognised by address instead of
/// read through the C API (a call into the interpreter per int, the
/// larger part of converting a positional `record`'s arguments).
///
/// CPython keeps one object per small int, so `0` and `1` from any caller
/// are these objects, and it keeps them in one array. The table is made
/// once: it takes each of `0..SMALL` from the interpreter, keeps a
/// reference to each (so no other object can have its address while the
/// module lives), and checks that entry `i` lies at `base + i * stride`
/// with a power-of-two stride. From then on an argument at such an
/// address is that object, of value `i`: a subtraction, a mask and a
/// shift, no table to look in. An interpreter that lays its small ints out
/// otherwise gets no fast path (`shift` is `None`), not a wrong value.
struct SmallInts {
    /// Kept alive so that each address keeps naming its int.
    _ints: Vec<Py<PyInt>>,
    /// The address of `0`.
    base: usize,
    /// log2 of the distance between two entries, when they lie as said.
    shift: Option<u32>,
}

static SMALL_INTS: PyOnceLock<SmallInts> = PyOnceLock::new();

fn small_ints(py: Python<'_>) -> &SmallInts {
    SMALL_INTS.get_or_init(py, || {
        let ints: Vec<Py<PyInt>> = (0..SMALL).map(|i| PyInt::new(py, i).unbind()).collect();
        let base = ints[0].as_ptr() as usize;
        let stride = (ints[1].as_ptr() as usize).wrapping_sub(base);
        let regular = stride.is_power_of_two()
            && ints
                .iter()
                .enumerate()
                .all(|(i, n)| n.as_ptr() as usize == base.wrapping_add(i.wrapping_mul(stride)));
        SmallInts {
            _ints: ints,
            base,
            shift: regular.then(|| stride.trailing_zeros()),
        }
    })
}

/// The value of `obj` if it is one of the interpreter's small ints, found
/// by its address; `None` for any other object (which may still be an
/// int: the caller converts it the ordinary way).
#[inline(always)]
pub(crate) fn small_int(obj: &Bound<'_, PyAny>) -> Option<usize> {
    let t = small_ints(obj.py());
    let shift = t.shift?;
    // An address below `base` wraps to beyond the table.
    let offset = (obj.as_ptr() as usize).wrapping_sub(t.base);
    let i = offset >> shift;
    (offset & ((1 << shift) - 1) == 0 && i < SMALL).then_some(i)
}

/// The members of `edgemark.Event` and their values, kept alive so that a
/// member is recognised by its address (empty if the package's `Event`
/// cannot be had: every event then takes the ordinary path).
static EVENT_MEMBERS: PyOnceLock<Vec<(Py<PyAny>, usize)>> = PyOnceLock::new();

fn event_members(py: Python<'_>) -> &Vec<(Py<PyAny>, usize)> {
    EVENT_MEMBERS.get_or_init(py, || {
        let members = || -> PyResult<Vec<(Py<PyAny>, usize)>> {
            py.import("edgemark")?
                .getattr("Event")?
                .try_iter()?
                .map(|m| {
                    let m = m?;
                    let v = m.extract::<usize>()?;
                    Ok((m.unbind(), v))
                })
                .collect()
        };
        members().unwrap_or_default()
    })
}

/// The value of an event argument that is an `edgemark.Event` member or a
/// small int, found by its address; `None` for anything else (a name, a
/// larger int, another type), which the caller converts the ordinary way.
#[inline(always)]
pub(crate) fn known_event(event: &Bound<'_, PyAny>) -> Option<usize> {
    let addr = event.as_ptr();
    event_members(event.py())
        .iter()
        .find(|(m, _)| m.as_ptr() == addr)
        .map(|&(_, v)| v)
        .or_else(|| small_int(event))
}

/// An int argument for one of the core's 32-bit fields: `Ok(v)` when it
/// fits, `Err(too_large)` for an int of 2**32 or more (a value the field
/// cannot hold: a refusal, as the core refuses values beyond its own
/// limits); `ValueError` for a negative int and `TypeError` for anything
/// that is not an int (argument errors).
pub(crate) fn u32_field(
    obj: &Bound<'_, PyAny>,
    what: &str,
    too_large: Outcome,
) -> PyResult<Result<u32, Outcome>> {
    if let Some(i) = small_int(obj) {
        // `SMALL` is far below `u32::MAX`.
        return Ok(Ok(i as u32));
    }
    if let Ok(v) = obj.extract::<u32>() {
        return Ok(Ok(v));
    }
    let i = obj.cast::<PyInt>().map_err(|_| {
        let ty = obj
            .get_type()
            .name()
            .map_or_else(|_| "?".to_owned(), |n| n.to_string());
        PyTypeError::new_err(format!("{what} is an int, not {ty}"))
    })?;
    if i.lt(0)? {
        return Err(PyValueError::new_err(format!(
            "{what} must be non-negative, not {i}"
        )));
    }
    Ok(Err(too_large))
}

/// A stage number (`from_stage`, `to_stage`), read by address when it is a
/// small int. One of 2**32 or more is no stage of any edge a region can
/// declare: `Err(unknown_edge)`, a refusal (see [`u32_field`]).
pub(crate) struct Stage(pub(crate) Result<u32, Outcome>);

impl<'py> FromPyObject<'_, 'py> for Stage {
    type Error = PyErr;

    #[inline(always)]
    fn extract(obj: Borrowed<'_, 'py, PyAny>) -> PyResult<Stage> {
        match small_int(&obj) {
            // `SMALL` is far below `u32::MAX`.
            Some(i) => Ok(Stage(Ok(i as u32))),
            None => u32_field(&obj, "a stage number", Outcome::UnknownEdge).map(Stage),
        }
    }
}

/// A segment index. One of 2**32 or more is beyond what a region holds:
/// `Err(out_of_range)`, a refusal (see [`u32_field`]).
pub(crate) struct Segment(pub(crate) Result<u32, Outcome>);

impl<'py> FromPyObject<'_, 'py> for Segment {
    type Error = PyErr;

    #[inline(always)]
    fn extract(obj: Borrowed<'_, 'py, PyAny>) -> PyResult<Segment> {
        u32_field(&obj, "a segment index", Outcome::OutOfRange).map(Segment)
    }
}

/// A `chunk_seq` argument.
pub(crate) enum ChunkArg {
    /// `None` or left out.
    Absent,
    /// A sequence number; one beyond 64 bits is `u64::MAX`, which is beyond
    /// the cell's range too, so the core answers it as `out_of_range` for
    /// the event that keeps it (and ignores it for the others) instead of
    /// Python raising `OverflowError`.
    Seq(u64),
    /// A negative int: the caller decides how to refuse it.
    Negative,
}

/// Converts `chunk_seq`: `None`, or an int of any size.
pub(crate) fn chunk_arg(c: Option<&Bound<'_, PyAny>>) -> PyResult<ChunkArg> {
    let Some(c) = c.filter(|c| !c.is_none()) else {
        return Ok(ChunkArg::Absent);
    };
    if let Ok(v) = c.extract::<u64>() {
        return Ok(ChunkArg::Seq(v));
    }
    let c = c
        .cast::<PyInt>()
        .map_err(|_| PyTypeError::new_err("chunk_seq is an int or None"))?;
    Ok(if c.lt(0)? {
        ChunkArg::Negative
    } else {
        ChunkArg::Seq(u64::MAX)
    })
}

/// A region path: a `str`, `bytes` (as `os.fsencode` gives) or an
/// `os.PathLike` of either, through `os.fspath`. A `str` is encoded as
/// `os.fsencode` does (surrogate escapes give back the bytes of a path
/// that is not UTF-8), so any path the system can name round-trips.
/// Refuses a NUL byte with a `ValueError` that says so (the system call
/// would only say "invalid argument").
pub(crate) fn path_arg(path: &Bound<'_, PyAny>) -> PyResult<PathBuf> {
    let py = path.py();
    static FSPATH: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let fspath = FSPATH.import(py, "os", "fspath")?;
    let p = fspath.call1((path,)).map_err(|e| {
        if e.is_instance_of::<PyTypeError>(py) {
            PyTypeError::new_err(format!(
                "a region path is a str, bytes or os.PathLike, not {}",
                path.get_type()
                    .name()
                    .map_or_else(|_| "?".to_owned(), |n| n.to_string())
            ))
        } else {
            e
        }
    })?;
    let path = match p.cast::<pyo3::types::PyBytes>() {
        Ok(b) => PathBuf::from(std::ffi::OsStr::from_bytes(b.as_bytes())),
        Err(_) => PathBuf::from(p.extract::<std::ffi::OsString>()?),
    };
    if path.as_os_str().as_bytes().contains(&0) {
        return Err(PyValueError::new_err(format!(
            "a region path cannot contain a NUL byte: {:?}",
            path.as_os_str()
        )));
    }
    Ok(path)
}

/// When a record's value was taken.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum When<'a> {
    /// Now, on the region's shared clock.
    Now,
    /// Measured elsewhere: milliseconds from the request's origin in a
    /// clock domain.
    Elapsed(f64, &'a str),
}

/// The `elapsed_ms` and `clock_domain` arguments of a record. Without
/// `elapsed_ms` the record reads the shared clock, so a `clock_domain` can
/// only name that clock; with it, the domain is the shared clock unless
/// named. `Err`: the message of the argument error. What the value and
/// the name may be is the core's to say (`Recorder::record_elapsed`).
pub(crate) fn when(
    elapsed_ms: Option<f64>,
    clock_domain: Option<&str>,
) -> Result<When<'_>, String> {
    match (elapsed_ms, clock_domain) {
        (Some(ms), d) => Ok(When::Elapsed(ms, d.unwrap_or(HOST_MONOTONIC))),
        (None, None) => Ok(When::Now),
        (None, Some(d)) if d == HOST_MONOTONIC => Ok(When::Now),
        (None, Some(d)) => Err(format!(
            "clock_domain={d:?} needs elapsed_ms: without it, the record reads the shared clock ({HOST_MONOTONIC})"
        )),
    }
}
