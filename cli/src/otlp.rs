//! `edgemark export --otlp`: each closed request of the region as
//! OpenTelemetry spans, sent to a collector over OTLP/HTTP with protobuf.
//!
//! A request becomes one span `edgemark request` (the request's own span id,
//! its parent the context it began under) and, as its children, one span
//! per edge segment, named for the edge (`edgemark 0->1`), from its first
//! event to its last, each of the four boundaries a span event at its
//! absolute time: the request's wall-clock origin plus the elapsed time.
//! A value measured in a foreign clock domain (anywhere but the region's
//! `host_monotonic`) has no place on this host's time line: its event is
//! placed at the origin, and its relative time is kept in attributes.
//! Deltas are given only between two values of one domain, as
//! [`edgemark::snapshot::EdgeSegment::elapsed_between`] gives them; values of two
//! domains (and so of two hosts) are never subtracted.
//!
//! Two tasks share one thread and its single-threaded runtime, apart from
//! the `/metrics` server: the drain takes closed requests from the region's
//! ring as a registered reader ([`edgemark::ClosedReader`]), only as many as
//! the queue has room for, turns them into spans and queues them; the
//! sender posts batches of the queue, one at a time, and retries a failed
//! post with exponential backoff for [`RETRY_FOR`]. A request is
//! acknowledged to the region when the collector has accepted the post
//! that carried it, and given up (counted by reason) when the collector
//! refuses it or its retries run out. While the queue is full the drain
//! takes nothing: requests wait in the ring, and the ones the ring
//! overwrites meanwhile are counted by the closes that overwrite them. So a
//! collector that is down costs memory up to the bound and never blocks a
//! close, the drain or `/metrics` ([`Stats`], served under
//! `edgemark_otlp_...`, and the region's counters).
//!
//! At least once: on SIGTERM or SIGINT the exporter stops taking, sends
//! what it holds for at most [`FLUSH_DEADLINE`], then logs what is left and
//! exits, leaving that in the ring taken in its name; the next exporter on
//! the region adopts it and sends it, as it adopts what a killed exporter
//! left. A segment span's id is derived from the request's span id, edge
//! and segment ([`ClosedRequest::segment_span_id`]), so a request sent
//! twice makes no second span where spans are keyed by id.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use edgemark::export::Format;
use edgemark::schema::{EventId, HOST_MONOTONIC};
use edgemark::trace::ClosedRequest;
use edgemark::{ClosedReader, Edge, GiveUp, Recorder};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper::header::{CONTENT_TYPE, HOST, HeaderName, HeaderValue};
use hyper::{Request, Uri};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::{Event as SpanEvent, SpanKind};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message as _;

/// Spans sent in one post, unless `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` says.
pub(crate) const DEFAULT_BATCH: usize = 512;
/// Spans queued at most, unless `OTEL_BSP_MAX_QUEUE_SIZE` says.
pub(crate) const DEFAULT_QUEUE: usize = 16_384;
/// The longest a queued span waits for a batch to fill, unless
/// `OTEL_BSP_SCHEDULE_DELAY` (milliseconds) says.
pub(crate) const DEFAULT_DELAY: Duration = Duration::from_millis(500);
/// The limit on one post (connect, send, answer), unless
/// `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds) says.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a batch is retried before its spans are dropped.
pub(crate) const RETRY_FOR: Duration = Duration::from_secs(30);
/// The first wait before a retry; each next one doubles, up to
/// [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
/// The longest wait between two tries.
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Closed requests taken from the ring by one drain call.
const DRAIN_MAX: usize = 256;
/// How long the exporter goes on sending what it holds after SIGTERM or
/// SIGINT (or the end of `--serve-for`) before it gives the rest back to
/// the ring for the next exporter.
pub(crate) const FLUSH_DEADLINE: Duration = Duration::from_secs(5);
/// How often the drain looks for requests that exporters which died (or
/// stopped before sending them) left taken in the ring.
const ADOPT_EVERY: Duration = Duration::from_secs(5);
/// How long a ring entry may stay claimed and unwritten before the drain
/// judges its closer dead and gives it up.
const PENDING_GIVE_UP: Duration = Duration::from_secs(5);
/// The wait between two drains that found the ring empty.
const POLL: Duration = Duration::from_millis(50);
/// The name of the span of a whole request.
pub(crate) const REQUEST_SPAN: &str = "edgemark request";
/// The W3C trace flag that says the trace is sampled.
const SAMPLED: u8 = 0x01;

/// Where and how to send: the command's `--otlp` and the standard
/// `OTEL_*` variables.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// The traces URL posted to, as given or built.
    pub(crate) url: String,
    /// The request target (path and query).
    target: Uri,
    /// `host:port` to connect to, also the `Host` header.
    authority: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    timeout: Duration,
    batch: usize,
    queue: usize,
    delay: Duration,
    /// The resource's attributes: `service.name`, `host.name`, then the
    /// rest of `OTEL_RESOURCE_ATTRIBUTES`.
    resource: Vec<(String, String)>,
}

/// The first of `names` set (and not empty) in `env`, with its name.
fn first(env: &impl Fn(&str) -> Option<String>, names: &[&str]) -> Option<(String, String)> {
    names.iter().find_map(|n| {
        env(n)
            .filter(|v| !v.trim().is_empty())
            .map(|v| ((*n).to_owned(), v.trim().to_owned()))
    })
}

/// `%XX` escapes of `s` decoded, as the OTLP exporter variables write
/// header and resource values.
fn percent_decode(s: &str) -> Result<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok());
            let v = hex
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| anyhow!("a bad %-escape in {s:?}"))?;
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| anyhow!("{s:?} decodes to text that is not UTF-8"))
}

/// A list `key=value,key=value` (the form of `OTEL_EXPORTER_OTLP_HEADERS`
/// and `OTEL_RESOURCE_ATTRIBUTES`), values %-decoded.
fn pairs(var: &str, s: &str) -> Result<Vec<(String, String)>> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| anyhow!("{var}: {p:?} is not key=value"))?;
            let k = k.trim();
            if k.is_empty() {
                bail!("{var}: {p:?} has no key");
            }
            Ok((
                percent_decode(k).with_context(|| var.to_owned())?,
                percent_decode(v.trim()).with_context(|| var.to_owned())?,
            ))
        })
        .collect()
}

