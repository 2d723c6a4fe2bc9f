//! The fenced read of a close decision (`Viewer::recorded`): two parties
//! each record their own event and then look for the other's.

use super::*;

/// The producer's event and the consumer's, as in the case the read is for.
const SEND: Event = Event::EdgeFirstSendComplete;
const OUTPUT: Event = Event::ConsumerFirstNonemptyOutput;

/// Party A (main) records `SEND` and then asks whether `OUTPUT` is in;
/// party B records `OUTPUT` and then asks whether `SEND` is in, each
/// through `look`. The outcome: both records' outcomes and what each saw.
fn two_parties(
    look: fn(&Recorder, Token, Event) -> bool,
) -> impl Fn() -> (Outcome, Outcome, bool, bool) + Sync + Send + 'static {
    move || {
        let rec = region(1, 1);
        let t = rec.begin().unwrap();
        let rb = rec.clone();
        let b = spawn(move || {
            let o = mark(&rb, t, OUTPUT, 2.0);
            (o, look(&rb, t, SEND))
        });
        let oa = mark(&rec, t, SEND, 1.0);
        let a_saw = look(&rec, t, OUTPUT);
        let (ob, b_saw) = b.join().unwrap();
        (oa, ob, a_saw, b_saw)
    }
}

/// With `recorded`, whose SeqCst fence sits between each party's record and
/// its load: at least one party sees the other's event, so someone closes.
/// Each of the three allowed answers is observed (either party alone, and
/// both).
///
/// loom 0.7.3 models `fence(SeqCst)` by joining the fencing thread's view
/// with one global view (`seq_cst_fence` in its `rt/thread.rs`): the later
/// fence then sees everything before the earlier one, at least what the
/// language's rule gives (`Proto::recorded` states it; loom treats SeqCst
/// loads and stores as AcqRel, but this model has none). The model is
/// therefore no stronger than loom's fence: it shows the protocol correct
/// under that model, and m12b shows the outcome it forbids is reachable
/// without the fence.
#[test]
fn m12a_two_parties_record_then_look_and_never_both_miss() {
    const NAME: &str = "m12a_two_parties_record_then_look_and_never_both_miss";
    let seen = explore(NAME, two_parties(|rec, t, e| rec.recorded(t, EDGE, e, 0)));
    assert_only(NAME, &seen, |(oa, ob, a_saw, b_saw)| {
        *oa == Outcome::Recorded && *ob == Outcome::Recorded && (*a_saw || *b_saw)
    });
    assert_seen(NAME, &seen, "A alone seeing both", |o| o.2 && !o.3);
    assert_seen(NAME, &seen, "B alone seeing both", |o| !o.2 && o.3);
    assert_seen(NAME, &seen, "both seeing both", |o| o.2 && o.3);
}

/// The same parties reading without the fence (as a snapshot reads: Acquire
/// loads after the Release compare-and-swap of the record): loom finds the
/// execution in which both miss the other's event (store buffering), the
/// outcome m12a forbids. This is what the fence is for; were it removed
/// from `recorded`, m12a would fail with this outcome.
#[test]
fn m12b_without_the_fence_both_parties_can_miss() {
    const NAME: &str = "m12b_without_the_fence_both_parties_can_miss";
    let seen = explore(
        NAME,
        two_parties(|rec, t, e| rec.recorded_unfenced(t, EDGE, e, 0)),
    );
    assert_only(NAME, &seen, |(oa, ob, _, _)| {
        *oa == Outcome::Recorded && *ob == Outcome::Recorded
    });
    assert_seen(NAME, &seen, "both parties missing each other", |o| {
        !o.2 && !o.3
    });
}
