//! What a record call names: a directed stage edge and a mark on it.
//!
//! These sit beside the schema, below the protocol and the region: the
//! header codec reads and writes edges, and the recorder checks marks.

use std::fmt;

use crate::schema::EventId;
use crate::word::EdgeWord;

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

/// Slots of an [`EdgeIndex`]: a power of two, at least twice
/// [`MAX_EDGES`](crate::layout::MAX_EDGES), so a probe always meets an
/// empty slot and most lookups end at the first.
const INDEX_SLOTS: usize = 128;
/// Stage numbers below this resolve through [`EdgeIndex`]'s direct table.
const DIRECT_STAGES: usize = 16;
const _: () = assert!(INDEX_SLOTS.is_power_of_two() && INDEX_SLOTS >= 2 * crate::layout::MAX_EDGES);

/// A region's declared edges by stage pair: the record path finds an edge's
/// index with one multiply and, almost always, one probe, instead of a
/// search of the edge list.
///
/// An open-addressed table (linear probing) keyed by the edge's word
/// ([`EdgeWord`]).
/// Invariant: each declared edge is in exactly one slot, which holds its
/// key and its index plus one; fewer than half the slots are used, so every
/// probe sequence reaches an empty slot (index 0).
#[derive(Clone)]
pub(crate) struct EdgeIndex {
    /// For edges whose stages are both below [`DIRECT_STAGES`], the edge's
    /// index plus one at `from + to * DIRECT_STAGES` (0: not declared), so
    /// that the usual small stage numbers resolve with one load.
    direct: [u8; DIRECT_STAGES * DIRECT_STAGES],
    keys: [u64; INDEX_SLOTS],
    /// The edge's index plus one; 0 for an empty slot.
    indexes: [u8; INDEX_SLOTS],
}

impl EdgeIndex {
    /// The index of `edges`, which the header codec has validated (at most
    /// `MAX_EDGES`, no duplicates); edges beyond the limit are left out.
    pub(crate) fn new(edges: &[Edge]) -> EdgeIndex {
        let mut index = EdgeIndex {
            direct: [0; DIRECT_STAGES * DIRECT_STAGES],
            keys: [0; INDEX_SLOTS],
            indexes: [0; INDEX_SLOTS],
        };
        for (i, edge) in edges.iter().take(crate::layout::MAX_EDGES).enumerate() {
            let key = Self::key(*edge);
            let mut s = Self::home(key);
            while index.indexes[s] != 0 && index.keys[s] != key {
                s = (s + 1) & (INDEX_SLOTS - 1);
            }
            if index.indexes[s] == 0 {
                index.keys[s] = key;
                index.indexes[s] = i as u8 + 1;
                if let Some(d) = Self::direct_slot(*edge) {
                    index.direct[d] = i as u8 + 1;
                }
            }
        }
        index
    }

    #[inline]
    fn key(edge: Edge) -> u64 {
        EdgeWord::new(edge.from, edge.to).bits()
    }

    /// The first slot probed for `key`: the top bits of a Fibonacci hash.
    #[inline]
    fn home(key: u64) -> usize {
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - INDEX_SLOTS.trailing_zeros())) as usize
    }

    /// Where `edge` sits in the direct table, if both its stages are small.
    #[inline]
    fn direct_slot(edge: Edge) -> Option<usize> {
        let (from, to) = (edge.from as usize, edge.to as usize);
        (from < DIRECT_STAGES && to < DIRECT_STAGES).then_some(from + to * DIRECT_STAGES)
    }

    /// The index of `edge` among the declared edges, if it is one.
    #[inline]
    pub(crate) fn get(&self, edge: Edge) -> Option<usize> {
        if let Some(d) = Self::direct_slot(edge) {
            return usize::from(self.direct[d]).checked_sub(1);
        }
        self.get_hashed(edge)
    }

    /// [`EdgeIndex::get`] for an edge with a large stage number.
    #[cold]
    fn get_hashed(&self, edge: Edge) -> Option<usize> {
        let key = Self::key(edge);
        let mut s = Self::home(key);
        loop {
            let i = self.indexes[s];
            if i == 0 {
                return None;
            }
            if self.keys[s] == key {
                return Some(usize::from(i - 1));
            }
            s = (s + 1) & (INDEX_SLOTS - 1);
        }
    }
}

impl fmt::Debug for EdgeIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let used = self.indexes.iter().filter(|&&i| i != 0).count();
        f.debug_struct("EdgeIndex").field("edges", &used).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_edge_index_finds_every_declared_edge_and_nothing_else() {
        // The most edges a region holds, with stage pairs that collide in
        // the low bits.
        let edges: Vec<Edge> = (0..64u32)
            .map(|i| Edge::new(i * 128, i * 128 + 1 + (i % 3)))
            .collect();
        let index = EdgeIndex::new(&edges);
        for (i, e) in edges.iter().enumerate() {
            assert_eq!(index.get(*e), Some(i), "{e}");
        }
        assert_eq!(index.get(Edge::new(1, 0)), None);
        assert_eq!(index.get(Edge::new(0, 0)), None);
        assert_eq!(index.get(Edge::new(u32::MAX, u32::MAX)), None);
        let small = EdgeIndex::new(&[Edge::new(0, 1), Edge::new(1, 2)]);
        assert_eq!(small.get(Edge::new(1, 2)), Some(1));
        assert_eq!(small.get(Edge::new(2, 1)), None);
    }

    #[test]
    fn small_and_large_stages_resolve_through_their_own_tables() {
        // Both sides of the direct table's bound, in one index.
        let edges = [
            Edge::new(0, 1),
            Edge::new(15, 15),
            Edge::new(15, 16),
            Edge::new(16, 15),
            Edge::new(16, 0),
            Edge::new(0, 16),
            Edge::new(1, 0),
        ];
        let index = EdgeIndex::new(&edges);
        for (i, e) in edges.iter().enumerate() {
            assert_eq!(index.get(*e), Some(i), "{e}");
        }
        for absent in [
            Edge::new(1, 1),
            Edge::new(0, 15),
            Edge::new(16, 16),
            Edge::new(0, 17),
            Edge::new(17, 0),
        ] {
            assert_eq!(index.get(absent), None, "{absent}");
        }
        // A repeated edge keeps its first index in both tables.
        let repeated = EdgeIndex::new(&[
            Edge::new(2, 3),
            Edge::new(2, 3),
            Edge::new(20, 3),
            Edge::new(20, 3),
        ]);
        assert_eq!(repeated.get(Edge::new(2, 3)), Some(0));
        assert_eq!(repeated.get(Edge::new(20, 3)), Some(2));
    }
}
