//! A request's control path, begin to close, and what the trace context and
//! the ring of closed requests add to it; then the drain that takes closed
//! requests back out.
//!
//! Each id is one request of the default schema on edges 0->1 and 1->2,
//! its producer event recorded on both edges, in a file-backed region of
//! 4096 slots; the ids differ in what the region keeps and what begin is
//! given:
//!
//! - `lifecycle/begin_close_no_ring`: a region without a ring of closed
//!   requests (`closed_entries(0)`): begin (with its trace words) and
//!   close, no ring entry written;
//! - `lifecycle/begin_close`: the default region: close also writes the
//!   request's ring entry (nobody drains, so entries are overwritten);
//! - `lifecycle/begin_traced_close`: the same with a caller's context;
//! - `lifecycle/drain_one`: one begin, close and drain of that request
//!   (the drain replays the entry into a snapshot).
//!
//! Rows are interleaved by criterion's own order; compare ratios within one
//! run.

use std::time::Duration;

mod common;

use common::{EDGES, region_dir};
use criterion::{Criterion, criterion_group, criterion_main};
use edgemark::{Event, Mark, Outcome, Recorder, TraceContext};

fn region(dir: &std::path::Path, name: &str, closed: Option<u32>) -> Recorder {
    let mut b = Recorder::builder().edge(0, 1).edge(1, 2).slots(4096);
    if let Some(n) = closed {
        b = b.closed_entries(n);
    }
    b.create(dir.join(name)).expect("create the region")
}

fn one(rec: &Recorder, parent: Option<TraceContext>) {
    let t = rec.begin_traced(parent).expect("a free slot");
    for edge in EDGES {
        let mark = Mark::new(edge, Event::ProducerFirstNonemptyEmit).chunk_seq(1);
        assert_eq!(rec.record(t, mark), Outcome::Recorded);
    }
    std::hint::black_box(rec.close(t));
}

fn lifecycle(c: &mut Criterion) {
    let dir = region_dir();
    let bare = region(dir.path(), "bare.region", Some(0));
    let ringed = region(dir.path(), "ring.region", None);
    let parent: TraceContext = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        .parse()
        .expect("a valid traceparent");
    let mut g = c.benchmark_group("lifecycle");
    g.bench_function("begin_close_no_ring", |b| b.iter(|| one(&bare, None)));
    g.bench_function("begin_close", |b| b.iter(|| one(&ringed, None)));
    g.bench_function("begin_traced_close", |b| {
        b.iter(|| one(&ringed, Some(parent)))
    });
    let mut out = Vec::with_capacity(1);
    // Catch up with what the rows above left in the ring.
    while !ringed.drain_closed(4096, &mut out).unwrap().caught_up {}
    g.bench_function("drain_one", |b| {
        b.iter(|| {
            one(&ringed, None);
            out.clear();
            let d = ringed.drain_closed(1, &mut out).unwrap();
            assert_eq!(d.taken, 1);
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = lifecycle
}
criterion_main!(benches);
