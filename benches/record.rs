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
//! The first-write benches lay fresh cells (or fresh request states) in
//! chunks of 4096 requests x 8 marks outside the timed part (`iter_custom`),
//! so every timed call is a first write, and the owner benches let the owner
//! drain between chunks outside the timed part, so the sender is timed with
//! the owner keeping up.
//!
//! After criterion's groups, `main` prints per-call latency percentiles (p50
//! to p99.9) of the same six operations, each call bracketed by serialised
//! time-stamp-counter reads; see `docs/benchmarks.md`. Set
//! `EDGEMARK_BENCH_P99=0` to skip that table.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hint::black_box;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod common;

use common::{EDGES, MARKS_PER_REQUEST, ROLE, marks};
use criterion::{Criterion, criterion_group};
use edgemark::clock::{Clock, monotonic_ns};
use edgemark::{Mark, Outcome, Recorder, Token};

/// The owner's socket path (child role `uds-owner`).
const OWNER_SOCKET: &str = "EDGEMARK_BENCH_OWNER_SOCKET";
/// The sender's socket path, where the owner replies.
const SENDER_SOCKET: &str = "EDGEMARK_BENCH_SENDER_SOCKET";

/// The default region's slots.
const SLOTS: usize = 4096;
/// First writes per chunk: every cell of every slot of a default region.
const CHUNK: usize = SLOTS * MARKS_PER_REQUEST;
/// The owner thread's channel capacity: the sender blocks when it is full.
const CHANNEL_CAPACITY: usize = 1024;

/// A file-backed region of the default geometry on the memory-backed
/// filesystem (where production regions live).
fn region(dir: &Path) -> Recorder {
    region_with(dir, Clock::Monotonic)
}

/// [`region`] with the shared clock `clock`.
fn region_with(dir: &Path, clock: Clock) -> Recorder {
    Recorder::builder()
        .edge(0, 1)
        .edge(1, 2)
        .slots(SLOTS as u32)
        .clock(clock)
        .create(dir.join(format!("record-{clock}.region")))
        .expect("create the region")
}

fn region_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(edgemark::default_dir()).expect("a region directory")
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
}

