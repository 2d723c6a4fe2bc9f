//! Detached snapshots and their JSON form.

use std::sync::Arc;

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};
use smallvec::SmallVec;

use crate::catalog::Catalog;
use crate::mark::Edge;
use crate::protocol::{ReadInto, SegmentRead, Values};
use crate::schema::{DomainId, EventId};
use crate::sync::AtomicU64;

/// Whether the request a snapshot describes is still running.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestState {
    /// The request is open: later snapshots may show more events.
    Open,
    /// This is the final snapshot, returned by the close that ended it.
    Closed,
    /// The token names no open request (closed before, reused, foreign, or
    /// the recorder is disabled): the snapshot is empty.
    Gone,
    /// `close` could not take the request: another control operation of a
    /// live process held it for the whole bounded wait (about a second).
    /// The request is still open; close it again. The snapshot is empty.
    Busy,
    /// `close` refused: this process's mapping of the region lost a page
    /// (see [`Outcome::Faulted`](crate::Outcome::Faulted)), so it cannot
    /// vouch for what it would read or seal. The request is left as it is
    /// in the file; a process that attaches again can close it. The
    /// snapshot is empty.
    Faulted,
}

/// One recorded value: elapsed time from the request's origin in a clock
/// domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observed {
    /// Elapsed microseconds from the request's origin.
    pub elapsed_us: u64,
    /// The clock domain it was measured in.
    pub domain: DomainId,
}

impl Observed {
    /// Elapsed milliseconds, as snapshots show them.
    #[inline]
    pub fn elapsed_ms(&self) -> f64 {
        self.elapsed_us as f64 / 1000.0
    }

    /// Milliseconds from this value to `end`, only when both were measured
    /// in the same clock domain (hence from the same origin) and `end` is
    /// not before this one; otherwise `None`. The rule of
    /// [`EdgeSegment::elapsed_between`], for values read elsewhere (a
    /// snapshot's JSON form, say).
    ///
    /// ```
    /// use edgemark::schema::DomainId;
    /// use edgemark::snapshot::Observed;
    /// let at = |us, d| Observed { elapsed_us: us, domain: DomainId(d) };
    /// assert_eq!(at(1_500, 0).until(at(4_000, 0)), Some(2.5));
    /// assert_eq!(at(4_000, 0).until(at(1_500, 0)), None);
    /// assert_eq!(at(1_500, 0).until(at(4_000, 1)), None);
    /// ```
    #[inline]
    pub fn until(&self, end: Observed) -> Option<f64> {
        crate::word::delta_us(
            (self.elapsed_us, self.domain.0),
            (end.elapsed_us, end.domain.0),
        )
        .map(|us| us as f64 / 1000.0)
    }
}

/// The first events of one segment of one directed edge of one request.
///
/// Serialises as the upstream recorder's per-edge object: `from_stage`,
/// `to_stage`, `segment_index`, `first_chunk_seq`, `clock_domains` (event
/// name to domain, for observed events) and one `<event>_ms` field per
/// schema event, `null` where missing.
#[derive(Clone, Debug, PartialEq)]
pub struct EdgeSegment {
    edge: Edge,
    segment_index: u32,
    /// One value word per schema event, inline.
    values: Values,
    names: Arc<Catalog>,
}

impl EdgeSegment {
    /// The directed edge.
    #[inline]
    pub fn edge(&self) -> Edge {
        self.edge
    }
    /// The producing stage.
    #[inline]
    pub fn from_stage(&self) -> u32 {
        self.edge.from
    }
    /// The consuming stage.
    #[inline]
    pub fn to_stage(&self) -> u32 {
        self.edge.to
    }
    /// The segment index.
    #[inline]
    pub fn segment_index(&self) -> u32 {
        self.segment_index
    }
    /// The chunk sequence number of the winning write of the chunk-keeping
    /// event (the producer event in the default schema).
    pub fn first_chunk_seq(&self) -> Option<u64> {
        let i = self.names.chunk_event?;
        self.values.get(i)?.chunk_seq
    }
    /// The snapshot key, `"from->to:segment"`.
    pub fn key(&self) -> String {
        format!("{}:{}", self.edge, self.segment_index)
    }
    /// The recorded value of `event`, if any.
    pub fn get(&self, event: impl Into<EventId>) -> Option<Observed> {
        self.observed(event.into().0 as usize)
    }

