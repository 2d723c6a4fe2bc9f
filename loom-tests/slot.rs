//! Models of one slot: two writers race one cell, a snapshot races writers,
//! begins race for slots, a sweeper snapshots a slot while it is reused.

use super::*;

// ---------------------------------------------------------------------------
// Model 1: two writers race one event.
// ---------------------------------------------------------------------------

/// Two writers race the producer event of one request with different values
/// and chunk sequences while an observer snapshots. Exactly one is
/// `Recorded`, the other `Duplicate`; every snapshot (the observer's
/// concurrent one, each writer's after its own call, the final one) shows
/// the winner's value with the winner's chunk sequence, or nothing yet.
///
/// Writer A runs on the model's main thread so that loom's first schedule
/// runs a writer before the observer (see "Thread placement" in
/// `docs/loom.md`).
#[test]
fn m1_two_writers_race_one_event() {
    const NAME: &str = "m1_two_writers_race_one_event";
    // (A's outcome, A's snapshot, B's outcome, B's snapshot,
    //  observer's snapshot, final snapshot)
    let seen = explore(NAME, || {
        let rec = region(1, 1);
        let t = rec.begin().unwrap();
        let (rb, ro) = (rec.clone(), rec.clone());
        let b = spawn(move || {
            let o = emit(&rb, t, 0, 2.0, 20);
            (o, view(&rb.snapshot(t)))
        });
        let observer = spawn(move || view(&ro.snapshot(t)));
        let oa = emit(&rec, t, 0, 1.0, 10);
        let sa = view(&rec.snapshot(t));
        let (ob, sb) = b.join().unwrap();
        let mid = observer.join().unwrap();
        let fin = view(&rec.close(t));
        (oa, sa, ob, sb, mid, fin)
    });
    let a_val = (1000, Some(10));
    let b_val = (2000, Some(20));
    assert_only(NAME, &seen, |(oa, sa, ob, sb, mid, fin)| {
        let winner = match (oa, ob) {
            (Outcome::Recorded, Outcome::Duplicate) => a_val,
            (Outcome::Duplicate, Outcome::Recorded) => b_val,
            _ => return false,
        };
        let only_winner = |v: &View| {
            v.segs.len() == 1
                && v.producer(0) == Some(winner)
                && v.segs[0].us[1..].iter().all(Option::is_none)
        };
        // Each writer's own snapshot comes after a value exists.
        only_winner(sa)
            && only_winner(sb)
            && (mid.segs.is_empty() || only_winner(mid))
            && only_winner(fin)
            && fin.state == RequestState::Closed
    });
    assert_seen(NAME, &seen, "writer A winning", |o| {
        o.0 == Outcome::Recorded
    });
    assert_seen(NAME, &seen, "writer B winning", |o| {
        o.2 == Outcome::Recorded
    });
    assert_seen(NAME, &seen, "an observer snapshot before any write", |o| {
        o.4.segs.is_empty()
    });
    assert_seen(NAME, &seen, "an observer snapshot of A's win", |o| {
        o.4.producer(0) == Some(a_val)
    });
    assert_seen(NAME, &seen, "an observer snapshot of B's win", |o| {
        o.4.producer(0) == Some(b_val)
    });
}

// ---------------------------------------------------------------------------
// Model 5: a snapshot races writers.
// ---------------------------------------------------------------------------

