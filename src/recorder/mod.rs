//! The public recorder: the handle every process uses.
//!
//! This file holds the handle, what it keeps of its region, and a
//! request's life (begin, start segment, close, snapshot); `record.rs` the
//! record path, `recorded.rs` the fenced read of one cell, `sweep.rs` the
//! reads of every slot (sweeps, reclaims, histograms), `info.rs` what the
//! region declares and counts, `closed.rs` a request's trace context and
//! the drain of closed requests, `builder.rs` and `attach.rs` the two ways
//! to a recorder.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::catalog::Catalog;
use crate::clock::{self, Clock, CounterScale};
use crate::mark::{Edge, EdgeIndex};
use crate::outcome::Outcome;
use crate::process;
use crate::protocol::{Both, Closed, Discard, Occupant, Proto, ReadInto, RingWrite, Tally};
use crate::region::{self, Header, Storage};
use crate::report::PidsUnjudged;
use crate::snapshot::{Refill, RequestState, Snapshot, has_unknown};
use crate::token::{RegionId, Token};
use crate::trace::{SlotTrace, TraceContext};
use record::{EVENT_IDS, RecordSpec};

mod attach;
mod builder;
mod closed;
mod info;
mod reader;
mod record;
mod recorded;
mod sweep;

pub use attach::AttachOptions;
pub use builder::RegionBuilder;
pub use reader::{ClosedReader, GiveUp, ReaderError, ReaderHolder};

/// Whether a region's `host_monotonic` domain is this process's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ClockShare {
    /// It is (same boot, same time namespace): records may read the clock.
    Shared,
    /// Same boot and time namespace, but the region's clock is the counter
    /// and this process does not trust it (the kernel does not, or the rate
    /// measured at attach differs from the region's): as `Foreign` for the
    /// shared domain, as `Shared` for process start times.
    Untrusted,
    /// It is not: only values measured elsewhere can be recorded.
    Foreign,
}

impl ClockShare {
    /// Whether this process may write values of the region's shared clock
    /// ([`ClockShare::Shared`]): begin, the clock-reading record, and
    /// `record_elapsed` into `host_monotonic`. What
    /// [`RegionInfo::shares_clock`] reports.
    #[inline]
    fn reads_clock(self) -> bool {
        self == ClockShare::Shared
    }

    /// Whether this process is in the region's boot and time namespace
    /// (not [`ClockShare::Foreign`]): process start times compare.
    #[inline]
    fn same_namespace(self) -> bool {
        self != ClockShare::Foreign
    }
}

/// The calling thread as a lock holder (its thread id).
fn holder() -> u32 {
    process::thread_id()
}

struct Inner {
    storage: Storage,
    /// The region's validated header: its geometry, edges, identity and
    /// clock. Its schema is shared with `names`.
    header: Header,
    /// The names this process has met, with the schema.
    names: Arc<Catalog>,
    /// `header.edges` by stage pair, for the record path.
    edge_index: EdgeIndex,
    /// Per schema event (the first `header.layout.events` entries): what
    /// the record path needs of it, inline rather than behind the schema's
    /// `Arc`.
    events: [RecordSpec; EVENT_IDS],
    /// Whether the region's `host_monotonic` domain is this process's
    /// clock.
    clock: ClockShare,
    /// The conversion of a counter region (`None` in a monotonic one).
    counter: Option<CounterScale>,
    path: Option<PathBuf>,
}

/// A handle on a region: begins, records into, segments, closes and
/// snapshots requests. Cheap to clone (one `Arc`), `Send` and `Sync`.
///
/// A [`Recorder::disabled`] recorder is a value of the same type whose calls
/// do nothing and cost about a branch, for collection that is off by default.
///
/// ```
/// use edgemark::{Edge, Event, Mark, Outcome, Recorder};
/// let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
/// let token = rec.begin().unwrap();
/// let edge = Edge::new(0, 1);
/// let emit = Mark::new(edge, Event::ProducerFirstNonemptyEmit).chunk_seq(3);
/// assert_eq!(rec.record(token, emit), Outcome::Recorded);
/// assert_eq!(rec.record(token, emit), Outcome::Duplicate);
/// let last = rec.close(token);
/// assert_eq!(last.segment(edge, 0).unwrap().first_chunk_seq(), Some(3));
/// assert_eq!(rec.record(token, Mark::new(edge, Event::ConsumerFirstAccept)), Outcome::Closed);
/// ```
///
/// Everything a [`Viewer`] reads, a recorder reads too: it dereferences to
/// its viewer (`&Recorder` goes wherever `&Viewer` is asked for).
#[derive(Clone)]
pub struct Recorder {
    /// The region, read through the viewer; a recorder's region is mapped
    /// for writing.
    view: Viewer,
}

