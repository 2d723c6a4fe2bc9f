//! Reading requests back: a snapshot of one request, and a sweep of every
//! open request of a full default-sized region.
//!
//! - `snapshot/one_request`: [`Recorder::snapshot`] of one open request with
//!   every event of both edges recorded (eight values).
//! - `snapshot/full_region`: [`Recorder::for_each_open`] over a file-backed
//!   region of the default geometry (4096 slots, edges 0->1 and 1->2) with
//!   every slot open and every event of every slot recorded, each snapshot
//!   lent to the callback in turn.
//! - `snapshot/full_region_collect`: the same sweep through
//!   [`Recorder::snapshot_open`], all snapshots kept in one `Vec`.
//! - `snapshot/full_region_into`: the same sweep through
//!   [`Recorder::snapshot_open_into`] into a `Vec` kept between sweeps.
//!
//! Each includes building and dropping what the caller is given (the
//! snapshot, or the `Vec` of them): a caller pays for both.

use std::time::Duration;

mod common;

use common::{EDGES, region_dir};
use criterion::{Criterion, criterion_group, criterion_main};
use edgemark::{Event, Mark, Outcome, Recorder, RequestState, Token};

const SLOTS: u32 = 4096;

/// Records every event of both edges of `token`.
fn record_all(rec: &Recorder, token: Token) {
    for edge in EDGES {
        for event in Event::ALL {
            let mark = Mark::new(edge, event).chunk_seq(7);
            assert_eq!(rec.record(token, mark), Outcome::Recorded);
        }
    }
}

fn snapshots(c: &mut Criterion) {
    let dir = region_dir();
    let rec = Recorder::builder()
        .edge(0, 1)
        .edge(1, 2)
        .slots(SLOTS)
        .create(dir.path().join("snapshot.region"))
        .expect("create the region");
    let mut g = c.benchmark_group("snapshot");

    let token = rec.begin().expect("a free slot");
    record_all(&rec, token);
    let first = rec.snapshot(token);
    assert_eq!(first.state(), RequestState::Open);
    assert_eq!(first.segments().len(), 2);
    g.bench_function("one_request", |b| b.iter(|| rec.snapshot(token)));

    for _ in 1..SLOTS {
        let t = rec.begin().expect("a free slot");
        record_all(&rec, t);
    }
    assert!(rec.begin().is_err(), "every slot is in use");
    assert_eq!(rec.snapshot_open().unwrap().len(), SLOTS as usize);
    // The sweep as a reader (an exporter, `top`) does it: one snapshot at a
    // time, lent to the callback.
    g.bench_function("full_region", |b| {
        b.iter(|| {
            let mut values = 0usize;
            rec.for_each_open(|_, s| values += s.segments().len())
                .unwrap();
            assert_eq!(values, 2 * SLOTS as usize);
            values
        })
    });
    // The same sweep, every snapshot kept in one Vec.
    g.bench_function("full_region_collect", |b| {
        b.iter(|| rec.snapshot_open().unwrap())
    });
    // The same, into a buffer kept between sweeps (an exporter's loop): no
    // allocation after the first.
    let mut kept = Vec::new();
    g.bench_function("full_region_into", |b| {
        b.iter(|| {
            rec.snapshot_open_into(&mut kept).unwrap();
            kept.len()
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    targets = snapshots
}
criterion_main!(benches);