/// Writer A records the producer event (1 ms, chunk 1) then the send event
/// (1.5 ms); writer B races A on the producer event (2 ms, chunk 2); an
/// observer takes two snapshots meanwhile. Every snapshot shows only exact
/// values some writer wrote, each producer value with its own chunk
/// sequence; a value once seen is in every later snapshot of that thread,
/// and in the final one, unchanged.
///
/// Writer A runs on the main thread so that loom's first schedule runs a
/// writer before the observer (see "Thread placement" in `docs/loom.md`).
#[test]
fn m5_snapshot_races_writers() {
    const NAME: &str = "m5_snapshot_races_writers";
    // (first snapshot, second snapshot, final snapshot)
    let seen = explore(NAME, || {
        let rec = region(1, 1);
        let t = rec.begin().unwrap();
        let (rb, ro) = (rec.clone(), rec.clone());
        let b = spawn(move || {
            emit(&rb, t, 0, 2.0, 2);
        });
        let observer = spawn(move || (view(&ro.snapshot(t)), view(&ro.snapshot(t))));
        emit(&rec, t, 0, 1.0, 1);
        mark(&rec, t, S, 1.5);
        b.join().unwrap();
        let (s1, s2) = observer.join().unwrap();
        let fin = view(&rec.close(t));
        (s1, s2, fin)
    });
    let exact = |v: &View| {
        v.segs.iter().all(|s| {
            s.index == 0
                && matches!(
                    (s.us[P as usize], s.chunk),
                    (None, None) | (Some(1000), Some(1)) | (Some(2000), Some(2))
                )
                && matches!(s.us[S as usize], None | Some(1500))
                && s.us[2..].iter().all(Option::is_none)
        })
    };
    assert_only(NAME, &seen, |(s1, s2, fin)| {
        exact(s1)
            && exact(s2)
            && exact(fin)
            && s1.kept_by(s2)
            && s2.kept_by(fin)
            && fin.producer(0).is_some()
            && fin.event(0, S) == Some(1500)
    });
    assert_seen(NAME, &seen, "an empty first snapshot", |o| {
        o.0.segs.is_empty()
    });
    assert_seen(NAME, &seen, "a first snapshot with a value", |o| {
        !o.0.segs.is_empty()
    });
    assert_seen(
        NAME,
        &seen,
        "the second snapshot seeing more than the first",
        |o| o.0 != o.1,
    );
    assert_seen(NAME, &seen, "writer A winning", |o| {
        o.2.producer(0) == Some((1000, Some(1)))
    });
    assert_seen(NAME, &seen, "writer B winning", |o| {
        o.2.producer(0) == Some((2000, Some(2)))
    });
}

// ---------------------------------------------------------------------------
// Model 6: begins race.
// ---------------------------------------------------------------------------

fn token_id(r: Result<Token, Outcome>) -> Result<(u32, u32), Outcome> {
    r.map(|t| (t.slot(), t.generation()))
}

