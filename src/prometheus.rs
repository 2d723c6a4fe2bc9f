//! The Prometheus encoding of a region (feature `prometheus`, on by
//! default), for any HTTP server to answer `/metrics` with.
//!
//! Every call reads the region afresh: the histograms of closed requests
//! (kept in the region by the close that ended each request, so each request
//! is counted exactly once however often it is scraped, and nothing is lost
//! or repeated when the server restarts), then the counters and gauges of
//! the region's report, one family per row of [`METRICS`] (the table that
//! also names them in `inspect --json` and Python's `Region.report()`):
//! the refusal counters, the ring's counters of closed requests (lost,
//! acknowledged, given up, overwritten while a reader held them), a sweep
//! of the slots for the open-request and free-slot gauges, and a pass over
//! the ring for its unread, unacknowledged and reader gauges. Labels are
//! bounded: an edge, an event, a reason; never a request. Times are in
//! seconds, as Prometheus names them.
//!
//! The text is encoded by `prometheus-client`, in one of the two formats
//! Prometheus reads: OpenMetrics, or the classic text format that older
//! scrapers and `promtool check metrics` read (each family described as its
//! format names it, never translated from the other's text).
//! [`Format::negotiate`] picks one from a request's `Accept` header; a
//! server that keeps counters of its own shows them with the region's
//! ([`render_with`]). The `edgemark export` command serves
//! it; an orchestrator that already runs a server serves it from there:
//!
//! ```
//! use edgemark::prometheus::{self, Format};
//! let rec = edgemark::Recorder::builder().edge(0, 1).create_in_memory()?;
//! let t = rec.begin().expect("a free slot");
//!
//! // In the `/metrics` handler of whatever server the process runs:
//! let accept = Some("text/plain;version=0.0.4"); // the request's Accept header
//! let format = Format::negotiate(accept);
//! let body = prometheus::render(&rec, format);
//! let content_type = format.content_type();
//! assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
//! assert!(body.contains("edgemark_open_requests 1"));
//! assert!(body.contains("# TYPE edgemark_closed_requests_total counter"));
//! rec.close(t);
//! assert!(prometheus::render(&rec, format).contains("edgemark_closed_requests_total 1"));
//! assert!(prometheus::render(&rec, Format::OpenMetrics).ends_with("# EOF\n"));
//! # Ok::<(), edgemark::CreateError>(())
//! ```

use std::borrow::Cow;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

use crate::recorder::Viewer;
use crate::region::SweepError;
use crate::report::{Counters, EdgeHistogram, METRICS, MetricKind, MetricValue, Occupancy};

/// A text format Prometheus reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0, which Prometheus asks for first.
    OpenMetrics,
    /// The classic Prometheus text format 0.0.4 (what `promtool check
    /// metrics` and scrapers that ask for no format read).
    Text,
}

/// What a family counts, for the names and metadata its format gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A counter: its samples are `<name>_total`.
    Counter,
    /// A gauge.
    Gauge,
    /// A histogram of seconds: its samples are `<name>_seconds_*`.
    Seconds,
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

    /// The name a family's HELP and TYPE lines carry and the unit it
    /// declares: where the two formats differ (with the `# EOF` that only
    /// OpenMetrics writes). Both name the samples alike: OpenMetrics names
    /// a counter's family without the `_total` its samples end in and
    /// declares a histogram's unit in a `# UNIT` line, which prometheus-client
    /// adds to the name; the classic format names each family as its
    /// samples, and has no unit line.
    fn family(self, name: &str, kind: Kind) -> (Cow<'_, str>, Option<&'static Unit>) {
        static SECONDS: Unit = Unit::Seconds;
        match (self, kind) {
            (Format::OpenMetrics, Kind::Seconds) => (Cow::Borrowed(name), Some(&SECONDS)),
            (Format::OpenMetrics, _) | (Format::Text, Kind::Gauge) => (Cow::Borrowed(name), None),
            (Format::Text, Kind::Counter) => (Cow::Owned(format!("{name}_total")), None),
            (Format::Text, Kind::Seconds) => (Cow::Owned(format!("{name}_seconds")), None),
        }
    }

    /// Writes one sample of a counter family described by
    /// [`Format::family`]: `<name>_total`, with the family's labels.
    fn counter_sample(self, mut m: MetricEncoder<'_>, v: u64) -> std::fmt::Result {
        match self {
            Format::OpenMetrics => ConstCounter::new(v).encode(m),
            // The family is already named `<name>_total`: the sample is
            // written under that name as it is.
            Format::Text => m.encode_gauge(&v),
        }
    }
}

