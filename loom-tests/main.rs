//! loom models of the recording protocol (see `docs/loom.md`).
//!
//! Each model is a litmus test in the manner of loom's own: every execution
//! returns its outcome (what each party was told and what each snapshot
//! showed), the set of outcomes is collected outside `loom::model`, and only
//! after loom has finished does the model assert which outcomes are allowed,
//! that no forbidden one occurred, and that the interesting allowed ones
//! were actually observed, so that no model passes vacuously (loom 0.7.3 can
//! silently skip interleavings; `docs/loom.md` says how the models are laid
//! out around that). Each model prints how many executions loom explored.
//!
//! Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg edgemark_loom" LOOM_MAX_PREEMPTIONS=2 \
//!     cargo test --release --test loom
//! ```
//!
#![cfg(edgemark_loom)]
// The execution counter and the outcome set live outside the model, so they
// are std types on purpose: loom's types exist only inside an execution.
#![allow(clippy::disallowed_types)]

use std::collections::HashSet;
use std::fmt::Debug;
use std::hash::Hash;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering as StdOrdering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use edgemark::{Edge, Event, Mark, Outcome, Recorder, RequestState, Snapshot, Token};
use loom::thread;

mod ring_ack;

const EDGE: Edge = Edge::new(0, 1);
const P: Event = Event::ProducerFirstNonemptyEmit;
const S: Event = Event::EdgeFirstSendComplete;
const DOMAIN: &str = "host_monotonic";

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

/// Explores every interleaving of `body` (up to the preemption bound) and
/// returns the set of outcomes the executions produced.
///
/// `LOOM_MAX_PREEMPTIONS` sets the bound; without it the bound is 2, so that
/// a bare `cargo test` cannot run unbounded.
fn explore<O, F>(name: &str, body: F) -> HashSet<O>
where
    O: Hash + Eq + Debug + Send + 'static,
    F: Fn() -> O + Sync + Send + 'static,
{
    explore_capped(name, usize::MAX, body)
}

/// [`explore`] with the preemption bound capped at `cap`, for a model whose
/// threads make so many atomic accesses that the common bound would run
/// for hours (the model's comment says what the cap still covers).
fn explore_capped<O, F>(name: &str, cap: usize, body: F) -> HashSet<O>
where
    O: Hash + Eq + Debug + Send + 'static,
    F: Fn() -> O + Sync + Send + 'static,
{
    let seen: Arc<Mutex<HashSet<O>>> = Arc::new(Mutex::new(HashSet::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    builder.preemption_bound = builder.preemption_bound.map(|b| b.min(cap));
    let start = Instant::now();
    {
        let seen = Arc::clone(&seen);
        let runs = Arc::clone(&runs);
        builder.check(move || {
            runs.fetch_add(1, StdOrdering::Relaxed);
            let outcome = body();
            seen.lock().unwrap().insert(outcome);
        });
    }
    let seen = Arc::try_unwrap(seen)
        .expect("loom is done with the set")
        .into_inner()
        .unwrap();
    // Written to stderr directly (not through `eprintln!`, which the test
    // harness captures), so that the counts show in a plain `cargo test`.
    let _ = writeln!(
        std::io::stderr(),
        "loom model {name}: {} executions, {} distinct outcomes, {:.1?}",
        runs.load(StdOrdering::Relaxed),
        seen.len(),
        start.elapsed()
    );
    seen
}

/// Fails the model unless every outcome satisfies `allowed`; lists the
/// forbidden ones.
fn assert_only<O: Debug>(name: &str, seen: &HashSet<O>, allowed: impl Fn(&O) -> bool) {
    let bad: Vec<&O> = seen.iter().filter(|o| !allowed(o)).collect();
    assert!(
        bad.is_empty(),
        "model {name}: {} forbidden outcome(s) observed:\n{bad:#?}",
        bad.len()
    );
}

/// Fails the model unless some outcome satisfies `wanted`: the interleaving
/// `what` must have been explored.
fn assert_seen<O: Debug>(name: &str, seen: &HashSet<O>, what: &str, wanted: impl Fn(&O) -> bool) {
    assert!(
        seen.iter().any(wanted),
        "model {name}: never observed {what}; outcomes were:\n{seen:#?}"
    );
}

/// A region with one edge (0 -> 1) and the default four-event schema.
fn region(slots: u32, segments: u32) -> Recorder {
    Recorder::builder()
        .edge(0, 1)
        .slots(slots)
        .segments(segments)
        .create_in_memory()
        .expect("a valid geometry")
}

/// One edge segment as a snapshot shows it: the elapsed microseconds of each
/// of the four events and the chunk sequence of the producer event.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SegView {
    index: u32,
    us: [Option<u64>; 4],
    chunk: Option<u64>,
}

/// A snapshot reduced to what the models compare.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct View {
    state: RequestState,
    dropped: u64,
    segs: Vec<SegView>,
}

