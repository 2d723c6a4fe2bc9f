//! The read-only reports on a region: its geometry and identity, a
//! request's owner, what a reclaim freed, the counters, and the histograms
//! of closed requests with the code that reads them. Plain values with no
//! reference into the region.
//!
//! # One encoding
//!
//! [`RegionReport`] is everything a region says about itself at one
//! moment: [`RegionInfo`], [`Counters`] and [`Occupancy`]. Its `Serialize`
//! is the one encoding of those facts: `edgemark inspect --json` prints it
//! (with the open requests after it), Python's `Region.report()` returns
//! it as a dict (through `pythonize`, as snapshots are), and
//! `Region.info()` and `Region.counters()` return its two parts.
//!
//! The counters and gauges are named in one table, [`METRICS`], which has
//! its own file (`report/metrics.rs`): a row gives each its key, its
//! Prometheus family, its help text, its kind and how to read it. The
//! serialization of [`Counters`] and [`Occupancy`], the Prometheus text
//! ([`crate::prometheus`], feature `prometheus`) and `edgemark inspect` all
//! iterate it, so a new counter is a field and a row. The JSON is one flat
//! object:
//!
//! ```json
//! {"region_id": "5c0de1f2a3b4c5d6", "bytes": 1318912, "slots": 64, "segments": 4,
//!  "slot_stride": 1024, "slots_offset": 139264,
//!  "edges": ["0->1", "1->2"],
//!  "events": [{"name": "producer_first_nonempty_emit", "domain": "host_monotonic", "keeps_chunk_seq": true}, "..."],
//!  "domains": ["host_monotonic", "gpu"],
//!  "clock": {"kind": "monotonic", "boot_id": "<32 hex digits>", "time_namespace": 4026531834,
//!            "shared_with_this_process": true},
//!  "created_unix_ns": 1764921600000000000, "creator_pid": 4242, "group_access": false,
//!  "pid_namespaces": {"mixed": false, "pids_judged": true, "why_not_judged": null},
//!  "closed_ring": {"entries": 64, "entry_bytes": 512},
//!  "refused": {"stale_segment": 0, "...": 0},
//!  "dropped_segments": 0, "closed_requests": 12, "reclaimed_requests": 0,
//!  "expired_requests": 1, "closed_lost": 0, "closed_acknowledged": 9,
//!  "closed_given_up": {"queue_full": 0, "retries_exhausted": 1, "refused": 0},
//!  "closed_overwritten_taken": 0, "closed_settled_overwritten": 0,
//!  "bad_trace_contexts": 0,
//!  "open_requests": 3, "free_slots": 61,
//!  "closed_unread": 0, "closed_unacknowledged": 2, "closed_readers": 1}
//! ```
//!
//! The histograms live in the region, between the header and the slots.
//! The close that ends a request (the one holder of its `Closing` lock, in
//! `protocol/control.rs`) adds each of its final values, and each delta
//! between consecutive events of one segment, to them. Closed requests
//! therefore reach any reader, such as the Prometheus exporter, as monotonic
//! counters in the region: each is counted exactly once, however often a
//! reader polls, and a reader that restarts loses and repeats nothing.
//! Nothing here runs on the record path.

use serde::{Serialize, Serializer};

use crate::clock::ClockIdentity;
pub use crate::layout::BUCKETS_MS;
use crate::layout::{
    H_BAD_TRACE, H_CLOSED, H_COUNTERS, H_DROPPED, H_EXPIRED, H_RECLAIMED, H_RING_ACKED,
    H_RING_GAVE_UP_FULL, H_RING_GAVE_UP_REFUSED, H_RING_GAVE_UP_RETRIES, H_RING_LOST,
    H_RING_OVERWRITTEN_TAKEN, H_RING_SETTLED_OVERWRITTEN, HistWords, Layout,
};
use crate::mark::Edge;
use crate::outcome::Outcome;
use crate::schema::Schema;
use crate::sync::{AtomicU64, Ordering};
use crate::token::RegionId;

mod metrics;

pub use metrics::{METRICS, Metric, MetricKind, MetricValue};

