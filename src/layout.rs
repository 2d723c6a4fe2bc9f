//! Where every word of a region lives, and the size formula.
//!
//! A region is an array of little-endian 64-bit words: a 4096-byte header,
//! then `slots` slots of `slot_stride` bytes each. All offsets below are in
//! words unless a name says bytes. `docs/design.md` draws the same map.

use crate::word::{MAX_COUNT, MAX_DOMAINS, NAME_WORDS};

/// Bytes in the header; slots begin here.
pub(crate) const HEADER_BYTES: usize = 4096;
pub(crate) const HEADER_WORDS: usize = HEADER_BYTES / 8;

/// `"EDGEMARK"` in little-endian.
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"EDGEMARK");
/// The region format this build reads and writes. 4: format 3's geometry,
/// with the ring's acknowledgment (a ring entry's state word says which
/// reader took it or that it is done with; the reader table; the ring's
/// counters in words 28..=31, 58 and 59), which a format-3 process would
/// misread (`docs/design.md`, "Format versions").
pub(crate) const FORMAT_VERSION: u64 = 4;

// Header words. Geometry and identity are written once before the version
// word is published and never change after.
pub(crate) const H_MAGIC: usize = 0;
pub(crate) const H_VERSION: usize = 1;
pub(crate) const H_HEADER_BYTES: usize = 2;
pub(crate) const H_FILE_BYTES: usize = 3;
pub(crate) const H_SLOTS: usize = 4;
pub(crate) const H_SEGMENTS: usize = 5;
pub(crate) const H_EDGES: usize = 6;
pub(crate) const H_EVENTS: usize = 7;
pub(crate) const H_DOMAINS: usize = 8;
pub(crate) const H_SLOT_STRIDE: usize = 9;
pub(crate) const H_SLOTS_OFFSET: usize = 10;
pub(crate) const H_REGION_ID: usize = 11;
pub(crate) const H_BOOT_ID: usize = 12; // two words
pub(crate) const H_TIME_NS: usize = 14;
pub(crate) const H_CREATED_UNIX_NS: usize = 15;
pub(crate) const H_CREATOR_PID: usize = 16;
pub(crate) const H_FLAGS: usize = 17;
/// The creator's pid namespace (inode of `/proc/self/ns/pid`, 0 if none).
pub(crate) const H_PID_NS: usize = 18;
/// The kind of the region's shared clock ([`crate::clock::Clock::word`]).
pub(crate) const H_CLOCK_KIND: usize = 19;
/// A counter region's calibrated rate: counter ticks per 2^32 ns
/// ([`crate::clock::RATE_BITS`]); 0 in a monotonic region.
pub(crate) const H_COUNTER_RATE: usize = 20;
/// Entries of the ring of closed requests (0: the region keeps none).
pub(crate) const H_RING_ENTRIES: usize = 21;
/// Bytes per entry of that ring.
pub(crate) const H_RING_STRIDE: usize = 22;
/// Where the ring begins, in bytes (after the slots).
pub(crate) const H_RING_OFFSET: usize = 23;
/// The ring's claim counter: closers take the next entry from it.
pub(crate) const H_RING_CLAIM: usize = 24;
/// The ring's shared read cursor: the next claim a reader takes.
pub(crate) const H_RING_READ: usize = 25;
/// Entries the readers skipped: overwritten or torn before read.
pub(crate) const H_RING_LOST: usize = 26;
/// Trace contexts refused on the record path
/// ([`crate::Recorder::begin_with_traceparent`]).
pub(crate) const H_BAD_TRACE: usize = 27;
/// Closed requests a registered reader took and acknowledged
/// (`protocol/ring.rs`, "Acknowledgment").
pub(crate) const H_RING_ACKED: usize = 28;
/// Taken closed requests a reader gave up on because its queue was full.
pub(crate) const H_RING_GAVE_UP_FULL: usize = 29;
/// Taken closed requests a reader gave up on after retrying for as long as
/// it retries.
pub(crate) const H_RING_GAVE_UP_RETRIES: usize = 30;
/// Entries a closer overwrote while a reader had taken them and not yet
/// settled them (acknowledged or given up).
pub(crate) const H_RING_OVERWRITTEN_TAKEN: usize = 31;
// Written at run time, each group on its own cache line, away from the
// read-mostly words above.
/// The begin cursor: where the next `begin` starts its search.
pub(crate) const H_CURSOR: usize = 32;
/// Segments dropped from the window of kept segments.
pub(crate) const H_DROPPED: usize = 40;
/// One counter per counted refusal, in [`crate::Outcome::COUNTED`] order.
pub(crate) const H_COUNTERS: usize = 41;
pub(crate) const MAX_COUNTERS: usize = 15;
/// Requests closed (each counted once, by the close that ended it).
pub(crate) const H_CLOSED: usize = 56;
/// Requests freed by a reclaim.
pub(crate) const H_RECLAIMED: usize = 57;
/// Of [`H_RING_OVERWRITTEN_TAKEN`], those their reader settled afterwards:
/// the difference is what readers that died took with them.
pub(crate) const H_RING_SETTLED_OVERWRITTEN: usize = 58;
/// Taken closed requests a reader gave up on because the collector (or
/// whatever it sends to) refused them.
pub(crate) const H_RING_GAVE_UP_REFUSED: usize = 59;
/// Requests closed by an expiry ([`crate::Recorder::expire_open`]): each
/// counted once, by the expiry whose close freed its slot (and counted in
/// [`H_CLOSED`] too, as every close is). Unused (0) before it was added,
/// within format 4: builds from before it neither write nor read it.
pub(crate) const H_EXPIRED: usize = 60;
/// Edge table: one word per edge ([`EdgeWord`](crate::word::EdgeWord)).
pub(crate) const H_EDGE_TABLE: usize = 64;
/// Most edges a region can declare.
pub const MAX_EDGES: usize = 64;
/// Most events a schema holds (its event table's size).
pub(crate) const MAX_EVENTS: usize = 16;
/// Event table: four name words and one word `domain | keeps_chunk << 8`.
pub(crate) const H_EVENT_TABLE: usize = 160;
pub(crate) const EVENT_WORDS: usize = NAME_WORDS + 1;
/// The clock-domain table, which processes write at run time
/// (`domains.rs`): [`MAX_DOMAINS`] entries of a state word and the name.
pub(crate) const H_DOMAIN_TABLE: usize = 256;
/// The reader table of the ring of closed requests: [`MAX_READERS`]
/// words, each free or the identity of the process whose reader holds it
/// ([`ReaderWord`](crate::word::ReaderWord)).
///
/// [`MAX_READERS`]: crate::word::MAX_READERS
pub(crate) const H_READERS: usize = 416;
/// Words per entry of the clock-domain table: the state and the name.
pub(crate) const DOMAIN_ENTRY_WORDS: usize = 1 + NAME_WORDS;

