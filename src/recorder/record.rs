//! The record path: the clock-reading record, the record of a value
//! measured elsewhere, and clock-domain registration.

use super::{Inner, Live, Recorder};
use crate::clock;
use crate::domains::RegisterError;
use crate::mark::Mark;
use crate::outcome::Outcome;
use crate::protocol::Occupant;
use crate::region::Header;
use crate::schema::DomainId;
use crate::token::Token;
use crate::word::{self, CellWord};

/// Event ids a mark can carry (`EventId` is a byte).
pub(super) const EVENT_IDS: usize = 1 << u8::BITS;

/// What the record path needs of one schema event (of its
/// [`EventSpec`](crate::schema::EventSpec), and of this process's access).
#[derive(Clone, Copy, Debug)]
pub(super) struct RecordSpec {
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
    /// The specs of `header`'s schema events, by id; `reads_clock` says
    /// whether this process may write the region and reads its shared
    /// clock (the fast path's condition beyond the event's own domain).
    pub(super) fn table(header: &Header, reads_clock: bool) -> [RecordSpec; EVENT_IDS] {
        let mut events = [RecordSpec {
            domain: DomainId::HOST_MONOTONIC,
            keeps_chunk_seq: false,
            fast: false,
        }; EVENT_IDS];
        for (spec, e) in events
            .iter_mut()
            .zip(header.schema.events())
            .take(header.layout.events as usize)
        {
            *spec = RecordSpec {
                domain: e.domain(),
                keeps_chunk_seq: e.keeps_chunk_seq(),
                fast: reads_clock && e.domain() == DomainId::HOST_MONOTONIC,
            };
        }
        events
    }

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

impl Inner {
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
        let proto = self.proto();
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
}

impl Recorder {
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
        let spec = inner.event(&mark);
        if !inner.clock.reads_clock() || spec.domain != DomainId::HOST_MONOTONIC {
            return proto.count(Outcome::ClockMismatch);
        }
        match spec.chunk(&mark) {
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
    /// whose shared clock is the counter ([`crate::clock::Clock::Counter`]), where
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
        if domain == DomainId::HOST_MONOTONIC
            && (!inner.clock.reads_clock() || inner.counter.is_some())
        {
            return proto.count(Outcome::ClockMismatch);
        }
        let us = (elapsed_ms * 1000.0).round();
        if us > word::MAX_ELAPSED_US as f64 {
            return proto.count(Outcome::OutOfRange);
        }
        let chunk = match inner.event(&mark).chunk(&mark) {
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
    /// [`MAX_DOMAINS`](crate::limits::MAX_DOMAINS) domains, declared and registered
    /// together.
    ///
    /// Errors: [`Outcome::UnknownDomain`] for a name that cannot name a
    /// domain (empty or blank, over 32 bytes, a control or invisible format
    /// character such as a bidirectional control),
    /// [`Outcome::DomainTableFull`] (counted) when the table is full,
    /// [`Outcome::Disabled`].
    ///
    /// ```
    /// # use edgemark::{Recorder, schema::DomainId};
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
}
