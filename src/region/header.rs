//! The header codec: the header of a new region, and writing, reading and
//! validating a region's header words.

use std::sync::Arc;

use super::error::{AttachError, CreateError};
use crate::clock::{Clock, ClockIdentity, CounterScale};
use crate::layout::*;
use crate::mark::Edge;
use crate::schema::{MAX_DOMAINS, MAX_EVENTS, Schema, SchemaError};
use crate::sync::{AtomicU64, Ordering};
use crate::word::{EdgeWord, EventMetaWord, NAME_WORDS, pack_name, unpack_name};

/// Everything a validated header says.
#[derive(Clone, Debug)]
pub(crate) struct Header {
    pub(crate) layout: Layout,
    /// Shared with the recorder's name catalog (one copy per process).
    pub(crate) schema: Arc<Schema>,
    pub(crate) edges: Vec<Edge>,
    pub(crate) region_id: u64,
    pub(crate) clock: ClockIdentity,
    pub(crate) created_unix_ns: u64,
    pub(crate) creator_pid: u64,
    pub(crate) group_access: bool,
    pub(crate) pid_namespace: u64,
    /// The kind of the shared clock.
    pub(crate) clock_kind: Clock,
    /// Counter ticks per 2^32 ns in a counter region (valid for
    /// [`CounterScale::new`]); 0 in a monotonic one.
    pub(crate) counter_rate: u64,
}

const FLAG_GROUP: u64 = 1;
/// Set (never cleared) by the first process that attaches from another pid
/// namespace: from then on no process trusts a pid found in the region, so
/// no lock is taken over and no owner is judged dead automatically.
const FLAG_MIXED_PID_NS: u64 = 2;

/// Whether a process from another pid namespace attached for writing (the
/// header's sticky flag, [`mark_mixed_pid_namespaces`]).
pub(crate) fn mixed_pid_namespaces(words: &[AtomicU64]) -> bool {
    // Relaxed: a sticky flag; a stale read only delays the extra care by
    // one call, as for any process that attaches later.
    words[H_FLAGS].load(Ordering::Relaxed) & FLAG_MIXED_PID_NS != 0
}

/// Sets the header's flag that a process from another pid namespace
/// attached for writing: from then on no process trusts a pid found in the
/// region.
pub(crate) fn mark_mixed_pid_namespaces(words: &[AtomicU64]) {
    // Relaxed: a sticky flag; its readers only ever become more careful.
    words[H_FLAGS].fetch_or(FLAG_MIXED_PID_NS, Ordering::Relaxed);
}

/// Writes a header into zeroed words: everything first, the version word
/// last.
pub(crate) fn write_header(words: &[AtomicU64], h: &Header) {
    let put = |i: usize, v: u64| words[i].store(v, Ordering::Relaxed);
    let l = &h.layout;
    put(H_MAGIC, MAGIC);
    put(H_HEADER_BYTES, HEADER_BYTES as u64);
    put(H_FILE_BYTES, l.bytes());
    put(H_SLOTS, l.slots.into());
    put(H_SEGMENTS, l.segments.into());
    put(H_EDGES, l.edges.into());
    put(H_EVENTS, l.events.into());
    put(H_DOMAINS, h.schema.domains().len() as u64);
    put(H_SLOT_STRIDE, l.slot_stride_bytes());
    put(H_SLOTS_OFFSET, l.slots_offset_bytes());
    put(H_REGION_ID, h.region_id);
    put(H_BOOT_ID, h.clock.boot_id as u64);
    put(H_BOOT_ID + 1, (h.clock.boot_id >> 64) as u64);
    put(H_TIME_NS, h.clock.time_namespace);
    put(H_CREATED_UNIX_NS, h.created_unix_ns);
    put(H_CREATOR_PID, h.creator_pid);
    put(H_FLAGS, if h.group_access { FLAG_GROUP } else { 0 });
    put(H_PID_NS, h.pid_namespace);
    put(H_CLOCK_KIND, h.clock_kind.word());
    put(H_COUNTER_RATE, h.counter_rate);
    put(H_RING_ENTRIES, l.ring_entries.into());
    put(H_RING_STRIDE, l.ring_stride_bytes());
    put(H_RING_OFFSET, l.ring_offset_bytes());
    for (i, e) in h.edges.iter().enumerate() {
        put(H_EDGE_TABLE + i, EdgeWord::new(e.from, e.to).bits());
    }
    crate::domains::write_declared(words, h.schema.domains());
    for (i, e) in h.schema.events().iter().enumerate() {
        let base = H_EVENT_TABLE + i * EVENT_WORDS;
        for (j, w) in pack_name(e.name()).into_iter().enumerate() {
            put(base + j, w);
        }
        put(
            base + NAME_WORDS,
            EventMetaWord::new(e.domain().0, e.keeps_chunk_seq()).bits(),
        );
    }
    // Release: publishes every word above (and the zeroed slots); pairs with
    // the Acquire load of the version in `read_header`. An opener that sees 0
    // knows the header is not ready (Aeron's CnC does the same).
    words[H_VERSION].store(FORMAT_VERSION, Ordering::Release);
}

