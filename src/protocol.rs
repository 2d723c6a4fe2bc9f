//! The recording protocol over a plain slice of atomics.
//!
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

use crate::layout::{Layout, H_COUNTERS, H_CURSOR, H_DROPPED, H_RECLAIMED};
use crate::outcome::Outcome;
use crate::schema::MAX_EVENTS;
use crate::sync::{fence, spin_step, AtomicU64, Ordering};
use crate::word::{self, Cell, SlotState, Value};

/// How many rounds a control operation waits for another one on the same
/// slot before giving up with [`Outcome::Busy`]: with `spin_step`'s
/// back-off, about a second.
const LOCK_ROUNDS: u32 = if cfg!(edgemark_loom) { 4 } else { 2_000 };

/// The values of one edge segment, one per schema event, inline (no
/// allocation): each a value word as read from the region, or 0 where
/// nothing was recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Values {
    words: [u64; MAX_EVENTS],
    len: u8,
}

impl Values {
    pub(crate) const fn new() -> Values {
        Values {
            words: [0; MAX_EVENTS],
            len: 0,
        }
    }
    /// Appends one event's value (`None`: not recorded).
    pub(crate) fn push(&mut self, v: Option<Value>) {
        // The layout validated at most MAX_EVENTS events.
        let i = (self.len as usize).min(MAX_EVENTS - 1);
        self.words[i] = v.map_or(0, |v| word::value(v.domain, v.chunk_seq, v.elapsed_us));
        self.len = self.len.saturating_add(1).min(MAX_EVENTS as u8);
    }
    pub(crate) fn len(&self) -> usize {
        self.len as usize
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
    pub(crate) segments: Vec<RawSegment>,
    pub(crate) dropped: u64,
    pub(crate) corrupt: bool,
}

/// The protocol's view of a region: its words and their geometry.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Proto<'a> {
    pub(crate) words: &'a [AtomicU64],
    pub(crate) layout: &'a Layout,
}

/// Why `reclaim` freed a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reclaimed {
    /// An open request whose owner process is gone.
    DeadOwner,
    /// A control lock whose holder process is gone.
    DeadHolder,
}

/// The result of trying to take a slot's control lock.
enum Lock {
    Held,
    /// Taken from a holder that died inside its operation.
    TookOver,
    Refused(Outcome),
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