// ---------------------------------------------------------------------------
// The floor.

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

    /// Zeroes the first `n` cells (outside the timed part).
    fn reset(&self, n: usize) {
        for c in &self.0[..n] {
            c.store(0, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// One clock read plus one compare-and-swap on cell `i`, with the
    /// orderings edgemark's record uses (Release on success, Relaxed on
    /// failure).
    #[inline(always)]
    fn record(&self, i: usize) -> bool {
        use std::sync::atomic::Ordering;
        let now = monotonic_ns();
        self.0[i]
            .compare_exchange(0, now | 1, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    /// [`FloorCells::record`] with the counter read as a counter region
    /// reads it (`lfence; rdtsc`) instead of the clock.
    #[inline(always)]
    fn record_tsc(&self, i: usize) -> bool {
        use std::sync::atomic::Ordering;
        let now = tsc();
        self.0[i]
            .compare_exchange(0, now | 1, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }
}

/// The time-stamp counter as a counter region's record reads it.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn tsc() -> u64 {
    // SAFETY: `lfence` and `rdtsc` exist on every x86_64 processor and touch
    // no memory.
    unsafe {
        std::arch::x86_64::_mm_lfence();
        std::arch::x86_64::_rdtsc()
    }
}

/// Elsewhere there is no counter: the floor falls back to the clock.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn tsc() -> u64 {
    monotonic_ns()
}

/// Runs `iters` first writes in chunks: `lay(n)` prepares `n` fresh cells
/// outside the timed part and returns the state the timed `run` consumes;
/// `run` returns how many calls succeeded, which must be all of them.
fn chunked<S>(
    iters: u64,
    mut lay: impl FnMut(usize) -> S,
    mut run: impl FnMut(&S, usize) -> u64,
    mut clear: impl FnMut(S),
) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        let state = lay(n);
        let start = Instant::now();
        let ok = run(&state, n);
        total += start.elapsed();
        assert_eq!(ok, n as u64, "every timed call must be a first write");
        clear(state);
        left -= n as u64;
    }
    total
}

// ---------------------------------------------------------------------------
// edgemark.

/// Begins enough requests for `n` first writes.
fn begin_for(rec: &Recorder, n: usize) -> Vec<Token> {
    (0..n.div_ceil(MARKS_PER_REQUEST))
        .map(|_| rec.begin().expect("a free slot"))
        .collect()
}

#[inline(always)]
fn edgemark_first_writes(rec: &Recorder, tokens: &[Token], marks: &[Mark; 8], n: usize) -> u64 {
    let mut ok = 0;
    for i in 0..n {
        let o = rec.record(tokens[i / MARKS_PER_REQUEST], marks[i % MARKS_PER_REQUEST]);
        ok += u64::from(o == Outcome::Recorded);
    }
    ok
}

fn close_all(rec: &Recorder, tokens: Vec<Token>) {
    for t in tokens {
        rec.close(t);
    }
}

// ---------------------------------------------------------------------------
// The upstream in-process design: a mutex-guarded map in the request state.

/// What an observation is keyed by: from, to, segment, event.
type Key = (u32, u32, u32, u8);
/// What it keeps: the timestamp (or elapsed time) and the chunk sequence.
type Value = (u64, Option<u64>);

/// The eight keys of one request's first writes, in the order of
/// [`marks`], with the chunk sequence each carries.
fn keys() -> [(Key, Option<u64>); MARKS_PER_REQUEST] {
    std::array::from_fn(|i| {
        let e = EDGES[i / 4];
        let chunk = (i % 4 == 0).then_some(3);
        ((e.from, e.to, 0, (i % 4) as u8), chunk)
    })
}

/// One request's state in the upstream design: the origin and a
/// mutex-guarded map of first observations, created empty when the request
/// begins.
struct UpstreamRequest {
    origin_ns: u64,
    edges: Mutex<HashMap<Key, Value>>,
}

impl UpstreamRequest {
    fn new() -> UpstreamRequest {
        UpstreamRequest {
            origin_ns: monotonic_ns(),
            edges: Mutex::new(HashMap::new()),
        }
    }

    /// Reads the clock and keeps the observation if it is the first for its
    /// key.
    #[inline(always)]
    fn record(&self, key: Key, chunk: Option<u64>) -> bool {
        let elapsed = monotonic_ns().saturating_sub(self.origin_ns);
        let mut map = self.edges.lock().unwrap_or_else(|e| e.into_inner());
        match map.entry(key) {
            Entry::Vacant(v) => {
                v.insert((elapsed, chunk));
                true
            }
            Entry::Occupied(_) => false,
        }
    }
}

fn upstream_requests(n: usize) -> Vec<UpstreamRequest> {
    (0..n.div_ceil(MARKS_PER_REQUEST))
        .map(|_| UpstreamRequest::new())
        .collect()
}

// ---------------------------------------------------------------------------
// Owners: the observation travels to whoever owns the request's state.

/// One observation as a worker would send it to the owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Observation {
    token: u128,
    from: u32,
    to: u32,
    segment: u32,
    event: u8,
    chunk_seq: Option<u64>,
    at_ns: u64,
}

impl Observation {
    /// Observation `i` of the request `request`, stamped now.
    #[inline(always)]
    fn now(request: u128, keys: &[(Key, Option<u64>); 8], i: usize) -> Observation {
        let ((from, to, segment, event), chunk_seq) = keys[i % MARKS_PER_REQUEST];
        Observation {
            token: request,
            from,
            to,
            segment,
            event,
            chunk_seq,
            at_ns: monotonic_ns(),
        }
    }
}

/// The owner's state: per request, a map of first observations.
#[derive(Default)]
struct OwnerState(HashMap<u128, HashMap<Key, Value>>);

impl OwnerState {
    /// First write wins.
    fn apply(&mut self, o: &Observation) -> bool {
        let request = self.0.entry(o.token).or_default();
        match request.entry((o.from, o.to, o.segment, o.event)) {
            Entry::Vacant(v) => {
                v.insert((o.at_ns, o.chunk_seq));
                true
            }
            Entry::Occupied(_) => false,
        }
    }
}

enum ToOwner {
    Observation(Observation),
    /// Closes every request so far and acknowledges (outside timed parts).
    Flush(crossbeam_channel::Sender<()>),
}

