//! The readers: a snapshot of one open request and the sweep of open
//! slots. Nothing here writes the region.

use super::{Proto, RawSegment, RawSnapshot, Request, Values};
use crate::report::Owner;
use crate::schema::MAX_EVENTS;
use crate::sync::Ordering;
use crate::word::{self, SlotState};

impl<'a> Proto<'a> {
    /// Reads the current state of an open request without changing it.
    /// `None` if the token's request is not open.
    pub(crate) fn snapshot(&self, req: Request) -> Option<RawSnapshot> {
        let mut snap = RawSnapshot::default();
        self.snapshot_into(req, &mut snap).then_some(snap)
    }

    /// [`Proto::snapshot`] into `snap`, whose segments' storage is reused
    /// (it is cleared first): a sweep reads every request into one buffer.
    /// `false` (and `snap` meaningless) if the request is not open.
    pub(crate) fn snapshot_into(&self, req: Request, snap: &mut RawSnapshot) -> bool {
        let Request { slot, gen } = req;
        let l = self.layout;
        let open = |h: u64| {
            word::decode_head(h).is_some_and(|d| {
                d.gen == gen && matches!(d.state, SlotState::Open | SlotState::Segmenting)
            })
        };
        // Acquire: pairs with the Release head store of `begin` (and of each
        // control operation), so the slot's layout is visible.
        if !open(self.w(l.head(slot)).load(Ordering::Acquire)) {
            return false;
        }
        snap.clear();
        let events = (l.events as usize).min(MAX_EVENTS);
        for edge in 0..l.edges as usize {
            // Acquire: pairs with the Release store of the segment word in
            // `begin` / `start_segment`: the kept entries are laid.
            let Some(cur) = word::decode_seg(self.w(l.seg(slot, edge)).load(Ordering::Acquire))
            else {
                snap.corrupt = true;
                continue;
            };
            snap.dropped += u64::from((cur.count + 1).saturating_sub(l.segments));
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
                    snap.corrupt = true;
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
                snap.corrupt |= corrupt;
                snap.segments.push(RawSegment {
                    edge,
                    index: ew.index,
                    values,
                    corrupt,
                });
            }
        }
        // Acquire: a close that sealed cells we read (their swaps are
        // Release, after its `Closing` store) is visible here.
        open(self.w(l.head(slot)).load(Ordering::Acquire))
    }

    /// Every open request in slots `from..to`, slot by slot.
    pub(crate) fn open_slots(&self, from: u32, to: u32) -> impl Iterator<Item = Request> + 'a {
        let this = *self;
        (from..to.min(self.layout.slots)).filter_map(move |slot| {
            // Acquire: pairs with `begin`'s Release store of `Open`.
            let h = this.w(this.layout.head(slot)).load(Ordering::Acquire);
            let d = word::decode_head(h)?;
            matches!(d.state, SlotState::Open | SlotState::Segmenting)
                .then_some(Request { slot, gen: d.gen })
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