/// A positive number of milliseconds from `var`.
fn millis(var: &str, v: &str) -> Result<Duration> {
    match v.parse::<u64>() {
        Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => bail!("{var}={v}: not a positive number of milliseconds"),
    }
}

/// A positive count from `var`.
fn count(var: &str, v: &str) -> Result<usize> {
    match v.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => bail!("{var}={v}: not a positive number"),
    }
}

/// This host's name, as `uname -n` says it.
fn host_name() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

impl Config {
    /// The configuration from `--otlp`'s URL (`None` or empty: none given)
    /// and the variables `env` reads.
    ///
    /// The traces URL is `--otlp`'s base URL with `/v1/traces` appended;
    /// without one, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, else
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` with `/v1/traces` appended. Headers,
    /// timeout, protocol and compression come from
    /// `OTEL_EXPORTER_OTLP_{TRACES_,}{HEADERS,TIMEOUT,PROTOCOL,COMPRESSION}`,
    /// the batch and queue from `OTEL_BSP_*`, the resource from
    /// `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`.
    pub(crate) fn new(flag: Option<&str>, env: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let join = |base: &str| format!("{}/v1/traces", base.trim_end_matches('/'));
        let url = match flag.map(str::trim).filter(|u| !u.is_empty()) {
            Some(base) => join(base),
            None => match first(&env, &["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]) {
                Some((_, u)) => u,
                None => match first(&env, &["OTEL_EXPORTER_OTLP_ENDPOINT"]) {
                    Some((_, base)) => join(&base),
                    None => bail!(
                        "--otlp needs the collector's URL (for example http://127.0.0.1:4318), \
                         or OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set"
                    ),
                },
            },
        };
        let uri: Uri = url.parse().with_context(|| format!("{url}: not a URL"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => bail!(
                "{url}: https is not supported: send to a collector's plain-http OTLP port \
                 (a local collector can forward over TLS)"
            ),
            _ => bail!("{url}: the URL must start with http://"),
        }
        let host = uri
            .host()
            .ok_or_else(|| anyhow!("{url}: the URL has no host"))?;
        let authority = format!("{host}:{}", uri.port_u16().unwrap_or(80));
        let target: Uri = uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .parse()
            .with_context(|| format!("{url}: not a URL"))?;

        let protocol_vars = [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ];
        if let Some((var, p)) = first(&env, &protocol_vars)
            && p != "http/protobuf"
        {
            bail!(
                "{var}={p}: this exporter speaks OTLP over HTTP with protobuf only \
                 (http/protobuf): point it at the collector's HTTP port (4318 by default)"
            );
        }
        let compression_vars = [
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
            "OTEL_EXPORTER_OTLP_COMPRESSION",
        ];
        if let Some((var, c)) = first(&env, &compression_vars)
            && c != "none"
        {
            bail!("{var}={c}: this exporter sends uncompressed bodies only (none)");
        }
        let mut headers = Vec::new();
        let header_vars = [
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "OTEL_EXPORTER_OTLP_HEADERS",
        ];
        if let Some((var, h)) = first(&env, &header_vars) {
            for (k, v) in pairs(&var, &h)? {
                let name = HeaderName::try_from(k.as_str())
                    .with_context(|| format!("{var}: {k:?} is not a header name"))?;
                let value = HeaderValue::try_from(v.as_str())
                    .with_context(|| format!("{var}: the value of {k} is not a header value"))?;
                headers.push((name, value));
            }
        }
        let timeout_vars = [
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ];
        let timeout = match first(&env, &timeout_vars) {
            Some((var, t)) => millis(&var, &t)?,
            None => DEFAULT_TIMEOUT,
        };
        let batch = match first(&env, &["OTEL_BSP_MAX_EXPORT_BATCH_SIZE"]) {
            Some((var, n)) => count(&var, &n)?,
            None => DEFAULT_BATCH,
        };
        let queue = match first(&env, &["OTEL_BSP_MAX_QUEUE_SIZE"]) {
            Some((var, n)) => count(&var, &n)?,
            None => DEFAULT_QUEUE,
        };
        let delay = match first(&env, &["OTEL_BSP_SCHEDULE_DELAY"]) {
            Some((var, t)) => millis(&var, &t)?,
            None => DEFAULT_DELAY,
        };

        let mut given = match first(&env, &["OTEL_RESOURCE_ATTRIBUTES"]) {
            Some((var, a)) => pairs(&var, &a)?,
            None => Vec::new(),
        };
        let mut take = |key: &str| {
            given
                .iter()
                .position(|(k, _)| k == key)
                .map(|i| given.remove(i).1)
        };
        let named = take("service.name");
        let service = first(&env, &["OTEL_SERVICE_NAME"])
            .map(|(_, s)| s)
            .or(named)
            .unwrap_or_else(|| "edgemark".to_owned());
        let host = take("host.name").unwrap_or_else(host_name);
        let mut resource = vec![
            ("service.name".to_owned(), service),
            ("host.name".to_owned(), host),
        ];
        resource.append(&mut given);

        Ok(Config {
            url,
            target,
            authority,
            headers,
            timeout,
            batch: batch.min(queue),
            queue,
            delay,
            resource,
        })
    }
}

/// The exporter's counters, served on `/metrics` beside the region's.
#[derive(Debug, Default)]
pub(crate) struct Stats(Mutex<Counts>);

/// The values of [`Stats`].
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    /// Closed requests taken from the ring.
    requests: u64,
    /// Entries of the ring overwritten or torn before the exporter took
    /// them.
    lost: u64,
    /// Requests taken whose trace flags say not sampled: no spans.
    unsampled: u64,
    /// Spans the collector accepted.
    exported: u64,
    /// Spans dropped because the queue was full.
    dropped_queue: u64,
    /// Spans dropped after their batch failed for [`RETRY_FOR`] (or, on
    /// the way out, once).
    dropped_retries: u64,
    /// Spans the collector refused (an answer that is not to be retried,
    /// or rejected spans of a partial success).
    dropped_rejected: u64,
    /// Posts that failed (each try).
    failures: u64,
    /// Spans waiting in the queue now, with the batch being posted.
    queued: u64,
    /// Closed requests adopted: taken by an exporter before this one (that
    /// died, or stopped before sending them) and sent by this one.
    adopted: u64,
    /// Closed requests left unsent at a stop (in the ring, for the next
    /// exporter).
    left_unsent: u64,
    /// Whether the last post succeeded.
    up: bool,
}

impl Stats {
    /// Changes the counts.
    fn update(&self, f: impl FnOnce(&mut Counts)) {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// The metrics text of the exporter, in `format`, to append to the
    /// region's (before OpenMetrics' `# EOF`).
    pub(crate) fn render(&self, format: Format) -> String {
        let c = *self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut s = String::new();
        let counter = |s: &mut String, name: &str, help: &str, samples: &[(&str, u64)]| {
            let family = match format {
                Format::OpenMetrics => name,
                Format::Text => &format!("{name}_total"),
            };
            let _ = writeln!(s, "# HELP {family} {help}\n# TYPE {family} counter");
            for (labels, v) in samples {
                let _ = writeln!(s, "{name}_total{labels} {v}");
            }
        };
        counter(
            &mut s,
            "edgemark_otlp_requests",
            "Closed requests the OTLP exporter took from the region's ring",
            &[("", c.requests)],
        );
        counter(
            &mut s,
            "edgemark_otlp_ring_lost",
            "Closed requests the ring overwrote (or that were torn) before the OTLP exporter took them",
            &[("", c.lost)],
        );
        counter(
            &mut s,
            "edgemark_otlp_unsampled_requests",
            "Closed requests whose trace flags say not sampled: no spans sent",
            &[("", c.unsampled)],
        );
        counter(
            &mut s,
            "edgemark_otlp_exported_spans",
            "Spans the collector accepted",
            &[("", c.exported)],
        );
        counter(
            &mut s,
            "edgemark_otlp_dropped_spans",
            "Spans not exported: the queue was full, retries ran out, or the collector refused them",
            &[
                ("{reason=\"queue_full\"}", c.dropped_queue),
                ("{reason=\"retries_exhausted\"}", c.dropped_retries),
                ("{reason=\"rejected\"}", c.dropped_rejected),
            ],
        );
        counter(
            &mut s,
            "edgemark_otlp_adopted_requests",
            "Closed requests an exporter before this one took and did not send, sent by this one",
            &[("", c.adopted)],
        );
        counter(
            &mut s,
            "edgemark_otlp_export_failures",
            "Posts to the collector that failed (each try)",
            &[("", c.failures)],
        );
        let _ = writeln!(
            s,
            "# HELP edgemark_otlp_queue_spans Spans waiting to be sent, with the batch being posted\n\
             # TYPE edgemark_otlp_queue_spans gauge\n\
             edgemark_otlp_queue_spans {}",
            c.queued
        );
        let _ = writeln!(
            s,
            "# HELP edgemark_otlp_collector_up 1 if the last post to the collector succeeded, 0 if not\n\
             # TYPE edgemark_otlp_collector_up gauge\n\
             edgemark_otlp_collector_up {}",
            u8::from(c.up)
        );
        s
    }
}

