//! Past one host: a request's W3C trace context, and the closed requests a
//! reader drains from a region to send on as OpenTelemetry spans.
//!
//! A region lives in one host's memory. When a request's stages run on
//! several hosts, each host records its part in its own region, under the
//! request's one trace context, and each host's exporter sends its part as
//! spans; a trace backend joins them by trace id. Values of two hosts are
//! never subtracted: each span carries only times of its own host.
//!
//! ```
//! use edgemark::{Edge, Event, Mark, Recorder, TraceContext};
//!
//! let rec = Recorder::builder().edge(0, 1).create_in_memory()?;
//! // The caller's context, as a `traceparent` header carries it.
//! let parent: TraceContext = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse()?;
//! let t = rec.begin_traced(Some(parent)).unwrap();
//! // The context to hand a stage on another host: same trace, this
//! // request's own span as the parent.
//! let downstream = rec.trace_context(t).unwrap();
//! assert_eq!(downstream.trace_id(), parent.trace_id());
//! rec.record(t, Mark::new(Edge::new(0, 1), Event::ProducerFirstNonemptyEmit));
//! rec.close(t);
//!
//! let mut closed = Vec::new();
//! let drained = rec.drain_closed(16, &mut closed)?;
//! assert_eq!((drained.taken, drained.lost), (1, 0));
//! assert_eq!(closed[0].parent_span_id(), Some(parent.span_id()));
//! assert_eq!(closed[0].span_id(), downstream.span_id());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::str::FromStr;

use crate::snapshot::Snapshot;
use crate::token::Token;

/// A W3C trace context (version 00 of the `traceparent` header): a trace
/// id, a span id and the trace flags.
///
/// Its text form is the header's value,
/// `00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`, lower-case.
///
/// ```
/// use edgemark::TraceContext;
/// let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// let ctx: TraceContext = tp.parse().unwrap();
/// assert!(ctx.sampled());
/// assert_eq!(ctx.to_string(), tp);
/// assert!("00-00000000000000000000000000000000-00f067aa0ba902b7-01"
///     .parse::<TraceContext>()
///     .is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceContext {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    flags: u8,
}

/// Why a trace context was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TraceparentError {
    /// Not four dash-separated fields of 2, 32, 16 and 2 lower-case hex
    /// digits.
    Format,
    /// Version `ff`, which the W3C recommendation forbids.
    Version,
    /// A trace id of all zeros.
    ZeroTraceId,
    /// A span id of all zeros.
    ZeroSpanId,
}

impl fmt::Display for TraceparentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TraceparentError::Format => {
                "a traceparent is 00-<32 hex digits>-<16 hex digits>-<2 hex digits>, lower-case"
            }
            TraceparentError::Version => "traceparent version ff is invalid",
            TraceparentError::ZeroTraceId => "the trace id is all zeros",
            TraceparentError::ZeroSpanId => "the span id is all zeros",
        })
    }
}

impl std::error::Error for TraceparentError {}

impl TraceContext {
    /// A context from its parts. All-zero ids are invalid in W3C trace
    /// context and refused.
    pub fn new(
        trace_id: [u8; 16],
        span_id: [u8; 8],
        flags: u8,
    ) -> Result<TraceContext, TraceparentError> {
        if trace_id == [0; 16] {
            return Err(TraceparentError::ZeroTraceId);
        }
        if span_id == [0; 8] {
            return Err(TraceparentError::ZeroSpanId);
        }
        Ok(TraceContext {
            trace_id,
            span_id,
            flags,
        })
    }

    /// The trace id.
    pub fn trace_id(&self) -> [u8; 16] {
        self.trace_id
    }

    /// The span id: of the caller's span, which becomes the parent.
    pub fn span_id(&self) -> [u8; 8] {
        self.span_id
    }

    /// The trace flags.
    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// Whether the `sampled` flag is set.
    pub fn sampled(&self) -> bool {
        self.flags & 1 != 0
    }

    /// The trace id as 32 lower-case hex digits.
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The span id as 16 lower-case hex digits.
    pub fn span_id_hex(&self) -> String {
        hex(&self.span_id)
    }
}

impl fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceContext({self})")
    }
}

impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            hex(&self.trace_id),
            hex(&self.span_id),
            self.flags
        )
    }
}

