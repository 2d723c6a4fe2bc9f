//! The encoding of every packed word the protocol reads and writes.
//!
//! All state lives in 64-bit words so that every transition is a single
//! atomic operation. This module only packs and unpacks them; it knows
//! nothing of orderings or of where the words live. Each packed word has its
//! own `#[repr(transparent)]` type ([`CellWord`], [`HeadWord`],
//! [`SegmentWord`]), in the manner of crossbeam's `Epoch`: its `const`
//! methods are the only code that knows the bits, and raw `u64`s exist only
//! at the atomics ([`from_bits`](CellWord::from_bits) after a load,
//! [`bits`](CellWord::bits) before a store).
//!
//! # Cell words
//!
//! The two high bits give the kind:
//!
//! | kind | bits 61..0 |
//! |---|---|
//! | `00` empty | bits 55..24 generation, bits 23..0 segment count; 61..56 zero |
//! | `01` value | bits 61..57 clock domain, 56..37 chunk sequence + 1 (0 = none), 36..0 elapsed microseconds |
//! | `10` sealed | as empty: the generation and count it was sealed in |
//! | `11` | never written by edgemark: a corrupt cell |
//!
//! An empty word names the exact epoch (request generation and segment count)
//! it was laid for. A record compares-and-swaps from that exact word, so a
//! writer holding anything older cannot land.
//!
//! # Head words
//!
//! Bits 63..32 the slot's generation, bits 31..8 the lock holder's thread id
//! (only in a locked state), bits 7..0 the [`SlotState`].
//!
//! # Segment and entry words
//!
//! The segment word of an edge (the current segment) and the entry word of
//! a ring entry (the segment it holds) share one packing: the segment count
//! in bits 55..32, the segment index in bits 31..0, bits 63..56 zero.
//!
//! # Header and ring words
//!
//! An edge word ([`EdgeWord`]), a token word ([`TokenWord`]) and a word of
//! the ring's reader table ([`ReaderWord`]) pack two 32-bit halves; an
//! event's meta word ([`EventMetaWord`]) its clock domain and a flag; a
//! clock-domain entry's state word ([`DomainWord`]) a state and a hash; a
//! ring entry's kind ([`entry_kind`]) two flags; a ring entry's state word
//! ([`RingStateWord`]) its claim, whether its closer is writing, and
//! whether a reader took it (and which) or is done with it.
//!
//! # Name words
//!
//! A name (of an event or a clock domain) is 32 bytes of NUL-padded UTF-8 in
//! four little-endian words ([`pack_name`], [`unpack_name`]).

/// Number of bits of elapsed time in a value word.
const ELAPSED_BITS: u32 = 37;
/// Largest elapsed time a value word holds, in microseconds (about 38.2 hours).
pub(crate) const MAX_ELAPSED_US: u64 = (1 << ELAPSED_BITS) - 1;
const CHUNK_BITS: u32 = 20;
/// Largest chunk sequence number a value word holds.
pub(crate) const MAX_CHUNK_SEQ: u64 = (1 << CHUNK_BITS) - 2;
const DOMAIN_BITS: u32 = 5;
const DOMAIN_SHIFT: u32 = ELAPSED_BITS + CHUNK_BITS;
/// Number of clock domains a region can hold (declared and registered).
pub(crate) const MAX_DOMAINS: usize = 1 << DOMAIN_BITS;
const COUNT_BITS: u32 = 24;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
/// Largest segment count a request can reach on one edge.
pub(crate) const MAX_COUNT: u32 = COUNT_MASK as u32;

const KIND_SHIFT: u32 = 62;
const KIND_EMPTY: u64 = 0;
const KIND_VALUE: u64 = 1;
const KIND_SEALED: u64 = 2;
const KIND_CORRUPT: u64 = 3;
/// The bits of an empty or sealed word below its kind: generation and count.
const EPOCH_BITS: u32 = 32 + COUNT_BITS;
const EPOCH_MASK: u64 = (1 << EPOCH_BITS) - 1;
/// The bits between the kind and the epoch, zero in an empty or sealed word.
const STRAY_MASK: u64 = ((1 << KIND_SHIFT) - 1) & !EPOCH_MASK;

// The fields of a value word fill the bits below its kind exactly.
const _: () = assert!(DOMAIN_SHIFT + DOMAIN_BITS == KIND_SHIFT);
// A domain bit mask (`CellWord::domain_bit`) is a u32.
const _: () = assert!(MAX_DOMAINS <= 32);

/// A packed word type: what a region word holds, seen through its encoding.
/// The only conversions between a packed word and its bits, for the
/// atomics that hold them.
pub(crate) trait Packed: Copy {
    /// The word as read from an atomic.
    fn from_bits(bits: u64) -> Self;
    /// The word to store in an atomic.
    fn bits(self) -> u64;
}

macro_rules! packed {
    ($($t:ident),*) => {$(
        impl Packed for $t {
            #[inline(always)]
            fn from_bits(bits: u64) -> $t {
                $t::from_bits(bits)
            }
            #[inline(always)]
            fn bits(self) -> u64 {
                $t::bits(self)
            }
        }
    )*};
}
packed!(CellWord, HeadWord, SegmentWord, RingStateWord, ReaderWord);

