//! Models of the ring's acknowledgment (`src/protocol/ring_ack.rs`):
//! readers registered in the reader table take entries in their name and
//! settle them later; a reader that dies between its take and its
//! acknowledgment leaves its entries to the next. In every model each
//! closed request ends delivered (acknowledged by a live reader) exactly
//! once, or counted: lost unread, or overwritten while a reader that then
//! died held it.

use std::collections::HashSet;

use edgemark::{ClosedReader, Recorder, RequestState};

use super::ring::{Took, ring_region};
use super::{assert_only, assert_seen, emit, explore, spawn, view};

/// What a reader took: `(slot, producer µs)` per request.
fn took(reader: &ClosedReader, max: usize) -> Vec<(u64, Took)> {
    let mut out = Vec::new();
    reader.take(max, &mut out).expect("a writable region");
    out.iter().map(request).collect()
}

fn request(c: &edgemark::trace::ClosedRequest) -> (u64, Took) {
    let v = view(c.snapshot());
    (c.claim(), (c.token().slot(), v.producer(0).map(|p| p.0)))
}

/// Acknowledges each of `got`; what it delivered.
fn deliver(reader: &ClosedReader, got: &[(u64, Took)]) -> Vec<Took> {
    got.iter()
        .map(|&(claim, t)| {
            reader.acknowledge(claim);
            t
        })
        .collect()
}

/// Whether each value is its slot's own (slot 0: 1 ms, slot 1: 2 ms).
fn whole(all: &[Took]) -> bool {
    all.iter()
        .all(|&(slot, v)| v == Some(if slot == 0 { 1000 } else { 2000 }))
}

/// The region's account of its closed requests: `(acknowledged, lost
/// unread, taken away by dead readers)`.
fn account(rec: &Recorder) -> (u64, u64, u64) {
    let c = rec.counters();
    (
        c.closed_acknowledged,
        c.closed_lost,
        c.closed_overwritten_taken
            .wrapping_sub(c.closed_settled_overwritten),
    )
}

/// One closed request; two registered readers take and acknowledge at
/// once. Exactly one of them takes it (the state's compare-and-swap), it
/// is acknowledged once, and nothing is lost.
#[test]
fn m11a_two_acknowledging_readers_share_one_request() {
    const NAME: &str = "m11a_two_acknowledging_readers_share_one_request";
    let seen = explore(NAME, || {
        let rec = ring_region(1, 2);
        let t = rec.begin().unwrap();
        emit(&rec, t, 0, 1.0, 0);
        rec.close(t);
        let a = rec.closed_reader().unwrap();
        let b = rec.closed_reader().unwrap();
        let other = spawn(move || {
            let got = took(&b, 4);
            deliver(&b, &got)
        });
        let got = took(&a, 4);
        let mine = deliver(&a, &got);
        let theirs = other.join().unwrap();
        (mine, theirs, account(&rec))
    });
    assert_only(NAME, &seen, |(a, b, account)| {
        let all: Vec<Took> = a.iter().chain(b).copied().collect();
        all.len() == 1 && whole(&all) && *account == (1, 0, 0)
    });
    assert_seen(NAME, &seen, "reader a taking it", |o| o.0.len() == 1);
    assert_seen(NAME, &seen, "reader b taking it", |o| o.1.len() == 1);
}

/// Request 0 is closed into a ring of one entry; reader A takes it and
/// dies before acknowledging it. Then, while request 1 closes into the same
/// entry, reader B registers (judging A's slot dead), adopts what A left,
/// takes and acknowledges, and takes again after the closer is done. Each
/// request ends acknowledged by B once, or counted: request 0 overwritten
/// while the dead A held it (request 1 is always delivered: B takes it
/// after the closer).
///
/// A's take is not raced here (m10a and m10b race readers with closers and
/// readers): racing it too made loom hold gigabytes for this model. The
/// race this model adds is the adoption's copy and swap against a closer
/// overwriting the entry.
#[test]
fn m11b_a_reader_that_dies_between_take_and_acknowledgment() {
    const NAME: &str = "m11b_a_reader_that_dies_between_take_and_acknowledgment";
    let seen = explore(NAME, || {
        let rec = ring_region(2, 1);
        let (t0, t1) = (rec.begin().unwrap(), rec.begin().unwrap());
        emit(&rec, t0, 0, 1.0, 0);
        emit(&rec, t1, 0, 2.0, 0);
        rec.close(t0);
        let dying = rec.closed_reader().unwrap();
        let a_took = took(&dying, 4).len();
        // Dies: no acknowledgment, and its slot stays held.
        std::mem::forget(dying);
        let r1 = rec.clone();
        let closer = spawn(move || r1.close(t1).state());
        let b = rec
            .closed_reader_where(|h| h.slot == 0)
            .expect("a free slot");
        let mut adopted = Vec::new();
        b.adopt(&mut adopted);
        let mut got: Vec<(u64, Took)> = adopted.iter().map(request).collect();
        got.extend(took(&b, 4));
        let mut delivered = deliver(&b, &got);
        assert_eq!(closer.join().unwrap(), RequestState::Closed);
        let after = took(&b, 4);
        delivered.extend(deliver(&b, &after));
        delivered.sort_unstable();
        (a_took, delivered, account(&rec))
    });
    assert_only(NAME, &seen, |(_, delivered, (acked, lost, dead))| {
        let slots: HashSet<u32> = delivered.iter().map(|t| t.0).collect();
        slots.len() == delivered.len()
            && whole(delivered)
            && *acked == delivered.len() as u64
            && acked + lost + dead == 2
            && delivered.iter().any(|t| t.0 == 1)
    });
    assert_seen(NAME, &seen, "A's request adopted and delivered by B", |o| {
        o.0 == 1 && o.1.len() == 2
    });
    assert_seen(
        NAME,
        &seen,
        "A's request overwritten while A, dead, held it: counted",
        |o| o.0 == 1 && o.2.2 == 1,
    );
}

/// Reader A takes a request and dies; readers B and C both adopt what dead
/// readers left, at once. Exactly one of them gets it, and it is
/// acknowledged once.
#[test]
fn m11c_two_readers_adopt_a_dead_readers_request() {
    const NAME: &str = "m11c_two_readers_adopt_a_dead_readers_request";
    let seen = explore(NAME, || {
        let rec = ring_region(1, 2);
        let t = rec.begin().unwrap();
        emit(&rec, t, 0, 1.0, 0);
        rec.close(t);
        let dying = rec.closed_reader().unwrap();
        assert_eq!(took(&dying, 4).len(), 1);
        std::mem::forget(dying);
        let b = rec.closed_reader().unwrap();
        let c = rec.closed_reader().unwrap();
        let other = spawn(move || {
            let mut out = Vec::new();
            c.adopt_where(|h| h.slot == 0, &mut out);
            let got: Vec<(u64, Took)> = out.iter().map(request).collect();
            deliver(&c, &got)
        });
        let mut out = Vec::new();
        b.adopt_where(|h| h.slot == 0, &mut out);
        let got: Vec<(u64, Took)> = out.iter().map(request).collect();
        let mine = deliver(&b, &got);
        (mine, other.join().unwrap(), account(&rec))
    });
    assert_only(NAME, &seen, |(b, c, account)| {
        let all: Vec<Took> = b.iter().chain(c).copied().collect();
        all.len() == 1 && whole(&all) && *account == (1, 0, 0)
    });
    assert_seen(NAME, &seen, "B adopting it", |o| o.0.len() == 1);
    assert_seen(NAME, &seen, "C adopting it", |o| o.1.len() == 1);
}