/// One slot, two begins: exactly one gets the slot (generation 1), the other
/// `RegionFull`.
#[test]
fn m6a_two_begins_race_one_slot() {
    const NAME: &str = "m6a_two_begins_race_one_slot";
    let seen = explore(NAME, || {
        let rec = region(1, 1);
        let (r1, r2) = (rec.clone(), rec.clone());
        let a = spawn(move || token_id(r1.begin()));
        let b = spawn(move || token_id(r2.begin()));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_only(NAME, &seen, |o| {
        matches!(
            o,
            (Ok((0, 1)), Err(Outcome::RegionFull)) | (Err(Outcome::RegionFull), Ok((0, 1)))
        )
    });
    assert_seen(NAME, &seen, "the first begin winning", |o| o.0.is_ok());
    assert_seen(NAME, &seen, "the second begin winning", |o| o.1.is_ok());
}

/// Two slots: request 0 holds slot 0 and is closed while two begins race.
/// The cursor sends the racers to slot 1 and to slot 0, so whichever finds
/// its slot taken falls over to the other's. No two requests ever share a
/// slot and generation, request 0's (slot 0, generation 1) is never handed
/// out again, a begin is refused with `RegionFull` only if both slots were
/// taken, and each new request's first record lands (a slot reused right
/// after another thread's close is laid after the close's seals).
#[test]
fn m6b_two_begins_race_a_close_on_two_slots() {
    const NAME: &str = "m6b_two_begins_race_a_close_on_two_slots";
    let seen = explore(NAME, || {
        let rec = region(2, 1);
        let t0 = rec.begin().unwrap();
        assert_eq!((t0.slot(), t0.generation()), (0, 1));
        let racer = |rec: Recorder, ms: f64| {
            move || match rec.begin() {
                Ok(t) => (
                    Ok((t.slot(), t.generation())),
                    Some(emit(&rec, t, 0, ms, 0)),
                ),
                Err(e) => (Err(e), None),
            }
        };
        let a = spawn(racer(rec.clone(), 1.0));
        let b = spawn(racer(rec.clone(), 2.0));
        let closed = rec.close(t0).state();
        (closed, a.join().unwrap(), b.join().unwrap())
    });
    assert_only(NAME, &seen, |(closed, (a, ra), (b, rb))| {
        let ok = |r: &Result<(u32, u32), Outcome>, rec: &Option<Outcome>| match r {
            Ok(id) => (*id == (0, 2) || *id == (1, 1)) && *rec == Some(Outcome::Recorded),
            Err(e) => *e == Outcome::RegionFull && rec.is_none(),
        };
        *closed == RequestState::Closed
            && ok(a, ra)
            && ok(b, rb)
            && !(a.is_ok() && a == b)
            && (a.is_ok() || b.is_ok())
    });
    assert_seen(NAME, &seen, "both begins succeeding", |o| {
        o.1.0.is_ok() && o.2.0.is_ok()
    });
    assert_seen(
        NAME,
        &seen,
        "one begin refused while slot 0 was held",
        |o| o.1.0.is_err() || o.2.0.is_err(),
    );
    assert_seen(NAME, &seen, "slot 0 reused with generation 2", |o| {
        o.1.0 == Ok((0, 2)) || o.2.0 == Ok((0, 2))
    });
}

// ---------------------------------------------------------------------------
// Model 7: a sweeper snapshots a slot while it is reused.
// ---------------------------------------------------------------------------

/// A sweeper (a process that finds requests through the region itself, as
/// `snapshot_open` does, with no message from the owner) lists the open
/// requests and snapshots each, while the owner runs request 1 (producer
/// event, 1 ms, chunk 1), closes it, and begins request 2 in the same slot
/// (send event, 5 ms). Whatever the sweeper finds, a snapshot of request 1
/// shows only request 1's value and a snapshot of request 2 only request
/// 2's: the head word that names the open request publishes its layout, and
/// a snapshot that overlapped a close or a reuse gives nothing.
#[test]
fn m7_sweeper_snapshots_a_reused_slot() {
    const NAME: &str = "m7_sweeper_snapshots_a_reused_slot";
    let seen = explore(NAME, || {
        let rec = region(1, 1);
        let rs = rec.clone();
        let sweeper = spawn(move || {
            rs.open_requests()
                .unwrap()
                .into_iter()
                .map(|t| (t.generation(), view(&rs.snapshot(t))))
                .collect::<Vec<_>>()
        });
        let t1 = rec.begin().unwrap();
        assert_eq!(emit(&rec, t1, 0, 1.0, 1), Outcome::Recorded);
        rec.close(t1);
        let t2 = rec.begin().unwrap();
        assert_eq!(mark(&rec, t2, S, 5.0), Outcome::Recorded);
        let found = sweeper.join().unwrap();
        rec.close(t2);
        found
    });
    let only = |v: &View, seg: SegView| {
        v.state == RequestState::Gone && v.segs.is_empty()
            || v.state == RequestState::Open && (v.segs.is_empty() || v.segs == [seg])
    };
    let req1 = SegView {
        index: 0,
        us: [Some(1000), None, None, None],
        chunk: Some(1),
    };
    let req2 = SegView {
        index: 0,
        us: [None, Some(5000), None, None],
        chunk: None,
    };
    assert_only(NAME, &seen, |found| {
        found.len() <= 1
            && found.iter().all(|(generation, v)| match generation {
                1 => only(v, req1.clone()),
                2 => only(v, req2.clone()),
                _ => false,
            })
    });
    assert_seen(NAME, &seen, "a sweep finding nothing open", |f| {
        f.is_empty()
    });
    assert_seen(NAME, &seen, "a sweep of request 1 with its value", |f| {
        f.iter().any(|(g, v)| *g == 1 && !v.segs.is_empty())
    });
    assert_seen(NAME, &seen, "a sweep of request 2 with its value", |f| {
        f.iter().any(|(g, v)| *g == 2 && !v.segs.is_empty())
    });
    assert_seen(
        NAME,
        &seen,
        "a sweep of request 1 that overlapped its close",
        |f| {
            f.iter()
                .any(|(g, v)| *g == 1 && v.state == RequestState::Gone)
        },
    );
}
