//! The readers: a snapshot of one open request and the sweep of open
//! slots. Nothing here writes the region.

use super::{At, INLINE_EVENTS, Occupant, Proto, Values};
use crate::layout::TRACE_WORDS;
use crate::report::Owner;
use crate::schema::MAX_EVENTS;
use crate::sync::{AtomicU64, Ordering, fence};
use crate::word::{CellWord, HeadWord};

/// What a read of one request is built into, as it is read: the reader
/// hands each kept segment straight to its destination (a snapshot refilled
/// in place, in a sweep), with no buffer of raw segments in between.
///
/// A read that returns `false` leaves its destination meaningless (the
/// request closed or was replaced while it was read).
pub(crate) trait ReadInto {
    /// The head showed the request open: the read begins. Anything an
    /// earlier read left is forgotten.
    fn start(&mut self);
    /// A segment or entry word held bits edgemark never writes.
    fn corrupt(&mut self);
    /// `n` segments of one edge have left the window of kept segments.
    fn dropped(&mut self, n: u64);
    /// One kept segment, read whole (its entry word was the same before
    /// and after its cells): its edge, its index, and what it holds. In
    /// edge order, and for each edge in count order.
    fn segment(&mut self, edge: usize, index: u32, read: SegmentRead);
}

/// What one kept segment holds, as read.
#[derive(Clone, Debug)]
pub(crate) struct SegmentRead {
    /// One value word per schema event, `NONE` where nothing was recorded.
    pub(crate) values: Values,
    /// Bit `d` set for each clock domain `d` a value was recorded in: 0
    /// when nothing was recorded.
    pub(crate) domains: u32,
    /// Whether a cell held bits edgemark never writes.
    pub(crate) corrupt: bool,
}

impl SegmentRead {
    /// The read of the first `len` of `cells` (one cell word per event as
    /// read from the region, the rest `NONE`), kept ([`CellWord::kept`])
    /// in one pass with their domains and whether one was corrupt. The one
    /// decoding of cells that snapshots, sweeps and close share.
    #[inline]
    pub(crate) fn of_cells<const N: usize>(mut cells: [CellWord; N], len: usize) -> SegmentRead {
        let mut corrupt = false;
        let mut domains = 0;
        for cell in &mut cells {
            let (kept, bad) = cell.kept();
            *cell = kept;
            corrupt |= bad;
            domains |= kept.domain_bit();
        }
        SegmentRead {
            values: Values::from_kept(&cells, len),
            domains,
            corrupt,
        }
    }
}

/// Two reads of one request at once: each gets every call (`A` a copy of
/// each segment). A close reads its final values into the snapshot it
/// returns and into a [`Tally`](super::Tally) for the histograms.
#[derive(Debug)]
pub(crate) struct Both<'a, A, B>(pub(crate) &'a mut A, pub(crate) &'a mut B);

impl<A: ReadInto, B: ReadInto> ReadInto for Both<'_, A, B> {
    fn start(&mut self) {
        self.0.start();
        self.1.start();
    }
    fn corrupt(&mut self) {
        self.0.corrupt();
        self.1.corrupt();
    }
    fn dropped(&mut self, n: u64) {
        self.0.dropped(n);
        self.1.dropped(n);
    }
    fn segment(&mut self, edge: usize, index: u32, read: SegmentRead) {
        self.0.segment(edge, index, read.clone());
        self.1.segment(edge, index, read);
    }
}

/// The first `len` (at most `N`) of a kept entry's cells, in order, the
/// rest `NONE`.
#[inline]
fn load_cells<const N: usize>(cells: &[AtomicU64], len: usize) -> [CellWord; N] {
    let mut out = [CellWord::NONE; N];
    for (i, (v, cell)) in out.iter_mut().zip(cells).enumerate() {
        if i < len {
            // Acquire: pairs with the writers' Release CAS (the value
            // comes with the head as new as its request) and with
            // `start_segment`'s Release relay (a relaid cell comes with its
            // new entry word, checked after these loads).
            *v = At::<CellWord>::new(cell).load(Ordering::Acquire);
        }
    }
    out
}

