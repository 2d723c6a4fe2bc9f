//! The record path, beside its floor and beside the alternatives a user
//! would otherwise pick, all in one run so that every figure is a ratio.
//!
//! - `record/floor_clock_cas`: the least a record can cost, one read of the
//!   clock edgemark uses ([`edgemark::clock::monotonic_ns`]) plus one
//!   compare-and-swap on a fresh, zeroed heap cell.
//! - `record/floor_tsc_cas`: the same with the time-stamp counter read as a
//!   counter region reads it (`lfence; rdtsc`) instead of the clock.
//! - `record/edgemark`: a full [`Recorder::record`] on a file-backed region
//!   (the default geometry: 4096 slots, edges 0->1 and 1->2), every
//!   iteration a first write.
//! - `record/edgemark_counter`: the same on a region created with
//!   [`Clock::Counter`](edgemark::clock::Clock::Counter) (where the kernel trusts
//!   the counter; elsewhere the region falls back to the monotonic clock and
//!   the bench says so).
//! - `record/edgemark_duplicate`: a record that loses to an earlier write.
//! - `record/mutex_map`: the upstream in-process design, a mutex-guarded map
//!   in the request's state, first write wins.
//! - `record/channel_to_owner`: the observation sent over a bounded channel
//!   to an owner thread that applies it to a map (cannot cross processes).
//! - `record/uds_to_owner`: the upstream design's transport, the observation
//!   sent as a datagram over a Unix socket to an owner *process* that applies
//!   it to a map. The owner is this binary re-executed with
//!   `EDGEMARK_BENCH_ROLE=uds-owner`, which `main` checks before criterion
//!   runs.
//!
//! Each operation is written once, as an [`Operation`]: what a chunk of
//! calls needs, laid outside the timed part (fresh cells, begun requests,
//! 4096 requests x 8 marks at most), the timed call, and what is undone
//! after the chunk (closing the requests, letting an owner drain). So every
//! timed first write is a first write, and an owner keeps up with its
//! sender. [`uncontended`] and [`to_owner`] list the operations once, and
//! run them under each [`Harness`]: criterion's groups first, then (unless
//! `EDGEMARK_BENCH_P99=0`) the per-call latency percentiles, p50 to p99.9,
//! each call bracketed by serialised time-stamp-counter reads; see
//! `docs/benchmarks.md`.
//!
//! The files: `main.rs`, the operations; `harness.rs`, the two harnesses;
//! `upstream.rs`, the upstream design's map, observation and owner thread;
//! `uds.rs`, its datagram codec and owner process; `../common/tsc.rs`, the
//! time-stamp counter.

use std::path::Path;

#[path = "../common/mod.rs"]
mod common;
mod harness;
mod uds;
mod upstream;

use common::tsc;
use common::{MARKS_PER_REQUEST, ROLE, marks, region_dir};
use criterion::Criterion;
use edgemark::clock::{Clock, monotonic_ns};
use edgemark::{Mark, Outcome, Recorder, Token};
use harness::{Harness, Operation, PerCall, Timed};
use upstream::{ChannelOwner, Keys, Observation, Owner, UpstreamRequest, keys};

/// Criterion's group, and the prefix of each row of the per-call table.
const GROUP: &str = "record";
/// The default region's slots.
const SLOTS: usize = 4096;
/// Most calls laid at a time: every cell of every slot of a default region.
const CHUNK: usize = SLOTS * MARKS_PER_REQUEST;

// ---------------------------------------------------------------------------
// The operations, in the order they run.

/// In one thread: the floors, edgemark's first write and duplicate, and the
/// mutex-guarded map.
fn uncontended(h: &mut impl Harness) {
    let cells = FloorCells::new();
    h.run("floor_clock_cas", &mut FloorCas::new(&cells, monotonic_ns));
    h.run("floor_tsc_cas", &mut FloorCas::new(&cells, tsc::read));

    let dir = region_dir();
    let rec = region(dir.path(), Clock::Monotonic);
    h.run("edgemark", &mut FirstWrites::new(&rec));
    let counter = region(dir.path(), Clock::Counter);
    if counter.clock() != Some(Clock::Counter) {
        eprintln!(
            "record/edgemark_counter: the counter is not trusted here; the region uses the monotonic clock"
        );
    }
    h.run("edgemark_counter", &mut FirstWrites::new(&counter));
    h.run("edgemark_duplicate", &mut Duplicates::new(&rec));

    h.run("mutex_map", &mut MutexMap { keys: keys() });
}

