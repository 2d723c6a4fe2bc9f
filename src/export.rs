//! The Prometheus encoding of a region (feature `prometheus`, on by
//! default), for any HTTP server to answer `/metrics` with.
//!
//! Every call reads the region afresh: the histograms of closed requests
//! (kept in the region by the close that ended each request, so each request
//! is counted exactly once however often it is scraped, and nothing is lost
//! or repeated when the server restarts), the refusal counters, and a sweep
//! of the slots for the open-request and free-slot gauges. Labels are
//! bounded: an edge, an event, a refusal reason; never a request. Times are
//! in seconds, as Prometheus names them.
//!
//! The text is encoded by `prometheus-client`, in one of the two formats
//! Prometheus reads: OpenMetrics, or the classic text format that older
//! scrapers and `promtool check metrics` read. [`Format::negotiate`] picks
//! one from a request's `Accept` header. The `edgemark export` command serves
//! it; an orchestrator that already runs a server serves it from there:
//!
//! ```
//! use edgemark::export::{self, Format};
//! let rec = edgemark::Recorder::builder().edge(0, 1).create_in_memory()?;
//! let t = rec.begin().expect("a free slot");
//!
//! // In the `/metrics` handler of whatever server the process runs:
//! let accept = Some("text/plain;version=0.0.4"); // the request's Accept header
//! let format = Format::negotiate(accept);
//! let body = export::render(&rec, format);
//! let content_type = format.content_type();
//! assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
//! assert!(body.contains("edgemark_open_requests 1"));
//! assert!(body.contains("# TYPE edgemark_closed_requests_total counter"));
//! rec.close(t);
//! assert!(export::render(&rec, format).contains("edgemark_closed_requests_total 1"));
//! assert!(export::render(&rec, Format::OpenMetrics).ends_with("# EOF\n"));
//! # Ok::<(), edgemark::CreateError>(())
//! ```

use std::collections::HashSet;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

use crate::Viewer;

/// A text format Prometheus reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0, which Prometheus asks for first.
    OpenMetrics,
    /// The classic Prometheus text format 0.0.4 (what `promtool check
    /// metrics` and scrapers that ask for no format read).
    Text,
}

impl Format {
    /// The format a request asks for by its `Accept` header: OpenMetrics if
    /// it names `application/openmetrics-text`, else the classic text.
    pub fn negotiate(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Text,
        }
    }

    /// The `Content-Type` of a response in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// The region's metrics now, as text in `format`.
pub fn render(recorder: &Viewer, format: Format) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = render_into(recorder, format, &mut out);
    out
}

/// Writes the region's metrics now into `out`, as text in `format`; fails
/// only if `out` does.
pub fn render_into(
    recorder: &Viewer,
    format: Format,
    out: &mut impl std::fmt::Write,
) -> std::fmt::Result {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(RegionCollector(recorder.clone())));
    let mut open_metrics = String::new();
    prometheus_client::encoding::text::encode(&mut open_metrics, &registry)?;
    match format {
        Format::OpenMetrics => out.write_str(&open_metrics),
        Format::Text => to_classic(&open_metrics, out),
    }
}

/// The classic text form of `prometheus-client`'s OpenMetrics text, for the
/// metric types this module writes (counters, gauges, histograms, with no
/// exemplars or creation times). The two differ in three ways: a counter's
/// HELP and TYPE lines name the family with its `_total` suffix, as its
/// samples do; `# UNIT` lines are not part of it; there is no `# EOF`.
fn to_classic(open_metrics: &str, out: &mut impl std::fmt::Write) -> std::fmt::Result {
    let counters: HashSet<&str> = open_metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    for line in open_metrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let described = ["# HELP ", "# TYPE "].into_iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            counters.contains(name).then_some((p, name, tail))
        });
        match described {
            Some((p, name, tail)) => writeln!(out, "{p}{name}_total {tail}")?,
            None => writeln!(out, "{line}")?,
        }
    }
    Ok(())
}

