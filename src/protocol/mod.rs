//! The recording protocol over a plain slice of atomics.
//!
//! `record.rs` holds the record path, `control.rs` the control operations
//! (begin, start segment, close, reclaim) and the histogram update of a
//! close, `read.rs` the readers (snapshot, the sweep of open slots).
//! Nothing here knows whether the words live in a shared mapping or on the
//! heap (the loom models run this code over heap storage). Offsets come from
//! [`Layout`], word packings from [`crate::word`].
//!
//! # Protocol
//!
//! **Slots.** A slot's head word holds a 32-bit generation and a state:
//!
//! ```text
//!   Free(g) --begin--> Beginning(g+1) --begin--> Open(g+1)
//!   Open(g) --start_segment--> Segmenting(g) --start_segment--> Open(g)
//!   Open(g) --close--> Closing(g) --close--> Free(g)
//! ```
//!
//! `Beginning`, `Segmenting` and `Closing` are held by exactly one control
//! operation (the head compare-and-swap that entered them is the lock), so
//! control operations on one slot never overlap. Records take no lock: they
//! never write the head word.
//!
//! **Epochs and cells.** Each edge of a slot has a ring of `K` entries; the
//! segment with count `c` (the initial segment has count 0, each
//! `start_segment` adds one) lives in entry `c % K`. A cell is laid for one
//! epoch, the pair (generation, count), by storing the *empty word* of that
//! epoch into it: `begin` lays entry 0 for `(g, 0)`, `start_segment` lays the
//! next entry for `(g, c + 1)`. The segment word of the edge, published last,
//! tells writers the current count and index.
//!
//! **Record.** A writer holding token `(slot, g)` reads the segment word,
//! checks the segment index, and compares-and-swaps the cell from the empty
//! word of `(g, c)` to its value. That one CAS is the whole fence:
//!
//! - a token of an earlier request expects an empty word with an older
//!   generation, which no cell of the current occupant holds;
//! - a writer of a retired segment expects the empty word of an older count,
//!   which a relaid entry no longer holds;
//! - `close` replaces every kept cell with a *sealed* word (by swap, which
//!   also collects the final values), so a CAS after the seal fails and a CAS
//!   before it is in the final snapshot;
//! - a duplicate finds a value word instead of the empty word.
//!
//! A stale write could land only if a cell came back to the exact empty word
//! the writer read, which takes 2^32 generations of the same slot while the
//! writer is stopped between two instructions (see `docs/design.md`).
//!
//! **Snapshots** read the head, then each edge's segment word, then each kept
//! entry (its entry word before and after its cells), then the head again;
//! a snapshot that saw the slot change gives nothing rather than a mixture.
mod control;
mod read;
mod record;

pub(crate) use control::{Closed, Reclaimed};
pub(crate) use read::{Found, ReadInto, SegmentRead};

use crate::layout::{Layout, H_COUNTERS};
use crate::outcome::Outcome;
use crate::schema::MAX_EVENTS;
use crate::sync::{AtomicU64, Ordering};
use crate::word::{self, Cell, Value};
use smallvec::SmallVec;

/// The values of one edge segment, one per schema event: each a value word
/// as read from the region, or 0 where nothing was recorded. Up to
/// [`INLINE_EVENTS`] inline (no allocation; the default schema has four
/// events), more on the heap; kept small because snapshots and sweeps move
/// it around.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Values {
    /// At most `MAX_EVENTS` words.
    words: SmallVec<[u64; INLINE_EVENTS]>,
}

impl Clone for Values {
    #[inline]
    fn clone(&self) -> Values {
        // In one piece: the derived clone appends word by word.
        Values::from_words(&self.words)
    }
}

/// Kept segments (over all edges) a [`RawSnapshot`] holds without
/// allocating: one on each of four edges, or the default window of four on
/// one.
pub(crate) const INLINE_SEGMENTS: usize = 4;

/// Events whose values a segment holds without allocating.
pub(crate) const INLINE_EVENTS: usize = 4;
const _: () = assert!(INLINE_EVENTS <= MAX_EVENTS);