    fn observed(&self, i: usize) -> Option<Observed> {
        self.values.get(i).map(|v| Observed {
            elapsed_us: v.elapsed_us,
            domain: DomainId(v.domain),
        })
    }

    /// Each schema event's value, in schema order.
    fn all(&self) -> impl Iterator<Item = Option<Observed>> + '_ {
        (0..self.values.len()).map(|i| self.observed(i))
    }
    /// Each recorded event in schema order: its name, value and clock
    /// domain's name (the span plan's input).
    pub(crate) fn recorded(&self) -> impl Iterator<Item = (&str, Observed, &str)> + '_ {
        self.names
            .schema
            .events()
            .iter()
            .zip(self.all())
            .filter_map(|(spec, v)| {
                let o = v?;
                Some((
                    spec.name(),
                    o,
                    self.names.name(o.domain).unwrap_or("unknown"),
                ))
            })
    }
    /// The recorded value of `event` in milliseconds, if any.
    pub fn elapsed_ms(&self, event: impl Into<EventId>) -> Option<f64> {
        self.get(event).map(|o| o.elapsed_ms())
    }
    /// The clock domain `event` was recorded in, if it was.
    pub fn domain(&self, event: impl Into<EventId>) -> Option<&str> {
        self.get(event).and_then(|o| self.names.name(o.domain))
    }
    /// Milliseconds from `start` to `end`, only when both were recorded in
    /// the same clock domain (hence from the same origin) and `end` is not
    /// before `start`; otherwise `None`.
    ///
    /// ```
    /// # use edgemark::{Event::*, Mark, Recorder, Edge};
    /// let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    /// let t = rec.begin().unwrap();
    /// let e = Edge::new(0, 1);
    /// rec.record_elapsed(t, Mark::new(e, ProducerFirstNonemptyEmit), 10.0, "host_monotonic");
    /// rec.record_elapsed(t, Mark::new(e, EdgeFirstSendComplete), 12.0, "host_monotonic");
    /// let snap = rec.snapshot(t);
    /// let seg = snap.segment(e, 0).unwrap();
    /// assert_eq!(seg.elapsed_between(ProducerFirstNonemptyEmit, EdgeFirstSendComplete), Some(2.0));
    /// assert_eq!(seg.elapsed_between(EdgeFirstSendComplete, ProducerFirstNonemptyEmit), None);
    /// ```
    pub fn elapsed_between(
        &self,
        start: impl Into<EventId>,
        end: impl Into<EventId>,
    ) -> Option<f64> {
        self.get(start)?.until(self.get(end)?)
    }
}

impl Serialize for EdgeSegment {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Domains<'a>(&'a EdgeSegment);
        impl Serialize for Domains<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let seg = self.0;
                let mut m = s.serialize_map(None)?;
                for (spec, v) in seg.names.schema.events().iter().zip(seg.all()) {
                    if let Some(o) = v {
                        let name = seg.names.name(o.domain).unwrap_or("unknown");
                        m.serialize_entry(spec.name(), name)?;
                    }
                }
                m.end()
            }
        }
        let mut m = s.serialize_map(Some(5 + self.values.len()))?;
        m.serialize_entry("from_stage", &self.edge.from)?;
        m.serialize_entry("to_stage", &self.edge.to)?;
        m.serialize_entry("segment_index", &self.segment_index)?;
        m.serialize_entry("first_chunk_seq", &self.first_chunk_seq())?;
        m.serialize_entry("clock_domains", &Domains(self))?;
        let mut key = String::with_capacity(48);
        for (spec, v) in self.names.schema.events().iter().zip(self.all()) {
            key.clear();
            key.push_str(spec.name());
            key.push_str("_ms");
            m.serialize_entry(&key, &v.map(|o| o.elapsed_ms()))?;
        }
        m.end()
    }
}