/// An owner thread fed by a bounded channel.
struct ChannelOwner {
    tx: Option<crossbeam_channel::Sender<ToOwner>>,
    thread: Option<JoinHandle<()>>,
}

impl ChannelOwner {
    fn spawn() -> ChannelOwner {
        let (tx, rx) = crossbeam_channel::bounded::<ToOwner>(CHANNEL_CAPACITY);
        let thread = std::thread::spawn(move || {
            let mut state = OwnerState::default();
            for msg in rx {
                match msg {
                    ToOwner::Observation(o) => {
                        black_box(state.apply(&o));
                    }
                    ToOwner::Flush(ack) => {
                        state.0.clear();
                        let _ = ack.send(());
                    }
                }
            }
        });
        ChannelOwner {
            tx: Some(tx),
            thread: Some(thread),
        }
    }

    #[inline(always)]
    fn send(&self, o: Observation) -> bool {
        self.tx
            .as_ref()
            .is_some_and(|tx| tx.send(ToOwner::Observation(o)).is_ok())
    }

    fn flush(&self) {
        let (ack, done) = crossbeam_channel::bounded(1);
        let tx = self.tx.as_ref().expect("owner running");
        tx.send(ToOwner::Flush(ack)).expect("owner running");
        done.recv().expect("owner acknowledges");
    }
}

impl Drop for ChannelOwner {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A datagram: 48 bytes, little-endian.
const MSG_LEN: usize = 48;
const KIND_OBSERVATION: u8 = 0;
const KIND_FLUSH: u8 = 1;
const KIND_QUIT: u8 = 2;

#[inline(always)]
fn encode(kind: u8, o: &Observation) -> [u8; MSG_LEN] {
    let mut b = [0u8; MSG_LEN];
    b[0..16].copy_from_slice(&o.token.to_le_bytes());
    b[16..20].copy_from_slice(&o.from.to_le_bytes());
    b[20..24].copy_from_slice(&o.to.to_le_bytes());
    b[24..28].copy_from_slice(&o.segment.to_le_bytes());
    b[28] = o.event;
    b[29] = kind;
    b[30] = u8::from(o.chunk_seq.is_some());
    b[32..40].copy_from_slice(&o.at_ns.to_le_bytes());
    b[40..48].copy_from_slice(&o.chunk_seq.unwrap_or(0).to_le_bytes());
    b
}

fn decode(b: &[u8; MSG_LEN]) -> (u8, Observation) {
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let o = Observation {
        token: u128::from_le_bytes(b[0..16].try_into().expect("16 bytes")),
        from: u32_at(16),
        to: u32_at(20),
        segment: u32_at(24),
        event: b[28],
        chunk_seq: (b[30] != 0).then(|| u64_at(40)),
        at_ns: u64_at(32),
    };
    (b[29], o)
}

/// The owner process's main loop (child role `uds-owner`): apply every
/// observation, first write wins; on a flush, close every request and
/// acknowledge.
fn uds_owner_main() {
    let own = std::env::var_os(OWNER_SOCKET).expect("owner socket path");
    let sender = std::env::var_os(SENDER_SOCKET).expect("sender socket path");
    let sock = UnixDatagram::bind(&own).expect("bind the owner socket");
    sock.send_to(b"ready", &sender).expect("tell the sender");
    let mut state = OwnerState::default();
    let mut buf = [0u8; MSG_LEN];
    loop {
        let n = sock.recv(&mut buf).expect("receive");
        assert_eq!(n, MSG_LEN, "a whole observation per datagram");
        let (kind, o) = decode(&buf);
        match kind {
            KIND_OBSERVATION => {
                black_box(state.apply(&o));
            }
            KIND_FLUSH => {
                state.0.clear();
                sock.send_to(b"flushed", &sender).expect("acknowledge");
            }
            _ => return,
        }
    }
}

/// A connected datagram socket to an owner process.
struct UdsOwner {
    sock: UnixDatagram,
    child: Child,
    _dir: tempfile::TempDir,
}

impl UdsOwner {
    fn spawn() -> UdsOwner {
        let dir = tempfile::tempdir().expect("a socket directory");
        let own = dir.path().join("owner.sock");
        let sender = dir.path().join("sender.sock");
        let sock = UnixDatagram::bind(&sender).expect("bind the sender socket");
        let child = Command::new(std::env::current_exe().expect("this binary"))
            .env(ROLE, "uds-owner")
            .env(OWNER_SOCKET, &own)
            .env(SENDER_SOCKET, &sender)
            .spawn()
            .expect("start the owner process");
        sock.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let mut buf = [0u8; 16];
        sock.recv(&mut buf).expect("the owner process starts");
        sock.set_read_timeout(None).expect("no timeout");
        sock.connect(&own).expect("connect to the owner");
        UdsOwner {
            sock,
            child,
            _dir: dir,
        }
    }

