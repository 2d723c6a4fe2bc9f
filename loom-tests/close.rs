//! Models of close: a writer races close, a stale writer races close and
//! the reuse of its slot, a reclaim races a live owner's close.

use super::*;

// ---------------------------------------------------------------------------
// Model 2: a writer races close.
// ---------------------------------------------------------------------------

/// A writer records two events (producer 1 ms chunk 7, then send 1.5 ms)
/// while the owner closes the request and an observer takes two snapshots.
/// For each event, either the writer was told `Recorded` and the value is in
/// the final snapshot (close's return value), or it was refused as `Closed`
/// and the value is absent: never recorded-and-missing, never
/// refused-and-present. An observer snapshot is either of the open request,
/// showing only values that are in the final snapshot and everything its
/// earlier snapshot showed, or `Gone` and empty: a snapshot never shows a
/// request half sealed.
#[test]
fn m2_writer_races_close() {
    const NAME: &str = "m2_writer_races_close";
    // (outcome for P, outcome for S, final snapshot, observer's two
    //  snapshots, the writer's snapshot after close)
    let seen = explore(NAME, || {
        let rec = region(1, 1);
        let t = rec.begin().unwrap();
        let (rw, ro) = (rec.clone(), rec.clone());
        let w = spawn(move || {
            let op = emit(&rw, t, 0, 1.0, 7);
            let os = mark(&rw, t, S, 1.5);
            (op, os)
        });
        let observer = spawn(move || (view(&ro.snapshot(t)), view(&ro.snapshot(t))));
        let fin = view(&rec.close(t));
        let (op, os) = w.join().unwrap();
        let (s1, s2) = observer.join().unwrap();
        let after = view(&rec.snapshot(t));
        (op, os, fin, s1, s2, after)
    });
    assert_only(NAME, &seen, |(op, os, fin, s1, s2, after)| {
        let consistent = |o: &Outcome, present: bool| match o {
            Outcome::Recorded => present,
            Outcome::Closed => !present,
            _ => false,
        };
        let observed_ok = |v: &View| match v.state {
            RequestState::Open => v.kept_by(fin),
            RequestState::Gone => v.segs.is_empty(),
            RequestState::Closed | RequestState::Busy | RequestState::Faulted => false,
        };
        fin.state == RequestState::Closed
            && consistent(op, fin.producer(0) == Some((1000, Some(7))))
            && consistent(os, fin.event(0, S) == Some(1500))
            // Nothing else is in the final snapshot.
            && fin.segs.iter().all(|s| s.index == 0 && s.us[2..].iter().all(Option::is_none))
            && observed_ok(s1)
            && observed_ok(s2)
            && (s2.state == RequestState::Gone || s1.kept_by(s2))
            && !(s1.state == RequestState::Gone && s2.state == RequestState::Open)
            // After close the token sees nothing.
            && after.state == RequestState::Gone
            && after.segs.is_empty()
    });
    assert_seen(NAME, &seen, "both writes before the close", |o| {
        (o.0, o.1) == (Outcome::Recorded, Outcome::Recorded)
    });
    assert_seen(NAME, &seen, "both writes refused by the close", |o| {
        (o.0, o.1) == (Outcome::Closed, Outcome::Closed)
    });
    assert_seen(NAME, &seen, "a close between the two writes", |o| {
        (o.0, o.1) == (Outcome::Recorded, Outcome::Closed)
    });
    assert_seen(
        NAME,
        &seen,
        "an observer snapshot with a value, then Gone",
        |o| !o.3.segs.is_empty() && o.4.state == RequestState::Gone,
    );
}

// ---------------------------------------------------------------------------
// Model 3: a stale writer races close and the reuse of its slot.
// ---------------------------------------------------------------------------

/// (stale outcome, the stale side's close, the owner's close of request 1,
///  (same slot, new generation), snapshot of request 2, request 2's own
///  outcome, final snapshot of request 2)
type StaleRun = (Outcome, View, View, (bool, bool), View, Outcome, View);

/// A writer holding the token of request 1 records the producer event
/// (1 ms, chunk 1) and then closes request 1 itself (a second removal path:
/// close is idempotent and every path calls it), while the owner closes
/// request 1, begins request 2 in the same (only) slot, snapshots it and
/// records request 2's own producer event (5 ms, chunk 5) into the very cell
/// the stale writer aims at.
fn stale_writer_runs(name: &str) -> HashSet<StaleRun> {
    explore(name, || {
        let rec = region(1, 1);
        let t1 = rec.begin().unwrap();
        let rw = rec.clone();
        let w = spawn(move || {
            let o = emit(&rw, t1, 0, 1.0, 1);
            (o, view(&rw.close(t1)))
        });
        let fin1 = view(&rec.close(t1));
        // The stale side's close may still hold the slot: then the region
        // is full for a moment, and the owner tries again.
        let t2 = loop {
            match rec.begin() {
                Ok(t) => break t,
                Err(Outcome::RegionFull) => thread::yield_now(),
                Err(e) => panic!("begin: {e}"),
            }
        };
        let reuse = (t2.slot() == t1.slot(), t2.generation() != t1.generation());
        let s2 = view(&rec.snapshot(t2));
        let own = emit(&rec, t2, 0, 5.0, 5);
        let (stale, stale_close) = w.join().unwrap();
        let fin2 = view(&rec.close(t2));
        (stale, stale_close, fin1, reuse, s2, own, fin2)
    })
}