impl Values {
    pub(crate) fn new() -> Values {
        Values {
            words: SmallVec::new(),
        }
    }
    /// Appends one event's value (`None`: not recorded).
    pub(crate) fn push(&mut self, v: Option<Value>) {
        // The layout validated at most MAX_EVENTS events.
        if self.words.len() < MAX_EVENTS {
            self.words
                .push(v.map_or(0, |v| word::value(v.domain, v.chunk_seq, v.elapsed_us)));
        }
    }
    /// The values of the first `len` of `cells`, one cell word per event
    /// as read from the region, decoded in place (the rest of `cells` must
    /// be zero); and whether a cell held bits edgemark never writes. The
    /// decoding is [`RawSegment::push_cell`]'s. Fixed-size copies only: a
    /// copy of a length known at run time is a call to `memcpy`.
    #[inline]
    pub(crate) fn from_cells(cells: &mut [u64; MAX_EVENTS], len: usize) -> (Values, bool) {
        let len = len.min(MAX_EVENTS);
        let mut corrupt = false;
        for cell in &mut cells[..len] {
            match word::decode(*cell) {
                Cell::Value(_) => {}
                Cell::Empty { .. } | Cell::Sealed => *cell = 0,
                Cell::Corrupt => {
                    corrupt = true;
                    *cell = 0;
                }
            }
        }
        let values = if len <= INLINE_EVENTS {
            let mut buf = [0u64; INLINE_EVENTS];
            buf.copy_from_slice(&cells[..INLINE_EVENTS]);
            Values {
                words: SmallVec::from_buf_and_len(buf, len),
            }
        } else {
            Values::from_words(&cells[..len])
        };
        (values, corrupt)
    }

    /// Values holding `words` (at most `MAX_EVENTS`), built in one piece
    /// (no append loop) and inline when they fit.
    #[inline]
    fn from_words(words: &[u64]) -> Values {
        let words = &words[..words.len().min(MAX_EVENTS)];
        if words.len() <= INLINE_EVENTS {
            let mut buf = [0u64; INLINE_EVENTS];
            buf[..words.len()].copy_from_slice(words);
            Values {
                words: SmallVec::from_buf_and_len(buf, words.len()),
            }
        } else {
            Values {
                words: SmallVec::from_slice(words),
            }
        }
    }
    pub(crate) fn len(&self) -> usize {
        self.words.len()
    }
    /// Event `i`'s value.
    pub(crate) fn get(&self, i: usize) -> Option<Value> {
        if i >= self.len() {
            return None;
        }
        match word::decode(self.words[i]) {
            Cell::Value(v) => Some(v),
            _ => None,
        }
    }
    pub(crate) fn clear(&mut self, i: usize) {
        if i < self.len() {
            self.words[i] = 0;
        }
    }
    pub(crate) fn iter(&self) -> impl Iterator<Item = Option<Value>> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }
    /// Whether every recorded value's clock domain has its bit in `mask`
    /// (bit `i` for domain `i`).
    #[inline]
    pub(crate) fn all_in(&self, mask: u32) -> bool {
        self.words
            .iter()
            .all(|&w| word::value_domain(w).is_none_or(|d| mask & (1 << (d & 31)) != 0))
    }
    pub(crate) fn any(&self) -> bool {
        self.words[..self.len()].iter().any(|w| *w != 0)
    }
}

/// One kept segment of one edge, as read from the region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RawSegment {
    pub(crate) edge: usize,
    pub(crate) index: u32,
    /// One entry per schema event.
    pub(crate) values: Values,
    pub(crate) corrupt: bool,
}

/// What a snapshot or close read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RawSnapshot {
    /// Inline up to [`INLINE_SEGMENTS`]: reading a request with no more
    /// kept segments than that allocates nothing.
    pub(crate) segments: SmallVec<[RawSegment; INLINE_SEGMENTS]>,
    pub(crate) dropped: u64,
    pub(crate) corrupt: bool,
}

/// The protocol's view of a region: its words and their geometry.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Proto<'a> {
    pub(crate) words: &'a [AtomicU64],
    pub(crate) layout: &'a Layout,
}

/// A request's place in the region: its slot and the slot's generation
/// while the request holds it (a token without the region ID).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) slot: u32,
    pub(crate) gen: u32,
}

impl RawSnapshot {
    /// Empties the snapshot, keeping its segments' storage.
    pub(crate) fn clear(&mut self) {
        self.segments.clear();
        self.dropped = 0;
        self.corrupt = false;
    }
}

impl RawSegment {
    /// Appends the value a cell word read by a snapshot or a seal holds: a
    /// value word is kept; an empty or sealed word is "not recorded"; bits
    /// edgemark never writes are "not recorded" and mark the segment
    /// corrupt. The one decoding of cells into values that snapshots and
    /// close share.
    fn push_cell(&mut self, cell: u64) {
        self.values.push(match word::decode(cell) {
            Cell::Value(v) => Some(v),
            Cell::Empty { .. } | Cell::Sealed => None,
            Cell::Corrupt => {
                self.corrupt = true;
                None
            }
        });
    }
}

impl<'a> Proto<'a> {
    #[inline]
    fn w(&self, i: usize) -> &'a AtomicU64 {
        &self.words[i]
    }

    /// Counts a refusal in the header (statistics only, hence `Relaxed`).
    #[inline]
    pub(crate) fn count(&self, outcome: Outcome) -> Outcome {
        if let Some(i) = outcome.counter() {
            self.w(H_COUNTERS + i).fetch_add(1, Ordering::Relaxed);
        }
        outcome
    }
}
