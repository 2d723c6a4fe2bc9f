//! What both views compute: quantiles from a region's histogram buckets, and
//! requests collected from snapshots, taken from a region or read back from
//! their JSON lines (the upstream recorder's
//! `metrics["stream_edge_metrics"]` form).

use anyhow::{Context, Result, anyhow, bail};
use edgemark::report::{BUCKETS_MS, EdgeHistogram, Histogram};
use edgemark::schema::{DomainId, EventId, HOST_MONOTONIC};
use edgemark::snapshot::Observed;
use edgemark::{Edge, Snapshot};
use serde_json::Value;

/// Short labels of the default schema's four events, in schema order.
const SHORT: [(&str, &str); 4] = [
    ("producer_first_nonempty_emit", "emit"),
    ("edge_first_send_complete", "send complete"),
    ("consumer_first_accept", "accept"),
    ("consumer_first_nonempty_output", "first output"),
];

/// The short label of an event name; other schemas' names stay as they are.
pub(crate) fn short_event(name: &str) -> &str {
    SHORT
        .iter()
        .find(|(long, _)| *long == name)
        .map_or(name, |(_, short)| short)
}

/// The short label of a histogram: its event, or its delta's two events
/// shown as `a -> b` (from the histogram's own fields, not its metric name).
pub(crate) fn short_metric(h: &EdgeHistogram) -> String {
    match &h.delta {
        Some((a, b)) => format!("{} -> {}", short_event(a), short_event(b)),
        None => short_event(&h.metric).to_owned(),
    }
}

/// The counts `now` has beyond `start`, bucket by bucket: the values closed
/// between two reads of one region (whose histograms only grow; a smaller
/// count is taken as none).
pub(crate) fn since(now: &Histogram, start: &Histogram) -> Histogram {
    let buckets: Vec<u64> = now
        .buckets
        .iter()
        .zip(start.buckets.iter().chain(std::iter::repeat(&0)))
        .map(|(n, s)| n.saturating_sub(*s))
        .collect();
    let count = buckets.iter().sum();
    Histogram::new(buckets, (now.sum_ms - start.sum_ms).max(0.0), count)
}

/// The `q`-quantile (0 < q <= 1) of the values a histogram counts, estimated
/// as Prometheus' `histogram_quantile` does: find the bucket holding the
/// value of rank `q * count` and interpolate linearly inside it (the first
/// bucket starts at 0). `None` when the histogram is empty; infinity when
/// the value lies above the last bound.
pub(crate) fn quantile(h: &Histogram, q: f64) -> Option<f64> {
    let total: u64 = h.buckets.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * total as f64).max(f64::MIN_POSITIVE);
    let mut below = 0u64;
    for (i, n) in h.buckets.iter().enumerate() {
        let upto = below + n;
        if (upto as f64) >= rank && *n > 0 {
            let Some(hi) = BUCKETS_MS.get(i) else {
                return Some(f64::INFINITY);
            };
            let lo = if i == 0 { 0.0 } else { BUCKETS_MS[i - 1] };
            return Some(lo + (hi - lo) * (rank - below as f64) / *n as f64);
        }
        below = upto;
    }
    Some(f64::INFINITY)
}

/// One edge segment of one request.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SegmentRow {
    /// The edge.
    pub(crate) edge: Edge,
    /// The segment index.
    pub(crate) segment: u32,
    /// One entry per event of [`Collected::events`], in that order, as the
    /// core keeps it (whole microseconds); its domain is a position in
    /// [`Collected::domains`].
    pub(crate) values: Vec<Option<Observed>>,
}

impl SegmentRow {
    /// `"from->to:segment"`, as snapshots key it.
    pub(crate) fn key(&self) -> String {
        format!("{}:{}", self.edge, self.segment)
    }

    /// Milliseconds from event `a` to event `b`: the core's rule
    /// ([`Observed::until`]).
    pub(crate) fn delta(&self, a: usize, b: usize) -> Option<f64> {
        let (x, y) = (self.values.get(a)?.as_ref()?, self.values.get(b)?.as_ref()?);
        x.until(*y)
    }
}

