//! Span mapping: a closed request becomes its request span and one span
//! per edge segment.

use edgemark::schema::{EventId, HOST_MONOTONIC};
use edgemark::trace::ClosedRequest;
use edgemark::{Edge, Recorder};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::{Event as SpanEvent, SpanKind};

/// The name of the span of a whole request.
pub const REQUEST_SPAN: &str = "edgemark request";

/// The names spans are made with: the region's events, in schema order,
/// and its id.
#[derive(Debug, Clone)]
pub struct Naming {
    events: Vec<String>,
    region: String,
    /// The most spans one request makes: its own and one per kept edge
    /// segment.
    pub(crate) spans_per_request: usize,
}

impl Naming {
    /// The names of `rec`'s region.
    pub fn of(rec: &Recorder) -> Naming {
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

pub(crate) fn attribute(key: impl Into<String>, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}
pub(crate) fn string(v: impl Into<String>) -> any_value::Value {
    any_value::Value::StringValue(v.into())
}
fn int_value(v: impl Into<i64>) -> any_value::Value {
    any_value::Value::IntValue(v.into())
}
fn double_value(v: f64) -> any_value::Value {
    any_value::Value::DoubleValue(v)
}

/// Appends the spans of one closed request to `out`: its request span,
/// then one span per edge segment.
pub fn request_spans(req: &ClosedRequest, naming: &Naming, out: &mut Vec<Span>) {
    let origin = req.origin_unix_ns();
    let snapshot = req.snapshot();
    let mut attributes = vec![
        attribute("edgemark.region", string(naming.region.as_str())),
        attribute("edgemark.token", string(req.token().to_string())),
        attribute(
            "edgemark.segments",
            int_value(snapshot.segments().len() as i64),
        ),
    ];
    if snapshot.dropped_segments() > 0 {
        attributes.push(attribute(
            "edgemark.dropped_segments",
            int_value(snapshot.dropped_segments() as i64),
        ));
    }
    if snapshot.is_corrupt() {
        attributes.push(attribute(
            "edgemark.corrupt",
            any_value::Value::BoolValue(true),
        ));
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
            attribute("edgemark.edge", string(edge.as_str())),
            attribute("edgemark.edge.from", int_value(seg.from_stage())),
            attribute("edgemark.edge.to", int_value(seg.to_stage())),
            attribute("edgemark.segment", int_value(index)),
        ];
        if let Some(c) = seg.first_chunk_seq() {
            attributes.push(attribute("edgemark.chunk_seq", int_value(c as i64)));
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
            attributes.push(attribute(format!("edgemark.{name}_ms"), double_value(ms)));
            attributes.push(attribute(
                format!("edgemark.{name}.clock_domain"),
                string(domain),
            ));
            let mut ev = vec![
                attribute("edgemark.edge", string(edge.as_str())),
                attribute("edgemark.segment", int_value(index)),
                attribute("edgemark.elapsed_ms", double_value(ms)),
                attribute("edgemark.clock_domain", string(domain)),
            ];
            // The delta from the previous recorded event, only within one
            // clock domain.
            if let Some((prev, prev_name)) = previous
                && let Some(d) = seg.elapsed_between(prev, id)
            {
                attributes.push(attribute(
                    format!("edgemark.{prev_name}_to_{name}_ms"),
                    double_value(d),
                ));
                ev.push(attribute("edgemark.since_previous_ms", double_value(d)));
                ev.push(attribute("edgemark.previous_event", string(prev_name)));
            }
            previous = Some((id, name.as_str()));
            if !host {
                ev.push(attribute(
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
        attributes.push(attribute(
            "edgemark.clock_domain",
            string(domains.join(",")),
        ));
        attributes.push(attribute("edgemark.region", string(naming.region.as_str())));
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