fn view(s: &Snapshot) -> View {
    View {
        state: s.state(),
        dropped: s.dropped_segments(),
        segs: s
            .segments()
            .iter()
            .map(|seg| SegView {
                index: seg.segment_index(),
                us: Event::ALL.map(|e| seg.get(e).map(|o| o.elapsed_us)),
                chunk: seg.first_chunk_seq(),
            })
            .collect(),
    }
}

impl View {
    fn seg(&self, index: u32) -> Option<&SegView> {
        self.segs.iter().find(|s| s.index == index)
    }
    /// The producer event of segment `index` as (microseconds, chunk).
    fn producer(&self, index: u32) -> Option<(u64, Option<u64>)> {
        let s = self.seg(index)?;
        s.us[P as usize].map(|us| (us, s.chunk))
    }
    fn event(&self, index: u32, e: Event) -> Option<u64> {
        self.seg(index)?.us[e as usize]
    }
    /// Every value this view shows is shown identically by `later`.
    fn kept_by(&self, later: &View) -> bool {
        self.segs.iter().all(|s| {
            let Some(l) = later.seg(s.index) else {
                return false;
            };
            (0..4).all(|e| s.us[e].is_none() || s.us[e] == l.us[e])
                && (s.us[P as usize].is_none() || s.chunk == l.chunk)
        })
    }
}

/// A producer write of `ms` milliseconds with chunk sequence `chunk`.
fn emit(rec: &Recorder, t: Token, segment: u32, ms: f64, chunk: u64) -> Outcome {
    let mark = Mark::new(EDGE, P).segment(segment).chunk_seq(chunk);
    rec.record_elapsed(t, mark, ms, DOMAIN)
}

/// A write of event `e` on segment 0.
fn mark(rec: &Recorder, t: Token, e: Event, ms: f64) -> Outcome {
    rec.record_elapsed(t, Mark::new(EDGE, e), ms, DOMAIN)
}

fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> thread::JoinHandle<T> {
    thread::spawn(f)
}

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
// Model 4: a writer races start_segment.
// ---------------------------------------------------------------------------

/// The owner starts segment 1 while a writer records the producer event
/// (1 ms, chunk 1) for segment 0. The write lands in segment 0 or is refused
/// as `StaleSegment`; it never shows in segment 1. With two kept segments,
/// segment 0 keeps the write exactly when it was `Recorded`; with one, ring
/// entry 0 is relaid for segment 1, segment 0 is dropped (and counted) and
/// its value goes with it.
///
/// The owner runs on the main thread so that loom's first schedule runs the
/// control operation first (see "Thread placement" in `docs/loom.md`).
fn old_writer_races_start_segment(segments: u32) {
    let name = format!("m4a_old_segment_writer_races_start_segment_k{segments}");
    // (start outcome, writer outcome, final snapshot)
    let seen = explore(&name, move || {
        let rec = region(1, segments);
        let t = rec.begin().unwrap();
        let rw = rec.clone();
        let w = spawn(move || emit(&rw, t, 0, 1.0, 1));
        let st = rec.start_segment(t, EDGE, 1);
        let o0 = w.join().unwrap();
        let fin = view(&rec.close(t));
        (st, o0, fin)
    });
    let old = (1000, Some(1));
    // With one kept segment the writer's CAS and start_segment's relay swap
    // are both read-modify-writes of the same cell, so loom orders them
    // strictly: either the write lands and the relay evicts it with segment
    // 0, or the writer finds the relaid word and is refused.
    assert_only(&name, &seen, |(st, o0, fin)| {
        let seg0_ok = match (segments, o0) {
            (1, Outcome::Recorded | Outcome::StaleSegment) => {
                fin.seg(0).is_none() && fin.dropped == 1 && fin.segs.is_empty()
            }
            (_, Outcome::Recorded) => fin.producer(0) == Some(old) && fin.segs.len() == 1,
            (_, Outcome::StaleSegment) => fin.segs.is_empty(),
            _ => false,
        };
        *st == Outcome::Started && seg0_ok
    });
    assert_seen(&name, &seen, "the write landing", |o| {
        o.1 == Outcome::Recorded
    });
    assert_seen(&name, &seen, "the write refused as stale", |o| {
        o.1 == Outcome::StaleSegment
    });
}