/// The names spans are made with: the region's events, in schema order,
/// and its id.
#[derive(Debug, Clone)]
pub(crate) struct Naming {
    events: Vec<String>,
    region: String,
    /// The most spans one request makes: its own and one per kept edge
    /// segment.
    spans_per_request: usize,
}

impl Naming {
    /// The names of `rec`'s region.
    pub(crate) fn of(rec: &Recorder) -> Naming {
        Naming {
            events: rec.schema().map_or_else(Vec::new, |s| {
                s.events().iter().map(|e| e.name().to_owned()).collect()
            }),
            region: rec
                .info()
                .map_or_else(String::new, |i| format!("{:016x}", i.region_id)),
            spans_per_request: 1 + rec.edges().len()
                * rec.info().map_or(1, |i| i.segments as usize),
        }
    }
}

fn kv(key: impl Into<String>, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}
fn s(v: impl Into<String>) -> any_value::Value {
    any_value::Value::StringValue(v.into())
}
fn int(v: impl Into<i64>) -> any_value::Value {
    any_value::Value::IntValue(v.into())
}
fn double(v: f64) -> any_value::Value {
    any_value::Value::DoubleValue(v)
}

/// Appends the spans of one closed request to `out`: its request span,
/// then one span per edge segment.
pub(crate) fn request_spans(req: &ClosedRequest, naming: &Naming, out: &mut Vec<Span>) {
    let origin = req.origin_unix_ns();
    let snapshot = req.snapshot();
    let mut attributes = vec![
        kv("edgemark.region", s(naming.region.as_str())),
        kv("edgemark.token", s(req.token().to_string())),
        kv("edgemark.segments", int(snapshot.segments().len() as i64)),
    ];
    if snapshot.dropped_segments() > 0 {
        attributes.push(kv(
            "edgemark.dropped_segments",
            int(snapshot.dropped_segments() as i64),
        ));
    }
    if snapshot.is_corrupt() {
        attributes.push(kv("edgemark.corrupt", any_value::Value::BoolValue(true)));
    }
    out.push(Span {
        trace_id: req.trace_id().to_vec(),
        span_id: req.span_id().to_vec(),
        parent_span_id: req.parent_span_id().map_or_else(Vec::new, |p| p.to_vec()),
        flags: u32::from(req.trace_flags()),
        name: REQUEST_SPAN.to_owned(),
        kind: SpanKind::Internal as i32,
        start_time_unix_nano: origin,
        end_time_unix_nano: req.closed_unix_ns().max(origin),
        attributes,
        ..Default::default()
    });

    for seg in snapshot.segments() {
        let edge = seg.edge().to_string();
        let index = i64::from(seg.segment_index());
        let mut events = Vec::new();
        let mut attributes = vec![
            kv("edgemark.edge", s(edge.as_str())),
            kv("edgemark.edge.from", int(seg.from_stage())),
            kv("edgemark.edge.to", int(seg.to_stage())),
            kv("edgemark.segment", int(index)),
        ];
        if let Some(c) = seg.first_chunk_seq() {
            attributes.push(kv("edgemark.chunk_seq", int(c as i64)));
        }
        let (mut first, mut last) = (u64::MAX, 0u64);
        let mut domains: Vec<&str> = Vec::new();
        // The previous recorded event, for the deltas.
        let mut previous: Option<(EventId, &str)> = None;
        for (i, name) in naming.events.iter().enumerate() {
            let Ok(i) = u8::try_from(i) else { break };
            let id = EventId(i);
            let Some(v) = seg.get(id) else { continue };
            let domain = seg.domain(id).unwrap_or("unknown");
            if !domains.contains(&domain) {
                domains.push(domain);
            }
            let ms = v.elapsed_ms();
            let host = domain == HOST_MONOTONIC;
            let at = if host {
                let t = origin.saturating_add(v.elapsed_us.saturating_mul(1000));
                first = first.min(t);
                last = last.max(t);
                t
            } else {
                origin
            };
            attributes.push(kv(format!("edgemark.{name}_ms"), double(ms)));
            attributes.push(kv(format!("edgemark.{name}.clock_domain"), s(domain)));
            let mut ev = vec![
                kv("edgemark.edge", s(edge.as_str())),
                kv("edgemark.segment", int(index)),
                kv("edgemark.elapsed_ms", double(ms)),
                kv("edgemark.clock_domain", s(domain)),
            ];
            // The delta from the previous recorded event, only within one
            // clock domain.
            if let Some((prev, prev_name)) = previous
                && let Some(d) = seg.elapsed_between(prev, id)
            {
                attributes.push(kv(format!("edgemark.{prev_name}_to_{name}_ms"), double(d)));
                ev.push(kv("edgemark.since_previous_ms", double(d)));
                ev.push(kv("edgemark.previous_event", s(prev_name)));
            }
            previous = Some((id, name.as_str()));
            if !host {
                ev.push(kv(
                    "edgemark.placed_at_origin",
                    any_value::Value::BoolValue(true),
                ));
            }
            events.push(SpanEvent {
                time_unix_nano: at,
                name: name.clone(),
                attributes: ev,
                dropped_attributes_count: 0,
            });
        }
        if first == u64::MAX {
            // No value on this host's clock: the span sits at the origin.
            (first, last) = (origin, origin);
        }
        attributes.push(kv("edgemark.clock_domain", s(domains.join(","))));
        attributes.push(kv("edgemark.region", s(naming.region.as_str())));
        // In time order (stable: schema order among equal times).
        events.sort_by_key(|e| e.time_unix_nano);
        out.push(Span {
            trace_id: req.trace_id().to_vec(),
            span_id: req
                .segment_span_id(
                    Edge::new(seg.from_stage(), seg.to_stage()),
                    seg.segment_index(),
                )
                .to_vec(),
            parent_span_id: req.span_id().to_vec(),
            flags: u32::from(req.trace_flags()),
            name: format!("edgemark {edge}"),
            kind: SpanKind::Internal as i32,
            start_time_unix_nano: first,
            end_time_unix_nano: last,
            attributes,
            events,
            ..Default::default()
        });
    }
}

