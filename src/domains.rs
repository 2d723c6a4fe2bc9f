//! The clock-domain table: names that any attached process may register at
//! run time, lock-free and idempotently.
//!
//! A value word carries a 5-bit domain id; the id is the index of an entry in
//! this table. The table lives in the region header (words
//! [`H_DOMAIN_TABLE`] onwards, placed by [`crate::layout`]), [`MAX_DOMAINS`] entries of five words each:
//!
//! | word | content |
//! |---|---|
//! | 0 | state: bits 63..62 kind (`00` empty, `01` claimed, `10` ready, `11` corrupt), bits 61..0 a hash of the name |
//! | 1..=4 | the name, 32 bytes of NUL-padded UTF-8 |
//!
//! The declared domains (the shared clock first) are written ready when the
//! region is created. To register a name at run time a process scans the
//! entries in order:
//!
//! - *ready* with the name's hash: the name words are compared; equal means
//!   this is the name's id.
//! - *empty*: the process claims it, compare-and-swap to *claimed* with the
//!   hash, then fills it (below).
//! - *claimed* with the name's hash: the process fills it, whether it claimed
//!   it or not, so a registrant that died between claim and publication
//!   delays nobody. Each name word goes from 0 to its value by
//!   compare-and-swap; a word already holding this name's value is fine,
//!   a word holding anything else means another name with the same hash got
//!   there first, and the entry is skipped. Once every word holds the name,
//!   the state goes from *claimed* to *ready*.
//! - anything else: the next entry.
//!
//! Entries only ever move empty -> claimed -> ready and a name word is
//! written at most once, so every process registering one name reaches the
//! same entry: the first one whose final content is that name. A full table
//! fails open ([`Outcome::DomainTableFull`](crate::Outcome::DomainTableFull)).
//!
//! Readers (snapshots) trust an entry only when it is *ready* and its name
//! words decode to a valid name with the state's hash; anything else, as a
//! hostile process could write, is no name, and values in that domain are
//! dropped as corrupt.

use crate::layout::{DOMAIN_ENTRY_WORDS as ENTRY_WORDS, H_DOMAIN_TABLE};
use crate::schema::{DomainId, MAX_DOMAINS, valid_name};
use crate::sync::{AtomicU64, Ordering};
use crate::word::{DomainState, DomainWord, NAME_WORDS, pack_name, unpack_name};

/// How often one entry's state may change under a registrant before it gives
/// the entry up: a bound, so that a process flipping a state word cannot keep
/// a registrant spinning. Honest registrants change a state at most twice.
const RETRIES: usize = 4;

/// A 62-bit FNV-1a hash of a name.
fn hash(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h & DomainWord::HASH_MASK
}

fn entry(words: &[AtomicU64], i: usize) -> &[AtomicU64] {
    let base = H_DOMAIN_TABLE + i * ENTRY_WORDS;
    &words[base..base + ENTRY_WORDS]
}

/// Why a name could not be registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RegisterError {
    /// Not a valid domain name.
    BadName,
    /// Every entry holds another name.
    Full,
}

/// Writes the declared domains as ready entries, at creation (into zeroed
/// words, before the header is published).
pub(crate) fn write_declared(words: &[AtomicU64], names: &[String]) {
    for (i, name) in names.iter().enumerate() {
        let e = entry(words, i);
        for (w, v) in e[1..].iter().zip(pack_name(name)) {
            // Relaxed: published by the Release store of the version word.
            w.store(v, Ordering::Relaxed);
        }
        e[0].store(DomainWord::ready(hash(name)).bits(), Ordering::Relaxed);
    }
}

/// What a reader finds in one entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Entry {
    /// Empty or claimed: no name yet.
    NotReady,
    /// A ready entry and its name.
    Ready(String),
    /// Ready, but its words are no valid name with the state's hash, or a
    /// state edgemark never writes.
    Garbled,
}

/// Entry `i` as a reader finds it.
pub(crate) fn inspect(words: &[AtomicU64], i: usize) -> Entry {
    let e = entry(words, i);
    // Acquire: pairs with the Release publication in `fill` (and, for
    // declared entries, with the version word's Release store), so the name
    // words read below are the ones the publisher saw.
    let s = e[0].load(Ordering::Acquire);
    let s = DomainWord::from_bits(s);
    match s.state() {
        DomainState::Empty | DomainState::Claimed => return Entry::NotReady,
        DomainState::Ready => {}
        DomainState::Garbled => return Entry::Garbled,
    }
    // Relaxed: ordered after the Acquire above; name words never change
    // once written.
    match unpack_name(std::array::from_fn(|j| e[1 + j].load(Ordering::Relaxed))) {
        Some(name) if valid_name(&name) && hash(&name) == s.hash() => Entry::Ready(name),
        _ => Entry::Garbled,
    }
}

