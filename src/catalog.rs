//! A process's cache of a region's names: its schema and the clock-domain
//! names it has met. Per process, not region state: the shared table it
//! caches is [`crate::domains`].

use std::sync::{Arc, OnceLock};

use crate::domains::{RegisterError, read, register};
use crate::schema::{DomainId, MAX_DOMAINS, Schema};
use crate::sync::local::AtomicU32;
use crate::sync::{AtomicU64, Ordering};
use crate::word::{NAME_BYTES, NAME_WORDS, pack_name};

impl PartialEq for Catalog {
    /// Segments of two snapshots are equal when their values and event names
    /// are: their catalogs are views of the same table.
    fn eq(&self, other: &Catalog) -> bool {
        self.schema.events() == other.schema.events()
    }
}

/// A process's view of a region's names: its schema and every domain name
/// it has met, filled in as they are registered. Shared by the recorder and
/// its snapshots (a name, once ready, never changes, so a snapshot's view of
/// it is fixed).
#[derive(Debug)]
pub(crate) struct Catalog {
    pub(crate) schema: Arc<Schema>,
    /// The schema event that keeps a chunk sequence, if one does.
    pub(crate) chunk_event: Option<usize>,
    domains: [OnceLock<Known>; MAX_DOMAINS],
    /// Bit `i` set once entry `i` of `domains` is: one load tells a
    /// snapshot that all its values' domains are known. Set only after the
    /// entry, and an unset bit only sends a reader to the entry itself, so
    /// a stale read is merely slower. A process-local cache (the entries
    /// hold the names), hence the facade's process-local atomic, which loom
    /// need not model.
    known: AtomicU32,
}

/// A domain name this process has met, with its packed form, which
/// [`Catalog::lookup`] compares.
#[derive(Debug)]
struct Known {
    name: String,
    packed: [u64; NAME_WORDS],
}

impl Known {
    fn new(name: String) -> Known {
        Known {
            packed: pack_name(&name),
            name,
        }
    }
}

impl Catalog {
    /// A catalog knowing the schema's declared domains.
    pub(crate) fn new(schema: Arc<Schema>) -> Catalog {
        let domains: [OnceLock<Known>; MAX_DOMAINS] = std::array::from_fn(|_| OnceLock::new());
        let mut known = 0u32;
        for (i, (slot, name)) in domains.iter().zip(schema.domains()).enumerate() {
            let _ = slot.set(Known::new(name.clone()));
            known |= 1 << i;
        }
        let known = AtomicU32::new(known);
        Catalog {
            chunk_event: schema.events().iter().position(|e| e.keeps_chunk_seq()),
            schema,
            domains,
            known,
        }
    }

    /// Bit `i` set: this process has met domain `i` (see `known`).
    #[inline]
    pub(crate) fn known_mask(&self) -> u32 {
        // Relaxed: a hint; see the field.
        self.known.load(Ordering::Relaxed)
    }

    fn mark_known(&self, id: DomainId) {
        // Relaxed: after the entry was set by this thread or seen set; see
        // the field.
        self.known.fetch_or(1 << (id.0 & 31), Ordering::Relaxed);
    }

    /// The name of domain `id`, if this process has met it.
    pub(crate) fn name(&self, id: DomainId) -> Option<&str> {
        self.domains
            .get(usize::from(id.0))?
            .get()
            .map(|k| k.name.as_str())
    }

    /// The id of `name` if this process has met it (declared, registered or
    /// read from the table), without touching the region: the name is
    /// packed once and compared as four words (and a length, so that
    /// trailing NULs cannot pass for padding) with each known name.
    #[inline]
    pub(crate) fn lookup(&self, name: &str) -> Option<DomainId> {
        if name.is_empty() || name.len() > NAME_BYTES {
            return None;
        }
        let packed = pack_name(name);
        self.domains
            .iter()
            .position(|d| {
                d.get()
                    .is_some_and(|k| k.packed == packed && k.name.len() == name.len())
            })
            .map(|i| DomainId(i as u8))
    }

    /// Whether `id` names a domain, reading the region's table for an id not
    /// met before.
    pub(crate) fn knows(&self, words: &[AtomicU64], id: DomainId) -> bool {
        let Some(slot) = self.domains.get(usize::from(id.0)) else {
            return false;
        };
        if slot.get().is_some() {
            self.mark_known(id);
            return true;
        }
        match read(words, usize::from(id.0)) {
            Some(name) => {
                let _ = slot.set(Known::new(name));
                self.mark_known(id);
                true
            }
            None => false,
        }
    }

    /// The id of the domain called `name`, registering it in the region if
    /// no process has yet.
    pub(crate) fn resolve(
        &self,
        words: &[AtomicU64],
        name: &str,
    ) -> Result<DomainId, RegisterError> {
        if let Some(id) = self.lookup(name) {
            return Ok(id);
        }
        let id = register(words, name)?;
        let _ = self.domains[usize::from(id.0)].set(Known::new(name.to_owned()));
        self.mark_known(id);
        Ok(id)
    }

    /// Every domain name of the region, in id order (reads the table).
    pub(crate) fn all(&self, words: &[AtomicU64]) -> Vec<String> {
        (0..MAX_DOMAINS as u8)
            .filter(|&i| self.knows(words, DomainId(i)))
            .filter_map(|i| self.name(DomainId(i)).map(str::to_owned))
            .collect()
    }
}

#[cfg(all(test, not(edgemark_loom)))]
mod tests {
    use super::*;
    use crate::domains::tests::table;

    #[test]
    fn the_catalog_finds_met_names_by_their_packed_words_only() {
        let heap = table();
        let w = heap.words();
        let schema = Arc::new(Schema::stream_edges());
        let names = Catalog::new(Arc::clone(&schema));
        assert_eq!(names.lookup("host_monotonic"), Some(DomainId(0)));
        assert_eq!(names.lookup("sender"), None, "not met yet");
        assert_eq!(names.resolve(w, "sender"), Ok(DomainId(1)));
        assert_eq!(names.lookup("sender"), Some(DomainId(1)));
        // Same packed words, other lengths or bytes: never a match.
        assert_eq!(names.lookup("sender\0"), None);
        assert_eq!(names.lookup("sende"), None);
        assert_eq!(names.lookup(""), None);
        assert_eq!(names.lookup(&"x".repeat(33)), None);
        // A name another process registered is met through the table.
        assert_eq!(register(w, "receiver"), Ok(DomainId(2)));
        assert_eq!(names.lookup("receiver"), None);
        assert!(names.knows(w, DomainId(2)));
        assert_eq!(names.lookup("receiver"), Some(DomainId(2)));
    }
}