/// A counter the serving process keeps itself, not the region: shown after
/// the region's metrics, named and typed as theirs are
/// ([`render_with`]).
#[derive(Clone, Copy, Debug)]
pub struct ServerCounter {
    name: &'static str,
    help: &'static str,
    value: u64,
}

impl ServerCounter {
    /// The counter `name` (its family name, without `_total`) with its
    /// help text and value.
    pub fn new(name: &'static str, help: &'static str, value: u64) -> ServerCounter {
        ServerCounter { name, help, value }
    }
}

/// The region's metrics now, as text in `format`.
pub fn render(recorder: &Viewer, format: Format) -> String {
    let mut out = String::new();
    // What it read is in the text (`edgemark_region_ok`).
    let _ = render_with(Some(recorder), &[], format, &mut out);
    out
}

/// Writes the region's metrics now into `out`, as text in `format`; fails
/// only if `out` does.
pub fn render_into(
    recorder: &Viewer,
    format: Format,
    out: &mut impl std::fmt::Write,
) -> std::fmt::Result {
    out.write_str(&render(recorder, format))
}

/// A server's scrape, appended to `out` in `format`: the region's metrics,
/// or `edgemark_region_ok 0` alone when there is no region (`None`: its
/// file is gone, say) or it could not be read, then `counters`.
///
/// Errors: why the region was not read (the text says
/// `edgemark_region_ok 0`): its file failed [`Viewer::check`] before the
/// reads or after them, or a read found it shrunk. A server may attach the
/// file again and render anew. No region is no error.
///
/// ```
/// use edgemark::prometheus::{self, Format, ServerCounter};
/// let served = [ServerCounter::new("my_reloads", "Times the file was attached again", 2)];
/// let mut text = String::new();
/// prometheus::render_with(None, &served, Format::Text, &mut text)?;
/// assert!(text.contains("edgemark_region_ok 0\n"));
/// assert!(text.contains("# TYPE my_reloads_total counter\nmy_reloads_total 2\n"));
/// # Ok::<(), edgemark::SweepError>(())
/// ```
pub fn render_with(
    recorder: Option<&Viewer>,
    counters: &[ServerCounter],
    format: Format,
    out: &mut String,
) -> Result<(), SweepError> {
    let read = recorder.map(Read::take).transpose();
    let (read, err) = match read {
        Ok(read) => (read, None),
        Err(e) => (None, Some(e)),
    };
    encode(vec![(None, read)], counters, format, out);
    err.map_or(Ok(()), Err)
}