/// Most slots a region can have.
pub const MAX_SLOTS: u32 = 1 << 20;
/// Most segments a region can keep per edge of a request.
pub const MAX_SEGMENTS: u32 = 64;
/// Most entries the ring of closed requests can have.
pub const MAX_CLOSED_ENTRIES: u32 = 1 << 20;
/// What [`GeometryError::OutOfRange`] names for the ring's entry count.
const RING_ENTRIES: &str = "the closed-request ring's entry count";
/// Largest region this build creates or attaches, in bytes.
pub(crate) const MAX_REGION_BYTES: u64 = 1 << 34;

// Slot words, from the start of a slot.
const S_HEAD: usize = 0;
const S_ORIGIN: usize = 1;
const S_OWNER_PID: usize = 2;
const S_OWNER_START: usize = 3;
const S_SEG: usize = 4;
/// Slots are padded to this many words (128 bytes: two cache lines, so that
/// the adjacent-line prefetcher never couples two requests either).
const SLOT_ALIGN_WORDS: usize = 16;

/// Words per slot of the trace table, which follows the slots: one cache
/// line per slot, apart from the slot so that a sweep (which reads slots,
/// never trace words) touches no more lines than without it.
const TRACE_STRIDE_WORDS: usize = 8;
const _: () = assert!(TRACE_WORDS <= TRACE_STRIDE_WORDS);