/// A read-only handle on a region: snapshots, sweeps, counters, histograms
/// and what the region declares, and nothing that writes. Cheap to clone
/// (one `Arc`), `Send` and `Sync`.
///
/// [`AttachOptions::view`] (or [`Viewer::attach`]) opens and maps a region
/// file for reading only, which read permission on the file allows: what a
/// monitoring user needs. A [`Recorder`] dereferences to the viewer of its
/// own region.
///
/// ```
/// # use edgemark::{Recorder, Viewer};
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("r.region");
/// let owner = Recorder::builder().edge(0, 1).create(&path)?;
/// let t = owner.begin().unwrap();
/// let viewer = Viewer::attach(&path)?;
/// assert_eq!(viewer.open_requests()?, vec![t]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A viewer cannot write, as a type: this does not compile.
///
/// ```compile_fail
/// # use edgemark::{Edge, Event, Mark, Recorder, Viewer};
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("r.region");
/// # let owner = Recorder::builder().edge(0, 1).create(&path)?;
/// # let t = owner.begin().unwrap();
/// let viewer = Viewer::attach(&path)?;
/// viewer.record(t, Mark::new(Edge::new(0, 1), Event::ProducerFirstNonemptyEmit));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Viewer {
    inner: Option<Arc<Inner>>,
}

impl std::ops::Deref for Recorder {
    type Target = Viewer;

    #[inline]
    fn deref(&self) -> &Viewer {
        &self.view
    }
}

impl fmt::Debug for Recorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.view.debug("Recorder", f)
    }
}

impl fmt::Debug for Viewer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.debug("Viewer", f)
    }
}

impl Viewer {
    /// The `Debug` text of a handle of type `name` on this region.
    fn debug(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            None => write!(f, "{name}(disabled)"),
            Some(i) => f
                .debug_struct(name)
                .field("path", &i.path)
                .field(
                    "region_id",
                    &format_args!("{}", RegionId::new(i.header.region_id)),
                )
                .field("edges", &i.header.edges)
                .field("storage", &i.storage)
                .finish(),
        }
    }
}

/// The protocol view of an enabled recorder, formed once per call: the
/// shared state and the protocol over its words.
#[derive(Clone, Copy)]
struct Live<'a> {
    inner: &'a Inner,
    proto: Proto<'a>,
}

impl Inner {
    /// The protocol over this region's words: the one place it is formed.
    #[inline]
    fn proto(&self) -> Proto<'_> {
        Proto {
            words: self.storage.words(),
            layout: &self.header.layout,
        }
    }

    /// The token of a request of this region.
    fn token(&self, req: Occupant) -> Token {
        Token {
            region: self.header.region_id,
            slot: req.slot,
            generation: req.generation,
        }
    }

    /// Whether pids found in the region can be judged by this process: it
    /// is in the creator's pid namespace and no process from another one has
    /// attached.
    fn trusts_pids(&self) -> bool {
        self.pids_unjudged().is_none()
    }

    /// Why this process may not judge the pids in the region, if it may
    /// not.
    fn pids_unjudged(&self) -> Option<PidsUnjudged> {
        if self.header.pid_namespace != process::pid_namespace() {
            Some(PidsUnjudged::OtherNamespace)
        } else if self.mixed_pid_namespaces() {
            Some(PidsUnjudged::MixedNamespaces)
        } else {
            None
        }
    }

    /// Whether the header's flag says a process from another pid namespace
    /// attached for writing.
    fn mixed_pid_namespaces(&self) -> bool {
        region::mixed_pid_namespaces(self.storage.words())
    }

    /// Liveness of a lock holder as this process may judge it: alive unless
    /// pids can be trusted and the thread is gone. Trust is decided only
    /// when a holder is judged (a close that finds its slot held), so the
    /// common close reads no `/proc` entry.
    fn holder_alive(&self) -> impl Fn(u32) -> bool + '_ {
        move |tid| !self.trusts_pids() || process::pid_alive(tid)
    }

    /// The request `token` names in this region: the one check of a token,
    /// made once per call. [`Outcome::ForeignToken`] for a token of another
    /// region, [`Outcome::Invalid`] for one no `begin` of it minted.
    #[inline]
    fn occupant(&self, token: Token) -> Result<Occupant, Outcome> {
        if token.region != self.header.region_id {
            return Err(Outcome::ForeignToken);
        }
        if token.slot >= self.header.layout.slots || token.generation == 0 {
            return Err(Outcome::Invalid);
        }
        Ok(Occupant {
            slot: token.slot,
            generation: token.generation,
        })
    }

    /// The index of a declared edge.
    #[inline]
    fn edge(&self, edge: Edge) -> Result<usize, Outcome> {
        self.edge_index.get(edge).ok_or(Outcome::UnknownEdge)
    }

    /// A reading of the region's clock now (what an origin is).
    fn now(&self) -> u64 {
        match self.counter {
            None => clock::monotonic_ns(),
            Some(_) => clock::counter(),
        }
    }

    /// Microseconds between two readings of the region's clock (0 if
    /// `to` is before `from`).
    fn micros_between(&self, from: u64, to: u64) -> u64 {
        let d = to.saturating_sub(from);
        match self.counter {
            None => d / 1000,
            Some(scale) => scale.micros(d),
        }
    }

    /// A refill of `snap` by a read of a request of this region (values
    /// no edgemark process writes are left out when it finishes).
    #[inline]
    fn refill<'a>(&'a self, snap: &'a mut Snapshot) -> Refill<'a> {
        Refill::new(snap, &self.names, &self.header.edges)
    }
}