/// Across a thread or a process: the observation sent to an owner.
fn to_owner(h: &mut impl Harness) {
    h.run(
        "channel_to_owner",
        &mut SendToOwner::new(ChannelOwner::spawn()),
    );
    h.run(
        "uds_to_owner",
        &mut SendToOwner::new(uds::UdsOwner::spawn()),
    );
}

/// A file-backed region of the default geometry with the shared clock
/// `clock`, in `dir`.
fn region(dir: &Path, clock: Clock) -> Recorder {
    Recorder::builder()
        .edge(0, 1)
        .edge(1, 2)
        .slots(SLOTS as u32)
        .clock(clock)
        .create(dir.join(format!("record-{clock}.region")))
        .expect("create the region")
}

/// Zeroed heap cells, one per first write of a chunk.
// The bench measures a plain core atomic on purpose: it is the floor, not
// the protocol, so the sync facade does not apply.
#[allow(clippy::disallowed_types)]
struct FloorCells(Box<[std::sync::atomic::AtomicU64]>);

#[allow(clippy::disallowed_types)]
impl FloorCells {
    fn new() -> FloorCells {
        FloorCells(
            (0..CHUNK)
                .map(|_| std::sync::atomic::AtomicU64::new(0))
                .collect(),
        )
    }
}

/// The floor: one read of `now` plus one compare-and-swap on a fresh cell.
struct FloorCas<'a, F> {
    cells: &'a FloorCells,
    now: F,
}

impl<'a, F: Fn() -> u64> FloorCas<'a, F> {
    fn new(cells: &'a FloorCells, now: F) -> Self {
        FloorCas { cells, now }
    }
}

#[allow(clippy::disallowed_types)]
impl<F: Fn() -> u64> Operation for FloorCas<'_, F> {
    type Chunk = ();

    /// Zeroes the first `n` cells.
    fn lay(&mut self, n: usize) {
        for c in &self.cells.0[..n] {
            c.store(0, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The orderings edgemark's record uses: Release on success, Relaxed
    /// on failure.
    #[inline(always)]
    fn call(&self, _: &(), i: usize) -> bool {
        use std::sync::atomic::Ordering;
        let now = (self.now)();
        self.cells.0[i]
            .compare_exchange(0, now | 1, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    fn clear(&mut self, _: ()) {}
}

/// [`Recorder::record`], every call a first write: a chunk begins enough
/// requests and closes them after.
struct FirstWrites<'a> {
    rec: &'a Recorder,
    marks: [Mark; MARKS_PER_REQUEST],
}

impl<'a> FirstWrites<'a> {
    fn new(rec: &'a Recorder) -> Self {
        FirstWrites {
            rec,
            marks: marks(),
        }
    }
}

impl Operation for FirstWrites<'_> {
    type Chunk = Vec<Token>;

    fn lay(&mut self, n: usize) -> Vec<Token> {
        (0..n.div_ceil(MARKS_PER_REQUEST))
            .map(|_| self.rec.begin().expect("a free slot"))
            .collect()
    }

    #[inline(always)]
    fn call(&self, tokens: &Vec<Token>, i: usize) -> bool {
        let o = self.rec.record(
            tokens[i / MARKS_PER_REQUEST],
            self.marks[i % MARKS_PER_REQUEST],
        );
        o == Outcome::Recorded
    }

    fn clear(&mut self, tokens: Vec<Token>) {
        for t in tokens {
            self.rec.close(t);
        }
    }
}

/// [`Recorder::record`] that loses to an earlier write: one request, begun
/// with every mark recorded, for as long as the operation lives.
struct Duplicates<'a> {
    first: FirstWrites<'a>,
    token: Token,
}

impl<'a> Duplicates<'a> {
    fn new(rec: &'a Recorder) -> Self {
        let first = FirstWrites::new(rec);
        let token = rec.begin().expect("a free slot");
        for m in first.marks {
            assert_eq!(rec.record(token, m), Outcome::Recorded);
        }
        Duplicates { first, token }
    }
}

impl Operation for Duplicates<'_> {
    type Chunk = ();

    fn lay(&mut self, _: usize) {}

    #[inline(always)]
    fn call(&self, _: &(), i: usize) -> bool {
        let FirstWrites { rec, marks } = &self.first;
        rec.record(self.token, marks[i % MARKS_PER_REQUEST]) == Outcome::Duplicate
    }

    fn clear(&mut self, _: ()) {}
}