/// Words of a request's trace context as the trace table and a ring entry
/// keep it:
/// the trace id (high, low), the parent span id (0: none), the request's
/// own span id, the trace flags, and the origin's `CLOCK_REALTIME` in
/// nanoseconds since the Unix epoch. Written by `begin` with the origin,
/// never changed while the request is open.
pub(crate) const TRACE_WORDS: usize = 6;
/// Where each word of the trace context lies, from its first.
pub(crate) mod trace_word {
    pub(crate) const TRACE_HI: usize = 0;
    pub(crate) const TRACE_LO: usize = 1;
    pub(crate) const PARENT: usize = 2;
    pub(crate) const SPAN: usize = 3;
    pub(crate) const FLAGS: usize = 4;
    pub(crate) const ORIGIN_UNIX_NS: usize = 5;
}

// Ring entry words, from the start of an entry (`protocol/ring.rs`).
/// The entry's state: `(claim + 1) << 1 | writing`, 0 before first use.
pub(crate) const R_STATE: usize = 0;
/// The checksum of the words after it, seeded with the claim.
pub(crate) const R_CHECK: usize = 1;
/// The request's trace context ([`TRACE_WORDS`] words).
pub(crate) const R_TRACE: usize = 2;
/// What the entry holds ([`entry_kind`](crate::word::entry_kind)): nothing
/// (a close that lost its slot), a closed request, or one whose read found
/// a corrupt word.
pub(crate) const R_KIND: usize = R_TRACE + TRACE_WORDS;
/// The request's token ([`TokenWord`](crate::word::TokenWord)).
pub(crate) const R_TOKEN: usize = R_KIND + 1;
/// Microseconds from the request's origin to its close, on the region's
/// clock.
pub(crate) const R_CLOSED_US: usize = R_TOKEN + 1;
/// The per-edge parts begin here: for each edge, the count of dropped
/// segments, then `segments` places of a segment word (bit 63: present,
/// low 32 bits: the index) and one value word per event.
pub(crate) const R_EDGES: usize = R_CLOSED_US + 1;
/// Ring entries are padded to this many words (a cache line).
const RING_ALIGN_WORDS: usize = 8;

/// Upper bounds of the histogram buckets, in milliseconds; a last bucket
/// takes the rest. Part of the region format.
pub const BUCKETS_MS: [f64; 15] = [
    0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
    30000.0,
];
/// Words of one histogram: a count per bucket (the last one unbounded), the
/// sum in microseconds, the count ([`HistWords`]).
const HIST_WORDS: usize = BUCKETS_MS.len() + 3;

/// Where the words of one histogram live: [`HIST_WORDS`] words from its
/// first, a count per bucket of [`BUCKETS_MS`] and one for the values above
/// the last bound, then the sum in microseconds, then the count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HistWords {
    first: usize,
}

impl HistWords {
    /// Buckets of a histogram: one per bound of [`BUCKETS_MS`], then the rest.
    pub(crate) const BUCKETS: usize = BUCKETS_MS.len() + 1;

    /// The count of bucket `i` (below [`HistWords::BUCKETS`]).
    #[inline]
    pub(crate) fn bucket(self, i: usize) -> usize {
        debug_assert!(i < Self::BUCKETS);
        self.first + i
    }
    /// The sum of the values, in microseconds.
    #[inline]
    pub(crate) fn sum_us(self) -> usize {
        self.first + Self::BUCKETS
    }
    /// The number of values.
    #[inline]
    pub(crate) fn count(self) -> usize {
        self.first + Self::BUCKETS + 1
    }
}

const _: () = assert!(HistWords::BUCKETS + 2 == HIST_WORDS);