impl Live<'_> {
    /// The one close of a request, which [`Recorder::close`] and
    /// [`Recorder::expire_open`] share: seals the request, hands its final
    /// values to `into` (as a snapshot's read would), to a tally for the
    /// histograms and to the next entry of the ring of closed requests,
    /// and, in the close that freed the slot, adds them to the histograms
    /// and counts the request.
    ///
    /// `Ok` as [`Proto::close`] says; `Err(Busy)` when another live
    /// control operation held the request for the whole bounded wait,
    /// `Err(Faulted)` when the mapping lost a page before the close
    /// finished (what it read may be zeros: nothing is counted), another
    /// `Err` when the request is not open.
    fn close_into(&self, req: Occupant, into: &mut impl ReadInto) -> Result<Closed, Outcome> {
        let Live { inner, proto } = *self;
        let mut tally = Tally::default();
        let now = inner.now();
        let mut ring = RingWrite::new(proto, req.slot, req.generation, |origin| {
            inner.micros_between(origin, now)
        });
        let closed = proto.close(
            req,
            holder(),
            &inner.holder_alive(),
            &mut Both(into, &mut Both(&mut tally, &mut ring)),
        );
        ring.publish(matches!(closed, Ok(Closed::Freed)) && !inner.storage.faulted());
        if inner.storage.faulted() {
            return Err(Outcome::Faulted);
        }
        if closed == Ok(Closed::Freed) {
            // Only the close that freed the slot counts the request, so
            // each is counted once; a segment with a value no edgemark
            // process writes is left out.
            let words = proto.words;
            proto.account_closed(
                tally
                    .segments()
                    .filter(|(_, values)| !has_unknown(values, &inner.names, words)),
            );
        }
        closed
    }
}

impl Viewer {
    /// The protocol view, if this handle is enabled.
    #[inline]
    fn live(&self) -> Option<Live<'_>> {
        let inner = self.inner.as_deref()?;
        Some(Live {
            inner,
            proto: inner.proto(),
        })
    }

    /// The protocol view and the request, if this recorder is enabled and
    /// `token` could name a request of its region.
    fn live_for(&self, token: Token) -> Option<(Live<'_>, Occupant)> {
        let live = self.live()?;
        let req = live.inner.occupant(token).ok()?;
        Some((live, req))
    }
}

impl Recorder {
    /// The protocol view for a call that writes the region (only a recorder
    /// has them, and its region is mapped for writing): [`Outcome::Disabled`]
    /// when disabled.
    #[inline]
    fn live_mut(&self) -> Result<Live<'_>, Outcome> {
        self.live().ok_or(Outcome::Disabled)
    }
}

impl Recorder {
    /// A recorder that records nothing: every call returns
    /// [`Outcome::Disabled`] or an empty snapshot.
    pub const fn disabled() -> Recorder {
        Recorder {
            view: Viewer { inner: None },
        }
    }

    /// A recorder on a region whose storage is writable.
    fn from_header(
        storage: Storage,
        header: Header,
        path: Option<PathBuf>,
        clock: ClockShare,
    ) -> Recorder {
        Recorder {
            view: Viewer::from_header(storage, header, path, clock),
        }
    }
}

