//! Span mapping: a closed request becomes its request span and one span
//! per edge segment.

use edgemark::trace::ClosedRequest;
use edgemark::{Edge, Recorder};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::{Event as SpanEvent, SpanKind};

/// The name of the span of a whole request.
pub const REQUEST_SPAN: &str = "edgemark request";

/// What a request's spans take from its region: the region's id (event
/// names come with each segment), and the most spans one request makes.
#[derive(Debug, Clone)]
pub struct Naming {
    region: String,
    /// The most spans one request makes: its own and one per kept edge
    /// segment.
    pub(crate) spans_per_request: usize,
}

impl Naming {
    /// The names of `rec`'s region.
    pub fn of(rec: &Recorder) -> Naming {
        Naming {
            region: rec
                .info()
                .map_or_else(String::new, |i| i.region_id.to_string()),
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
        let mut attributes = vec![
            attribute("edgemark.edge", string(edge.as_str())),
            attribute("edgemark.edge.from", int_value(seg.from_stage())),
            attribute("edgemark.edge.to", int_value(seg.to_stage())),
            attribute("edgemark.segment", int_value(index)),
        ];
        if let Some(c) = seg.first_chunk_seq() {
            attributes.push(attribute("edgemark.chunk_seq", int_value(c as i64)));
        }
        // The core's span plan: placement, time order, deltas.
        let plan = seg.span_plan(origin);
        let mut events = Vec::with_capacity(plan.events.len());
        for e in &plan.events {
            let name = e.name.as_str();
            attributes.push(attribute(
                format!("edgemark.{name}_ms"),
                double_value(e.elapsed_ms),
            ));
            attributes.push(attribute(
                format!("edgemark.{name}.clock_domain"),
                string(e.clock_domain.as_str()),
            ));
            let mut ev = vec![
                attribute("edgemark.edge", string(edge.as_str())),
                attribute("edgemark.segment", int_value(index)),
                attribute("edgemark.elapsed_ms", double_value(e.elapsed_ms)),
                attribute("edgemark.clock_domain", string(e.clock_domain.as_str())),
            ];
            if let Some((prev, d)) = &e.since_previous {
                attributes.push(attribute(
                    format!("edgemark.{prev}_to_{name}_ms"),
                    double_value(*d),
                ));
                ev.push(attribute("edgemark.since_previous_ms", double_value(*d)));
                ev.push(attribute("edgemark.previous_event", string(prev.as_str())));
            }
            if e.placed_at_origin {
                ev.push(attribute(
                    "edgemark.placed_at_origin",
                    any_value::Value::BoolValue(true),
                ));
            }
            events.push(SpanEvent {
                time_unix_nano: e.at_unix_ns,
                name: e.name.clone(),
                attributes: ev,
                dropped_attributes_count: 0,
            });
        }
        attributes.push(attribute(
            "edgemark.clock_domain",
            string(plan.clock_domains.join(",")),
        ));
        attributes.push(attribute("edgemark.region", string(naming.region.as_str())));
        let (first, last) = (plan.start_unix_ns, plan.end_unix_ns);
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
