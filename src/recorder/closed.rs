//! The recorder's side of past one host: a request's trace context, and the
//! drain of the ring of closed requests.

use super::{Live, Recorder, Viewer};
use crate::protocol::{self, Take, TakeAs};
use crate::region::SweepError;
use crate::snapshot::{RequestState, Snapshot};
use crate::token::Token;
use crate::trace::{ClosedRequest, Drained, SlotTrace, TraceContext};

impl Viewer {
    /// The trace context to hand the request's next stage on another host
    /// (with the token, in the same dispatch message): the request's trace
    /// and its own span, so that the other host's spans become its
    /// children. `None` if the token names no open request.
    ///
    /// Its text form is a `traceparent` value; the other host passes it to
    /// [`Recorder::begin_traced`] on its own region.
    pub fn trace_context(&self, token: Token) -> Option<TraceContext> {
        let (Live { proto, .. }, req) = self.live_for(token)?;
        let words = proto.trace_words(req)?;
        SlotTrace::from_words(words).map(SlotTrace::downstream)
    }
}

impl Recorder {
    /// Takes up to `max` closed requests from the region's ring of closed
    /// requests, oldest first, appending them to `out`.
    ///
    /// Every close writes its request into the ring (see
    /// [`RegionBuilder::closed_entries`](crate::RegionBuilder::closed_entries));
    /// readers share one cursor in the region, so that of several readers,
    /// in one process or many, each closed request reaches exactly one.
    /// Closes never wait for a reader: a reader more than a ring behind
    /// loses the oldest entries (counted by the closes that overwrite them),
    /// as does one that finds an entry torn (counted by the reader,
    /// [`Drained::lost`]); both are in
    /// [`Counters::closed_lost`](crate::report::Counters::closed_lost). A close
    /// still being written holds the drain there until the next call
    /// ([`Drained::pending`]; see [`Recorder::skip_closed`]).
    ///
    /// Each request taken here is done with: nothing acknowledges it (at
    /// most once). A [`ClosedReader`](crate::ClosedReader) acknowledges
    /// what it takes, and what it leaves is sent again (at least once).
    ///
    /// A recorder, not a [`Viewer`]: the drain moves the readers' shared
    /// cursor. Errors: what [`Viewer::check`] says. A disabled recorder or
    /// a region without a ring drains nothing.
    ///
    /// A viewer cannot drain, as a type: this does not compile.
    ///
    /// ```compile_fail
    /// # use edgemark::{Recorder, Viewer};
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("r.region");
    /// # let owner = Recorder::builder().edge(0, 1).create(&path)?;
    /// let viewer = Viewer::attach(&path)?;
    /// viewer.drain_closed(16, &mut Vec::new());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn drain_closed(
        &self,
        max: usize,
        out: &mut Vec<ClosedRequest>,
    ) -> Result<Drained, SweepError> {
        self.drain_as(TakeAs::Done, max, out)
    }

    /// [`Recorder::drain_closed`], leaving each taken entry as `mark` says.
    pub(super) fn drain_as(
        &self,
        mark: TakeAs,
        max: usize,
        out: &mut Vec<ClosedRequest>,
    ) -> Result<Drained, SweepError> {
        let mut drained = Drained::default();
        let Some(Live { inner, proto }) = self.live() else {
            return Ok(drained);
        };
        inner.storage.check_len()?;
        let mut buf = Vec::with_capacity(inner.header.layout.ring_words);
        // Each step moves the cursor or stops; the bound keeps a region
        // whose closers outrun the reader from holding it forever.
        let steps = max.saturating_mul(4).saturating_add(64);
        for _ in 0..steps {
            if drained.taken >= max {
                break;
            }
            match proto.ring_take(&mut buf, mark) {
                Take::Empty => {
                    drained.caught_up = true;
                    break;
                }
                Take::Pending(claim) => {
                    drained.pending = Some(claim);
                    break;
                }
                Take::Lost(n) => drained.lost += n,
                Take::Raced | Take::Void => {}
                Take::Entry(claim) => {
                    if inner.storage.faulted() {
                        // The copy may be zeros from a lost page.
                        break;
                    }
                    match (Live { inner, proto }).closed_request(claim, &buf) {
                        Some(c) => {
                            out.push(c);
                            drained.taken += 1;
                        }
                        None => {
                            // Taken, but not what a close writes: counted
                            // as lost, as a torn entry is, and done with.
                            match mark {
                                TakeAs::Reader(r) => {
                                    proto.ring_settle(claim, r, protocol::Settle::Lost);
                                }
                                TakeAs::Done => proto.count_ring_lost(1),
                            }
                            drained.lost += 1;
                        }
                    }
                }
            }
        }
        Ok(drained)
    }

    /// Gives up on the closed request with claim number `claim`, which a
    /// drain reported as [`Drained::pending`] (its close began writing it
    /// and has not published it), if no reader has moved past it: counted
    /// as lost, and the next drain reads on. For a reader that judged its
    /// closer dead (`edgemark export` gives up after five seconds); a
    /// closer still writing then loses its request. True if this call
    /// skipped it.
    pub fn skip_closed(&self, claim: u64) -> bool {
        self.live()
            .is_some_and(|Live { proto, .. }| proto.ring_skip(claim))
    }
}

impl Live<'_> {
    /// The closed request a taken ring entry holds, read as a close reads
    /// its slot; `None` for words no close writes.
    pub(super) fn closed_request(self, claim: u64, buf: &[u64]) -> Option<ClosedRequest> {
        let Live { inner, proto } = self;
        let trace = SlotTrace::from_words(protocol::trace_of(buf))?;
        let (slot, generation) = protocol::token_of(buf);
        if slot >= inner.header.layout.slots || generation == 0 {
            return None;
        }
        let mut snapshot = Snapshot::empty(RequestState::Closed);
        let mut fill = inner.refill(&mut snapshot);
        if !protocol::replay(&inner.header.layout, buf, &mut fill) {
            return None;
        }
        fill.finish(RequestState::Closed, proto.words);
        Some(ClosedRequest {
            token: inner.token(crate::protocol::Occupant { slot, generation }),
            trace,
            closed_us: protocol::closed_us_of(buf),
            snapshot,
            claim,
        })
    }
}