/// The name of entry `i` if it is ready and intact.
pub(crate) fn read(words: &[AtomicU64], i: usize) -> Option<String> {
    match inspect(words, i) {
        Entry::Ready(name) => Some(name),
        _ => None,
    }
}

/// Every entry's name, `None` for entries that hold none.
#[cfg(test)]
pub(crate) fn read_all(words: &[AtomicU64]) -> Vec<Option<String>> {
    (0..MAX_DOMAINS).map(|i| read(words, i)).collect()
}

/// Registers `name`, or finds it registered: its id.
pub(crate) fn register(words: &[AtomicU64], name: &str) -> Result<DomainId, RegisterError> {
    if !valid_name(name) {
        return Err(RegisterError::BadName);
    }
    let h = hash(name);
    let packed = pack_name(name);
    for i in 0..MAX_DOMAINS {
        let e = entry(words, i);
        // Acquire: pairs with the Release publication in `fill`, so that a
        // ready entry's name words are visible before they are compared.
        let mut s = e[0].load(Ordering::Acquire);
        for _ in 0..RETRIES {
            let w = DomainWord::from_bits(s);
            match (w.state(), w.hash()) {
                (DomainState::Empty, 0) => {
                    // AcqRel: the claim is ordered before the fill below;
                    // on failure the Acquire reads the claimer's state as
                    // above.
                    match e[0].compare_exchange(
                        s,
                        DomainWord::claimed(h).bits(),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => s = DomainWord::claimed(h).bits(),
                        Err(now) => s = now,
                    }
                    continue;
                }
                (DomainState::Claimed, sh) if sh == h && fill(e, &packed) => {
                    return Ok(DomainId(i as u8));
                }
                (DomainState::Ready, sh) if sh == h && names_equal(e, &packed) => {
                    return Ok(DomainId(i as u8));
                }
                _ => {}
            }
            break;
        }
    }
    Err(RegisterError::Full)
}

/// Fills a claimed entry with `packed` and publishes it; `false` if another
/// name's words are in it.
fn fill(e: &[AtomicU64], packed: &[u64; NAME_WORDS]) -> bool {
    for (w, &v) in e[1..].iter().zip(packed) {
        // Relaxed is enough: a name word is written once, from 0. Whoever
        // publishes the entry has read every word's final value with these
        // read-modify-writes before its Release store below, and read-read
        // coherence carries those values to any reader that acquires the
        // published state.
        match w.compare_exchange(0, v, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => {}
            Err(now) if now == v => {}
            Err(_) => return false,
        }
    }
    let claimed = e[0].load(Ordering::Relaxed);
    let ready = DomainWord::ready(DomainWord::from_bits(claimed).hash()).bits();
    if DomainWord::from_bits(claimed).state() == DomainState::Claimed {
        // Release: publishes the name words filled above; pairs with the
        // Acquire loads in `read` and `register`. A failure means another
        // registrant published first (or a hostile process wrote the word):
        // the comparison below decides.
        let _ = e[0].compare_exchange(claimed, ready, Ordering::Release, Ordering::Relaxed);
    }
    // Acquire: pairs with whichever Release store made the entry ready.
    e[0].load(Ordering::Acquire) == ready && names_equal(e, packed)
}

fn names_equal(e: &[AtomicU64], packed: &[u64; NAME_WORDS]) -> bool {
    // Relaxed: ordered after the caller's Acquire load of the ready state.
    e[1..]
        .iter()
        .zip(packed)
        .all(|(w, &v)| w.load(Ordering::Relaxed) == v)
}

/// The domain table over heap words, for the loom models in `loom-tests/`
/// (which drive the real registration code over loom's atomics).
#[cfg(edgemark_loom)]
pub struct LoomTable(crate::sync::HeapWords);

#[cfg(edgemark_loom)]
impl std::fmt::Debug for LoomTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoomTable")
    }
}

