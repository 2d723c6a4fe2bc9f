//! Recording: `record` and `record_outcome`, which share one signature and
//! one path ([`PyRegion::record_call`]) and differ only in what they return;
//! `handle`, which resolves the same arguments once; and the registration
//! of a clock domain.

use edgemark::schema::EventId;
use edgemark::{Edge, Mark, Outcome};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyString;

use super::PyRegion;
use crate::args::{chunk_arg, u32_field, when, ChunkArg, Segment, Stage, When};
use crate::handle::PyHandle;
use crate::outcome::outcome_str;
use crate::token::token_arg;

/// The optional arguments of a record call as Python passed them.
pub(crate) struct Optional<'a, 'py> {
    meaningful: bool,
    chunk_seq: Option<&'a Bound<'py, PyAny>>,
    segment: Segment,
    elapsed_ms: Option<f64>,
    clock_domain: Option<&'a Bound<'py, PyString>>,
}

impl Optional<'_, '_> {
    /// Whether every optional argument is at its default (or was left
    /// out): the positional call, which converts nothing more.
    #[inline(always)]
    fn at_defaults(&self) -> bool {
        self.meaningful
            && self.chunk_seq.is_none()
            && matches!(self.segment.0, Ok(0))
            && self.elapsed_ms.is_none()
            && self.clock_domain.is_none()
    }
}

impl PyRegion {
    /// The one record path: every call of `record` and `record_outcome`
    /// comes here and gets its outcome back.
    ///
    /// In order: a disabled region answers at once (a branch); an event
    /// the schema lacks raises; an int too large for its field is a
    /// refusal, as a value beyond a cell's range is; the token is
    /// converted (a value that is no token is a refusal, answered after
    /// the other arguments are checked); then the positional call records,
    /// and any other goes through [`PyRegion::record_with`].
    #[inline(always)]
    fn record_call(
        &self,
        token: &Bound<'_, PyAny>,
        from_stage: Stage,
        to_stage: Stage,
        event: &Bound<'_, PyAny>,
        optional: Optional<'_, '_>,
    ) -> PyResult<Outcome> {
        // Off by default: a disabled region costs a branch.
        if !self.rec.is_enabled() {
            return Ok(self.off());
        }
        let event = self.event_id(event)?;
        let edge = match (from_stage.0, to_stage.0) {
            (Ok(from), Ok(to)) => Edge::new(from, to),
            (Err(why), _) | (_, Err(why)) => return Ok(why),
        };
        let token = token_arg(token);
        if optional.at_defaults() {
            return Ok(match token {
                Ok(t) => self.rec.record(t, Mark::new(edge, event)),
                Err(why) => why,
            });
        }
        self.record_with(token, edge, event, optional)
    }

    /// The rest of [`PyRegion::record_call`] for a call that gives an
    /// optional argument: out of line, so that the positional call stays
    /// small.
    #[inline(never)]
    fn record_with(
        &self,
        token: Result<edgemark::Token, Outcome>,
        edge: Edge,
        event: EventId,
        optional: Optional<'_, '_>,
    ) -> PyResult<Outcome> {
        let segment = match optional.segment.0 {
            Ok(s) => s,
            Err(why) => return Ok(why),
        };
        let domain = match optional.clock_domain {
            Some(d) => Some(d.to_cow()?),
            None => None,
        };
        let when = when(optional.elapsed_ms, domain.as_deref()).map_err(PyValueError::new_err)?;
        let token = match token {
            Ok(t) => t,
            Err(why) => return Ok(why),
        };
        let mut mark = Mark::new(edge, event)
            .segment(segment)
            .meaningful(optional.meaningful);
        match chunk_arg(optional.chunk_seq)? {
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
}

/// `record` and `record_outcome`: one call, with its one signature written
/// here once, and two answers. Each method gives its docs, its name, what
/// it returns and how it makes that from the outcome.
macro_rules! record_methods {
    ($(
        $(#[doc = $doc:expr])*
        fn $name:ident -> $ret:ty = $answer:expr;
    )*) => {
        #[pymethods]
        impl PyRegion {$(
            $(#[doc = $doc])*
            // `text_signature`: pyo3 would show the default segment, a
            // Rust value, as `...`; Python's signature shows it as 0.
            #[pyo3(
                signature = (token, from_stage, to_stage, event, meaningful = true, chunk_seq = None, segment = Segment(Ok(0)), elapsed_ms = None, clock_domain = None),
                text_signature = "($self, token, from_stage, to_stage, event, meaningful=True, chunk_seq=None, segment=0, elapsed_ms=None, clock_domain=None)"
            )]
            #[allow(clippy::too_many_arguments)]
            fn $name<'py>(
                &self,
                py: Python<'py>,
                token: &Bound<'py, PyAny>,
                from_stage: Stage,
                to_stage: Stage,
                event: &Bound<'py, PyAny>,
                meaningful: bool,
                chunk_seq: Option<&Bound<'py, PyAny>>,
                segment: Segment,
                elapsed_ms: Option<f64>,
                clock_domain: Option<&Bound<'py, PyString>>,
            ) -> PyResult<$ret> {
                let optional = Optional {
                    meaningful,
                    chunk_seq,
                    segment,
                    elapsed_ms,
                    clock_domain,
                };
                let outcome = self.record_call(token, from_stage, to_stage, event, optional)?;
                let answer = $answer;
                Ok(answer(py, outcome))
            }
        )*}
    };
}

record_methods! {
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
    /// Never raises for runtime conditions (``record_outcome``, with the
    /// same arguments, says which one refused a call); raises
    /// ``ValueError`` for an event the region's schema lacks. A caller that
    /// records one edge and event of one request from a hot loop can
    /// resolve them once with ``handle``.
    fn record -> bool = |_: Python<'_>, o: Outcome| o.is_success();

    /// ``record`` with the same arguments, returning the outcome's name
    /// instead of a bool: one of ``edgemark.OUTCOME_NAMES`` (the core's
    /// list), to which ``edgemark.Outcome`` members compare equal. The same
    /// call as ``record``, at the same cost.
    fn record_outcome -> Bound<'py, PyString> = outcome_str;
}

#[pymethods]
impl PyRegion {
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
}
