//! Models of the ring of closed requests: closers and readers.

use super::*;

// ---------------------------------------------------------------------------
// Model 10: the ring of closed requests.
// ---------------------------------------------------------------------------

/// A closed request as a reader took it: its slot and its producer value.
pub(super) type Took = (u32, Option<u64>);

/// A region of one edge, one kept segment and a schema of the producer
/// event alone (the ring's models are about entries, not events: fewer
/// words keep loom's exploration short), with `slots` slots and a ring of
/// `entries`.
pub(super) fn ring_region(slots: u32, entries: u32) -> Recorder {
    let schema = edgemark::schema::Schema::empty()
        .with_event(P.name(), DOMAIN, true)
        .expect("a valid schema");
    Recorder::builder()
        .edge(0, 1)
        .slots(slots)
        .segments(1)
        .schema(schema)
        .closed_entries(entries)
        .create_in_memory()
        .expect("a valid geometry")
}

fn took(rec: &Recorder, max: usize) -> (Vec<Took>, u64) {
    let mut out = Vec::new();
    let d = rec.drain_closed(max, &mut out).expect("a writable region");
    let took = out
        .iter()
        .map(|c| {
            let v = view(c.snapshot());
            (c.token().slot(), v.producer(0).map(|p| p.0))
        })
        .collect();
    // Every loss, counted where it happens (by a closer that overwrote an
    // entry, or by the reader that found one torn).
    let _ = d;
    (took, rec.counters().closed_lost)
}

/// Two closers close one request each (slot 0 with a 1 ms producer value,
/// slot 1 with 2 ms) into a ring of two entries while a reader drains; the
/// model's main thread drains again once they are done. No request is
/// taken twice, each one taken carries its own value, and nothing is lost:
/// a reader that meets an entry still being written waits for it
/// (pending) rather than taking a part of it, and an entry it takes is
/// whole. (A reader racing two closers on one entry makes every one of the
/// entry's words readable from either closer, which loom cannot explore in
/// hours; the overwrite is modelled in m10c, the readers' race in m10b.)
#[test]
fn m10a_two_closers_and_a_reader() {
    const NAME: &str = "m10a_two_closers_and_a_reader";
    let seen = explore(NAME, || {
        let rec = ring_region(2, 2);
        let (t0, t1) = (rec.begin().unwrap(), rec.begin().unwrap());
        emit(&rec, t0, 0, 1.0, 0);
        emit(&rec, t1, 0, 2.0, 0);
        let (r1, r2) = (rec.clone(), rec.clone());
        let closer = spawn(move || r1.close(t1).state());
        let reader = spawn(move || took(&r2, 2));
        let closed = rec.close(t0).state();
        let (during, lost_during) = reader.join().unwrap();
        assert_eq!(closer.join().unwrap(), RequestState::Closed);
        assert_eq!(closed, RequestState::Closed);
        let (after, lost) = took(&rec, 2);
        let _ = lost_during;
        (during, after, lost)
    });
    assert_only(NAME, &seen, |(during, after, lost)| {
        let all: Vec<&Took> = during.iter().chain(after).collect();
        let slots: HashSet<u32> = all.iter().map(|t| t.0).collect();
        slots.len() == 2
            && all.len() == 2
            && *lost == 0
            && all
                .iter()
                .all(|&&(slot, v)| v == Some(if slot == 0 { 1000 } else { 2000 }))
    });
    assert_seen(
        NAME,
        &seen,
        "the reader taking one during the closes",
        |o| o.0.len() == 1,
    );
    assert_seen(NAME, &seen, "the reader taking both", |o| o.0.len() == 2);
    assert_seen(NAME, &seen, "the reader taking none", |o| o.0.is_empty());
}

/// Two closers close one request each into a ring of ONE entry, so the
/// later claim takes the entry over (or, lapped, writes nothing); a reader
/// drains after both. It takes at most one request, whole (its own value,
/// never a mixture of the two closes), and what it does not take is
/// counted lost: taken + lost = 2. When the earlier closer was taken over
/// mid-write, its late stores tear the later one's entry: the checksum
/// catches it and both are lost, counted.
///
/// Capped at one preemption: two closers writing the same entry's words
/// make loom's exploration grow past an hour at two; one preemption is
/// enough for the takeover (the earlier closer stopped anywhere in its
/// writing while the later one runs) and for the torn entry.
#[test]
fn m10c_two_closers_share_one_ring_entry() {
    const NAME: &str = "m10c_two_closers_share_one_ring_entry";
    let seen = explore_capped(NAME, 1, || {
        let rec = ring_region(2, 1);
        let (t0, t1) = (rec.begin().unwrap(), rec.begin().unwrap());
        emit(&rec, t0, 0, 1.0, 0);
        emit(&rec, t1, 0, 2.0, 0);
        let r1 = rec.clone();
        let closer = spawn(move || r1.close(t1).state());
        let closed = rec.close(t0).state();
        assert_eq!(closer.join().unwrap(), RequestState::Closed);
        assert_eq!(closed, RequestState::Closed);
        took(&rec, 2)
    });
    assert_only(NAME, &seen, |(took, lost)| {
        took.len() as u64 + lost == 2
            && took.len() <= 1
            && took
                .iter()
                .all(|&(slot, v)| v == Some(if slot == 0 { 1000 } else { 2000 }))
    });
    assert_seen(NAME, &seen, "slot 0's close kept", |o| {
        o.0.first().is_some_and(|t| t.0 == 0)
    });
    assert_seen(NAME, &seen, "slot 1's close kept", |o| {
        o.0.first().is_some_and(|t| t.0 == 1)
    });
    assert_seen(NAME, &seen, "a torn entry lost with the other", |o| {
        o.0.is_empty()
    });
}

/// One closed request waits in the ring; two readers drain at once. Exactly
/// one of them takes it (the entry state's compare-and-swap decides), and
/// nothing is lost.
#[test]
fn m10b_two_readers_never_take_one_entry_twice() {
    const NAME: &str = "m10b_two_readers_never_take_one_entry_twice";
    let seen = explore(NAME, || {
        let rec = ring_region(1, 2);
        let t = rec.begin().unwrap();
        emit(&rec, t, 0, 1.0, 0);
        rec.close(t);
        let r1 = rec.clone();
        let other = spawn(move || took(&r1, 4));
        let mine = took(&rec, 4);
        (mine, other.join().unwrap())
    });
    assert_only(NAME, &seen, |((a, la), (b, lb))| {
        a.len() + b.len() == 1 && la + lb == 0 && a.iter().chain(b).all(|t| *t == (0, Some(1000)))
    });
    assert_seen(NAME, &seen, "the main reader taking it", |o| {
        o.0.0.len() == 1
    });
    assert_seen(NAME, &seen, "the other reader taking it", |o| {
        o.1.0.len() == 1
    });
}