/// A scrape of several regions, appended to `out` in `format`: each family
/// once, each sample labelled `region="NAME"` with its region's name (a
/// server that follows a directory names each region by its file name, so
/// the label has one value per region file, never per request), then
/// `counters`. A region given as `None`, or one that cannot be read now
/// (gone, shrunk), shows as `edgemark_region_ok{region="NAME"} 0` alone.
/// The names of the regions that could not be read are returned.
///
/// ```
/// use edgemark::prometheus::{self, Format};
/// let a = edgemark::Recorder::builder().edge(0, 1).create_in_memory()?;
/// let b = edgemark::Recorder::builder().edge(0, 1).create_in_memory()?;
/// a.close(a.begin().unwrap());
/// let mut text = String::new();
/// let unread = prometheus::render_regions(
///     &[("a.region", Some(&*a)), ("b.region", Some(&*b)), ("gone.region", None)],
///     &[],
///     Format::Text,
///     &mut text,
/// );
/// assert!(unread.is_empty());
/// assert!(text.contains("edgemark_closed_requests_total{region=\"a.region\"} 1\n"));
/// assert!(text.contains("edgemark_closed_requests_total{region=\"b.region\"} 0\n"));
/// assert!(text.contains("edgemark_region_ok{region=\"gone.region\"} 0\n"));
/// assert_eq!(text.matches("# TYPE edgemark_open_requests gauge").count(), 1);
/// # Ok::<(), edgemark::CreateError>(())
/// ```
pub fn render_regions(
    regions: &[(&str, Option<&Viewer>)],
    counters: &[ServerCounter],
    format: Format,
    out: &mut String,
) -> Vec<(String, SweepError)> {
    let mut unread = Vec::new();
    let reads = regions
        .iter()
        .map(|(name, rec)| {
            let read = match rec.map(Read::take).transpose() {
                Ok(read) => read,
                Err(e) => {
                    unread.push(((*name).to_owned(), e));
                    None
                }
            };
            (Some((*name).to_owned()), read)
        })
        .collect();
    encode(reads, counters, format, out);
    unread
}

/// Encodes what was read, each region's samples labelled with its name
/// when it has one.
fn encode(
    reads: Vec<(Option<String>, Option<Read>)>,
    counters: &[ServerCounter],
    format: Format,
    out: &mut String,
) {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ScrapeCollector {
        reads,
        counters: counters.to_vec(),
        format,
    }));
    // Writing into a String cannot fail.
    let _ = match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(out, &registry),
        Format::Text => prometheus_client::encoding::text::encode_registry(out, &registry),
    };
}

/// What one scrape read of a region: everything it shows, read before any
/// of it is encoded. The counters and gauges are the parts of the region's
/// [`RegionReport`](crate::report::RegionReport), each shown as its row of
/// [`METRICS`] names it, the row that also names it in `inspect --json`
/// and Python's `Region.report()`.
#[derive(Debug)]
struct Read {
    hists: Vec<EdgeHistogram>,
    /// The report's counters (all zero for a disabled recorder).
    counters: Counters,
    /// The report's occupancy (no slots for a disabled recorder).
    occupancy: Occupancy,
}

impl Read {
    /// Reads the region. A region whose file was shrunk, before or while it
    /// is read (`docs/design.md`, "A file shrunk under a mapping"), is not
    /// read: two `fstat`s per scrape, the check before and the one after;
    /// the reads between fail on a page lost while they run.
    fn take(rec: &Viewer) -> Result<Read, SweepError> {
        rec.check()?;
        let hists = rec.histograms_checked()?;
        let report = rec.report_checked()?;
        rec.check()?;
        let (counters, occupancy) =
            report.map_or_else(Default::default, |r| (r.counters, r.occupancy));
        Ok(Read {
            hists,
            counters,
            occupancy,
        })
    }
}

#[derive(Debug)]
struct ScrapeCollector {
    /// Each region's name (its `region` label; none for a scrape of one
    /// region) and what was read of it (`None`: shows
    /// `edgemark_region_ok 0` alone).
    reads: Vec<(Option<String>, Option<Read>)>,
    counters: Vec<ServerCounter>,
    format: Format,
}

/// A sample's labels: the region's name (if it has one), then its own.
fn labels(region: &Option<String>, own: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    region
        .iter()
        .map(|r| ("region", r.clone()))
        .chain(own.iter().cloned())
        .collect()
}

impl Collector for ScrapeCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let format = self.format;
        let counter = |enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64| {
            let (family, unit) = format.family(name, Kind::Counter);
            format.counter_sample(
                enc.encode_descriptor(&family, help, unit, MetricType::Counter)?,
                v,
            )
        };
        {
            let (family, unit) = format.family("edgemark_region_ok", Kind::Gauge);
            let mut family = enc.encode_descriptor(
                &family,
                "1 if the region file has its full length and was read, 0 if not",
                unit,
                MetricType::Gauge,
            )?;
            for (region, read) in &self.reads {
                let g = ConstGauge::new(i64::from(read.is_some()));
                g.encode(family.encode_family(&labels(region, &[]))?)?;
            }
        }
        encode_reads(&self.reads, &mut enc, format)?;
        for c in &self.counters {
            counter(&mut enc, c.name, c.help, c.value)?;
        }
        Ok(())
    }
}

