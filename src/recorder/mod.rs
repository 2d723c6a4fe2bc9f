//! The public recorder: the handle every process uses.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::catalog::Catalog;
use crate::clock::{self, Clock, CounterScale};
use crate::domains::RegisterError;
use crate::mark::{Edge, EdgeIndex, Mark};
use crate::outcome::Outcome;
use crate::process;
use crate::protocol::{Both, Closed, Discard, Found, Occupant, Proto, Reclaimed, RingWrite, Tally};
use crate::region::{self, Access, AttachError, Header, Storage};
use crate::report::{
    self, Counters, EdgeHistogram, Owner, PidsUnjudged, ReclaimReport, RegionInfo,
};
use crate::schema::{DomainId, EventId, Schema};
use crate::snapshot::{Refill, RequestState, Snapshot, has_unknown};
use crate::token::Token;
use crate::trace::{SlotTrace, TraceContext};
use crate::word::{self, CellWord};

mod attach;
mod builder;
mod closed;

pub use attach::AttachOptions;
pub use builder::RegionBuilder;

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

/// Event ids a mark can carry (`EventId` is a byte).
const EVENT_IDS: usize = 1 << u8::BITS;

/// What the record path needs of one schema event (of its
/// [`EventSpec`](crate::EventSpec), and of this process's access).
#[derive(Clone, Copy, Debug)]
struct RecordSpec {
    /// The event's clock domain.
    domain: DomainId,
    /// Whether its value word keeps the chunk sequence.
    keeps_chunk_seq: bool,
    /// Whether a clock-reading record of this event may take the fast path:
    /// the event is in the region's schema, its domain is the shared clock,
    /// this process reads that clock and may write the region. Every other
    /// case takes [`Recorder::record_checked`], which says why not.
    fast: bool,
}