impl Viewer {
    fn from_header(
        storage: Storage,
        header: Header,
        path: Option<PathBuf>,
        clock: ClockShare,
    ) -> Viewer {
        // Only a recorder records, and its storage is writable.
        let events = RecordSpec::table(&header, clock.reads_clock());
        Viewer {
            inner: Some(Arc::new(Inner {
                names: Arc::new(Catalog::new(Arc::clone(&header.schema))),
                edge_index: EdgeIndex::new(&header.edges),
                events,
                clock,
                counter: match header.clock_kind {
                    Clock::Monotonic => None,
                    Clock::Counter => CounterScale::new(header.counter_rate),
                },
                storage,
                header,
                path,
            })),
        }
    }

    /// Whether this handle is on a region (it is not
    /// [`Recorder::disabled`]).
    #[inline]
    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }
}

impl Recorder {
    /// Begins a request: claims a free slot, sets the request's origin to
    /// now on the shared clock, and mints its token.
    ///
    /// Fails open: a full region gives [`Outcome::RegionFull`] (counted), a
    /// disabled recorder [`Outcome::Disabled`], and a counter region whose
    /// counter this process does not trust [`Outcome::ClockMismatch`]
    /// (counted; see [`RegionBuilder::clock`]); the request then runs
    /// unrecorded. A mapping that lost a page (the file was truncated, or a
    /// sparse region found no space) gives [`Outcome::Faulted`], also when
    /// the page is lost during this begin: a token is only handed out for
    /// a request that other processes can see.
    pub fn begin(&self) -> Result<Token, Outcome> {
        self.begin_traced(None)
    }

    /// Begins a request as [`Recorder::begin`] does, under the W3C trace
    /// context `parent` (the caller's span: a `traceparent` it was given,
    /// or the [`Viewer::trace_context`] of the request's part on another
    /// host), or in a new trace when `None`. The region keeps the context
    /// with the request's origin and its wall-clock time
    /// (`CLOCK_REALTIME`, which places spans in absolute time and is never
    /// subtracted), and hands them with the final values to the readers of
    /// closed requests ([`Recorder::drain_closed`]). The request gets its
    /// own random span id, the parent of its spans.
    ///
    /// ```
    /// # use edgemark::{Recorder, TraceContext};
    /// let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    /// let parent: TraceContext =
    ///     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap();
    /// let t = rec.begin_traced(Some(parent)).unwrap();
    /// let mine = rec.trace_context(t).unwrap();
    /// assert_eq!(mine.trace_id(), parent.trace_id());
    /// assert_ne!(mine.span_id(), parent.span_id());
    /// ```
    pub fn begin_traced(&self, parent: Option<TraceContext>) -> Result<Token, Outcome> {
        let Live { inner, proto } = self.live_mut()?;
        if inner.storage.faulted() {
            return Err(Outcome::Faulted);
        }
        let mut owner = process::owner_identity();
        // A start time is only comparable in the region's time namespace.
        if !inner.clock.same_namespace() {
            owner.start_ticks = 0;
        }
        let origin = match inner.counter {
            None => clock::monotonic_ns(),
            // An origin is a reading of the region's clock: a process that
            // cannot vouch for the counter sets none.
            Some(_) if !inner.clock.reads_clock() => {
                return Err(proto.count(Outcome::ClockMismatch));
            }
            Some(_) => clock::counter(),
        };
        let trace = SlotTrace::begin(parent).to_words();
        match proto.begin(origin, trace, owner, holder()) {
            // A page lost meanwhile may be this request's: the slot may
            // exist only in this process. Close it (on a lost page that
            // changes nothing anyone else sees; on a good one it frees the
            // slot) and hand out nothing.
            Some(req) if inner.storage.faulted() => {
                let _ = proto.close(req, holder(), &inner.holder_alive(), &mut Discard);
                Err(Outcome::Faulted)
            }
            Some(req) => Ok(inner.token(req)),
            None => Err(proto.count(Outcome::RegionFull)),
        }
    }

