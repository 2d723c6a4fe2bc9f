//! The OTLP exporter of an edgemark region: each closed request of the
//! region as OpenTelemetry spans, sent to a collector over OTLP/HTTP with
//! protobuf. `edgemark export --otlp` is one program that runs it; any
//! other may.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use edgemark_otlp::Exporter;
//!
//! // The OTEL_* variables, with what the builder sets over them.
//! let exporter = Exporter::builder("/dev/shm/pipeline.region")
//!     .with_endpoint("http://127.0.0.1:4318")
//!     .start()?;
//! // The program's own signal handling calls `stopper.stop()`.
//! let stopper = exporter.stopper();
//! # stopper.stop();
//! exporter.join();
//! # Ok(())
//! # }
//! ```
//!
//! The exporter attaches the region file itself, and attaches it again when
//! another file takes its place or a drain fails. It prints nothing and
//! handles no signal: its notes (a collector down and back, requests
//! adopted, a region attached again, what a stop left unsent) go to the
//! [`log`](https://docs.rs/log) facade under the target `edgemark_otlp`,
//! for the program's logger to show, and a program that stops on a signal
//! calls [`Stopper::stop`].
//!
//! `http://` and `https://` endpoints: https through rustls (the `ring`
//! provider), ALPN `http/1.1`, the collector's certificate always verified
//! for the URL's host (a name, also sent as SNI, or an IP address in the
//! certificate's subject alternative names), against the system's roots or
//! the CA file of `OTEL_EXPORTER_OTLP_CERTIFICATE`; mutual TLS with
//! `OTEL_EXPORTER_OTLP_CLIENT_KEY` and `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE`
//! (each with its `TRACES_` form, which wins; see [`config`]). A failed
//! handshake is a failed post, retried, and counted apart as well
//! ([`Counts::tls_failures`](stats::Counts::tls_failures)).
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
//! Two tasks share one thread and its single-threaded runtime: the drain takes closed requests from the region's
//! ring as a registered reader ([`edgemark::ClosedReader`]), only as many as
//! the queue has room for, turns them into spans and queues them; the
//! sender posts batches of the queue, one at a time, and retries a failed
//! post with exponential backoff for [`RETRY_FOR`]. A request is
//! acknowledged to the region when the collector has accepted the post
//! that carried it, and given up (counted by reason) when the collector
//! refuses it, answers with a success too long to read
//! ([`client::MAX_ANSWER`]), or its retries run out. While the queue is
//! full the drain takes nothing: requests wait in the ring, and the ones
//! the ring overwrites meanwhile are counted by the closes that overwrite
//! them. So a collector that is down costs memory up to the bound and
//! never blocks a close, the drain or `/metrics` ([`Stats`], served under
//! `edgemark_otlp_...`, and the region's counters).
//!
//! At least once: once stopped ([`Stopper::stop`], or at the end of
//! [`ExporterBuilder::run_for`]) the exporter stops taking, sends what it
//! holds for at most [`FLUSH_DEADLINE`], then logs what is left and ends,
//! leaving that in the ring taken in its name; the next exporter on the
//! region adopts it and sends it, as it adopts what a killed exporter
//! left. A segment span's id is derived from the request's span id, edge
//! and segment
//! ([`ClosedRequest::segment_span_id`](edgemark::trace::ClosedRequest::segment_span_id)),
//! so a request sent twice makes no second span where spans are keyed by
//! id.
//!
//! The crate is laid out as the OpenTelemetry exporters are: [`config`]
//! (the variables, each beside its default), `tls` (the certificate files
//! of an `https://` URL), `error` ([`ConfigError`]), `exporter` (the
//! builder, the running exporter and its stopper), [`mapping`] (spans),
//! [`envelope`] (the export request), [`queue`], [`client`] (HTTP), `send`
//! (batches, retries, acknowledgment), `drain` (the ring), `shared` (what
//! the drain and the sender share, and how long a stopped exporter goes on
//! sending), `region` (how it attaches the region file; following the file is the
//! core's [`edgemark::follow`]) and [`stats`] (prometheus-client).

#![warn(missing_docs)]

pub mod client;
pub mod config;
pub mod envelope;
pub mod mapping;
pub mod queue;
pub mod stats;

mod drain;
mod error;
mod exporter;
mod region;
mod send;
mod shared;
mod tls;

pub use config::{Config, ConfigError};
pub use exporter::{Exporter, ExporterBuilder, StartError, Stopper};
pub use send::RETRY_FOR;
pub use shared::FLUSH_DEADLINE;
pub use stats::Stats;
