//! Acknowledgment of the ring of closed requests: a reader that registers
//! in the region's reader table takes entries as `taken(c, r)`, and each
//! stays so until the reader settles it: acknowledged (its receiver has
//! it) or given up (counted by reason). A reader that dies leaves its
//! entries taken; the next reader to register, or a running one that
//! judges it dead, adopts them and sends them again. So a request leaves
//! the region at least once, and every one that does not is counted.
//!
//! # Protocol
//!
//! **The reader table** ([`H_READERS`]) has [`MAX_READERS`] words, each 0
//! (free) or the identity of the process whose reader holds it. A reader
//! takes a free word, or one whose process its judge finds dead, by
//! compare-and-swap; it gives its word back (stores 0) when it is dropped,
//! leaving the entries it had not settled taken in its name.
//!
//! **Settling** moves `taken(c, r)` to `done(c)` by compare-and-swap. Only
//! reader `r` settles its entries (and an adopter, once `r`'s word is its
//! own). The swap fails only if a closer overwrote the entry meanwhile: that
//! closer counted it as overwritten while taken
//! ([`H_RING_OVERWRITTEN_TAKEN`]), and the reader counts it as settled
//! after all ([`H_RING_SETTLED_OVERWRITTEN`]): the difference of the two
//! counters is what readers took with them when they died.
//!
//! **Adoption.** A reader that holds word `w` (its own, just taken, or one
//! it took from a dead or departed reader to adopt from) owns every entry
//! in state `taken(c, w)`: no other reader changes those states. For each,
//! it copies the entry, fences (`Acquire`), checks the checksum
//! ([`Proto::copy_entry`], the take's own) and swaps the state from
//! `taken(c, w)` to `taken(c, mine)`, the same sequence lock as a take: a
//! closer that overwrote the entry during the copy made the swap fail (and
//! counted the claim). An adopted word is given back after.
//!
//! What the ring can no longer show is not resent: an entry overwritten
//! while its reader held it was counted by the closer that overwrote it.

use super::{At, Proto};
use crate::layout::{
    H_READERS, H_RING_ACKED, H_RING_GAVE_UP_FULL, H_RING_GAVE_UP_REFUSED, H_RING_GAVE_UP_RETRIES,
    H_RING_LOST, H_RING_SETTLED_OVERWRITTEN, R_STATE,
};
use crate::sync::Ordering;
use crate::word::{MAX_READERS, ReaderWord, RingStateWord};

/// How a reader settles an entry it took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Settle {
    /// Its receiver has it.
    Acked,
    /// Given up: the reader's queue was full.
    Full,
    /// Given up: retried for as long as the reader retries.
    Retries,
    /// Given up: the receiver refused it.
    Refused,
    /// Not what a close writes: counted lost.
    Lost,
}