/// A cell word: one event's value for one epoch, or the empty or sealed
/// marker of that epoch (see the module docs for the bits).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct CellWord(u64);

impl core::fmt::Debug for CellWord {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "CellWord({:#018x}: {:?})", self.0, self.decode())
    }
}

/// A decoded cell word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cell {
    /// Laid for the epoch (generation, segment count); writable in it.
    Empty { generation: u32, count: u32 },
    /// A recorded value.
    Value(Recorded),
    /// Fenced by close: nothing can be written any more.
    Sealed,
    /// Bits edgemark never writes.
    Corrupt,
}

/// The delta between two values, in microseconds: defined only when both
/// are in one clock domain (hence from one origin) and `to` is not before
/// `from`. The one statement of the rule that snapshots
/// (`Observed::until`) and the histograms of closed requests share: values
/// of two domains (or two hosts) are never subtracted.
#[inline]
pub(crate) const fn delta_us(from: (u64, u8), to: (u64, u8)) -> Option<u64> {
    if from.1 != to.1 || to.0 < from.0 {
        None
    } else {
        Some(to.0 - from.0)
    }
}

/// The fields of a value word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Recorded {
    /// The clock domain's id (below [`MAX_DOMAINS`]).
    pub(crate) domain: u8,
    /// The chunk sequence of the winning write, if the event keeps one.
    pub(crate) chunk_seq: Option<u64>,
    /// Elapsed microseconds from the request's origin.
    pub(crate) elapsed_us: u64,
}

impl CellWord {
    /// The word a snapshot keeps for "not recorded" (an empty word of
    /// generation 0, which no request has).
    pub(crate) const NONE: CellWord = CellWord(0);

    /// The word as read from an atomic.
    #[inline(always)]
    pub(crate) const fn from_bits(bits: u64) -> CellWord {
        CellWord(bits)
    }

    /// The word to store in an atomic.
    #[inline(always)]
    pub(crate) const fn bits(self) -> u64 {
        self.0
    }

    /// The empty word of epoch (`generation`, `count`).
    #[inline]
    pub(crate) const fn empty(generation: u32, count: u32) -> CellWord {
        CellWord((KIND_EMPTY << KIND_SHIFT) | Self::epoch(generation, count))
    }

    /// The sealed word of epoch (`generation`, `count`).
    #[inline]
    pub(crate) const fn sealed(generation: u32, count: u32) -> CellWord {
        CellWord((KIND_SEALED << KIND_SHIFT) | Self::epoch(generation, count))
    }

    #[inline]
    const fn epoch(generation: u32, count: u32) -> u64 {
        ((generation as u64) << COUNT_BITS) | (count as u64 & COUNT_MASK)
    }

    /// A value word. The caller has checked the ranges (`domain <
    /// MAX_DOMAINS`, `chunk_seq <= MAX_CHUNK_SEQ`, `elapsed_us <=
    /// MAX_ELAPSED_US`).
    #[inline]
    pub(crate) const fn value(domain: u8, chunk_seq: Option<u64>, elapsed_us: u64) -> CellWord {
        let chunk = match chunk_seq {
            Some(c) => c + 1,
            None => 0,
        };
        CellWord(
            (KIND_VALUE << KIND_SHIFT)
                | ((domain as u64) << DOMAIN_SHIFT)
                | (chunk << ELAPSED_BITS)
                | elapsed_us,
        )
    }

    /// Whether this is a value word.
    #[inline]
    pub(crate) const fn is_value(self) -> bool {
        self.0 >> KIND_SHIFT == KIND_VALUE
    }

    /// The clock domain of a value word; `None` for any other kind. What
    /// [`CellWord::decode`] would say of the domain, without the rest.
    #[inline]
    pub(crate) const fn domain(self) -> Option<u8> {
        if self.is_value() {
            Some(((self.0 >> DOMAIN_SHIFT) & (MAX_DOMAINS as u64 - 1)) as u8)
        } else {
            None
        }
    }

    /// Bit `d` for a value word of clock domain `d`; 0 for any other word.
    #[inline]
    pub(crate) const fn domain_bit(self) -> u32 {
        match self.domain() {
            Some(d) => 1 << d,
            None => 0,
        }
    }

    /// The word as a snapshot keeps it, and whether it is corrupt:
    /// [`CellWord::decode`]'s verdict without its fields, free of branches.
    /// A value word is kept; an empty or sealed word is [`CellWord::NONE`],
    /// "not recorded"; bits edgemark never writes (kind `11`, or an empty
    /// or sealed word with bits above its epoch) are `NONE` and corrupt.
    #[inline]
    pub(crate) const fn kept(self) -> (CellWord, bool) {
        let kind = self.0 >> KIND_SHIFT;
        let value = kind == KIND_VALUE;
        let stray = self.0 & STRAY_MASK != 0;
        let corrupt = kind == KIND_CORRUPT || (!value && stray);
        (CellWord(if value { self.0 } else { 0 }), corrupt)
    }