#[derive(Debug)]
struct RegionCollector(Viewer);

impl Collector for RegionCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let rec = &self.0;
        // Everything the scrape shows is read first: a region whose file was
        // shrunk, before or while it is read (`docs/design.md`, "A file
        // shrunk under a mapping"), shows nothing but `edgemark_region_ok 0`.
        // Two `fstat`s per scrape: the check before and the one after; the
        // reads between fail on a page lost while they run.
        let read = rec.check().and_then(|()| {
            let hists = rec.histograms_checked()?;
            let open = rec.open_requests_checked()?.len() as i64;
            let counters = rec.counters();
            rec.check().map(|()| (hists, open, counters))
        });
        let ok = read.is_ok();
        let g = ConstGauge::new(i64::from(ok));
        g.encode(enc.encode_descriptor(
            "edgemark_region_ok",
            "1 if the region file has its full length and was read, 0 if not",
            None,
            g.metric_type(),
        )?)?;
        let Ok((hists, open, c)) = read else {
            return Ok(());
        };
        {
            let mut family = enc.encode_descriptor(
                "edgemark_boundary_elapsed",
                "Elapsed time from request start to each first event, over closed requests",
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?;
            for h in hists.iter().filter(|h| h.delta.is_none()) {
                let labels = [("edge", h.edge.to_string()), ("event", h.metric.clone())];
                let m = family.encode_family(&labels)?;
                encode_histogram(m, &h.histogram)?;
            }
        }
        {
            let mut family = enc.encode_descriptor(
                "edgemark_delta",
                "Time between consecutive first events of one edge segment, over closed requests",
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?;
            for h in &hists {
                let Some((from, to)) = &h.delta else { continue };
                let labels = [
                    ("edge", h.edge.to_string()),
                    ("from_event", from.clone()),
                    ("to_event", to.clone()),
                ];
                let m = family.encode_family(&labels)?;
                encode_histogram(m, &h.histogram)?;
            }
        }
        {
            let mut family = enc.encode_descriptor(
                "edgemark_refused_records",
                "Records refused, by reason (duplicates and not-meaningful payloads are not counted)",
                None,
                MetricType::Counter,
            )?;
            for (o, n) in &c.refused {
                let labels = [("reason", o.name())];
                ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
            }
        }
        let counter = |enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64| {
            let c = ConstCounter::new(v);
            c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
        };
        counter(
            &mut enc,
            "edgemark_closed_requests",
            "Requests closed",
            c.closed_requests,
        )?;
        counter(
            &mut enc,
            "edgemark_reclaimed_requests",
            "Requests of dead owners freed by a reclaim",
            c.reclaimed_requests,
        )?;
        counter(
            &mut enc,
            "edgemark_dropped_segments",
            "Segments that left a request's window of kept segments",
            c.dropped_segments,
        )?;
        let slots = rec.info().map_or(0, |i| i64::from(i.slots));
        let gauge = |enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: i64| {
            let g = ConstGauge::new(v);
            g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
        };
        gauge(
            &mut enc,
            "edgemark_open_requests",
            "Requests open now",
            open,
        )?;
        gauge(
            &mut enc,
            "edgemark_free_slots",
            "Slots free now",
            slots - open,
        )?;
        Ok(())
    }
}

fn encode_histogram(
    mut m: prometheus_client::encoding::MetricEncoder<'_>,
    h: &crate::report::Histogram,
) -> Result<(), std::fmt::Error> {
    // prometheus-client takes each bucket's own count and accumulates. The
    // region keeps milliseconds; Prometheus names seconds.
    let buckets: Vec<(f64, u64)> = crate::report::BUCKETS_MS
        .iter()
        .map(|ms| ms / 1000.0)
        .chain([f64::INFINITY])
        .zip(h.buckets.iter().copied())
        .collect();
    m.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
        h.sum_ms / 1000.0,
        h.count,
        &buckets,
        None,
    )
}
