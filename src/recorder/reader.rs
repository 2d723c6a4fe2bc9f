//! A reader of the ring of closed requests that acknowledges what it takes:
//! at least once, and every request it does not deliver counted.

use std::fmt;
use std::sync::Mutex;

use super::{Live, Recorder};
use crate::process;
use crate::protocol::{READER_SLOTS, Settle, TakeAs};
use crate::region::SweepError;
use crate::trace::{ClosedRequest, Drained};
use crate::word::ReaderWord;

/// A registered reader of a region's ring of closed requests
/// ([`Recorder::closed_reader`]): what it takes stays in the ring as taken
/// in its name until it settles it, by [`ClosedReader::acknowledge`] once
/// its receiver has the request, or by [`ClosedReader::give_up`] with a
/// reason, which the region counts.
///
/// If the reader's process dies, or the reader is dropped, with requests
/// taken and not settled, those requests stay in the ring; the next reader
/// that registers in that region, or a running one that calls
/// [`ClosedReader::adopt`], takes them over and hands them on again. A
/// request the ring overwrote meanwhile cannot be handed on again: the
/// closer that overwrote it counted it
/// ([`Counters::closed_overwritten_taken`](crate::report::Counters::closed_overwritten_taken)).
///
/// So a closed request reaches a reader's receiver at least once: a
/// receiver that keys what it gets by id must treat a second copy as the
/// same request ([`ClosedRequest::claim`] and the request's span id are
/// the same in both).
///
/// ```
/// # use edgemark::Recorder;
/// let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
/// let t = rec.begin().unwrap();
/// rec.close(t);
/// let reader = rec.closed_reader().unwrap();
/// let mut closed = Vec::new();
/// reader.take(16, &mut closed).unwrap();
/// assert_eq!(closed.len(), 1);
/// // ... sent; the receiver said it has it:
/// assert!(reader.acknowledge(closed[0].claim()));
/// assert_eq!(rec.counters().closed_acknowledged, 1);
/// ```
pub struct ClosedReader {
    rec: Recorder,
    /// This reader's slot in the region's reader table.
    slot: u8,
    /// The identity it holds its slot under.
    me: ReaderWord,
    /// Requests a previous holder of this slot left taken, adopted at
    /// registration and handed out by the next [`ClosedReader::adopt`].
    leftover: Mutex<Vec<ClosedRequest>>,
}

impl fmt::Debug for ClosedReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClosedReader")
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

/// The holder of a slot of a region's reader table, as a judge of
/// liveness sees it ([`Recorder::closed_reader_where`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReaderHolder {
    /// The slot.
    pub slot: u8,
    /// The holder's process ID.
    pub pid: u32,
    /// The low 32 bits of its process's start time in clock ticks since
    /// boot (0 if unknown).
    pub start_ticks_low: u32,
}

/// Why a [`ClosedReader`] gives a request up ([`ClosedReader::give_up`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GiveUp {
    /// The reader's queue was full.
    QueueFull,
    /// It retried for as long as it retries.
    RetriesExhausted,
    /// Its receiver refused the request.
    Refused,
}

/// Why [`Recorder::closed_reader`] failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReaderError {
    /// The recorder is disabled.
    Disabled,
    /// The region keeps no ring of closed requests
    /// ([`RegionBuilder::closed_entries`](crate::RegionBuilder::closed_entries)
    /// was 0).
    NoRing,
    /// Every slot of the region's reader table is held by a live reader.
    TableFull,
}

impl fmt::Display for ReaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReaderError::Disabled => f.write_str("the recorder is disabled"),
            ReaderError::NoRing => f.write_str(
                "the region keeps no ring of closed requests (it was created with 0 closed entries)",
            ),
            ReaderError::TableFull => write!(
                f,
                "all {} reader slots of the region are held by live readers",
                READER_SLOTS.end
            ),
        }
    }
}

impl std::error::Error for ReaderError {}