/// One request: one snapshot.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RequestRow {
    /// The line it came from (1-based), or its position for in-memory
    /// snapshots.
    pub(crate) line: usize,
    /// Its edge segments, in the order the snapshot lists them.
    pub(crate) segments: Vec<SegmentRow>,
}

/// Snapshots collected: the events and clock domains they name, and the
/// requests.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Collected {
    /// Event names, in schema order (from the `<event>_ms` fields of JSON
    /// lines: in the order first seen).
    pub(crate) events: Vec<String>,
    /// Clock-domain names, in the order first seen; the first is always
    /// the shared clock's, as in a region.
    pub(crate) domains: Vec<String>,
    /// Edges, in the order first seen.
    pub(crate) edges: Vec<Edge>,
    /// The requests, in input order.
    pub(crate) requests: Vec<RequestRow>,
}

impl Default for Collected {
    fn default() -> Collected {
        Collected::with_events(Vec::new())
    }
}

impl Collected {
    /// No requests yet, of a schema with `events`.
    pub(crate) fn with_events(events: Vec<String>) -> Collected {
        Collected {
            events,
            domains: vec![HOST_MONOTONIC.to_owned()],
            edges: Vec::new(),
            requests: Vec::new(),
        }
    }

    /// The name of a domain of [`Collected::domains`].
    pub(crate) fn domain_name(&self, d: DomainId) -> &str {
        self.domains
            .get(usize::from(d.0))
            .map_or("?", String::as_str)
    }

    /// The position of the domain `name`, added if new.
    fn domain_id(&mut self, name: &str) -> Result<DomainId> {
        let i = match self.domains.iter().position(|d| d == name) {
            Some(i) => i,
            None => {
                self.domains.push(name.to_owned());
                self.domains.len() - 1
            }
        };
        u8::try_from(i)
            .map(DomainId)
            .map_err(|_| anyhow!("more than 256 clock domains"))
    }

    /// The edge's place in [`Collected::edges`], added if new.
    fn see_edge(&mut self, edge: Edge) {
        if !self.edges.contains(&edge) {
            self.edges.push(edge);
        }
    }

    /// Adds a snapshot of a region whose events are [`Collected::events`],
    /// read through the core's accessors.
    pub(crate) fn push_snapshot(&mut self, line: usize, snap: &Snapshot) {
        let mut segments = Vec::with_capacity(snap.segments().len());
        for seg in snap.segments() {
            self.see_edge(seg.edge());
            let values = (0..self.events.len())
                .map(|i| {
                    // The schema's event count fits a `u8`.
                    let id = EventId(i as u8);
                    let o = seg.get(id)?;
                    let domain = self.domain_id(seg.domain(id).unwrap_or("?")).ok()?;
                    Some(Observed { domain, ..o })
                })
                .collect();
            segments.push(SegmentRow {
                edge: seg.edge(),
                segment: seg.segment_index(),
                values,
            });
        }
        self.requests.push(RequestRow { line, segments });
    }

