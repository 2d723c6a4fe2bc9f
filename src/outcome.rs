//! What a record, begin or start-segment call did.

use std::fmt;

/// The outcome of a recording call.
///
/// Recording never fails a request (brief S10): every runtime condition is
/// an outcome, cheap to ignore. Only [`Outcome::Recorded`] and
/// [`Outcome::Started`] mean that state changed.
///
/// The refusals in [`Outcome::COUNTED`] are also counted in the region's
/// header. [`Outcome::Duplicate`] and [`Outcome::NotMeaningful`] are not: they
/// are normal operation (instrumentation may mark every chunk), and counting
/// them would put a shared, contended write on the hottest refusal path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Outcome {
    /// The first write of this event for this request, edge and segment: it
    /// is now in every later snapshot.
    Recorded,
    /// `start_segment` started the segment.
    Started,
    /// An earlier write of the same event, edge and segment won.
    Duplicate,
    /// The payload was not meaningful (heartbeat, retry, metadata-only or
    /// empty terminal payload): nothing was written.
    NotMeaningful,
    /// The segment was retired by a newer one (or, for `start_segment`, is
    /// not newer than the current one).
    StaleSegment,
    /// The segment has not been started on this edge; recording never
    /// advances a segment.
    SegmentNotStarted,
    /// The request is closed (or closing).
    Closed,
    /// The token's slot now holds a newer request.
    Reused,
    /// This process does not share the region's clock (another boot or time
    /// namespace, or a counter region whose counter it does not trust), or
    /// the event is declared in a clock domain other than the shared one, so
    /// the clock-reading form cannot record it; also a `host_monotonic`
    /// value measured elsewhere given to a counter region.
    ClockMismatch,
    /// A malformed argument: a negative, infinite or NaN elapsed time, an
    /// elapsed time before the request's origin, or a token that is not a
    /// token of any region.
    Invalid,
    /// An elapsed time or chunk sequence beyond what a cell holds (see
    /// `docs/limitations.md`), or too many segments started on one edge.
    OutOfRange,
    /// The edge is not declared in the region.
    UnknownEdge,
    /// The event is not in the region's schema.
    UnknownEvent,
    /// The clock-domain name cannot name a domain: empty or blank, longer
    /// than 32 bytes, or with a control or invisible format character such
    /// as a bidirectional control. (Any valid name is
    /// registered on first use; see [`Outcome::DomainTableFull`].)
    UnknownDomain,
    /// The token belongs to another region.
    ForeignToken,
    /// `begin` found no free slot (fail open: the request runs unrecorded).
    RegionFull,
    /// Another control operation on the same request held its slot for too
    /// long (its process may have died; `reclaim` frees such slots).
    Busy,
    /// A word of the slot holds bits edgemark never writes.
    Corrupt,
    /// Recording is off: the recorder is [`Recorder::disabled`](crate::Recorder::disabled).
    Disabled,
    /// The region's clock-domain table is full (32 domains, declared and
    /// registered together), so a new domain name could not be registered.
    DomainTableFull,
    /// A handle that may only read the region was asked to write it. A
    /// [`Viewer`](crate::Viewer) has no call that writes, so no call of this
    /// crate gives it; bindings whose handles are read-only at run time
    /// (Python's `Region.attach(path, read_only=True)`) answer their writing
    /// calls with it. Not counted (counting would be a write).
    ReadOnly,
    /// This process's mapping of the region lost a page: the file was
    /// truncated under it, or a sparse region's file system had no space
    /// for a page ([`Viewer::check`](crate::Viewer::check) says which).
    /// `begin`, `start_segment` and `close` refuse from then on, since
    /// what they would write may reach no other process; attach the region
    /// again. Not counted (the counter may be on a lost page too).
    Faulted,
}

impl Outcome {
    /// Every outcome, in declaration order.
    pub const ALL: [Outcome; 22] = [
        Outcome::Recorded,
        Outcome::Started,
        Outcome::Duplicate,
        Outcome::NotMeaningful,
        Outcome::StaleSegment,
        Outcome::SegmentNotStarted,
        Outcome::Closed,
        Outcome::Reused,
        Outcome::ClockMismatch,
        Outcome::Invalid,
        Outcome::OutOfRange,
        Outcome::UnknownEdge,
        Outcome::UnknownEvent,
        Outcome::UnknownDomain,
        Outcome::ForeignToken,
        Outcome::RegionFull,
        Outcome::Busy,
        Outcome::Corrupt,
        Outcome::Disabled,
        Outcome::DomainTableFull,
        Outcome::ReadOnly,
        Outcome::Faulted,
    ];

