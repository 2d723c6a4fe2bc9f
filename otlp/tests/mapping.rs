//! Span mapping and the envelope, through the crate's API: a closed
//! request taken from a real (in-memory) region's ring.

use edgemark::schema::HOST_MONOTONIC;
use edgemark::{Edge, Event, Mark, Recorder};
use edgemark_otlp::Config;
use edgemark_otlp::envelope::export_request;
use edgemark_otlp::mapping::{Naming, REQUEST_SPAN, request_spans};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

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
    let c = Config::new(Some("http://x:1"), |_| None).unwrap();
    let bytes = export_request(&c, spans.clone()).encode_to_vec();
    let back = ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap();
    assert_eq!(back.resource_spans[0].scope_spans[0].spans, spans);
}

#[test]
fn a_gzip_body_decompresses_to_the_export_request() {
    use std::io::Read as _;
    let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    rec.close(rec.begin().unwrap());
    let mut closed = Vec::new();
    rec.drain_closed(1, &mut closed).unwrap();
    let mut spans = Vec::new();
    request_spans(&closed[0], &Naming::of(&rec), &mut spans);
    let plain = Config::new(Some("http://x:1"), |_| None).unwrap();
    let gz = Config::new(Some("http://x:1"), |k| {
        (k == "OTEL_EXPORTER_OTLP_COMPRESSION").then(|| "gzip".to_owned())
    })
    .unwrap();
    let raw = edgemark_otlp::envelope::body(&plain, spans.clone());
    let packed = edgemark_otlp::envelope::body(&gz, spans);
    assert_eq!(&packed[..2], &[0x1f, 0x8b], "a gzip member");
    let mut back = Vec::new();
    flate2::read::GzDecoder::new(packed.as_slice())
        .read_to_end(&mut back)
        .unwrap();
    assert_eq!(back, raw);
    assert!(ExportTraceServiceRequest::decode(back.as_slice()).is_ok());
}