    /// The fields of a value word; `None` for any other kind.
    #[inline]
    pub(crate) const fn recorded(self) -> Option<Recorded> {
        match self.decode() {
            Cell::Value(v) => Some(v),
            _ => None,
        }
    }

    /// The word, decoded.
    #[inline]
    pub(crate) const fn decode(self) -> Cell {
        let word = self.0;
        let rest = word & !(3 << KIND_SHIFT);
        match word >> KIND_SHIFT {
            KIND_EMPTY | KIND_SEALED if rest & !EPOCH_MASK != 0 => Cell::Corrupt,
            KIND_EMPTY => Cell::Empty {
                generation: (rest >> COUNT_BITS) as u32,
                count: (rest & COUNT_MASK) as u32,
            },
            KIND_SEALED => Cell::Sealed,
            KIND_VALUE => {
                let chunk = (rest >> ELAPSED_BITS) & ((1 << CHUNK_BITS) - 1);
                Cell::Value(Recorded {
                    domain: (rest >> DOMAIN_SHIFT) as u8,
                    chunk_seq: if chunk == 0 { None } else { Some(chunk - 1) },
                    elapsed_us: rest & MAX_ELAPSED_US,
                })
            }
            _ => Cell::Corrupt,
        }
    }
}

/// States of a slot's head word (its low byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum SlotState {
    /// Not in use; `begin` may claim it.
    Free = 0,
    /// Claimed by `begin`, which is laying out the slot.
    Beginning = 1,
    /// A running request; records land.
    Open = 2,
    /// A running request whose owner is starting a segment (holds the
    /// slot's control lock); records still land.
    Segmenting = 3,
    /// `close` holds the control lock and is sealing the cells.
    Closing = 4,
}

/// A slot's head word: its generation, its state and, while a control
/// operation holds the slot, the holder's thread id (see the module docs).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeadWord(u64);

impl core::fmt::Debug for HeadWord {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "HeadWord({:#018x}: {:?})", self.0, self.decode())
    }
}

/// A decoded head word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) generation: u32,
    pub(crate) state: SlotState,
    /// The thread id holding the control lock (`Beginning`, `Segmenting`,
    /// `Closing`), so that a reclaim can tell a dead holder; 0 otherwise.
    /// Linux thread ids are below 2^22, so 24 bits hold any of them.
    pub(crate) holder: u32,
}

/// Largest thread id a head word can name as a lock holder.
const MAX_HOLDER: u32 = (1 << 24) - 1;
const HOLDER_SHIFT: u32 = 8;
const STATE_MASK: u64 = 0xff;
const GENERATION_SHIFT: u32 = 32;

impl HeadWord {
    /// The word as read from an atomic.
    #[inline(always)]
    pub(crate) const fn from_bits(bits: u64) -> HeadWord {
        HeadWord(bits)
    }

    /// The word to store in an atomic.
    #[inline(always)]
    pub(crate) const fn bits(self) -> u64 {
        self.0
    }

    /// A head word in an unlocked state (`Free` or `Open`).
    #[inline]
    pub(crate) const fn unlocked(generation: u32, state: SlotState) -> HeadWord {
        HeadWord(((generation as u64) << GENERATION_SHIFT) | state as u64)
    }

    /// A head word in a locked state, naming its holder.
    #[inline]
    pub(crate) const fn held(generation: u32, state: SlotState, holder: u32) -> HeadWord {
        HeadWord(
            ((generation as u64) << GENERATION_SHIFT)
                | ((holder as u64 & MAX_HOLDER as u64) << HOLDER_SHIFT)
                | state as u64,
        )
    }

    /// The generation, whatever the rest of the word holds.
    #[inline]
    pub(crate) const fn generation(self) -> u32 {
        (self.0 >> GENERATION_SHIFT) as u32
    }

    /// Whether the word is of an open request, one that snapshots read:
    /// `Open` (which has no holder, so the low half is the state alone) or
    /// `Segmenting` (held). What [`HeadWord::decode`] says of it, in two
    /// comparisons.
    #[inline]
    pub(crate) const fn is_open(self) -> bool {
        self.0 as u32 == HeadWord::unlocked(0, SlotState::Open).0 as u32
            || self.0 & STATE_MASK == SlotState::Segmenting as u64
    }

    /// Whether the word shows request generation `generation` open.
    #[inline]
    pub(crate) const fn shows_open(self, generation: u32) -> bool {
        self.generation() == generation && self.is_open()
    }

    /// The word, decoded; `None` for bits edgemark never writes.
    #[inline]
    pub(crate) const fn decode(self) -> Option<Head> {
        let state = match self.0 & STATE_MASK {
            0 => SlotState::Free,
            1 => SlotState::Beginning,
            2 => SlotState::Open,
            3 => SlotState::Segmenting,
            4 => SlotState::Closing,
            _ => return None,
        };
        let holder = ((self.0 >> HOLDER_SHIFT) as u32) & MAX_HOLDER;
        let locked = matches!(
            state,
            SlotState::Beginning | SlotState::Segmenting | SlotState::Closing
        );
        if holder != 0 && !locked {
            return None;
        }
        Some(Head {
            generation: self.generation(),
            state,
            holder,
        })
    }
}

