//! The ring of closed requests: each close writes its request's final
//! values and trace context into the next entry; readers drain the entries
//! in order, each exactly once, to send them on (`edgemark export --otlp`).
//!
//! # Protocol
//!
//! **Claims.** A closer takes the next claim `c` from the claim counter
//! (`fetch_add`); claim `c` lives in entry `c % entries`. The entry's state
//! word ([`RingStateWord`]) names the claim that last took it and whether
//! its closer is still writing.
//!
//! **Writing never waits.** The closer moves the state word from any
//! older claim's state (published or still writing) to `writing(c)` by
//! compare-and-swap, writes every word of the entry, then its checksum,
//! then moves the state from `writing(c)` to `published(c)`. If the state
//! already names a claim at least as new as `c`, the closer was lapped: its
//! request is lost (a reader counts it), and it writes nothing. If a newer
//! closer took the entry while `c` was writing, `c`'s publishing CAS fails
//! and its late stores may mix into the newer closer's words: the checksum,
//! computed from what each closer meant to write, tells a reader so.
//!
//! **Reading is a sequence lock plus a checksum.** The readers share a
//! cursor, the next claim to look at. A reader loads the state (`Acquire`,
//! pairing with the publishing CAS), copies the entry, fences (`Acquire`),
//! and swaps the state (below): a changed state means the entry was taken
//! during the copy, and the swap fails. An unchanged one with a checksum
//! that does not match means a lapped closer's late stores (or a hostile
//! writer) tore it: the claim is lost and counted. The copy, the fence and
//! the checksum are one function, [`Proto::copy_entry`], which a take and
//! an adoption (`ring_ack.rs`) both use, with its ordering argument.
//!
//! **Taking is the state's compare-and-swap.** The copy is validated and
//! the entry taken by one compare-and-swap of its state, from
//! `published(c)` to `taken(c, r)` (a registered reader in slot `r` of the
//! reader table, which acknowledges it later) or to `done(c)` (a reader
//! that acknowledges nothing): a closer that took the entry during the copy
//! changed the state first, so the swap fails. Of several readers that
//! copied it, only the one whose swap succeeds hands it on. The cursor then
//! moves from `c` to `c + 1`; any reader that finds the cursor at an entry
//! already taken or overwritten moves it on, so the cursor is only where
//! the readers look next, never who owns what.
//!
//! **Counting is by whoever moves a state away.** Each claim leaves the ring
//! through exactly one change of its entry's state, and that change counts
//! it: a reader's take; a closer that replaces `published(c)` or
//! `writing(c)` (lost unread) or `taken(c, r)` (overwritten while awaiting
//! acknowledgment, [`H_RING_OVERWRITTEN_TAKEN`]); a lapped closer, which
//! finds a newer claim in its entry and counts itself lost; a reader that
//! finds a whole-looking copy with a bad checksum, or gives up on a closer
//! judged dead, and moves the state to `done(c)`.
//!
//! **Falling behind** loses the oldest: when the claims are more than a ring
//! ahead of the cursor, a reader moves the cursor to the oldest claim still
//! in the ring; the closers that overwrite the skipped entries count them.
//! A claim whose closer is still writing (or died between its claim and its
//! publication) holds the readers until it is published or a ring of newer
//! closes passes it.
//!
//! Acknowledgment, the reader table and adoption are in `ring_ack.rs`.

use super::read::{ReadInto, SegmentRead};
use super::{At, Proto};
use crate::layout::{
    H_RING_CLAIM, H_RING_LOST, H_RING_OVERWRITTEN_TAKEN, H_RING_READ, R_CHECK, R_CLOSED_US, R_KIND,
    R_STATE, R_TOKEN, R_TRACE, TRACE_WORDS,
};
use crate::schema::MAX_EVENTS;
use crate::sync::{Ordering, fence};
use crate::word::entry_kind as kind;
use crate::word::{CellWord, MAX_CLAIM, PlaceWord, RingStateWord, TokenWord};