    /// Sends one observation; blocks while the owner's queue is full.
    #[inline(always)]
    fn send(&self, o: &Observation) -> bool {
        matches!(self.sock.send(&encode(KIND_OBSERVATION, o)), Ok(MSG_LEN))
    }

    fn flush(&self) {
        let none = Observation::now(0, &keys(), 0);
        self.sock
            .send(&encode(KIND_FLUSH, &none))
            .expect("send a flush");
        let mut buf = [0u8; 16];
        self.sock.recv(&mut buf).expect("the owner acknowledges");
    }
}

impl Drop for UdsOwner {
    fn drop(&mut self) {
        let none = Observation::now(0, &keys(), 0);
        if self.sock.send(&encode(KIND_QUIT, &none)).is_err() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------
// Criterion groups.

/// In one thread: the floor, edgemark's first write and duplicate, and the
/// mutex-guarded map.
fn uncontended(c: &mut Criterion) {
    let mut g = c.benchmark_group("record");
    let marks = marks();
    let keys = keys();

    let cells = FloorCells::new();
    g.bench_function("floor_clock_cas", |b| {
        b.iter_custom(|iters| {
            chunked(
                iters,
                |n| cells.reset(n),
                |_, n| (0..n).map(|i| u64::from(cells.record(i))).sum(),
                |_| {},
            )
        })
    });

    g.bench_function("floor_tsc_cas", |b| {
        b.iter_custom(|iters| {
            chunked(
                iters,
                |n| cells.reset(n),
                |_, n| (0..n).map(|i| u64::from(cells.record_tsc(i))).sum(),
                |_| {},
            )
        })
    });

    let dir = region_dir();
    let rec = region(dir.path());
    g.bench_function("edgemark", |b| {
        b.iter_custom(|iters| {
            chunked(
                iters,
                |n| begin_for(&rec, n),
                |tokens, n| edgemark_first_writes(&rec, tokens, &marks, n),
                |tokens| close_all(&rec, tokens),
            )
        })
    });

    let counter = region_with(dir.path(), Clock::Counter);
    if counter.clock() != Some(Clock::Counter) {
        eprintln!(
            "record/edgemark_counter: the counter is not trusted here; the region uses the monotonic clock"
        );
    }
    g.bench_function("edgemark_counter", |b| {
        b.iter_custom(|iters| {
            chunked(
                iters,
                |n| begin_for(&counter, n),
                |tokens, n| edgemark_first_writes(&counter, tokens, &marks, n),
                |tokens| close_all(&counter, tokens),
            )
        })
    });

    let token = rec.begin().expect("a free slot");
    for m in marks {
        assert_eq!(rec.record(token, m), Outcome::Recorded);
    }
    let mut i = 0usize;
    g.bench_function("edgemark_duplicate", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            rec.record(token, marks[i % MARKS_PER_REQUEST])
        })
    });
    assert_eq!(rec.record(token, marks[0]), Outcome::Duplicate);
    rec.close(token);

    g.bench_function("mutex_map", |b| {
        b.iter_custom(|iters| {
            chunked(
                iters,
                upstream_requests,
                |reqs, n| {
                    let mut ok = 0;
                    for i in 0..n {
                        let (key, chunk) = keys[i % MARKS_PER_REQUEST];
                        ok += u64::from(reqs[i / MARKS_PER_REQUEST].record(key, chunk));
                    }
                    ok
                },
                drop,
            )
        })
    });
    g.finish();
}