/// The next generation after `generation`; 0 is never used, so that a
/// zeroed slot matches no token.
#[inline]
pub(crate) const fn next_generation(generation: u32) -> u32 {
    match generation.wrapping_add(1) {
        0 => 1,
        g => g,
    }
}

/// A segment word (per slot and edge: the current segment) or an entry word
/// (per slot, edge and ring entry: the segment it holds); one packing.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentWord(u64);

impl core::fmt::Debug for SegmentWord {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "SegmentWord({:#018x}: {:?})", self.0, self.decode())
    }
}

/// A decoded segment or entry word: which segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentPos {
    /// How many segments were started on this edge of this request before
    /// this one (0 for the initial segment).
    pub(crate) count: u32,
    /// The caller's segment index.
    pub(crate) index: u32,
}

const SEGMENT_COUNT_SHIFT: u32 = 32;

impl SegmentWord {
    /// The word as read from an atomic.
    #[inline(always)]
    pub(crate) const fn from_bits(bits: u64) -> SegmentWord {
        SegmentWord(bits)
    }

    /// The word to store in an atomic.
    #[inline(always)]
    pub(crate) const fn bits(self) -> u64 {
        self.0
    }

    /// The word of the segment with count `count` and index `index`.
    #[inline]
    pub(crate) const fn new(count: u32, index: u32) -> SegmentWord {
        SegmentWord(((count as u64 & COUNT_MASK) << SEGMENT_COUNT_SHIFT) | index as u64)
    }

    /// The word, decoded; `None` for bits edgemark never writes.
    #[inline]
    pub(crate) const fn decode(self) -> Option<SegmentPos> {
        if self.0 >> (SEGMENT_COUNT_SHIFT + COUNT_BITS) != 0 {
            return None;
        }
        Some(SegmentPos {
            count: ((self.0 >> SEGMENT_COUNT_SHIFT) & COUNT_MASK) as u32,
            index: self.0 as u32,
        })
    }
}

/// Words of a name: 32 bytes of NUL-padded UTF-8.
pub(crate) const NAME_WORDS: usize = 4;
/// Most bytes a name has.
pub(crate) const NAME_BYTES: usize = NAME_WORDS * 8;

/// Packs a name (at most [`NAME_BYTES`] bytes) into its words.
pub(crate) fn pack_name(name: &str) -> [u64; NAME_WORDS] {
    let mut bytes = [0u8; NAME_BYTES];
    bytes[..name.len()].copy_from_slice(name.as_bytes());
    let mut out = [0u64; NAME_WORDS];
    for (i, w) in out.iter_mut().enumerate() {
        *w = u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    }
    out
}

