//! Throughput of writers recording at once into different requests of one
//! region.
//!
//! Every figure is wall-clock time per record over all writers, so
//! `threads_1 / threads_2` is the throughput ratio of two writers to one:
//!
//! - `scale/threads_1`, `scale/threads_2`: one or two writer threads of this
//!   process on one file-backed region.
//! - `scale/control_spin_threads_1`, `scale/control_spin_threads_2`: the
//!   same rounds with no region and no memory traffic, only a chain of
//!   integer arithmetic about as long as a record: the scaling the machine
//!   itself gives two threads during the run, against which the writers'
//!   scaling is read.
//! - `scale/processes_1`, `scale/processes_2`: one or two writer processes,
//!   each attached to the same region file. A writer process is this binary
//!   re-executed with `EDGEMARK_BENCH_ROLE=writer`, which `main` checks
//!   before criterion runs.
//!
//! Work runs in rounds. In a round every writer begins its own requests
//! (8192 of them, 65536 first writes), waits for a common start, records
//! every cell of its requests once, and closes them. Only the recording is
//! timed, as the span from the earliest writer's start to the latest one's
//! end. Beginning concurrently, the writers' requests interleave in the
//! slot array, so two writers' requests sit in adjacent slots: what the
//! slot padding must keep apart.

use std::hint::black_box;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

mod common;

use common::{MARKS_PER_REQUEST, ROLE, marks, region_dir};
use criterion::{Criterion, criterion_group};
use edgemark::clock::monotonic_ns;
use edgemark::{Outcome, Recorder, Token};

/// The region file a writer process attaches to.
const REGION: &str = "EDGEMARK_BENCH_REGION";

/// Requests each writer begins per round.
const REQUESTS_PER_ROUND: usize = 8192;
/// First writes each writer makes per round (at most).
const ROUND: usize = REQUESTS_PER_ROUND * MARKS_PER_REQUEST;
/// Most writers a bench uses.
const MAX_WRITERS: usize = 2;

/// A region with room for every writer's round.
fn create_region(path: &Path) -> Recorder {
    Recorder::builder()
        .edge(0, 1)
        .edge(1, 2)
        .slots((MAX_WRITERS * REQUESTS_PER_ROUND) as u32)
        .create(path)
        .expect("create the region")
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .sample_size(30)
}

/// One writer's part of one round: begin (untimed), then record `n` first
/// writes, then close (untimed). Returns the timed span in monotonic
/// nanoseconds.
fn writer_round(rec: &Recorder, n: usize, start: impl FnOnce()) -> (u64, u64) {
    let marks = marks();
    let tokens: Vec<Token> = (0..n.div_ceil(MARKS_PER_REQUEST))
        .map(|_| rec.begin().expect("a free slot"))
        .collect();
    start();
    let t0 = monotonic_ns();
    let mut ok = 0u64;
    for i in 0..n {
        let o = rec.record(tokens[i / MARKS_PER_REQUEST], marks[i % MARKS_PER_REQUEST]);
        ok += u64::from(o == Outcome::Recorded);
    }
    let t1 = monotonic_ns();
    assert_eq!(ok, n as u64, "every timed record must be a first write");
    for t in tokens {
        rec.close(t);
    }
    (t0, t1)
}

/// How many records writer `k` of `writers` makes out of `iters`.
fn share(iters: u64, writers: usize, k: usize) -> u64 {
    iters / writers as u64 + u64::from((k as u64) < iters % writers as u64)
}

/// The rounds' total span: per round, the latest end less the earliest
/// start.
fn total_span(spans: &[Vec<(u64, u64)>]) -> Duration {
    let rounds = spans.iter().map(Vec::len).max().unwrap_or(0);
    let mut ns = 0;
    for r in 0..rounds {
        let start = spans.iter().filter_map(|s| s.get(r)).map(|s| s.0).min();
        let end = spans.iter().filter_map(|s| s.get(r)).map(|s| s.1).max();
        if let (Some(a), Some(b)) = (start, end) {
            ns += b.saturating_sub(a);
        }
    }
    Duration::from_nanos(ns)
}

