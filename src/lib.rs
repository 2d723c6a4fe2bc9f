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
//! - **Regions**: [`Recorder`] (the handle every process uses),
//!   [`RegionBuilder`] (create), [`AttachOptions`] (attach),
//!   [`default_dir`]; errors [`CreateError`], [`AttachError`] (and
//!   [`GeometryError`] within them).
//! - **Recording**: [`Token`] (and [`ParseTokenError`]), [`Mark`], [`Edge`],
//!   [`Event`], [`EventId`], [`Outcome`] (what every record call says).
//! - **Reading**: [`Snapshot`], [`EdgeSegment`], [`Observed`],
//!   [`RequestState`].
//! - **Schemas**: [`Schema`], [`EventSpec`], [`DomainId`],
//!   [`HOST_MONOTONIC`], [`SchemaError`].
//! - **Clocks**: [`Clock`], [`ClockIdentity`], [`monotonic_ns`],
//!   [`DISTRUST_COUNTER_ENV`].
//! - **Reports**: [`RegionInfo`], [`Counters`], [`EdgeHistogram`],
//!   [`Histogram`], [`BUCKETS_MS`], [`ReclaimReport`], [`Owner`],
//!   [`PidsUnjudged`]; the Prometheus text in `export` (feature
//!   `prometheus`).
//! - **Limits**: [`MAX_SLOTS`], [`MAX_SEGMENTS`], [`MAX_EDGES`],
//!   [`MAX_EVENTS`], [`MAX_DOMAINS`], [`MAX_NAME_LEN`], [`MAX_ELAPSED_MS`],
//!   [`MAX_CHUNK_SEQ`].
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
mod clock;
mod domains;
#[cfg(not(edgemark_loom))]
mod fault;
#[cfg(edgemark_loom)]
#[doc(hidden)]
pub use domains::LoomTable;
#[cfg(all(feature = "prometheus", not(edgemark_loom)))]
pub mod export;
mod layout;
mod mark;
mod outcome;
mod process;
mod protocol;
mod recorder;
mod region;
mod report;
mod schema;
mod snapshot;
mod sync;
mod token;
mod word;

pub use clock::{Clock, ClockIdentity, DISTRUST_COUNTER_ENV, monotonic_ns};
pub use layout::{BUCKETS_MS, GeometryError, MAX_EDGES, MAX_SEGMENTS, MAX_SLOTS};
pub use mark::{Edge, Mark};
pub use outcome::Outcome;
pub use recorder::{AttachOptions, Recorder, RegionBuilder, Viewer};
pub use region::{AttachError, CreateError, SweepError};
pub use report::{
    Counters, EdgeHistogram, Histogram, Owner, PidsUnjudged, ReclaimReport, RegionInfo,
};
pub use schema::{
    DomainId, Event, EventId, EventSpec, HOST_MONOTONIC, MAX_DOMAINS, MAX_EVENTS, MAX_NAME_LEN,
    Schema, SchemaError,
};
pub use snapshot::{EdgeSegment, Observed, RequestState, Snapshot};
pub use token::{ParseTokenError, Token};

/// The longest elapsed time a value holds, in milliseconds (about 38.2
/// hours); longer ones are refused as [`Outcome::OutOfRange`].
pub const MAX_ELAPSED_MS: f64 = word::MAX_ELAPSED_US as f64 / 1000.0;
/// The largest chunk sequence number a value holds.
pub const MAX_CHUNK_SEQ: u64 = word::MAX_CHUNK_SEQ;

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