/// The stale write is in request 1's final snapshot (returned by whichever
/// close won; the other close is `Gone`) if and only if it was `Recorded`;
/// a refused stale write is told `Closed` or `Reused`, nothing else; it never
/// appears in request 2's snapshots, the stale close never touches request
/// 2, and request 2's own write to the same cell always lands.
///
/// This model found a protocol bug (see `docs/loom.md`, "Protocol
/// findings"): a refused stale writer was sometimes told `StaleSegment` or
/// `Duplicate`. Fixed by the Acquire fence and the epoch check in
/// `refuse_cell`; the model now allows only `Closed` and `Reused`.
#[test]
fn m3_stale_writer_races_close_and_reuse() {
    const NAME: &str = "m3_stale_writer_races_close_and_reuse";
    let seen = stale_writer_runs(NAME);
    let stale_val = (1000, Some(1));
    let own_val = (5000, Some(5));
    let gone = |v: &View| v.state == RequestState::Gone && v.segs.is_empty();
    assert_only(
        NAME,
        &seen,
        |(stale, stale_close, fin1, reuse, s2, own, fin2)| {
            // Exactly one close of request 1 returns its final snapshot.
            let fin1 = match (stale_close.state, fin1.state) {
                (RequestState::Closed, _) if gone(fin1) => stale_close,
                (_, RequestState::Closed) if gone(stale_close) => fin1,
                _ => return false,
            };
            let in_fin1 = fin1.producer(0) == Some(stale_val);
            let stale_ok = match stale {
                Outcome::Recorded => in_fin1 && fin1.segs.len() == 1,
                Outcome::Closed | Outcome::Reused => fin1.segs.is_empty(),
                _ => false,
            };
            stale_ok
            && *reuse == (true, true)
            // Request 2 is open and never shows the stale write.
            && s2.state == RequestState::Open
            && s2.segs.is_empty()
            && *own == Outcome::Recorded
            && fin2.state == RequestState::Closed
            && fin2.producer(0) == Some(own_val)
            && fin2.segs.len() == 1
            && fin2.segs[0].us[1..].iter().all(Option::is_none)
        },
    );
    assert_seen(
        NAME,
        &seen,
        "the stale write landing before the close",
        |o| o.0 == Outcome::Recorded,
    );
    assert_seen(NAME, &seen, "the stale write refused as closed", |o| {
        o.0 == Outcome::Closed
    });
    assert_seen(NAME, &seen, "the stale write refused as reused", |o| {
        o.0 == Outcome::Reused
    });
    assert_seen(NAME, &seen, "the stale side's close winning", |o| {
        o.1.state == RequestState::Closed
    });
    assert_seen(NAME, &seen, "the stale side's close after the reuse", |o| {
        o.1.state == RequestState::Gone && o.0 == Outcome::Reused
    });
}

// ---------------------------------------------------------------------------
// Model 8: a reclaim races a live owner's close.
// ---------------------------------------------------------------------------

/// A reclaimer that (wrongly or rightly) judges the owner dead races the
/// owner, which records the producer event and closes. It judges lock
/// holders alive, as `reclaim_dead_owners` does for any live pid: a holder
/// is known by pid only, and both parties here share one, so a reclaimer
/// told that a live holder is dead would take over a running close (an
/// earlier draft of this model did exactly that, and lost the write). Exactly one of them
/// ends the request: either close returns the final snapshot (with the
/// write exactly when it was `Recorded`) and the reclaim frees nothing, or
/// the reclaim frees the slot and close finds it gone. The region counts the
/// request once, as closed or as reclaimed, and the slot is free afterwards.
#[test]
fn m8_reclaim_races_a_live_owners_close() {
    const NAME: &str = "m8_reclaim_races_a_live_owners_close";
    // (write outcome, close's view, slots reclaimed, closed + reclaimed
    //  counts, a begin afterwards succeeded)
    let seen = explore(NAME, || {
        let rec = region(1, 1);
        let t = rec.begin().unwrap();
        let rr = rec.clone();
        let reclaimer = spawn(move || {
            rr.reclaim_where(|_| true, |_| false)
                .expect("an in-memory region cannot shrink")
                .freed()
        });
        let o = emit(&rec, t, 0, 1.0, 1);
        let last = view(&rec.close(t));
        let freed = reclaimer.join().unwrap();
        let c = rec.counters();
        let again = rec.begin().is_ok();
        (
            o,
            last,
            freed,
            (c.closed_requests, c.reclaimed_requests),
            again,
        )
    });
    assert_only(NAME, &seen, |(o, last, freed, counts, again)| {
        let by_close = *freed == 0
            && last.state == RequestState::Closed
            && *counts == (1, 0)
            && match o {
                Outcome::Recorded => last.producer(0) == Some((1000, Some(1))),
                _ => false,
            };
        let by_reclaim = *freed == 1
            && last.state == RequestState::Gone
            && last.segs.is_empty()
            && *counts == (0, 1)
            && matches!(o, Outcome::Recorded | Outcome::Closed);
        (by_close || by_reclaim) && *again
    });
    assert_seen(NAME, &seen, "the owner's close winning", |o| o.2 == 0);
    assert_seen(NAME, &seen, "the reclaim winning before the write", |o| {
        o.2 == 1 && o.0 == Outcome::Closed
    });
    assert_seen(NAME, &seen, "the reclaim winning after the write", |o| {
        o.2 == 1 && o.0 == Outcome::Recorded
    });
}
