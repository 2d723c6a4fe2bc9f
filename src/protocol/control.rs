//! The control operations on a slot: begin, start segment, close and
//! reclaim, each under the slot's control lock (the head word), and the
//! histogram update of the close that ends a request.

use super::{Occupant, Proto, ReadInto, SegmentRead, Values};
use crate::layout::{
    BUCKETS_MS, H_BAD_TRACE, H_CLOSED, H_CURSOR, H_DROPPED, H_EXPIRED, H_RECLAIMED, TRACE_WORDS,
};
use crate::outcome::Outcome;
use crate::report::Owner;
use crate::schema::MAX_EVENTS;
use crate::sync::{Ordering, fence, spin_step};
use crate::word::{self, CellWord, HeadWord, SegmentWord, SlotState};
use smallvec::SmallVec;

/// How many rounds a control operation waits for another one on the same
/// slot before giving up with [`Outcome::Busy`]: with `spin_step`'s
/// back-off, about a second.
const LOCK_ROUNDS: u32 = if cfg!(edgemark_loom) { 4 } else { 2_000 };

/// Why `reclaim` freed a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reclaimed {
    /// An open request whose owner process is gone.
    DeadOwner,
    /// A control lock whose holder process is gone; `live_owner` if it was
    /// a segment start on a request whose owner still runs (its values are
    /// discarded while the owner goes on).
    DeadHolder {
        /// The request's owner is alive.
        live_owner: bool,
    },
}

/// What [`Proto::close`] did, when it took the slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Closed {
    /// This call closed the request and freed the slot: the request is to
    /// be counted (once, by this call).
    Freed,
    /// A reclaim took the slot over mid-way: the final values may lack what
    /// the reclaim sealed first, and the request must not be counted twice.
    TakenOver,
}

/// Whether a control operation that finds the slot held by another may take
/// the lock over.
#[derive(Clone, Copy)]
pub(crate) enum Takeover<'a> {
    /// Never: wait the bounded time, then give up.
    Never,
    /// When the holder is gone, as this liveness judgement (of a thread id)
    /// says.
    IfDead(&'a dyn Fn(u32) -> bool),
}

/// The result of trying to take a slot's control lock.
enum Lock {
    Held,
    /// Taken from a holder that died inside its operation.
    TookOver,
    Refused(Outcome),
}

