//! The envelope of a post: the spans under the exporter's resource and
//! instrumentation scope.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

use crate::config::Config;
use crate::mapping::{attribute, string};

/// The export request of `spans` under `config`'s resource.
pub fn export_request(config: &Config, spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: config
                    .resource
                    .iter()
                    .map(|(k, v)| attribute(k.as_str(), string(v.as_str())))
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

/// The body of a post of `spans`: the export request's protobuf encoding,
/// gzip-compressed if `config` says so.
pub fn body(config: &Config, spans: Vec<Span>) -> Vec<u8> {
    use prost::Message as _;
    let raw = export_request(config, spans).encode_to_vec();
    if !config.gzip {
        return raw;
    }
    use std::io::Write as _;
    let mut gz = flate2::write::GzEncoder::new(
        Vec::with_capacity(raw.len() / 4),
        flate2::Compression::fast(),
    );
    // Writing into a Vec does not fail.
    let _ = gz.write_all(&raw);
    gz.finish().unwrap_or(raw)
}