/// The checksum's term for word `w` at offset `i` of an entry: a 64-bit
/// finaliser (splitmix64's) of the word and its place. Terms are summed, so
/// a writer can change one word's term without rereading the others.
#[inline]
fn term(i: usize, w: u64) -> u64 {
    let mut z = w ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The checksum of an entry of claim `claim` whose terms sum to `sum`.
#[inline]
fn check(claim: u64, sum: u64) -> u64 {
    sum ^ term(usize::MAX, claim)
}

/// One close's writing of its ring entry, fed by the close's read of the
/// slot ([`ReadInto`]): the entry is claimed when the read starts (the
/// closer holds the slot's `Closing` lock, so the slot's trace words are
/// stable), each kept segment is written as it is read, and
/// [`RingWrite::publish`] ends it. Inert in a region without a ring.
pub(crate) struct RingWrite<'a, F> {
    proto: Proto<'a>,
    slot: u32,
    token: u64,
    /// Microseconds from the request's origin (a reading of the region's
    /// clock) to the close.
    closed_us: F,
    taken: Option<Taken>,
    corrupt: bool,
    /// Segments the edge being read dropped, written with its first kept
    /// segment.
    dropped: u64,
    /// Whether the entry's kind word is written.
    kind_written: bool,
}

/// The entry a [`RingWrite`] holds.
struct Taken {
    claim: u64,
    /// The entry's first word.
    base: usize,
    /// The sum of the terms of every word after the checksum, as written.
    sum: u64,
    /// Per edge, the places written so far.
    places: [u8; crate::layout::MAX_EDGES],
    /// Bit `e` set once edge `e`'s dropped-segment count is written.
    dropped: u64,
}

impl<'a, F: Fn(u64) -> u64> RingWrite<'a, F> {
    /// A writing of the entry of the request in `slot` with generation
    /// `generation`; `closed_us(origin)` gives the time from its origin to
    /// now.
    pub(crate) fn new(
        proto: Proto<'a>,
        slot: u32,
        generation: u32,
        closed_us: F,
    ) -> RingWrite<'a, F> {
        RingWrite {
            proto,
            slot,
            token: TokenWord::new(slot, generation).bits(),
            closed_us,
            taken: None,
            corrupt: false,
            dropped: 0,
            kind_written: false,
        }
    }

    /// Stores `w` at offset `i` of the taken entry. Each word of the
    /// entry after its checksum is stored exactly once per claim.
    #[inline]
    fn put(&mut self, i: usize, w: u64) {
        let Some(t) = &mut self.taken else { return };
        // Relaxed: published by the Release CAS in `finish`; the Release
        // fence after the claim orders these after the `writing` state.
        self.proto.w(t.base + i).store(w, Ordering::Relaxed);
        t.sum = t.sum.wrapping_add(term(i, w));
    }

    /// Takes the next claim's entry, or none if a newer claim has it
    /// already (lapped: the request is lost, and a reader counts it).
    fn claim(&mut self) {
        let l = self.proto.layout;
        if l.ring_entries == 0 {
            return;
        }
        // Relaxed: the counter only numbers the claims; the state CAS below
        // decides who writes an entry.
        let claim = self.proto.w(H_RING_CLAIM).fetch_add(1, Ordering::Relaxed);
        if claim > MAX_CLAIM {
            return;
        }
        let base = l.ring_entry((claim % u64::from(l.ring_entries)) as u32);
        let state = At::<RingStateWord>::new(self.proto.w(base + R_STATE));
        // Relaxed: the CAS re-validates it.
        let mut s = state.load(Ordering::Relaxed);
        loop {
            match s.claim() {
                // A reader judged this closer dead and gave the claim up
                // (it counted it): write nothing.
                Some(c) if c == claim => return,
                // Lapped: a newer claim has the entry. Nobody else can
                // count this request: count it here.
                Some(c) if c > claim => {
                    self.proto.count_ring_lost(1);
                    return;
                }
                _ => {}
            }
            // Acquire: pairs with the Release CAS that published the
            // entry's previous claim (or took it), so that its stores come
            // before ours in each word's modification order. Relaxed on
            // failure: the new state is judged again.
            match state.compare_exchange(
                s,
                RingStateWord::writing(claim),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => s = now,
            }
        }
        // The claim this swap replaced leaves the ring here.
        self.proto.count_replaced(s);
        // Release fence: pairs with the Acquire fence of a reader's copy
        // (`Proto::copy_entry`). A reader whose copy loads any store below
        // then has our `writing` state before its state swap, which fails,
        // so it never takes a mixture for a published entry (the sequence
        // lock's writer side).
        fence(Ordering::Release);
        self.taken = Some(Taken {
            claim,
            base,
            sum: 0,
            places: [0; crate::layout::MAX_EDGES],
            dropped: 0,
        });
    }

    /// Ends the writing: the entry holds the request (`closed`: the close
    /// freed its slot) or nothing, and is published.
    pub(crate) fn publish(mut self, closed: bool) {
        let kind = match (closed, self.corrupt) {
            (false, _) => kind::VOID,
            (true, false) => kind::CLOSED,
            (true, true) => kind::CORRUPT,
        };
        self.put(R_KIND, kind);
        self.kind_written = true;
        self.finish();
    }
}