#[test]
fn m4a_old_segment_writer_races_start_segment_k1() {
    old_writer_races_start_segment(1);
}

#[test]
fn m4a_old_segment_writer_races_start_segment_k2() {
    old_writer_races_start_segment(2);
}

/// The owner starts segment 1 while a writer that was told of segment 1
/// records its producer event (3 ms, chunk 3). If the writer read the new
/// segment word, it finds the segment's cells laid and its write lands in
/// segment 1; if it came first, it is refused as `SegmentNotStarted`
/// (recording never advances a segment). Never `StaleSegment`, never in
/// segment 0.
fn new_writer_races_start_segment(segments: u32) {
    let name = format!("m4b_new_segment_writer_races_start_segment_k{segments}");
    let seen = explore(&name, move || {
        let rec = region(1, segments);
        let t = rec.begin().unwrap();
        let rw = rec.clone();
        let w = spawn(move || emit(&rw, t, 1, 3.0, 3));
        let st = rec.start_segment(t, EDGE, 1);
        let o1 = w.join().unwrap();
        let fin = view(&rec.close(t));
        (st, o1, fin)
    });
    let new = (3000, Some(3));
    assert_only(&name, &seen, |(st, o1, fin)| {
        let ok = match o1 {
            Outcome::Recorded => fin.producer(1) == Some(new) && fin.segs.len() == 1,
            Outcome::SegmentNotStarted => fin.segs.is_empty(),
            _ => false,
        };
        *st == Outcome::Started && ok && fin.dropped == u64::from(segments == 1)
    });
    assert_seen(&name, &seen, "the write landing in segment 1", |o| {
        o.1 == Outcome::Recorded
    });
    assert_seen(&name, &seen, "the write before the start", |o| {
        o.1 == Outcome::SegmentNotStarted
    });
}

#[test]
fn m4b_new_segment_writer_races_start_segment_k1() {
    new_writer_races_start_segment(1);
}