/// The geometry, identity and schema of a region, as its header declares
/// them. Serialises as the first part of a [`RegionReport`] (see the
/// module docs for the names).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegionInfo {
    /// The region's random ID (tokens carry it).
    pub region_id: RegionId,
    /// Request slots.
    pub slots: u32,
    /// Segments kept per edge of a request.
    pub segments: u32,
    /// Bytes per slot.
    pub slot_stride: u64,
    /// Where slot 0 begins, in bytes (after the header and the histograms).
    pub slots_offset: u64,
    /// Entries of the ring of closed requests (0: the region keeps none).
    pub ring_entries: u32,
    /// Bytes per entry of that ring.
    pub ring_stride: u64,
    /// Bytes in all.
    pub bytes: u64,
    /// The clock the region's `host_monotonic` domain is.
    pub clock: ClockIdentity,
    /// Whether this process shares that clock: it may begin requests and
    /// record values in `host_monotonic` (false in another boot or time
    /// namespace, and in a counter region whose counter this process does
    /// not trust).
    pub shares_clock: bool,
    /// The kind of the region's shared clock.
    pub clock_kind: crate::clock::Clock,
    /// Creation time, nanoseconds since the Unix epoch.
    pub created_unix_ns: u64,
    /// The creating process.
    pub creator_pid: u64,
    /// Whether the file's group may use it.
    pub group_access: bool,
    /// Whether a process from another pid namespace than the creator's has
    /// attached the region for writing (a header flag, set by that attach
    /// and never cleared): from then on no process judges pids in it.
    pub mixed_pid_namespaces: bool,
    /// Why this process does not judge the pids in the region (so its
    /// reclaims free nothing and its closes never take a lock over), or
    /// `None` when it does.
    pub pids_unjudged: Option<PidsUnjudged>,
    /// The declared edges, in order.
    pub edges: Vec<Edge>,
    /// The schema's events, in schema order.
    pub events: Vec<EventInfo>,
    /// Every clock domain, declared and registered, in id order.
    pub domains: Vec<String>,
}

/// One event of a region's schema, by name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct EventInfo {
    /// The event's name.
    pub name: String,
    /// The name of its clock domain.
    pub domain: String,
    /// Whether its winning write keeps the chunk sequence number.
    pub keeps_chunk_seq: bool,
}

impl EventInfo {
    /// The event `name` in clock domain `domain`.
    pub fn new(name: &str, domain: &str, keeps_chunk_seq: bool) -> EventInfo {
        EventInfo {
            name: name.to_owned(),
            domain: domain.to_owned(),
            keeps_chunk_seq,
        }
    }
}

impl Serialize for RegionInfo {
    /// The names of the module docs: the clock, the pid namespaces and the
    /// ring of closed requests each as one object.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Clock {
            kind: &'static str,
            boot_id: String,
            time_namespace: u64,
            shared_with_this_process: bool,
        }
        #[derive(Serialize)]
        struct PidNamespaces {
            mixed: bool,
            pids_judged: bool,
            why_not_judged: Option<&'static str>,
        }
        #[derive(Serialize)]
        struct ClosedRing {
            entries: u32,
            entry_bytes: u64,
        }
        #[derive(Serialize)]
        struct Info<'a> {
            region_id: RegionId,
            bytes: u64,
            slots: u32,
            segments: u32,
            slot_stride: u64,
            slots_offset: u64,
            edges: Vec<String>,
            events: &'a [EventInfo],
            domains: &'a [String],
            clock: Clock,
            created_unix_ns: u64,
            creator_pid: u64,
            group_access: bool,
            pid_namespaces: PidNamespaces,
            closed_ring: ClosedRing,
        }
        Info {
            region_id: self.region_id,
            bytes: self.bytes,
            slots: self.slots,
            segments: self.segments,
            slot_stride: self.slot_stride,
            slots_offset: self.slots_offset,
            edges: self.edges.iter().map(Edge::to_string).collect(),
            events: &self.events,
            domains: &self.domains,
            clock: Clock {
                kind: self.clock_kind.name(),
                boot_id: format!("{:032x}", self.clock.boot_id),
                time_namespace: self.clock.time_namespace,
                shared_with_this_process: self.shares_clock,
            },
            created_unix_ns: self.created_unix_ns,
            creator_pid: self.creator_pid,
            group_access: self.group_access,
            pid_namespaces: PidNamespaces {
                mixed: self.mixed_pid_namespaces,
                pids_judged: self.pids_unjudged.is_none(),
                why_not_judged: self.pids_unjudged.map(PidsUnjudged::name),
            },
            closed_ring: ClosedRing {
                entries: self.ring_entries,
                entry_bytes: self.ring_stride,
            },
        }
        .serialize(s)
    }
}

