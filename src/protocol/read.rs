//! The readers: a snapshot of one open request and the sweep of open
//! slots. Nothing here writes the region.

use super::{Proto, RawSegment, RawSnapshot, Request, Values};
use crate::report::Owner;
use crate::schema::MAX_EVENTS;
use crate::sync::Ordering;
use crate::word::{self, SlotState};

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
    /// and after its cells): its edge, its index, its values, and whether a
    /// cell held bits edgemark never writes. In edge order, and for each
    /// edge in count order.
    fn segment(&mut self, edge: usize, index: u32, values: Values, corrupt: bool);
}

impl ReadInto for RawSnapshot {
    fn start(&mut self) {
        self.clear();
    }
    fn corrupt(&mut self) {
        self.corrupt = true;
    }
    fn dropped(&mut self, n: u64) {
        self.dropped += n;
    }
    fn segment(&mut self, edge: usize, index: u32, values: Values, corrupt: bool) {
        self.corrupt |= corrupt;
        self.segments.push(RawSegment {
            edge,
            index,
            values,
            corrupt,
        });
    }
}

/// An open request as a sweep found it: the request and the head word whose
/// Acquire load showed it open.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Found {
    pub(crate) req: Request,
    head: u64,
}

/// Whether head word `h` shows request generation `gen` open (a snapshot
/// may read it).
#[inline]
fn shows_open(h: u64, gen: u32) -> bool {
    word::decode_head(h).is_some_and(|d| {
        d.gen == gen && matches!(d.state, SlotState::Open | SlotState::Segmenting)
    })
}

impl<'a> Proto<'a> {
    /// Reads the current state of an open request without changing it,
    /// into `into`, built as it is read. `false` (and `into` meaningless)
    /// if the request is not open.
    #[inline]
    pub(crate) fn snapshot_into(&self, req: Request, into: &mut impl ReadInto) -> bool {
        // Acquire: pairs with the Release head store of `begin` (and of each
        // control operation), so the slot's layout is visible.
        let head = self.w(self.layout.head(req.slot)).load(Ordering::Acquire);
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
    fn read_after_head(&self, req: Request, head: u64, into: &mut impl ReadInto) -> bool {
        let Request { slot, gen } = req;
        let l = self.layout;
        if !shows_open(head, gen) {
            return false;
        }
        into.start();
        let events = (l.events as usize).min(MAX_EVENTS);
        for edge in 0..l.edges as usize {
            // Acquire: pairs with the Release store of the segment word in
            // `begin` / `start_segment`: the kept entries are laid.
            let Some(cur) = word::decode_seg(self.w(l.seg(slot, edge)).load(Ordering::Acquire))
            else {
                into.corrupt();
                continue;
            };
            let dropped = (cur.count + 1).saturating_sub(l.segments);
            if dropped != 0 {
                into.dropped(u64::from(dropped));
            }
            for count in l.window(cur.count) {
                let entry = l.ring(count);
                let entry_word = self.w(l.entry(slot, edge, entry));
                // Relaxed (both entry loads): the segment word's Acquire
                // already shows this count laid, and the Acquire cell loads
                // keep the second entry load after them; a cell relaid with
                // Release (`start_segment`) that we read then makes the new
                // entry word visible to that second load (loom mutation M18
                // weakened these and nothing failed, as this argues).
                let before = entry_word.load(Ordering::Relaxed);
                let Some(ew) = word::decode_seg(before) else {
                    into.corrupt();
                    continue;
                };
                if ew.count != count {
                    // Being relaid for a newer segment: it has left the window.
                    continue;
                }
                // The cells are read into a local array and decoded at once
                // (one value at a time into the segment made every append
                // wait on the last one's length).
                let mut cells = [0u64; MAX_EVENTS];
                for (ev, cell) in cells[..events].iter_mut().enumerate() {
                    // Acquire: pairs with the writers' Release CAS (the value
                    // comes with the head as new as its request) and with
                    // `start_segment`'s Release relay (a relaid cell comes
                    // with its new entry word, checked below).
                    *cell = self
                        .w(l.cell(slot, edge, entry, ev))
                        .load(Ordering::Acquire);
                }
                if entry_word.load(Ordering::Relaxed) != before {
                    continue;
                }
                let (values, corrupt) = Values::from_cells(&mut cells, events);
                into.segment(edge, ew.index, values, corrupt);
            }
        }
        // Acquire: a close that sealed cells we read (their swaps are
        // Release, after its `Closing` store) is visible here.
        shows_open(self.w(l.head(slot)).load(Ordering::Acquire), gen)
    }

    /// Every open request in slots `from..to`, slot by slot.
    pub(crate) fn open_slots(&self, from: u32, to: u32) -> impl Iterator<Item = Found> + 'a {
        let this = *self;
        (from..to.min(self.layout.slots)).filter_map(move |slot| {
            // Acquire: pairs with `begin`'s Release store of `Open`. For a
            // snapshot of the request found, this is its first head load.
            let head = this.w(this.layout.head(slot)).load(Ordering::Acquire);
            let d = word::decode_head(head)?;
            matches!(d.state, SlotState::Open | SlotState::Segmenting).then_some(Found {
                req: Request { slot, gen: d.gen },
                head,
            })
        })
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
