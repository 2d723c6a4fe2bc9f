//! The encoding of every word the protocol reads and writes.
//!
//! All state lives in 64-bit words so that every transition is a single
//! atomic operation. This module only packs and unpacks them; it knows
//! nothing of orderings or of where the words live.
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

/// Number of bits of elapsed time in a value word.
pub(crate) const ELAPSED_BITS: u32 = 37;
/// Largest elapsed time a value word holds, in microseconds (about 38.2 hours).
pub(crate) const MAX_ELAPSED_US: u64 = (1 << ELAPSED_BITS) - 1;
const CHUNK_BITS: u32 = 20;
/// Largest chunk sequence number a value word holds.
pub(crate) const MAX_CHUNK_SEQ: u64 = (1 << CHUNK_BITS) - 2;
const DOMAIN_BITS: u32 = 5;
/// Number of clock domains a region can hold (declared and registered).
pub(crate) const MAX_DOMAINS: usize = 1 << DOMAIN_BITS;
/// Largest segment count a request can reach on one edge.
pub(crate) const MAX_COUNT: u32 = (1 << 24) - 1;

const KIND_SHIFT: u32 = 62;
const KIND_EMPTY: u64 = 0;
const KIND_VALUE: u64 = 1;
const KIND_SEALED: u64 = 2;
const COUNT_MASK: u64 = (1 << 24) - 1;
const EPOCH_MASK: u64 = (1 << 56) - 1;

/// A decoded cell word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cell {
    /// Laid for the epoch (generation, segment count); writable in it.
    Empty { gen: u32, count: u32 },
    /// A recorded value.
    Value(Value),
    /// Fenced by close: nothing can be written any more.
    Sealed,
    /// Bits edgemark never writes.
    Corrupt,
}

/// The content of a value word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Value {
    pub(crate) domain: u8,
    pub(crate) chunk_seq: Option<u64>,
    pub(crate) elapsed_us: u64,
}

#[inline]
pub(crate) const fn empty(gen: u32, count: u32) -> u64 {
    (KIND_EMPTY << KIND_SHIFT) | ((gen as u64) << 24) | (count as u64 & COUNT_MASK)
}

#[inline]
pub(crate) const fn sealed(gen: u32, count: u32) -> u64 {
    (KIND_SEALED << KIND_SHIFT) | ((gen as u64) << 24) | (count as u64 & COUNT_MASK)
}

/// Packs a value word. The caller has checked the ranges (`domain <
/// MAX_DOMAINS`, `chunk_seq <= MAX_CHUNK_SEQ`, `elapsed_us <= MAX_ELAPSED_US`).
#[inline]
pub(crate) const fn value(domain: u8, chunk_seq: Option<u64>, elapsed_us: u64) -> u64 {
    let chunk = match chunk_seq {
        Some(c) => c + 1,
        None => 0,
    };
    (KIND_VALUE << KIND_SHIFT)
        | ((domain as u64) << (ELAPSED_BITS + CHUNK_BITS))
        | (chunk << ELAPSED_BITS)
        | elapsed_us
}

/// The clock domain of a value word; `None` for any other kind. What
/// [`decode`] would say of the domain, without decoding the rest.
#[inline]
pub(crate) const fn value_domain(word: u64) -> Option<u8> {
    if word >> KIND_SHIFT == KIND_VALUE {
        Some(((word >> (ELAPSED_BITS + CHUNK_BITS)) & (MAX_DOMAINS as u64 - 1)) as u8)
    } else {
        None
    }
}