    /// Claims a free slot for a new request and lays it out.
    ///
    /// Returns the slot and its new generation, or `None` when every slot is
    /// in use.
    /// `owner` is the (pid, start time) stored for reclaim; `holder` names
    /// the calling thread in the head while it lays the slot out.
    pub(crate) fn begin(
        &self,
        origin_ns: u64,
        owner: (u64, u64),
        holder: u32,
    ) -> Option<(u32, u32)> {
        let l = self.layout;
        // Relaxed: the cursor only spreads requests over the slots; the head
        // CAS below decides ownership.
        let start = self.w(H_CURSOR).fetch_add(1, Ordering::Relaxed);
        for i in 0..u64::from(l.slots) {
            let slot = ((start.wrapping_add(i)) % u64::from(l.slots)) as u32;
            let head = self.w(l.head(slot));
            // Relaxed: a hint; the CAS re-validates the word.
            let h = head.load(Ordering::Relaxed);
            let Some(d) = word::decode_head(h) else {
                continue;
            };
            if d.state != SlotState::Free {
                continue;
            }
            let gen = word::next_gen(d.gen);
            // Acquire: pairs with the Release store of `Free` at the end of
            // `close`, so that close's seals happen before the stores below.
            // Relaxed on failure: we move on to the next slot.
            if head
                .compare_exchange(
                    h,
                    word::head_held(gen, SlotState::Beginning, holder),
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_err()
            {
                continue;
            }
            // Release fence: a reader whose Acquire load reads any of the
            // Relaxed stores below (a laid cell, an entry word) then also
            // sees our `Beginning` head, so a snapshot of the slot's previous
            // request that reads them fails its final head check rather than
            // showing that request half-erased.
            fence(Ordering::Release);
            // Relaxed: all published by the Release stores of the segment
            // words and the head below.
            self.w(l.origin(slot)).store(origin_ns, Ordering::Relaxed);
            self.w(l.owner_pid(slot)).store(owner.0, Ordering::Relaxed);
            self.w(l.owner_start(slot))
                .store(owner.1, Ordering::Relaxed);
            for edge in 0..l.edges as usize {
                self.w(l.entry(slot, edge, 0))
                    .store(word::seg(0, 0), Ordering::Relaxed);
                for ev in 0..l.events as usize {
                    self.w(l.cell(slot, edge, 0, ev))
                        .store(word::empty(gen, 0), Ordering::Relaxed);
                }
                // Release: publishes the origin and the laid cells to writers;
                // pairs with the Acquire load of the segment word in `record`.
                self.w(l.seg(slot, edge))
                    .store(word::seg(0, 0), Ordering::Release);
            }
            // Release: publishes the whole slot; pairs with the Acquire loads
            // of the head in `snapshot`, `close` and `start_segment`. A CAS
            // from the exact word we hold, not a store: if a reclaim took
            // the slot from us (it judged us dead), we must not roll its
            // head back. Relaxed on failure: we give the slot up.
            if self.unlock(slot, gen, SlotState::Beginning, holder, SlotState::Open) {
                return Some((slot, gen));
            }
        }
        None
    }

    /// Records one value word. `value` turns the request's origin into the
    /// word to store (or a refusal); it runs only when the cell is empty.
    #[inline]
    pub(crate) fn record(
        &self,
        slot: u32,
        gen: u32,
        edge: usize,
        segment: u32,
        event: usize,
        value: impl FnOnce(u64) -> Result<u64, Outcome>,
    ) -> Outcome {
        let l = self.layout;
        // Acquire: pairs with the Release store of the segment word in
        // `begin` / `start_segment`; the cell and origin loads below then see
        // the epoch's laid cells and the request's origin.
        let sw = self.w(l.seg(slot, edge)).load(Ordering::Acquire);
        let Some(seg) = word::decode_seg(sw) else {
            return self.refuse(slot, gen, Outcome::Corrupt);
        };
        if seg.index != segment {
            let why = if segment < seg.index {
                Outcome::StaleSegment
            } else {
                Outcome::SegmentNotStarted
            };
            return self.refuse(slot, gen, why);
        }
        let cell = self.w(l.cell(slot, edge, l.ring(seg.count), event));
        let empty = word::empty(gen, seg.count);
        // Relaxed: only compared; the CAS below decides. Checking first keeps
        // duplicates (the common refusal) free of a clock read and a locked
        // instruction.
        let seen = cell.load(Ordering::Relaxed);
        if seen != empty {
            return self.refuse_cell(slot, gen, seen);
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
            Err(actual) => self.refuse_cell(slot, gen, actual),
        }
    }

    /// Classifies a refusal, giving the request's own state precedence over
    /// the reason found on the record path.
    #[cold]
    fn refuse(&self, slot: u32, gen: u32, why: Outcome) -> Outcome {
        // Acquire: pairs with the Release head stores of the control
        // operations, so a closed or reused slot is reported as such.
        let h = self.w(self.layout.head(slot)).load(Ordering::Acquire);
        let outcome = match word::decode_head(h) {
            None => Outcome::Corrupt,
            Some(d) if d.gen != gen => Outcome::Reused,
            Some(d) if matches!(d.state, SlotState::Open | SlotState::Segmenting) => why,
            Some(_) => Outcome::Closed,
        };
        self.count(outcome)
    }

    #[cold]
    fn refuse_cell(&self, slot: u32, gen: u32, seen: u64) -> Outcome {
        // Acquire fence: pairs with the Release CAS (a value) or the AcqRel
        // swap (a seal) that wrote `seen`, so the head load in `refuse` sees
        // the slot at least as new as the request that wrote it. Without it
        // a stale writer that read a newer request's value could be told
        // `Duplicate` (found by the loom model m3).
        fence(Ordering::Acquire);
        let why = match word::decode(seen) {
            Cell::Value(_) => Outcome::Duplicate,
            Cell::Sealed => Outcome::Closed,
            // An empty word names its epoch: laid by a newer request, so the
            // answer is known without the head (which, after begin's Release
            // fence and ours, would say the same).
            Cell::Empty { gen: g, .. } if g != gen => return self.count(Outcome::Reused),
            // Laid for a newer segment of this request: the entry was relaid.
            Cell::Empty { .. } => Outcome::StaleSegment,
            Cell::Corrupt => Outcome::Corrupt,
        };
        self.refuse(slot, gen, why)
    }

    /// Ends a control operation: `from(gen, holder)` to `to(gen)`, by CAS
    /// from the exact word held. False if another party took the lock over
    /// (a reclaim or close that judged the holder dead); then nothing is
    /// stored.
    fn unlock(&self, slot: u32, gen: u32, from: SlotState, holder: u32, to: SlotState) -> bool {
        // Release: ends the control operation; pairs with the next lock's
        // Acquire and with snapshots' Acquire loads of the head. Relaxed on
        // failure: nothing was written.
        self.w(self.layout.head(slot))
            .compare_exchange(
                word::head_held(gen, from, holder),
                word::head(gen, to),
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Takes the slot's control lock for `holder`, moving `Open(gen)` to `to`.
    ///
    /// While another operation holds the slot (`Segmenting`), waits a bounded
    /// time; with `holder_alive`, if it says the holder is gone, takes the
    /// lock over from it (`Lock::TookOver`). A word that names `holder`
    /// itself is never taken over.
    fn lock(
        &self,
        slot: u32,
        gen: u32,
        to: SlotState,
        holder: u32,
        holder_alive: Option<&dyn Fn(u32) -> bool>,
    ) -> Lock {
        let head = self.w(self.layout.head(slot));
        for round in 0..LOCK_ROUNDS {
            // Acquire: pairs with the Release store that ended the previous
            // control operation (or `begin`), whose stores we build on.
            let h = head.load(Ordering::Acquire);
            let Some(d) = word::decode_head(h) else {
                return Lock::Refused(Outcome::Corrupt);
            };
            if d.gen != gen {
                return Lock::Refused(Outcome::Reused);
            }
            // Acquire as above. From a dead holder the memory model gives us
            // nothing (it never released); in practice its death and the
            // system calls since make its stores visible, and close seals
            // every cell whatever it left. Relaxed on failure: we retry.
            let take = || {
                head.compare_exchange(
                    h,
                    word::head_held(gen, to, holder),
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_ok()
            };
            match d.state {
                SlotState::Open => {
                    if take() {
                        return Lock::Held;
                    }
                }
                SlotState::Segmenting => {
                    let check = cfg!(edgemark_loom) || round % 64 == 63;
                    let dead = check
                        && d.holder != holder
                        && holder_alive.is_some_and(|alive| d.holder == 0 || !alive(d.holder));
                    if dead && take() {
                        return Lock::TookOver;
                    }
                    spin_step(round);
                }
                SlotState::Free | SlotState::Closing | SlotState::Beginning => {
                    return Lock::Refused(Outcome::Closed)
                }
            }
        }
        Lock::Refused(Outcome::Busy)
    }

    /// Starts segment `index` on `edge`, fencing the current one.
    pub(crate) fn start_segment(
        &self,
        slot: u32,
        gen: u32,
        edge: usize,
        index: u32,
        holder: u32,
    ) -> Outcome {
        let l = self.layout;
        // No takeover here: a start that died half-way may have half-relaid
        // an entry, which only close's seal of the whole slot repairs. A
        // start that finds a dead holder gives up with `Busy`; close then
        // takes the slot over.
        if let Lock::Refused(why) = self.lock(slot, gen, SlotState::Segmenting, holder, None) {
            return self.count(why);
        }
        let seg_word = self.w(l.seg(slot, edge));
        // Relaxed: we hold the control lock, and only its holder writes the
        // segment word; the lock's Acquire made the last store visible.
        let cur = word::decode_seg(seg_word.load(Ordering::Relaxed));
        let outcome = match cur {
            None => Outcome::Corrupt,
            Some(cur) if index <= cur.index => Outcome::StaleSegment,
            Some(cur) if cur.count >= word::MAX_COUNT => Outcome::OutOfRange,
            Some(cur) => {
                let count = cur.count + 1;
                let entry = l.ring(count);
                if count >= l.segments {
                    // The entry held count - K, which leaves the window.
                    self.w(H_DROPPED).fetch_add(1, Ordering::Relaxed);
                }
                // Relaxed: ordered before the Release cell stores below.
                self.w(l.entry(slot, edge, entry))
                    .store(word::seg(count, index), Ordering::Relaxed);
                for ev in 0..l.events as usize {
                    // Release: a snapshot that reads a relaid cell (Acquire)
                    // then also sees the new entry word, and skips the entry.
                    // A swap rather than a store: a writer's CAS on the cell
                    // and the relay are then both read-modify-writes, ordered
                    // in the cell's modification order in a way loom checks
                    // strictly (it under-constrains a plain store racing a
                    // CAS). The value it returns is the evicted segment's.
                    self.w(l.cell(slot, edge, entry, ev))
                        .swap(word::empty(gen, count), Ordering::Release);
                }
                // Release: pairs with the Acquire load in `record`; writers
                // of the new segment find its cells laid.
                seg_word.store(word::seg(count, index), Ordering::Release);
                Outcome::Started
            }
        };
        if !self.unlock(slot, gen, SlotState::Segmenting, holder, SlotState::Open) {
            // Taken over by a close or reclaim that judged us dead: it sealed
            // the slot, so the segment we started records nothing.
            return self.count(Outcome::Closed);
        }
        self.count(outcome)
    }

    /// Closes the request: seals every kept cell, collects the final values,
    /// frees the slot. `None` if the token's request is not open.
    ///
    /// `Ok((snapshot, true))` when this call closed it; `Ok((snapshot,
    /// false))` when a reclaim took the slot over mid-way (the snapshot may
    /// lack what the reclaim sealed first, and the request is not counted
    /// twice); `Err(Busy)` when a live control operation held the slot for
    /// the whole bounded wait (the request is still open: close again).
    pub(crate) fn close(
        &self,
        slot: u32,
        gen: u32,
        holder: u32,
        holder_alive: &dyn Fn(u32) -> bool,
    ) -> Result<(RawSnapshot, bool), Outcome> {
        // Only close takes a lock over from a dead holder: it seals the whole
        // slot whatever state the holder left (see `seal_and_free`).
        match self.lock(slot, gen, SlotState::Closing, holder, Some(holder_alive)) {
            Lock::Held | Lock::TookOver => {}
            Lock::Refused(Outcome::Busy) => return Err(self.count(Outcome::Busy)),
            Lock::Refused(why) => return Err(why),
        }
        Ok(self.seal_and_free(slot, gen, holder))
    }

    /// The second half of close, for the holder of the slot's `Closing`
    /// lock: seals every kept cell, collects the values, frees the slot.
    /// The flag says whether this holder freed it (no one took over).
    fn seal_and_free(&self, slot: u32, gen: u32, holder: u32) -> (RawSnapshot, bool) {
        let l = self.layout;
        let mut snap = RawSnapshot::default();
        for edge in 0..l.edges as usize {
            // Relaxed: stable while we hold the lock; see `start_segment`.
            let Some(cur) = word::decode_seg(self.w(l.seg(slot, edge)).load(Ordering::Relaxed))
            else {
                snap.corrupt = true;
                continue;
            };
            snap.dropped += u64::from((cur.count + 1).saturating_sub(l.segments));
            for count in l.window(cur.count) {
                let entry = l.ring(count);
                // Relaxed: stable while we hold the lock.
                let ew =
                    word::decode_seg(self.w(l.entry(slot, edge, entry)).load(Ordering::Relaxed));
                let mut seg = RawSegment {
                    edge,
                    index: ew.map_or(0, |e| e.index),
                    values: Values::new(),
                    corrupt: ew.map_or(true, |e| e.count != count),
                };
                for ev in 0..l.events as usize {
                    // AcqRel: Acquire pairs with the writers' Release CAS (we
                    // collect their values); Release orders our `Closing`
                    // head word before the seal, for snapshots that read it.
                    let old = self
                        .w(l.cell(slot, edge, entry, ev))
                        .swap(word::sealed(gen, count), Ordering::AcqRel);
                    seg.values.push(match word::decode(old) {
                        Cell::Value(v) => Some(v),
                        Cell::Empty { .. } | Cell::Sealed => None,
                        Cell::Corrupt => {
                            seg.corrupt = true;
                            None
                        }
                    });
                }
                snap.corrupt |= seg.corrupt;
                snap.segments.push(seg);
            }
            // Then every entry outside the window: a holder that died may
            // have laid cells there (begin's entry 0, or a start that never
            // published its segment word). Sealing the whole slot keeps the
            // invariant simple: after a close no cell holds an empty word.
            let kept = l.window(cur.count);
            for entry in 0..l.segments as usize {
                let in_window = kept.clone().any(|c| l.ring(c) == entry);
                if in_window {
                    continue;
                }
                for ev in 0..l.events as usize {
                    // AcqRel: as for the kept cells.
                    self.w(l.cell(slot, edge, entry, ev))
                        .swap(word::sealed(gen, 0), Ordering::AcqRel);
                }
            }
        }
        // Release (in `unlock`): pairs with the Acquire CAS in `begin`: the
        // next occupant's cell stores come after our seals in every cell's
        // modification order.
        let freed = self.unlock(slot, gen, SlotState::Closing, holder, SlotState::Free);
        (snap, freed)
    }

    /// Frees `slot` if the process that holds it is dead: the owner of an
    /// open request (by pid and start time, so a reused pid does not count
    /// as alive), or the holder of a control lock that was never released.
    /// The request's values are discarded.
    ///
    /// `owner_alive(pid, start)` and `holder_alive(pid)` answer for the
    /// caller's view of the processes. Races with live operations are
    /// decided by the head compare-and-swap: a slot that changed since it
    /// was judged is left alone.
    pub(crate) fn reclaim(
        &self,
        slot: u32,
        me: u32,
        owner_alive: impl Fn(u64, u64) -> bool,
        holder_alive: impl Fn(u32) -> bool,
    ) -> Option<Reclaimed> {
        let l = self.layout;
        let head = self.w(l.head(slot));
        // Acquire: pairs with begin's Release store of `Open`, so the owner
        // words below are this request's (or a later one's: then its owner
        // is alive, or the CAS below fails).
        let h = head.load(Ordering::Acquire);
        let d = word::decode_head(h)?;
        let kind = match d.state {
            SlotState::Free => return None,
            SlotState::Open => {
                let (pid, start) = self.owner(slot);
                if owner_alive(pid, start) {
                    return None;
                }
                Reclaimed::DeadOwner
            }
            SlotState::Beginning | SlotState::Segmenting | SlotState::Closing => {
                // Holder 0 is never written by edgemark: garbage, reclaimable.
                if d.holder == me || (d.holder != 0 && holder_alive(d.holder)) {
                    return None;
                }
                Reclaimed::DeadHolder
            }
        };
        // Acquire: as for the control lock; the CAS fails if the slot moved
        // on since we judged it. Relaxed on failure: nothing to do.
        head.compare_exchange(
            h,
            word::head_held(d.gen, SlotState::Closing, me),
            Ordering::Acquire,
            Ordering::Relaxed,
        )
        .ok()?;
        // `seal_and_free` seals every entry, kept or not, so whatever a dead
        // holder left half-laid is fenced too.
        if !self.seal_and_free(slot, d.gen, me).1 {
            return None;
        }
        // Relaxed: a statistics counter.
        self.w(H_RECLAIMED).fetch_add(1, Ordering::Relaxed);
        Some(kind)
    }

    /// Reads the current state of an open request without changing it.
    /// `None` if the token's request is not open.
    pub(crate) fn snapshot(&self, slot: u32, gen: u32) -> Option<RawSnapshot> {
        let l = self.layout;
        let open = |h: u64| {
            word::decode_head(h).is_some_and(|d| {
                d.gen == gen && matches!(d.state, SlotState::Open | SlotState::Segmenting)
            })
        };
        // Acquire: pairs with the Release head store of `begin` (and of each
        // control operation), so the slot's layout is visible.
        if !open(self.w(l.head(slot)).load(Ordering::Acquire)) {
            return None;
        }
        let mut snap = RawSnapshot::default();
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
                let mut seg = RawSegment {
                    edge,
                    index: ew.index,
                    values: Values::new(),
                    corrupt: false,
                };
                for ev in 0..l.events as usize {
                    let w = self
                        .w(l.cell(slot, edge, entry, ev))
                        .load(Ordering::Acquire);
                    seg.values.push(match word::decode(w) {
                        Cell::Value(v) => Some(v),
                        Cell::Empty { .. } | Cell::Sealed => None,
                        Cell::Corrupt => {
                            seg.corrupt = true;
                            None
                        }
                    });
                }
                if entry_word.load(Ordering::Relaxed) != before {
                    continue;
                }
                snap.corrupt |= seg.corrupt;
                snap.segments.push(seg);
            }
        }
        // Acquire: a close that sealed cells we read (their swaps are
        // Release, after its `Closing` store) is visible here.
        if !open(self.w(l.head(slot)).load(Ordering::Acquire)) {
            return None;
        }
        Some(snap)
    }

    /// The generation of every open request, slot by slot.
    pub(crate) fn open_slots(&self) -> impl Iterator<Item = (u32, u32)> + 'a {
        let this = *self;
        (0..self.layout.slots).filter_map(move |slot| {
            // Acquire: pairs with `begin`'s Release store of `Open`.
            let h = this.w(this.layout.head(slot)).load(Ordering::Acquire);
            let d = word::decode_head(h)?;
            matches!(d.state, SlotState::Open | SlotState::Segmenting).then_some((slot, d.gen))
        })
    }

    /// The owner identity (pid, process start time) stored by `begin`.
    pub(crate) fn owner(&self, slot: u32) -> (u64, u64) {
        let l = self.layout;
        // Relaxed: diagnostics and reclaim heuristics only.
        (
            self.w(l.owner_pid(slot)).load(Ordering::Relaxed),
            self.w(l.owner_start(slot)).load(Ordering::Relaxed),
        )
    }
}