impl Drop for Duplicates<'_> {
    fn drop(&mut self) {
        self.first.rec.close(self.token);
    }
}

/// The upstream in-process design: each request's state created when it
/// begins, a mutex-guarded map in it, first write wins.
struct MutexMap {
    keys: Keys,
}

impl Operation for MutexMap {
    type Chunk = Vec<UpstreamRequest>;

    fn lay(&mut self, n: usize) -> Vec<UpstreamRequest> {
        (0..n.div_ceil(MARKS_PER_REQUEST))
            .map(|_| UpstreamRequest::new())
            .collect()
    }

    #[inline(always)]
    fn call(&self, requests: &Vec<UpstreamRequest>, i: usize) -> bool {
        let (key, chunk) = self.keys[i % MARKS_PER_REQUEST];
        requests[i / MARKS_PER_REQUEST].record(key, chunk)
    }

    fn clear(&mut self, _: Vec<UpstreamRequest>) {}
}

/// An observation stamped and sent to the owner of the request's state: a
/// chunk takes fresh request ids, and the owner drains after it.
struct SendToOwner<O> {
    owner: O,
    keys: Keys,
    /// The first request id of the last chunk.
    base: u128,
}

impl<O: Owner> SendToOwner<O> {
    fn new(owner: O) -> Self {
        SendToOwner {
            owner,
            keys: keys(),
            base: 0,
        }
    }
}

impl<O: Owner> Operation for SendToOwner<O> {
    /// The chunk's first request id.
    type Chunk = u128;

    fn lay(&mut self, _: usize) -> u128 {
        self.base += SLOTS as u128;
        self.base
    }

    #[inline(always)]
    fn call(&self, base: &u128, i: usize) -> bool {
        let request = base + (i / MARKS_PER_REQUEST) as u128;
        self.owner.send(&Observation::now(request, &self.keys, i))
    }

    fn clear(&mut self, _: u128) {
        self.owner.flush();
    }
}

// ---------------------------------------------------------------------------
// The harnesses.

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(std::time::Duration::from_secs(1))
        .measurement_time(std::time::Duration::from_secs(3))
        .sample_size(50)
}

fn uncontended_timed(c: &mut Criterion) {
    let mut h = Timed::new(c, GROUP, CHUNK);
    uncontended(&mut h);
    h.finish();
}

fn to_owner_timed(c: &mut Criterion) {
    let mut h = Timed::new(c, GROUP, CHUNK);
    to_owner(&mut h);
    h.finish();
}

criterion::criterion_group! {
    name = uncontended_group;
    config = config();
    targets = uncontended_timed
}
criterion::criterion_group! {
    name = to_owner_group;
    config = config();
    targets = to_owner_timed
}

/// Prints p50, p90, p99 and p99.9 of `calls` single calls of each operation.
fn percentiles(calls: usize) {
    let mut h = PerCall::new(GROUP, calls, CHUNK);
    uncontended(&mut h);
    to_owner(&mut h);
    h.print();
}

fn main() {
    if let Some(role) = std::env::var_os(ROLE) {
        match role.to_str() {
            Some(uds::OWNER_ROLE) => uds::owner_main(),
            other => panic!("unknown bench role {other:?}"),
        }
        return;
    }
    uncontended_group();
    to_owner_group();
    let args: Vec<String> = std::env::args().collect();
    let benchmarking = args.iter().any(|a| a == "--bench");
    let listing = args.iter().any(|a| a == "--list");
    let wanted = std::env::var("EDGEMARK_BENCH_P99").map_or(true, |v| v != "0");
    if !listing && wanted {
        // Under `cargo test --benches`, a smoke run of the same code.
        percentiles(if benchmarking { 4 * CHUNK } else { 64 });
    }
    Criterion::default().configure_from_args().final_summary();
}