/// An open request as a sweep found it: the request and the head word whose
/// Acquire load showed it open.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Found {
    pub(crate) req: Occupant,
    head: HeadWord,
}

impl<'a> Proto<'a> {
    /// Reads the current state of an open request without changing it,
    /// into `into`, built as it is read. `false` (and `into` meaningless)
    /// if the request is not open.
    #[inline]
    pub(crate) fn snapshot_into(&self, req: Occupant, into: &mut impl ReadInto) -> bool {
        // Acquire: pairs with the Release head store of `begin` (and of each
        // control operation), so the slot's layout is visible.
        let head = self.head(req.slot).load(Ordering::Acquire);
        self.read_after_head(req, head, into)
    }

    /// [`Proto::snapshot_into`] of a request a sweep found open: the sweep's
    /// Acquire load of the head ([`Proto::open_slots`]) is the snapshot's
    /// first read of it, so the read goes on from there, in the same order.
    #[inline]
    pub(crate) fn snapshot_found(&self, found: Found, into: &mut impl ReadInto) -> bool {
        self.read_after_head(found.req, found.head, into)
    }

    /// The read of a snapshot after its first head load (Acquire), which
    /// gave `head`: each edge's segment word, each kept entry (its entry
    /// word before and after its cells), then the head again.
    #[inline]
    fn read_after_head(&self, req: Occupant, head: HeadWord, into: &mut impl ReadInto) -> bool {
        let Occupant { slot, generation } = req;
        if !head.shows_open(generation) {
            return false;
        }
        // A copy: its fields stay in registers across the atomic loads
        // (through the reference they would be read again after each).
        let l = *self.layout;
        into.start();
        let events = (l.events as usize).min(MAX_EVENTS);
        // Where the entries begin, and the words of an entry and of an
        // edge's ring of entries: `l.entry(slot, edge, entry)` without its
        // multiplications for each entry.
        let entries = l.entry(slot, 0, 0);
        let entry_words = 1 + l.events as usize;
        let ring_words = l.segments as usize * entry_words;
        for edge in 0..l.edges as usize {
            // Acquire: pairs with the Release store of the segment word in
            // `begin` / `start_segment`: the kept entries are laid.
            let Some(cur) = self.segment(slot, edge).load(Ordering::Acquire).decode() else {
                into.corrupt();
                continue;
            };
            // The window of kept counts, `l.window(cur.count)`, as a plain
            // range (an inclusive range's iterator tests a flag each step).
            let kept = (cur.count + 1).min(l.segments);
            if kept <= cur.count {
                into.dropped(u64::from(cur.count + 1 - kept));
            }
            for count in cur.count + 1 - kept..cur.count + 1 {
                // `l.ring(count)`, which is the count itself until the ring
                // has gone round once.
                let entry = if count < l.segments {
                    count as usize
                } else {
                    l.ring(count)
                };
                // The entry word and its cells: one bounds check.
                let at = entries + edge * ring_words + entry * entry_words;
                debug_assert_eq!(at, l.entry(slot, edge, entry));
                let words = &self.words[at..at + entry_words];
                let entry_word = At::<crate::word::SegmentWord>::new(&words[0]);
                let cells = &words[1..];
                // Relaxed (both entry loads): the segment word's Acquire
                // already shows this count laid, and the Acquire cell loads
                // keep the second entry load after them; a cell relaid with
                // Release (`start_segment`) that we read then makes the new
                // entry word visible to that second load (loom mutation M18
                // weakened these and nothing failed, as this argues).
                let before = entry_word.load(Ordering::Relaxed);
                let Some(ew) = before.decode() else {
                    into.corrupt();
                    continue;
                };
                if ew.count != count {
                    // Being relaid for a newer segment: it has left the window.
                    continue;
                }
                // The cells are read into a local array and decoded at once
                // (one value at a time into the segment made every append
                // wait on the last one's length); into one of the inline
                // size when the schema's events fit inline.
                let read = if events <= INLINE_EVENTS {
                    let cells = load_cells::<INLINE_EVENTS>(cells, events);
                    if entry_word.load(Ordering::Relaxed) != before {
                        continue;
                    }
                    SegmentRead::of_cells(cells, events)
                } else {
                    let cells = load_cells::<MAX_EVENTS>(cells, events);
                    if entry_word.load(Ordering::Relaxed) != before {
                        continue;
                    }
                    SegmentRead::of_cells(cells, events)
                };
                into.segment(edge, ew.index, read);
            }
        }
        // Acquire: a close that sealed cells we read (their swaps are
        // Release, after its `Closing` store) is visible here.
        self.head(slot)
            .load(Ordering::Acquire)
            .shows_open(generation)
    }

