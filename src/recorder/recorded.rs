//! Whether an event is recorded: the fenced read of one cell, for a close
//! that two parties decide from each other's records.

use super::{Live, Recorder, Viewer};
use crate::mark::Edge;
use crate::protocol::{Occupant, Proto};
use crate::schema::EventId;
use crate::token::Token;

impl Recorder {
    /// Whether `event` of segment `segment` of `edge` is recorded for the
    /// request, read after a full fence: the same as [`Viewer::recorded`]
    /// of this recorder's viewer, which says when to call it.
    #[inline]
    pub fn recorded(
        &self,
        token: Token,
        edge: impl Into<Edge>,
        event: impl Into<EventId>,
        segment: u32,
    ) -> bool {
        self.view.recorded(token, edge, event, segment)
    }
}

impl Viewer {
    /// Whether `event` of segment `segment` of `edge` is recorded for the
    /// open request `token`: the read of a decision that two parties make
    /// from each other's records, fenced so that they cannot both miss.
    ///
    /// The case it is for: party A records event X and then asks whether
    /// event Y is in; party B records Y and then asks whether X is in;
    /// whoever sees both closes the request. Read as a snapshot reads
    /// (Acquire loads after the record's Release compare-and-swap), both
    /// may miss the other's record on a weakly ordered CPU (Arm, POWER:
    /// store buffering), and nobody closes. This call issues a
    /// sequentially consistent fence before it reads, so when each party
    /// calls it after its own record (a [`Recorder::record`] that returned
    /// [`Outcome::Recorded`](crate::Outcome::Recorded), or
    /// [`Outcome::Duplicate`](crate::Outcome::Duplicate) for a value
    /// another writer got in first), at least one of them sees the
    /// other's event. Both may see both: the close is idempotent. The
    /// fence costs one full barrier (tens of cycles on x86), on this call
    /// only: the record path is unchanged (`docs/design.md`, "A fenced
    /// read for a close decision", says why that is enough).
    ///
    /// `false` for a token that names no open request (closed, reused, of
    /// another region, disabled), an undeclared edge or an event the
    /// schema lacks, a segment not started or no longer kept, and an event
    /// not recorded yet. It never fails and never writes.
    ///
    /// ```
    /// # use edgemark::{Edge, Event::*, Mark, Recorder};
    /// let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    /// let t = rec.begin().unwrap();
    /// let e01 = Edge::new(0, 1);
    /// // The producer's send thread: its event, then a look at the consumer's.
    /// rec.record(t, Mark::new(e01, EdgeFirstSendComplete));
    /// assert!(!rec.recorded(t, e01, ConsumerFirstNonemptyOutput, 0));
    /// // The consumer: its event, then a look at the producer's; it sees both
    /// // and closes.
    /// rec.record(t, Mark::new(e01, ConsumerFirstNonemptyOutput));
    /// assert!(rec.recorded(t, e01, EdgeFirstSendComplete, 0));
    /// rec.close(t);
    /// assert!(!rec.recorded(t, e01, EdgeFirstSendComplete, 0), "closed");
    /// ```
    pub fn recorded(
        &self,
        token: Token,
        edge: impl Into<Edge>,
        event: impl Into<EventId>,
        segment: u32,
    ) -> bool {
        self.cell_of(token, edge.into(), event.into())
            .is_some_and(|(proto, req, edge, event)| proto.recorded(req, edge, segment, event))
    }

    /// [`Viewer::recorded`] without its fence, as a snapshot would read the
    /// cell: only in the loom build, whose model m12b shows that two
    /// parties can then both miss each other's record.
    #[cfg(edgemark_loom)]
    #[doc(hidden)]
    pub fn recorded_unfenced(
        &self,
        token: Token,
        edge: impl Into<Edge>,
        event: impl Into<EventId>,
        segment: u32,
    ) -> bool {
        self.cell_of(token, edge.into(), event.into())
            .is_some_and(|(proto, req, edge, event)| proto.holds_value(req, edge, segment, event))
    }

    /// The protocol view, the request, and the indexes of `edge` and
    /// `event` for a read of one cell: `None` when disabled, for a token
    /// that cannot name a request of this region, an undeclared edge or an
    /// event the schema lacks.
    fn cell_of(
        &self,
        token: Token,
        edge: Edge,
        event: EventId,
    ) -> Option<(Proto<'_>, Occupant, usize, usize)> {
        let (Live { inner, proto }, req) = self.live_for(token)?;
        if u32::from(event.0) >= inner.header.layout.events {
            return None;
        }
        let edge = inner.edge(edge).ok()?;
        Some((proto, req, edge, usize::from(event.0)))
    }
}