// ---------------------------------------------------------------------------
// Threads.

/// A reusable spinning barrier: the writers start within a few nanoseconds
/// of each other, which a sleeping barrier's wake-up would not give.
// A plain core atomic: bench scaffolding, not the protocol.
#[allow(clippy::disallowed_types)]
struct SpinBarrier {
    parties: u64,
    arrived: std::sync::atomic::AtomicU64,
    round: std::sync::atomic::AtomicU64,
}

#[allow(clippy::disallowed_types)]
impl SpinBarrier {
    fn new(parties: usize) -> SpinBarrier {
        SpinBarrier {
            parties: parties as u64,
            arrived: std::sync::atomic::AtomicU64::new(0),
            round: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn wait(&self) {
        use std::sync::atomic::Ordering::{AcqRel, Acquire, Release};
        // Acquire: the round we wait for ends with the last arrival's
        // Release store below.
        let round = self.round.load(Acquire);
        if self.arrived.fetch_add(1, AcqRel) + 1 == self.parties {
            self.arrived.store(0, Release);
            self.round.store(round + 1, Release);
        } else {
            while self.round.load(Acquire) == round {
                std::hint::spin_loop();
            }
        }
    }
}

/// Runs `iters` units of work split over `writers` threads in lockstep
/// rounds; `round(n, start)` does one writer's part of one round (`n`
/// units, timed from after `start` returns) and gives its span.
fn threads(
    writers: usize,
    iters: u64,
    round: impl Fn(usize, &dyn Fn()) -> (u64, u64) + Sync,
) -> Duration {
    let barrier = SpinBarrier::new(writers);
    let spans: Vec<Vec<(u64, u64)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..writers)
            .map(|k| {
                let (barrier, round) = (&barrier, &round);
                s.spawn(move || {
                    let mut left = share(iters, writers, k);
                    let rounds = share(iters, writers, 0).div_ceil(ROUND as u64);
                    let mut spans = Vec::new();
                    // Every writer takes part in every round, so the barrier
                    // always has all its parties.
                    for _ in 0..rounds {
                        let n = left.min(ROUND as u64) as usize;
                        spans.push(round(n, &|| barrier.wait()));
                        left -= n as u64;
                    }
                    spans
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("writer thread"))
            .collect()
    });
    total_span(&spans)
}

/// A control with no memory traffic at all: `n` units of a dependent
/// integer chain of about the record's length. Its scaling is what the
/// machine gives two threads during the run (other load, shared cores).
fn spin_round(n: usize, start: &dyn Fn()) -> (u64, u64) {
    start();
    let t0 = monotonic_ns();
    let mut x = black_box(1u64);
    for _ in 0..n {
        for _ in 0..16 {
            // `black_box` at every step, or the compiler folds the chain.
            x = black_box(
                x.wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407),
            );
        }
    }
    let t1 = monotonic_ns();
    black_box(x);
    (t0, t1)
}

fn scale_threads(c: &mut Criterion) {
    let dir = region_dir();
    let rec = create_region(&dir.path().join("scale.region"));
    let mut g = c.benchmark_group("scale");
    for writers in [1, 2] {
        g.bench_function(format!("threads_{writers}"), |b| {
            b.iter_custom(|iters| threads(writers, iters, |n, start| writer_round(&rec, n, start)))
        });
    }
    for writers in [1, 2] {
        g.bench_function(format!("control_spin_threads_{writers}"), |b| {
            b.iter_custom(|iters| threads(writers, iters, spin_round))
        });
    }
    g.finish();
}

// ---------------------------------------------------------------------------
// Processes.

/// A writer process, driven line by line over its standard input and
/// output: `round N` (begin requests for N records, answer `ready`), then
/// `go T` (spin until the monotonic clock reads T, record, answer
/// `done START END`, close), and `quit`.
struct Writer {
    child: Child,
    to: ChildStdin,
    from: BufReader<ChildStdout>,
}

impl Writer {
    fn spawn(region: &Path) -> Writer {
        let mut child = Command::new(std::env::current_exe().expect("this binary"))
            .env(ROLE, "writer")
            .env(REGION, region)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a writer process");
        let to = child.stdin.take().expect("stdin");
        let from = BufReader::new(child.stdout.take().expect("stdout"));
        Writer { child, to, from }
    }