/// Across a thread or a process: the observation sent to an owner.
fn to_owner(c: &mut Criterion) {
    let mut g = c.benchmark_group("record");
    let keys = keys();
    let mut request: u128 = 0;

    let owner = ChannelOwner::spawn();
    g.bench_function("channel_to_owner", |b| {
        b.iter_custom(|iters| {
            chunked(
                iters,
                |_| {
                    request += SLOTS as u128;
                    request
                },
                |base, n| {
                    let mut ok = 0;
                    for i in 0..n {
                        let o = Observation::now(base + (i / MARKS_PER_REQUEST) as u128, &keys, i);
                        ok += u64::from(owner.send(o));
                    }
                    ok
                },
                |_| owner.flush(),
            )
        })
    });
    drop(owner);

    let owner = UdsOwner::spawn();
    g.bench_function("uds_to_owner", |b| {
        b.iter_custom(|iters| {
            chunked(
                iters,
                |_| {
                    request += SLOTS as u128;
                    request
                },
                |base, n| {
                    let mut ok = 0;
                    for i in 0..n {
                        let o = Observation::now(base + (i / MARKS_PER_REQUEST) as u128, &keys, i);
                        ok += u64::from(owner.send(&o));
                    }
                    ok
                },
                |_| owner.flush(),
            )
        })
    });
    drop(owner);
    g.finish();
}

criterion_group! {
    name = uncontended_group;
    config = config();
    targets = uncontended
}
criterion_group! {
    name = to_owner_group;
    config = config();
    targets = to_owner
}

// ---------------------------------------------------------------------------
// Per-call percentiles.

/// A cheap, serialised time source for bracketing single calls.
struct Ticks {
    /// Ticks per nanosecond.
    per_ns: f64,
    #[cfg(not(target_arch = "x86_64"))]
    base: Instant,
}