/// What a region holds now: how many of its slots hold an open request,
/// from one sweep of the slots, and what its ring of closed requests
/// holds, from one pass over the ring's entries (all 0 in a region
/// without a ring). Serialises as the third part of a [`RegionReport`],
/// as its rows of [`METRICS`] name it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Occupancy {
    /// Requests open when the sweep passed their slots.
    pub open_requests: u32,
    /// The other slots.
    pub free_slots: u32,
    /// Entries of the ring of closed requests published and not yet taken
    /// by any reader.
    pub closed_unread: u64,
    /// Entries a registered reader
    /// ([`ClosedReader`](crate::ClosedReader)) took and has not yet
    /// acknowledged or given up.
    pub closed_unacknowledged: u64,
    /// Readers registered in the region's reader table.
    pub closed_readers: u64,
}

impl Occupancy {
    /// `open` requests open in a region of `slots` slots, and nothing in
    /// its ring of closed requests.
    pub fn new(open: u32, slots: u32) -> Occupancy {
        Occupancy {
            open_requests: open,
            free_slots: slots.saturating_sub(open),
            ..Occupancy::default()
        }
    }

    /// This occupancy with the ring of closed requests holding `unread`
    /// entries not yet taken and `unacknowledged` taken and not settled,
    /// with `readers` readers registered.
    pub fn with_closed_ring(self, unread: u64, unacknowledged: u64, readers: u64) -> Occupancy {
        Occupancy {
            closed_unread: unread,
            closed_unacknowledged: unacknowledged,
            closed_readers: readers,
            ..self
        }
    }
}

/// Everything a region says about itself at one moment: what it declares,
/// what it has counted and how full it is; the one encoding of these
/// facts (see the module docs), from
/// [`Viewer::report`](crate::Viewer::report).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RegionReport {
    /// Geometry, identity and schema.
    #[serde(flatten)]
    pub info: RegionInfo,
    /// The counters.
    #[serde(flatten)]
    pub counters: Counters,
    /// Open requests and free slots.
    #[serde(flatten)]
    pub occupancy: Occupancy,
}

/// Why a process does not judge the pids found in a region: a pid means
/// different processes in different pid namespaces, so it frees no slot
/// and takes over no lock on their account (`docs/limitations.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PidsUnjudged {
    /// This process is in another pid namespace than the region's creator.
    OtherNamespace,
    /// A process from another pid namespace than the creator's attached the
    /// region for writing ([`RegionInfo::mixed_pid_namespaces`]).
    MixedNamespaces,
}

impl PidsUnjudged {
    /// A stable snake-case name, for JSON.
    pub fn name(self) -> &'static str {
        match self {
            PidsUnjudged::OtherNamespace => "other_pid_namespace",
            PidsUnjudged::MixedNamespaces => "mixed_pid_namespaces",
        }
    }
}

/// As its [`name`](PidsUnjudged::name).
impl Serialize for PidsUnjudged {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl std::fmt::Display for PidsUnjudged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PidsUnjudged::OtherNamespace => {
                "this process is in another pid namespace than the region's creator"
            }
            PidsUnjudged::MixedNamespaces => {
                "a process from another pid namespace attached the region for writing (a flag that is never cleared)"
            }
        })
    }
}

/// The identity of a process that began a request: its pid and its start
/// time, which tells a reused pid from the original.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Owner {
    /// The process ID.
    pub pid: u64,
    /// The process's start time in clock ticks since boot (field 22 of
    /// `/proc/<pid>/stat`).
    pub start_ticks: u64,
}

/// What [`Recorder::reclaim_dead_owners`](crate::Recorder::reclaim_dead_owners) freed.
/// Serialises under its field names, `unjudged` as the reason's
/// [`name`](PidsUnjudged::name) or null (Python's
/// `Region.reclaim_dead_owners()` returns it so).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ReclaimReport {
    /// Open requests whose owner process is gone.
    pub dead_owners: u32,
    /// Slots left locked by a process that died inside begin, start segment
    /// or close.
    pub dead_holders: u32,
    /// Set when the reclaim judged no pid and freed nothing, and why
    /// ([`Recorder::reclaim_dead_owners_in_this_namespace`](crate::Recorder::reclaim_dead_owners_in_this_namespace)
    /// judges them anyway).
    pub unjudged: Option<PidsUnjudged>,
    /// Of `dead_holders`, requests locked by a process that died inside
    /// start segment while their owner still runs: freed all the same, so
    /// the live owner's values are discarded and its later calls refused.
    pub live_owners_locked: u32,
}