impl RecordSpec {
    /// The chunk field of a value word of this event for `mark`, checked.
    #[inline]
    fn chunk(self, mark: &Mark) -> Result<Option<u64>, Outcome> {
        match mark.chunk_seq {
            Some(c) if self.keeps_chunk_seq => {
                if c > word::MAX_CHUNK_SEQ {
                    Err(Outcome::OutOfRange)
                } else {
                    Ok(Some(c))
                }
            }
            _ => Ok(None),
        }
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
#[derive(Clone)]
pub struct Recorder {
    inner: Option<Arc<Inner>>,
}

impl fmt::Debug for Recorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            None => f.write_str("Recorder(disabled)"),
            Some(i) => f
                .debug_struct("Recorder")
                .field("path", &i.path)
                .field("region_id", &format_args!("{:016x}", i.header.region_id))
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

    /// Checks a mark against the region's schema and edges; on success
    /// gives the edge's index.
    #[inline]
    fn check_mark(&self, mark: &Mark) -> Result<usize, Outcome> {
        if mark.event.0 as u32 >= self.header.layout.events {
            return Err(Outcome::UnknownEvent);
        }
        self.edge(mark.edge)
    }

    /// The record path's view of `mark`'s event: its spec for a schema
    /// event, and for any other id an entry that never takes the fast path.
    #[inline]
    fn event(&self, mark: &Mark) -> RecordSpec {
        // One entry per possible id: no bounds check, and ids beyond the
        // schema have entries that never take the fast path.
        self.events[usize::from(mark.event.0)]
    }

    /// The chunk field of a value word, checked.
    #[inline]
    fn chunk(&self, mark: &Mark) -> Result<Option<u64>, Outcome> {
        self.event(mark).chunk(mark)
    }

    /// The clock-reading record of a checked call: `edge` is the mark's
    /// edge index, `event` a schema event of the shared clock's domain, and
    /// this process reads that clock and may write.
    #[inline]
    fn record_now(
        &self,
        req: Occupant,
        edge: usize,
        segment: u32,
        event: u8,
        chunk: Option<u64>,
    ) -> Outcome {
        let proto = Proto {
            words: self.storage.words(),
            layout: &self.header.layout,
        };
        let counter = self.counter;
        proto.record(req, edge, segment, usize::from(event), |origin| {
            // One branch on the region's clock kind, which never changes.
            let us = match counter {
                None => {
                    let now = clock::monotonic_ns();
                    if now < origin {
                        return Err(Outcome::Invalid);
                    }
                    (now - origin) / 1000
                }
                Some(scale) => {
                    let now = clock::counter();
                    if now < origin {
                        return Err(Outcome::Invalid);
                    }
                    scale.micros(now - origin)
                }
            };
            if us > word::MAX_ELAPSED_US {
                return Err(Outcome::OutOfRange);
            }
            Ok(CellWord::value(0, chunk, us))
        })
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

    /// The id of the domain called `name`: one this process has met (a
    /// comparison of packed words per known name, no region access), else
    /// registered or found in the region's table.
    fn resolve_domain(&self, name: &str) -> Result<DomainId, Outcome> {
        self.names
            .resolve(self.storage.words(), name)
            .map_err(|e| match e {
                RegisterError::BadName => Outcome::UnknownDomain,
                RegisterError::Full => Outcome::DomainTableFull,
            })
    }

    /// A refill of `snap` by a read of a request of this region (values
    /// no edgemark process writes are left out when it finishes).
    #[inline]
    fn refill<'a>(&'a self, snap: &'a mut Snapshot) -> Refill<'a> {
        Refill::new(snap, &self.names, &self.header.edges)
    }
}

impl Recorder {
    /// The protocol view, if this recorder is enabled.
    #[inline]
    fn live(&self) -> Option<Live<'_>> {
        let inner = self.inner.as_deref()?;
        Some(Live {
            inner,
            proto: Proto {
                words: inner.storage.words(),
                layout: &inner.header.layout,
            },
        })
    }

    /// The protocol view and the request, if this recorder is enabled and
    /// `token` could name a request of its region.
    fn live_for(&self, token: Token) -> Option<(Live<'_>, Occupant)> {
        let live = self.live()?;
        let req = live.inner.occupant(token).ok()?;
        Some((live, req))
    }

    /// The protocol view for a call that writes the region: enabled and not
    /// attached read-only.
    #[inline]
    fn live_mut(&self) -> Result<Live<'_>, Outcome> {
        let live = self.live().ok_or(Outcome::Disabled)?;
        if live.inner.storage.access() == Access::ReadWrite {
            Ok(live)
        } else {
            Err(Outcome::ReadOnly)
        }
    }

    /// The protocol view for a sweep of all slots: `None` when disabled, an
    /// error if the region's file no longer has its full length (see
    /// [`Recorder::check`]).
    fn live_for_sweep(&self) -> Result<Option<Live<'_>>, AttachError> {
        match self.live() {
            None => Ok(None),
            Some(live) => live.inner.storage.check_len().map(|()| Some(live)),
        }
    }
}

impl Live<'_> {
    /// Every open request, in slot order, for `f`; stops and fails as soon
    /// as an access found the file shrunk (its pages then read as zeros).
    /// Slots in a hole of the file are skipped: never written, they are
    /// free ([`Storage::slot_runs`]).
    fn sweep(&self, f: impl FnMut(Found)) -> Result<(), AttachError> {
        self.sweep_runs(|from, to| self.proto.open_slots(from, to), f)
    }

    /// The one sweep loop: `each` turns a run of slots that may have been
    /// written ([`Storage::slot_runs`]) into the items it holds, `f` takes
    /// them in order; the mapping's faulted flag is checked before each item
    /// is handed over and at the end, and a fault stops the sweep with its
    /// error.
    fn sweep_runs<I: Iterator>(
        &self,
        mut each: impl FnMut(u32, u32) -> I,
        mut f: impl FnMut(I::Item),
    ) -> Result<(), AttachError> {
        let storage = &self.inner.storage;
        let mut faulted = false;
        storage.slot_runs(&self.inner.header.layout, |from, to| {
            if faulted {
                return;
            }
            for item in each(from, to) {
                if storage.faulted() {
                    faulted = true;
                    return;
                }
                f(item);
            }
        });
        if faulted || storage.faulted() {
            return Err(storage.fault_error());
        }
        Ok(())
    }
}