    /// Begins a request under the context of a `traceparent` header value
    /// as the record path gets it (from a caller's headers): a malformed
    /// value never fails the request. It is ignored, the request begins in
    /// a new trace, and it is counted
    /// ([`Counters::bad_trace_contexts`](crate::report::Counters::bad_trace_contexts)).
    /// At a boundary that can refuse (a command line, an API argument),
    /// parse it as a [`TraceContext`] instead and report the error.
    ///
    /// ```
    /// # use edgemark::Recorder;
    /// let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    /// let t = rec.begin_with_traceparent("00-not-a-trace").unwrap();
    /// assert_eq!(rec.counters().bad_trace_contexts, 1);
    /// assert!(rec.trace_context(t).is_some());
    /// ```
    pub fn begin_with_traceparent(&self, traceparent: &str) -> Result<Token, Outcome> {
        match traceparent.parse::<TraceContext>() {
            Ok(parent) => self.begin_traced(Some(parent)),
            Err(_) => {
                if let Some(Live { proto, .. }) = self.live() {
                    proto.count_bad_trace();
                }
                self.begin_traced(None)
            }
        }
    }

    /// Starts segment `segment` on `edge` of the request: a control
    /// operation (recording never advances a segment). The old segment is
    /// fenced: later records for it are refused as
    /// [`Outcome::StaleSegment`]. The newest segments are kept (see
    /// [`RegionBuilder::segments`]); older ones are dropped and counted.
    ///
    /// `segment` must be greater than the current one; otherwise the call
    /// is refused as [`Outcome::StaleSegment`]. On a mapping that lost a
    /// page, before or during the call, it is [`Outcome::Faulted`].
    pub fn start_segment(&self, token: Token, edge: impl Into<Edge>, segment: u32) -> Outcome {
        let Live { inner, proto } = match self.live_mut() {
            Ok(live) => live,
            Err(why) => return why,
        };
        if inner.storage.faulted() {
            return Outcome::Faulted;
        }
        let (req, edge) = match inner
            .occupant(token)
            .and_then(|req| Ok((req, inner.edge(edge.into())?)))
        {
            Ok(checked) => checked,
            Err(why) => return proto.count(why),
        };
        let started = proto.start_segment(req, edge, segment, holder());
        if inner.storage.faulted() {
            return Outcome::Faulted;
        }
        started
    }

    /// Closes the request and returns its final snapshot.
    ///
    /// Idempotent: closing a closed, reused or foreign token returns an empty
    /// snapshot in state [`RequestState::Gone`]. If another control
    /// operation of a live process holds the request for about a second, the
    /// result is an empty snapshot in state [`RequestState::Busy`] and the
    /// request stays open: close again. A process that died holding it is
    /// taken over. Every removal path
    /// (completion, abort, disconnect, timeout, error) should call it; it
    /// never fails the rest of a cleanup. Late records are refused, and the
    /// slot can be reused at once.
    ///
    /// On a mapping that lost a page (see [`Outcome::Faulted`]) close
    /// refuses: an empty snapshot in state [`RequestState::Faulted`],
    /// nothing changed; a process that attaches the region again can close
    /// the token.
    pub fn close(&self, token: Token) -> Snapshot {
        let Some((live, req)) = self.live_for(token) else {
            return Snapshot::gone();
        };
        let Live { inner, proto } = live;
        if inner.storage.faulted() {
            return Snapshot::empty(RequestState::Faulted);
        }
        // The final values go straight into the snapshot returned, as a
        // snapshot's read would put them.
        let mut snap = Snapshot::empty(RequestState::Closed);
        let mut fill = inner.refill(&mut snap);
        match live.close_into(req, &mut fill) {
            Ok(_) => {
                fill.finish(RequestState::Closed, proto.words);
                snap
            }
            Err(Outcome::Busy) => Snapshot::empty(RequestState::Busy),
            Err(Outcome::Faulted) => Snapshot::empty(RequestState::Faulted),
            Err(_) => Snapshot::gone(),
        }
    }

    /// A detached snapshot of the request as it is now: the same as
    /// [`Viewer::snapshot`] of this recorder's viewer.
    #[inline]
    pub fn snapshot(&self, token: Token) -> Snapshot {
        self.view.snapshot(token)
    }
}

impl Viewer {
    /// A detached snapshot of the request as it is now. An empty snapshot in
    /// state [`RequestState::Gone`] if the token names no open request.
    pub fn snapshot(&self, token: Token) -> Snapshot {
        let Some((Live { inner, proto }, req)) = self.live_for(token) else {
            return Snapshot::gone();
        };
        let mut snap = Snapshot::empty(RequestState::Open);
        let mut fill = inner.refill(&mut snap);
        if !proto.snapshot_into(req, &mut fill) {
            return Snapshot::gone();
        }
        fill.finish(RequestState::Open, proto.words);
        snap
    }
}