    /// Every open request in slots `from..to`, slot by slot.
    pub(crate) fn open_slots(&self, from: u32, to: u32) -> impl Iterator<Item = Found> + 'a {
        let this = *self;
        (from..to.min(self.layout.slots)).filter_map(move |slot| {
            // Acquire: pairs with `begin`'s Release store of `Open`. For a
            // snapshot of the request found, this is its first head load.
            let head = this.head(slot).load(Ordering::Acquire);
            head.is_open().then_some(Found {
                req: Occupant {
                    slot,
                    generation: head.generation(),
                },
                head,
            })
        })
    }

    /// The trace words `begin` stored for an open request; `None` if the
    /// request is not open (or closed while they were read).
    pub(crate) fn trace_words(&self, req: Occupant) -> Option<[u64; TRACE_WORDS]> {
        let first = self.layout.trace(req.slot);
        // Acquire: pairs with `begin`'s Release store of `Open`, which
        // publishes the trace words.
        if !self
            .head(req.slot)
            .load(Ordering::Acquire)
            .shows_open(req.generation)
        {
            return None;
        }
        let mut w = [0; TRACE_WORDS];
        for (i, v) in w.iter_mut().enumerate() {
            // Relaxed: validated by the fence and the second head load.
            *v = self.w(first + i).load(Ordering::Relaxed);
        }
        // Acquire fence: if a load above read a store of a later `begin`
        // of the slot (made after its Release fence), the head load below
        // sees that begin's head, not this request's.
        fence(Ordering::Acquire);
        // Relaxed: ordered by the fence.
        self.head(req.slot)
            .load(Ordering::Relaxed)
            .shows_open(req.generation)
            .then_some(w)
    }

    /// The origin `begin` stored in `slot`: a reading of the region's clock.
    /// For a request a sweep found open ([`Proto::open_slots`]), it is that
    /// request's origin or a later request's, which is never older (a
    /// caller that acts on it through a control operation on the found
    /// generation fails if the slot moved on).
    pub(crate) fn origin(&self, slot: u32) -> u64 {
        // Relaxed: ordered after the sweep's Acquire load of the head, which
        // pairs with `begin`'s Release store of `Open` made after it stored
        // the origin.
        self.w(self.layout.origin(slot)).load(Ordering::Relaxed)
    }

    /// Whether event `event` of segment `segment` of `edge` holds a value
    /// for the open request `req`, read after a sequentially consistent
    /// fence: the read of a close decision that two parties make from each
    /// other's records (`Viewer::recorded`). `false` when the request is
    /// not open (closed, reused), the segment is not kept (not started,
    /// dropped from the window, or being relaid), or the cell holds no
    /// value.
    ///
    /// # The fence
    ///
    /// Party A records event X (its compare-and-swap on X's cell, in
    /// [`Proto::record`]) and then asks whether Y is in; party B records Y
    /// and then asks whether X is in. With only the record's Release CAS
    /// and Acquire loads, both loads may read the cell as it was before
    /// the other's CAS (store buffering: Arm and POWER allow it; x86 does
    /// not), and neither party closes. The SeqCst fence here, between
    /// each party's CAS and its load, forbids that. In the terms of
    /// C++20 [atomics.order] (which Rust's model is): suppose B's load of
    /// X's cell read a value before A's CAS in that cell's modification
    /// order. Then the load is coherence-ordered before the CAS; B's fence
    /// happens before the load and the CAS happens before A's fence, so
    /// (p4.4) B's fence precedes A's in the single total order S. By the
    /// same argument, if A's load also missed B's CAS, A's fence precedes
    /// B's in S: a contradiction, S being a total order. So at least one
    /// of the loads sees the other's value (or a later word of that cell:
    /// a close's seal, so someone closed, or a newer segment's relay,
    /// after which the segment asked about is gone).
    ///
    /// The record path stays as it is: the argument needs only that each
    /// party's write of its event happens before its own fence, which
    /// holds for its own CAS (sequenced before) whatever the CAS's
    /// ordering, and for a value another writer got in first (the caller
    /// was told `Duplicate` after `refuse_cell`'s Acquire fence, which
    /// synchronises with that writer's Release CAS). Making the CAS SeqCst
    /// instead would not do without SeqCst on the load side too, and
    /// would put the cost on every record rather than on this call, made
    /// once per close decision. loom models the fence (m12a), and the
    /// unfenced read fails the same model (m12b).
    pub(crate) fn recorded(&self, req: Occupant, edge: usize, segment: u32, event: usize) -> bool {
        // SeqCst: the fence of the argument above; pairs with the same
        // fence of the other party's `recorded`, after its own record.
        fence(Ordering::SeqCst);
        self.holds_value(req, edge, segment, event)
    }

    /// [`Proto::recorded`] without its fence: what a snapshot would say of
    /// the one cell. Only the loom models call it alone, to show that the
    /// fence is needed (m12b).
    pub(crate) fn holds_value(
        &self,
        req: Occupant,
        edge: usize,
        segment: u32,
        event: usize,
    ) -> bool {
        let Occupant { slot, generation } = req;
        let l = *self.layout;
        // Acquire: pairs with the Release head store of `begin` (and of each
        // control operation), so the slot's layout is visible.
        if !self
            .head(slot)
            .load(Ordering::Acquire)
            .shows_open(generation)
        {
            return false;
        }
        // Acquire: pairs with the Release store of the segment word in
        // `begin` / `start_segment`: the kept entries are laid.
        let Some(cur) = self.segment(slot, edge).load(Ordering::Acquire).decode() else {
            return false;
        };
        if segment > cur.index {
            return false;
        }
        // The kept entry that holds segment `segment`, newest first (the
        // current segment's, usually).
        let found = l.window(cur.count).rev().find_map(|count| {
            let entry = l.ring(count);
            // Relaxed: as a snapshot's first entry load (`read_after_head`):
            // the segment word's Acquire shows the window's entries laid,
            // and the entry word is checked again after the cell.
            let word = self.entry(slot, edge, entry).load(Ordering::Relaxed);
            word.decode()
                .filter(|e| e.count == count && e.index == segment)
                .map(|_| (entry, word))
        });
        let Some((entry, word)) = found else {
            return false;
        };
        // Acquire: pairs with the writer's Release CAS (the value comes with
        // the head as new as its request) and with `start_segment`'s Release
        // relay (a relaid cell comes with its new entry word).
        let cell = self.cell(slot, edge, entry, event).load(Ordering::Acquire);
        // Relaxed: kept after the Acquire cell load; an entry relaid for a
        // newer segment meanwhile no longer holds this one.
        if self.entry(slot, edge, entry).load(Ordering::Relaxed) != word {
            return false;
        }
        // Acquire: a value of a later request of the slot (read above, its
        // CAS Release after that request's `begin`) comes with that
        // request's head, so the check fails rather than answer for it.
        cell.is_value()
            && self
                .head(slot)
                .load(Ordering::Acquire)
                .shows_open(generation)
    }

    /// The owner identity (pid, process start time) stored by `begin`.
    pub(crate) fn owner(&self, slot: u32) -> Owner {
        let l = self.layout;
        // Relaxed: diagnostics and reclaim heuristics only.
        Owner {
            pid: self.w(l.owner_pid(slot)).load(Ordering::Relaxed),
            start_ticks: self.w(l.owner_start(slot)).load(Ordering::Relaxed),
        }
    }
}