/// The validated geometry of a region, and the arithmetic of its offsets.
///
/// Invariant: `total_words` is the length of the region's word array, and
/// every offset this type returns for in-range arguments is below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) slots: u32,
    pub(crate) segments: u32,
    pub(crate) edges: u32,
    pub(crate) events: u32,
    pub(crate) slot_words: usize,
    /// Entries of the ring of closed requests (0: none).
    pub(crate) ring_entries: u32,
    /// Words per ring entry.
    pub(crate) ring_words: usize,
    /// `ceil(2^64 / segments)`, so that [`Layout::ring`] takes a count
    /// modulo `segments` with two multiplications instead of a division.
    ring_magic: u64,
    /// Words of the statistics area between the header and the slots.
    pub(crate) stats_words: usize,
    pub(crate) total_words: usize,
}

/// What is wrong with a region's geometry or with another header field: the
/// payload of [`CreateError::Geometry`](crate::CreateError::Geometry) and
/// [`AttachError::Geometry`](crate::AttachError::Geometry).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GeometryError {
    /// A count (`what`: slots, kept segments, edges, events, declared
    /// clock domains) outside `1..=max`.
    OutOfRange {
        /// Which count.
        what: &'static str,
        /// Its value.
        value: u64,
        /// The largest it may be.
        max: u64,
    },
    /// A count in the header that does not even fit its 32-bit field.
    Oversized {
        /// Which count.
        what: &'static str,
        /// Its value.
        value: u64,
    },
    /// The region would be larger than this build creates or attaches.
    TooLarge {
        /// Its size in bytes.
        bytes: u64,
        /// The largest size allowed, in bytes.
        max: u64,
    },
    /// A header field disagrees with what the geometry gives.
    Mismatch {
        /// Which field.
        what: &'static str,
        /// Its value.
        found: u64,
        /// What the geometry gives.
        expected: u64,
    },
    /// A file length that no geometry gives.
    FileLength(u64),
    /// An event table entry with flags edgemark never writes.
    EventFlags {
        /// The event's index.
        event: usize,
        /// Its flag word.
        flags: u64,
    },
    /// An edge table entry that is a self-loop or a duplicate.
    Edge {
        /// The entry's index.
        index: usize,
        /// The stage the edge leaves.
        from: u32,
        /// The stage it enters.
        to: u32,
    },
    /// Header flags edgemark never writes.
    Flags(u64),
    /// A clock kind this build does not know.
    ClockKind(u64),
    /// A counter rate that the region's clock kind cannot have.
    CounterRate {
        /// The region's clock kind.
        clock: crate::clock::Clock,
        /// The rate word.
        rate: u64,
    },
}

impl std::fmt::Display for GeometryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GeometryError::Oversized { what, value } => write!(f, "{what} is {value}"),
            GeometryError::OutOfRange { what, value, max } => {
                // A ring of 0 entries is a region without one.
                let min = if *what == RING_ENTRIES {
                    "0 (no ring)"
                } else {
                    "1"
                };
                write!(f, "{what} is {value}; it must be between {min} and {max}")
            }
            GeometryError::TooLarge { bytes, max } => {
                write!(
                    f,
                    "the region would be {bytes} bytes; at most {max} are allowed"
                )
            }
            GeometryError::Mismatch {
                what,
                found,
                expected,
            } => write!(f, "{what} is {found} but the geometry gives {expected}"),
            GeometryError::FileLength(len) => {
                write!(f, "the file is {len} bytes, which no region geometry gives")
            }
            GeometryError::EventFlags { event, flags } => {
                write!(f, "event #{event} has unknown flags {flags:#x}")
            }
            GeometryError::Edge { index, from, to } => {
                write!(
                    f,
                    "edge #{index} ({from}->{to}) is a self-loop or a duplicate"
                )
            }
            GeometryError::Flags(flags) => write!(f, "unknown flags {flags:#x}"),
            GeometryError::ClockKind(k) => write!(f, "unknown clock kind {k}"),
            GeometryError::CounterRate { clock, rate } => {
                write!(f, "a {clock} region cannot have the counter rate {rate}")
            }
        }
    }
}

impl std::error::Error for GeometryError {}

