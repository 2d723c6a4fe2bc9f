//! What a region declares and counts: its schema, edges, clock, identity,
//! counters, domains, and a request's owner.

use std::path::Path;

use super::Viewer;
use crate::clock::Clock;
use crate::mark::Edge;
use crate::process;
use crate::region::SweepError;
use crate::report::{self, Counters, EventInfo, Occupancy, Owner, RegionInfo, RegionReport};
use crate::schema::{EventId, Schema};
use crate::token::{RegionId, Token};

impl Viewer {
    /// Every clock domain of the region, declared and registered, in id
    /// order; empty when disabled.
    pub fn domains(&self) -> Vec<String> {
        self.live()
            .map_or_else(Vec::new, |live| live.inner.names.all(live.proto.words))
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

    /// The region's geometry, identity and schema; `None` when disabled.
    pub fn info(&self) -> Option<RegionInfo> {
        let live = self.live()?;
        let i = live.inner;
        let h = &i.header;
        let schema = &*h.schema;
        Some(RegionInfo {
            region_id: RegionId::new(h.region_id),
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
            edges: h.edges.clone(),
            events: schema
                .events()
                .iter()
                .map(|e| {
                    let domain = schema.domain_name(e.domain()).unwrap_or_default();
                    EventInfo::new(e.name(), domain, e.keeps_chunk_seq())
                })
                .collect(),
            domains: i.names.all(live.proto.words),
        })
    }

    /// Everything the region says about itself now, in its one encoding
    /// (see [`report`](crate::report)): its info, its counters, and its
    /// occupancy from one sweep of the slots and one pass over the ring of
    /// closed requests; `None` when disabled.
    ///
    /// ```
    /// let rec = edgemark::Recorder::builder().edge(0, 1).slots(8).create_in_memory()?;
    /// let t = rec.begin().expect("a free slot");
    /// rec.close(t);
    /// rec.begin().expect("a free slot");
    /// let report = rec.report()?.expect("an enabled recorder");
    /// assert_eq!((report.occupancy.open_requests, report.occupancy.free_slots), (1, 7));
    /// assert_eq!(report.counters.closed_requests, 1);
    /// let json = serde_json::to_value(&report).unwrap();
    /// assert_eq!(json["edges"], serde_json::json!(["0->1"]));
    /// assert_eq!(json["closed_requests"], 1);
    /// assert_eq!(json["clock"]["kind"], "monotonic");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// Errors: what [`Viewer::check`] says before the sweep, or
    /// [`SweepError::Shrunk`](crate::SweepError::Shrunk) if the file was
    /// found shrunk during it.
    pub fn report(&self) -> Result<Option<RegionReport>, SweepError> {
        self.check()?;
        self.report_checked()
    }

    /// [`Viewer::report`] for a caller that runs [`Viewer::check`] before
    /// and after (the Prometheus scrape).
    pub(crate) fn report_checked(&self) -> Result<Option<RegionReport>, SweepError> {
        let Some(info) = self.info() else {
            return Ok(None);
        };
        // The ring's pass first: a page it found lost (read as zeros)
        // marks the mapping faulted, which the sweep's last check reports.
        // Entries in a hole of a sparse file were never written: left out,
        // as the sweep leaves out the slots there.
        let ring = match self.live() {
            Some(live) if info.ring_entries > 0 => {
                let (mut unread, mut unacknowledged) = (0, 0);
                let inner = live.inner;
                inner.storage.ring_runs(&inner.header.layout, |from, to| {
                    let (u, a) = live.proto.ring_states(from..to);
                    unread += u;
                    unacknowledged += a;
                });
                (unread, unacknowledged, live.proto.ring_readers())
            }
            _ => (0, 0, 0),
        };
        let open = self.open_count_checked()?;
        let (unread, unacknowledged, readers) = ring;
        let occupancy =
            Occupancy::new(open, info.slots).with_closed_ring(unread, unacknowledged, readers);
        Ok(Some(RegionReport {
            counters: self.counters(),
            occupancy,
            info,
        }))
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

    /// The region's counters of refused records and dropped segments.
    pub fn counters(&self) -> Counters {
        self.live()
            .map_or_else(Counters::default, |live| report::counters(live.proto.words))
    }
}