/// The histogram families, then the report's counters and gauges, each
/// family once with the samples of every region read.
fn encode_reads(
    reads: &[(Option<String>, Option<Read>)],
    enc: &mut DescriptorEncoder<'_>,
    format: Format,
) -> std::fmt::Result {
    let read: Vec<(&Option<String>, &Read)> = reads
        .iter()
        .filter_map(|(region, read)| read.as_ref().map(|r| (region, r)))
        .collect();
    if read.is_empty() {
        return Ok(());
    }
    {
        let (family, unit) = format.family("edgemark_boundary_elapsed", Kind::Seconds);
        let mut family = enc.encode_descriptor(
            &family,
            "Elapsed time from request start to each first event, over closed requests",
            unit,
            MetricType::Histogram,
        )?;
        for (region, r) in &read {
            for h in r.hists.iter().filter(|h| h.delta.is_none()) {
                let own = [("edge", h.edge.to_string()), ("event", h.metric.clone())];
                let set = labels(region, &own);
                let m = family.encode_family(&set)?;
                encode_histogram(m, &h.histogram)?;
            }
        }
    }
    {
        let (family, unit) = format.family("edgemark_delta", Kind::Seconds);
        let mut family = enc.encode_descriptor(
            &family,
            "Time between consecutive first events of one edge segment, over closed requests",
            unit,
            MetricType::Histogram,
        )?;
        for (region, r) in &read {
            for h in &r.hists {
                let Some((from, to)) = &h.delta else { continue };
                let own = [
                    ("edge", h.edge.to_string()),
                    ("from_event", from.clone()),
                    ("to_event", to.clone()),
                ];
                let set = labels(region, &own);
                let m = family.encode_family(&set)?;
                encode_histogram(m, &h.histogram)?;
            }
        }
    }
    // The report's counters and gauges, one family per row of the table
    // that also names them in the JSON and `inspect`.
    for m in METRICS {
        let (kind, metric_type) = match m.kind {
            MetricKind::Counter => (Kind::Counter, MetricType::Counter),
            MetricKind::Gauge => (Kind::Gauge, MetricType::Gauge),
        };
        let (family, unit) = format.family(m.prometheus, kind);
        let sample = |m: MetricEncoder<'_>, v: u64| match kind {
            // Counted in one pass over the slots (at most 2^20), the
            // ring's entries (at most 2^20) or the reader table (8
            // words): they always fit an i64.
            Kind::Gauge => ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX)).encode(m),
            _ => format.counter_sample(m, v),
        };
        let mut family = enc.encode_descriptor(&family, m.help, unit, metric_type)?;
        for (region, r) in &read {
            match (m.value(&r.counters, &r.occupancy), m.label) {
                (MetricValue::ByLabel(v), Some(label)) => {
                    for (value, n) in v {
                        let own = [(label, value.to_string())];
                        sample(family.encode_family(&labels(region, &own))?, n)?;
                    }
                }
                (v, _) => sample(family.encode_family(&labels(region, &[]))?, v.total())?,
            }
        }
    }
    Ok(())
}

