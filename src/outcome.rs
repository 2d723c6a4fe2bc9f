//! What a record, begin or start-segment call did.

use std::fmt;

/// Declares [`Outcome`] from one table: each variant with its doc, its
/// stable name and, for a counted refusal, its header counter. [`Outcome::ALL`],
/// [`Outcome::name`], [`Outcome::COUNTED`] and `Outcome::counter` are all
/// made from it, so that no list of outcomes is written twice.
macro_rules! outcomes {
    ($($(#[$doc:meta])* $variant:ident = $name:literal $(, counter $counter:literal)?;)*) => {
        /// The outcome of a recording call.
        ///
        /// Recording never fails a request: every runtime condition is an
        /// outcome, cheap to ignore (the README's "Fail open"). Only
        /// [`Outcome::Recorded`] and [`Outcome::Started`] mean that state
        /// changed.
        ///
        /// The refusals in [`Outcome::COUNTED`] are also counted in the region's
        /// header. [`Outcome::Duplicate`] and [`Outcome::NotMeaningful`] are not: they
        /// are normal operation (instrumentation may mark every chunk), and counting
        /// them would put a shared, contended write on the hottest refusal path.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum Outcome {
            $($(#[$doc])* $variant,)*
        }

        impl Outcome {
            /// Every outcome, in declaration order.
            pub const ALL: [Outcome; [$(Outcome::$variant),*].len()] = [$(Outcome::$variant),*];

            /// A stable snake-case name, as used in logs, JSON and metrics labels.
            pub fn name(self) -> &'static str {
                match self {
                    $(Outcome::$variant => $name,)*
                }
            }

            /// The header counter of a counted refusal.
            #[inline]
            pub(crate) const fn counter(self) -> Option<usize> {
                // A match, not a search: this runs on refusal paths.
                match self {
                    $($(Outcome::$variant => Some($counter),)?)*
                    #[allow(unreachable_patterns)]
                    _ => None,
                }
            }
        }
    };
}

outcomes! {
    /// The first write of this event for this request, edge and segment: it
    /// is now in every later snapshot.
    Recorded = "recorded";
    /// `start_segment` started the segment.
    Started = "started";
    /// An earlier write of the same event, edge and segment won.
    Duplicate = "duplicate";
    /// The payload was not meaningful (heartbeat, retry, metadata-only or
    /// empty terminal payload): nothing was written.
    NotMeaningful = "not_meaningful";
    /// The segment was retired by a newer one (or, for `start_segment`, is
    /// not newer than the current one).
    StaleSegment = "stale_segment", counter 0;
    /// The segment has not been started on this edge; recording never
    /// advances a segment.
    SegmentNotStarted = "segment_not_started", counter 1;
    /// The request is closed (or closing).
    Closed = "closed", counter 2;
    /// The token's slot now holds a newer request.
    Reused = "reused", counter 3;
    /// This process does not share the region's clock (another boot or time
    /// namespace, or a counter region whose counter it does not trust), or
    /// the event is declared in a clock domain other than the shared one, so
    /// the clock-reading form cannot record it; also a `host_monotonic`
    /// value measured elsewhere given to a counter region.
    ClockMismatch = "clock_mismatch", counter 4;
    /// A malformed argument: a negative, infinite or NaN elapsed time, an
    /// elapsed time before the request's origin, or a token that is not a
    /// token of any region.
    Invalid = "invalid", counter 5;
    /// An elapsed time or chunk sequence beyond what a cell holds (see
    /// `docs/limitations.md`), or too many segments started on one edge.
    OutOfRange = "out_of_range", counter 6;
    /// The edge is not declared in the region.
    UnknownEdge = "unknown_edge", counter 7;
    /// The event is not in the region's schema.
    UnknownEvent = "unknown_event", counter 8;
    /// The clock-domain name cannot name a domain: empty or blank, longer
    /// than 32 bytes, or with a control or invisible format character such
    /// as a bidirectional control. (Any valid name is
    /// registered on first use; see [`Outcome::DomainTableFull`].)
    UnknownDomain = "unknown_domain", counter 9;
    /// The token belongs to another region.
    ForeignToken = "foreign_token", counter 10;
    /// `begin` found no free slot (fail open: the request runs unrecorded).
    RegionFull = "region_full", counter 11;
    /// Another control operation on the same request held its slot for too
    /// long (its process may have died; `reclaim` frees such slots).
    Busy = "busy", counter 12;
    /// A word of the slot holds bits edgemark never writes.
    Corrupt = "corrupt", counter 13;
    /// Recording is off: the recorder is [`Recorder::disabled`](crate::Recorder::disabled).
    Disabled = "disabled";
    /// The region's clock-domain table is full (32 domains, declared and
    /// registered together), so a new domain name could not be registered.
    DomainTableFull = "domain_table_full", counter 14;
    /// A handle that may only read the region was asked to write it. A
    /// [`Viewer`](crate::Viewer) has no call that writes, so no call of this
    /// crate gives it; bindings whose handles are read-only at run time
    /// (Python's `Region.attach(path, read_only=True)`) answer their writing
    /// calls with it. Not counted (counting would be a write).
    ReadOnly = "read_only";
    /// This process's mapping of the region lost a page: the file was
    /// truncated under it, or a sparse region's file system had no space
    /// for a page ([`Viewer::check`](crate::Viewer::check) says which).
    /// `begin`, `start_segment` and `close` refuse from then on, since
    /// what they would write may reach no other process; attach the region
    /// again. Not counted (the counter may be on a lost page too).
    Faulted = "faulted";
}

/// How many outcomes are counted.
const COUNTED_LEN: usize = {
    let mut n = 0;
    let mut i = 0;
    while i < Outcome::ALL.len() {
        if Outcome::ALL[i].counter().is_some() {
            n += 1;
        }
        i += 1;
    }
    n
};

impl Outcome {
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
    pub const COUNTED: [Outcome; COUNTED_LEN] = {
        let mut out = [Outcome::Recorded; COUNTED_LEN];
        let mut seen = [false; COUNTED_LEN];
        let mut i = 0;
        while i < Outcome::ALL.len() {
            if let Some(c) = Outcome::ALL[i].counter() {
                // Each counter is one outcome's, and they are 0..COUNTED_LEN.
                assert!(
                    c < COUNTED_LEN && !seen[c],
                    "counters are 0.. without gaps or repeats"
                );
                seen[c] = true;
                out[c] = Outcome::ALL[i];
            }
            i += 1;
        }
        out
    };

    /// Whether the call changed state (`Recorded` or `Started`).
    #[inline]
    pub fn is_success(self) -> bool {
        matches!(self, Outcome::Recorded | Outcome::Started)
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