/// Reads and validates a header from the first words of a region of
/// `file_len` bytes. Touches nothing past the header.
pub(crate) fn read_header(words: &[AtomicU64], file_len: u64) -> Result<Header, AttachError> {
    if words.len() < HEADER_WORDS {
        return Err(AttachError::Length {
            actual: file_len,
            expected: HEADER_BYTES as u64,
        });
    }
    // Acquire: pairs with the Release store of the version in `write_header`.
    let version = words[H_VERSION].load(Ordering::Acquire);
    // Relaxed from here on: ordered after the Acquire above, and these words
    // never change once the version is published.
    let get = |i: usize| words[i].load(Ordering::Relaxed);
    let magic = get(H_MAGIC);
    if magic != MAGIC {
        return Err(if magic == 0 && version == 0 {
            AttachError::NotInitialised
        } else {
            AttachError::BadMagic
        });
    }
    if version == 0 {
        return Err(AttachError::NotInitialised);
    }
    if version != FORMAT_VERSION {
        return Err(AttachError::UnsupportedVersion(version));
    }
    let small = |i: usize, what: &'static str| -> Result<u32, AttachError> {
        u32::try_from(get(i)).map_err(|_| {
            AttachError::Geometry(GeometryError::Oversized {
                what,
                value: get(i),
            })
        })
    };
    let layout = Layout::new(
        small(H_SLOTS, "the slot count")?,
        small(H_SEGMENTS, "the segment count")?,
        small(H_EDGES, "the edge count")?,
        small(H_EVENTS, "the event count")?,
        small(H_RING_ENTRIES, "the closed-request ring's entry count")?,
    )
    .map_err(AttachError::Geometry)?;
    let expect = |i: usize, what: &'static str, want: u64| {
        if get(i) == want {
            Ok(())
        } else {
            Err(AttachError::Geometry(GeometryError::Mismatch {
                what,
                found: get(i),
                expected: want,
            }))
        }
    };
    expect(H_HEADER_BYTES, "the header length", HEADER_BYTES as u64)?;
    expect(H_SLOT_STRIDE, "the slot stride", layout.slot_stride_bytes())?;
    expect(
        H_SLOTS_OFFSET,
        "the slots offset",
        layout.slots_offset_bytes(),
    )?;
    expect(H_RING_STRIDE, "the ring stride", layout.ring_stride_bytes())?;
    expect(H_RING_OFFSET, "the ring offset", layout.ring_offset_bytes())?;
    expect(H_FILE_BYTES, "the recorded file length", layout.bytes())?;
    if file_len != layout.bytes() {
        return Err(AttachError::Length {
            actual: file_len,
            expected: layout.bytes(),
        });
    }
    let domain_count = get(H_DOMAINS);
    if domain_count == 0 || domain_count > MAX_DOMAINS as u64 {
        return Err(AttachError::Geometry(GeometryError::OutOfRange {
            what: "the domain count",
            value: domain_count,
            max: MAX_DOMAINS as u64,
        }));
    }
    let name_at = |base: usize, what: String| {
        let w = [get(base), get(base + 1), get(base + 2), get(base + 3)];
        unpack_name(w).ok_or(AttachError::Schema(SchemaError::BadName(what)))
    };
    // The declared domains are written ready at creation and never change;
    // entries after them are registered at run time and read when needed.
    let domains = (0..domain_count as usize)
        .map(|i| {
            crate::domains::read(words, i)
                .ok_or_else(|| AttachError::Schema(SchemaError::BadName(format!("domain #{i}"))))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut events = Vec::with_capacity(layout.events as usize);
    for i in 0..layout.events as usize {
        debug_assert!(i < MAX_EVENTS);
        let base = H_EVENT_TABLE + i * EVENT_WORDS;
        let name = name_at(base, format!("event #{i}"))?;
        let meta = get(base + NAME_WORDS);
        let Some((domain, keeps_chunk_seq)) = EventMetaWord::from_bits(meta).decode() else {
            return Err(AttachError::Geometry(GeometryError::EventFlags {
                event: i,
                flags: meta,
            }));
        };
        events.push((name, domain, keeps_chunk_seq));
    }
    let schema = Schema::from_parts(events, domains).map_err(AttachError::Schema)?;
    let mut edges: Vec<Edge> = Vec::with_capacity(layout.edges as usize);
    for i in 0..layout.edges as usize {
        let w = get(H_EDGE_TABLE + i);
        let (from, to) = EdgeWord::from_bits(w).decode();
        let e = Edge::new(from, to);
        if e.from == e.to || edges.contains(&e) {
            return Err(AttachError::Geometry(GeometryError::Edge {
                index: i,
                from: e.from,
                to: e.to,
            }));
        }
        edges.push(e);
    }
    let flags = get(H_FLAGS);
    if flags & !(FLAG_GROUP | FLAG_MIXED_PID_NS) != 0 {
        return Err(AttachError::Geometry(GeometryError::Flags(flags)));
    }
    let clock_kind = Clock::from_word(get(H_CLOCK_KIND))
        .ok_or_else(|| AttachError::Geometry(GeometryError::ClockKind(get(H_CLOCK_KIND))))?;
    let counter_rate = get(H_COUNTER_RATE);
    let rate_ok = match clock_kind {
        Clock::Monotonic => counter_rate == 0,
        Clock::Counter => CounterScale::new(counter_rate).is_some(),
    };
    if !rate_ok {
        return Err(AttachError::Geometry(GeometryError::CounterRate {
            clock: clock_kind,
            rate: counter_rate,
        }));
    }
    Ok(Header {
        layout,
        schema: Arc::new(schema),
        edges,
        region_id: get(H_REGION_ID),
        clock: ClockIdentity {
            boot_id: u128::from(get(H_BOOT_ID)) | u128::from(get(H_BOOT_ID + 1)) << 64,
            time_namespace: get(H_TIME_NS),
        },
        created_unix_ns: get(H_CREATED_UNIX_NS),
        creator_pid: get(H_CREATOR_PID),
        group_access: flags & FLAG_GROUP != 0,
        pid_namespace: get(H_PID_NS),
        clock_kind,
        counter_rate,
    })
}

/// A fresh, random region ID (never 0).
pub(crate) fn new_region_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(crate::clock::unix_ns());
    h.write_u64(crate::clock::monotonic_ns());
    h.write_u32(std::process::id());
    h.finish().max(1)
}