impl FromStr for TraceContext {
    type Err = TraceparentError;

    /// Parses a `traceparent` value. Version 00 must have exactly four
    /// fields; a later version may carry more after the flags, which are
    /// ignored, as the recommendation asks.
    fn from_str(s: &str) -> Result<TraceContext, TraceparentError> {
        let s = s.trim_matches(|c| c == ' ' || c == '\t');
        let b = s.as_bytes();
        if b.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return Err(TraceparentError::Format);
        }
        let version = unhex::<1>(&b[0..2]).ok_or(TraceparentError::Format)?[0];
        if version == 0xff {
            return Err(TraceparentError::Version);
        }
        if b.len() > 55 && (version == 0 || b[55] != b'-') {
            return Err(TraceparentError::Format);
        }
        let trace_id = unhex::<16>(&b[3..35]).ok_or(TraceparentError::Format)?;
        let span_id = unhex::<8>(&b[36..52]).ok_or(TraceparentError::Format)?;
        let flags = unhex::<1>(&b[53..55]).ok_or(TraceparentError::Format)?[0];
        TraceContext::new(trace_id, span_id, flags)
    }
}

fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// `2 * N` lower-case hex digits as `N` bytes.
fn unhex<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    if digits.len() != 2 * N {
        return None;
    }
    let mut out = [0; N];
    for (o, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *o = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// Three random non-zero 64-bit ids (a trace id's two halves and a span
/// id): the process's random SipHash keys (std's `RandomState`) over a
/// per-process count and `now` (the wall-clock time the caller read), then
/// the index of each id. One hasher and no clock read of its own per
/// begin. Not cryptographic; trace and span ids need only be unlikely to
/// repeat.
pub(crate) fn random_ids(now: u64) -> [u64; 3] {
    use std::hash::{BuildHasher, Hasher};
    // std's atomics on purpose: a per-process sequence number that no
    // protocol reads (outside the loom facade, as the clock is).
    #[allow(clippy::disallowed_types)]
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    #[allow(clippy::disallowed_types)]
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(n);
    h.write_u64(now);
    [0u8, 1, 2].map(|i| {
        let mut h = h.clone();
        h.write_u8(i);
        h.finish().max(1)
    })
}

/// splitmix64's finaliser: a bijection of 64-bit words that spreads every
/// input bit over the output.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The span id of segment `segment` of `edge` of the request whose span id
/// is `span` ([`ClosedRequest::segment_span_id`]).
pub(crate) fn segment_span_id(span: u64, edge: crate::Edge, segment: u32) -> u64 {
    let place = mix(u64::from(edge.from) << 32 | u64::from(edge.to))
        ^ mix(u64::from(segment).wrapping_add(0x9e37_79b9_7f4a_7c15));
    let id = mix(span ^ mix(place));
    if id == 0 || id == span {
        mix(id ^ 1).max(1)
    } else {
        id
    }
}

/// The trace words a request's slot keeps: its context (given, or a new
/// trace), its own span id, and its wall-clock origin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotTrace {
    pub(crate) trace_id: u128,
    /// The parent span id; 0 when the trace starts here.
    pub(crate) parent: u64,
    /// The request's own span id.
    pub(crate) span: u64,
    pub(crate) flags: u8,
    pub(crate) origin_unix_ns: u64,
}

impl SlotTrace {
    /// The trace words of a request beginning now under `parent` (or in a
    /// new, sampled trace).
    pub(crate) fn begin(parent: Option<TraceContext>) -> SlotTrace {
        let origin_unix_ns = crate::clock::unix_ns();
        let [hi, lo, span] = random_ids(origin_unix_ns);
        let (trace_id, parent, flags) = match parent {
            Some(p) => (
                u128::from_be_bytes(p.trace_id),
                u64::from_be_bytes(p.span_id),
                p.flags,
            ),
            None => (u128::from(hi) << 64 | u128::from(lo), 0, 1),
        };
        SlotTrace {
            trace_id,
            parent,
            span,
            flags,
            origin_unix_ns,
        }
    }

    /// As [`crate::layout::TRACE_WORDS`] words, in the order of
    /// [`crate::layout::trace_word`].
    pub(crate) fn to_words(self) -> [u64; crate::layout::TRACE_WORDS] {
        [
            (self.trace_id >> 64) as u64,
            self.trace_id as u64,
            self.parent,
            self.span,
            u64::from(self.flags),
            self.origin_unix_ns,
        ]
    }