impl Layout {
    pub(crate) fn new(
        slots: u32,
        segments: u32,
        edges: u32,
        events: u32,
        ring_entries: u32,
    ) -> Result<Layout, GeometryError> {
        let bad = |what: &'static str, v: u32, max: u64| {
            Err(GeometryError::OutOfRange {
                what,
                value: v.into(),
                max,
            })
        };
        if slots == 0 || slots > MAX_SLOTS {
            return bad("the slot count", slots, MAX_SLOTS.into());
        }
        if segments == 0 || segments > MAX_SEGMENTS {
            return bad("the segment count", segments, MAX_SEGMENTS.into());
        }
        if edges == 0 || edges as usize > MAX_EDGES {
            return bad("the edge count", edges, MAX_EDGES as u64);
        }
        if events == 0 || events as usize > MAX_EVENTS {
            return bad("the event count", events, MAX_EVENTS as u64);
        }
        if ring_entries > MAX_CLOSED_ENTRIES {
            return Err(GeometryError::OutOfRange {
                what: RING_ENTRIES,
                value: ring_entries.into(),
                max: MAX_CLOSED_ENTRIES.into(),
            });
        }
        let (e, k, n) = (edges as usize, segments as usize, events as usize);
        let raw = S_SEG + e + e * k * (1 + n);
        let slot_words = raw.div_ceil(SLOT_ALIGN_WORDS) * SLOT_ALIGN_WORDS;
        // One histogram per edge for each event and for each delta between
        // consecutive events.
        let hists = e * (2 * n - 1) * HIST_WORDS;
        let stats_words = hists.div_ceil(SLOT_ALIGN_WORDS) * SLOT_ALIGN_WORDS;
        let ring_words =
            (R_EDGES + e * (1 + k * (1 + n))).div_ceil(RING_ALIGN_WORDS) * RING_ALIGN_WORDS;
        let bytes = (HEADER_WORDS + stats_words) as u64 * 8
            + slots as u64 * (slot_words + TRACE_STRIDE_WORDS) as u64 * 8
            + u64::from(ring_entries) * ring_words as u64 * 8;
        if bytes > MAX_REGION_BYTES {
            return Err(GeometryError::TooLarge {
                bytes,
                max: MAX_REGION_BYTES,
            });
        }
        Ok(Layout {
            slots,
            segments,
            edges,
            events,
            slot_words,
            ring_entries,
            ring_words,
            ring_magic: (u64::MAX / segments as u64).wrapping_add(1),
            stats_words,
            total_words: HEADER_WORDS
                + stats_words
                + slots as usize * (slot_words + TRACE_STRIDE_WORDS)
                + ring_entries as usize * ring_words,
        })
    }

    /// Where slot 0 begins, in bytes.
    pub(crate) fn slots_offset_bytes(&self) -> u64 {
        (HEADER_WORDS + self.stats_words) as u64 * 8
    }

    /// Histograms per edge: one per event, then one per delta between
    /// consecutive events.
    pub(crate) fn hists_per_edge(&self) -> usize {
        2 * self.events as usize - 1
    }

    /// The words of histogram `metric` of `edge`.
    #[inline]
    pub(crate) fn hist(&self, edge: usize, metric: usize) -> HistWords {
        HistWords {
            first: HEADER_WORDS + (edge * self.hists_per_edge() + metric) * HIST_WORDS,
        }
    }

    /// Where the ring of closed requests begins, in words.
    fn ring_start(&self) -> usize {
        self.trace_start() + self.slots as usize * TRACE_STRIDE_WORDS
    }

    /// Where the trace table begins, in words: right after the slots.
    fn trace_start(&self) -> usize {
        HEADER_WORDS + self.stats_words + self.slots as usize * self.slot_words
    }

    /// Where the ring of closed requests begins, in bytes.
    pub(crate) fn ring_offset_bytes(&self) -> u64 {
        self.ring_start() as u64 * 8
    }

    /// Bytes per ring entry.
    pub(crate) fn ring_stride_bytes(&self) -> u64 {
        self.ring_words as u64 * 8
    }

    /// The first word of ring entry `entry` (below `ring_entries`).
    #[inline]
    pub(crate) fn ring_entry(&self, entry: u32) -> usize {
        self.ring_start() + entry as usize * self.ring_words
    }

    /// Offset within a ring entry of edge `edge`'s dropped-segment count.
    #[inline]
    pub(crate) fn ring_dropped(&self, edge: usize) -> usize {
        R_EDGES + edge * (1 + self.segments as usize * (1 + self.events as usize))
    }

    /// Offset within a ring entry of place `place` (below `segments`) of
    /// edge `edge`: its segment word, then one value word per event.
    #[inline]
    pub(crate) fn ring_place(&self, edge: usize, place: usize) -> usize {
        self.ring_dropped(edge) + 1 + place * (1 + self.events as usize)
    }

    /// The region's size in bytes: `4096 + stats + slots * slot_stride +
    /// ring_entries * ring_stride`.
    pub(crate) fn bytes(&self) -> u64 {
        self.total_words as u64 * 8
    }

    pub(crate) fn slot_stride_bytes(&self) -> u64 {
        self.slot_words as u64 * 8
    }

    #[inline]
    fn slot(&self, slot: u32) -> usize {
        HEADER_WORDS + self.stats_words + slot as usize * self.slot_words
    }
    #[inline]
    pub(crate) fn head(&self, slot: u32) -> usize {
        self.slot(slot) + S_HEAD
    }
    #[inline]
    pub(crate) fn origin(&self, slot: u32) -> usize {
        self.slot(slot) + S_ORIGIN
    }
    #[inline]
    pub(crate) fn owner_pid(&self, slot: u32) -> usize {
        self.slot(slot) + S_OWNER_PID
    }
    #[inline]
    pub(crate) fn owner_start(&self, slot: u32) -> usize {
        self.slot(slot) + S_OWNER_START
    }
    /// The first of the slot's [`TRACE_WORDS`] trace words, in the trace
    /// table.
    #[inline]
    pub(crate) fn trace(&self, slot: u32) -> usize {
        self.trace_start() + slot as usize * TRACE_STRIDE_WORDS
    }
    /// The segment word of `edge`: the current segment's count and index.
    #[inline]
    pub(crate) fn seg(&self, slot: u32, edge: usize) -> usize {
        self.slot(slot) + S_SEG + edge
    }
    /// The entry word of ring entry `entry` of `edge`: which segment it holds.
    #[inline]
    pub(crate) fn entry(&self, slot: u32, edge: usize, entry: usize) -> usize {
        let n = self.events as usize;
        self.slot(slot)
            + S_SEG
            + self.edges as usize
            + (edge * self.segments as usize + entry) * (1 + n)
    }
    /// The cell of `event` in ring entry `entry` of `edge`.
    #[inline]
    pub(crate) fn cell(&self, slot: u32, edge: usize, entry: usize, event: usize) -> usize {
        self.entry(slot, edge, entry) + 1 + event
    }

    /// The ring entry that holds segment count `count`: `count % segments`,
    /// computed without a hardware division (the record path runs this).
    ///
    /// Lemire's "fastmod" (Lemire, Kaser and Kurz, *Faster Remainder by
    /// Direct Computation*, 2019): with `M = ceil(2^64 / d)`, the low 64 bits
    /// of `M * n` are the fraction `n / d` scaled by 2^64, and multiplying
    /// that fraction by `d` gives the remainder in the high word; exact for
    /// every 32-bit `n` and `d` (for `d = 1`, `M` wraps to 0 and the result
    /// is 0, as it should be).
    #[inline]
    pub(crate) fn ring(&self, count: u32) -> usize {
        let fraction = self.ring_magic.wrapping_mul(u64::from(count));
        ((u128::from(fraction) * u128::from(self.segments)) >> 64) as usize
    }

    /// The counts of the kept segments when the current count is `count`:
    /// the newest `segments` of them.
    #[inline]
    pub(crate) fn window(&self, count: u32) -> std::ops::RangeInclusive<u32> {
        (count + 1).saturating_sub(self.segments)..=count
    }
}