    fn say(&mut self, line: &str) {
        writeln!(self.to, "{line}").expect("write to the writer");
        self.to.flush().expect("flush to the writer");
    }

    fn hear(&mut self) -> String {
        let mut line = String::new();
        self.from
            .read_line(&mut line)
            .expect("read from the writer");
        assert!(!line.is_empty(), "the writer process ended");
        line.trim_end().to_owned()
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if writeln!(self.to, "quit")
            .and_then(|_| self.to.flush())
            .is_err()
        {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The writer process's main loop (child role `writer`).
fn writer_main() {
    let path = PathBuf::from(std::env::var_os(REGION).expect("region path"));
    let rec = Recorder::attach(&path).expect("attach the region");
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut out = std::io::stdout().lock();
    let mut next = || lines.next().expect("a command").expect("read a command");
    loop {
        let cmd = next();
        let Some(n) = cmd.strip_prefix("round ") else {
            return;
        };
        let n: usize = n.parse().expect("a record count");
        let (t0, t1) = writer_round(&rec, n, || {
            writeln!(out, "ready").expect("answer");
            out.flush().expect("answer");
            let go = next();
            let at: u64 = go
                .strip_prefix("go ")
                .and_then(|t| t.parse().ok())
                .expect("go T");
            while monotonic_ns() < at {
                std::hint::spin_loop();
            }
        });
        writeln!(out, "done {t0} {t1}").expect("answer");
        out.flush().expect("answer");
    }
}

/// How long before the common start the `go` is sent: enough for a pipe
/// wake-up, so that the writers start together.
const GO_AHEAD: Duration = Duration::from_micros(500);

fn processes(writers: &mut [Writer], iters: u64) -> Duration {
    let w = writers.len();
    let mut left: Vec<u64> = (0..w).map(|k| share(iters, w, k)).collect();
    let mut spans = vec![Vec::new(); w];
    while left[0] > 0 {
        for (k, wr) in writers.iter_mut().enumerate() {
            let n = left[k].min(ROUND as u64);
            wr.say(&format!("round {n}"));
            left[k] -= n;
        }
        for wr in writers.iter_mut() {
            assert_eq!(wr.hear(), "ready");
        }
        let at = monotonic_ns() + GO_AHEAD.as_nanos() as u64;
        for wr in writers.iter_mut() {
            wr.say(&format!("go {at}"));
        }
        for (k, wr) in writers.iter_mut().enumerate() {
            let done = wr.hear();
            let mut f = done
                .strip_prefix("done ")
                .expect("done START END")
                .split(' ')
                .map(|x| x.parse::<u64>().expect("a time"));
            let (t0, t1) = (f.next().expect("start"), f.next().expect("end"));
            spans[k].push((t0, t1));
        }
    }
    total_span(&spans)
}

fn scale_processes(c: &mut Criterion) {
    let dir = region_dir();
    let path = dir.path().join("scale-processes.region");
    let _owner = create_region(&path);
    let mut g = c.benchmark_group("scale");
    for n in [1, 2] {
        let mut writers: Vec<Writer> = (0..n).map(|_| Writer::spawn(&path)).collect();
        g.bench_function(format!("processes_{n}"), |b| {
            b.iter_custom(|iters| processes(&mut writers, iters))
        });
    }
    g.finish();
}

criterion_group! {
    name = threads_group;
    config = config();
    targets = scale_threads
}
criterion_group! {
    name = processes_group;
    config = config();
    targets = scale_processes
}

fn main() {
    if let Some(role) = std::env::var_os(ROLE) {
        match role.to_str() {
            Some("writer") => writer_main(),
            other => panic!("unknown bench role {other:?}"),
        }
        return;
    }
    threads_group();
    processes_group();
    Criterion::default().configure_from_args().final_summary();
}
