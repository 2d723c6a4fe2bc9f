//! # edgemark
//!
//! A lock-free, shared-memory recorder of once-only "first event" timestamps
//! for the directed stage edges of a multi-stage streaming inference
//! pipeline.
//!
//! An orchestrator creates a region (a memory-mapped file); for each request
//! it [`begin`](Recorder::begin)s, it hands the small [`Token`] to the stage
//! workers inside the dispatch message they already get. Workers
//! [`attach`](Recorder::attach) to the region by path and
//! [`record`](Recorder::record) each first event with one compare-and-swap,
//! without sending anything to the orchestrator. Generation counters fence
//! stale tokens, retired segments and reused slots. Any process can take a
//! detached [`Snapshot`], which serialises exactly as the upstream recorder's
//! `metrics["stream_edge_metrics"]`.
//!
//! ```
//! use edgemark::{Edge, Event::*, Mark, Outcome, Recorder};
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("pipeline.region");
//! // The orchestrator.
//! let owner = Recorder::builder().edge(0, 1).edge(1, 2).create(&path)?;
//! let token = owner.begin().expect("a free slot");
//! let wire = token.to_string(); // travels in the dispatch message
//!
//! // A stage worker, normally in another process.
//! let worker = Recorder::attach(&path)?;
//! let token: edgemark::Token = wire.parse()?;
//! let e01 = Edge::new(0, 1);
//! assert_eq!(worker.record(token, Mark::new(e01, ProducerFirstNonemptyEmit).chunk_seq(0)), Outcome::Recorded);
//! assert_eq!(worker.record(token, Mark::new(e01, EdgeFirstSendComplete)), Outcome::Recorded);
//! assert_eq!(worker.record(token, Mark::new(e01, EdgeFirstSendComplete)), Outcome::Duplicate);
//!
//! // The orchestrator closes the request on every removal path.
//! let last = owner.close(token);
//! let seg = last.segment(e01, 0).unwrap();
//! assert!(seg.elapsed_between(ProducerFirstNonemptyEmit, EdgeFirstSendComplete).is_some());
//! println!("{}", serde_json::to_string(&last)?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## The API by category
//!
//! At the root, what a pipeline uses:
//!
//! - **Handles**: [`Recorder`] (begins, records into, segments, closes and
//!   reads requests), [`Viewer`] (reads only; a recorder dereferences to
//!   one); [`RegionBuilder`] creates a region, [`AttachOptions`] attaches
//!   to one; [`default_dir`].
//! - **Recording**: [`Token`] (and [`ParseTokenError`]), [`RegionId`] (and
//!   [`ParseRegionIdError`]), [`Mark`],
//!   [`Edge`], [`Event`], [`Outcome`] (what every writing call says).
//! - **Reading**: [`Snapshot`], [`RequestState`].
//! - **Errors**, one per operation: [`CreateError`] (create),
//!   [`AttachError`] (attach), [`SweepError`] (a read of every slot:
//!   sweeps, reclaims, histograms, [`Viewer::check`]); [`GeometryError`]
//!   is the header's part of the first two.
//!
//! In modules, the rest:
//!
//! - [`schema`]: the events and clock domains a region declares
//!   ([`schema::Schema`], [`schema::EventSpec`], [`schema::EventId`],
//!   [`schema::DomainId`], [`schema::HOST_MONOTONIC`],
//!   [`schema::SchemaError`]).
//! - [`snapshot`]: the parts of a snapshot ([`snapshot::EdgeSegment`],
//!   [`snapshot::Observed`]).
//! - [`clock`]: the region's shared clock ([`clock::Clock`],
//!   [`clock::ClockIdentity`], [`clock::monotonic_ns`],
//!   [`clock::DISTRUST_COUNTER_ENV`]).
//! - [`report`]: what a region says about itself and its closed requests
//!   ([`report::RegionInfo`], [`report::Counters`], [`report::METRICS`]
//!   (the one table of its counters and gauges), [`report::EdgeHistogram`], [`report::Histogram`],
//!   [`report::BUCKETS_MS`], [`report::ReclaimReport`], [`report::ExpireReport`],
//!   [`report::Owner`], [`report::PidsUnjudged`]).
//! - [`trace`]: past one host: a request's W3C trace context
//!   ([`TraceContext`], at the root too, for [`Recorder::begin_traced`];
//!   [`trace::TraceparentError`]) and the closed requests a reader takes
//!   from the region ([`trace::ClosedRequest`] and [`trace::Drained`], from
//!   [`Recorder::drain_closed`]) to send on as spans.
//! - [`limits`]: the largest region, schema and value edgemark holds.
//! - `prometheus` (feature `prometheus`): the Prometheus and OpenMetrics
//!   text of a region, for a `/metrics` handler.
//!
//! The layers, bottom up: word encodings and the layout, the atomics
//! facade, the clock, names (schema, edges and marks), the clock-domain
//! table, the reports and processes, the protocol over a slice of atomics
//! (`docs/design.md` states it in full, with its layer table), the region
//! (create, attach, validate, map), and this crate's public types (the
//! recorder and snapshots).