/// Whether a value of `values` is in a clock domain that names no domain in
/// the region's table (no edgemark process writes one).
pub(crate) fn has_unknown(values: &Values, names: &Catalog, words: &[AtomicU64]) -> bool {
    !values.all_in(names.known_mask())
        && values
            .iter()
            .any(|v| v.is_some_and(|v| !names.knows(words, DomainId(v.domain))))
}

/// Clears the values of `values` whose clock domain names no domain in the
/// region's table; whether it cleared one.
fn drop_unknown(values: &mut Values, names: &Catalog, words: &[AtomicU64]) -> bool {
    if values.all_in(names.known_mask()) {
        // Every value's domain is one this process has met: nothing to
        // drop (the common case, one test per segment).
        return false;
    }
    let mut dropped = false;
    for i in 0..values.len() {
        if values
            .get(i)
            .is_some_and(|v| !names.knows(words, DomainId(v.domain)))
        {
            values.clear(i);
            dropped = true;
        }
    }
    dropped
}

/// A snapshot refilled in place by a read of its request ([`ReadInto`]):
/// each segment with an event is written over the snapshot's next segment,
/// which keeps its storage and its catalog handle (no reference count
/// touched), or appended to it; [`Refill::finish`] then drops the stale
/// rest. A snapshot refilled with no more segments than it ever held (or
/// [`INLINE_SEGMENTS`]) allocates nothing, and a sweep that refills one
/// snapshot for every request moves no snapshot at all.
pub(crate) struct Refill<'a> {
    snap: &'a mut Snapshot,
    names: &'a Arc<Catalog>,
    edges: &'a [Edge],
    /// Segments written so far (the ones after are stale).
    n: usize,
    /// The (edge, index) of the last one written.
    last: (usize, u32),
    /// Whether they came in snapshot order. The protocol reads edges in
    /// declared order and each edge's kept segments by count, so by index:
    /// they do unless a region holds entry words edgemark never wrote.
    sorted: bool,
    /// The catalog's known domains when the read began.
    known: u32,
    /// Whether a value's domain is not among them: [`Refill::finish`] then
    /// checks each value against the region's table.
    unchecked: bool,
}

impl<'a> Refill<'a> {
    /// A refill of `snap` with the values of a request of a region with
    /// this catalog and these declared edges.
    #[inline]
    pub(crate) fn new(snap: &'a mut Snapshot, names: &'a Arc<Catalog>, edges: &'a [Edge]) -> Self {
        Refill {
            snap,
            names,
            edges,
            n: 0,
            last: (0, 0),
            sorted: true,
            known: 0,
            unchecked: false,
        }
    }

    /// Ends a read that succeeded: the snapshot is the request's, in
    /// `state`, with values no edgemark process writes left out (found in
    /// `words`, the region's, for domains this process has not met).
    #[inline]
    pub(crate) fn finish(self, state: RequestState, words: &[AtomicU64]) {
        let (names, unchecked) = (self.names, self.unchecked);
        let snap = self.end(state);
        if unchecked {
            for seg in &mut snap.segments {
                if drop_unknown(&mut seg.values, names, words) {
                    snap.corrupt = true;
                }
            }
            snap.segments.retain(|s| s.values.any());
        }
    }

    /// Ends the refill: the segments written, in snapshot order, in `state`.
    #[inline]
    fn end(self, state: RequestState) -> &'a mut Snapshot {
        let Refill {
            snap,
            edges,
            n,
            sorted,
            ..
        } = self;
        snap.state = state;
        if snap.segments.len() > n {
            snap.segments.truncate(n);
        }
        if !sorted {
            snap.segments
                .sort_by_key(|s| (edges.iter().position(|e| *e == s.edge), s.segment_index));
        }
        snap
    }
}

