//! The fenced read of one event (`Viewer::recorded`): what it says of each
//! state of a request, and the close decision it is for, made by two
//! threads that each record their event and then look for the other's.

use std::sync::Barrier;

use edgemark::schema::EventId;
use edgemark::{Edge, Event::*, Mark, Outcome, Recorder, Viewer};

const E01: Edge = Edge::new(0, 1);

#[test]
fn recorded_says_whether_the_event_of_the_segment_is_in_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.region");
    let rec = Recorder::builder()
        .edge(0, 1)
        .edge(1, 2)
        .slots(1)
        .create(&path)
        .unwrap();
    let t = rec.begin().unwrap();
    assert!(!rec.recorded(t, E01, EdgeFirstSendComplete, 0));
    assert_eq!(
        rec.record(t, Mark::new(E01, EdgeFirstSendComplete)),
        Outcome::Recorded
    );
    assert!(rec.recorded(t, E01, EdgeFirstSendComplete, 0));
    // Another event, another edge, a segment not started: not in.
    assert!(!rec.recorded(t, E01, ConsumerFirstAccept, 0));
    assert!(!rec.recorded(t, (1, 2), EdgeFirstSendComplete, 0));
    assert!(!rec.recorded(t, E01, EdgeFirstSendComplete, 1));
    // An undeclared edge and an event beyond the schema are not in either.
    assert!(!rec.recorded(t, (2, 0), EdgeFirstSendComplete, 0));
    assert!(!rec.recorded(t, E01, EventId(9), 0));
    // A value measured elsewhere counts as any value.
    let accept = Mark::new(E01, ConsumerFirstAccept);
    assert!(rec.record_elapsed(t, accept, 3.0, "receiver").is_success());
    assert!(rec.recorded(t, E01, ConsumerFirstAccept, 0));

    // A new segment: the old one is still kept and still answers.
    assert_eq!(rec.start_segment(t, E01, 1), Outcome::Started);
    assert!(!rec.recorded(t, E01, EdgeFirstSendComplete, 1));
    assert!(rec.recorded(t, E01, EdgeFirstSendComplete, 0));
    rec.record(t, Mark::new(E01, EdgeFirstSendComplete).segment(1));
    assert!(rec.recorded(t, E01, EdgeFirstSendComplete, 1));

    // A read-only viewer reads the same.
    let viewer = Viewer::attach(&path).unwrap();
    assert!(viewer.recorded(t, E01, EdgeFirstSendComplete, 1));

    // Closed, reused, foreign, disabled: nothing is recorded.
    rec.close(t);
    assert!(!rec.recorded(t, E01, EdgeFirstSendComplete, 0));
    assert!(!viewer.recorded(t, E01, EdgeFirstSendComplete, 0));
    let next = rec.begin().unwrap();
    assert_eq!(next.slot(), t.slot(), "one slot, reused");
    rec.record(next, Mark::new(E01, EdgeFirstSendComplete));
    assert!(rec.recorded(next, E01, EdgeFirstSendComplete, 0));
    assert!(!rec.recorded(t, E01, EdgeFirstSendComplete, 0));
    let other = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    assert!(!other.recorded(next, E01, EdgeFirstSendComplete, 0));
    assert!(!Recorder::disabled().recorded(next, E01, EdgeFirstSendComplete, 0));
}

#[test]
fn a_segment_that_left_the_window_is_not_recorded() {
    let rec = Recorder::builder()
        .edge(0, 1)
        .segments(1)
        .create_in_memory()
        .unwrap();
    let t = rec.begin().unwrap();
    rec.record(t, Mark::new(E01, EdgeFirstSendComplete));
    assert!(rec.recorded(t, E01, EdgeFirstSendComplete, 0));
    // One segment kept: segment 1 takes segment 0's cells.
    assert_eq!(rec.start_segment(t, E01, 1), Outcome::Started);
    assert!(!rec.recorded(t, E01, EdgeFirstSendComplete, 0));
    assert!(!rec.recorded(t, E01, EdgeFirstSendComplete, 1));
}

/// The close decision of two parties: each records its own event and then
/// looks for the other's; whoever sees both closes. At least one of them
/// must see both, in every round (the fence makes it so on any CPU; this
/// runs on whatever CPU the tests run on, and checks the answers, not how
/// they were reached).
#[test]
fn two_parties_that_record_then_look_never_both_miss() {
    const ROUNDS: usize = 2000;
    let rec = Recorder::builder()
        .edge(0, 1)
        .slots(4)
        .create_in_memory()
        .unwrap();
    let start = Barrier::new(2);
    let handoff = Barrier::new(2);
    let token = std::sync::Mutex::new(None);
    let party = |mine, theirs, begins: bool| {
        let mut closes = 0usize;
        for _ in 0..ROUNDS {
            if begins {
                *token.lock().unwrap() = Some(rec.begin().unwrap());
            }
            start.wait();
            let t = token.lock().unwrap().unwrap();
            assert!(rec.record(t, Mark::new(E01, mine)).is_success());
            let saw = rec.recorded(t, E01, theirs, 0);
            if saw {
                rec.close(t);
                closes += 1;
            }
            handoff.wait();
            // Both have looked: someone closed it.
            assert!(!rec.recorded(t, E01, mine, 0), "nobody closed {t}");
        }
        closes
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| party(EdgeFirstSendComplete, ConsumerFirstNonemptyOutput, true));
        let b = s.spawn(|| party(ConsumerFirstNonemptyOutput, EdgeFirstSendComplete, false));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert!(a + b >= ROUNDS, "{a} + {b} closes in {ROUNDS} rounds");
    assert_eq!(rec.counters().closed_requests, ROUNDS as u64);
}