/// What [`Recorder::expire_open`](crate::Recorder::expire_open) closed,
/// and what it could not judge. Serialises under its field names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ExpireReport {
    /// Requests this call closed (and counted in
    /// [`Counters::expired_requests`]): open for at least the bound, and
    /// closed by this call rather than by another close that got there
    /// first.
    pub expired: u32,
    /// Open requests left alone because this process cannot tell their
    /// age: every open request when it does not read the region's clock
    /// ([`RegionInfo::shares_clock`] is false), else those begun in
    /// another time namespace (their origin is on another clock).
    pub unjudged: u32,
}

impl ReclaimReport {
    /// Slots freed in all.
    pub fn freed(&self) -> u32 {
        self.dead_owners + self.dead_holders
    }
}

/// The region's counters: refused records by reason, dropped segments,
/// closed, reclaimed and expired requests, the fates of closed requests in the ring
/// (lost to its readers, acknowledged, given up, overwritten while taken),
/// malformed trace contexts. Serialises as the second part of a
/// [`RegionReport`], as its rows of [`METRICS`] name it: `refused` as an
/// object from each outcome's name to its count and `closed_given_up` as
/// one from each reason to its count.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counters {
    /// Count of each counted refusal, in [`Outcome::COUNTED`] order.
    pub refused: Vec<(Outcome, u64)>,
    /// Segments that left a request's window of kept segments.
    pub dropped_segments: u64,
    /// Requests closed, each counted once by the close that ended it.
    pub closed_requests: u64,
    /// Requests freed by a reclaim (their values are not in the histograms).
    pub reclaimed_requests: u64,
    /// Requests closed by an expiry
    /// ([`Recorder::expire_open`](crate::Recorder::expire_open)) because
    /// they stayed open longer than its bound; each counted once, by the
    /// expiry whose close ended it. They are closed as any request is, so
    /// [`Counters::closed_requests`] counts them too.
    pub expired_requests: u64,
    /// Closed requests that left the ring of closed requests before a
    /// reader took them whole: overwritten unread (no reader took them
    /// within a ring of later closes), torn, or given up unwritten (their
    /// closer died). Counted by whoever moved the entry on (the close that
    /// overwrote it, the reader that found it torn or gave it up), whether
    /// or not a reader runs.
    pub closed_lost: u64,
    /// Closed requests a registered reader
    /// ([`ClosedReader`](crate::ClosedReader)) acknowledged: its receiver
    /// has them.
    pub closed_acknowledged: u64,
    /// Closed requests a registered reader took and gave up on, by
    /// reason: its queue was full, its retries ran out, its receiver
    /// refused them.
    pub closed_given_up: GivenUp,
    /// Closed requests the ring overwrote while a registered reader had
    /// taken them and not yet settled them. Their reader still holds them
    /// unless it died: [`Counters::closed_settled_overwritten`] counts
    /// those it settled after all, and the difference is what readers
    /// took with them when they died.
    pub closed_overwritten_taken: u64,
    /// Of [`Counters::closed_overwritten_taken`], those their reader
    /// settled (acknowledged or gave up) afterwards.
    pub closed_settled_overwritten: u64,
    /// Malformed trace contexts ignored on the record path (their
    /// requests began in a new trace).
    pub bad_trace_contexts: u64,
}

/// Closed requests registered readers gave up on, by reason
/// ([`GiveUp`](crate::GiveUp)). Serialises as an object under these
/// names, as the `reason` label of the Prometheus family
/// `edgemark_closed_given_up_total` names them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct GivenUp {
    /// The reader's queue was full.
    pub queue_full: u64,
    /// Its retries ran out.
    pub retries_exhausted: u64,
    /// Its receiver refused them.
    pub refused: u64,
}

impl GivenUp {
    /// All of them.
    pub fn total(&self) -> u64 {
        self.queue_full
            .saturating_add(self.retries_exhausted)
            .saturating_add(self.refused)
    }

    /// Each reason's name and count, in field order.
    pub fn by_reason(&self) -> [(&'static str, u64); 3] {
        [
            ("queue_full", self.queue_full),
            ("retries_exhausted", self.retries_exhausted),
            ("refused", self.refused),
        ]
    }
}

/// One histogram of a region's closed requests: an edge, and an event or a
/// delta between two consecutive events.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct EdgeHistogram {
    /// The edge.
    pub edge: Edge,
    /// The event's name, or for a delta `"<from event>__to__<to event>"`.
    pub metric: String,
    /// For a delta, the two events it spans.
    pub delta: Option<(String, String)>,
    /// The counts.
    pub histogram: Histogram,
}

