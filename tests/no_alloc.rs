//! The record path allocates nothing: `record`, `record_elapsed`, duplicate
//! records and refused records, after warm-up, on a file-backed region.
//!
//! This file is its own test binary so that its counting global allocator
//! sees every allocation. Counts are kept per thread, so the test harness's
//! other threads (and other tests running in parallel) cannot disturb a
//! measurement.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use edgemark::{Edge, Event, Mark, Outcome, Recorder, Token};

use edgemark::clock::Clock;

/// The system allocator, counting the calls made by each thread.
struct Counting;

thread_local! {
    /// Allocations, reallocations and frees made by this thread.
    static CALLS: Cell<u64> = const { Cell::new(0) };
}

fn bump() {
    // `try_with`: a thread's last frees may come after its locals are gone.
    let _ = CALLS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees hold; counting touches only a
// const-initialised thread-local `Cell`, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: the caller upholds `alloc`'s contract, which we pass on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump();
        // SAFETY: `ptr` and `layout` come from this allocator, which is
        // `System`'s; the caller upholds the rest.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        bump();
        // SAFETY: `ptr` and `layout` come from this allocator, which is
        // `System`'s.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The allocator calls this thread makes while running `f`.
fn allocator_calls(f: impl FnOnce()) -> u64 {
    let before = CALLS.with(Cell::get);
    f();
    CALLS.with(Cell::get) - before
}

const EDGES: [Edge; 2] = [Edge::new(0, 1), Edge::new(1, 2)];
const DOMAIN: &str = "worker_local";
const REQUESTS: usize = 256;

/// The eight first writes a request can take: both edges, all four events.
fn marks() -> Vec<Mark> {
    EDGES
        .iter()
        .flat_map(|&e| Event::ALL.map(|ev| Mark::new(e, ev).chunk_seq(5)))
        .collect()
}

/// A file-backed region, as production uses, with a second clock domain.
fn region() -> (tempfile::TempDir, Recorder) {
    region_with(Clock::Monotonic)
}

/// [`region`] with the shared clock `clock`.
fn region_with(clock: Clock) -> (tempfile::TempDir, Recorder) {
    let dir = tempfile::tempdir_in(edgemark::default_dir()).unwrap();
    let rec = Recorder::builder()
        .edge(0, 1)
        .edge(1, 2)
        .slots(1024)
        .domain(DOMAIN)
        .clock(clock)
        .create(dir.path().join("no-alloc.region"))
        .unwrap();
    (dir, rec)
}

/// Begins `n` requests, plus one whose records warm the path up.
fn begin(rec: &Recorder, n: usize, marks: &[Mark]) -> Vec<Token> {
    let warm = rec.begin().unwrap();
    for &m in marks {
        rec.record(warm, m);
        rec.record_elapsed(warm, m, 1.0, DOMAIN);
    }
    rec.close(warm);
    (0..n).map(|_| rec.begin().unwrap()).collect()
}

#[test]
fn the_counter_sees_allocations() {
    let calls = allocator_calls(|| {
        std::hint::black_box(vec![1u8; 16]);
    });
    assert!(calls >= 2, "an allocation and a free, counted {calls}");
}

#[test]
fn record_allocates_nothing_after_warm_up() {
    let (_dir, rec) = region();
    records_allocate_nothing(&rec);
}

/// Records every mark of every request once, counting allocations.
fn records_allocate_nothing(rec: &Recorder) {
    let marks = marks();
    let tokens = begin(rec, REQUESTS, &marks);
    let mut outcomes = Vec::with_capacity(tokens.len() * marks.len());
    let calls = allocator_calls(|| {
        for &t in &tokens {
            for &m in &marks {
                outcomes.push(rec.record(t, m));
            }
        }
    });
    assert_eq!(calls, 0, "record allocated");
    assert!(outcomes.iter().all(|&o| o == Outcome::Recorded));
}

#[test]
fn counter_record_allocates_nothing_after_warm_up() {
    let (_dir, rec) = region_with(Clock::Counter);
    if rec.clock() != Some(Clock::Counter) {
        eprintln!("NOTE: the counter is not trusted here; the region reads the monotonic clock");
    }
    records_allocate_nothing(&rec);
}

#[test]
fn record_elapsed_allocates_nothing_after_warm_up() {
    let (_dir, rec) = region();
    let marks = marks();
    let tokens = begin(&rec, REQUESTS, &marks);
    let mut outcomes = Vec::with_capacity(tokens.len() * marks.len() * 2);
    let calls = allocator_calls(|| {
        for (i, &t) in tokens.iter().enumerate() {
            for &m in &marks {
                // Both domains: the one measured elsewhere and the shared one.
                let domain = if i % 2 == 0 {
                    DOMAIN
                } else {
                    edgemark::schema::HOST_MONOTONIC
                };
                outcomes.push(rec.record_elapsed(t, m, 12.5, domain));
            }
        }
    });
    assert_eq!(calls, 0, "record_elapsed allocated");
    assert!(outcomes.iter().all(|&o| o == Outcome::Recorded));
}

#[test]
fn duplicate_records_allocate_nothing() {
    let (_dir, rec) = region();
    let marks = marks();
    let tokens = begin(&rec, REQUESTS, &marks);
    for &t in &tokens {
        for &m in &marks {
            assert_eq!(rec.record(t, m), Outcome::Recorded);
        }
    }
    let mut outcomes = Vec::with_capacity(tokens.len() * marks.len() * 2);
    let calls = allocator_calls(|| {
        for &t in &tokens {
            for &m in &marks {
                outcomes.push(rec.record(t, m));
                outcomes.push(rec.record_elapsed(t, m, 3.0, DOMAIN));
            }
        }
    });
    assert_eq!(calls, 0, "a duplicate record allocated");
    assert!(outcomes.iter().all(|&o| o == Outcome::Duplicate));
}

#[test]
fn records_in_a_registered_domain_allocate_nothing_after_the_first() {
    let (_dir, rec) = region();
    let marks = marks();
    let tokens = begin(&rec, REQUESTS, &marks);
    // The first use registers the name (and caches it: one allocation).
    assert_eq!(
        rec.record_elapsed(tokens[0], marks[0], 1.0, "registered_late"),
        Outcome::Recorded
    );
    let mut outcomes = Vec::with_capacity(tokens.len() * marks.len());
    let calls = allocator_calls(|| {
        for &t in &tokens[1..] {
            for &m in &marks {
                outcomes.push(rec.record_elapsed(t, m, 2.0, "registered_late"));
            }
        }
    });
    assert_eq!(calls, 0, "a record in a registered domain allocated");
    assert!(outcomes.iter().all(|&o| o == Outcome::Recorded));
}

#[test]
fn refused_records_allocate_nothing() {
    let (_dir, rec) = region();
    let marks = marks();
    let tokens = begin(&rec, 4, &marks);
    let closed = tokens[0];
    rec.close(closed);
    let open = tokens[1];
    let heartbeat = marks[0].meaningful(false);
    let undeclared = Mark::new(Edge::new(2, 0), Event::ConsumerFirstAccept);
    let mut outcomes = Vec::with_capacity(64);
    let calls = allocator_calls(|| {
        for _ in 0..8 {
            outcomes.push(rec.record(closed, marks[1]));
            outcomes.push(rec.record(open, heartbeat));
            outcomes.push(rec.record(open, undeclared));
            outcomes.push(rec.record_elapsed(open, marks[2], f64::NAN, DOMAIN));
            outcomes.push(rec.record_elapsed(open, marks[2], 1.0, "no\nname"));
            outcomes.push(Recorder::disabled().record(open, marks[3]));
        }
    });
    assert_eq!(calls, 0, "a refused record allocated");
    let expected = [
        Outcome::Closed,
        Outcome::NotMeaningful,
        Outcome::UnknownEdge,
        Outcome::Invalid,
        Outcome::UnknownDomain,
        Outcome::Disabled,
    ];
    for (i, o) in outcomes.iter().enumerate() {
        assert_eq!(*o, expected[i % expected.len()], "call {i}");
    }
}

/// A region with `n` open requests, each with every event of both edges.
fn swept_region(n: usize) -> (tempfile::TempDir, Recorder, Vec<Token>) {
    let (dir, rec) = region();
    let marks = marks();
    let tokens = begin(&rec, n, &marks);
    for &t in &tokens {
        for &m in &marks {
            assert_eq!(rec.record(t, m), Outcome::Recorded);
        }
    }
    (dir, rec, tokens)
}

#[test]
fn a_second_sweep_into_a_reused_buffer_allocates_nothing() {
    let (_dir, rec, tokens) = swept_region(REQUESTS);
    let mut open = Vec::new();
    rec.snapshot_open_into(&mut open).unwrap();
    assert_eq!(open.len(), REQUESTS);
    let calls = allocator_calls(|| rec.snapshot_open_into(&mut open).unwrap());
    assert_eq!(calls, 0, "a sweep into a reused buffer allocated");
    // And it is the same sweep as the allocating one.
    let fresh = rec.snapshot_open().unwrap();
    assert_eq!(open, fresh);
    assert_eq!(open.iter().map(|(t, _)| *t).collect::<Vec<_>>(), tokens);
    assert!(open.iter().all(|(_, s)| s.segments().len() == 2));
}

#[test]
fn for_each_open_allocates_nothing_for_requests_of_two_segments() {
    let (_dir, rec, tokens) = swept_region(REQUESTS);
    let sweep = |rec: &Recorder| {
        let mut values = 0;
        let calls = allocator_calls(|| {
            rec.for_each_open(|_, s| values += s.segments().len())
                .unwrap()
        });
        (calls, values)
    };
    let (few, values) = sweep(&rec);
    assert_eq!(values, 2 * REQUESTS);
    // Twice the requests, the same allocations: none of them per request.
    let more: Vec<Token> = (0..REQUESTS).map(|_| rec.begin().unwrap()).collect();
    for &t in &more {
        for &m in &marks() {
            rec.record(t, m);
        }
    }
    let (many, values) = sweep(&rec);
    assert_eq!(values, 4 * REQUESTS);
    assert_eq!(few, many, "allocations grew with the requests swept");
    assert_eq!(many, 0, "a sweep allocated");
    drop(tokens);
}

#[test]
fn a_snapshot_of_a_request_of_two_segments_allocates_nothing() {
    let (_dir, rec, tokens) = swept_region(1);
    let t = tokens[0];
    let calls = allocator_calls(|| {
        let snap = rec.snapshot(t);
        assert_eq!(snap.segments().len(), 2);
    });
    assert_eq!(calls, 0, "a snapshot allocated");
}

/// A region with `n` open requests that each have three edge segments with
/// events (two on edge 0->1), one more than a snapshot holds inline.
fn swept_region_of_three_segments(n: usize) -> (tempfile::TempDir, Recorder) {
    let (dir, rec, tokens) = swept_region(n);
    for &t in &tokens {
        assert_eq!(rec.start_segment(t, EDGES[0], 1), Outcome::Started);
        let mark = Mark::new(EDGES[0], Event::ALL[0]).segment(1);
        assert_eq!(rec.record(t, mark), Outcome::Recorded);
    }
    (dir, rec)
}

#[test]
fn a_second_sweep_of_larger_requests_into_a_reused_buffer_allocates_nothing() {
    let (_dir, rec) = swept_region_of_three_segments(REQUESTS);
    let mut open = Vec::new();
    // The first sweep spills every snapshot's segments to the heap...
    rec.snapshot_open_into(&mut open).unwrap();
    assert!(open.iter().all(|(_, s)| s.segments().len() == 3));
    // ...and the next ones reuse that storage.
    let calls = allocator_calls(|| rec.snapshot_open_into(&mut open).unwrap());
    assert_eq!(calls, 0, "a sweep into a reused buffer allocated");
    assert_eq!(open, rec.snapshot_open().unwrap());
}

#[test]
fn for_each_open_allocates_per_sweep_not_per_request_for_larger_requests() {
    let sweep = |rec: &Recorder| {
        let mut values = 0;
        let calls = allocator_calls(|| {
            rec.for_each_open(|_, s| values += s.segments().len())
                .unwrap()
        });
        (calls, values)
    };
    let (_dir, few) = swept_region_of_three_segments(REQUESTS / 2);
    let (_dir2, many) = swept_region_of_three_segments(REQUESTS);
    let (few_calls, few_values) = sweep(&few);
    let (many_calls, many_values) = sweep(&many);
    assert_eq!((few_values, many_values), (3 * REQUESTS / 2, 3 * REQUESTS));
    // The lent snapshot spills once, for the first request.
    assert_eq!(
        few_calls, many_calls,
        "allocations grew with the requests swept"
    );
    assert!(many_calls <= 2, "{many_calls} allocator calls in a sweep");
}
