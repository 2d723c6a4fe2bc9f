//! The catalogue of a region's counters and gauges: [`METRICS`], one row
//! each, with its key, its Prometheus family, its help text, its kind and
//! how to read it from a report. The serialization of [`Counters`] and
//! [`Occupancy`], the Prometheus text ([`crate::prometheus`]) and
//! `edgemark inspect` all iterate it.

use serde::{Serialize, Serializer};

use super::{Counters, Occupancy};

/// What a [`Metric`] is, as Prometheus types it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MetricKind {
    /// A count since the region was created, that only grows: Prometheus
    /// names its samples `<name>_total`.
    Counter,
    /// How many there are now, from one pass over the slots or the ring.
    Gauge,
}

/// The value of one [`Metric`] in one report: one number, or one per value
/// of its label ([`Metric::label`]), in a fixed order.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MetricValue {
    /// One number.
    One(u64),
    /// One number per label value, each value's name with its count.
    ByLabel(Vec<(&'static str, u64)>),
}

impl MetricValue {
    /// The number, or the sum of the numbers per label (saturating).
    pub fn total(&self) -> u64 {
        match self {
            MetricValue::One(n) => *n,
            MetricValue::ByLabel(v) => v.iter().fold(0u64, |t, (_, n)| t.saturating_add(*n)),
        }
    }
}

/// As the number, or as an object from each label value to its count.
impl Serialize for MetricValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            MetricValue::One(n) => s.serialize_u64(*n),
            MetricValue::ByLabel(v) => s.collect_map(v.iter().map(|(k, n)| (*k, *n))),
        }
    }
}

/// Which part of a [`RegionReport`] a [`Metric`] reads, and how.
#[derive(Clone, Copy, Debug)]
enum Read {
    /// A counter of [`Counters`].
    Counters(fn(&Counters) -> MetricValue),
    /// A gauge of [`Occupancy`].
    Occupancy(fn(&Occupancy) -> MetricValue),
}

/// One counter or gauge of a region's report, as every output names it: a
/// row of [`METRICS`].
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Metric {
    /// Its key in the report's JSON (`edgemark inspect --json`), in Python's
    /// `Region.report()` and `Region.counters()`, and in `inspect`'s text.
    pub key: &'static str,
    /// Its Prometheus family: a counter's samples are `<prometheus>_total`,
    /// a gauge's `<prometheus>`.
    pub prometheus: &'static str,
    /// What it counts: the Prometheus `HELP` line and `inspect`'s text.
    pub help: &'static str,
    /// Counter or gauge.
    pub kind: MetricKind,
    /// The label of a metric with one number per reason (`Some("reason")`),
    /// whose value is [`MetricValue::ByLabel`]; `None` for one number.
    pub label: Option<&'static str>,
    read: Read,
}

impl Metric {
    /// Its value in a report of these counters and this occupancy.
    pub fn value(&self, counters: &Counters, occupancy: &Occupancy) -> MetricValue {
        match self.read {
            Read::Counters(f) => f(counters),
            Read::Occupancy(f) => f(occupancy),
        }
    }

    /// Whether it is one of [`Counters`] (else of [`Occupancy`]).
    pub fn in_counters(&self) -> bool {
        matches!(self.read, Read::Counters(_))
    }
}