/// The export request of `spans` under `config`'s resource.
pub(crate) fn export_request(config: &Config, spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: config
                    .resource
                    .iter()
                    .map(|(k, v)| kv(k.as_str(), s(v.as_str())))
                    .collect(),
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "edgemark".to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..Default::default()
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

/// Why a post failed.
#[derive(Debug)]
enum PostError {
    /// Worth another try: no connection, a timeout, 429, 502, 503, 504.
    Retry(String),
    /// Not: the collector refused the batch.
    Refused(String),
}

/// One connection to the collector, made again after any failure.
struct Client {
    config: Arc<Config>,
    sender: Option<http1::SendRequest<Full<Bytes>>>,
}

impl Client {
    /// Posts `body`; the spans the collector rejected (a partial success).
    async fn post(&mut self, body: Bytes) -> Result<u64, PostError> {
        let timeout = self.config.timeout;
        let r = match tokio::time::timeout(timeout, self.try_post(body)).await {
            Ok(r) => r,
            Err(_) => Err(PostError::Retry(format!(
                "no answer within {} ms",
                timeout.as_millis()
            ))),
        };
        if r.is_err() {
            self.sender = None;
        }
        r
    }

    async fn try_post(&mut self, body: Bytes) -> Result<u64, PostError> {
        let retry =
            |what: &str, e: &dyn std::fmt::Display| PostError::Retry(format!("{what}: {e}"));
        if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
            let stream = tokio::net::TcpStream::connect(self.config.authority.as_str())
                .await
                .map_err(|e| retry("cannot connect", &e))?;
            let _ = stream.set_nodelay(true);
            let (sender, conn) = http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| retry("the connection failed", &e))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            self.sender = Some(sender);
        }
        let Some(sender) = self.sender.as_mut() else {
            return Err(PostError::Retry("no connection".to_owned()));
        };
        sender
            .ready()
            .await
            .map_err(|e| retry("the connection closed", &e))?;
        let mut req = Request::post(self.config.target.clone())
            .header(HOST, self.config.authority.as_str())
            .header(CONTENT_TYPE, "application/x-protobuf")
            .body(Full::new(body))
            .map_err(|e| PostError::Refused(format!("cannot make the request: {e}")))?;
        for (k, v) in &self.config.headers {
            req.headers_mut().append(k.clone(), v.clone());
        }
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| retry("the post failed", &e))?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| retry("the answer was cut", &e))?
            .to_bytes();
        if status.is_success() {
            // A partial success names the spans it rejected; a body that is
            // not the message (some answer `{}` as JSON) rejects none.
            let rejected = ExportTraceServiceResponse::decode(body)
                .ok()
                .and_then(|r| r.partial_success)
                .map_or(0, |p| p.rejected_spans.max(0) as u64);
            return Ok(rejected);
        }
        let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        let why = format!("the collector answered {status}: {}", text.trim());
        match status.as_u16() {
            429 | 502 | 503 | 504 => Err(PostError::Retry(why)),
            _ => Err(PostError::Refused(why)),
        }
    }
}

/// The running exporter.
#[derive(Debug)]
pub(crate) struct Exporter {
    stats: Arc<Stats>,
    thread: std::thread::JoinHandle<()>,
}

