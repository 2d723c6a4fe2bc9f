//! The recording protocol over a plain slice of atomics.
//!
//! `record.rs` holds the record path, `control.rs` the control operations
//! (begin, start segment, close, reclaim) and the histogram update of a
//! close, `read.rs` the readers (snapshot, the sweep of open slots).
//! Nothing here knows whether the words live in a shared mapping or on the
//! heap (the loom models run this code over heap storage). Offsets come from
//! [`Layout`], word packings from [`crate::word`] (a region word is
//! reached as its packed type through [`At`]).
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
mod ring;
mod ring_ack;

pub(crate) use control::{Closed, Discard, Reclaimed, Tally};
pub(crate) use read::{Both, Found, ReadInto, SegmentRead};
pub(crate) use ring::{RingWrite, Take, TakeAs};
pub(crate) use ring::{closed_us_of, replay, token_of, trace_of};
pub(crate) use ring_ack::{READER_SLOTS, Settle};

use core::marker::PhantomData;

use crate::layout::{H_COUNTERS, Layout};
use crate::outcome::Outcome;
use crate::schema::MAX_EVENTS;
use crate::sync::{AtomicU64, Ordering};
use crate::word::{CellWord, HeadWord, Packed, Recorded, SegmentWord};
use smallvec::SmallVec;

/// The values of one edge segment, one per schema event: each a value word
/// as read from the region, or [`CellWord::NONE`] where nothing was
/// recorded. Up to [`INLINE_EVENTS`] inline (no allocation; the default
/// schema has four events), more on the heap; kept small because snapshots
/// and sweeps move it around.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Values {
    /// At most `MAX_EVENTS` words, each a value word or `NONE`.
    words: SmallVec<[CellWord; INLINE_EVENTS]>,
}

impl Clone for Values {
    #[inline]
    fn clone(&self) -> Values {
        // In one piece: the derived clone appends word by word.
        Values::from_words(&self.words)
    }
}

/// Events whose values a segment holds without allocating.
pub(crate) const INLINE_EVENTS: usize = 4;
const _: () = assert!(INLINE_EVENTS <= MAX_EVENTS);

impl Values {
    /// Values holding the first `len` of `cells`, already kept
    /// ([`CellWord::kept`]; the rest `NONE`). Fixed-size copies only: a copy
    /// of a length known at run time is a call to `memcpy`.
    #[inline]
    fn from_kept<const N: usize>(cells: &[CellWord; N], len: usize) -> Values {
        let len = len.min(N).min(MAX_EVENTS);
        if N == INLINE_EVENTS {
            let mut buf = [CellWord::NONE; INLINE_EVENTS];
            buf.copy_from_slice(&cells[..INLINE_EVENTS]);
            Values {
                words: SmallVec::from_buf_and_len(buf, len),
            }
        } else {
            Values::from_words(&cells[..len])
        }
    }

    /// Values holding `words` (at most `MAX_EVENTS`), built in one piece
    /// (no append loop) and inline when they fit.
    #[inline]
    fn from_words(words: &[CellWord]) -> Values {
        let words = &words[..words.len().min(MAX_EVENTS)];
        if words.len() <= INLINE_EVENTS {
            let mut buf = [CellWord::NONE; INLINE_EVENTS];
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
    /// The value words, `NONE` where nothing was recorded.
    pub(crate) fn words(&self) -> &[CellWord] {
        &self.words
    }
    /// Event `i`'s value.
    pub(crate) fn get(&self, i: usize) -> Option<Recorded> {
        self.words.get(i)?.recorded()
    }
    pub(crate) fn clear(&mut self, i: usize) {
        if let Some(w) = self.words.get_mut(i) {
            *w = CellWord::NONE;
        }
    }
    pub(crate) fn iter(&self) -> impl Iterator<Item = Option<Recorded>> + '_ {
        self.words.iter().map(|w| w.recorded())
    }
    /// Bit `d` set for each clock domain `d` a value was recorded in.
    #[inline]
    pub(crate) fn domains(&self) -> u32 {
        self.words.iter().fold(0, |d, w| d | w.domain_bit())
    }
    /// Whether every recorded value's clock domain has its bit in `mask`
    /// (bit `i` for domain `i`).
    #[inline]
    pub(crate) fn all_in(&self, mask: u32) -> bool {
        self.domains() & !mask == 0
    }
    pub(crate) fn any(&self) -> bool {
        self.words.iter().any(|w| *w != CellWord::NONE)
    }
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
pub(crate) struct Occupant {
    pub(crate) slot: u32,
    pub(crate) generation: u32,
}

/// An atomic word of the region seen as the packed word type `W`: the
/// one place where a packed word becomes bits and back.
#[derive(Clone, Copy)]
pub(crate) struct At<'a, W> {
    word: &'a AtomicU64,
    packing: PhantomData<W>,
}

impl<'a, W: Packed> At<'a, W> {
    #[inline(always)]
    fn new(word: &'a AtomicU64) -> At<'a, W> {
        At {
            word,
            packing: PhantomData,
        }
    }
    #[inline(always)]
    pub(crate) fn load(self, order: Ordering) -> W {
        W::from_bits(self.word.load(order))
    }
    #[inline(always)]
    pub(crate) fn store(self, w: W, order: Ordering) {
        self.word.store(w.bits(), order)
    }
    #[inline(always)]
    pub(crate) fn swap(self, w: W, order: Ordering) -> W {
        W::from_bits(self.word.swap(w.bits(), order))
    }
    #[inline(always)]
    pub(crate) fn compare_exchange(
        self,
        current: W,
        new: W,
        success: Ordering,
        failure: Ordering,
    ) -> Result<W, W> {
        self.word
            .compare_exchange(current.bits(), new.bits(), success, failure)
            .map(W::from_bits)
            .map_err(W::from_bits)
    }
}

impl<'a> Proto<'a> {
    #[inline]
    fn w(&self, i: usize) -> &'a AtomicU64 {
        &self.words[i]
    }

    /// The head word of `slot`.
    #[inline]
    fn head(&self, slot: u32) -> At<'a, HeadWord> {
        At::new(self.w(self.layout.head(slot)))
    }

    /// The segment word of `edge` in `slot`.
    #[inline]
    fn segment(&self, slot: u32, edge: usize) -> At<'a, SegmentWord> {
        At::new(self.w(self.layout.seg(slot, edge)))
    }

    /// The entry word of ring entry `entry` of `edge` in `slot`.
    #[inline]
    fn entry(&self, slot: u32, edge: usize, entry: usize) -> At<'a, SegmentWord> {
        At::new(self.w(self.layout.entry(slot, edge, entry)))
    }

    /// The cell of `event` in ring entry `entry` of `edge` in `slot`.
    #[inline]
    fn cell(&self, slot: u32, edge: usize, entry: usize, event: usize) -> At<'a, CellWord> {
        At::new(self.w(self.layout.cell(slot, edge, entry, event)))
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