impl Ticks {
    /// Measures the tick rate against `Instant` over 50 ms.
    fn calibrate() -> Ticks {
        let mut t = Ticks {
            per_ns: 1.0,
            #[cfg(not(target_arch = "x86_64"))]
            base: Instant::now(),
        };
        let (i0, t0) = (Instant::now(), t.now());
        while i0.elapsed() < Duration::from_millis(50) {
            std::hint::spin_loop();
        }
        let (t1, ns) = (t.now(), i0.elapsed().as_nanos() as f64);
        t.per_ns = (t1 - t0) as f64 / ns;
        t
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn now(&self) -> u64 {
        use std::arch::x86_64::{_mm_lfence, _rdtsc};
        // SAFETY: `lfence` and `rdtsc` exist on every x86_64 processor and
        // touch no memory; the fences keep the read from moving across the
        // measured call.
        unsafe {
            _mm_lfence();
            let t = _rdtsc();
            _mm_lfence();
            t
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    #[inline(always)]
    fn now(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }
}

/// Per-call samples, in ticks.
struct Samples(Vec<u64>);

impl Samples {
    fn with_capacity(n: usize) -> Samples {
        Samples(Vec::with_capacity(n))
    }

    /// The `q` quantile in nanoseconds, less the bracket's own cost.
    fn quantile_ns(&mut self, q: f64, ticks: &Ticks, bracket: u64) -> f64 {
        self.0.sort_unstable();
        let i = ((self.0.len() as f64 - 1.0) * q).round() as usize;
        self.0[i].saturating_sub(bracket) as f64 / ticks.per_ns
    }
}

/// Times `calls` single calls, in chunks that `lay` prepares outside the
/// timing, with `call(state, i)` the measured call.
fn per_call<S>(
    ticks: &Ticks,
    calls: usize,
    mut lay: impl FnMut(usize) -> S,
    mut call: impl FnMut(&S, usize) -> bool,
    mut clear: impl FnMut(S),
) -> Samples {
    let mut out = Samples::with_capacity(calls);
    let mut left = calls;
    while left > 0 {
        let n = left.min(CHUNK);
        let state = lay(n);
        for i in 0..n {
            let t0 = ticks.now();
            let ok = call(&state, i);
            let t1 = ticks.now();
            assert!(ok, "every timed call must succeed");
            out.0.push(t1 - t0);
        }
        clear(state);
        left -= n;
    }
    out
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Prints p50, p90, p99 and p99.9 of single calls of each benchmarked
/// operation.
fn percentiles(calls: usize) {
    let ticks = Ticks::calibrate();
    let marks = marks();
    let keys = keys();

    let mut empty = per_call(&ticks, calls, |_| (), |_, _| true, |_| {});
    let bracket = {
        empty.0.sort_unstable();
        empty.0[empty.0.len() / 2]
    };
    // The counter's step: every reading is a multiple of it (some
    // processors advance the time-stamp counter in coarse steps).
    let step = empty.0.iter().fold(0, |g, &x| gcd(g, x));

    let mut rows: Vec<(&str, Samples)> = Vec::new();
    let cells = FloorCells::new();
    rows.push((
        "record/floor_clock_cas",
        per_call(
            &ticks,
            calls,
            |n| cells.reset(n),
            |_, i| cells.record(i),
            |_| {},
        ),
    ));
    rows.push((
        "record/floor_tsc_cas",
        per_call(
            &ticks,
            calls,
            |n| cells.reset(n),
            |_, i| cells.record_tsc(i),
            |_| {},
        ),
    ));
    let dir = region_dir();
    let rec = region(dir.path());
    let counter = region_with(dir.path(), Clock::Counter);
    rows.push((
        "record/edgemark_counter",
        per_call(
            &ticks,
            calls,
            |n| begin_for(&counter, n),
            |tokens, i| {
                counter.record(tokens[i / MARKS_PER_REQUEST], marks[i % MARKS_PER_REQUEST])
                    == Outcome::Recorded
            },
            |tokens| close_all(&counter, tokens),
        ),
    ));
    rows.push((
        "record/edgemark",
        per_call(
            &ticks,
            calls,
            |n| begin_for(&rec, n),
            |tokens, i| {
                rec.record(tokens[i / MARKS_PER_REQUEST], marks[i % MARKS_PER_REQUEST])
                    == Outcome::Recorded
            },
            |tokens| close_all(&rec, tokens),
        ),
    ));
    rows.push((
        "record/edgemark_duplicate",
        per_call(
            &ticks,
            calls,
            |_| {
                let t = rec.begin().expect("a free slot");
                for m in marks {
                    rec.record(t, m);
                }
                t
            },
            |t, i| rec.record(*t, marks[i % MARKS_PER_REQUEST]) == Outcome::Duplicate,
            |t| {
                rec.close(t);
            },
        ),
    ));
    rows.push((
        "record/mutex_map",
        per_call(
            &ticks,
            calls,
            upstream_requests,
            |reqs, i| {
                let (key, chunk) = keys[i % MARKS_PER_REQUEST];
                reqs[i / MARKS_PER_REQUEST].record(key, chunk)
            },
            drop,
        ),
    ));
    let mut request: u128 = 1 << 64;
    let owner = ChannelOwner::spawn();
    rows.push((
        "record/channel_to_owner",
        per_call(
            &ticks,
            calls,
            |_| {
                request += SLOTS as u128;
                request
            },
            |base, i| owner.send(Observation::now(base + (i / 8) as u128, &keys, i)),
            |_| owner.flush(),
        ),
    ));
    drop(owner);
    let owner = UdsOwner::spawn();
    rows.push((
        "record/uds_to_owner",
        per_call(
            &ticks,
            calls,
            |_| {
                request += SLOTS as u128;
                request
            },
            |base, i| owner.send(&Observation::now(base + (i / 8) as u128, &keys, i)),
            |_| owner.flush(),
        ),
    ));
    drop(owner);

    println!();
    println!(
        "per-call latency, ns ({calls} calls each; the bracket's own median cost, {:.1} ns, \
         subtracted; the counter advances in steps of {:.1} ns)",
        bracket as f64 / ticks.per_ns,
        step as f64 / ticks.per_ns
    );
    println!(
        "{:<28} {:>9} {:>9} {:>9} {:>9}",
        "operation", "p50", "p90", "p99", "p99.9"
    );
    for (name, mut s) in rows {
        let q = |s: &mut Samples, q| s.quantile_ns(q, &ticks, bracket);
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

fn main() {
    if let Some(role) = std::env::var_os(ROLE) {
        match role.to_str() {
            Some("uds-owner") => uds_owner_main(),
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
