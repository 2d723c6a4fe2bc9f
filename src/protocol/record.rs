//! The record path: one compare-and-swap on a cell, and the classification
//! of a refusal.

use super::{Occupant, Proto};
use crate::outcome::Outcome;
use crate::sync::{Ordering, fence};
use crate::word::{Cell, CellWord, SlotState};

impl Proto<'_> {
    /// Records one value word. `value` turns the request's origin into the
    /// word to store (or a refusal); it runs only when the cell is empty.
    #[inline]
    pub(crate) fn record(
        &self,
        req: Occupant,
        edge: usize,
        segment: u32,
        event: usize,
        value: impl FnOnce(u64) -> Result<CellWord, Outcome>,
    ) -> Outcome {
        let Occupant { slot, generation } = req;
        let l = self.layout;
        // Acquire: pairs with the Release store of the segment word in
        // `begin` / `start_segment`; the cell and origin loads below then see
        // the epoch's laid cells and the request's origin.
        let Some(seg) = self.segment(slot, edge).load(Ordering::Acquire).decode() else {
            return self.refuse(slot, generation, Outcome::Corrupt);
        };
        if seg.index != segment {
            let why = if segment < seg.index {
                Outcome::StaleSegment
            } else {
                Outcome::SegmentNotStarted
            };
            return self.refuse(slot, generation, why);
        }
        let cell = self.cell(slot, edge, Self::ring_entry(l, seg.count), event);
        let empty = CellWord::empty(generation, seg.count);
        // Relaxed: only compared; the CAS below decides. Checking first keeps
        // duplicates (the common refusal) free of a clock read and a locked
        // instruction.
        let seen = cell.load(Ordering::Relaxed);
        if seen != empty {
            return self.refuse_cell(slot, generation, seen);
        }
        // Relaxed: ordered after the Acquire load of the segment word, which
        // `begin` published after storing the origin. If the slot was reused
        // since, the CAS below fails, so a newer origin never lands.
        let origin = self.w(l.origin(slot)).load(Ordering::Relaxed);
        let new = match value(origin) {
            Ok(w) => w,
            Err(why) => return self.count(why),
        };
        // Release, for two pairings. With the AcqRel swap in `close`: our
        // origin load then happens before the close, hence before any later
        // `begin` of this slot stores a new origin. With the Acquire cell
        // loads of `snapshot` (and the fence in `refuse_cell`): a reader that
        // sees this value also sees the head as new as our request, so a
        // snapshot of an older request that reads it fails its final head
        // check (loom model m7). Relaxed on failure: the observed word is
        // only classified.
        match cell.compare_exchange(empty, new, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => Outcome::Recorded,
            Err(actual) => self.refuse_cell(slot, generation, actual),
        }
    }

    /// The ring entry of segment count `count`: the count itself while it
    /// is below the ring's size (the usual case: no multiplication), else
    /// [`Layout::ring`].
    #[inline]
    fn ring_entry(l: &crate::layout::Layout, count: u32) -> usize {
        if count < l.segments {
            count as usize
        } else {
            l.ring(count)
        }
    }

    /// Classifies a refusal, giving the request's own state precedence over
    /// the reason found on the record path.
    #[cold]
    fn refuse(&self, slot: u32, generation: u32, why: Outcome) -> Outcome {
        // Acquire: pairs with the Release head stores of the control
        // operations, so a closed or reused slot is reported as such.
        let outcome = match self.head(slot).load(Ordering::Acquire).decode() {
            None => Outcome::Corrupt,
            Some(d) if d.generation != generation => Outcome::Reused,
            Some(d) if matches!(d.state, SlotState::Open | SlotState::Segmenting) => why,
            Some(_) => Outcome::Closed,
        };
        self.count(outcome)
    }

    #[cold]
    fn refuse_cell(&self, slot: u32, generation: u32, seen: CellWord) -> Outcome {
        // Acquire fence: pairs with the Release CAS (a value) or the AcqRel
        // swap (a seal) that wrote `seen`, so the head load in `refuse` sees
        // the slot at least as new as the request that wrote it. Without it
        // a stale writer that read a newer request's value could be told
        // `Duplicate` (found by the loom model m3).
        fence(Ordering::Acquire);
        let why = match seen.decode() {
            Cell::Value(_) => Outcome::Duplicate,
            Cell::Sealed => Outcome::Closed,
            // An empty word names its epoch: laid by a newer request, so the
            // answer is known without the head (which, after begin's Release
            // fence and ours, would say the same).
            Cell::Empty { generation: g, .. } if g != generation => {
                return self.count(Outcome::Reused);
            }
            // Laid for a newer segment of this request: the entry was relaid.
            Cell::Empty { .. } => Outcome::StaleSegment,
            Cell::Corrupt => Outcome::Corrupt,
        };
        self.refuse(slot, generation, why)
    }
}
