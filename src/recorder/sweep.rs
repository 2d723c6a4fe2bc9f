//! Reads of every slot: sweeps of the open requests, reclaims of dead
//! owners, and the histograms of closed requests.

use std::time::Duration;

use super::{Live, Recorder, Viewer, holder};
use crate::process;
use crate::protocol::{Closed, Discard, Found, Reclaimed};
use crate::region::SweepError;
use crate::report::{self, EdgeHistogram, ExpireReport, Owner, ReclaimReport};
use crate::snapshot::{RequestState, Snapshot};
use crate::token::Token;

impl Live<'_> {
    /// Every open request, in slot order, for `f`; stops and fails as soon
    /// as an access found the file shrunk (its pages then read as zeros).
    /// Slots in a hole of the file are skipped: never written, they are
    /// free ([`Storage::slot_runs`]).
    fn sweep(&self, f: impl FnMut(Found)) -> Result<(), SweepError> {
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
    ) -> Result<(), SweepError> {
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

impl Viewer {
    /// The protocol view for a sweep of all slots: `None` when disabled, an
    /// error if the region's file no longer has its full length (see
    /// [`Viewer::check`]).
    fn live_for_sweep(&self) -> Result<Option<Live<'_>>, SweepError> {
        match self.live() {
            None => Ok(None),
            Some(live) => live.inner.storage.check_len().map(|()| Some(live)),
        }
    }

    /// Checks that the region's file still has its full length and that no
    /// access has found it shrunk since it was attached (another process
    /// with write access can shrink it; see `docs/design.md`, "A file shrunk
    /// under a mapping"). Sweeps of all slots call this first and fail with
    /// its error; single-request calls do not (it is a system call). An
    /// in-memory region always passes.
    pub fn check(&self) -> Result<(), SweepError> {
        self.live()
            .map_or(Ok(()), |live| live.inner.storage.check_len())
    }

    /// The tokens of every open request, in slot order (a sweep of all
    /// slots). Empty when disabled.
    ///
    /// Errors: what [`Viewer::check`] says before the sweep, or
    /// [`SweepError::Shrunk`] if the file was found shrunk during it.
    pub fn open_requests(&self) -> Result<Vec<Token>, SweepError> {
        self.check()?;
        self.open_requests_checked()
    }

    /// [`Viewer::open_requests`] for a caller that has just run
    /// [`Viewer::check`] and runs it again after (the exporter's scrape):
    /// the sweep still fails on a page lost during it, without a second
    /// `fstat`.
    pub(crate) fn open_requests_checked(&self) -> Result<Vec<Token>, SweepError> {
        let mut out = Vec::new();
        if let Some(live) = self.live() {
            live.sweep(|found| out.push(live.inner.token(found.req)))?;
        }
        Ok(out)
    }

    /// How many requests are open: [`Viewer::open_requests_checked`]
    /// without collecting their tokens.
    pub(crate) fn open_count_checked(&self) -> Result<u32, SweepError> {
        let mut n = 0u32;
        if let Some(live) = self.live() {
            live.sweep(|_| n = n.saturating_add(1))?;
        }
        Ok(n)
    }

    /// Snapshots of every open request: one sweep of the region, collected.
    /// [`Viewer::for_each_open`] does the same without holding them all.
    /// Errors as [`Viewer::for_each_open`].
    pub fn snapshot_open(&self) -> Result<Vec<(Token, Snapshot)>, SweepError> {
        let mut out = Vec::new();
        self.snapshot_open_into(&mut out)?;
        Ok(out)
    }

    /// [`Viewer::snapshot_open`] into a buffer the caller keeps between
    /// sweeps: `out` is replaced by the snapshots of every open request, and
    /// its storage, and that of the snapshots already in it, is reused. A
    /// sweep into a buffer that an earlier sweep of as many requests filled
    /// allocates nothing, as long as no request has more than two edge
    /// segments with events (a snapshot holds two inline).
    ///
    /// Errors as [`Viewer::for_each_open`]; on an error `out` holds the
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
    /// # Ok::<(), edgemark::SweepError>(())
    /// ```
    pub fn snapshot_open_into(&self, out: &mut Vec<(Token, Snapshot)>) -> Result<(), SweepError> {
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
    /// [`Viewer::snapshot_open`]).
    ///
    /// Errors: what [`Viewer::check`] says before the sweep (nothing is
    /// swept), or [`SweepError::Shrunk`] if the file was found shrunk
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
    /// # Ok::<(), edgemark::SweepError>(())
    /// ```
    pub fn for_each_open(&self, mut f: impl FnMut(Token, &Snapshot)) -> Result<(), SweepError> {
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
}

impl Recorder {
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
    pub fn reclaim_dead_owners(&self) -> Result<ReclaimReport, SweepError> {
        self.reclaim_dead(false)
    }

    /// [`Recorder::reclaim_dead_owners`] that judges every owner and lock
    /// holder as a process of this process's pid namespace, even when the
    /// region is shared across pid namespaces
    /// ([`RegionInfo::pids_unjudged`](crate::report::RegionInfo::pids_unjudged)). Use it only when the processes of
    /// other namespaces that attached are gone or never began a request:
    /// a live owner there whose pid names no process here loses its
    /// request.
    ///
    /// Errors: as [`Recorder::reclaim_where`].
    pub fn reclaim_dead_owners_in_this_namespace(&self) -> Result<ReclaimReport, SweepError> {
        self.reclaim_dead(true)
    }

    fn reclaim_dead(&self, judge_anyway: bool) -> Result<ReclaimReport, SweepError> {
        let Some(Live { inner, .. }) = self.live() else {
            return Ok(ReclaimReport::default());
        };
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
    /// Errors: what [`Viewer::check`] says before the sweep; [`SweepError::Shrunk`] if
    /// the file was found shrunk during it (what was freed before stays
    /// freed).
    pub fn reclaim_where(
        &self,
        owner_dead: impl Fn(Owner) -> bool,
        holder_dead: impl Fn(u32) -> bool,
    ) -> Result<ReclaimReport, SweepError> {
        let mut report = ReclaimReport::default();
        let Some(live) = self.live_for_sweep()? else {
            return Ok(report);
        };
        let proto = live.proto;
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
}

impl Recorder {
    /// Closes every open request that has been open for at least
    /// `older_than`: a bound on how long a request can stay open, for the
    /// requests whose closer died (killed, out of memory) or never saw
    /// them, which would otherwise hold their slots for ever and fill the
    /// region. Nothing calls it by itself: whoever begins requests (a
    /// serving framework's plugin) calls it now and then, with a bound
    /// well above the longest request it serves.
    ///
    /// A request's age is the time from its origin (the reading of the
    /// region's clock at its begin) to a reading of the same clock taken
    /// once, when the call starts; requests begun after that reading are
    /// younger than any bound. Each expired request is closed through the
    /// ordinary close ([`Recorder::close`]): idempotent, safe against any
    /// close, reclaim or expiry racing it, its final values (the events it
    /// lacks missing, null in its snapshot) in the histograms and in the
    /// ring of closed requests for its readers, exactly as any close puts
    /// them. The expiry whose close ended a request counts it in
    /// [`Counters::expired_requests`](crate::report::Counters::expired_requests),
    /// once however many processes expire at once; a request that another
    /// close ended first is not counted as expired. A request whose slot
    /// another live control operation holds for the whole bounded wait
    /// (about a second) stays open for the next call.
    ///
    /// Requests whose age this process cannot judge are left open and
    /// counted in [`ExpireReport::unjudged`]: all of them when this
    /// process does not read the region's clock (it attached from another
    /// boot or time namespace, or does not trust a counter region's
    /// counter: see [`RegionInfo::shares_clock`](crate::report::RegionInfo::shares_clock)),
    /// and, in a process that does, those begun by a process of another
    /// time namespace, whose origin is on its own clock (a begin there
    /// stores no process start time, which is how they are told).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use edgemark::{Edge, Event, Mark, RequestState, Recorder};
    /// let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    /// let t = rec.begin().unwrap();
    /// rec.record(t, Mark::new(Edge::new(0, 1), Event::ProducerFirstNonemptyEmit));
    /// // No request is an hour old.
    /// assert_eq!(rec.expire_open(Duration::from_secs(3600))?.expired, 0);
    /// // Every request open when the call starts is at least 0 s old.
    /// assert_eq!(rec.expire_open(Duration::ZERO)?.expired, 1);
    /// assert_eq!(rec.snapshot(t).state(), RequestState::Gone);
    /// assert_eq!(rec.counters().expired_requests, 1);
    /// assert_eq!(rec.counters().closed_requests, 1);
    /// # Ok::<(), edgemark::SweepError>(())
    /// ```
    ///
    /// Errors: what [`Viewer::check`] says before the sweep, or
    /// [`SweepError::Shrunk`] if the file was found shrunk during it (what
    /// was closed before stays closed). A disabled recorder expires
    /// nothing.
    ///
    /// A recorder, not a [`Viewer`]: it closes requests. A viewer cannot
    /// expire, as a type: this does not compile.
    ///
    /// ```compile_fail
    /// # use edgemark::{Recorder, Viewer};
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("r.region");
    /// # let owner = Recorder::builder().edge(0, 1).create(&path)?;
    /// let viewer = Viewer::attach(&path)?;
    /// viewer.expire_open(std::time::Duration::ZERO);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn expire_open(&self, older_than: Duration) -> Result<ExpireReport, SweepError> {
        let mut report = ExpireReport::default();
        let Some(live) = self.live_for_sweep()? else {
            return Ok(report);
        };
        let Live { inner, proto } = live;
        let reads_clock = inner.clock.reads_clock();
        let now = inner.now();
        let bound_us = older_than.as_micros();
        live.sweep(|found| {
            let slot = found.req.slot;
            // Relaxed owner and origin reads after the sweep's Acquire head
            // load: this request's, or a later one's if the slot moved on,
            // in which case the close below fails on the generation.
            if !reads_clock || proto.owner(slot).start_ticks == 0 {
                report.unjudged += 1;
                return;
            }
            let origin = proto.origin(slot);
            if origin > now || u128::from(inner.micros_between(origin, now)) < bound_us {
                return;
            }
            if let Ok(Closed::Freed) = live.close_into(found.req, &mut Discard) {
                proto.count_expired();
                report.expired += 1;
            }
        })?;
        Ok(report)
    }
}

impl Viewer {
    /// The histograms of every closed request's values and deltas, per edge:
    /// for each edge, one per schema event, then one per delta between
    /// consecutive events (recorded in one clock domain, in order).
    ///
    /// Empty when disabled. Errors as [`Viewer::check`], before or after
    /// the histograms are read.
    pub fn histograms(&self) -> Result<Vec<EdgeHistogram>, SweepError> {
        self.check()?;
        self.histograms_checked()
    }

    /// [`Viewer::histograms`] for a caller that runs [`Viewer::check`]
    /// before and after ([`Viewer::open_requests_checked`]).
    pub(crate) fn histograms_checked(&self) -> Result<Vec<EdgeHistogram>, SweepError> {
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

#[cfg(all(test, not(edgemark_loom)))]
mod tests {
    use super::*;
    use crate::mark::{Edge, Mark};
    use crate::outcome::Outcome;
    use crate::schema::{Event, Schema};

    const E01: Edge = Edge::new(0, 1);
    const E12: Edge = Edge::new(1, 2);

    /// A region whose open requests have every shape a sweep meets: nothing
    /// recorded, one event, every event of both edges, segments that left
    /// the window, a value in a registered domain; and a closed request.
    fn every_shape() -> (Recorder, Vec<Token>) {
        let rec = Recorder::builder()
            .edge(0, 1)
            .edge(1, 2)
            .segments(2)
            .slots(16)
            .create_in_memory()
            .unwrap();
        let record = |t, mark| assert_eq!(rec.record(t, mark), Outcome::Recorded);
        let idle = rec.begin().unwrap();
        let one = rec.begin().unwrap();
        record(one, Mark::new(E12, Event::ALL[1]));
        let closed = rec.begin().unwrap();
        record(closed, Mark::new(E01, Event::ALL[0]));
        let full = rec.begin().unwrap();
        for edge in [E01, E12] {
            for event in Event::ALL {
                record(full, Mark::new(edge, event).chunk_seq(3));
            }
        }
        let segmented = rec.begin().unwrap();
        for seg in 0..4 {
            if seg > 0 {
                assert_eq!(rec.start_segment(segmented, E01, seg), Outcome::Started);
            }
            record(segmented, Mark::new(E01, Event::ALL[2]).segment(seg));
        }
        let elsewhere = rec.begin().unwrap();
        let mark = Mark::new(E12, Event::ALL[3]);
        assert!(
            rec.record_elapsed(elsewhere, mark, 2.5, "worker")
                .is_success()
        );
        rec.close(closed);
        (rec, vec![idle, one, full, segmented, elsewhere])
    }

    #[test]
    fn every_sweep_gives_the_snapshots_of_single_reads() {
        let (rec, tokens) = every_shape();
        let single: Vec<(Token, Snapshot)> = tokens.iter().map(|&t| (t, rec.snapshot(t))).collect();
        assert_eq!(single[3].1.segments().len(), 2);
        assert_eq!(single[3].1.dropped_segments(), 2);
        assert_eq!(
            single[4].1.segments()[0].domain(Event::ALL[3]),
            Some("worker")
        );

        let mut lent = Vec::new();
        rec.for_each_open(|t, s| lent.push((t, s.clone()))).unwrap();
        assert_eq!(lent, single);
        assert_eq!(rec.snapshot_open().unwrap(), single);
        let json = |v: &[(Token, Snapshot)]| v.iter().map(|(_, s)| s.to_json()).collect::<Vec<_>>();
        assert_eq!(json(&lent), json(&single));

        // A buffer filled by a sweep of another region, with another
        // schema and more requests, is refilled as a fresh one.
        let schema = Schema::empty()
            .with_event("only", "host_monotonic", true)
            .unwrap();
        let other = Recorder::builder()
            .edge(0, 1)
            .schema(schema)
            .create_in_memory()
            .unwrap();
        for _ in 0..8 {
            let t = other.begin().unwrap();
            other.record(t, Mark::new(E01, crate::schema::EventId(0)).chunk_seq(1));
        }
        let mut kept = Vec::new();
        other.snapshot_open_into(&mut kept).unwrap();
        assert_eq!(kept.len(), 8);
        rec.snapshot_open_into(&mut kept).unwrap();
        assert_eq!(kept, single);
        assert_eq!(json(&kept), json(&single));
        // And back.
        other.snapshot_open_into(&mut kept).unwrap();
        assert_eq!(kept, other.snapshot_open().unwrap());
        assert_eq!(kept[0].1.segments()[0].first_chunk_seq(), Some(1));
    }

    #[test]
    fn a_lent_snapshot_cloned_outlives_its_sweep_and_recorder() {
        let (rec, tokens) = every_shape();
        let mut kept = None;
        rec.for_each_open(|t, s| {
            if t == tokens[2] {
                kept = Some(s.clone());
            }
        })
        .unwrap();
        let expected = rec.snapshot(tokens[2]).to_json();
        drop(rec);
        let kept = kept.unwrap();
        assert_eq!(kept.to_json(), expected);
        let seg = kept.segment(E01, 0).unwrap().clone();
        drop(kept);
        assert_eq!(seg.first_chunk_seq(), Some(3));
        assert_eq!(seg.domain(Event::ALL[0]), Some("host_monotonic"));
    }
}