    /// The trace words as read; `None` if they are not what `begin`
    /// writes (a zero trace or span id, flags past a byte).
    pub(crate) fn from_words(w: [u64; crate::layout::TRACE_WORDS]) -> Option<SlotTrace> {
        use crate::layout::trace_word::*;
        let t = SlotTrace {
            trace_id: u128::from(w[TRACE_HI]) << 64 | u128::from(w[TRACE_LO]),
            parent: w[PARENT],
            span: w[SPAN],
            flags: u8::try_from(w[FLAGS]).ok()?,
            origin_unix_ns: w[ORIGIN_UNIX_NS],
        };
        (t.trace_id != 0 && t.span != 0).then_some(t)
    }

    /// The context to hand downstream: this trace, this request's span.
    pub(crate) fn downstream(self) -> TraceContext {
        TraceContext {
            trace_id: self.trace_id.to_be_bytes(),
            span_id: self.span.to_be_bytes(),
            flags: self.flags,
        }
    }
}

/// A closed request as a reader drained it from a region's ring of closed
/// requests ([`Recorder::drain_closed`](crate::Recorder::drain_closed)):
/// its final values and its trace context, to send on as spans.
#[derive(Clone, Debug)]
pub struct ClosedRequest {
    pub(crate) token: Token,
    pub(crate) trace: SlotTrace,
    pub(crate) closed_us: u64,
    pub(crate) snapshot: Snapshot,
    /// Its claim number in the ring it was taken from.
    pub(crate) claim: u64,
}

impl ClosedRequest {
    /// The request's trace id.
    pub fn trace_id(&self) -> [u8; 16] {
        self.trace.trace_id.to_be_bytes()
    }

    /// The span id of the context the request began under
    /// ([`Recorder::begin_traced`](crate::Recorder::begin_traced)); `None`
    /// when its trace started here.
    pub fn parent_span_id(&self) -> Option<[u8; 8]> {
        self.parent_context().map(|p| p.span_id)
    }

    /// The context the request began under, if it was given one: its
    /// trace, and the caller's span.
    pub fn parent_context(&self) -> Option<TraceContext> {
        (self.trace.parent != 0).then(|| TraceContext {
            trace_id: self.trace.trace_id.to_be_bytes(),
            span_id: self.trace.parent.to_be_bytes(),
            flags: self.trace.flags,
        })
    }

    /// The request's own span id, made at begin: the parent of a stage's
    /// request on another host
    /// ([`Viewer::trace_context`](crate::Viewer::trace_context)).
    pub fn span_id(&self) -> [u8; 8] {
        self.trace.span.to_be_bytes()
    }

    /// The trace flags.
    pub fn trace_flags(&self) -> u8 {
        self.trace.flags
    }

    /// The request's context for its children: its trace, its own span.
    pub fn context(&self) -> TraceContext {
        self.trace.downstream()
    }

    /// When the request began: `CLOCK_REALTIME`, nanoseconds since the
    /// Unix epoch, read with its origin. It places the request's values
    /// (elapsed times from the origin) in absolute time; it is never used
    /// to subtract.
    pub fn origin_unix_ns(&self) -> u64 {
        self.trace.origin_unix_ns
    }

    /// When the request closed: its origin's wall-clock time plus the time
    /// from its origin to its close on the region's clock (microseconds).
    pub fn closed_unix_ns(&self) -> u64 {
        self.trace
            .origin_unix_ns
            .saturating_add(self.closed_us.saturating_mul(1000))
    }

    /// Milliseconds from the request's origin to its close, on the region's
    /// clock.
    pub fn closed_ms(&self) -> f64 {
        self.closed_us as f64 / 1000.0
    }

    /// The request's final values: what its close returned.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// The request's token (its instance in the region it closed in).
    pub fn token(&self) -> Token {
        self.token
    }