impl Proto<'_> {
    /// Settles claim `claim`, taken by reader `reader`, and counts how.
    /// False if a closer overwrote its entry first (it is then counted as
    /// settled after being overwritten).
    pub(crate) fn ring_settle(&self, claim: u64, reader: u8, how: Settle) -> bool {
        let l = self.layout;
        let entries = u64::from(l.ring_entries);
        if entries == 0 {
            return false;
        }
        let counter = match how {
            Settle::Acked => H_RING_ACKED,
            Settle::Full => H_RING_GAVE_UP_FULL,
            Settle::Retries => H_RING_GAVE_UP_RETRIES,
            Settle::Refused => H_RING_GAVE_UP_REFUSED,
            Settle::Lost => H_RING_LOST,
        };
        // Relaxed: counters.
        self.w(counter).fetch_add(1, Ordering::Relaxed);
        let base = l.ring_entry((claim % entries) as u32);
        // Relaxed: the swap carries no data; it only says the entry is done
        // with, to closers (which count nothing for a done entry) and to
        // adopters.
        let settled = At::<RingStateWord>::new(self.w(base + R_STATE))
            .compare_exchange(
                RingStateWord::taken(claim, reader),
                RingStateWord::done(claim),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok();
        if !settled {
            // Relaxed: a counter.
            self.w(H_RING_SETTLED_OVERWRITTEN)
                .fetch_add(1, Ordering::Relaxed);
        }
        settled
    }

    /// Whether claim `claim`'s entry is taken by reader `reader` and not
    /// settled.
    pub(crate) fn ring_holds(&self, claim: u64, reader: u8) -> bool {
        let l = self.layout;
        let entries = u64::from(l.ring_entries);
        if entries == 0 {
            return false;
        }
        let base = l.ring_entry((claim % entries) as u32);
        // Relaxed: a report; nothing is read on the strength of it.
        At::<RingStateWord>::new(self.w(base + R_STATE)).load(Ordering::Relaxed)
            == RingStateWord::taken(claim, reader)
    }

    /// The reader slots that have entries taken and not settled among
    /// `entries` (all of the ring's that may have been written), as a bit
    /// set (bit `r` for slot `r`).
    pub(crate) fn ring_takers(&self, entries: std::ops::Range<u32>) -> u8 {
        let l = self.layout;
        let mut takers = 0u8;
        for e in entries {
            // Relaxed: a hint; `ring_adopt` loads each state again
            // (Acquire) before it copies anything.
            let s =
                At::<RingStateWord>::new(self.w(l.ring_entry(e) + R_STATE)).load(Ordering::Relaxed);
            if let Some(r) = s.taken_by() {
                takers |= 1 << r;
            }
        }
        takers
    }

    /// The word of reader slot `r`.
    pub(crate) fn reader_word(&self, r: u8) -> ReaderWord {
        // Acquire: pairs with the Release store of `release_reader` (and
        // the AcqRel of `hold_reader`), so that whatever the reader that
        // gave the word back did comes before what its next holder does.
        At::<ReaderWord>::new(self.w(H_READERS + usize::from(r))).load(Ordering::Acquire)
    }

    /// Takes reader slot `r` for `me` if its word is still `was`.
    pub(crate) fn hold_reader(&self, r: u8, was: ReaderWord, me: ReaderWord) -> bool {
        // AcqRel: Acquire as in `reader_word`; Release publishes nothing
        // yet but keeps this word's history ordered for the next holder.
        // Relaxed on failure: another reader took it.
        At::<ReaderWord>::new(self.w(H_READERS + usize::from(r)))
            .compare_exchange(was, me, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Gives reader slot `r` back.
    pub(crate) fn release_reader(&self, r: u8) {
        // Release: pairs with the Acquire load in `reader_word`.
        At::<ReaderWord>::new(self.w(H_READERS + usize::from(r)))
            .store(ReaderWord::FREE, Ordering::Release);
    }

    /// Adopts into reader slot `to` every entry of `entries` (all of the
    /// ring's that may have been written) taken by reader slot `from` and
    /// not settled: each whole one is handed to `each` (its claim and
    /// words) and is `taken(c, to)` after; a torn one is given up and
    /// counted lost. The caller holds both slots. Returns how many were
    /// adopted.
    pub(crate) fn ring_adopt(
        &self,
        from: u8,
        to: u8,
        entries: std::ops::Range<u32>,
        buf: &mut Vec<u64>,
        mut each: impl FnMut(u64, &[u64]),
    ) -> usize {
        let l = self.layout;
        let mut adopted = 0;
        for e in entries {
            let base = l.ring_entry(e);
            let state = At::<RingStateWord>::new(self.w(base + R_STATE));
            // Acquire: pairs with the closer's Release CAS that published
            // the entry (the take and any adoption continue its release
            // sequence).
            let s = state.load(Ordering::Acquire);
            let Some(claim) = s.claim() else { continue };
            if s.taken_by() != Some(from) || s.is_writing() {
                continue;
            }
            // The sequence lock's reader side, as a take's: a copy that
            // read a newer closer's store makes the swap below fail.
            let whole = self.copy_entry(base, claim, buf);
            let to_state = if whole {
                RingStateWord::taken(claim, to)
            } else {
                RingStateWord::done(claim)
            };
            // Relaxed: as the take in `ring_take`.
            if state
                .compare_exchange(s, to_state, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
            {
                // A closer overwrote it (and counted it).
                continue;
            }
            if whole {
                adopted += 1;
                each(claim, buf);
            } else {
                // Relaxed: a counter.
                self.w(H_RING_LOST).fetch_add(1, Ordering::Relaxed);
            }
        }
        adopted
    }

    /// Entries of `entries` as a reader that takes nothing sees them:
    /// `(published and not taken, taken and not settled)`.
    pub(crate) fn ring_states(&self, entries: std::ops::Range<u32>) -> (u64, u64) {
        let l = self.layout;
        let (mut published, mut taken) = (0, 0);
        for e in entries {
            // Relaxed: a count for display.
            let s =
                At::<RingStateWord>::new(self.w(l.ring_entry(e) + R_STATE)).load(Ordering::Relaxed);
            if s.is_published() {
                published += 1;
            } else if s.taken_by().is_some() && !s.is_writing() {
                taken += 1;
            }
        }
        (published, taken)
    }

    /// Readers registered in the reader table.
    pub(crate) fn ring_readers(&self) -> u64 {
        READER_SLOTS
            .filter(|&r| {
                // Relaxed: a count for display.
                !At::<ReaderWord>::new(self.w(H_READERS + usize::from(r)))
                    .load(Ordering::Relaxed)
                    .is_free()
            })
            .count() as u64
    }
}

/// Reader slots, for iteration.
pub(crate) const READER_SLOTS: std::ops::Range<u8> = 0..MAX_READERS as u8;