    /// The outcome with this [`Outcome::name`].
    ///
    /// ```
    /// use edgemark::Outcome;
    /// assert_eq!(Outcome::from_name("duplicate"), Some(Outcome::Duplicate));
    /// assert_eq!(Outcome::from_name("nope"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|o| o.name() == name)
    }

    /// The refusals counted in the region header, in counter order. The
    /// order is part of the region format.
    pub const COUNTED: [Outcome; 15] = [
        Outcome::StaleSegment,
        Outcome::SegmentNotStarted,
        Outcome::Closed,
        Outcome::Reused,
        Outcome::ClockMismatch,
        Outcome::Invalid,
        Outcome::OutOfRange,
        Outcome::UnknownEdge,
        Outcome::UnknownEvent,
        Outcome::UnknownDomain,
        Outcome::ForeignToken,
        Outcome::RegionFull,
        Outcome::Busy,
        Outcome::Corrupt,
        Outcome::DomainTableFull,
    ];

    /// Whether the call changed state (`Recorded` or `Started`).
    #[inline]
    pub fn is_success(self) -> bool {
        matches!(self, Outcome::Recorded | Outcome::Started)
    }

    /// A stable snake-case name, as used in logs, JSON and metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Recorded => "recorded",
            Outcome::Started => "started",
            Outcome::Duplicate => "duplicate",
            Outcome::NotMeaningful => "not_meaningful",
            Outcome::StaleSegment => "stale_segment",
            Outcome::SegmentNotStarted => "segment_not_started",
            Outcome::Closed => "closed",
            Outcome::Reused => "reused",
            Outcome::ClockMismatch => "clock_mismatch",
            Outcome::Invalid => "invalid",
            Outcome::OutOfRange => "out_of_range",
            Outcome::UnknownEdge => "unknown_edge",
            Outcome::UnknownEvent => "unknown_event",
            Outcome::UnknownDomain => "unknown_domain",
            Outcome::ForeignToken => "foreign_token",
            Outcome::RegionFull => "region_full",
            Outcome::Busy => "busy",
            Outcome::Corrupt => "corrupt",
            Outcome::Disabled => "disabled",
            Outcome::DomainTableFull => "domain_table_full",
            Outcome::ReadOnly => "read_only",
            Outcome::Faulted => "faulted",
        }
    }

    /// The header counter of a counted refusal.
    #[inline]
    pub(crate) fn counter(self) -> Option<usize> {
        // A match, not a search: this runs on refusal paths.
        Some(match self {
            Outcome::StaleSegment => 0,
            Outcome::SegmentNotStarted => 1,
            Outcome::Closed => 2,
            Outcome::Reused => 3,
            Outcome::ClockMismatch => 4,
            Outcome::Invalid => 5,
            Outcome::OutOfRange => 6,
            Outcome::UnknownEdge => 7,
            Outcome::UnknownEvent => 8,
            Outcome::UnknownDomain => 9,
            Outcome::ForeignToken => 10,
            Outcome::RegionFull => 11,
            Outcome::Busy => 12,
            Outcome::Corrupt => 13,
            Outcome::DomainTableFull => 14,
            _ => return None,
        })
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_is_listed_once_and_found_by_name() {
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(Outcome::from_name(o.name()), Some(*o));
            assert!(!Outcome::ALL[..i].contains(o));
        }
        for o in Outcome::COUNTED {
            assert!(Outcome::ALL.contains(&o));
        }
    }

    #[test]
    fn counted_order_matches_counter_indexes() {
        for (i, o) in Outcome::COUNTED.iter().enumerate() {
            assert_eq!(o.counter(), Some(i), "{o}");
        }
        assert_eq!(Outcome::Duplicate.counter(), None);
        assert_eq!(Outcome::Recorded.counter(), None);
        assert!(Outcome::COUNTED.len() <= crate::layout::MAX_COUNTERS);
    }
}