impl Proto<'_> {
    /// Counts a trace context that a begin on the record path ignored
    /// (`Recorder::begin_with_traceparent`): malformed, so its request
    /// began in a new trace.
    pub(crate) fn count_bad_trace(&self) {
        // Relaxed: a counter; nothing is ordered by it.
        self.w(H_BAD_TRACE).fetch_add(1, Ordering::Relaxed);
    }

    /// Claims a free slot for a new request and lays it out.
    ///
    /// Returns the slot and its new generation, or `None` when every slot is
    /// in use.
    /// `owner` is the process identity stored for reclaim; `holder` names
    /// the calling thread in the head while it lays the slot out.
    pub(crate) fn begin(
        &self,
        origin_ns: u64,
        trace: [u64; TRACE_WORDS],
        owner: Owner,
        holder: u32,
    ) -> Option<Occupant> {
        let l = self.layout;
        // Relaxed: the cursor only spreads requests over the slots; the head
        // CAS below decides ownership.
        let start = self.w(H_CURSOR).fetch_add(1, Ordering::Relaxed);
        for i in 0..u64::from(l.slots) {
            let slot = ((start.wrapping_add(i)) % u64::from(l.slots)) as u32;
            let head = self.head(slot);
            // Relaxed: a hint; the CAS re-validates the word.
            let h = head.load(Ordering::Relaxed);
            let Some(d) = h.decode() else {
                continue;
            };
            if d.state != SlotState::Free {
                continue;
            }
            let generation = word::next_generation(d.generation);
            // Acquire: pairs with the Release store of `Free` at the end of
            // `close`, so that close's seals happen before the stores below.
            // Relaxed on failure: we move on to the next slot.
            if head
                .compare_exchange(
                    h,
                    HeadWord::held(generation, SlotState::Beginning, holder),
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
            for (i, w) in trace.into_iter().enumerate() {
                self.w(l.trace(slot) + i).store(w, Ordering::Relaxed);
            }
            self.w(l.owner_pid(slot))
                .store(owner.pid, Ordering::Relaxed);
            self.w(l.owner_start(slot))
                .store(owner.start_ticks, Ordering::Relaxed);
            for edge in 0..l.edges as usize {
                self.entry(slot, edge, 0)
                    .store(SegmentWord::new(0, 0), Ordering::Relaxed);
                for ev in 0..l.events as usize {
                    self.cell(slot, edge, 0, ev)
                        .store(CellWord::empty(generation, 0), Ordering::Relaxed);
                }
                // Release: publishes the origin and the laid cells to writers;
                // pairs with the Acquire load of the segment word in `record`.
                self.segment(slot, edge)
                    .store(SegmentWord::new(0, 0), Ordering::Release);
            }
            // Release: publishes the whole slot; pairs with the Acquire loads
            // of the head in `snapshot`, `close` and `start_segment`. A CAS
            // from the exact word we hold, not a store: if a reclaim took
            // the slot from us (it judged us dead), we must not roll its
            // head back. Relaxed on failure: we give the slot up.
            if self.unlock(
                slot,
                generation,
                SlotState::Beginning,
                holder,
                SlotState::Open,
            ) {
                return Some(Occupant { slot, generation });
            }
        }
        None
    }

    /// Ends a control operation: `from(generation, holder)` to `to(generation)`, by CAS
    /// from the exact word held. False if another party took the lock over
    /// (a reclaim or close that judged the holder dead); then nothing is
    /// stored.
    fn unlock(
        &self,
        slot: u32,
        generation: u32,
        from: SlotState,
        holder: u32,
        to: SlotState,
    ) -> bool {
        // Release: ends the control operation; pairs with the next lock's
        // Acquire and with snapshots' Acquire loads of the head. Relaxed on
        // failure: nothing was written.
        self.head(slot)
            .compare_exchange(
                HeadWord::held(generation, from, holder),
                HeadWord::unlocked(generation, to),
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Takes the slot's control lock for `holder`, moving `Open(generation)` to `to`.
    ///
    /// While another operation holds the slot (`Segmenting`), waits a bounded
    /// time; with [`Takeover::IfDead`], if it says the holder is gone, takes
    /// the lock over from it (`Lock::TookOver`). A word that names `holder`
    /// itself is never taken over.
    fn lock(
        &self,
        slot: u32,
        generation: u32,
        to: SlotState,
        holder: u32,
        takeover: Takeover<'_>,
    ) -> Lock {
        let head = self.head(slot);
        for round in 0..LOCK_ROUNDS {
            // Acquire: pairs with the Release store that ended the previous
            // control operation (or `begin`), whose stores we build on.
            let h = head.load(Ordering::Acquire);
            let Some(d) = h.decode() else {
                return Lock::Refused(Outcome::Corrupt);
            };
            if d.generation != generation {
                return Lock::Refused(Outcome::Reused);
            }
            // Acquire as above. From a dead holder the memory model gives us
            // nothing (it never released); in practice its death and the
            // system calls since make its stores visible, and close seals
            // every cell whatever it left. Relaxed on failure: we retry.
            let take = || {
                head.compare_exchange(
                    h,
                    HeadWord::held(generation, to, holder),
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
                        && match takeover {
                            Takeover::Never => false,
                            Takeover::IfDead(alive) => d.holder == 0 || !alive(d.holder),
                        };
                    if dead && take() {
                        return Lock::TookOver;
                    }
                    spin_step(round);
                }
                SlotState::Free | SlotState::Closing | SlotState::Beginning => {
                    return Lock::Refused(Outcome::Closed);
                }
            }
        }
        Lock::Refused(Outcome::Busy)
    }

    /// Starts segment `index` on `edge`, fencing the current one.
    pub(crate) fn start_segment(
        &self,
        req: Occupant,
        edge: usize,
        index: u32,
        holder: u32,
    ) -> Outcome {
        let Occupant { slot, generation } = req;
        let l = self.layout;
        // No takeover here: a start that died half-way may have half-relaid
        // an entry, which only close's seal of the whole slot repairs. A
        // start that finds a dead holder gives up with `Busy`; close then
        // takes the slot over.
        if let Lock::Refused(why) = self.lock(
            slot,
            generation,
            SlotState::Segmenting,
            holder,
            Takeover::Never,
        ) {
            return self.count(why);
        }
        let seg_word = self.segment(slot, edge);
        // Relaxed: we hold the control lock, and only its holder writes the
        // segment word; the lock's Acquire made the last store visible.
        let cur = seg_word.load(Ordering::Relaxed).decode();
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
                self.entry(slot, edge, entry)
                    .store(SegmentWord::new(count, index), Ordering::Relaxed);
                for ev in 0..l.events as usize {
                    // Release: a snapshot that reads a relaid cell (Acquire)
                    // then also sees the new entry word, and skips the entry.
                    // A swap rather than a store: a writer's CAS on the cell
                    // and the relay are then both read-modify-writes, ordered
                    // in the cell's modification order in a way loom checks
                    // strictly (it under-constrains a plain store racing a
                    // CAS). The value it returns is the evicted segment's.
                    self.cell(slot, edge, entry, ev)
                        .swap(CellWord::empty(generation, count), Ordering::Release);
                }
                // Release: pairs with the Acquire load in `record`; writers
                // of the new segment find its cells laid.
                seg_word.store(SegmentWord::new(count, index), Ordering::Release);
                Outcome::Started
            }
        };
        if !self.unlock(
            slot,
            generation,
            SlotState::Segmenting,
            holder,
            SlotState::Open,
        ) {
            // Taken over by a close or reclaim that judged us dead: it sealed
            // the slot, so the segment we started records nothing.
            return self.count(Outcome::Closed);
        }
        self.count(outcome)
    }

    /// Closes the request: seals every kept cell, collects the final values
    /// into `into` (read as a snapshot reads them, [`ReadInto`]), frees the
    /// slot.
    ///
    /// `Ok` when this call took the slot ([`Closed`] says whether it freed
    /// it); `Err(Busy)` when a live control operation held the slot for the
    /// whole bounded wait (the request is still open: close again); another
    /// `Err` when the token's request is not open (`into` untouched).
    pub(crate) fn close(
        &self,
        req: Occupant,
        holder: u32,
        holder_alive: &dyn Fn(u32) -> bool,
        into: &mut impl ReadInto,
    ) -> Result<Closed, Outcome> {
        let Occupant { slot, generation } = req;
        // Only close takes a lock over from a dead holder: it seals the whole
        // slot whatever state the holder left (see `seal_and_free`).
        let takeover = Takeover::IfDead(holder_alive);
        match self.lock(slot, generation, SlotState::Closing, holder, takeover) {
            Lock::Held | Lock::TookOver => {}
            Lock::Refused(Outcome::Busy) => return Err(self.count(Outcome::Busy)),
            Lock::Refused(why) => return Err(why),
        }
        Ok(self.seal_and_free(slot, generation, holder, into))
    }

    /// The second half of close, for the holder of the slot's `Closing`
    /// lock: seals every kept cell, hands what each kept segment held to
    /// `into`, frees the slot. [`Closed`] says whether this holder freed it
    /// (no one took over).
    fn seal_and_free(
        &self,
        slot: u32,
        generation: u32,
        holder: u32,
        into: &mut impl ReadInto,
    ) -> Closed {
        let l = self.layout;
        let events = (l.events as usize).min(MAX_EVENTS);
        into.start();
        for edge in 0..l.edges as usize {
            // Relaxed: stable while we hold the lock; see `start_segment`.
            let Some(cur) = self.segment(slot, edge).load(Ordering::Relaxed).decode() else {
                into.corrupt();
                continue;
            };
            let dropped = (cur.count + 1).saturating_sub(l.segments);
            if dropped > 0 {
                into.dropped(u64::from(dropped));
            }
            for count in l.window(cur.count) {
                let entry = l.ring(count);
                // Relaxed: stable while we hold the lock.
                let ew = self
                    .entry(slot, edge, entry)
                    .load(Ordering::Relaxed)
                    .decode();
                let mut cells = [CellWord::NONE; MAX_EVENTS];
                for (ev, cell) in cells.iter_mut().enumerate().take(events) {
                    // AcqRel: Acquire pairs with the writers' Release CAS (we
                    // collect their values); Release orders our `Closing`
                    // head word before the seal, for snapshots that read it.
                    *cell = self
                        .cell(slot, edge, entry, ev)
                        .swap(CellWord::sealed(generation, count), Ordering::AcqRel);
                }
                // Unlike a snapshot, which skips an entry whose word names
                // another count, close hands over what it sealed, flagged.
                let mut read = SegmentRead::of_cells(cells, events);
                read.corrupt |= ew.is_none_or(|e| e.count != count);
                into.segment(edge, ew.map_or(0, |e| e.index), read);
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
                    self.cell(slot, edge, entry, ev)
                        .swap(CellWord::sealed(generation, 0), Ordering::AcqRel);
                }
            }
        }
        // Release (in `unlock`): pairs with the Acquire CAS in `begin`: the
        // next occupant's cell stores come after our seals in every cell's
        // modification order.
        if self.unlock(
            slot,
            generation,
            SlotState::Closing,
            holder,
            SlotState::Free,
        ) {
            Closed::Freed
        } else {
            Closed::TakenOver
        }
    }

    /// Frees `slot` if the process that holds it is dead: the owner of an
    /// open request (by pid and start time, so a reused pid does not count
    /// as alive), or the holder of a control lock that was never released.
    /// The request's values are discarded.
    ///
    /// `owner_alive(owner)` and `holder_alive(pid)` answer for the
    /// caller's view of the processes. Races with live operations are
    /// decided by the head compare-and-swap: a slot that changed since it
    /// was judged is left alone.
    pub(crate) fn reclaim(
        &self,
        slot: u32,
        me: u32,
        owner_alive: impl Fn(Owner) -> bool,
        holder_alive: impl Fn(u32) -> bool,
    ) -> Option<Reclaimed> {
        let head = self.head(slot);
        // Acquire: pairs with begin's Release store of `Open`, so the owner
        // words below are this request's (or a later one's: then its owner
        // is alive, or the CAS below fails).
        let h = head.load(Ordering::Acquire);
        let d = h.decode()?;
        let kind = match d.state {
            SlotState::Free => return None,
            SlotState::Open => {
                if owner_alive(self.owner(slot)) {
                    return None;
                }
                Reclaimed::DeadOwner
            }
            SlotState::Beginning | SlotState::Segmenting | SlotState::Closing => {
                // Holder 0 is never written by edgemark: garbage, reclaimable.
                if d.holder == me || (d.holder != 0 && holder_alive(d.holder)) {
                    return None;
                }
                // A segment start locks an open request, whose owner words
                // are set (the Acquire above pairs with begin's publication).
                Reclaimed::DeadHolder {
                    live_owner: d.state == SlotState::Segmenting && owner_alive(self.owner(slot)),
                }
            }
        };
        // Acquire: as for the control lock; the CAS fails if the slot moved
        // on since we judged it. Relaxed on failure: nothing to do.
        head.compare_exchange(
            h,
            HeadWord::held(d.generation, SlotState::Closing, me),
            Ordering::Acquire,
            Ordering::Relaxed,
        )
        .ok()?;
        // `seal_and_free` seals every entry, kept or not, so whatever a dead
        // holder left half-laid is fenced too.
        // The request's values are discarded.
        if self.seal_and_free(slot, d.generation, me, &mut Discard) != Closed::Freed {
            return None;
        }
        // Relaxed: a statistics counter.
        self.w(H_RECLAIMED).fetch_add(1, Ordering::Relaxed);
        Some(kind)
    }

    /// Adds a closed request's final values to the histograms and counts it:
    /// `segments` are its sound kept segments (edge, values), as its close
    /// read them. Only the close that freed the slot calls it, so each
    /// request is counted once. Nothing here runs on the record path.
    pub(crate) fn account_closed<'v>(&self, segments: impl Iterator<Item = (usize, &'v Values)>) {
        let events = self.layout.events as usize;
        for (edge, values) in segments {
            for (ev, v) in values.iter().enumerate() {
                if let Some(v) = v {
                    self.observe(edge, ev, v.elapsed_us);
                }
            }
            for ev in 0..events.saturating_sub(1) {
                if let (Some(a), Some(b)) = (values.get(ev), values.get(ev + 1))
                    && let Some(d) =
                        word::delta_us((a.elapsed_us, a.domain), (b.elapsed_us, b.domain))
                {
                    self.observe(edge, events + ev, d);
                }
            }
        }
        // Relaxed: a statistics counter.
        self.w(H_CLOSED).fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request that an expiry closed. Only the expiry whose close
    /// freed the slot ([`Closed::Freed`]) calls it, so each request is
    /// counted once, however many processes expire at once.
    pub(crate) fn count_expired(&self) {
        // Relaxed: a statistics counter; nothing is ordered by it.
        self.w(H_EXPIRED).fetch_add(1, Ordering::Relaxed);
    }

    /// Adds one value (or delta) in microseconds to histogram `metric` of
    /// `edge`.
    fn observe(&self, edge: usize, metric: usize, us: u64) {
        let h = self.layout.hist(edge, metric);
        // Relaxed: independent statistics counters; readers need no order
        // among them (a scrape may see a count one ahead of its sum).
        self.w(h.bucket(bucket(us))).fetch_add(1, Ordering::Relaxed);
        self.w(h.sum_us()).fetch_add(us, Ordering::Relaxed);
        self.w(h.count()).fetch_add(1, Ordering::Relaxed);
    }
}