impl ReadInto for Refill<'_> {
    #[inline]
    fn start(&mut self) {
        self.n = 0;
        self.sorted = true;
        self.unchecked = false;
        self.known = self.names.known_mask();
        self.snap.dropped_segments = 0;
        self.snap.corrupt = false;
    }

    #[inline]
    fn corrupt(&mut self) {
        self.snap.corrupt = true;
    }

    #[inline]
    fn dropped(&mut self, n: u64) {
        self.snap.dropped_segments += n;
    }

    #[inline]
    fn segment(&mut self, edge: usize, index: u32, read: SegmentRead) {
        let SegmentRead {
            values,
            domains,
            corrupt,
        } = read;
        self.snap.corrupt |= corrupt;
        if domains == 0 {
            // Nothing recorded: the segment does not appear.
            return;
        }
        let Some(&declared) = self.edges.get(edge) else {
            return;
        };
        let key = (edge, index);
        self.sorted &= self.n == 0 || key > self.last;
        self.last = key;
        self.unchecked |= domains & !self.known != 0;
        match self.snap.segments.get_mut(self.n) {
            Some(seg) => {
                seg.edge = declared;
                seg.segment_index = index;
                seg.values = values;
                if !Arc::ptr_eq(&seg.names, self.names) {
                    seg.names = Arc::clone(self.names);
                }
            }
            None => self.snap.segments.push(EdgeSegment {
                edge: declared,
                segment_index: index,
                values,
                names: Arc::clone(self.names),
            }),
        }
        self.n += 1;
    }
}

/// A detached snapshot of one request: an owned value with no reference into
/// the region.
///
/// It serialises exactly as the upstream recorder's
/// `metrics["stream_edge_metrics"]` map, from `"from->to:segment"` to an
/// [`EdgeSegment`]; an edge segment appears once it has an event, so a
/// request that recorded nothing is `{}`. No request ID appears. Whether the
/// request is open and how many segments were dropped are told by
/// [`Snapshot::state`] and [`Snapshot::dropped_segments`], outside that map.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    state: RequestState,
    dropped_segments: u64,
    corrupt: bool,
    /// The first [`INLINE_SEGMENTS`] inline: building a snapshot of a
    /// request with no more edge segments than that allocates nothing.
    segments: SmallVec<[EdgeSegment; INLINE_SEGMENTS]>,
}

/// Edge segments a [`Snapshot`] holds without allocating: one segment on
/// each of two edges, the default pipeline's (stage 0 -> 1 -> 2).
const INLINE_SEGMENTS: usize = 2;

impl Snapshot {
    /// An empty snapshot.
    pub(crate) fn gone() -> Snapshot {
        Snapshot::empty(RequestState::Gone)
    }

    /// An empty snapshot in `state`.
    pub(crate) fn empty(state: RequestState) -> Snapshot {
        Snapshot {
            state,
            dropped_segments: 0,
            corrupt: false,
            segments: SmallVec::new(),
        }
    }

    /// Whether the request is open, closed by the call that returned this
    /// snapshot, or gone.
    #[inline]
    pub fn state(&self) -> RequestState {
        self.state
    }
    /// Segments that left the window of kept segments, over all edges.
    #[inline]
    pub fn dropped_segments(&self) -> u64 {
        self.dropped_segments
    }
    /// Whether some word of the request's slot held bits edgemark never
    /// writes (another process wrote garbage into the region); such values
    /// are left out.
    #[inline]
    pub fn is_corrupt(&self) -> bool {
        self.corrupt
    }
    /// The edge segments that have at least one event, in declared edge order
    /// and then segment order.
    #[inline]
    pub fn segments(&self) -> &[EdgeSegment] {
        &self.segments
    }
    /// One edge segment, if it has an event.
    pub fn segment(&self, edge: impl Into<Edge>, segment_index: u32) -> Option<&EdgeSegment> {
        let edge = edge.into();
        self.segments
            .iter()
            .find(|s| s.edge == edge && s.segment_index == segment_index)
    }
    /// Whether no event was recorded (the JSON form is `{}`).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }
    /// The snapshot's JSON form as a `serde_json::Value`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

impl Serialize for Snapshot {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.segments.len()))?;
        for seg in &self.segments {
            m.serialize_entry(&seg.key(), seg)?;
        }
        m.end()
    }
}