/// The region's counters ([`Counters`]) and gauges ([`Occupancy`]), in the
/// order of the report's JSON: the one table that the report's
/// serialization, the Prometheus text ([`crate::prometheus`]) and
/// `edgemark inspect` iterate, so a new counter is one row here (and a
/// field of its part). `docs/cli.md` lists them, and which loss each
/// counts.
pub const METRICS: &[Metric] = &[
    Metric {
        key: "refused",
        prometheus: "edgemark_refused_records",
        help: "Records refused, and begins refused on a full region, by reason (duplicates and \
               not-meaningful payloads are not counted)",
        kind: MetricKind::Counter,
        label: Some("reason"),
        read: Read::Counters(|c| {
            MetricValue::ByLabel(c.refused.iter().map(|(o, n)| (o.name(), *n)).collect())
        }),
    },
    Metric {
        key: "dropped_segments",
        prometheus: "edgemark_dropped_segments",
        help: "Segments that left a request's window of kept segments (their values with them)",
        kind: MetricKind::Counter,
        label: None,
        read: Read::Counters(|c| MetricValue::One(c.dropped_segments)),
    },
    Metric {
        key: "closed_requests",
        prometheus: "edgemark_closed_requests",
        help: "Requests closed",
        kind: MetricKind::Counter,
        label: None,
        read: Read::Counters(|c| MetricValue::One(c.closed_requests)),
    },
    Metric {
        key: "reclaimed_requests",
        prometheus: "edgemark_reclaimed_requests",
        help: "Requests of dead owners freed by a reclaim (their values are not in the histograms)",
        kind: MetricKind::Counter,
        label: None,
        read: Read::Counters(|c| MetricValue::One(c.reclaimed_requests)),
    },
    Metric {
        key: "expired_requests",
        prometheus: "edgemark_expired_requests",
        help: "Requests closed by an expiry because they stayed open longer than its bound (their \
               closer died or never saw them); counted in the closed requests too",
        kind: MetricKind::Counter,
        label: None,
        read: Read::Counters(|c| MetricValue::One(c.expired_requests)),
    },
    Metric {
        key: "closed_lost",
        prometheus: "edgemark_closed_lost",
        help: "Closed requests that left the ring of closed requests before a reader took them \
               whole: overwritten unread (no reader, or readers a ring behind), torn, or given up \
               unwritten (their closer died)",
        kind: MetricKind::Counter,
        label: None,
        read: Read::Counters(|c| MetricValue::One(c.closed_lost)),
    },
    Metric {
        key: "closed_acknowledged",
        prometheus: "edgemark_closed_acknowledged",
        help: "Closed requests a registered reader of the ring acknowledged (its receiver has them)",
        kind: MetricKind::Counter,
        label: None,
        read: Read::Counters(|c| MetricValue::One(c.closed_acknowledged)),
    },
    Metric {
        key: "closed_given_up",
        prometheus: "edgemark_closed_given_up",
        help: "Closed requests a registered reader of the ring took and gave up on, by reason: \
               its queue was full, its retries ran out, its receiver refused them",
        kind: MetricKind::Counter,
        label: Some("reason"),
        read: Read::Counters(|c| MetricValue::ByLabel(c.closed_given_up.by_reason().to_vec())),
    },
    Metric {
        key: "closed_overwritten_taken",
        prometheus: "edgemark_closed_overwritten_taken",
        help: "Closed requests the ring overwrote while a registered reader held them unsettled",
        kind: MetricKind::Counter,
        label: None,
        read: Read::Counters(|c| MetricValue::One(c.closed_overwritten_taken)),
    },
    Metric {
        key: "closed_settled_overwritten",
        prometheus: "edgemark_closed_settled_overwritten",
        help: "Of those overwritten while held, the ones their reader settled afterwards \
               (the rest left with readers that died)",
        kind: MetricKind::Counter,
        label: None,
        read: Read::Counters(|c| MetricValue::One(c.closed_settled_overwritten)),
    },
    Metric {
        key: "bad_trace_contexts",
        prometheus: "edgemark_bad_trace_contexts",
        help: "Malformed trace contexts ignored at begin (their requests began in a new trace)",
        kind: MetricKind::Counter,
        label: None,
        read: Read::Counters(|c| MetricValue::One(c.bad_trace_contexts)),
    },
    Metric {
        key: "open_requests",
        prometheus: "edgemark_open_requests",
        help: "Requests open now",
        kind: MetricKind::Gauge,
        label: None,
        read: Read::Occupancy(|o| MetricValue::One(u64::from(o.open_requests))),
    },
    Metric {
        key: "free_slots",
        prometheus: "edgemark_free_slots",
        help: "Slots free now",
        kind: MetricKind::Gauge,
        label: None,
        read: Read::Occupancy(|o| MetricValue::One(u64::from(o.free_slots))),
    },
    Metric {
        key: "closed_unread",
        prometheus: "edgemark_closed_unread",
        help: "Entries of the ring of closed requests published and not yet taken by a reader",
        kind: MetricKind::Gauge,
        label: None,
        read: Read::Occupancy(|o| MetricValue::One(o.closed_unread)),
    },
    Metric {
        key: "closed_unacknowledged",
        prometheus: "edgemark_closed_unacknowledged",
        help: "Entries of the ring a registered reader took and has not yet acknowledged or given up",
        kind: MetricKind::Gauge,
        label: None,
        read: Read::Occupancy(|o| MetricValue::One(o.closed_unacknowledged)),
    },
    Metric {
        key: "closed_readers",
        prometheus: "edgemark_closed_readers",
        help: "Readers registered in the ring's reader table",
        kind: MetricKind::Gauge,
        label: None,
        read: Read::Occupancy(|o| MetricValue::One(o.closed_readers)),
    },
];

