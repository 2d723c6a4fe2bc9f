//! Readers that acknowledge what they take (`ClosedReader`): a request
//! stays taken until its reader settles it; what a dropped or dead reader
//! left is adopted by the next one; every request not delivered is
//! counted, by reason.

use edgemark::trace::ClosedRequest;
use edgemark::{ClosedReader, Edge, Event, GiveUp, Mark, ReaderError, Recorder};

const E01: Edge = Edge::new(0, 1);

fn ring(entries: u32) -> Recorder {
    Recorder::builder()
        .edge(0, 1)
        .slots(8)
        .closed_entries(entries)
        .create_in_memory()
        .unwrap()
}

/// Closes `n` requests, each with its index + 1 in milliseconds as its
/// producer value.
fn close_n(rec: &Recorder, n: usize) {
    for i in 0..n {
        let t = rec.begin().unwrap();
        let mark = Mark::new(E01, Event::ProducerFirstNonemptyEmit);
        assert!(
            rec.record_elapsed(t, mark, (i + 1) as f64, "host_monotonic")
                .is_success()
        );
        rec.close(t);
    }
}

fn take_all(reader: &ClosedReader) -> Vec<ClosedRequest> {
    let mut out = Vec::new();
    loop {
        let d = reader.take(3, &mut out).unwrap();
        if d.caught_up || d.pending.is_some() {
            return out;
        }
    }
}

/// What the region's report says its ring holds now: `(unread,
/// unacknowledged, readers)`.
fn ring_now(rec: &Recorder) -> (u64, u64, u64) {
    let o = rec.report().unwrap().unwrap().occupancy;
    (o.closed_unread, o.closed_unacknowledged, o.closed_readers)
}

fn claims(reqs: &[ClosedRequest]) -> Vec<u64> {
    reqs.iter().map(ClosedRequest::claim).collect()
}

#[test]
fn an_acknowledged_request_is_done_and_counted() {
    let rec = ring(8);
    close_n(&rec, 3);
    let reader = rec.closed_reader().unwrap();
    let got = take_all(&reader);
    assert_eq!(claims(&got), [0, 1, 2]);
    assert_eq!(ring_now(&rec), (0, 3, 1));
    assert!(got.iter().all(|c| reader.acknowledge(c.claim())));
    let c = rec.counters();
    assert_eq!(c.closed_acknowledged, 3);
    assert_eq!(c.closed_lost, 0);
    assert_eq!(ring_now(&rec), (0, 0, 1));
    // Nothing is left to adopt, by this reader or a new one.
    assert_eq!(reader.adopt(&mut Vec::new()), 0);
    drop(reader);
    let next = rec.closed_reader().unwrap();
    assert_eq!(next.adopt(&mut Vec::new()), 0);
    assert!(take_all(&next).is_empty());
}

#[test]
fn a_dropped_readers_unacknowledged_requests_go_to_the_next_reader() {
    let rec = ring(8);
    close_n(&rec, 4);
    let first = rec.closed_reader().unwrap();
    let got = take_all(&first);
    assert_eq!(got.len(), 4);
    assert!(first.acknowledge(got[1].claim()));
    // Dropped (a shutdown whose deadline passed) with three unsettled.
    drop(first);
    assert_eq!(ring_now(&rec), (0, 3, 0));
    let next = rec.closed_reader().unwrap();
    let mut again = Vec::new();
    assert_eq!(next.adopt(&mut again), 3);
    assert_eq!(claims(&again), [0, 2, 3]);
    // The same request, whole: its span id and values.
    assert_eq!(again[0].span_id(), got[0].span_id());
    assert_eq!(again[2].snapshot(), got[3].snapshot());
    assert!(
        again
            .iter()
            .all(|c| next.give_up(c.claim(), GiveUp::Refused))
    );
    assert_eq!(next.adopt(&mut Vec::new()), 0);
    let c = rec.counters();
    assert_eq!((c.closed_acknowledged, c.closed_given_up.refused), (1, 3));
}

#[test]
fn a_dead_readers_requests_are_adopted_by_a_running_reader() {
    let rec = ring(8);
    close_n(&rec, 2);
    let dying = rec.closed_reader().unwrap();
    assert_eq!(dying.slot(), 0);
    assert_eq!(take_all(&dying).len(), 2);
    // Killed: its slot stays held in its name.
    std::mem::forget(dying);
    let other = rec.closed_reader().unwrap();
    assert_eq!(other.slot(), 1);
    // A live holder's requests are never adopted.
    assert_eq!(other.adopt(&mut Vec::new()), 0);
    let mut got = Vec::new();
    assert_eq!(other.adopt_where(|h| h.slot == 0, &mut got), 2);
    assert_eq!(claims(&got), [0, 1]);
    assert!(got.iter().all(|c| other.acknowledge(c.claim())));
    assert_eq!(rec.counters().closed_acknowledged, 2);
    // The dead slot was given back.
    assert_eq!(ring_now(&rec).2, 1);
}

