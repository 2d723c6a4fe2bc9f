//! The builder of a new region.

#[cfg(not(edgemark_loom))]
use std::path::Path;

use super::{ClockShare, Recorder};
use crate::clock::Clock;
use crate::mark::Edge;
use crate::region::{self, CreateError, Header};
use crate::schema::{Schema, SchemaError};

/// Builds a new region: its edges, slots, kept segments and schema.
///
/// ```
/// use edgemark::Recorder;
/// let dir = tempfile::tempdir().unwrap();
/// let rec = Recorder::builder()
///     .edge(0, 1)
///     .edge(1, 2)
///     .slots(64)
///     .create(dir.path().join("pipeline.region"))
///     .unwrap();
/// assert_eq!(rec.edges().len(), 2);
/// ```
#[derive(Clone, Debug)]
pub struct RegionBuilder {
    edges: Vec<Edge>,
    slots: u32,
    segments: u32,
    /// Entries of the ring of closed requests; `None`: the default.
    closed: Option<u32>,
    schema: Schema,
    group_access: bool,
    clock: Clock,
    /// Whether `create` leaves the file sparse instead of reserving its
    /// space.
    sparse: bool,
    /// Why `domain` refused a name, reported by `create`.
    bad_domain: Option<SchemaError>,
}

impl Recorder {
    /// A builder for a new region.
    pub fn builder() -> RegionBuilder {
        RegionBuilder::new()
    }
}

impl Default for RegionBuilder {
    fn default() -> RegionBuilder {
        RegionBuilder {
            edges: Vec::new(),
            slots: 4096,
            segments: 4,
            closed: None,
            schema: Schema::stream_edges(),
            group_access: false,
            clock: Clock::Monotonic,
            sparse: false,
            bad_domain: None,
        }
    }
}

impl RegionBuilder {
    /// No edges yet, 4096 slots, 4 kept segments per edge, the default schema.
    pub fn new() -> RegionBuilder {
        RegionBuilder::default()
    }
    /// Declares the directed edge `from -> to`.
    pub fn edge(mut self, from: u32, to: u32) -> RegionBuilder {
        self.edges.push(Edge::new(from, to));
        self
    }
    /// Declares several edges.
    pub fn edges(mut self, edges: impl IntoIterator<Item = impl Into<Edge>>) -> RegionBuilder {
        self.edges.extend(edges.into_iter().map(Into::into));
        self
    }
    /// The number of request slots: how many requests can be open at once.
    pub fn slots(mut self, slots: u32) -> RegionBuilder {
        self.slots = slots;
        self
    }
    /// How many of the newest segments each edge of a request keeps.
    pub fn segments(mut self, segments: u32) -> RegionBuilder {
        self.segments = segments;
        self
    }
    /// The schema (default: [`Schema::stream_edges`]).
    pub fn schema(mut self, schema: Schema) -> RegionBuilder {
        self.schema = schema;
        self
    }
    /// Declares a clock domain for values measured elsewhere. Invalid names
    /// are reported by `create`.
    pub fn domain(mut self, name: &str) -> RegionBuilder {
        match self.schema.clone().with_domain(name) {
            Ok(s) => self.schema = s,
            Err(e) => self.bad_domain = Some(e),
        }
        self
    }
    /// Lets the file's group read and write the region (owner-only by
    /// default).
    pub fn group_access(mut self, yes: bool) -> RegionBuilder {
        self.group_access = yes;
        self
    }

    /// The region's shared clock (default [`Clock::Monotonic`]).
    /// [`Clock::Counter`] is honoured only where the kernel trusts the
    /// time-stamp counter and its calibration succeeds (about 15 ms at
    /// creation); elsewhere the region is created with
    /// [`Clock::Monotonic`]: [`Viewer::clock`](crate::Viewer::clock) says which it got.
    ///
    /// ```
    /// # use edgemark::{Recorder, clock::Clock};
    /// let rec = Recorder::builder()
    ///     .edge(0, 1)
    ///     .clock(Clock::Counter)
    ///     .create_in_memory()
    ///     .unwrap();
    /// assert!(matches!(rec.clock(), Some(Clock::Counter | Clock::Monotonic)));
    /// ```
    pub fn clock(mut self, clock: Clock) -> RegionBuilder {
        self.clock = clock;
        self
    }