    /// Reads JSON lines: one snapshot per line, either the snapshot map itself
    /// or an object holding it under `"stream_edge_metrics"`. Blank lines are
    /// skipped; anything else that is not a snapshot is an error naming its
    /// line.
    pub(crate) fn from_lines(text: &str) -> Result<Collected> {
        let mut out = Collected::default();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let v: Value =
                serde_json::from_str(line).map_err(|e| anyhow!("line {}: not JSON: {e}", i + 1))?;
            out.push(i + 1, &v)
                .with_context(|| format!("line {}", i + 1))?;
        }
        Ok(out)
    }

    /// Adds one snapshot's JSON form.
    fn push(&mut self, line: usize, v: &Value) -> Result<()> {
        let v = v.get("stream_edge_metrics").unwrap_or(v);
        let map = v
            .as_object()
            .ok_or_else(|| anyhow!("not a snapshot (a JSON object of edge segments)"))?;
        let mut segments = Vec::with_capacity(map.len());
        for (key, seg) in map {
            segments.push(self.segment(key, seg).with_context(|| key.clone())?);
        }
        // Events first seen in a later segment lengthen earlier ones too.
        for s in &mut segments {
            s.values.resize(self.events.len(), None);
        }
        self.requests.push(RequestRow { line, segments });
        Ok(())
    }

    fn segment(&mut self, key: &str, v: &Value) -> Result<SegmentRow> {
        let obj = v
            .as_object()
            .ok_or_else(|| anyhow!("not an edge segment object"))?;
        let num = |f: &str| {
            obj.get(f)
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| anyhow!("{f} is missing or not a whole number below 2^32"))
        };
        let edge = Edge::new(num("from_stage")?, num("to_stage")?);
        let segment = num("segment_index")?;
        if key != format!("{edge}:{segment}") {
            bail!("the key does not match from_stage, to_stage and segment_index");
        }
        self.see_edge(edge);
        let domains = obj.get("clock_domains").and_then(Value::as_object);
        let mut values: Vec<Option<Observed>> = vec![None; self.events.len()];
        for (field, value) in obj {
            let Some(event) = field.strip_suffix("_ms") else {
                continue;
            };
            let i = match self.events.iter().position(|e| e == event) {
                Some(i) => i,
                None => {
                    self.events.push(event.to_owned());
                    values.push(None);
                    self.events.len() - 1
                }
            };
            if value.is_null() {
                continue;
            }
            // Milliseconds made from whole microseconds, as the core keeps
            // them.
            let us = value
                .as_f64()
                .map(|ms| (ms * 1000.0).round())
                .filter(|us| us.is_finite() && *us >= 0.0)
                .ok_or_else(|| anyhow!("{field} is not a number of milliseconds"))?;
            let domain = domains
                .and_then(|d| d.get(event))
                .and_then(Value::as_str)
                .ok_or_else(|| anyhow!("{field} has no clock domain in clock_domains"))?;
            values[i] = Some(Observed {
                elapsed_us: us as u64,
                domain: self.domain_id(domain)?,
            });
        }
        Ok(SegmentRow {
            edge,
            segment,
            values,
        })
    }

    /// The values of a metric over segment 0 of `edge` of every request,
    /// and how many were left out: event `i` for `i < events` (only values
    /// in clock domain `domain`: another domain's values count from another
    /// origin), else the delta from event `i - events` to the next one
    /// (only where the core gives one: both in one domain, in order; the two
    /// events' domain may differ from request to request, as a duration
    /// means the same in each).
    pub(crate) fn metric_values(
        &self,
        edge: Edge,
        metric: usize,
        domain: DomainId,
    ) -> (Vec<f64>, usize) {
        let n = self.events.len();
        let mut left_out = 0;
        let values = self
            .requests
            .iter()
            .filter_map(|r| r.segments.iter().find(|s| s.edge == edge && s.segment == 0))
            .filter_map(|s| {
                if metric < n {
                    let v = s.values[metric].as_ref()?;
                    if v.domain != domain {
                        left_out += 1;
                        return None;
                    }
                    Some(v.elapsed_ms())
                } else {
                    s.delta(metric - n, metric - n + 1)
                }
            })
            .collect();
        (values, left_out)
    }

    /// The names of the metrics [`Collected::metric_values`] takes, in
    /// order: every event, then every delta between consecutive events.
    pub(crate) fn metric_names(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .events
            .iter()
            .map(|e| short_event(e).to_owned())
            .collect();
        for w in self.events.windows(2) {
            out.push(format!("{} -> {}", short_event(&w[0]), short_event(&w[1])));
        }
        out
    }
}