const _: () = assert!(H_COUNTERS + MAX_COUNTERS <= H_CLOSED);
const _: () = assert!(H_RECLAIMED < H_EDGE_TABLE);
const _: () = assert!(H_EXPIRED < H_EDGE_TABLE);
const _: () = assert!(H_BAD_TRACE < H_CURSOR);
const _: () = assert!(H_EDGE_TABLE + MAX_EDGES <= H_EVENT_TABLE);
const _: () = assert!(H_EVENT_TABLE + MAX_EVENTS * EVENT_WORDS <= H_DOMAIN_TABLE);
const _: () = assert!(H_DOMAIN_TABLE + MAX_DOMAINS * DOMAIN_ENTRY_WORDS <= HEADER_WORDS);
const _: () = assert!(H_DOMAIN_TABLE + MAX_DOMAINS * DOMAIN_ENTRY_WORDS <= H_READERS);
const _: () = assert!(H_READERS + crate::word::MAX_READERS <= HEADER_WORDS);
const _: () = assert!(MAX_COUNT as u64 >= MAX_SEGMENTS as u64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_geometry_is_a_few_mebibytes_and_slots_are_line_aligned() {
        let l = Layout::new(4096, 4, 2, 4, 1024).unwrap();
        // 4 control words + 2 segment words + 2 edges * 4 entries * 5 words
        // = 46, padded to 48 words = 384 bytes.
        assert_eq!(l.slot_stride_bytes(), 384);
        // 11 fixed words + 2 edges * (1 + 4 places * 5 words) = 53, padded
        // to 56 words = 448 bytes.
        assert_eq!(l.ring_stride_bytes(), 448);
        // 2 edges * 7 histograms * 18 words = 252, padded to 256 words.
        assert_eq!(l.slots_offset_bytes(), 4096 + 2048);
        // Then a 64-byte line of trace words per slot.
        assert_eq!(l.trace(0) * 8, 4096 + 2048 + 4096 * 384);
        assert_eq!(l.trace(4095) + 8, l.ring_entry(0));
        assert_eq!(l.ring_offset_bytes(), 4096 + 2048 + 4096 * (384 + 64));
        assert_eq!(l.bytes(), 4096 + 2048 + 4096 * (384 + 64) + 1024 * 448);
        assert_eq!(l.ring_entry(1023) + l.ring_words, l.total_words);
        assert!(l.ring_place(1, 3) + 1 + 4 <= l.ring_words);
        assert!(l.hist(1, 6).count() < HEADER_WORDS + l.stats_words);
        assert_eq!(l.hist(1, 0).bucket(0), l.hist(0, 6).count() + 1);
        assert_eq!(l.slot_stride_bytes() % 128, 0);
        let last = l.cell(4095, 1, 3, 3);
        assert!(last < l.total_words);
    }

    #[test]
    fn the_ring_entry_is_the_count_modulo_the_kept_segments() {
        for k in 1..=MAX_SEGMENTS {
            let l = Layout::new(1, k, 1, 1, 0).unwrap();
            let edge_counts = (0..4096).chain(MAX_COUNT - 4096..=MAX_COUNT);
            for c in edge_counts.chain([u32::MAX - 1, u32::MAX]) {
                assert_eq!(l.ring(c), (c % k) as usize, "count {c}, K {k}");
            }
        }
    }

    #[test]
    fn geometry_limits_are_enforced() {
        assert!(Layout::new(0, 4, 2, 4, 0).is_err());
        assert!(Layout::new(1, 0, 2, 4, 0).is_err());
        assert!(Layout::new(1, 65, 2, 4, 0).is_err());
        assert!(Layout::new(1, 4, 0, 4, 0).is_err());
        assert!(Layout::new(1, 4, 65, 4, 0).is_err());
        assert!(Layout::new(1, 4, 2, 17, 0).is_err());
        assert!(Layout::new(MAX_SLOTS, 64, 64, 16, 0).is_err());
        assert!(Layout::new(1, 4, 2, 4, MAX_CLOSED_ENTRIES + 1).is_err());
        assert!(Layout::new(1, 4, 2, 4, MAX_CLOSED_ENTRIES).is_ok());
    }
}