impl Exporter {
    /// Starts exporting the closed requests of `rec` (attached from `path`;
    /// `reattach` attaches that path again when the file there changes or
    /// the drain fails) for `run_for`, or until SIGTERM or SIGINT, after
    /// which it flushes for at most [`FLUSH_DEADLINE`] and ends the
    /// process. Fails if the region keeps no ring of closed requests, or
    /// its reader table is full.
    pub(crate) fn start(
        config: Config,
        rec: Recorder,
        path: PathBuf,
        reattach: impl Fn() -> Result<Recorder> + Send + 'static,
        run_for: Option<Duration>,
    ) -> Result<Exporter> {
        let reader = rec.closed_reader().map_err(|e| {
            anyhow!(
                "{}: cannot export closed requests: {e}{}",
                path.display(),
                if matches!(e, edgemark::ReaderError::NoRing) {
                    " (create it with --closed-entries above 0)"
                } else {
                    ""
                }
            )
        })?;
        let stats = Arc::new(Stats::default());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .context("cannot start the exporter's runtime")?;
        // Made here, on the caller's thread, so that a signal that comes
        // before the exporter's thread runs is already ours.
        let signals = {
            let _guard = runtime.enter();
            use tokio::signal::unix::{SignalKind, signal};
            let term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
            let int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
            (term, int)
        };
        let thread_stats = Arc::clone(&stats);
        let thread = std::thread::Builder::new()
            .name("otlp".to_owned())
            .spawn(move || {
                let config = Arc::new(config);
                let deadline = run_for.map(|d| Instant::now() + d);
                let signalled = runtime.block_on(run(
                    config,
                    Arc::new(reader),
                    path,
                    Box::new(reattach),
                    thread_stats,
                    deadline,
                    signals,
                ));
                if let Some(name) = signalled {
                    eprintln!("edgemark: export stopped by {name}");
                    std::process::exit(0);
                }
            })
            .context("cannot start the exporter's thread")?;
        Ok(Exporter { stats, thread })
    }

    /// The counters, for `/metrics`.
    pub(crate) fn stats(&self) -> Arc<Stats> {
        Arc::clone(&self.stats)
    }

    /// Waits until the exporter has stopped (after its `run_for`, having
    /// sent what it could).
    pub(crate) fn join(self) -> Result<()> {
        self.thread
            .join()
            .map_err(|_| anyhow!("the OTLP exporter's thread panicked"))
    }
}

/// One closed request's spans, and who acknowledges it.
struct Queued {
    /// The reader that took it (the region it came from).
    reader: Arc<ClosedReader>,
    claim: u64,
    spans: Vec<Span>,
}

impl Queued {
    fn acknowledge(&self) {
        self.reader.acknowledge(self.claim);
    }

    fn give_up(&self, why: GiveUp) {
        self.reader.give_up(self.claim, why);
    }
}

/// The queue of spans to send, whole requests at a time: a request's spans
/// are sent in one post.
#[derive(Default)]
struct Queue {
    requests: VecDeque<Queued>,
    /// Spans in all of them.
    spans: usize,
}

impl Queue {
    /// Queues one request's spans.
    fn push(&mut self, request: Queued) {
        self.spans += request.spans.len();
        self.requests.push_back(request);
    }

    /// The oldest requests, up to `batch` spans (at least one request).
    fn take(&mut self, batch: usize) -> Vec<Queued> {
        let mut out: Vec<Queued> = Vec::new();
        let mut spans = 0;
        while let Some(next) = self.requests.front() {
            if !out.is_empty() && spans + next.spans.len() > batch {
                break;
            }
            let Some(next) = self.requests.pop_front() else {
                break;
            };
            self.spans -= next.spans.len();
            spans += next.spans.len();
            out.push(next);
        }
        out
    }
}

/// What the drain and the sender share (on one thread).
struct Shared {
    queue: RefCell<Queue>,
    /// Spans of the batch being posted (or waiting to be retried).
    in_flight: std::cell::Cell<usize>,
    /// Told when spans are queued, when the queue has room again, and when
    /// the exporter stops.
    wake: tokio::sync::Notify,
    room: tokio::sync::Notify,
    /// Set when the exporter stops taking: the sender sends what is queued
    /// until then, and gives back what is left.
    stop_by: std::cell::Cell<Option<Instant>>,
}

impl Shared {
    fn stopping(&self) -> bool {
        self.stop_by.get().is_some()
    }

    fn publish(&self, stats: &Stats) {
        let queued = (self.queue.borrow().spans + self.in_flight.get()) as u64;
        stats.update(|c| c.queued = queued);
    }
}

/// The device and inode of the file at `path`.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Runs the exporter; the name of the signal that stopped it, if one did.
async fn run(
    config: Arc<Config>,
    reader: Arc<ClosedReader>,
    path: PathBuf,
    reattach: Box<dyn Fn() -> Result<Recorder> + Send>,
    stats: Arc<Stats>,
    deadline: Option<Instant>,
    (mut term, mut int): (tokio::signal::unix::Signal, tokio::signal::unix::Signal),
) -> Option<&'static str> {
    let shared = Shared {
        queue: RefCell::new(Queue::default()),
        in_flight: std::cell::Cell::new(0),
        wake: tokio::sync::Notify::new(),
        room: tokio::sync::Notify::new(),
        stop_by: std::cell::Cell::new(None),
    };
    let signalled = std::cell::Cell::new(None);
    let watch = async {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        signalled.set(Some(name));
        if !shared.stopping() {
            eprintln!(
                "edgemark: {name}: sending what is queued for at most {} s",
                FLUSH_DEADLINE.as_secs()
            );
            shared.stop_by.set(Some(Instant::now() + FLUSH_DEADLINE));
            shared.wake.notify_waiters();
            shared.room.notify_waiters();
        }
        std::future::pending::<()>().await;
    };
    let work = async {
        tokio::join!(
            drain_loop(&config, reader, &path, reattach, &stats, &shared, deadline),
            send_loop(&config, &stats, &shared),
        );
    };
    tokio::select! {
        _ = work => {}
        _ = watch => {}
    }
    // What the sender could not send by the deadline stays taken in the
    // ring: the next exporter on the region adopts it.
    let left: Vec<Queued> = shared.queue.borrow_mut().requests.drain(..).collect();
    if !left.is_empty() {
        let held = left.iter().filter(|q| q.reader.holds(q.claim)).count();
        eprintln!(
            "edgemark: {} closed requests not sent by the deadline: {held} left in the ring \
             for the next exporter on it, {} already overwritten there (lost, counted in the \
             region's closed_overwritten_taken)",
            left.len(),
            left.len() - held
        );
        stats.update(|c| c.left_unsent += left.len() as u64);
    }
    signalled.get()
}

