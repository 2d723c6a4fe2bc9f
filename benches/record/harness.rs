//! The harnesses an [`Operation`] runs under, each written once for every
//! operation: [`Timed`], criterion's mean per call, and [`PerCall`], each
//! call bracketed by serialised time-stamp-counter reads and reported as
//! percentiles.
//!
//! Both lay the calls out in chunks outside the timed part, so that every
//! timed call finds what it needs (a fresh cell, a begun request).

use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion};

use crate::common::tsc::Ticks;

/// One benchmarked operation: what a chunk of calls needs, laid outside the
/// timed part; the timed call; and what is undone after the chunk, again
/// outside the timed part.
pub(crate) trait Operation {
    /// What one chunk's calls use (fresh cells, begun requests).
    type Chunk;

    /// Prepares `n` calls.
    fn lay(&mut self, n: usize) -> Self::Chunk;

    /// Call `i` of the chunk, the timed part: true if it did what the
    /// operation measures (a first write; for a duplicate, a refusal).
    fn call(&self, chunk: &Self::Chunk, i: usize) -> bool;

    /// Undoes the chunk.
    fn clear(&mut self, chunk: Self::Chunk);
}

/// Something that runs operations and reports each under its id.
pub(crate) trait Harness {
    /// Runs `op` and reports it as `id` in the harness's group.
    fn run(&mut self, id: &str, op: &mut impl Operation);
}

/// Criterion: the mean time per call, chunk by chunk (`iter_custom`).
pub(crate) struct Timed<'a> {
    group: BenchmarkGroup<'a, WallTime>,
    chunk: usize,
}

impl<'a> Timed<'a> {
    /// Criterion's group `group`, laying at most `chunk` calls at a time.
    pub(crate) fn new(c: &'a mut Criterion, group: &str, chunk: usize) -> Timed<'a> {
        Timed {
            group: c.benchmark_group(group),
            chunk,
        }
    }

    /// Ends criterion's group.
    pub(crate) fn finish(self) {
        self.group.finish();
    }
}

impl Harness for Timed<'_> {
    fn run(&mut self, id: &str, op: &mut impl Operation) {
        let chunk = self.chunk;
        self.group
            .bench_function(id, |b| b.iter_custom(|iters| timed(op, iters, chunk)));
    }
}

/// Runs `iters` calls of `op` in chunks of at most `chunk`, and gives the
/// time of the calls alone.
fn timed<O: Operation>(op: &mut O, iters: u64, chunk: usize) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(chunk as u64) as usize;
        let laid = op.lay(n);
        let start = Instant::now();
        let ok: u64 = (0..n).map(|i| u64::from(op.call(&laid, i))).sum();
        total += start.elapsed();
        assert_eq!(ok, n as u64, "every timed call must succeed");
        op.clear(laid);
        left -= n as u64;
    }
    total
}

/// Per-call latency: every call bracketed by two fenced counter reads,
/// the bracket's own median cost subtracted; p50 to p99.9 per operation.
pub(crate) struct PerCall {
    ticks: Ticks,
    group: String,
    calls: usize,
    chunk: usize,
    /// The median cost of an empty bracket, in ticks.
    bracket: u64,
    /// The counter's step: every reading is a multiple of it (some
    /// processors advance the time-stamp counter in coarse steps).
    step: u64,
    rows: Vec<(String, Samples)>,
}

impl PerCall {
    /// `calls` calls per operation, at most `chunk` laid at a time, reported
    /// as `group/id`. Calibrates the counter and measures the empty bracket.
    pub(crate) fn new(group: &str, calls: usize, chunk: usize) -> PerCall {
        let mut h = PerCall {
            ticks: Ticks::calibrate(),
            group: group.to_owned(),
            calls,
            chunk,
            bracket: 0,
            step: 0,
            rows: Vec::new(),
        };
        let mut empty = h.samples(&mut Empty);
        empty.0.sort_unstable();
        h.bracket = empty.0[empty.0.len() / 2];
        h.step = empty.0.iter().fold(0, |g, &x| gcd(g, x));
        h
    }

    fn samples<O: Operation>(&self, op: &mut O) -> Samples {
        let mut out = Samples(Vec::with_capacity(self.calls));
        let mut left = self.calls;
        while left > 0 {
            let n = left.min(self.chunk);
            let laid = op.lay(n);
            for i in 0..n {
                let t0 = self.ticks.now();
                let ok = op.call(&laid, i);
                let t1 = self.ticks.now();
                assert!(ok, "every timed call must succeed");
                out.0.push(t1 - t0);
            }
            op.clear(laid);
            left -= n;
        }
        out
    }

    /// Prints p50, p90, p99 and p99.9 of each operation run so far.
    pub(crate) fn print(self) {
        let (ticks, bracket) = (&self.ticks, self.bracket);
        println!();
        println!(
            "per-call latency, ns ({} calls each; the bracket's own median cost, {:.1} ns, \
             subtracted; the counter advances in steps of {:.1} ns)",
            self.calls,
            bracket as f64 / ticks.per_ns,
            self.step as f64 / ticks.per_ns
        );
        println!(
            "{:<28} {:>9} {:>9} {:>9} {:>9}",
            "operation", "p50", "p90", "p99", "p99.9"
        );
        for (name, mut s) in self.rows {
            let q = |s: &mut Samples, q| s.quantile_ns(q, ticks, bracket);
            println!(
                "{:<28} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
                name,
                q(&mut s, 0.50),
                q(&mut s, 0.90),
                q(&mut s, 0.99),
                q(&mut s, 0.999)
            );
        }
    }
}

impl Harness for PerCall {
    fn run(&mut self, id: &str, op: &mut impl Operation) {
        let samples = self.samples(op);
        self.rows.push((format!("{}/{id}", self.group), samples));
    }
}

/// The empty bracket: a call that does nothing.
struct Empty;

impl Operation for Empty {
    type Chunk = ();

    fn lay(&mut self, _: usize) {}

    #[inline(always)]
    fn call(&self, _: &(), _: usize) -> bool {
        true
    }

    fn clear(&mut self, _: ()) {}
}

/// Per-call samples, in ticks.
struct Samples(Vec<u64>);

impl Samples {
    /// The `q` quantile in nanoseconds, less the bracket's own cost.
    fn quantile_ns(&mut self, q: f64, ticks: &Ticks, bracket: u64) -> f64 {
        self.0.sort_unstable();
        let i = ((self.0.len() as f64 - 1.0) * q).round() as usize;
        self.0[i].saturating_sub(bracket) as f64 / ticks.per_ns
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}
