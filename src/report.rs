//! The read-only reports on a region: its geometry and identity, a
//! request's owner, what a reclaim freed, the counters, and the histograms
//! of closed requests with the code that reads them. Plain values with no
//! reference into the region.
//!
//! The histograms live in the region, between the header and the slots.
//! The close that ends a request (the one holder of its `Closing` lock, in
//! `protocol/control.rs`) adds each of its final values, and each delta
//! between consecutive events of one segment, to them. Closed requests
//! therefore reach any reader, such as the Prometheus exporter, as monotonic
//! counters in the region: each is counted exactly once, however often a
//! reader polls, and a reader that restarts loses and repeats nothing.
//! Nothing here runs on the record path.

use crate::clock::ClockIdentity;
pub use crate::layout::BUCKETS_MS;
use crate::layout::{
    H_BAD_TRACE, H_CLOSED, H_COUNTERS, H_DROPPED, H_RECLAIMED, H_RING_ACKED, H_RING_GAVE_UP_FULL,
    H_RING_GAVE_UP_REFUSED, H_RING_GAVE_UP_RETRIES, H_RING_LOST, H_RING_OVERWRITTEN_TAKEN,
    H_RING_SETTLED_OVERWRITTEN, HistWords, Layout,
};
use crate::mark::Edge;
use crate::outcome::Outcome;
use crate::schema::Schema;
use crate::sync::{AtomicU64, Ordering};

/// The geometry and identity of a region, as its header declares them.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegionInfo {
    /// The region's random ID (tokens carry it).
    pub region_id: u64,
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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

impl ReclaimReport {
    /// Slots freed in all.
    pub fn freed(&self) -> u32 {
        self.dead_owners + self.dead_holders
    }
}

/// The region's counters: refused records by reason, dropped segments,
/// closed and reclaimed requests.
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
    /// Closed requests that left the ring of closed requests unread:
    /// overwritten (its reader fell a ring behind) or torn.
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
/// ([`GiveUp`](crate::GiveUp)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
        self.queue_full + self.retries_exhausted + self.refused
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
