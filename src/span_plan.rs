//! The span plan: how a request's values become span events, defined once
//! for every exporter (`edgemark-otlp`'s spans, the Python package's
//! `edgemark.otel.add_snapshot`).
//!
//! Each edge segment is one span. Each recorded event of it is one span
//! event, named for the event: in the region's shared clock domain
//! ([`HOST_MONOTONIC`]) at its absolute time, the request's wall-clock
//! origin plus the elapsed time; in any other domain (measured elsewhere)
//! placed at the origin, its relative time kept. Each event carries the
//! delta from the previous recorded event of the segment, only when both
//! are in one clock domain and in order ([`Observed::until`], the rule
//! histograms share): values of two domains are never subtracted. Events
//! are in time order, schema order among equal times. The segment span
//! runs from its first to its last event on the host's clock (at the origin
//! if it has none).

use crate::schema::DomainId;
use crate::schema::HOST_MONOTONIC;
use crate::snapshot::{EdgeSegment, Observed, Snapshot};
use crate::trace::ClosedRequest;

/// One span event of a segment span.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct PlannedEvent {
    /// The event's name (`producer_first_nonempty_emit`, ...).
    pub name: String,
    /// Its elapsed time from the request's origin.
    pub elapsed_ms: f64,
    /// The clock domain it was measured in.
    pub clock_domain: String,
    /// Where it sits: nanoseconds since the Unix epoch.
    pub at_unix_ns: u64,
    /// Whether it sits at the origin because it was measured in a foreign
    /// clock domain.
    pub placed_at_origin: bool,
    /// The previous recorded event of the segment and the milliseconds
    /// since it, when both are in one clock domain and in order.
    pub since_previous: Option<(String, f64)>,
}

/// The plan of one segment span.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct SegmentPlan {
    /// Its events, in time order (schema order among equal times).
    pub events: Vec<PlannedEvent>,
    /// Where the span starts: its first event on the host's clock, or the
    /// origin.
    pub start_unix_ns: u64,
    /// Where it ends: its last event on the host's clock, or the origin.
    pub end_unix_ns: u64,
    /// The clock domains of its events, in the order first met.
    pub clock_domains: Vec<String>,
}

/// Plans one segment from its recorded events in schema order, each
/// `(name, elapsed milliseconds, clock domain)` as a snapshot shows them,
/// for a request whose origin is `origin_unix_ns`.
pub fn plan_events<'a>(
    events: impl IntoIterator<Item = (&'a str, f64, &'a str)>,
    origin_unix_ns: u64,
) -> SegmentPlan {
    let mut domains: Vec<String> = Vec::new();
    let mut out: Vec<PlannedEvent> = Vec::new();
    let (mut first, mut last) = (u64::MAX, 0u64);
    let mut previous: Option<(&str, Observed)> = None;
    for (name, ms, domain) in events {
        let us = (ms * 1000.0).round();
        if !(us.is_finite() && us >= 0.0) {
            continue;
        }
        let index = match domains.iter().position(|d| d == domain) {
            Some(i) => i,
            None => {
                domains.push(domain.to_owned());
                domains.len() - 1
            }
        };
        let observed = Observed {
            elapsed_us: us as u64,
            domain: DomainId(index.min(255) as u8),
        };
        let host = domain == HOST_MONOTONIC;
        let at = if host {
            let t = origin_unix_ns.saturating_add(observed.elapsed_us.saturating_mul(1000));
            first = first.min(t);
            last = last.max(t);
            t
        } else {
            origin_unix_ns
        };
        let since_previous =
            previous.and_then(|(prev, p)| p.until(observed).map(|d| (prev.to_owned(), d)));
        previous = Some((name, observed));
        out.push(PlannedEvent {
            name: name.to_owned(),
            elapsed_ms: observed.elapsed_ms(),
            clock_domain: domain.to_owned(),
            at_unix_ns: at,
            placed_at_origin: !host,
            since_previous,
        });
    }
    if first == u64::MAX {
        (first, last) = (origin_unix_ns, origin_unix_ns);
    }
    // Stable: schema order among equal times.
    out.sort_by_key(|e| e.at_unix_ns);
    SegmentPlan {
        events: out,
        start_unix_ns: first,
        end_unix_ns: last,
        clock_domains: domains,
    }
}

impl EdgeSegment {
    /// This segment's span plan, for a request whose origin is
    /// `origin_unix_ns` ([`plan_events`] over its recorded events).
    pub fn span_plan(&self, origin_unix_ns: u64) -> SegmentPlan {
        let events: Vec<(&str, f64, &str)> = self
            .recorded()
            .map(|(name, o, domain)| (name, o.elapsed_ms(), domain))
            .collect();
        plan_events(events, origin_unix_ns)
    }
}

impl Snapshot {
    /// The span plan of each of its segments, in its order.
    pub fn span_plan(&self, origin_unix_ns: u64) -> Vec<SegmentPlan> {
        self.segments()
            .iter()
            .map(|s| s.span_plan(origin_unix_ns))
            .collect()
    }
}

impl ClosedRequest {
    /// The span plan of each of its segments, placed at its own origin.
    pub fn span_plan(&self) -> Vec<SegmentPlan> {
        self.snapshot().span_plan(self.origin_unix_ns())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_values_are_placed_foreign_ones_at_the_origin_and_deltas_stay_in_one_domain() {
        let origin = 1_000_000_000;
        let p = plan_events(
            [
                ("a", 1.0, HOST_MONOTONIC),
                ("b", 0.75, "worker"),
                ("c", 3.25, HOST_MONOTONIC),
                ("d", 2.0, HOST_MONOTONIC),
            ],
            origin,
        );
        let names: Vec<&str> = p.events.iter().map(|e| e.name.as_str()).collect();
        // b at the origin, then a, d, c by time.
        assert_eq!(names, ["b", "a", "d", "c"]);
        let by = |n: &str| p.events.iter().find(|e| e.name == n).unwrap();
        assert_eq!(by("a").at_unix_ns, origin + 1_000_000);
        assert!(by("b").placed_at_origin && by("b").at_unix_ns == origin);
        // a -> b: two domains; b -> c: two domains; c -> d: backwards.
        assert_eq!(by("b").since_previous, None);
        assert_eq!(by("c").since_previous, None);
        assert_eq!(by("d").since_previous, None);
        assert_eq!(
            (p.start_unix_ns, p.end_unix_ns),
            (origin + 1_000_000, origin + 3_250_000)
        );
        assert_eq!(p.clock_domains, [HOST_MONOTONIC, "worker"]);
        let q = plan_events([("a", 1.5, "w"), ("b", 4.0, "w")], origin);
        assert_eq!(q.events[1].since_previous, Some(("a".to_owned(), 2.5)));
        assert_eq!((q.start_unix_ns, q.end_unix_ns), (origin, origin));
    }
}
