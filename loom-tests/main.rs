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

// The models, by protocol part; each file holds the models of one.
mod close;
mod domains;
mod expire;
mod fence;
mod ring;
mod ring_ack;
mod segment;
mod slot;