impl<F> RingWrite<'_, F> {
    /// Stores 0 in every word of the entry not written yet (the drop counts
    /// and places of edges with fewer kept segments than places; the kind
    /// of an entry cut short), then publishes it.
    fn finish(&mut self) {
        let l = self.proto.layout;
        let Some(mut t) = self.taken.take() else {
            return;
        };
        let mut zero = |i: usize| {
            // Relaxed: as in `put`.
            self.proto.w(t.base + i).store(0, Ordering::Relaxed);
            t.sum = t.sum.wrapping_add(term(i, 0));
        };
        if !self.kind_written {
            zero(R_KIND);
        }
        for edge in 0..l.edges as usize {
            if t.dropped & 1 << edge == 0 {
                zero(l.ring_dropped(edge));
            }
            for place in usize::from(t.places[edge])..l.segments as usize {
                let at = l.ring_place(edge, place);
                for i in at..at + 1 + l.events as usize {
                    zero(i);
                }
            }
        }
        let last =
            l.ring_place(l.edges as usize - 1, l.segments as usize - 1) + 1 + l.events as usize;
        for i in last..l.ring_words {
            zero(i);
        }
        // Relaxed: published by the CAS below.
        self.proto
            .w(t.base + R_CHECK)
            .store(check(t.claim, t.sum), Ordering::Relaxed);
        // Release: publishes the entry; pairs with the readers' Acquire
        // load of the state. Fails only if a newer claim took the entry
        // meanwhile, or a reader gave this claim up: whichever moved the
        // state counted this request lost. Relaxed on failure: nothing
        // more to do.
        let _ = At::<RingStateWord>::new(self.proto.w(t.base + R_STATE)).compare_exchange(
            RingStateWord::writing(t.claim),
            RingStateWord::published(t.claim),
            Ordering::Release,
            Ordering::Relaxed,
        );
    }
}

impl<F> Drop for RingWrite<'_, F> {
    /// An entry taken and never published (the close was cut short) is
    /// published empty (its kind word still 0), so that no reader waits
    /// for it.
    fn drop(&mut self) {
        self.finish();
    }
}