impl Recorder {
    /// A builder for a new region.
    pub fn builder() -> RegionBuilder {
        RegionBuilder::new()
    }

    /// Attaches to an existing region file with default options: the same as
    /// `AttachOptions::new().attach(path)`.
    #[cfg(not(edgemark_loom))]
    pub fn attach(path: impl AsRef<Path>) -> Result<Recorder, AttachError> {
        AttachOptions::new().attach(path)
    }

    /// A recorder that records nothing: every call returns
    /// [`Outcome::Disabled`] or an empty snapshot.
    pub const fn disabled() -> Recorder {
        Recorder { inner: None }
    }

    fn from_header(
        storage: Storage,
        header: Header,
        path: Option<PathBuf>,
        clock: ClockShare,
    ) -> Recorder {
        let mut events = [RecordSpec {
            domain: DomainId::HOST_MONOTONIC,
            keeps_chunk_seq: false,
            fast: false,
        }; EVENT_IDS];
        let writable = storage.access() == Access::ReadWrite;
        for (spec, e) in events
            .iter_mut()
            .zip(header.schema.events())
            .take(header.layout.events as usize)
        {
            *spec = RecordSpec {
                domain: e.domain(),
                keeps_chunk_seq: e.keeps_chunk_seq(),
                fast: writable && clock.reads_clock() && e.domain() == DomainId::HOST_MONOTONIC,
            };
        }
        Recorder {
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

    /// Whether this recorder records (it is not [`Recorder::disabled`]).
    #[inline]
    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

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
    /// or the [`Recorder::trace_context`] of the request's part on another
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

    /// Records `mark` for the request `token` at the current time on the
    /// shared clock (elapsed from the request's origin).
    ///
    /// The record path is one compare-and-swap on the event's cell plus the
    /// clock read: no lock, no allocation, no system call, no shared counter
    /// written on success. It never panics; see [`Outcome`] for what it can
    /// say.
    #[inline]
    pub fn record(&self, token: Token, mark: Mark) -> Outcome {
        let Some(inner) = self.inner.as_deref() else {
            return Outcome::Disabled;
        };
        // The token is checked once, here; `record_checked` reports what
        // this check found in its place in the order of refusals.
        let req = inner.occupant(token);
        // The fast path: every check of `record_checked` that a valid call
        // passes, folded into flags computed when the recorder was made.
        let spec = inner.event(&mark);
        if spec.fast
            && mark.meaningful
            && let (Ok(req), Some(edge), Ok(chunk)) =
                (req, inner.edge_index.get(mark.edge), spec.chunk(&mark))
        {
            return inner.record_now(req, edge, mark.segment, mark.event.0, chunk);
        }
        self.record_checked(req, mark)
    }

    /// [`Recorder::record`] with every check in the order that decides
    /// which refusal a call gets.
    #[cold]
    #[inline(never)]
    fn record_checked(&self, req: Result<Occupant, Outcome>, mark: Mark) -> Outcome {
        let Live { inner, proto } = match self.live_mut() {
            Ok(live) => live,
            Err(why) => return why,
        };
        if !mark.meaningful {
            return Outcome::NotMeaningful;
        }
        let (req, edge) = match req.and_then(|req| Ok((req, inner.check_mark(&mark)?))) {
            Ok(checked) => checked,
            Err(why) => return proto.count(why),
        };
        if !inner.clock.reads_clock() || inner.event(&mark).domain.0 != 0 {
            return proto.count(Outcome::ClockMismatch);
        }
        match inner.chunk(&mark) {
            Ok(chunk) => inner.record_now(req, edge, mark.segment, mark.event.0, chunk),
            Err(why) => proto.count(why),
        }
    }

    /// Records `mark` with an elapsed time measured elsewhere: `elapsed_ms`
    /// milliseconds from the request's origin in the clock domain `domain`,
    /// for worker-local durations and other clocks.
    ///
    /// A domain the region does not hold yet is registered on first use
    /// (see [`Recorder::register_domain`]). A negative, infinite or NaN
    /// elapsed time is refused as [`Outcome::Invalid`] and leaves no state.
    /// `"host_monotonic"` is refused as [`Outcome::ClockMismatch`] (counted)
    /// by a process that does not share the region's clock, and in a region
    /// whose shared clock is the counter ([`crate::Clock::Counter`]), where
    /// only the clock-reading [`Recorder::record`] fills that domain.
    /// Values are kept to the microsecond.
    ///
    /// ```
    /// # use edgemark::{Edge, Event, Mark, Recorder};
    /// let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    /// let t = rec.begin().unwrap();
    /// let emit = Mark::new(Edge::new(0, 1), Event::ProducerFirstNonemptyEmit);
    /// assert!(rec.record_elapsed(t, emit, 10.0, "talker_worker").is_success());
    /// let snap = rec.snapshot(t);
    /// let seg = snap.segment(Edge::new(0, 1), 0).unwrap();
    /// assert_eq!(seg.domain(Event::ProducerFirstNonemptyEmit), Some("talker_worker"));
    /// assert_eq!(seg.elapsed_ms(Event::ProducerFirstNonemptyEmit), Some(10.0));
    /// ```
    pub fn record_elapsed(
        &self,
        token: Token,
        mark: Mark,
        elapsed_ms: f64,
        domain: &str,
    ) -> Outcome {
        let Live { inner, proto } = match self.live_mut() {
            Ok(live) => live,
            Err(why) => return why,
        };
        if !mark.meaningful {
            return Outcome::NotMeaningful;
        }
        if !elapsed_ms.is_finite() || elapsed_ms < 0.0 {
            return proto.count(Outcome::Invalid);
        }
        let (req, edge) = match inner
            .occupant(token)
            .and_then(|req| Ok((req, inner.check_mark(&mark)?)))
        {
            Ok(checked) => checked,
            Err(why) => return proto.count(why),
        };
        let domain = match inner.resolve_domain(domain) {
            Ok(d) => d,
            Err(why) => return proto.count(why),
        };
        // `host_monotonic` values come from the region's shared clock; in a
        // counter region a duration measured elsewhere cannot be one (its
        // origin is not the counter's), so it is refused rather than mixed.
        if domain.0 == 0 && (!inner.clock.reads_clock() || inner.counter.is_some()) {
            return proto.count(Outcome::ClockMismatch);
        }
        let us = (elapsed_ms * 1000.0).round();
        if us > word::MAX_ELAPSED_US as f64 {
            return proto.count(Outcome::OutOfRange);
        }
        let chunk = match inner.chunk(&mark) {
            Ok(c) => c,
            Err(why) => return proto.count(why),
        };
        let value = CellWord::value(domain.0, chunk, us as u64);
        proto.record(req, edge, mark.segment, usize::from(mark.event.0), |_| {
            Ok(value)
        })
    }

    /// The id of the clock domain `name`, registering it in the region if no
    /// process has yet. Registration is lock-free and idempotent: processes
    /// that register one name at once get one id. A region holds at most
    /// [`MAX_DOMAINS`](crate::MAX_DOMAINS) domains, declared and registered
    /// together.
    ///
    /// Errors: [`Outcome::UnknownDomain`] for a name that cannot name a
    /// domain (empty or blank, over 32 bytes, a control or invisible format
    /// character such as a bidirectional control),
    /// [`Outcome::DomainTableFull`] (counted) when the table is full,
    /// [`Outcome::Disabled`].
    ///
    /// ```
    /// # use edgemark::{DomainId, Recorder};
    /// let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    /// assert_eq!(rec.register_domain("host_monotonic"), Ok(DomainId::HOST_MONOTONIC));
    /// let sender = rec.register_domain("sender").unwrap();
    /// assert_eq!(rec.register_domain("sender"), Ok(sender));
    /// assert_eq!(rec.domains(), ["host_monotonic", "sender"]);
    /// ```
    pub fn register_domain(&self, name: &str) -> Result<DomainId, Outcome> {
        let Live { inner, proto } = self.live_mut()?;
        inner.resolve_domain(name).map_err(|why| match why {
            Outcome::DomainTableFull => proto.count(why),
            other => other,
        })
    }

    /// Every clock domain of the region, declared and registered, in id
    /// order; empty when disabled.
    pub fn domains(&self) -> Vec<String> {
        self.live()
            .map_or_else(Vec::new, |live| live.inner.names.all(live.proto.words))
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
        let Some((Live { inner, proto }, req)) = self.live_for(token) else {
            return Snapshot::gone();
        };
        if inner.storage.access() == Access::ReadOnly {
            return Snapshot::gone();
        }
        if inner.storage.faulted() {
            return Snapshot::empty(RequestState::Faulted);
        }
        // The final values go straight into the snapshot returned, as a
        // snapshot's read would put them, and into a tally for the
        // histograms.
        let mut snap = Snapshot::empty(RequestState::Closed);
        let mut fill = inner.refill(&mut snap);
        let mut tally = Tally::default();
        // And into the next entry of the ring of closed requests, for the
        // readers that send them on.
        let now = inner.now();
        let mut ring = RingWrite::new(proto, req.slot, req.generation, |origin| {
            inner.micros_between(origin, now)
        });
        let closed = proto.close(
            req,
            holder(),
            &inner.holder_alive(),
            &mut Both(&mut fill, &mut Both(&mut tally, &mut ring)),
        );
        ring.publish(matches!(closed, Ok(Closed::Freed)) && !inner.storage.faulted());
        if inner.storage.faulted() {
            // Lost during the close: what it read may be zeros.
            return Snapshot::empty(RequestState::Faulted);
        }
        match closed {
            Ok(closed) => {
                fill.finish(RequestState::Closed, proto.words);
                if closed == Closed::Freed {
                    // Only the close that freed the slot counts the request,
                    // so each is counted once; a segment with a value no
                    // edgemark process writes is left out.
                    let words = proto.words;
                    proto.account_closed(
                        tally
                            .segments()
                            .filter(|(_, values)| !has_unknown(values, &inner.names, words)),
                    );
                }
                snap
            }
            Err(Outcome::Busy) => Snapshot::empty(RequestState::Busy),
            Err(_) => Snapshot::gone(),
        }
    }

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

    /// Checks that the region's file still has its full length and that no
    /// access has found it shrunk since it was attached (another process
    /// with write access can shrink it; see `docs/design.md`, "A file shrunk
    /// under a mapping"). Sweeps of all slots call this first and fail with
    /// its error; single-request calls do not (it is a system call). An
    /// in-memory region always passes.
    pub fn check(&self) -> Result<(), AttachError> {
        self.live()
            .map_or(Ok(()), |live| live.inner.storage.check_len())
    }

    /// The tokens of every open request, in slot order (a sweep of all
    /// slots). Empty when disabled.
    ///
    /// Errors: what [`Recorder::check`] says before the sweep, or
    /// [`AttachError::Shrunk`] if the file was found shrunk during it.
    pub fn open_requests(&self) -> Result<Vec<Token>, AttachError> {
        self.check()?;
        self.open_requests_checked()
    }

    /// [`Recorder::open_requests`] for a caller that has just run
    /// [`Recorder::check`] and runs it again after (the exporter's scrape):
    /// the sweep still fails on a page lost during it, without a second
    /// `fstat`.
    pub(crate) fn open_requests_checked(&self) -> Result<Vec<Token>, AttachError> {
        let mut out = Vec::new();
        if let Some(live) = self.live() {
            live.sweep(|found| out.push(live.inner.token(found.req)))?;
        }
        Ok(out)
    }

    /// Snapshots of every open request: one sweep of the region, collected.
    /// [`Recorder::for_each_open`] does the same without holding them all.
    /// Errors as [`Recorder::for_each_open`].
    pub fn snapshot_open(&self) -> Result<Vec<(Token, Snapshot)>, AttachError> {
        let mut out = Vec::new();
        self.snapshot_open_into(&mut out)?;
        Ok(out)
    }

    /// [`Recorder::snapshot_open`] into a buffer the caller keeps between
    /// sweeps: `out` is replaced by the snapshots of every open request, and
    /// its storage, and that of the snapshots already in it, is reused. A
    /// sweep into a buffer that an earlier sweep of as many requests filled
    /// allocates nothing, as long as no request has more than two edge
    /// segments with events (a snapshot holds two inline).
    ///
    /// Errors as [`Recorder::for_each_open`]; on an error `out` holds the
    /// snapshots swept before it.
    ///
    /// ```
    /// # use edgemark::{Edge, Event, Mark, Recorder};
    /// let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    /// let t = rec.begin().unwrap();
    /// rec.record(t, Mark::new(Edge::new(0, 1), Event::ProducerFirstNonemptyEmit));
    /// let mut open = Vec::new();
    /// for _ in 0..3 {
    ///     // An exporter's loop: one buffer for every scrape.
    ///     rec.snapshot_open_into(&mut open)?;
    ///     assert_eq!(open.len(), 1);
    ///     assert_eq!(open[0].0, t);
    /// }
    /// # Ok::<(), edgemark::AttachError>(())
    /// ```
    pub fn snapshot_open_into(&self, out: &mut Vec<(Token, Snapshot)>) -> Result<(), AttachError> {
        let mut filled = 0;
        let swept = match self.live_for_sweep() {
            Ok(None) => Ok(()),
            Err(e) => Err(e),
            Ok(Some(live)) => {
                let Live { inner, proto } = live;
                live.sweep(|found| {
                    if filled == out.len() {
                        out.push((inner.token(found.req), Snapshot::empty(RequestState::Open)));
                    }
                    // Read straight into the buffer's next snapshot; one
                    // read that fails (the request closed meanwhile) is
                    // overwritten by the next or truncated.
                    let (token, snap) = &mut out[filled];
                    let mut fill = inner.refill(snap);
                    if proto.snapshot_found(found, &mut fill) {
                        fill.finish(RequestState::Open, proto.words);
                        *token = inner.token(found.req);
                        filled += 1;
                    }
                })
            }
        };
        out.truncate(filled);
        swept
    }

    /// One sweep of the region: calls `f` with the token and a snapshot of
    /// each open request, slot by slot, one snapshot at a time (a request
    /// closed while the sweep passes is left out).
    ///
    /// The snapshot is lent: the sweep reads each request into one snapshot
    /// that it refills in place, so a sweep of requests with up to two edge
    /// segments with events allocates nothing and touches no reference
    /// count. Clone it to keep it (or collect the sweep with
    /// [`Recorder::snapshot_open`]).
    ///
    /// Errors: what [`Recorder::check`] says before the sweep (nothing is
    /// swept), or [`AttachError::Shrunk`] if the file was found shrunk
    /// during it (the sweep stops there; what `f` was given before is
    /// real).
    ///
    /// ```
    /// # use edgemark::{Edge, Event, Mark, Recorder, Snapshot, Token};
    /// let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    /// let idle = rec.begin().unwrap();
    /// let busy = rec.begin().unwrap();
    /// rec.record(busy, Mark::new(Edge::new(0, 1), Event::ProducerFirstNonemptyEmit));
    /// let mut open = 0;
    /// let mut kept: Vec<(Token, Snapshot)> = Vec::new();
    /// rec.for_each_open(|token, snapshot| {
    ///     open += 1;
    ///     if !snapshot.is_empty() {
    ///         // Detached: an owned copy outlives the sweep.
    ///         kept.push((token, snapshot.clone()));
    ///     }
    /// })?;
    /// assert_eq!(open, 2);
    /// assert_eq!(kept.len(), 1);
    /// assert_eq!(kept[0].0, busy);
    /// assert_eq!(kept[0].1, rec.snapshot(busy));
    /// # let _ = idle;
    /// # Ok::<(), edgemark::AttachError>(())
    /// ```
    pub fn for_each_open(&self, mut f: impl FnMut(Token, &Snapshot)) -> Result<(), AttachError> {
        let Some(live) = self.live_for_sweep()? else {
            return Ok(());
        };
        let Live { inner, proto } = live;
        // One snapshot for the whole sweep, refilled in place for each
        // request: its segments keep their storage and catalog handles.
        let mut snap = Snapshot::empty(RequestState::Open);
        live.sweep(|found| {
            // A snapshot read from a page replaced under it is zeros, which
            // no open request holds: the read says so for it, and the
            // sweep fails at its next slot.
            let mut fill = inner.refill(&mut snap);
            if proto.snapshot_found(found, &mut fill) {
                fill.finish(RequestState::Open, proto.words);
                f(inner.token(found.req), &snap);
            }
        })
    }

    /// The owner identity of the process that began the request in
    /// `token`'s slot.
    pub fn owner(&self, token: Token) -> Option<Owner> {
        let (live, req) = self.live_for(token)?;
        Some(live.proto.owner(req.slot))
    }

    /// The region's schema; `None` when disabled.
    pub fn schema(&self) -> Option<&Schema> {
        self.live().map(|live| &*live.inner.header.schema)
    }

    /// The declared edges, in order; empty when disabled.
    pub fn edges(&self) -> &[Edge] {
        self.live().map_or(&[], |live| &live.inner.header.edges)
    }

    /// The id of the event called `name` in the region's schema.
    pub fn event(&self, name: &str) -> Option<EventId> {
        self.schema()?.event(name)
    }

    /// The region file's path, for a file-backed region.
    pub fn path(&self) -> Option<&Path> {
        self.live()?.inner.path.as_deref()
    }

    /// The kind of the region's shared clock; `None` when disabled.
    pub fn clock(&self) -> Option<Clock> {
        Some(self.live()?.inner.header.clock_kind)
    }

    /// The region's geometry and identity; `None` when disabled.
    pub fn info(&self) -> Option<RegionInfo> {
        let i = self.live()?.inner;
        let h = &i.header;
        Some(RegionInfo {
            region_id: h.region_id,
            slots: h.layout.slots,
            segments: h.layout.segments,
            slot_stride: h.layout.slot_stride_bytes(),
            slots_offset: h.layout.slots_offset_bytes(),
            ring_entries: h.layout.ring_entries,
            ring_stride: h.layout.ring_stride_bytes(),
            bytes: h.layout.bytes(),
            clock: h.clock,
            shares_clock: i.clock.reads_clock(),
            clock_kind: h.clock_kind,
            created_unix_ns: h.created_unix_ns,
            creator_pid: h.creator_pid,
            group_access: h.group_access,
            mixed_pid_namespaces: i.mixed_pid_namespaces(),
            pids_unjudged: i.pids_unjudged(),
        })
    }

    /// Whether the process that created the region still runs: `None` when
    /// this process cannot tell (it does not judge pids here, see
    /// [`RegionInfo::pids_unjudged`], or the recorder is disabled or in
    /// memory). A pid that was reused by another process counts as alive.
    pub fn creator_alive(&self) -> Option<bool> {
        let i = self.live()?.inner;
        if i.path.is_none() || !i.trusts_pids() {
            return None;
        }
        let pid = u32::try_from(i.header.creator_pid).ok()?;
        Some(process::pid_alive(pid))
    }

    /// Frees the slots of dead processes: open requests whose owner (the
    /// process that began them, by pid and start time, so a reused pid does
    /// not fool it) is gone, and control operations whose process died
    /// holding the slot. Live owners' slots are left alone. The freed
    /// requests' values are discarded.
    ///
    /// Assumes every process sharing the region is in this process's pid
    /// namespace (see `docs/limitations.md`).
    ///
    /// Frees nothing when pids cannot be trusted: this process is in another
    /// pid namespace than the region's creator, or some process from another
    /// one has attached for writing (`docs/limitations.md`); the report's
    /// [`ReclaimReport::unjudged`] then says which.
    ///
    /// Errors: as [`Recorder::reclaim_where`].
    pub fn reclaim_dead_owners(&self) -> Result<ReclaimReport, AttachError> {
        self.reclaim_dead(false)
    }

    /// [`Recorder::reclaim_dead_owners`] that judges every owner and lock
    /// holder as a process of this process's pid namespace, even when the
    /// region is shared across pid namespaces
    /// ([`RegionInfo::pids_unjudged`]). Use it only when the processes of
    /// other namespaces that attached are gone or never began a request:
    /// a live owner there whose pid names no process here loses its
    /// request.
    ///
    /// Errors: as [`Recorder::reclaim_where`].
    pub fn reclaim_dead_owners_in_this_namespace(&self) -> Result<ReclaimReport, AttachError> {
        self.reclaim_dead(true)
    }

    fn reclaim_dead(&self, judge_anyway: bool) -> Result<ReclaimReport, AttachError> {
        let Some(Live { inner, .. }) = self.live() else {
            return Ok(ReclaimReport::default());
        };
        if inner.storage.access() == Access::ReadOnly {
            return Err(AttachError::ReadOnly);
        }
        if let (Some(why), false) = (inner.pids_unjudged(), judge_anyway) {
            // Still fail as a sweep would on a damaged mapping.
            inner.storage.check_len()?;
            return Ok(ReclaimReport {
                unjudged: Some(why),
                ..ReclaimReport::default()
            });
        }
        // Start times are compared only in the region's time namespace.
        let compare_start = inner.clock.same_namespace();
        self.reclaim_where(
            |owner| {
                let start = if compare_start { owner.start_ticks } else { 0 };
                !process::owner_alive(owner.pid, start)
            },
            |tid| !process::pid_alive(tid),
        )
    }

    /// [`Recorder::reclaim_dead_owners`] with the caller's own judgement of
    /// which processes are gone: `owner_dead` for the owner of an open
    /// request, `holder_dead` for the pid holding a slot's control lock.
    /// A slot that changes while it is judged is left alone.
    ///
    /// Errors: [`AttachError::ReadOnly`] for a read-only recorder; what
    /// [`Recorder::check`] says before the sweep; [`AttachError::Shrunk`] if
    /// the file was found shrunk during it (what was freed before stays
    /// freed).
    pub fn reclaim_where(
        &self,
        owner_dead: impl Fn(Owner) -> bool,
        holder_dead: impl Fn(u32) -> bool,
    ) -> Result<ReclaimReport, AttachError> {
        let mut report = ReclaimReport::default();
        let Some(live) = self.live_for_sweep()? else {
            return Ok(report);
        };
        let Live { inner, proto } = live;
        if inner.storage.access() == Access::ReadOnly {
            return Err(AttachError::ReadOnly);
        }
        let me = holder();
        let owner_alive = |owner| !owner_dead(owner);
        let holder_alive = |pid| !holder_dead(pid);
        live.sweep_runs(
            |from, to| from..to,
            |slot| match proto.reclaim(slot, me, owner_alive, holder_alive) {
                Some(Reclaimed::DeadOwner) => report.dead_owners += 1,
                Some(Reclaimed::DeadHolder { live_owner }) => {
                    report.dead_holders += 1;
                    report.live_owners_locked += u32::from(live_owner);
                }
                None => {}
            },
        )?;
        Ok(report)
    }

    /// The region's counters of refused records and dropped segments.
    pub fn counters(&self) -> Counters {
        self.live()
            .map_or_else(Counters::default, |live| report::counters(live.proto.words))
    }

    /// The histograms of every closed request's values and deltas, per edge:
    /// for each edge, one per schema event, then one per delta between
    /// consecutive events (recorded in one clock domain, in order).
    ///
    /// Empty when disabled. Errors as [`Recorder::check`], before or after
    /// the histograms are read.
    pub fn histograms(&self) -> Result<Vec<EdgeHistogram>, AttachError> {
        self.check()?;
        self.histograms_checked()
    }

    /// [`Recorder::histograms`] for a caller that runs [`Recorder::check`]
    /// before and after ([`Recorder::open_requests_checked`]).
    pub(crate) fn histograms_checked(&self) -> Result<Vec<EdgeHistogram>, AttachError> {
        let Some(Live { inner, proto }) = self.live() else {
            return Ok(Vec::new());
        };
        let h = report::histograms(
            proto.words,
            proto.layout,
            &inner.header.schema,
            &inner.header.edges,
        );
        if inner.storage.faulted() {
            return Err(inner.storage.fault_error());
        }
        Ok(h)
    }
}