#[test]
fn a_reader_registering_in_a_dead_readers_slot_takes_what_it_left() {
    let rec = ring(8);
    close_n(&rec, 2);
    let dying = rec.closed_reader().unwrap();
    assert_eq!(take_all(&dying).len(), 2);
    std::mem::forget(dying);
    let next = rec.closed_reader_where(|h| h.slot == 0).unwrap();
    assert_eq!(next.slot(), 0);
    let mut got = Vec::new();
    assert_eq!(next.adopt(&mut got), 2);
    // Once only.
    assert_eq!(next.adopt(&mut Vec::new()), 0);
}

#[test]
fn requests_overwritten_while_taken_are_counted_and_settled_after_all() {
    let rec = ring(2);
    close_n(&rec, 2);
    let reader = rec.closed_reader().unwrap();
    let got = take_all(&reader);
    assert_eq!(got.len(), 2);
    // Two more closes overwrite both taken entries.
    close_n(&rec, 2);
    let c = rec.counters();
    assert_eq!((c.closed_overwritten_taken, c.closed_lost), (2, 0));
    // Delivered anyway: counted as acknowledged, and settled after being
    // overwritten.
    assert!(!reader.acknowledge(got[0].claim()));
    assert!(!reader.give_up(got[1].claim(), GiveUp::QueueFull));
    let c = rec.counters();
    assert_eq!(c.closed_acknowledged, 1);
    assert_eq!(c.closed_given_up.queue_full, 1);
    assert_eq!(c.closed_settled_overwritten, 2);
    assert_eq!(claims(&take_all(&reader)), [2, 3]);
}

#[test]
fn overwrites_are_counted_as_they_happen_without_any_reader() {
    let rec = ring(4);
    close_n(&rec, 10);
    let c = rec.counters();
    assert_eq!(c.closed_lost, 6);
    let r = rec.report().unwrap().unwrap();
    assert_eq!(
        (
            r.info.ring_entries,
            r.counters.closed_requests,
            r.occupancy.closed_unread,
            r.occupancy.closed_unacknowledged
        ),
        (4, 10, 4, 0)
    );
    // A reader then finds the four newest, and counts nothing again.
    let reader = rec.closed_reader().unwrap();
    assert_eq!(claims(&take_all(&reader)), [6, 7, 8, 9]);
    assert_eq!(rec.counters().closed_lost, 6);
}

#[test]
fn every_close_is_delivered_or_counted_when_a_reader_dies_mid_stream() {
    let rec = ring(4);
    let mut delivered = std::collections::HashSet::new();
    close_n(&rec, 3);
    let dying = rec.closed_reader().unwrap();
    let held = take_all(&dying);
    assert!(dying.acknowledge(held[0].claim()));
    delivered.insert(held[0].claim());
    std::mem::forget(dying);
    // Five more: two of the dead reader's entries are overwritten.
    close_n(&rec, 5);
    let next = rec.closed_reader_where(|h| h.slot == 0).unwrap();
    let mut got = Vec::new();
    next.adopt(&mut got);
    got.extend(take_all(&next));
    for c in &got {
        assert!(delivered.insert(c.claim()), "claim {} twice", c.claim());
        next.acknowledge(c.claim());
    }
    let c = rec.counters();
    let dead = c.closed_overwritten_taken - c.closed_settled_overwritten;
    assert_eq!(
        c.closed_acknowledged + c.closed_lost + dead,
        c.closed_requests,
        "{c:?}"
    );
    assert_eq!(c.closed_requests, 8);
}

#[test]
fn drain_closed_and_registered_readers_share_the_cursor() {
    let rec = ring(8);
    close_n(&rec, 4);
    let reader = rec.closed_reader().unwrap();
    let mut a = Vec::new();
    reader.take(2, &mut a).unwrap();
    let mut b = Vec::new();
    rec.drain_closed(8, &mut b).unwrap();
    assert_eq!((claims(&a), claims(&b)), (vec![0, 1], vec![2, 3]));
    // drain_closed acknowledges nothing: its requests are done with.
    assert_eq!(ring_now(&rec), (0, 2, 1));
}

#[test]
fn a_region_without_a_ring_has_no_reader() {
    let rec = ring(0);
    assert!(matches!(rec.closed_reader(), Err(ReaderError::NoRing)));
    assert_eq!(ring_now(&rec), (0, 0, 0));
    let full = ring(4);
    let held: Vec<ClosedReader> = (0..8).map(|_| full.closed_reader().unwrap()).collect();
    assert!(matches!(full.closed_reader(), Err(ReaderError::TableFull)));
    drop(held);
    assert!(full.closed_reader().is_ok());
}
