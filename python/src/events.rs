//! Event arguments: the one resolver of every method that takes an event
//! (`Region.record`, `Region.handle`, `StreamEdgeRecorder.record`), and
//! the names of events given to `elapsed_between`.

use edgemark::schema::EventId;
use edgemark::{Event, Viewer};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyString};

use crate::args::known_event;

/// Why an argument names no event of the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BadEvent {
    /// An int or a name, but not of an event the schema declares.
    NotInSchema,
    /// Neither an int nor a str.
    WrongType,
}

/// A region's events as arguments name them: an `edgemark.Event` member or
/// another int (a schema position), or a name (a `str`, or a `str` enum
/// member such as a `StreamEdgeEvent`, by its text).
pub(crate) struct Events {
    /// Event name (str) to schema position (int), looked up by the string's
    /// cached hash: no UTF-8 conversion on the record path.
    by_name: Py<PyDict>,
    /// The schema's event names, in order (empty when disabled).
    names: Vec<String>,
}

impl Events {
    /// The events of `rec`'s schema.
    pub(crate) fn of(py: Python<'_>, rec: &Viewer) -> PyResult<Events> {
        let names: Vec<String> = rec.schema().map_or_else(Vec::new, |s| {
            s.events().iter().map(|e| e.name().to_owned()).collect()
        });
        let by_name = PyDict::new(py);
        for (i, name) in names.iter().enumerate() {
            by_name.set_item(PyString::intern(py, name), i)?;
        }
        Ok(Events {
            by_name: by_name.unbind(),
            names,
        })
    }

    /// The schema's event names, in schema order.
    pub(crate) fn names(&self) -> &[String] {
        &self.names
    }

    /// The schema position `event` names.
    #[inline(always)]
    pub(crate) fn resolve(&self, event: &Bound<'_, PyAny>) -> Result<EventId, BadEvent> {
        // An `Event` member or a small int, by address; anything else, and
        // a position beyond the schema, the ordinary way.
        match known_event(event) {
            // The schema's event count fits a `u8`.
            Some(i) if i < self.names.len() => Ok(EventId(i as u8)),
            _ => self.resolve_other(event),
        }
    }

    /// `resolve` of an event that is not known by its address.
    #[cold]
    fn resolve_other(&self, event: &Bound<'_, PyAny>) -> Result<EventId, BadEvent> {
        let n = self.names.len();
        if let Ok(i) = event.cast::<PyInt>() {
            // `i64` reads the int in place (`PyLong_AsLongLong`); `usize`
            // would first copy an `Event` member into a plain int.
            return match i.extract::<i64>() {
                Ok(i) if (0..n as i64).contains(&i) => Ok(EventId(i as u8)),
                _ => Err(BadEvent::NotInSchema),
            };
        }
        let Ok(s) = event.cast::<PyString>() else {
            return Err(BadEvent::WrongType);
        };
        // A `str` by its hash; a subclass (an enum member, whose hash is
        // its member name's) by its text.
        if event.cast_exact::<PyString>().is_ok() {
            return self
                .by_name
                .bind(event.py())
                .get_item(s)
                .ok()
                .flatten()
                .and_then(|i| i.extract::<u8>().ok())
                .map(EventId)
                .ok_or(BadEvent::NotInSchema);
        }
        let text = s.to_str().map_err(|_| BadEvent::NotInSchema)?;
        self.names
            .iter()
            .position(|n| n == text)
            // The schema's event count fits a `u8`.
            .map(|i| EventId(i as u8))
            .ok_or(BadEvent::NotInSchema)
    }

    /// The argument error of the plain binding for an event that `resolve`
    /// refused: `ValueError` for one the schema lacks, `TypeError` for a
    /// value of another type.
    pub(crate) fn error(&self, event: &Bound<'_, PyAny>, why: BadEvent) -> PyErr {
        let n = self.names.len();
        match why {
            BadEvent::NotInSchema if event.cast::<PyInt>().is_ok() => PyValueError::new_err(
                format!("event {event} is not in the region's schema ({n} events)"),
            ),
            BadEvent::NotInSchema => PyValueError::new_err(format!(
                "unknown event {event}; the region's events are {}",
                self.names.join(", ")
            )),
            BadEvent::WrongType => PyTypeError::new_err(format!(
                "an event is an edgemark.Event or its name, not {}",
                event
                    .get_type()
                    .name()
                    .map_or_else(|_| "?".to_owned(), |n| n.to_string())
            )),
        }
    }
}

/// The name of an event argument where there is no region to resolve it
/// against (a snapshot's dict): an ``Event`` or its int names a position of
/// the core's default schema, [`Event::ALL`]; a name is taken as it is.
pub(crate) fn name_of(event: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = event.cast::<PyString>() {
        return Ok(s.to_str()?.to_owned());
    }
    if let Ok(i) = event.cast::<PyInt>() {
        return i
            .extract::<usize>()
            .ok()
            .and_then(|i| Event::ALL.get(i))
            .map(|e| e.name().to_owned())
            .ok_or_else(|| PyValueError::new_err(format!("{i} is not a valid Event")));
    }
    Err(PyTypeError::new_err(format!(
        "an event is an edgemark.Event or its name, not {}",
        event.get_type().name()?
    )))
}