/// The bucket bounds of [`BUCKETS_MS`] in microseconds.
const BUCKET_US: [u64; BUCKETS_MS.len()] = {
    let mut out = [0u64; BUCKETS_MS.len()];
    let mut i = 0;
    while i < out.len() {
        out[i] = (BUCKETS_MS[i] * 1000.0) as u64;
        i += 1;
    }
    out
};

/// The bucket of a value in microseconds.
fn bucket(us: u64) -> usize {
    BUCKET_US
        .iter()
        .position(|b| us <= *b)
        .unwrap_or(BUCKET_US.len())
}

/// The sound segments of a closed request that hold a value, as its
/// close read them ([`ReadInto`]): what [`Proto::account_closed`] adds to
/// the histograms. A segment with a corrupt cell or entry word is left
/// out.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    segments: SmallVec<[(usize, Values); 2]>,
}

impl Tally {
    /// The segments: (edge, values).
    pub(crate) fn segments(&self) -> impl Iterator<Item = (usize, &Values)> {
        self.segments.iter().map(|(edge, values)| (*edge, values))
    }
}

impl ReadInto for Tally {
    fn start(&mut self) {
        self.segments.clear();
    }
    fn corrupt(&mut self) {}
    fn dropped(&mut self, _: u64) {}
    fn segment(&mut self, edge: usize, _: u32, read: SegmentRead) {
        if !read.corrupt && read.domains != 0 {
            self.segments.push((edge, read.values));
        }
    }
}

/// A read that keeps nothing: a reclaim, and a begin that faulted, discard
/// the request's values.
#[derive(Debug)]
pub(crate) struct Discard;

impl ReadInto for Discard {
    fn start(&mut self) {}
    fn corrupt(&mut self) {}
    fn dropped(&mut self, _: u64) {}
    fn segment(&mut self, _: usize, _: u32, _: SegmentRead) {}
}
