//! What a record call names: a directed stage edge and a mark on it.
//!
//! These sit beside the schema, below the protocol and the region: the
//! header codec reads and writes edges, and the recorder checks marks.

use std::fmt;

use crate::schema::EventId;

/// A directed stage edge, `from -> to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Edge {
    /// The producing stage.
    pub from: u32,
    /// The consuming stage.
    pub to: u32,
}

impl Edge {
    /// The edge `from -> to`.
    pub const fn new(from: u32, to: u32) -> Edge {
        Edge { from, to }
    }
}

impl From<(u32, u32)> for Edge {
    fn from((from, to): (u32, u32)) -> Edge {
        Edge { from, to }
    }
}

impl fmt::Display for Edge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}->{}", self.from, self.to)
    }
}

/// What one record call observed: the edge, segment and event, whether the
/// payload was meaningful and, for the producer event, its chunk sequence.
///
/// ```
/// use edgemark::{Edge, Event, Mark};
/// let m = Mark::new(Edge::new(0, 1), Event::ProducerFirstNonemptyEmit)
///     .segment(0)
///     .chunk_seq(3);
/// assert!(m.is_meaningful());
/// let heartbeat = m.meaningful(false); // recorded as nothing
/// assert!(!heartbeat.is_meaningful());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    pub(crate) edge: Edge,
    pub(crate) segment: u32,
    pub(crate) event: EventId,
    pub(crate) meaningful: bool,
    pub(crate) chunk_seq: Option<u64>,
}

impl Mark {
    /// A meaningful observation of `event` on segment 0 of `edge`, without a
    /// chunk sequence.
    pub fn new(edge: impl Into<Edge>, event: impl Into<EventId>) -> Mark {
        Mark {
            edge: edge.into(),
            segment: 0,
            event: event.into(),
            meaningful: true,
            chunk_seq: None,
        }
    }
    /// On segment `segment` instead of 0.
    pub fn segment(mut self, segment: u32) -> Mark {
        self.segment = segment;
        self
    }
    /// Whether the payload counts: heartbeats, retries, metadata-only and
    /// empty terminal payloads do not, and leave no state.
    pub fn meaningful(mut self, meaningful: bool) -> Mark {
        self.meaningful = meaningful;
        self
    }
    /// The payload's chunk sequence number, kept by events that keep one
    /// (the producer event) and ignored by the others.
    pub fn chunk_seq(mut self, seq: u64) -> Mark {
        self.chunk_seq = Some(seq);
        self
    }
    /// Whether the payload counts.
    pub fn is_meaningful(&self) -> bool {
        self.meaningful
    }
}