/// Takes closed requests into the queue, as many as it has room for,
/// until the deadline or a signal.
async fn drain_loop(
    config: &Config,
    mut reader: Arc<ClosedReader>,
    path: &Path,
    reattach: Box<dyn Fn() -> Result<Recorder> + Send>,
    stats: &Stats,
    shared: &Shared,
    deadline: Option<Instant>,
) {
    let mut naming = Naming::of(reader.recorder());
    let mut id = identity(path);
    let mut checked = Instant::now();
    let mut failing: Option<String> = None;
    // The ring entry a drain found still being written, and since when.
    let mut pending: Option<(u64, Instant)> = None;
    let mut closed = Vec::with_capacity(DRAIN_MAX);
    // Adopt at once what an exporter before this one left.
    let mut adopted_at: Option<Instant> = None;
    loop {
        if shared.stopping() {
            return;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            shared
                .stop_by
                .set(Some(Instant::now() + FLUSH_DEADLINE.min(config.timeout)));
            shared.wake.notify_waiters();
            return;
        }
        // Another file at the path, or a drain that failed: attach again.
        if failing.is_some() || checked.elapsed() >= Duration::from_secs(1) {
            checked = Instant::now();
            let now = identity(path);
            if failing.is_some() || (now.is_some() && now != id) {
                match reattach().and_then(|r| {
                    r.closed_reader()
                        .map_err(|e| anyhow!("cannot export closed requests: {e}"))
                }) {
                    Ok(r) => {
                        if failing.take().is_some() || now != id {
                            eprintln!(
                                "edgemark: {}: attached again; exporting its closed requests",
                                path.display()
                            );
                        }
                        reader = Arc::new(r);
                        naming = Naming::of(reader.recorder());
                        id = now;
                        adopted_at = None;
                        pending = None;
                    }
                    Err(e) => {
                        let why = format!("{e:#}");
                        if failing.as_deref() != Some(why.as_str()) {
                            eprintln!("edgemark: OTLP export: {why}; trying again every second");
                        }
                        failing = Some(why);
                    }
                }
            }
        }
        let mut took = 0;
        if failing.is_none() {
            if adopted_at.is_none_or(|t| t.elapsed() >= ADOPT_EVERY) {
                adopted_at = Some(Instant::now());
                closed.clear();
                let n = reader.adopt(&mut closed);
                if n > 0 {
                    eprintln!(
                        "edgemark: {}: {n} closed requests that an exporter before this one \
                         took and did not send: sending them",
                        path.display()
                    );
                    stats.update(|c| c.adopted += n as u64);
                    queue_requests(&reader, &naming, &closed, stats, shared);
                }
            }
            // A burst: up to a few full drains, then let the sender run.
            for _ in 0..8 {
                // Only what the queue has room for: the rest waits in the
                // ring (and, if the ring overwrites it, is counted lost by
                // the close that overwrote it).
                let room = config
                    .queue
                    .saturating_sub(shared.queue.borrow().spans + shared.in_flight.get());
                let max = (room / naming.spans_per_request).min(DRAIN_MAX);
                if max == 0 {
                    break;
                }
                closed.clear();
                match reader.take(max, &mut closed) {
                    Ok(d) => {
                        stats.update(|c| {
                            c.requests += d.taken as u64;
                            c.lost += d.lost;
                        });
                        took += d.taken;
                        // A close that began writing its entry and has not
                        // published it holds the drain; after
                        // PENDING_GIVE_UP its closer is judged dead and the
                        // entry given up (counted as lost).
                        pending = match (d.pending, pending) {
                            (None, _) => None,
                            (Some(claim), Some((held, since))) if held == claim => {
                                if since.elapsed() < PENDING_GIVE_UP {
                                    Some((held, since))
                                } else {
                                    if reader.skip(claim) {
                                        stats.update(|c| c.lost += 1);
                                        eprintln!(
                                            "edgemark: {}: a closed request was not written \
                                             within {} s (its closer died?): given up, counted as lost",
                                            path.display(),
                                            PENDING_GIVE_UP.as_secs()
                                        );
                                    }
                                    None
                                }
                            }
                            (Some(claim), _) => Some((claim, Instant::now())),
                        };
                        queue_requests(&reader, &naming, &closed, stats, shared);
                        if d.taken < max {
                            break;
                        }
                    }
                    Err(e) => {
                        let why = format!("cannot drain closed requests: {e}");
                        eprintln!("edgemark: {}: {why}; attaching again", path.display());
                        failing = Some(why);
                        break;
                    }
                }
            }
        }
        if took == 0 {
            let mut sleep = POLL;
            if let Some(d) = deadline {
                sleep = sleep.min(d.saturating_duration_since(Instant::now()));
            }
            // Woken early when the sender makes room, or to stop.
            let _ = tokio::time::timeout(sleep, shared.room.notified()).await;
        } else {
            tokio::task::yield_now().await;
        }
    }
}

/// Turns taken requests into queued spans; an unsampled one is
/// acknowledged at once (there is nothing to send).
fn queue_requests(
    reader: &Arc<ClosedReader>,
    naming: &Naming,
    closed: &[ClosedRequest],
    stats: &Stats,
    shared: &Shared,
) {
    for c in closed {
        if c.trace_flags() & SAMPLED == 0 {
            stats.update(|c| c.unsampled += 1);
            reader.acknowledge(c.claim());
            continue;
        }
        let mut spans = Vec::with_capacity(1 + c.snapshot().segments().len());
        request_spans(c, naming, &mut spans);
        shared.queue.borrow_mut().push(Queued {
            reader: Arc::clone(reader),
            claim: c.claim(),
            spans,
        });
    }
    shared.publish(stats);
    shared.wake.notify_one();
}