impl<F: Fn(u64) -> u64> ReadInto for RingWrite<'_, F> {
    fn start(&mut self) {
        if self.taken.is_none() {
            self.claim();
        }
        if self.taken.is_none() {
            return;
        }
        let l = self.proto.layout;
        let first = l.trace(self.slot);
        for i in 0..TRACE_WORDS {
            // Relaxed: written by the request's begin and published by its
            // head; stable while the caller holds the slot's lock.
            let w = self.proto.w(first + i).load(Ordering::Relaxed);
            self.put(R_TRACE + i, w);
        }
        // Relaxed: as the trace words.
        let origin = self.proto.w(l.origin(self.slot)).load(Ordering::Relaxed);
        let closed = (self.closed_us)(origin);
        self.put(R_CLOSED_US, closed);
        self.put(R_TOKEN, self.token);
    }

    fn corrupt(&mut self) {
        self.corrupt = true;
    }

    fn dropped(&mut self, n: u64) {
        // A close reports an edge's drops just before its kept segments
        // (of which an edge that dropped any has at least one).
        self.dropped = n;
    }

    fn segment(&mut self, edge: usize, index: u32, read: SegmentRead) {
        let l = self.proto.layout;
        self.corrupt |= read.corrupt;
        let Some(t) = &mut self.taken else { return };
        let place = usize::from(t.places[edge]);
        if place >= l.segments as usize {
            self.corrupt = true;
            return;
        }
        t.places[edge] += 1;
        let dropped = std::mem::take(&mut self.dropped);
        if t.dropped & 1 << edge == 0 {
            t.dropped |= 1 << edge;
            self.put(l.ring_dropped(edge), dropped);
        }
        let at = l.ring_place(edge, place);
        self.put(at, PlaceWord::segment(index).bits());
        for (ev, v) in read
            .values
            .words()
            .iter()
            .enumerate()
            .take(l.events as usize)
        {
            self.put(at + 1 + ev, v.bits());
        }
    }
}

/// What a reader found at the cursor.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Take {
    /// No claim past the cursor.
    Empty,
    /// The claim at the cursor is still being written (or its closer died
    /// before publishing it).
    Pending(u64),
    /// Claims lost (torn, and counted by this call); read on.
    Lost(u64),
    /// Nothing for this reader here (another reader took it, a closer
    /// overwrote it, the cursor moved); read on.
    Raced,
    /// An entry with nothing to hand on (taken, and done); read on.
    Void,
    /// The claim taken: `buf` holds its entry's words.
    Entry(u64),
}

/// What a take leaves in the state of the entry it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TakeAs {
    /// `done(c)`: the reader acknowledges nothing (at most once).
    Done,
    /// `taken(c, r)`: the reader in slot `r` of the reader table
    /// acknowledges it later (at least once).
    Reader(u8),
}