    /// The span id of the request's segment `segment` of `edge`, derived
    /// from the request's own span id, the edge and the segment: the same
    /// for every copy of the request a reader hands on, so that a request
    /// sent twice (a [`ClosedReader`](crate::ClosedReader) resends what a
    /// dead reader left unacknowledged) makes no second span in a backend
    /// that keys spans by id. Never all zeros, never the request's own
    /// span id.
    ///
    /// ```
    /// # use edgemark::{Edge, Recorder};
    /// let rec = Recorder::builder().edge(0, 1).edge(1, 2).create_in_memory().unwrap();
    /// rec.close(rec.begin().unwrap());
    /// let mut closed = Vec::new();
    /// rec.drain_closed(1, &mut closed).unwrap();
    /// let c = &closed[0];
    /// let id = c.segment_span_id(Edge::new(0, 1), 0);
    /// assert_eq!(id, c.clone().segment_span_id(Edge::new(0, 1), 0));
    /// assert_ne!(id, c.segment_span_id(Edge::new(1, 2), 0));
    /// assert_ne!(id, c.segment_span_id(Edge::new(0, 1), 1));
    /// assert_ne!(id, c.span_id());
    /// ```
    pub fn segment_span_id(&self, edge: crate::Edge, segment: u32) -> [u8; 8] {
        segment_span_id(self.trace.span, edge, segment).to_be_bytes()
    }

    /// Its claim number in the region's ring of closed requests: what a
    /// [`ClosedReader`](crate::ClosedReader) acknowledges it by. Claims
    /// number the closes of a region from 0.
    pub fn claim(&self) -> u64 {
        self.claim
    }
}

/// What one [`Recorder::drain_closed`](crate::Recorder::drain_closed) did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Drained {
    /// Closed requests this call took (appended to its vector).
    pub taken: usize,
    /// Closed requests this call found torn (a lapped close's late stores,
    /// or a hostile writer) and gave up: lost. Also added to
    /// [`Counters::closed_lost`](crate::report::Counters::closed_lost),
    /// which also counts the requests overwritten before any reader took
    /// them, as the closes that overwrite them happen.
    pub lost: u64,
    /// The claim number of a closed request whose close has not finished
    /// writing it, where this call stopped: the next call reads on from
    /// there, or [`Recorder::skip_closed`](crate::Recorder::skip_closed)
    /// gives it up.
    pub pending: Option<u64>,
    /// Whether the call stopped because no closed request was left to
    /// take (rather than at `max`, at a pending one, or after its bound of
    /// steps while other readers or closers kept it busy).
    pub caught_up: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_parse_and_print_as_the_w3c_recommendation_says() {
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let c: TraceContext = tp.parse().unwrap();
        assert_eq!(c.trace_id_hex(), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(c.span_id_hex(), "b7ad6b7169203331");
        assert_eq!(c.flags(), 1);
        assert_eq!(c.to_string(), tp);
        // A later version may carry more fields; version 00 may not.
        let later = "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00-extra";
        assert_eq!(later.parse::<TraceContext>().unwrap().flags(), 0);
        let bad = [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01",
            "00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "0g-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ];
        for b in bad {
            assert_eq!(
                b.parse::<TraceContext>(),
                Err(TraceparentError::Format),
                "{b:?}"
            );
        }
        assert_eq!(
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".parse::<TraceContext>(),
            Err(TraceparentError::Version)
        );
        assert_eq!(
            "00-00000000000000000000000000000000-b7ad6b7169203331-01".parse::<TraceContext>(),
            Err(TraceparentError::ZeroTraceId)
        );
        assert_eq!(
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01".parse::<TraceContext>(),
            Err(TraceparentError::ZeroSpanId)
        );
    }

    #[test]
    fn slot_trace_words_round_trip_and_a_new_trace_is_random() {
        let parent: TraceContext = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
            .parse()
            .unwrap();
        let t = SlotTrace::begin(Some(parent));
        assert_eq!(SlotTrace::from_words(t.to_words()), Some(t));
        assert_eq!(t.downstream().trace_id(), parent.trace_id());
        assert_ne!(t.downstream().span_id(), parent.span_id());
        assert_eq!(t.parent.to_be_bytes(), parent.span_id());
        let (a, b) = (SlotTrace::begin(None), SlotTrace::begin(None));
        assert_ne!(a.trace_id, b.trace_id);
        assert_ne!(a.span, b.span);
        assert_eq!(a.parent, 0);
        let mut words = a.to_words();
        words[crate::layout::trace_word::FLAGS] = 256;
        assert_eq!(SlotTrace::from_words(words), None);
    }
}