/// The calling process's identity as a reader: its pid and start time.
fn identity() -> ReaderWord {
    let o = process::owner_identity();
    ReaderWord::held(o.pid as u32, o.start_ticks)
}

fn holder(slot: u8, word: ReaderWord) -> ReaderHolder {
    let (pid, start_ticks_low) = word.decode();
    ReaderHolder {
        slot,
        pid,
        start_ticks_low,
    }
}

/// The default judge: a holder is dead when its pid is, or when the pid
/// now names a process that started at another time.
fn holder_dead(h: &ReaderHolder) -> bool {
    if !process::pid_alive(h.pid) {
        return true;
    }
    match process::process_start_ticks(h.pid) {
        Some(now) if h.start_ticks_low != 0 => now as u32 != h.start_ticks_low,
        _ => false,
    }
}

impl Recorder {
    /// Registers a reader of the region's ring of closed requests that
    /// acknowledges what it takes ([`ClosedReader`]), in a free slot of the
    /// region's reader table or one whose process is dead. What a previous
    /// holder of that slot left unsettled is adopted: the first
    /// [`ClosedReader::adopt`] hands it out.
    ///
    /// Readers that acknowledge and [`Recorder::drain_closed`] share the
    /// ring's cursor: each closed request goes to one of them.
    pub fn closed_reader(&self) -> Result<ClosedReader, ReaderError> {
        self.closed_reader_where(holder_dead)
    }

    /// [`Recorder::closed_reader`] with the judge of a reader slot's
    /// holder given: `dead(holder)` says whether the process holding a slot
    /// is dead. A wrong "dead" makes two readers hand on the same requests.
    pub fn closed_reader_where(
        &self,
        dead: impl Fn(&ReaderHolder) -> bool,
    ) -> Result<ClosedReader, ReaderError> {
        let Some(Live { inner, proto }) = self.live() else {
            return Err(ReaderError::Disabled);
        };
        if inner.header.layout.ring_entries == 0 {
            return Err(ReaderError::NoRing);
        }
        let me = identity();
        for slot in READER_SLOTS {
            let was = proto.reader_word(slot);
            if (was.is_free() || dead(&holder(slot, was))) && proto.hold_reader(slot, was, me) {
                let reader = ClosedReader {
                    rec: self.clone(),
                    slot,
                    me,
                    leftover: Mutex::new(Vec::new()),
                };
                let mut left = Vec::new();
                reader.adopt_slot(slot, &mut left);
                *reader.leftover.lock().unwrap_or_else(|e| e.into_inner()) = left;
                return Ok(reader);
            }
        }
        Err(ReaderError::TableFull)
    }
}

impl ClosedReader {
    /// Takes up to `max` closed requests, oldest first, appending them to
    /// `out`, as [`Recorder::drain_closed`] does; each stays taken in this
    /// reader's name until it settles it.
    pub fn take(&self, max: usize, out: &mut Vec<ClosedRequest>) -> Result<Drained, SweepError> {
        self.rec.drain_as(TakeAs::Reader(self.slot), max, out)
    }

    /// Adopts what other readers left taken and unsettled, appending it to
    /// `out`: readers whose process is dead, and readers dropped with
    /// requests unsettled (for example at a shutdown whose deadline
    /// passed), and, the first time, what a previous holder of this
    /// reader's own slot left. The adopted requests are this reader's to
    /// settle. Returns how many it appended.
    pub fn adopt(&self, out: &mut Vec<ClosedRequest>) -> usize {
        self.adopt_where(holder_dead, out)
    }