#[cfg(edgemark_loom)]
impl LoomTable {
    /// A table holding the shared clock only.
    pub fn new() -> LoomTable {
        let heap = crate::sync::HeapWords::zeroed(crate::layout::HEADER_WORDS);
        write_declared(heap.words(), &[crate::schema::HOST_MONOTONIC.to_owned()]);
        LoomTable(heap)
    }
    /// Registers `name`: its id, or `None` if the table is full.
    pub fn register(&self, name: &str) -> Option<u8> {
        register(self.0.words(), name).ok().map(|d| d.0)
    }
    /// Entry `i`: `Ok(None)` not ready, `Ok(Some(name))` ready, `Err(())`
    /// garbled.
    #[allow(clippy::result_unit_err)]
    pub fn inspect(&self, i: usize) -> Result<Option<String>, ()> {
        match inspect(self.0.words(), i) {
            Entry::NotReady => Ok(None),
            Entry::Ready(n) => Ok(Some(n)),
            Entry::Garbled => Err(()),
        }
    }
}

#[cfg(all(test, not(edgemark_loom)))]
pub(crate) mod tests {
    use super::*;
    use crate::layout::HEADER_WORDS;
    use crate::sync::HeapWords;

    /// A table holding the shared clock only (also the catalog's tests').
    pub(crate) fn table() -> HeapWords {
        let heap = HeapWords::zeroed(HEADER_WORDS);
        write_declared(heap.words(), &["host_monotonic".to_owned()]);
        heap
    }

    #[test]
    fn registering_is_idempotent_and_ids_follow_the_declared_ones() {
        let heap = table();
        let w = heap.words();
        assert_eq!(register(w, "host_monotonic"), Ok(DomainId(0)));
        assert_eq!(register(w, "sender"), Ok(DomainId(1)));
        assert_eq!(register(w, "receiver"), Ok(DomainId(2)));
        assert_eq!(register(w, "sender"), Ok(DomainId(1)));
        assert_eq!(read(w, 2).as_deref(), Some("receiver"));
        assert_eq!(read(w, 3), None);
    }

    #[test]
    fn a_full_table_refuses_and_bad_names_never_land() {
        let heap = table();
        let w = heap.words();
        for i in 1..MAX_DOMAINS {
            assert_eq!(register(w, &format!("d{i}")), Ok(DomainId(i as u8)));
        }
        assert_eq!(register(w, "one_more"), Err(RegisterError::Full));
        assert_eq!(register(w, "d7"), Ok(DomainId(7)));
        assert_eq!(register(w, ""), Err(RegisterError::BadName));
        assert_eq!(register(w, "a\nb"), Err(RegisterError::BadName));
        assert_eq!(register(w, &"x".repeat(33)), Err(RegisterError::BadName));
    }

    #[test]
    fn a_claim_left_by_a_dead_registrant_is_finished_by_the_next() {
        let heap = table();
        let w = heap.words();
        let e = entry(w, 1);
        e[0].store(
            DomainWord::claimed(hash("sender")).bits(),
            Ordering::Relaxed,
        );
        e[1].store(pack_name("sender")[0], Ordering::Relaxed);
        assert_eq!(read(w, 1), None, "a claimed entry names nothing yet");
        assert_eq!(register(w, "sender"), Ok(DomainId(1)));
        assert_eq!(read(w, 1).as_deref(), Some("sender"));
    }

    #[test]
    fn a_colliding_or_garbled_entry_is_skipped() {
        let heap = table();
        let w = heap.words();
        // Entry 1 claimed with "sender"'s hash but another name's words.
        let e = entry(w, 1);
        e[0].store(
            DomainWord::claimed(hash("sender")).bits(),
            Ordering::Relaxed,
        );
        e[1].store(pack_name("other")[0], Ordering::Relaxed);
        // Entry 2 ready but its words do not hash to its state.
        let e = entry(w, 2);
        e[0].store(DomainWord::ready(hash("x")).bits(), Ordering::Relaxed);
        e[1].store(pack_name("y")[0], Ordering::Relaxed);
        // Entry 3 in the kind edgemark never writes.
        entry(w, 3)[0].store(u64::MAX, Ordering::Relaxed);
        assert_eq!(register(w, "sender"), Ok(DomainId(4)));
        assert_eq!(register(w, "x"), Ok(DomainId(5)));
        let all = read_all(w);
        assert_eq!(all[1..4], [None, None, None]);
        assert_eq!(all[4].as_deref(), Some("sender"));
    }
}