/// Validates the declared edges and geometry and builds the header of a new
/// region.
pub(crate) fn new_header(
    edges: &[Edge],
    slots: u32,
    segments: u32,
    ring_entries: u32,
    schema: &Schema,
    group_access: bool,
    clock: Clock,
) -> Result<Header, CreateError> {
    if edges.is_empty() {
        return Err(CreateError::NoEdges);
    }
    for (i, e) in edges.iter().enumerate() {
        if e.from == e.to || edges[..i].contains(e) {
            return Err(CreateError::BadEdge(*e));
        }
    }
    schema.validate().map_err(CreateError::Schema)?;
    let layout = Layout::new(
        slots,
        segments,
        u32::try_from(edges.len()).unwrap_or(u32::MAX),
        schema.events().len() as u32,
        ring_entries,
    )
    .map_err(CreateError::Geometry)?;
    // A counter region only where the kernel trusts the counter and a
    // calibration succeeds; otherwise the region falls back to
    // CLOCK_MONOTONIC (documented on `Clock::Counter`).
    let counter_rate = match clock {
        Clock::Counter if crate::clock::counter_untrusted().is_none() => {
            crate::clock::calibrate(3, 5_000_000)
                .filter(|&r| CounterScale::new(r).is_some())
                .unwrap_or(0)
        }
        _ => 0,
    };
    let clock_kind = if counter_rate == 0 {
        Clock::Monotonic
    } else {
        Clock::Counter
    };
    Ok(Header {
        layout,
        schema: Arc::new(schema.clone()),
        edges: edges.to_vec(),
        region_id: new_region_id(),
        clock: ClockIdentity::current(),
        created_unix_ns: crate::clock::unix_ns(),
        creator_pid: u64::from(std::process::id()),
        group_access,
        pid_namespace: crate::process::pid_namespace(),
        clock_kind,
        counter_rate,
    })
}