#![deny(unsafe_op_in_unsafe_fn)]
// Under loom only the heap-backed protocol is built; the file layer is out.
#![cfg_attr(edgemark_loom, allow(dead_code, unused_imports))]
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]

mod catalog;
pub mod clock;
mod domains;
#[cfg(not(edgemark_loom))]
mod fault;
#[cfg(not(edgemark_loom))]
pub mod follow;
mod layout;
mod mark;
mod outcome;
mod process;
#[cfg(all(feature = "prometheus", not(edgemark_loom)))]
pub mod prometheus;
mod protocol;
mod recorder;
mod region;
pub mod report;
pub mod schema;
pub mod snapshot;
pub mod span_plan;
mod sync;
mod token;
pub mod trace;
mod word;

// Only in the loom build (`--cfg edgemark_loom`), never in a release: the
// domain-table models need registrants without the per-process name cache
// that every handle keeps (each stands for a separate process) and a
// reader of an entry's raw state, which no public call gives.
#[cfg(edgemark_loom)]
#[doc(hidden)]
pub use domains::LoomTable;

pub use layout::GeometryError;
pub use mark::{Edge, Mark};
pub use outcome::Outcome;
pub use recorder::{
    AttachOptions, ClosedReader, GiveUp, ReaderError, ReaderHolder, Recorder, RegionBuilder, Viewer,
};
pub use region::{AttachError, CreateError, SweepError};
pub use schema::Event;
pub use snapshot::{RequestState, Snapshot};
pub use token::{ParseRegionIdError, ParseTokenError, RegionId, Token};
pub use trace::TraceContext;

/// The limits of a region, its schema and its values; beyond them
/// [`RegionBuilder::create`] fails or a record is refused.
pub mod limits {
    pub use crate::layout::{MAX_CLOSED_ENTRIES, MAX_EDGES, MAX_SEGMENTS, MAX_SLOTS};
    pub use crate::schema::{MAX_DOMAINS, MAX_EVENTS, MAX_NAME_LEN};

    /// The longest elapsed time a value holds, in milliseconds (about 38.2
    /// hours); longer ones are refused as
    /// [`Outcome::OutOfRange`](crate::Outcome::OutOfRange).
    pub const MAX_ELAPSED_MS: f64 = crate::word::MAX_ELAPSED_US as f64 / 1000.0;
    /// The largest chunk sequence number a value holds.
    pub const MAX_CHUNK_SEQ: u64 = crate::word::MAX_CHUNK_SEQ;
}

/// The default directory for region files: `/dev/shm` where it exists (a
/// memory-backed filesystem), else the system's temporary directory.
pub fn default_dir() -> std::path::PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_owned()
    } else {
        std::env::temp_dir()
    }
}