impl Proto<'_> {
    /// One step of a reader: takes the claim at the shared cursor into
    /// `buf` (the entry's words, as many as an entry has) if it is
    /// published and whole, leaving its state as `mark` says, else says why
    /// not. Only the reader whose state swap succeeds gets
    /// [`Take::Entry`]; only the one whose swap gives up a torn entry
    /// counts it.
    pub(crate) fn ring_take(&self, buf: &mut Vec<u64>, mark: TakeAs) -> Take {
        let l = self.layout;
        let entries = u64::from(l.ring_entries);
        if entries == 0 {
            return Take::Empty;
        }
        let cursor = self.w(H_RING_READ);
        // Acquire: pairs with the AcqRel move of the reader that moved the
        // cursor last (the state swaps decide who takes what; this only
        // keeps each reader's view of the cursor moving forward).
        let at = cursor.load(Ordering::Acquire);
        // Relaxed: the claim counter only numbers the claims; every entry
        // is judged by its own state word below.
        let claims = self.w(H_RING_CLAIM).load(Ordering::Relaxed);
        if at >= claims {
            return Take::Empty;
        }
        if claims - at > entries {
            // The skipped entries are counted by the closers that
            // overwrite them.
            self.advance(at, claims - entries);
            return Take::Raced;
        }
        let base = l.ring_entry((at % entries) as u32);
        let state = At::<RingStateWord>::new(self.w(base + R_STATE));
        // Acquire: pairs with the Release CAS that published the entry.
        let s = state.load(Ordering::Acquire);
        match s.claim() {
            Some(c) if c == at && s.is_published() => {}
            // Overwritten (its closer counted it), or taken or given up
            // already: move on.
            Some(c) if c > at || (c == at && !s.is_writing()) => {
                self.advance(at, at + 1);
                return Take::Raced;
            }
            _ => return Take::Pending(at),
        }
        if !self.copy_entry(base, at, buf) {
            // Torn with its state unchanged (a lapped closer's late stores,
            // or a hostile writer): given up, and counted by the reader
            // whose swap gives it up. Relaxed: the swap carries no data.
            let gave_up = state
                .compare_exchange(
                    s,
                    RingStateWord::done(at),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok();
            self.advance(at, at + 1);
            if gave_up {
                self.count_ring_lost(1);
                return Take::Lost(1);
            }
            return Take::Raced;
        }
        let to = match mark {
            TakeAs::Done => RingStateWord::done(at),
            TakeAs::Reader(r) => RingStateWord::taken(at, r),
        };
        // The take. Relaxed: the Acquire fence above orders the copy
        // before it, and it publishes nothing (the words are the closer's,
        // published by its Release CAS, whose release sequence this swap
        // continues). Relaxed on failure: another reader took it or a
        // closer took the entry; read on.
        if state
            .compare_exchange(s, to, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return Take::Raced;
        }
        self.advance(at, at + 1);
        if buf[R_KIND] == kind::VOID {
            if let TakeAs::Reader(r) = mark {
                // Nothing to acknowledge: done now. Relaxed: as the take.
                let _ = state.compare_exchange(
                    RingStateWord::taken(at, r),
                    RingStateWord::done(at),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
            Take::Void
        } else {
            Take::Entry(at)
        }
    }

    /// The reader side of an entry's sequence lock, for a take and for an
    /// adoption alike: copies the entry at `base` into `buf` (every word of
    /// it) and says whether the copy is whole for claim `claim`, its
    /// checksum matching the words.
    ///
    /// The caller has loaded the entry's state `s` (Acquire, pairing with
    /// the Release CAS that published the entry, so the copy reads at least
    /// the publishing closer's words) and, after this, hands the copy on
    /// only if its compare-and-swap from `s` succeeds. The copy can still
    /// mix in the stores of a closer that took the entry after `s`; then
    /// that closer's `writing` state comes before the caller's swap (the
    /// fence below), the swap fails and the copy is dropped. A copy whose
    /// swap succeeds and whose checksum fails was torn with the state
    /// unchanged (a lapped closer's late stores, or a hostile writer).
    pub(super) fn copy_entry(&self, base: usize, claim: u64, buf: &mut Vec<u64>) -> bool {
        let words = self.layout.ring_words;
        buf.clear();
        for i in 0..words {
            // Relaxed: validated by the fence below and the caller's state
            // swap.
            buf.push(self.w(base + i).load(Ordering::Relaxed));
        }
        // Acquire fence: pairs with the Release fence a closer issues after
        // its `writing` CAS (`RingWrite::claim`). If a load above read a
        // store of a closer that took the entry after `s`, that closer's
        // `writing` state comes before the caller's swap in the state's
        // modification order, so the swap fails.
        fence(Ordering::Acquire);
        let sum = (R_CHECK + 1..words).fold(0u64, |sum, i| sum.wrapping_add(term(i, buf[i])));
        buf[R_CHECK] == check(claim, sum)
    }

    /// Gives up on claim `claim`, which a take found pending (its closer
    /// claimed it and has not published it), if the readers are still at
    /// it: counted as lost, and the cursor moves on. False if it was
    /// published, taken or overwritten meanwhile.
    pub(crate) fn ring_skip(&self, claim: u64) -> bool {
        let l = self.layout;
        let entries = u64::from(l.ring_entries);
        // Acquire: as in `ring_take`.
        if entries == 0 || self.w(H_RING_READ).load(Ordering::Acquire) != claim {
            return false;
        }
        let base = l.ring_entry((claim % entries) as u32);
        let state = At::<RingStateWord>::new(self.w(base + R_STATE));
        // Relaxed: the swap below re-validates it and carries no data.
        let s = state.load(Ordering::Relaxed);
        if s.claim()
            .is_some_and(|c| c > claim || (c == claim && !s.is_writing()))
        {
            self.advance(claim, claim + 1);
            return false;
        }
        // Relaxed: no data; the closer, if it lives, finds `done(claim)`
        // and writes nothing, or fails to publish.
        if state
            .compare_exchange(
                s,
                RingStateWord::done(claim),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return false;
        }
        // The state replaced: the claim's own `writing` state (counted as
        // lost here), or an older claim's, whose fate is counted as a
        // closer would count it, and then this claim, given up.
        self.count_replaced(s);
        if s.claim() != Some(claim) {
            self.count_ring_lost(1);
        }
        self.advance(claim, claim + 1);
        true
    }

    /// Counts the fate of the claim whose state `s` a swap replaced: lost
    /// unread if it was published or still being written, overwritten
    /// while taken if a reader had taken it and not settled it, nothing if
    /// it was done with (or the entry never used).
    pub(super) fn count_replaced(&self, s: RingStateWord) {
        if s.claim().is_none() || s.is_done() {
            return;
        }
        if s.taken_by().is_some() {
            // Relaxed: a counter.
            self.w(H_RING_OVERWRITTEN_TAKEN)
                .fetch_add(1, Ordering::Relaxed);
        } else {
            self.count_ring_lost(1);
        }
    }

    /// Counts `n` closed requests lost to the readers.
    pub(crate) fn count_ring_lost(&self, n: u64) {
        // Relaxed: a counter.
        self.w(H_RING_LOST).fetch_add(n, Ordering::Relaxed);
    }

    /// Moves the cursor from `at` to `to`; false if another reader moved
    /// it first.
    pub(super) fn advance(&self, at: u64, to: u64) -> bool {
        // AcqRel: pairs with the other readers' Acquire loads of the
        // cursor and their moves, so the cursor each reader sees only
        // grows. Relaxed on failure: another reader moved it, and we read
        // on from there.
        self.w(H_RING_READ)
            .compare_exchange(at, to, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }
}

/// Replays a taken entry's words into `into` as a close's read put them:
/// the one read pipeline that snapshots, sweeps and closes use, so an
/// entry's values are judged as theirs are (a word edgemark never writes is
/// left out and flags the read corrupt). Returns `false` for an entry
/// whose kind edgemark never writes.
pub(crate) fn replay(
    layout: &crate::layout::Layout,
    buf: &[u64],
    into: &mut impl ReadInto,
) -> bool {
    let corrupt = match buf[R_KIND] {
        kind::CLOSED => false,
        kind::CORRUPT => true,
        _ => return false,
    };
    into.start();
    if corrupt {
        into.corrupt();
    }
    let events = (layout.events as usize).min(MAX_EVENTS);
    for edge in 0..layout.edges as usize {
        let dropped = buf[layout.ring_dropped(edge)];
        if dropped > 0 {
            into.dropped(dropped);
        }
        for place in 0..layout.segments as usize {
            let at = layout.ring_place(edge, place);
            match PlaceWord::from_bits(buf[at]).decode() {
                Ok(None) => {}
                Ok(Some(index)) => {
                    let mut cells = [CellWord::NONE; MAX_EVENTS];
                    for (ev, cell) in cells.iter_mut().enumerate().take(events) {
                        *cell = CellWord::from_bits(buf[at + 1 + ev]);
                    }
                    into.segment(edge, index, SegmentRead::of_cells(cells, events));
                }
                Err(()) => into.corrupt(),
            }
        }
    }
    true
}

/// The token words of a taken entry: `(slot, generation)`.
pub(crate) fn token_of(buf: &[u64]) -> (u32, u32) {
    TokenWord::from_bits(buf[R_TOKEN]).decode()
}

/// The trace words of a taken entry.
pub(crate) fn trace_of(buf: &[u64]) -> [u64; TRACE_WORDS] {
    let mut w = [0; TRACE_WORDS];
    w.copy_from_slice(&buf[R_TRACE..R_TRACE + TRACE_WORDS]);
    w
}

/// Microseconds from origin to close of a taken entry.
pub(crate) fn closed_us_of(buf: &[u64]) -> u64 {
    buf[R_CLOSED_US]
}