/// Under the keys of its rows of [`METRICS`], in their order.
impl Serialize for Counters {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let none = Occupancy::default();
        s.collect_map(
            METRICS
                .iter()
                .filter(|m| m.in_counters())
                .map(|m| (m.key, m.value(self, &none))),
        )
    }
}

/// Under the keys of its rows of [`METRICS`], in their order.
impl Serialize for Occupancy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let none = Counters::default();
        s.collect_map(
            METRICS
                .iter()
                .filter(|m| !m.in_counters())
                .map(|m| (m.key, m.value(&none, self))),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::Outcome;
    use crate::report::GivenUp;

    /// A report with a distinct value in every field. Named field by field,
    /// without `..`: a field added to [`Counters`] or [`Occupancy`] does not
    /// compile here until it has a value, and then fails the test below
    /// until it has a row of [`METRICS`].
    fn distinct() -> (Counters, Occupancy, Vec<u64>) {
        let refused: Vec<(Outcome, u64)> = Outcome::COUNTED
            .iter()
            .zip(100..)
            .map(|(o, n)| (*o, n))
            .collect();
        let c = Counters {
            refused: refused.clone(),
            dropped_segments: 1,
            closed_requests: 2,
            reclaimed_requests: 3,
            expired_requests: 12,
            closed_lost: 4,
            closed_acknowledged: 5,
            closed_given_up: GivenUp {
                queue_full: 6,
                retries_exhausted: 7,
                refused: 8,
            },
            closed_overwritten_taken: 9,
            closed_settled_overwritten: 10,
            bad_trace_contexts: 11,
        };
        let o = Occupancy {
            open_requests: 21,
            free_slots: 22,
            closed_unread: 23,
            closed_unacknowledged: 24,
            closed_readers: 25,
        };
        let mut all: Vec<u64> = refused.iter().map(|(_, n)| *n).collect();
        all.extend(1..=12);
        all.extend(21..=25);
        (c, o, all)
    }

    #[test]
    fn every_field_of_the_counters_and_the_occupancy_is_one_row() {
        let (c, o, mut all) = distinct();
        let mut shown: Vec<u64> = METRICS
            .iter()
            .flat_map(|m| match m.value(&c, &o) {
                MetricValue::One(n) => vec![n],
                MetricValue::ByLabel(by) => by.into_iter().map(|(_, n)| n).collect(),
            })
            .collect();
        shown.sort_unstable();
        all.sort_unstable();
        assert_eq!(shown, all, "each value in exactly one row");
        for (i, m) in METRICS.iter().enumerate() {
            let others = &METRICS[..i];
            assert!(others.iter().all(|p| p.key != m.key), "{}", m.key);
            assert!(
                others.iter().all(|p| p.prometheus != m.prometheus),
                "{}",
                m.prometheus
            );
            assert!(m.prometheus.starts_with("edgemark_"), "{}", m.prometheus);
            assert!(!m.prometheus.ends_with("_total"), "{}", m.prometheus);
            assert!(!m.help.is_empty() && !m.help.contains('\n'), "{}", m.key);
            let labelled = matches!(m.value(&c, &o), MetricValue::ByLabel(_));
            assert_eq!(labelled, m.label.is_some(), "{}", m.key);
            // A counter of the counters, a gauge of the occupancy.
            assert_eq!(m.in_counters(), m.kind == MetricKind::Counter, "{}", m.key);
        }
    }

    #[test]
    fn the_counters_and_the_occupancy_serialize_as_their_rows() {
        let (c, o, _) = distinct();
        let counters = serde_json::to_value(&c).unwrap();
        let occupancy = serde_json::to_value(o).unwrap();
        let keys = |v: &serde_json::Value| -> Vec<String> {
            v.as_object().unwrap().keys().cloned().collect()
        };
        let rows = |counters: bool| -> Vec<String> {
            METRICS
                .iter()
                .filter(|m| m.in_counters() == counters)
                .map(|m| m.key.to_owned())
                .collect()
        };
        assert_eq!(keys(&counters), rows(true));
        assert_eq!(keys(&occupancy), rows(false));
        assert_eq!(counters["refused"]["stale_segment"], 100);
        assert_eq!(counters["closed_given_up"]["retries_exhausted"], 7);
        assert_eq!(counters["closed_lost"], 4);
        assert_eq!(occupancy["closed_readers"], 25);
    }
}