#[test]
fn m4b_new_segment_writer_races_start_segment_k2() {
    new_writer_races_start_segment(2);
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

/// Model 5b: a snapshot races the relaying of a ring entry.
///
/// With one kept segment, segment 1 reuses segment 0's cells. Segment 0 has
/// the producer (1 ms, chunk 1) and send (1.5 ms) events; the owner starts
/// segment 1 and records its producer event (3 ms, chunk 3) while another
/// thread takes two snapshots. A snapshot shows segment 0 whole or not at
/// all, and segment 1's value only as segment 1: never a mixture of the
/// two epochs of the entry.
#[test]
fn m5b_snapshot_races_segment_relay() {
    const NAME: &str = "m5b_snapshot_races_segment_relay";
    let seen = explore(NAME, || {
        let rec = region(1, 1);
        let t = rec.begin().unwrap();
        assert_eq!(emit(&rec, t, 0, 1.0, 1), Outcome::Recorded);
        assert_eq!(mark(&rec, t, S, 1.5), Outcome::Recorded);
        let rs = rec.clone();
        let snaps = spawn(move || (view(&rs.snapshot(t)), view(&rs.snapshot(t))));
        let st = rec.start_segment(t, EDGE, 1);
        let o1 = emit(&rec, t, 1, 3.0, 3);
        let (s1, s2) = snaps.join().unwrap();
        let fin = view(&rec.close(t));
        (st, o1, s1, s2, fin)
    });
    let seg0 = SegView {
        index: 0,
        us: [Some(1000), Some(1500), None, None],
        chunk: Some(1),
    };
    let seg1 = SegView {
        index: 1,
        us: [Some(3000), None, None, None],
        chunk: Some(3),
    };
    let whole =
        |v: &View| v.segs.is_empty() || v.segs == [seg0.clone()] || v.segs == [seg1.clone()];
    assert_only(NAME, &seen, |(st, o1, s1, s2, fin)| {
        *st == Outcome::Started
            && *o1 == Outcome::Recorded
            && whole(s1)
            && whole(s2)
            // Once segment 1 is seen, segment 0 never comes back.
            && !(s1.seg(1).is_some() && s2.seg(0).is_some())
            && s1.seg(1).map_or(true, |_| s1.kept_by(s2))
            && fin.segs == [seg1.clone()]
            && fin.dropped == 1
    });
    assert_seen(NAME, &seen, "a snapshot of segment 0", |o| {
        o.2.seg(0).is_some()
    });
    assert_seen(NAME, &seen, "a snapshot of segment 1", |o| {
        o.3.seg(1).is_some()
    });
    assert_seen(NAME, &seen, "a snapshot between the epochs", |o| {
        o.2.segs.is_empty() || o.3.segs.is_empty()
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

// ---------------------------------------------------------------------------
// Model 9: processes register clock domains at run time.
// ---------------------------------------------------------------------------

/// What a registration model's reader saw of entry 1 at two moments:
/// `Ok(None)` not ready, `Ok(Some(name))` ready, `Err(())` garbled.
type EntryView = Result<Option<String>, ()>;

/// Two registrants of one name and a reader of the entry they race for, over
/// one domain table (each registrant stands for a separate process: there is
/// no per-process cache in the table). Both get the same id, 1 (the first
/// free entry after the shared clock); the reader sees the entry not ready
/// or ready with the name, never garbled, and never ready then not ready.
#[test]
fn m9a_two_registrants_of_one_name() {
    const NAME: &str = "m9a_two_registrants_of_one_name";
    let seen = explore(NAME, || {
        let table = Arc::new(edgemark::LoomTable::new());
        let (t1, t2) = (Arc::clone(&table), Arc::clone(&table));
        let b = spawn(move || t1.register("sender"));
        let r = spawn(move || (t2.inspect(1), t2.inspect(1)));
        let a = table.register("sender");
        let b = b.join().unwrap();
        let (r1, r2): (EntryView, EntryView) = r.join().unwrap();
        (a, b, r1, r2, table.inspect(1), table.inspect(2))
    });
    let ready = Ok(Some("sender".to_owned()));
    assert_only(NAME, &seen, |(a, b, r1, r2, end1, end2)| {
        *a == Some(1)
            && *b == Some(1)
            && (*r1 == Ok(None) || *r1 == ready)
            && (*r2 == Ok(None) || *r2 == ready)
            && !(*r1 == ready && *r2 == Ok(None))
            && *end1 == ready
            && *end2 == Ok(None)
    });
    assert_seen(NAME, &seen, "the reader before publication", |o| {
        o.2 == Ok(None)
    });
    assert_seen(NAME, &seen, "the reader after publication", |o| {
        o.2 == ready
    });
}

/// Two registrants of different names and a reader: they get ids 1 and 2 in
/// either order, each entry ends ready with its own name, and the reader
/// never sees entry 1 garbled or holding a third name.
#[test]
fn m9b_two_registrants_of_two_names() {
    const NAME: &str = "m9b_two_registrants_of_two_names";
    let seen = explore(NAME, || {
        let table = Arc::new(edgemark::LoomTable::new());
        let (t1, t2) = (Arc::clone(&table), Arc::clone(&table));
        let b = spawn(move || t1.register("receiver"));
        let r = spawn(move || t2.inspect(1));
        let a = table.register("sender");
        let b = b.join().unwrap();
        let r: EntryView = r.join().unwrap();
        (a, b, r, table.inspect(1), table.inspect(2))
    });
    let name = |n: &str| Ok(Some(n.to_owned()));
    assert_only(NAME, &seen, |(a, b, r, end1, end2)| {
        let (first, second) = match (a, b) {
            (Some(1), Some(2)) => ("sender", "receiver"),
            (Some(2), Some(1)) => ("receiver", "sender"),
            _ => return false,
        };
        *end1 == name(first) && *end2 == name(second) && (*r == Ok(None) || *r == name(first))
    });
    assert_seen(NAME, &seen, "the first name winning entry 1", |o| {
        o.0 == Some(1)
    });
    assert_seen(NAME, &seen, "the second name winning entry 1", |o| {
        o.1 == Some(1)
    });
    assert_seen(NAME, &seen, "the reader seeing entry 1 ready", |o| {
        o.2.as_ref().is_ok_and(|n| n.is_some())
    });
}

// ---------------------------------------------------------------------------
// Model 10: the ring of closed requests.
// ---------------------------------------------------------------------------

/// A closed request as a reader took it: its slot and its producer value.
type Took = (u32, Option<u64>);

/// A region of one edge, one kept segment and a schema of the producer
/// event alone (the ring's models are about entries, not events: fewer
/// words keep loom's exploration short), with `slots` slots and a ring of
/// `entries`.
fn ring_region(slots: u32, entries: u32) -> Recorder {
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
