//! Histograms of closed requests, kept in the region.
//!
//! The close that ends a request (the one holder of its `Closing` lock) adds
//! each of its final values, and each delta between consecutive events of
//! one segment, to per-edge histograms between the header and the slots.
//! Closed requests therefore reach any reader, such as the Prometheus
//! exporter, as monotonic counters in the region: each is counted exactly
//! once, however often a reader polls, and a reader that restarts loses and
//! repeats nothing. Nothing here runs on the record path.

use crate::layout::{Layout, BUCKETS_MS, HIST_WORDS, H_CLOSED};
use crate::protocol::{Proto, RawSnapshot};
use crate::sync::Ordering;

const BUCKET_US: [u64; BUCKETS_MS.len()] = {
    let mut out = [0u64; BUCKETS_MS.len()];
    let mut i = 0;
    while i < out.len() {
        out[i] = (BUCKETS_MS[i] * 1000.0) as u64;
        i += 1;
    }
    out
};

/// The bucket of a value in microseconds.
fn bucket(us: u64) -> usize {
    BUCKET_US
        .iter()
        .position(|b| us <= *b)
        .unwrap_or(BUCKET_US.len())
}

impl Proto<'_> {
    fn observe(&self, edge: usize, metric: usize, us: u64) {
        let base = self.layout.hist(edge, metric);
        // Relaxed: independent statistics counters; readers need no order
        // among them (a scrape may see a count one ahead of its sum).
        self.words[base + bucket(us)].fetch_add(1, Ordering::Relaxed);
        self.words[base + BUCKETS_MS.len() + 1].fetch_add(us, Ordering::Relaxed);
        self.words[base + BUCKETS_MS.len() + 2].fetch_add(1, Ordering::Relaxed);
    }

    /// Adds a closed request's final values to the histograms and counts it.
    pub(crate) fn account_closed(&self, snap: &RawSnapshot) {
        let events = self.layout.events as usize;
        for seg in snap.segments.iter().filter(|s| !s.corrupt) {
            for (ev, v) in seg.values.iter().enumerate() {
                if let Some(v) = v {
                    self.observe(seg.edge, ev, v.elapsed_us);
                }
            }
            for ev in 0..events.saturating_sub(1) {
                if let (Some(a), Some(b)) = (seg.values.get(ev), seg.values.get(ev + 1)) {
                    if a.domain == b.domain && b.elapsed_us >= a.elapsed_us {
                        self.observe(seg.edge, events + ev, b.elapsed_us - a.elapsed_us);
                    }
                }
            }
        }
        // Relaxed: a statistics counter.
        self.words[H_CLOSED].fetch_add(1, Ordering::Relaxed);
    }
}

/// One histogram as read from a region: counts per bucket (not cumulative),
/// sum and count.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    /// Count of values in each bucket of [`crate::BUCKETS_MS`], then of the
    /// values above the last bound.
    pub buckets: Vec<u64>,
    /// Sum of the values, in milliseconds.
    pub sum_ms: f64,
    /// Number of values.
    pub count: u64,
}

impl Histogram {
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

pub(crate) fn read(
    words: &[crate::sync::AtomicU64],
    l: &Layout,
    edge: usize,
    metric: usize,
) -> Histogram {
    let base = l.hist(edge, metric);
    // Relaxed: statistics, see `observe`.
    let get = |i: usize| words[base + i].load(Ordering::Relaxed);
    // Counts written by another process may be garbage: clamp them so that
    // no reader summing the buckets can overflow.
    let mut total = 0u64;
    let buckets = (0..=BUCKETS_MS.len())
        .map(|i| {
            let v = get(i).min(u64::MAX - total);
            total += v;
            v
        })
        .collect();
    Histogram {
        buckets,
        sum_ms: get(BUCKETS_MS.len() + 1) as f64 / 1000.0,
        count: get(HIST_WORDS - 1),
    }
}