/// One histogram as read from a region: counts per bucket (not cumulative),
/// sum and count.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Histogram {
    /// Count of values in each bucket of [`crate::report::BUCKETS_MS`], then of the
    /// values above the last bound.
    pub buckets: Vec<u64>,
    /// Sum of the values, in milliseconds.
    pub sum_ms: f64,
    /// Number of values.
    pub count: u64,
}

impl Histogram {
    /// A histogram of these bucket counts (one per bound of
    /// [`crate::report::BUCKETS_MS`], then the rest), sum in milliseconds and count.
    pub fn new(buckets: Vec<u64>, sum_ms: f64, count: u64) -> Histogram {
        Histogram {
            buckets,
            sum_ms,
            count,
        }
    }

    /// `(upper bound in ms, cumulative count)` pairs, ending with
    /// `(+inf, count)`: the form Prometheus expects.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut total = 0u64;
        let mut out: Vec<(f64, u64)> = BUCKETS_MS
            .iter()
            .zip(&self.buckets)
            .map(|(le, n)| {
                total = total.saturating_add(*n);
                (*le, total)
            })
            .collect();
        out.push((f64::INFINITY, self.count));
        out
    }
}

/// Reads histogram `metric` of `edge`.
fn read_histogram(words: &[AtomicU64], l: &Layout, edge: usize, metric: usize) -> Histogram {
    let h = l.hist(edge, metric);
    // Relaxed: statistics; see `Proto::observe`, which adds to them.
    let get = |i: usize| words[i].load(Ordering::Relaxed);
    // Counts written by another process may be garbage: clamp them so that
    // no reader summing the buckets can overflow.
    let mut total = 0u64;
    let buckets = (0..HistWords::BUCKETS)
        .map(|i| {
            let v = get(h.bucket(i)).min(u64::MAX - total);
            total += v;
            v
        })
        .collect();
    Histogram {
        buckets,
        sum_ms: get(h.sum_us()) as f64 / 1000.0,
        count: get(h.count()),
    }
}

/// Reads the region's counters.
pub(crate) fn counters(w: &[AtomicU64]) -> Counters {
    // Relaxed: statistics.
    Counters {
        refused: Outcome::COUNTED
            .iter()
            .enumerate()
            .map(|(i, o)| (*o, w[H_COUNTERS + i].load(Ordering::Relaxed)))
            .collect(),
        dropped_segments: w[H_DROPPED].load(Ordering::Relaxed),
        closed_requests: w[H_CLOSED].load(Ordering::Relaxed),
        reclaimed_requests: w[H_RECLAIMED].load(Ordering::Relaxed),
        expired_requests: w[H_EXPIRED].load(Ordering::Relaxed),
        // Relaxed: a counter, as the others.
        closed_lost: w[H_RING_LOST].load(Ordering::Relaxed),
        closed_acknowledged: w[H_RING_ACKED].load(Ordering::Relaxed),
        closed_given_up: GivenUp {
            queue_full: w[H_RING_GAVE_UP_FULL].load(Ordering::Relaxed),
            retries_exhausted: w[H_RING_GAVE_UP_RETRIES].load(Ordering::Relaxed),
            refused: w[H_RING_GAVE_UP_REFUSED].load(Ordering::Relaxed),
        },
        closed_overwritten_taken: w[H_RING_OVERWRITTEN_TAKEN].load(Ordering::Relaxed),
        closed_settled_overwritten: w[H_RING_SETTLED_OVERWRITTEN].load(Ordering::Relaxed),
        bad_trace_contexts: w[H_BAD_TRACE].load(Ordering::Relaxed),
    }
}

/// Reads every histogram of the region: for each edge, one per schema
/// event, then one per delta between consecutive events.
pub(crate) fn histograms(
    w: &[AtomicU64],
    l: &Layout,
    schema: &Schema,
    edges: &[Edge],
) -> Vec<EdgeHistogram> {
    let names: Vec<&str> = schema.events().iter().map(|e| e.name()).collect();
    let n = names.len();
    let mut out = Vec::with_capacity(edges.len() * l.hists_per_edge());
    for (e, edge) in edges.iter().enumerate() {
        for m in 0..l.hists_per_edge() {
            let (metric, delta) = if m < n {
                (names[m].to_owned(), None)
            } else {
                let (a, b) = (names[m - n], names[m - n + 1]);
                (format!("{a}__to__{b}"), Some((a.to_owned(), b.to_owned())))
            };
            out.push(EdgeHistogram {
                edge: *edge,
                metric,
                delta,
                histogram: read_histogram(w, l, e, m),
            });
        }
    }
    out
}