/// Sends the queue in batches until the drain stops and the queue is
/// sent (or its deadline passed).
async fn send_loop(config: &Arc<Config>, stats: &Stats, shared: &Shared) {
    let mut client = Client {
        config: Arc::clone(config),
        sender: None,
    };
    // Whether the collector was last found down: said once, and once
    // when it is back.
    let mut down = false;
    let past = |shared: &Shared| shared.stop_by.get().is_some_and(|d| Instant::now() >= d);
    loop {
        // Wait for spans.
        while shared.queue.borrow().spans == 0 {
            if shared.stopping() {
                return;
            }
            shared.wake.notified().await;
        }
        // Wait for a full batch, at most the schedule delay.
        let since = Instant::now();
        while !shared.stopping() && shared.queue.borrow().spans < config.batch {
            let left = config.delay.saturating_sub(since.elapsed());
            if left.is_zero() {
                break;
            }
            let _ = tokio::time::timeout(left, shared.wake.notified()).await;
        }
        if past(shared) {
            return;
        }
        let batch: Vec<Queued> = shared.queue.borrow_mut().take(config.batch);
        let n: usize = batch.iter().map(|q| q.spans.len()).sum();
        shared.in_flight.set(n);
        shared.publish(stats);
        let spans: Vec<Span> = batch.iter().flat_map(|q| q.spans.iter().cloned()).collect();
        let body = Bytes::from(export_request(config, spans).encode_to_vec());
        let n = n as u64;
        let started = Instant::now();
        let mut backoff = BACKOFF_FIRST;
        let outcome = loop {
            // After a signal, no post outlives the flush deadline.
            let post = client.post(body.clone());
            let r = match shared.stop_by.get() {
                Some(d) => {
                    match tokio::time::timeout(d.saturating_duration_since(Instant::now()), post)
                        .await
                    {
                        Ok(r) => r,
                        Err(_) => {
                            client.sender = None;
                            break None;
                        }
                    }
                }
                None => post.await,
            };
            match r {
                Ok(rejected) => {
                    let rejected = rejected.min(n);
                    stats.update(|c| {
                        c.up = true;
                        c.exported += n - rejected;
                        c.dropped_rejected += rejected;
                    });
                    if down {
                        eprintln!("edgemark: OTLP export to {}: sending again", config.url);
                        down = false;
                    }
                    break Some(None);
                }
                Err(e) => {
                    stats.update(|c| {
                        c.up = false;
                        c.failures += 1;
                    });
                    let (why, retry) = match e {
                        PostError::Retry(w) => (w, true),
                        PostError::Refused(w) => (w, false),
                    };
                    if !retry {
                        eprintln!(
                            "edgemark: OTLP export to {}: {why}; {n} spans dropped",
                            config.url
                        );
                        stats.update(|c| c.dropped_rejected += n);
                        break Some(Some(GiveUp::Refused));
                    }
                    if !down {
                        eprintln!(
                            "edgemark: OTLP export to {}: {why}; retrying with backoff \
                             (closed requests wait in the region's ring meanwhile)",
                            config.url
                        );
                        down = true;
                    }
                    if past(shared) {
                        break None;
                    }
                    if started.elapsed() >= RETRY_FOR {
                        stats.update(|c| c.dropped_retries += n);
                        break Some(Some(GiveUp::RetriesExhausted));
                    }
                    // Jitter over the second half of the wait, from the
                    // clock's low bits (not an id: any spread will do).
                    let noise = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| u64::from(d.subsec_nanos()));
                    let jitter = noise % (backoff.as_millis() as u64 / 2 + 1);
                    let mut wait = backoff / 2 + Duration::from_millis(jitter);
                    if let Some(d) = shared.stop_by.get() {
                        wait = wait.min(d.saturating_duration_since(Instant::now()));
                    }
                    tokio::time::sleep(wait).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        };
        shared.in_flight.set(0);
        match outcome {
            // The collector has them.
            Some(None) => batch.iter().for_each(Queued::acknowledge),
            Some(Some(why)) => batch.iter().for_each(|q| q.give_up(why)),
            // The deadline passed with the batch unsent: back to the
            // queue's front, for `run` to count and leave in the ring.
            None => {
                let mut q = shared.queue.borrow_mut();
                for b in batch.into_iter().rev() {
                    q.spans += b.spans.len();
                    q.requests.push_front(b);
                }
                drop(q);
                shared.publish(stats);
                return;
            }
        }
        shared.publish(stats);
        shared.room.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgemark::{Edge, Event, Mark};

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn the_url_and_the_variables() {
        let c = Config::new(Some("http://collector:4318/"), env(&[])).unwrap();
        assert_eq!(c.url, "http://collector:4318/v1/traces");
        assert_eq!(c.authority, "collector:4318");
        assert_eq!(c.target, "/v1/traces");
        assert_eq!(c.resource[0], ("service.name".into(), "edgemark".into()));
        assert_eq!(c.resource[1].0, "host.name");

        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1/base"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-key=a%20b, other = 2"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=ignored,host.name=h1,deployment.environment=ci",
            ),
            ("OTEL_SERVICE_NAME", "stage-a"),
        ];
        let c = Config::new(None, env(&vars)).unwrap();
        assert_eq!(c.url, "http://a:1/base/v1/traces");
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(c.headers.len(), 2);
        assert_eq!(c.headers[0].1, "a b");
        assert_eq!(c.headers[1].0, "other");
        let r: Vec<(&str, &str)> = c
            .resource
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            r,
            [
                ("service.name", "stage-a"),
                ("host.name", "h1"),
                ("deployment.environment", "ci")
            ]
        );
        // The traces endpoint is used as it is; the flag wins over both.
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://b:2/custom"),
        ];
        assert_eq!(
            Config::new(None, env(&vars)).unwrap().url,
            "http://b:2/custom"
        );
        assert_eq!(
            Config::new(Some("http://c:3"), env(&vars)).unwrap().url,
            "http://c:3/v1/traces"
        );
    }

    #[test]
    fn what_is_refused_is_said() {
        let err = |flag: Option<&str>, vars: &[(&str, &str)]| {
            format!("{:#}", Config::new(flag, env(vars)).unwrap_err())
        };
        assert!(err(None, &[]).contains("--otlp needs"));
        assert!(err(Some("https://x:4318"), &[]).contains("https is not supported"));
        assert!(
            err(Some("http://x"), &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")])
                .contains("OTEL_EXPORTER_OTLP_PROTOCOL=grpc: this exporter speaks OTLP over HTTP with protobuf only")
        );
        assert!(
            err(
                Some("http://x"),
                &[("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")]
            )
            .contains("http/json")
        );
        assert!(
            err(
                Some("http://x"),
                &[("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")]
            )
            .contains("gzip")
        );
        assert!(err(Some("http://x"), &[("OTEL_EXPORTER_OTLP_TIMEOUT", "soon")]).contains("soon"));
        assert!(
            err(
                Some("http://x"),
                &[("OTEL_EXPORTER_OTLP_HEADERS", "novalue")]
            )
            .contains("key=value")
        );
    }

    #[test]
    fn a_request_becomes_a_request_span_and_one_span_per_edge_segment() {
        let rec = Recorder::builder()
            .edge(0, 1)
            .edge(1, 2)
            .create_in_memory()
            .unwrap();
        let parent = edgemark::TraceContext::new([7; 16], [9; 8], 1).unwrap();
        let t = rec.begin_traced(Some(parent)).unwrap();
        let (e01, e12) = (Edge::new(0, 1), Edge::new(1, 2));
        let at = |edge, event, ms, domain| {
            assert!(
                rec.record_elapsed(t, Mark::new(edge, event).chunk_seq(4), ms, domain)
                    .is_success()
            );
        };
        at(e01, Event::ProducerFirstNonemptyEmit, 1.0, HOST_MONOTONIC);
        at(e01, Event::EdgeFirstSendComplete, 1.5, HOST_MONOTONIC);
        at(e01, Event::ConsumerFirstAccept, 3.25, HOST_MONOTONIC);
        at(e12, Event::ProducerFirstNonemptyEmit, 5.0, HOST_MONOTONIC);
        // Measured elsewhere.
        at(e12, Event::EdgeFirstSendComplete, 0.75, "worker");
        at(e12, Event::ConsumerFirstAccept, 6.0, HOST_MONOTONIC);
        rec.close(t);
        let mut closed = Vec::new();
        rec.drain_closed(1, &mut closed).unwrap();
        let req = &closed[0];
        let origin = req.origin_unix_ns();
        let me = req.span_id();
        let mut spans = Vec::new();
        request_spans(req, &Naming::of(&rec), &mut spans);
        assert_eq!(spans.len(), 3);
        let (req_span, a, b) = (&spans[0], &spans[1], &spans[2]);
        assert_eq!(req_span.name, REQUEST_SPAN);
        assert_eq!(req_span.span_id, me);
        assert_eq!(req_span.parent_span_id, [9; 8]);
        assert_eq!(
            (req_span.start_time_unix_nano, req_span.end_time_unix_nano),
            (origin, req.closed_unix_ns())
        );
        for child in [a, b] {
            assert_eq!(child.trace_id, [7; 16]);
            assert_eq!(child.parent_span_id, me);
            assert_ne!(child.span_id, me);
        }
        assert_ne!(a.span_id, b.span_id);
        // A second copy of the request (a resend) makes the same ids.
        let mut again = Vec::new();
        request_spans(&req.clone(), &Naming::of(&rec), &mut again);
        assert_eq!(
            again.iter().map(|s| &s.span_id).collect::<Vec<_>>(),
            spans.iter().map(|s| &s.span_id).collect::<Vec<_>>()
        );
        assert_eq!(a.name, "edgemark 0->1");
        assert_eq!(a.start_time_unix_nano, origin + 1_000_000);
        assert_eq!(a.end_time_unix_nano, origin + 3_250_000);
        let names: Vec<&str> = a.events.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "producer_first_nonempty_emit",
                "edge_first_send_complete",
                "consumer_first_accept"
            ]
        );
        let attr = |span: &Span, key: &str| {
            span.attributes
                .iter()
                .find(|k| k.key == key)
                .and_then(|k| k.value.clone())
                .and_then(|v| v.value)
        };
        assert_eq!(
            attr(
                a,
                "edgemark.producer_first_nonempty_emit_to_edge_first_send_complete_ms"
            ),
            Some(any_value::Value::DoubleValue(0.5))
        );
        assert_eq!(
            attr(a, "edgemark.chunk_seq"),
            Some(any_value::Value::IntValue(4))
        );
        assert_eq!(
            attr(a, "edgemark.segment"),
            Some(any_value::Value::IntValue(0))
        );
        // Edge 1->2: the foreign value is placed at the origin, keeps its
        // relative time, and no delta joins it to a value of another domain.
        assert_eq!(b.name, "edgemark 1->2");
        let foreign = b
            .events
            .iter()
            .find(|e| e.name == "edge_first_send_complete")
            .unwrap();
        assert_eq!(foreign.time_unix_nano, origin);
        assert!(
            foreign
                .attributes
                .iter()
                .any(|k| k.key == "edgemark.placed_at_origin")
        );
        assert_eq!(
            attr(b, "edgemark.edge_first_send_complete_ms"),
            Some(any_value::Value::DoubleValue(0.75))
        );
        assert_eq!(
            attr(b, "edgemark.clock_domain"),
            Some(any_value::Value::StringValue(
                "host_monotonic,worker".into()
            ))
        );
        assert!(
            b.attributes
                .iter()
                .all(|k| !k.key.ends_with("_to_edge_first_send_complete_ms")
                    && !k.key.starts_with("edgemark.edge_first_send_complete_to_"))
        );
        assert_eq!(b.start_time_unix_nano, origin + 5_000_000);
        let times: Vec<u64> = b.events.iter().map(|e| e.time_unix_nano).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]));

        // Encoded and decoded whole.
        let c = Config::new(Some("http://x:1"), env(&[])).unwrap();
        let bytes = export_request(&c, spans.clone()).encode_to_vec();
        let back = ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(back.resource_spans[0].scope_spans[0].spans, spans);
    }

    #[test]
    fn the_metrics_parse_in_both_formats() {
        let s = Stats::default();
        s.update(|c| c.dropped_queue = 3);
        let text = s.render(Format::Text);
        assert!(text.contains("# TYPE edgemark_otlp_dropped_spans_total counter\n"));
        assert!(text.contains("edgemark_otlp_dropped_spans_total{reason=\"queue_full\"} 3\n"));
        let om = s.render(Format::OpenMetrics);
        assert!(om.contains("# TYPE edgemark_otlp_dropped_spans counter\n"));
        assert!(om.contains("edgemark_otlp_dropped_spans_total{reason=\"queue_full\"} 3\n"));
    }

    #[test]
    fn a_batch_takes_whole_requests_and_at_least_one() {
        let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
        let reader = Arc::new(rec.closed_reader().unwrap());
        let span = |n: u8| Span {
            name: n.to_string(),
            ..Default::default()
        };
        let queued = |n: u8, k: usize| Queued {
            reader: Arc::clone(&reader),
            claim: u64::from(n),
            spans: vec![span(n); k],
        };
        let mut q = Queue::default();
        q.push(queued(1, 3));
        q.push(queued(2, 2));
        q.push(queued(3, 2));
        assert_eq!(q.spans, 7);
        let claims = |b: &[Queued]| b.iter().map(|q| q.claim).collect::<Vec<_>>();
        // A request larger than the batch still goes, alone.
        assert_eq!(claims(&q.take(2)), [1]);
        assert_eq!(claims(&q.take(4)), [2, 3]);
        assert_eq!(q.spans, 0);
        assert!(q.take(8).is_empty());
    }
}