fn encode_histogram(
    mut m: MetricEncoder<'_>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mark::{Edge, Mark};
    use crate::recorder::Recorder;
    use crate::schema::Event;

    /// The lines of `text` that are not comments: the samples.
    fn samples(text: &str) -> Vec<&str> {
        text.lines().filter(|l| !l.starts_with('#')).collect()
    }

    #[test]
    fn the_two_formats_differ_only_in_family_names_units_and_eof() {
        let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
        let t = rec.begin().unwrap();
        let emit = Mark::new(Edge::new(0, 1), Event::ProducerFirstNonemptyEmit);
        rec.record_elapsed(t, emit, 3.0, "host_monotonic");
        rec.record(t, emit.segment(2));
        rec.close(t);
        let served = [ServerCounter::new("my_reloads", "Reloads", 7)];
        let (mut om, mut text) = (String::new(), String::new());
        render_with(Some(&rec), &served, Format::OpenMetrics, &mut om).unwrap();
        render_with(Some(&rec), &served, Format::Text, &mut text).unwrap();
        assert_eq!(samples(&om), samples(&text));
        assert!(om.ends_with("# EOF\n") && !text.contains("# EOF"));
        assert!(om.contains("# UNIT edgemark_delta_seconds seconds\n"));
        assert!(!text.contains("# UNIT"));
        for (om_family, text_family) in [
            (
                "edgemark_refused_records counter",
                "edgemark_refused_records_total counter",
            ),
            ("my_reloads counter", "my_reloads_total counter"),
            (
                "edgemark_delta_seconds histogram",
                "edgemark_delta_seconds histogram",
            ),
            (
                "edgemark_open_requests gauge",
                "edgemark_open_requests gauge",
            ),
        ] {
            assert!(om.contains(&format!("# TYPE {om_family}\n")), "{om_family}");
            assert!(
                text.contains(&format!("# TYPE {text_family}\n")),
                "{text_family}"
            );
        }
        assert!(text.contains("my_reloads_total 7\n"));
        assert!(
            text.contains("edgemark_refused_records_total{reason=\"segment_not_started\"} 1\n")
        );
        // The server's counters come last, before the end of an OpenMetrics text.
        assert!(om.ends_with("my_reloads_total 7\n# EOF\n"));
    }

    #[test]
    fn every_row_of_the_report_table_is_a_family_in_both_formats() {
        let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
        rec.close(rec.begin().unwrap());
        for format in [Format::OpenMetrics, Format::Text] {
            let text = render(&rec, format);
            for m in METRICS {
                let (family, kind) = match (format, m.kind) {
                    (Format::Text, MetricKind::Counter) => {
                        (format!("{}_total", m.prometheus), "counter")
                    }
                    (_, MetricKind::Counter) => (m.prometheus.to_owned(), "counter"),
                    (_, MetricKind::Gauge) => (m.prometheus.to_owned(), "gauge"),
                };
                let described = format!("# HELP {family} {}\n# TYPE {family} {kind}\n", m.help);
                assert!(text.contains(&described), "{described} in\n{text}");
            }
        }
        let text = render(&rec, Format::Text);
        assert!(
            text.contains("\nedgemark_closed_requests_total 1\n"),
            "{text}"
        );
        assert!(text.contains("\nedgemark_free_slots 4096\n"), "{text}");
    }

    #[test]
    fn a_shrunk_file_is_not_read_and_the_scrape_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.region");
        let rec = Recorder::builder().edge(0, 1).create(&path).unwrap();
        let served = [ServerCounter::new("my_reloads", "Reloads", 1)];
        let mut whole = String::new();
        assert!(render_with(Some(&rec), &served, Format::Text, &mut whole).is_ok());
        assert!(whole.contains("edgemark_region_ok 1\n"));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(4096)
            .unwrap();
        let mut text = String::new();
        let read = render_with(Some(&rec), &served, Format::Text, &mut text);
        assert!(
            matches!(read, Err(SweepError::Truncated { .. })),
            "{read:?}"
        );
        assert!(text.contains("edgemark_region_ok 0\n"));
        assert!(!text.contains("edgemark_open_requests"));
        assert!(text.contains("my_reloads_total 1\n"));
        // No region at all is no error.
        let mut none = String::new();
        assert!(render_with(None, &served, Format::OpenMetrics, &mut none).is_ok());
        assert_eq!(
            samples(&none),
            ["edgemark_region_ok 0", "my_reloads_total 1"]
        );
    }
}