    /// [`ClosedReader::adopt`] with the judge given, as in
    /// [`Recorder::closed_reader_where`].
    pub fn adopt_where(
        &self,
        dead: impl Fn(&ReaderHolder) -> bool,
        out: &mut Vec<ClosedRequest>,
    ) -> usize {
        let before = out.len();
        out.append(&mut self.leftover.lock().unwrap_or_else(|e| e.into_inner()));
        let Some(Live { inner, proto }) = self.rec.live() else {
            return out.len() - before;
        };
        // Only slots with something to adopt are looked at (and held). The
        // ring's entries in a hole of a sparse file were never written:
        // nothing there was taken.
        let mut takers = 0;
        inner.storage.ring_runs(&inner.header.layout, |from, to| {
            takers |= proto.ring_takers(from..to);
        });
        for slot in READER_SLOTS {
            if slot == self.slot || takers & 1 << slot == 0 {
                continue;
            }
            let was = proto.reader_word(slot);
            if !was.is_free() && !dead(&holder(slot, was)) {
                continue;
            }
            if !proto.hold_reader(slot, was, self.me) {
                continue;
            }
            self.adopt_slot(slot, out);
            proto.release_reader(slot);
        }
        out.len() - before
    }

    /// Moves into this reader's name every unsettled entry taken in the
    /// name of `from`, which this reader holds.
    fn adopt_slot(&self, from: u8, out: &mut Vec<ClosedRequest>) {
        let Some(live @ Live { inner, proto }) = self.rec.live() else {
            return;
        };
        let mut buf = Vec::with_capacity(inner.header.layout.ring_words);
        let mut malformed = Vec::new();
        // Entries in a hole of a sparse file were never written, so never
        // taken: left out, as a sweep leaves out the slots there.
        inner.storage.ring_runs(&inner.header.layout, |first, end| {
            proto.ring_adopt(
                from,
                self.slot,
                first..end,
                &mut buf,
                |claim, words| match live.closed_request(claim, words) {
                    Some(c) => out.push(c),
                    None => malformed.push(claim),
                },
            );
        });
        for claim in malformed {
            proto.ring_settle(claim, self.slot, Settle::Lost);
        }
    }

    /// Settles the request with claim `claim` (taken or adopted by this
    /// reader) as delivered: its receiver has it. Counted
    /// ([`Counters::closed_acknowledged`](crate::report::Counters::closed_acknowledged)).
    /// False if the ring overwrote its entry before (it is still counted
    /// as delivered, and as settled after being overwritten).
    pub fn acknowledge(&self, claim: u64) -> bool {
        self.settle(claim, Settle::Acked)
    }

    /// Settles the request with claim `claim` as not delivered, for the
    /// reason `why`, which the region counts
    /// ([`Counters::closed_given_up`](crate::report::Counters::closed_given_up)).
    /// False as for [`ClosedReader::acknowledge`].
    pub fn give_up(&self, claim: u64, why: GiveUp) -> bool {
        self.settle(
            claim,
            match why {
                GiveUp::QueueFull => Settle::Full,
                GiveUp::RetriesExhausted => Settle::Retries,
                GiveUp::Refused => Settle::Refused,
            },
        )
    }

    fn settle(&self, claim: u64, how: Settle) -> bool {
        self.rec
            .live()
            .is_some_and(|Live { proto, .. }| proto.ring_settle(claim, self.slot, how))
    }

    /// Gives up on a claim that its closer has not finished writing, as
    /// [`Recorder::skip_closed`] does.
    pub fn skip(&self, claim: u64) -> bool {
        self.rec.skip_closed(claim)
    }

    /// Whether the request with claim `claim` is still taken in this
    /// reader's name in the ring (not settled, not overwritten): what a
    /// reader that stops leaves for the next one.
    pub fn holds(&self, claim: u64) -> bool {
        self.rec
            .live()
            .is_some_and(|Live { proto, .. }| proto.ring_holds(claim, self.slot))
    }

    /// This reader's slot in the region's reader table.
    pub fn slot(&self) -> u8 {
        self.slot
    }

    /// The recorder this reader reads.
    pub fn recorder(&self) -> &Recorder {
        &self.rec
    }
}

impl Drop for ClosedReader {
    /// Gives the reader's slot back. What it took and did not settle stays
    /// taken in the ring, for the next reader to adopt.
    fn drop(&mut self) {
        if let Some(Live { proto, .. }) = self.rec.live() {
            proto.release_reader(self.slot);
        }
    }
}