    /// Whether [`RegionBuilder::create`] leaves the region file sparse
    /// (default `false`).
    ///
    /// By default `create` reserves the file's whole space on its file
    /// system (`posix_fallocate`) and fails with [`CreateError::NoSpace`]
    /// if it cannot, so that a full file system is found at creation. A
    /// sparse region takes space only as its pages are first written (a
    /// large region that is mostly idle costs less memory on `/dev/shm`),
    /// but a page that cannot be allocated later is lost to the process
    /// that writes it: its `begin`, `start_segment` and `close` then refuse
    /// ([`Outcome::Faulted`](crate::Outcome::Faulted)), its records on that
    /// page reach nobody, and its sweeps fail with
    /// [`SweepError::NoSpace`](crate::SweepError::NoSpace)
    /// (`docs/limitations.md`).
    pub fn sparse(mut self, yes: bool) -> RegionBuilder {
        self.sparse = yes;
        self
    }

    /// How many closed requests the region keeps for a reader such as
    /// `edgemark export --otlp` ([`Recorder::drain_closed`]): entries of
    /// its ring of closed requests. Each close writes its request's final
    /// values and trace context into the next entry; a reader that falls
    /// more than this many closes behind loses the oldest (counted). 0
    /// keeps none. Default: the slot count, at most 4096.
    ///
    /// Each entry takes about as many bytes as a slot
    /// ([`RegionInfo::ring_stride`](crate::report::RegionInfo::ring_stride)).
    ///
    /// [`Recorder::drain_closed`]: crate::Recorder::drain_closed
    pub fn closed_entries(mut self, entries: u32) -> RegionBuilder {
        self.closed = Some(entries);
        self
    }

    fn header(&self) -> Result<Header, CreateError> {
        if let Some(bad) = &self.bad_domain {
            return Err(CreateError::Schema(bad.clone()));
        }
        region::new_header(
            &self.edges,
            self.slots,
            self.segments,
            self.closed.unwrap_or(self.slots.min(4096)),
            &self.schema,
            self.group_access,
            self.clock,
        )
    }

    /// Creates the region file at `path` (a new file, owner-only unless
    /// group access was asked for), reserves its space unless
    /// [`RegionBuilder::sparse`], and returns a recorder on it. A creation
    /// that fails after making the file removes it again.
    ///
    /// Mapping a region file (here, in [`RegionBuilder::create_sealed`] and
    /// in every attach) installs, once per process, a process-wide `SIGBUS`
    /// handler that keeps a file shrunk under the mapping from killing the
    /// process; faults outside edgemark's mappings go to the action it
    /// replaced (`docs/design.md`, "A file shrunk under a mapping").
    #[cfg(not(edgemark_loom))]
    pub fn create(&self, path: impl AsRef<Path>) -> Result<Recorder, CreateError> {
        let path = path.as_ref();
        let header = self.header()?;
        let storage = region::create_file(path, &header, self.sparse)?;
        Ok(Recorder::from_header(
            storage,
            header,
            Some(path.to_owned()),
            ClockShare::Shared,
        ))
    }

    /// Creates the region in a sealed memory file that no process can shrink
    /// or grow (so none can make another's accesses fault; see
    /// `docs/limitations.md`). It lives while this process keeps the
    /// recorder; others attach through [`Viewer::path`](crate::Viewer::path), a
    /// `/proc/<pid>/fd/<fd>` path.
    #[cfg(not(edgemark_loom))]
    pub fn create_sealed(&self) -> Result<Recorder, CreateError> {
        let header = self.header()?;
        let sealed = region::create_sealed(&header)?;
        Ok(Recorder::from_header(
            sealed.storage,
            header,
            Some(sealed.path),
            ClockShare::Shared,
        ))
    }

    /// Creates a region on the heap, private to this process: the same
    /// protocol without a file (for tests, benchmarks and single-process
    /// use).
    pub fn create_in_memory(&self) -> Result<Recorder, CreateError> {
        let header = self.header()?;
        let storage = region::create_in_memory(&header);
        Ok(Recorder::from_header(
            storage,
            header,
            None,
            ClockShare::Shared,
        ))
    }
}