/// The nearest-rank percentile of sorted values (the demo's table and the
/// report page share it).
pub(crate) fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(buckets: &[u64]) -> Histogram {
        let mut b = buckets.to_vec();
        b.resize(BUCKETS_MS.len() + 1, 0);
        let count = b.iter().sum();
        Histogram::new(b, 0.0, count)
    }

    #[test]
    fn quantiles_interpolate_inside_the_bucket_that_holds_the_rank() {
        // Ten values in (1, 2.5]: the median is half way through it.
        let h = hist(&[0, 0, 10]);
        assert_eq!(quantile(&h, 0.5), Some(1.75));
        assert_eq!(quantile(&h, 1.0), Some(2.5));
        assert_eq!(quantile(&hist(&[]), 0.5), None);
        let mut over = hist(&[1]);
        *over.buckets.last_mut().unwrap() = 9;
        assert_eq!(quantile(&over, 0.99), Some(f64::INFINITY));
        assert_eq!(quantile(&over, 0.05), Some(0.25));
    }

    #[test]
    fn since_subtracts_the_histogram_read_at_start() {
        let d = since(&hist(&[3, 5]), &hist(&[1, 5]));
        assert_eq!(d.buckets[..2], [2, 0]);
        assert_eq!(d.count, 2);
    }

    #[test]
    fn lines_keep_domains_and_refuse_what_is_not_a_snapshot() {
        let text = r#"{"0->1:0":{"from_stage":0,"to_stage":1,"segment_index":0,"first_chunk_seq":0,"clock_domains":{"producer_first_nonempty_emit":"host_monotonic","edge_first_send_complete":"sender"},"producer_first_nonempty_emit_ms":1.5,"edge_first_send_complete_ms":2.0,"consumer_first_accept_ms":null,"consumer_first_nonempty_output_ms":null}}

{}"#;
        let c = Collected::from_lines(text).unwrap();
        assert_eq!(c.requests.len(), 2);
        assert_eq!(c.events.len(), 4);
        let s = &c.requests[0].segments[0];
        assert_eq!(c.domain_name(s.values[1].unwrap().domain), "sender");
        assert_eq!(s.values[0].unwrap().elapsed_us, 1500);
        assert_eq!(s.delta(0, 1), None, "different clock domains");
        assert_eq!(c.requests[1].line, 3);
        let err = Collected::from_lines("{}\n[1]").unwrap_err();
        assert!(format!("{err:#}").starts_with("line 2:"), "{err:#}");
    }

    #[test]
    fn snapshots_are_collected_as_their_json_lines_are() {
        use edgemark::{Event::*, Mark, Recorder};
        let rec = Recorder::builder()
            .edge(0, 1)
            .edge(1, 2)
            .create_in_memory()
            .unwrap();
        let (e01, e12) = (Edge::new(0, 1), Edge::new(1, 2));
        let mut snaps = Vec::new();
        for i in 0..3u32 {
            let t = rec.begin().unwrap();
            let ms = f64::from(i);
            let at = |mark, v, d| rec.record_elapsed(t, mark, v, d);
            at(
                Mark::new(e01, ProducerFirstNonemptyEmit),
                ms + 0.25,
                "host_monotonic",
            );
            at(
                Mark::new(e01, EdgeFirstSendComplete),
                ms + 1.5,
                "host_monotonic",
            );
            at(Mark::new(e12, ConsumerFirstAccept), ms + 3.125, "receiver");
            if i == 2 {
                rec.start_segment(t, e01, 1);
                at(
                    Mark::new(e01, ProducerFirstNonemptyEmit).segment(1),
                    9.0,
                    "sender",
                );
            }
            snaps.push(rec.close(t));
        }
        let events: Vec<String> = rec
            .schema()
            .unwrap()
            .events()
            .iter()
            .map(|e| e.name().to_owned())
            .collect();
        let mut direct = Collected::with_events(events);
        for (i, s) in snaps.iter().enumerate() {
            direct.push_snapshot(i + 1, s);
        }
        let lines: Vec<String> = snaps
            .iter()
            .map(|s| serde_json::to_string(s).unwrap())
            .collect();
        let read = Collected::from_lines(&lines.join("\n")).unwrap();
        assert_eq!(direct, read);
        assert_eq!(direct.domains, ["host_monotonic", "receiver", "sender"]);
        assert_eq!(direct.edges, [e01, e12]);
        // Deltas are the core's: the same value as `elapsed_between`.
        let seg = snaps[1].segment(e01, 0).unwrap();
        assert_eq!(
            direct.requests[1].segments[0].delta(0, 1),
            seg.elapsed_between(ProducerFirstNonemptyEmit, EdgeFirstSendComplete)
        );
        assert_eq!(direct.requests[1].segments[0].delta(0, 1), Some(1.25));
        let (values, left_out) = direct.metric_values(e12, 2, DomainId(0));
        assert_eq!(
            (values.len(), left_out),
            (0, 3),
            "accepts are in another domain"
        );
    }
}