#[inline]
pub(crate) const fn decode(word: u64) -> Cell {
    let rest = word & !(3 << KIND_SHIFT);
    match word >> KIND_SHIFT {
        KIND_EMPTY | KIND_SEALED if rest & !EPOCH_MASK != 0 => Cell::Corrupt,
        KIND_EMPTY => Cell::Empty {
            gen: (rest >> 24) as u32,
            count: (rest & COUNT_MASK) as u32,
        },
        KIND_SEALED => Cell::Sealed,
        KIND_VALUE => {
            let chunk = (rest >> ELAPSED_BITS) & ((1 << CHUNK_BITS) - 1);
            Cell::Value(Value {
                domain: (rest >> (ELAPSED_BITS + CHUNK_BITS)) as u8,
                chunk_seq: if chunk == 0 { None } else { Some(chunk - 1) },
                elapsed_us: rest & MAX_ELAPSED_US,
            })
        }
        _ => Cell::Corrupt,
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

/// A decoded head word: the slot's generation, state and, while a control
/// operation holds the slot, the holder's pid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) gen: u32,
    pub(crate) state: SlotState,
    /// The pid of the process holding the control lock (`Beginning`,
    /// `Segmenting`, `Closing`), so that a reclaim can tell a dead holder;
    /// 0 otherwise. Linux pids are below 2^22, so 24 bits hold any of them.
    pub(crate) holder: u32,
}

/// Largest pid a head word can name as a lock holder.
pub(crate) const MAX_HOLDER: u32 = (1 << 24) - 1;

/// A head word in an unlocked state (`Free` or `Open`).
#[inline]
pub(crate) const fn head(gen: u32, state: SlotState) -> u64 {
    ((gen as u64) << 32) | state as u64
}

/// A head word in a locked state, naming its holder.
#[inline]
pub(crate) const fn head_held(gen: u32, state: SlotState, holder: u32) -> u64 {
    ((gen as u64) << 32) | ((holder as u64 & MAX_HOLDER as u64) << 8) | state as u64
}

#[inline]
pub(crate) fn decode_head(word: u64) -> Option<Head> {
    let state = match word & 0xFF {
        0 => SlotState::Free,
        1 => SlotState::Beginning,
        2 => SlotState::Open,
        3 => SlotState::Segmenting,
        4 => SlotState::Closing,
        _ => return None,
    };
    let holder = ((word >> 8) as u32) & MAX_HOLDER;
    let locked = matches!(
        state,
        SlotState::Beginning | SlotState::Segmenting | SlotState::Closing
    );
    if holder != 0 && !locked {
        return None;
    }
    Some(Head {
        gen: (word >> 32) as u32,
        state,
        holder,
    })
}

/// The next generation after `gen`; 0 is never used, so that a zeroed slot
/// matches no token.
#[inline]
pub(crate) const fn next_gen(gen: u32) -> u32 {
    match gen.wrapping_add(1) {
        0 => 1,
        g => g,
    }
}

/// A segment word (per slot and edge) and an entry word (per slot, edge and
/// ring entry) share one packing: the segment count in bits 55..32 and the
/// segment index in bits 31..0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seg {
    /// How many segments were started on this edge of this request before
    /// this one (0 for the initial segment).
    pub(crate) count: u32,
    /// The caller's segment index.
    pub(crate) index: u32,
}

#[inline]
pub(crate) const fn seg(count: u32, index: u32) -> u64 {
    ((count as u64 & COUNT_MASK) << 32) | index as u64
}

#[inline]
pub(crate) fn decode_seg(word: u64) -> Option<Seg> {
    if word >> 56 != 0 {
        return None;
    }
    Some(Seg {
        count: ((word >> 32) & COUNT_MASK) as u32,
        index: word as u32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_words_round_trip_at_their_limits() {
        for (d, c, e) in [
            (0u8, None, 0u64),
            (7, Some(0), MAX_ELAPSED_US),
            (3, Some(MAX_CHUNK_SEQ), 12_000),
        ] {
            assert_eq!(
                decode(value(d, c, e)),
                Cell::Value(Value {
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
            let w = value(d, Some(MAX_CHUNK_SEQ), MAX_ELAPSED_US);
            assert_eq!(value_domain(w), Some(d));
        }
        assert_eq!(value_domain(empty(3, 1)), None);
        assert_eq!(value_domain(sealed(3, 1)), None);
        assert_eq!(value_domain(u64::MAX), None);
    }

    #[test]
    fn empty_words_name_their_epoch_and_differ_from_every_value() {
        assert_eq!(
            decode(empty(u32::MAX, MAX_COUNT)),
            Cell::Empty {
                gen: u32::MAX,
                count: MAX_COUNT
            }
        );
        assert_ne!(empty(1, 0), value(0, None, 0));
        assert_ne!(empty(1, 0), empty(2, 0));
        assert_ne!(empty(1, 0), empty(1, 1));
        assert_eq!(decode(sealed(5, 1)), Cell::Sealed);
        assert_eq!(decode(u64::MAX), Cell::Corrupt);
        assert_eq!(decode(1 << 60), Cell::Corrupt);
    }

    #[test]
    fn head_and_segment_words_round_trip_and_reject_garbage() {
        let h = decode_head(head_held(9, SlotState::Closing, 4_194_304)).unwrap();
        assert_eq!(
            (h.gen, h.state, h.holder),
            (9, SlotState::Closing, 4_194_304)
        );
        assert_eq!(decode_head(head(3, SlotState::Open)).unwrap().holder, 0);
        assert_eq!(decode_head(7), None);
        assert_eq!(
            decode_head(1 << 12 | 2),
            None,
            "an open slot names no holder"
        );
        assert_eq!(next_gen(u32::MAX), 1);
        let s = decode_seg(seg(3, 77)).unwrap();
        assert_eq!((s.count, s.index), (3, 77));
        assert_eq!(decode_seg(1 << 60), None);
    }
}