/// Unpacks a name; `None` unless it is 1..=32 bytes of UTF-8 followed only
/// by NUL padding.
pub(crate) fn unpack_name(words: [u64; NAME_WORDS]) -> Option<String> {
    let mut bytes = [0u8; NAME_BYTES];
    for (i, w) in words.iter().enumerate() {
        bytes[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    let len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    if len == 0 || bytes[len..].iter().any(|&b| b != 0) {
        return None;
    }
    String::from_utf8(bytes[..len].to_vec()).ok()
}

/// The state word of an entry of the ring of closed requests
/// (`protocol/ring.rs`): the claim that last took the entry, whether its
/// closer is still writing, and what the readers did with it.
///
/// Bit 0: writing. Bits 1..=56: the claim plus one (0 for an entry never
/// taken). Bit 60: taken by a reader and not yet settled, bits 57..=59 the
/// reader's slot in the reader table. Bit 61: done (acknowledged, given up
/// or taken by a reader that acknowledges nothing).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RingStateWord(u64);

/// Claims a ring state word can name (56 bits).
pub(crate) const MAX_CLAIM: u64 = (1 << 56) - 2;
const CLAIM_MASK: u64 = (1 << 56) - 1;
const READER_SHIFT: u32 = 57;
const TAKEN: u64 = 1 << 60;
const DONE: u64 = 1 << 61;

/// Readers a region's reader table holds ([`RingStateWord::taken`]'s
/// three bits).
pub(crate) const MAX_READERS: usize = 8;

impl RingStateWord {
    /// The word as read from an atomic.
    #[inline(always)]
    pub(crate) const fn from_bits(bits: u64) -> RingStateWord {
        RingStateWord(bits)
    }

    /// The word to store in an atomic.
    #[inline(always)]
    pub(crate) const fn bits(self) -> u64 {
        self.0
    }

    /// Claim `claim` (at most [`MAX_CLAIM`]) writing the entry.
    pub(crate) const fn writing(claim: u64) -> RingStateWord {
        RingStateWord((claim + 1) << 1 | 1)
    }

    /// Claim `claim`'s entry, published and not taken.
    pub(crate) const fn published(claim: u64) -> RingStateWord {
        RingStateWord((claim + 1) << 1)
    }

    /// Claim `claim`'s entry, taken by the reader in slot `reader` (below
    /// [`MAX_READERS`]) and awaiting its acknowledgment.
    pub(crate) const fn taken(claim: u64, reader: u8) -> RingStateWord {
        RingStateWord((claim + 1) << 1 | TAKEN | ((reader as u64 & 7) << READER_SHIFT))
    }

    /// Claim `claim`'s entry, done with: acknowledged, given up, or taken
    /// by a reader that acknowledges nothing.
    pub(crate) const fn done(claim: u64) -> RingStateWord {
        RingStateWord((claim + 1) << 1 | DONE)
    }

    /// The claim that last took the entry; `None` for an unused entry.
    pub(crate) const fn claim(self) -> Option<u64> {
        match (self.0 >> 1) & CLAIM_MASK {
            0 => None,
            c => Some(c - 1),
        }
    }

    /// Whether the entry's closer is still writing it.
    pub(crate) const fn is_writing(self) -> bool {
        self.0 & 1 != 0
    }

    /// The reader slot that took the entry and has not settled it.
    pub(crate) const fn taken_by(self) -> Option<u8> {
        if self.0 & TAKEN != 0 && self.0 & DONE == 0 {
            Some((self.0 >> READER_SHIFT & 7) as u8)
        } else {
            None
        }
    }

    /// Whether the entry is done with (see [`RingStateWord::done`]).
    pub(crate) const fn is_done(self) -> bool {
        self.0 & DONE != 0
    }

    /// Whether the entry is published and waits for a reader: neither
    /// being written, nor taken, nor done.
    pub(crate) const fn is_published(self) -> bool {
        self.claim().is_some() && self.0 & (1 | TAKEN | DONE) == 0
    }
}

/// A place word of a ring entry: whether the place holds a kept segment
/// (bit 63) and the segment's index (the low 32 bits).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PlaceWord(u64);

const PLACE_PRESENT: u64 = 1 << 63;

impl PlaceWord {
    /// The word as read.
    #[inline(always)]
    pub(crate) const fn from_bits(bits: u64) -> PlaceWord {
        PlaceWord(bits)
    }

    /// The word to store.
    #[inline(always)]
    pub(crate) const fn bits(self) -> u64 {
        self.0
    }

    /// A place holding the segment with index `index`.
    pub(crate) const fn segment(index: u32) -> PlaceWord {
        PlaceWord(PLACE_PRESENT | index as u64)
    }

    /// The index of the segment the place holds: `Ok(None)` for an empty
    /// place, `Err(())` for bits edgemark never writes.
    #[allow(clippy::result_unit_err)]
    pub(crate) const fn decode(self) -> Result<Option<u32>, ()> {
        if self.0 == 0 {
            Ok(None)
        } else if self.0 & !(PLACE_PRESENT | u32::MAX as u64) != 0 || self.0 & PLACE_PRESENT == 0 {
            Err(())
        } else {
            Ok(Some(self.0 as u32))
        }
    }
}

/// What a ring entry holds, its kind word (`R_KIND`): two flags, bit 0 set
/// when the entry holds a closed request, bit 1 set when the close's read
/// of it found a word edgemark never writes. A corrupt read is always of a
/// request, so 2 (corrupt, no request) is never written: a reader refuses
/// it as it refuses any other word outside these three.
pub(crate) mod entry_kind {
    /// Bit 0: the entry holds a closed request.
    const REQUEST: u64 = 1;
    /// Bit 1: the close's read found a word edgemark never writes.
    const CORRUPT_READ: u64 = 2;
    /// Nothing: its close found the slot taken over and hands on nothing.
    pub(crate) const VOID: u64 = 0;
    /// A closed request.
    pub(crate) const CLOSED: u64 = REQUEST;
    /// A closed request whose read found a word edgemark never writes.
    pub(crate) const CORRUPT: u64 = REQUEST | CORRUPT_READ;
}

/// A token word (a ring entry's `R_TOKEN`): the request's slot in bits
/// 31..0, its generation in bits 63..32.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TokenWord(u64);

impl TokenWord {
    /// The word as read.
    #[inline(always)]
    pub(crate) const fn from_bits(bits: u64) -> TokenWord {
        TokenWord(bits)
    }

    /// The word to store.
    #[inline(always)]
    pub(crate) const fn bits(self) -> u64 {
        self.0
    }

    /// The token of the request with generation `generation` in `slot`.
    pub(crate) const fn new(slot: u32, generation: u32) -> TokenWord {
        TokenWord(slot as u64 | (generation as u64) << 32)
    }

    /// `(slot, generation)`. Every word decodes: the caller checks the slot
    /// against the region's geometry and the generation against 0.
    pub(crate) const fn decode(self) -> (u32, u32) {
        (self.0 as u32, (self.0 >> 32) as u32)
    }
}

/// A word of the reader table of the ring of closed requests
/// (`protocol/ring_ack.rs`): 0 for a free slot, else the identity of the
/// process whose reader holds the slot, its pid in bits 63..32 and the low
/// 32 bits of its start time (clock ticks since boot) in bits 31..0.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReaderWord(u64);

impl ReaderWord {
    /// A free slot.
    pub(crate) const FREE: ReaderWord = ReaderWord(0);

    /// The word as read.
    #[inline(always)]
    pub(crate) const fn from_bits(bits: u64) -> ReaderWord {
        ReaderWord(bits)
    }

    /// The word to store.
    #[inline(always)]
    pub(crate) const fn bits(self) -> u64 {
        self.0
    }

    /// The slot held by process `pid`, started at `start_ticks` (only its
    /// low 32 bits are kept). Never [`ReaderWord::FREE`] for a real
    /// process: a pid is never 0.
    pub(crate) const fn held(pid: u32, start_ticks: u64) -> ReaderWord {
        ReaderWord((pid as u64) << 32 | (start_ticks & 0xffff_ffff))
    }

    /// Whether no reader holds the slot.
    pub(crate) const fn is_free(self) -> bool {
        self.0 == 0
    }

    /// `(pid, low 32 bits of the start ticks)` of the holder. Every word
    /// decodes: the judge of a holder looks the pid up.
    pub(crate) const fn decode(self) -> (u32, u32) {
        ((self.0 >> 32) as u32, self.0 as u32)
    }
}

/// An edge word (the header's edge table): the stage it leaves in bits
/// 31..0, the stage it enters in bits 63..32. Also the key of the record
/// path's edge index (`mark.rs`).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EdgeWord(u64);

impl EdgeWord {
    /// The word as read.
    #[inline(always)]
    pub(crate) const fn from_bits(bits: u64) -> EdgeWord {
        EdgeWord(bits)
    }

    /// The word to store.
    #[inline(always)]
    pub(crate) const fn bits(self) -> u64 {
        self.0
    }

    /// The edge from stage `from` to stage `to`.
    #[inline(always)]
    pub(crate) const fn new(from: u32, to: u32) -> EdgeWord {
        EdgeWord(from as u64 | (to as u64) << 32)
    }

    /// `(from, to)`. Every word decodes: the header codec checks the edge
    /// (no self edge, no duplicate).
    pub(crate) const fn decode(self) -> (u32, u32) {
        (self.0 as u32, (self.0 >> 32) as u32)
    }
}

/// The word after an event's name in the header's event table: the id of
/// its clock domain in bits 7..0, bit 8 set when the event keeps the chunk
/// sequence of its winning write, bits 63..9 zero.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EventMetaWord(u64);

const KEEPS_CHUNK_SEQ: u64 = 1 << 8;

impl EventMetaWord {
    /// The word as read.
    #[inline(always)]
    pub(crate) const fn from_bits(bits: u64) -> EventMetaWord {
        EventMetaWord(bits)
    }

    /// The word to store.
    #[inline(always)]
    pub(crate) const fn bits(self) -> u64 {
        self.0
    }

    /// An event in domain `domain` that keeps the chunk sequence or not.
    pub(crate) const fn new(domain: u8, keeps_chunk_seq: bool) -> EventMetaWord {
        EventMetaWord(domain as u64 | if keeps_chunk_seq { KEEPS_CHUNK_SEQ } else { 0 })
    }

    /// `(domain, keeps_chunk_seq)`; `None` for bits edgemark never writes.
    pub(crate) const fn decode(self) -> Option<(u8, bool)> {
        if self.0 >> 9 != 0 {
            None
        } else {
            Some((self.0 as u8, self.0 & KEEPS_CHUNK_SEQ != 0))
        }
    }
}

/// The state of an entry of the header's clock-domain table (`domains.rs`)
/// as its state word names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DomainState {
    /// Never claimed (with a zero hash: an entry never written).
    Empty,
    /// Claimed by a registrant that is filling in the name.
    Claimed,
    /// Published: the name words are final.
    Ready,
    /// Bits edgemark never writes.
    Garbled,
}

/// The state word of an entry of the clock-domain table: the entry's state
/// in bits 63..62 (`00` empty, `01` claimed, `10` ready, `11` never
/// written), a 62-bit hash of its name in bits 61..0.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DomainWord(u64);

const DOMAIN_STATE_SHIFT: u32 = 62;

impl DomainWord {
    /// The bits of a name's hash.
    pub(crate) const HASH_MASK: u64 = (1 << DOMAIN_STATE_SHIFT) - 1;

    /// The word as read.
    #[inline(always)]
    pub(crate) const fn from_bits(bits: u64) -> DomainWord {
        DomainWord(bits)
    }

    /// The word to store.
    #[inline(always)]
    pub(crate) const fn bits(self) -> u64 {
        self.0
    }

    /// A claimed entry for the name whose hash is `hash` (its low 62 bits).
    pub(crate) const fn claimed(hash: u64) -> DomainWord {
        DomainWord(1 << DOMAIN_STATE_SHIFT | hash & Self::HASH_MASK)
    }

    /// A ready entry for the name whose hash is `hash` (its low 62 bits).
    pub(crate) const fn ready(hash: u64) -> DomainWord {
        DomainWord(2 << DOMAIN_STATE_SHIFT | hash & Self::HASH_MASK)
    }

    /// The entry's state.
    pub(crate) const fn state(self) -> DomainState {
        match self.0 >> DOMAIN_STATE_SHIFT {
            0 => DomainState::Empty,
            1 => DomainState::Claimed,
            2 => DomainState::Ready,
            _ => DomainState::Garbled,
        }
    }

    /// The hash of the entry's name.
    pub(crate) const fn hash(self) -> u64 {
        self.0 & Self::HASH_MASK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Words with every kind, every pattern of the bits above an epoch,
    /// and low bits from a simple generator.
    fn words() -> impl Iterator<Item = u64> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        (0..4096u64).map(move |i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let low = if i % 3 == 0 { i } else { x };
            (i % 4) << 62 | (i / 4 % 64) << 56 | low & ((1 << 56) - 1)
        })
    }

    #[test]
    fn value_words_round_trip_at_their_limits() {
        for (d, c, e) in [
            (0u8, None, 0u64),
            (7, Some(0), MAX_ELAPSED_US),
            (3, Some(MAX_CHUNK_SEQ), 12_000),
            (MAX_DOMAINS as u8 - 1, Some(5), 1),
        ] {
            assert_eq!(
                CellWord::value(d, c, e).decode(),
                Cell::Value(Recorded {
                    domain: d,
                    chunk_seq: c,
                    elapsed_us: e
                })
            );
        }
    }

    #[test]
    fn the_domain_of_a_value_word_is_the_decoded_one() {
        for d in 0..MAX_DOMAINS as u8 {
            let w = CellWord::value(d, Some(MAX_CHUNK_SEQ), MAX_ELAPSED_US);
            assert_eq!(w.domain(), Some(d));
            assert_eq!(w.domain_bit(), 1 << d);
        }
        assert_eq!(CellWord::empty(3, 1).domain(), None);
        assert_eq!(CellWord::sealed(3, 1).domain(), None);
        assert_eq!(CellWord::from_bits(u64::MAX).domain(), None);
        assert_eq!(CellWord::from_bits(u64::MAX).domain_bit(), 0);
    }

    #[test]
    fn empty_words_name_their_epoch_and_differ_from_every_value() {
        assert_eq!(
            CellWord::empty(u32::MAX, MAX_COUNT).decode(),
            Cell::Empty {
                generation: u32::MAX,
                count: MAX_COUNT
            }
        );
        assert_ne!(CellWord::empty(1, 0), CellWord::value(0, None, 0));
        assert_ne!(CellWord::empty(1, 0), CellWord::empty(2, 0));
        assert_ne!(CellWord::empty(1, 0), CellWord::empty(1, 1));
        assert_eq!(CellWord::sealed(5, 1).decode(), Cell::Sealed);
        assert_eq!(CellWord::from_bits(u64::MAX).decode(), Cell::Corrupt);
        assert_eq!(CellWord::from_bits(1 << 60).decode(), Cell::Corrupt);
        assert_eq!(CellWord::NONE.recorded(), None);
    }

    #[test]
    fn a_kept_cell_is_what_decode_says() {
        let special = [
            0,
            u64::MAX,
            CellWord::sealed(7, 3).bits(),
            CellWord::empty(7, 3).bits(),
        ];
        for w in words().chain(special).map(CellWord::from_bits) {
            let expected = match w.decode() {
                Cell::Value(_) => (w, false),
                Cell::Empty { .. } | Cell::Sealed => (CellWord::NONE, false),
                Cell::Corrupt => (CellWord::NONE, true),
            };
            assert_eq!(w.kept(), expected, "{w:?}");
            assert_eq!(w.is_value(), matches!(w.decode(), Cell::Value(_)));
        }
    }

    #[test]
    fn a_head_is_open_as_decode_says() {
        let heads = words().flat_map(|w| {
            // Heads of every state byte, with and without a holder.
            [
                w,
                w & !0xffff_ff00,
                w & 0xffff_ffff_0000_00ff,
                w & !0xff | 2,
                w & !0xff | 3,
            ]
        });
        for h in heads.map(HeadWord::from_bits) {
            let open = h
                .decode()
                .is_some_and(|d| matches!(d.state, SlotState::Open | SlotState::Segmenting));
            assert_eq!(h.is_open(), open, "{h:?}");
            let g = h.generation();
            assert_eq!(h.shows_open(g), open, "{h:?}");
            assert!(!h.shows_open(g ^ 1), "{h:?}");
        }
    }

    #[test]
    fn head_and_segment_words_round_trip_and_reject_garbage() {
        let h = HeadWord::held(9, SlotState::Closing, 4_194_304)
            .decode()
            .unwrap();
        assert_eq!(
            (h.generation, h.state, h.holder),
            (9, SlotState::Closing, 4_194_304)
        );
        let open = HeadWord::unlocked(3, SlotState::Open).decode().unwrap();
        assert_eq!(open.holder, 0);
        assert_eq!(HeadWord::from_bits(7).decode(), None);
        assert_eq!(
            HeadWord::from_bits(1 << 12 | 2).decode(),
            None,
            "an open slot names no holder"
        );
        assert_eq!(next_generation(u32::MAX), 1);
        let s = SegmentWord::new(3, 77).decode().unwrap();
        assert_eq!((s.count, s.index), (3, 77));
        assert_eq!(SegmentWord::from_bits(1 << 60).decode(), None);
    }

    #[test]
    fn names_round_trip_and_garbage_is_refused() {
        assert_eq!(unpack_name(pack_name("sender")).as_deref(), Some("sender"));
        let long = "x".repeat(NAME_BYTES);
        assert_eq!(unpack_name(pack_name(&long)), Some(long));
        assert_eq!(unpack_name([0; 4]), None);
        assert_eq!(unpack_name([0x00ff, 0, 0, 0]), None);
        assert_eq!(unpack_name([0x41 | (0x41 << 16), 0, 0, 0]), None);
    }

    #[test]
    fn token_and_edge_words_round_trip_their_halves() {
        for (a, b) in [
            (0, 0),
            (1, 2),
            (u32::MAX, 7),
            (3, u32::MAX),
            (u32::MAX, u32::MAX),
        ] {
            assert_eq!(
                TokenWord::from_bits(TokenWord::new(a, b).bits()).decode(),
                (a, b)
            );
            assert_eq!(
                EdgeWord::from_bits(EdgeWord::new(a, b).bits()).decode(),
                (a, b)
            );
        }
        // The slot is the low half, as the ring's entries have always held it.
        assert_eq!(TokenWord::new(5, 9).bits(), 5 | 9 << 32);
        assert_eq!(EdgeWord::new(1, 2).bits(), 1 | 2 << 32);
    }

    #[test]
    fn event_meta_words_round_trip_and_refuse_stray_bits() {
        for (d, keeps) in [(0, false), (0, true), (31, true), (u8::MAX, false)] {
            let w = EventMetaWord::new(d, keeps);
            assert_eq!(
                EventMetaWord::from_bits(w.bits()).decode(),
                Some((d, keeps))
            );
        }
        assert_eq!(EventMetaWord::new(3, true).bits(), 3 | 1 << 8);
        for stray in [1 << 9, 1 << 63, u64::MAX] {
            assert_eq!(EventMetaWord::from_bits(stray).decode(), None);
        }
    }

    #[test]
    fn domain_words_keep_their_state_and_hash() {
        let h = 0x1234_5678_9abc_def0 & DomainWord::HASH_MASK;
        assert_eq!(DomainWord::from_bits(0).state(), DomainState::Empty);
        assert_eq!(DomainWord::claimed(h).state(), DomainState::Claimed);
        assert_eq!(DomainWord::ready(h).state(), DomainState::Ready);
        assert_eq!(DomainWord::ready(h).hash(), h);
        assert_eq!(DomainWord::claimed(u64::MAX).hash(), DomainWord::HASH_MASK);
        assert_eq!(
            DomainWord::from_bits(u64::MAX).state(),
            DomainState::Garbled
        );
    }

    #[test]
    fn ring_state_words_keep_their_claim_and_readers() {
        for claim in [0, 1, 4095, MAX_CLAIM] {
            let writing = RingStateWord::writing(claim);
            assert_eq!(writing.claim(), Some(claim));
            assert!(writing.is_writing() && !writing.is_published() && !writing.is_done());
            let published = RingStateWord::published(claim);
            assert_eq!(published.claim(), Some(claim));
            assert!(published.is_published() && published.taken_by().is_none());
            for r in 0..MAX_READERS as u8 {
                let taken = RingStateWord::taken(claim, r);
                assert_eq!(taken.claim(), Some(claim));
                assert_eq!(taken.taken_by(), Some(r));
                assert!(!taken.is_published() && !taken.is_done() && !taken.is_writing());
                assert_eq!(RingStateWord::from_bits(taken.bits()), taken);
            }
            let done = RingStateWord::done(claim);
            assert_eq!(done.claim(), Some(claim));
            assert!(done.is_done() && !done.is_published() && done.taken_by().is_none());
        }
        // A word with no claim is an entry never used, whatever its flags.
        assert_eq!(RingStateWord::from_bits(0).claim(), None);
        assert!(!RingStateWord::from_bits(0).is_published());
        // Two readers' takes of one claim differ, as do two claims'.
        assert_ne!(RingStateWord::taken(3, 0), RingStateWord::taken(3, 1));
        assert_ne!(RingStateWord::taken(3, 0), RingStateWord::taken(4, 0));
    }

    #[test]
    fn reader_words_round_trip_their_halves() {
        assert!(ReaderWord::FREE.is_free());
        for (pid, start) in [(1, 0), (4_194_304, u64::MAX), (u32::MAX, 0x1_2345_6789)] {
            let w = ReaderWord::held(pid, start);
            assert!(!w.is_free());
            assert_eq!(
                ReaderWord::from_bits(w.bits()).decode(),
                (pid, start as u32)
            );
        }
        assert_eq!(ReaderWord::held(7, 9).bits(), 7 << 32 | 9);
    }

    #[test]
    fn entry_kinds_are_two_flags() {
        assert_eq!(entry_kind::VOID, 0);
        assert_eq!(entry_kind::CLOSED & 1, 1);
        assert_eq!(entry_kind::CORRUPT, entry_kind::CLOSED | 2);
    }
}
