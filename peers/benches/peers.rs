//! edgemark's record beside the tools a user would pick instead, in one
//! run, and the time until another process sees a record.
//!
//! Rows (criterion ids), every call a first event:
//!
//! - `peers/floor_clock_cas`: the least a record can cost, one read of
//!   `CLOCK_MONOTONIC` ([`edgemark::clock::monotonic_ns`]) plus one
//!   compare-and-swap on a fresh, zeroed heap cell.
//! - `peers/edgemark_record`: [`Recorder::record`] on a file-backed region
//!   of the default geometry on the memory-backed filesystem.
//! - `peers/edgemark_record_counter`: the same on a region created with
//!   [`Clock::Counter`].
//! - `peers/lttng_ust_id`: an enabled LTTng-UST tracepoint carrying one
//!   integer; LTTng stamps the time (its clock read is inside).
//! - `peers/lttng_ust_id_ts`: an enabled tracepoint carrying an integer and
//!   a timestamp the caller read ([`edgemark::clock::monotonic_ns`]).
//! - `peers/lttng_ust_disabled`: a tracepoint that no session enabled.
//! - `peers/iceoryx2_publish`: an iceoryx2 publish (loan, write 32 bytes,
//!   send) to a subscriber in another process that drains every sample.
//! - `peers/tracing_ring`: a `tracing` event with one integer field, to a
//!   global subscriber that stamps it and keeps it in an in-process ring.
//!
//! Every row runs in chunks of [`CHUNK`] calls whose set-up (fresh cells,
//! begun requests, a drained subscriber) is outside the timed part.
//! criterion measures each id on its own; then `main` runs the rows
//! *interleaved*: in each round every row runs one chunk, in an order that
//! rotates from round to round, and a block of [`ROUNDS_PER_BLOCK`] rounds
//! gives each row a block median (ns per call). The table printed is the
//! median, min and max of the block medians and each row's ratio to
//! `edgemark_record` (or, for the record rows, to the floor), all from the
//! same rounds: load that comes and goes hits every row alike.
//!
//! Then the visibility latency: the time from just before a call in this
//! process until another process observes it, edgemark (`record`, the
//! observer polls a read of the region) against iceoryx2 (`send`, the
//! observer polls `receive`), interleaved ping by ping; percentiles of
//! both.
//!
//! Under `cargo test --benches` (no `--bench` argument) everything runs
//! once, briefly, and asserts only that each row did its work.
//! `EDGEMARK_PEERS_ROUNDS`, `EDGEMARK_PEERS_PINGS` set the interleaved
//! rounds and the pings per system; `EDGEMARK_PEERS_CRITERION=0` skips the
//! criterion measurements.

// The bench's own counters and flags live in one process, outside the
// region and the loom models: std's atomics are the right tool here.
#![allow(clippy::disallowed_types)]

use std::hint::black_box;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use criterion::Criterion;
use edgemark::clock::{monotonic_ns, Clock};
use edgemark::{Edge, Event, Mark, Outcome, Recorder, Token};
use edgemark_peers::lttng;
use iceoryx2::prelude::*;

/// Selects a child role when the bench binary is re-executed.
const ROLE: &str = "EDGEMARK_PEERS_ROLE";
/// The iceoryx2 service names' prefix, unique per run (child roles).
const SERVICE: &str = "EDGEMARK_PEERS_SERVICE";
/// The visibility run's directory (child role `observer`).
const VIS_DIR: &str = "EDGEMARK_PEERS_VIS_DIR";

/// The default region's slots.
const SLOTS: usize = 4096;
/// Two edges times four events: the first writes one request can take.
const MARKS_PER_REQUEST: usize = 8;
/// Calls per chunk: every cell of every slot of a default region.
const CHUNK: usize = SLOTS * MARKS_PER_REQUEST;
/// Rounds per block of the interleaved run.
const ROUNDS_PER_BLOCK: usize = 10;
/// What the LTTng session keeps on disk per stream (older files are
/// rotated out), so that a long run does not fill memory.
const TRACE_MIB: u64 = 32;
/// The payload of an iceoryx2 sample: 32 bytes.
type Payload = [u64; 4];

/// The default region's edges.
const EDGES: [Edge; 2] = [Edge::new(0, 1), Edge::new(1, 2)];

/// The eight first writes of one request: both edges, all four events, the
/// producer event with a chunk sequence.
fn marks() -> [Mark; MARKS_PER_REQUEST] {
    std::array::from_fn(|i| {
        let mark = Mark::new(EDGES[i / 4], Event::ALL[i % 4]);
        if i % 4 == 0 {
            mark.chunk_seq(3)
        } else {
            mark
        }
    })
}

fn full_run() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------
// The rows.

/// One row: `chunk(n)` makes `n` calls and returns the time they took,
/// with any set-up outside the timed part.
trait Row {
    fn id(&self) -> &'static str;
    fn chunk(&mut self, n: usize) -> Duration;
    /// Events this row sent to an enabled LTTng tracepoint.
    fn traced(&self) -> u64 {
        0
    }
}

/// Zeroed heap cells, one per first write of a chunk.
// The floor is a plain core atomic on purpose, not the protocol: the sync
// facade does not apply.
struct Floor(Box<[std::sync::atomic::AtomicU64]>);

impl Floor {
    fn new() -> Floor {
        Floor(
            (0..CHUNK)
                .map(|_| std::sync::atomic::AtomicU64::new(0))
                .collect(),
        )
    }
}

impl Row for Floor {
    fn id(&self) -> &'static str {
        "floor_clock_cas"
    }

    fn chunk(&mut self, n: usize) -> Duration {
        use std::sync::atomic::Ordering;
        for c in &self.0[..n] {
            c.store(0, Ordering::Relaxed);
        }
        let start = Instant::now();
        let mut ok = 0u64;
        for c in &self.0[..n] {
            let now = monotonic_ns();
            // Release on success, Relaxed on failure: the orderings of
            // edgemark's record (nothing reads these cells).
            ok += u64::from(
                c.compare_exchange(0, now | 1, Ordering::Release, Ordering::Relaxed)
                    .is_ok(),
            );
        }
        let took = start.elapsed();
        assert_eq!(ok, n as u64, "every floor call is a first write");
        took
    }
}

/// `Recorder::record` on a file-backed region, every call a first write.
struct EdgemarkRow {
    id: &'static str,
    rec: Recorder,
    marks: [Mark; MARKS_PER_REQUEST],
    tokens: Vec<Token>,
}

impl EdgemarkRow {
    fn new(id: &'static str, dir: &Path, clock: Clock) -> EdgemarkRow {
        let rec = Recorder::builder()
            .edge(0, 1)
            .edge(1, 2)
            .slots(SLOTS as u32)
            .clock(clock)
            .create(dir.join(format!("peers-{clock}.region")))
            .expect("create the region");
        if rec.clock() != Some(clock) {
            println!("peers/{id}: the region fell back to {:?}", rec.clock());
        }
        EdgemarkRow {
            id,
            rec,
            marks: marks(),
            tokens: Vec::with_capacity(SLOTS),
        }
    }
}

impl Row for EdgemarkRow {
    fn id(&self) -> &'static str {
        self.id
    }

    fn chunk(&mut self, n: usize) -> Duration {
        self.tokens.clear();
        for _ in 0..n.div_ceil(MARKS_PER_REQUEST) {
            self.tokens.push(self.rec.begin().expect("a free slot"));
        }
        let start = Instant::now();
        let mut ok = 0u64;
        for i in 0..n {
            let o = self.rec.record(
                self.tokens[i / MARKS_PER_REQUEST],
                self.marks[i % MARKS_PER_REQUEST],
            );
            ok += u64::from(o == Outcome::Recorded);
        }
        let took = start.elapsed();
        assert_eq!(ok, n as u64, "every record is a first write");
        for t in self.tokens.drain(..) {
            self.rec.close(t);
        }
        took
    }
}

/// Which tracepoint an [`LttngRow`] fires.
#[derive(Clone, Copy)]
enum Tracepoint {
    Id,
    IdTs,
    Disabled,
}

struct LttngRow(Tracepoint, u64);

impl Row for LttngRow {
    fn id(&self) -> &'static str {
        match self.0 {
            Tracepoint::Id => "lttng_ust_id",
            Tracepoint::IdTs => "lttng_ust_id_ts",
            Tracepoint::Disabled => "lttng_ust_disabled",
        }
    }

    fn traced(&self) -> u64 {
        match self.0 {
            Tracepoint::Id | Tracepoint::IdTs => self.1,
            Tracepoint::Disabled => 0,
        }
    }

    fn chunk(&mut self, n: usize) -> Duration {
        let base = self.1;
        self.1 += n as u64;
        let start = Instant::now();
        match self.0 {
            Tracepoint::Id => {
                for i in 0..n as u64 {
                    lttng::id(black_box(base + i));
                }
            }
            Tracepoint::IdTs => {
                for i in 0..n as u64 {
                    lttng::id_ts(black_box(base + i), monotonic_ns());
                }
            }
            Tracepoint::Disabled => {
                for i in 0..n as u64 {
                    lttng::disabled(black_box(base + i));
                }
            }
        }
        start.elapsed()
    }
}

// ---------------------------------------------------------------------------
// iceoryx2: a publisher here, a subscriber process that drains every sample
// and reports how many it has received on a second service.

fn iox_node() -> Node<ipc::Service> {
    NodeBuilder::new()
        .create::<ipc::Service>()
        .expect("an iceoryx2 node")
}

fn service_name(prefix: &str, what: &str) -> ServiceName {
    format!("{prefix}/{what}")
        .as_str()
        .try_into()
        .expect("a service name")
}

/// The samples' service: the subscriber's buffer holds a whole chunk, so a
/// publish never finds it full and never recycles an unread sample (the
/// publisher also waits, outside the timed part, until the subscriber has
/// drained each chunk).
fn samples_service(
    node: &Node<ipc::Service>,
    prefix: &str,
) -> iceoryx2::service::port_factory::publish_subscribe::PortFactory<ipc::Service, Payload, ()> {
    node.service_builder(&service_name(prefix, "samples"))
        .publish_subscribe::<Payload>()
        .subscriber_max_buffer_size(CHUNK)
        .history_size(0)
        .max_publishers(1)
        .max_subscribers(1)
        .enable_safe_overflow(false)
        .open_or_create()
        .expect("the samples service")
}

fn acks_service(
    node: &Node<ipc::Service>,
    prefix: &str,
) -> iceoryx2::service::port_factory::publish_subscribe::PortFactory<ipc::Service, u64, ()> {
    node.service_builder(&service_name(prefix, "acks"))
        .publish_subscribe::<u64>()
        .subscriber_max_buffer_size(16)
        .history_size(0)
        .max_publishers(1)
        .max_subscribers(1)
        .open_or_create()
        .expect("the acks service")
}

/// Child role `iox-sub`: drain every sample, sleep briefly when there is
/// none, and publish the running count whenever it changes. Exits when the
/// publisher is gone (its parent closes our stdin).
fn iox_sub_main() {
    let prefix = std::env::var(SERVICE).expect("service prefix");
    let node = iox_node();
    let samples = samples_service(&node, &prefix);
    let sub = samples
        .subscriber_builder()
        .buffer_size(CHUNK)
        .create()
        .expect("a subscriber");
    let acks = acks_service(&node, &prefix);
    let ack = acks.publisher_builder().create().expect("an ack publisher");
    // The parent closes our stdin when it is done.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
            // Relaxed: a stop flag, nothing else is published with it.
            done.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    }
    println!("ready");
    std::io::stdout().flush().expect("stdout");
    let mut count = 0u64;
    let mut sum = 0u64;
    // Relaxed: see above.
    while !done.load(std::sync::atomic::Ordering::Relaxed) {
        let before = count;
        while let Some(s) = sub.receive().expect("receive") {
            sum = sum.wrapping_add(s.payload()[0]);
            count += 1;
        }
        if count != before {
            ack.send_copy(count).expect("send the count");
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    black_box(sum);
}

struct IoxRow {
    _node: Node<ipc::Service>,
    publisher: iceoryx2::port::publisher::Publisher<ipc::Service, Payload, ()>,
    acks: iceoryx2::port::subscriber::Subscriber<ipc::Service, u64, ()>,
    child: Child,
    sent: u64,
}

impl IoxRow {
    fn spawn(prefix: &str) -> IoxRow {
        let node = iox_node();
        let samples = samples_service(&node, prefix);
        let acks = acks_service(&node, prefix)
            .subscriber_builder()
            .create()
            .expect("an ack subscriber");
        let publisher = samples
            .publisher_builder()
            .max_loaned_samples(1)
            .create()
            .expect("a publisher");
        let mut child = Command::new(std::env::current_exe().expect("own path"))
            .env(ROLE, "iox-sub")
            .env(SERVICE, prefix)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the subscriber");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().expect("stdout")),
            &mut line,
        )
        .expect("the subscriber starts");
        assert_eq!(line.trim(), "ready", "the subscriber starts");
        // The subscriber connects when the publisher next updates its
        // connections: wait until a probe sample reaches it.
        let mut row = IoxRow {
            _node: node,
            publisher,
            acks,
            child,
            sent: 0,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let delivered = row
                .publisher
                .send_copy([u64::MAX; 4])
                .expect("send a probe");
            if delivered > 0 {
                row.sent += 1;
                row.wait_drained();
                break;
            }
            assert!(Instant::now() < deadline, "the subscriber never connected");
            std::thread::sleep(Duration::from_millis(5));
        }
        row
    }

    /// Waits until the subscriber has received every sample sent.
    fn wait_drained(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = 0;
        while seen < self.sent {
            while let Some(c) = self.acks.receive().expect("receive an ack") {
                seen = seen.max(*c);
            }
            assert!(
                Instant::now() < deadline,
                "the subscriber drained {seen} of {} samples",
                self.sent
            );
            std::hint::spin_loop();
        }
    }
}

impl Row for IoxRow {
    fn id(&self) -> &'static str {
        "iceoryx2_publish"
    }

    fn chunk(&mut self, n: usize) -> Duration {
        let base = self.sent;
        let start = Instant::now();
        let mut delivered = 0;
        for i in 0..n as u64 {
            let sample = self.publisher.loan_uninit().expect("loan a sample");
            let v = base + i;
            let sample = sample.write_payload([v, v, v, v]);
            delivered += sample.send().expect("send");
        }
        let took = start.elapsed();
        assert_eq!(delivered, n, "every sample reached the subscriber");
        self.sent += n as u64;
        self.wait_drained();
        took
    }
}

impl Drop for IoxRow {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------
// tracing, with an in-process ring subscriber.

// A plain ring in this process, not the protocol: the sync facade does not
// apply.
mod ring {
    use std::sync::atomic::{AtomicU64, Ordering};

    use tracing_core::field::{Field, Visit};
    use tracing_core::span::{Attributes, Id, Record};
    use tracing_core::{Event, Metadata, Subscriber};

    /// Entries in the ring (a power of two).
    const LEN: usize = 1 << 16;

    /// A subscriber that keeps every event in a ring of fixed entries: the
    /// callsite's address, a timestamp it reads, and the event's `id`
    /// field. Writers claim an entry with one `fetch_add`.
    // A plain ring in this process, not the protocol: the sync facade does
    // not apply.
    pub(super) struct Ring {
        head: AtomicU64,
        entries: Box<[[AtomicU64; 3]]>,
    }

    impl Ring {
        pub(super) fn new() -> Ring {
            Ring {
                head: AtomicU64::new(0),
                entries: (0..LEN)
                    .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                    .collect(),
            }
        }

        /// Events written so far.
        pub(super) fn written(&self) -> u64 {
            // Relaxed: a count read after the writers' calls returned on
            // this thread.
            self.head.load(Ordering::Relaxed)
        }
    }

    struct IdField(u64);

    impl Visit for IdField {
        fn record_u64(&mut self, field: &Field, value: u64) {
            if field.name() == "id" {
                self.0 = value;
            }
        }

        fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
    }

    /// The subscriber: the ring, shared with the bench that counts its
    /// entries.
    pub(super) struct RingSubscriber(pub(super) &'static Ring);

    impl Subscriber for RingSubscriber {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }

        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }

        fn record(&self, _: &Id, _: &Record<'_>) {}

        fn record_follows_from(&self, _: &Id, _: &Id) {}

        fn event(&self, event: &Event<'_>) {
            let now = edgemark::clock::monotonic_ns();
            let mut id = IdField(0);
            event.record(&mut id);
            // Relaxed throughout: each entry is written by the one thread
            // that claimed it; nothing reads the ring concurrently.
            let i = self.0.head.fetch_add(1, Ordering::Relaxed) as usize & (LEN - 1);
            let e = &self.0.entries[i];
            e[0].store(event.metadata() as *const _ as u64, Ordering::Relaxed);
            e[1].store(now, Ordering::Relaxed);
            e[2].store(id.0, Ordering::Relaxed);
        }

        fn enter(&self, _: &Id) {}

        fn exit(&self, _: &Id) {}
    }
}

struct TracingRow(&'static ring::Ring, u64);

impl TracingRow {
    fn install() -> TracingRow {
        let ring: &'static ring::Ring = Box::leak(Box::new(ring::Ring::new()));
        tracing::dispatcher::set_global_default(tracing::Dispatch::new(ring::RingSubscriber(ring)))
            .expect("no other global subscriber");
        TracingRow(ring, 0)
    }
}

impl Row for TracingRow {
    fn id(&self) -> &'static str {
        "tracing_ring"
    }

    fn chunk(&mut self, n: usize) -> Duration {
        let base = self.1;
        self.1 += n as u64;
        let before = self.0.written();
        let start = Instant::now();
        for i in 0..n as u64 {
            tracing::info!(id = black_box(base + i));
        }
        let took = start.elapsed();
        assert_eq!(
            self.0.written() - before,
            n as u64,
            "every event reached the ring"
        );
        took
    }
}

// ---------------------------------------------------------------------------
// criterion, then the interleaved rounds.

fn criterion_rows(c: &mut Criterion, rows: &mut [Box<dyn Row>]) {
    let mut g = c.benchmark_group("peers");
    for row in rows.iter_mut() {
        g.bench_function(row.id(), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let n = left.min(CHUNK as u64) as usize;
                    total += row.chunk(n);
                    left -= n as u64;
                }
                total
            })
        });
    }
    g.finish();
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The rows interleaved: every round runs one chunk of each row, the order
/// rotated by one each round; returns each row's block medians (ns/call).
fn interleaved(rows: &mut [Box<dyn Row>], rounds: usize, chunk: usize) -> Vec<Vec<f64>> {
    let k = rows.len();
    let mut blocks = vec![Vec::new(); k];
    let mut current = vec![Vec::new(); k];
    for round in 0..rounds {
        for j in 0..k {
            let r = (round + j) % k;
            let took = rows[r].chunk(chunk);
            current[r].push(took.as_nanos() as f64 / chunk as f64);
        }
        if (round + 1) % ROUNDS_PER_BLOCK == 0 || round + 1 == rounds {
            for (b, c) in blocks.iter_mut().zip(current.iter_mut()) {
                b.push(median(c));
                c.clear();
            }
        }
    }
    blocks
}

fn print_interleaved(rows: &[Box<dyn Row>], blocks: &[Vec<f64>], rounds: usize, chunk: usize) {
    let idx = |id: &str| rows.iter().position(|r| r.id() == id).expect("row");
    let med: Vec<f64> = blocks.iter().map(|b| median(&mut b.clone())).collect();
    let floor = med[idx("floor_clock_cas")];
    let record = med[idx("edgemark_record")];
    println!();
    println!(
        "peers, interleaved: {rounds} rounds of {chunk} calls per row, order rotated each round, \
         {} blocks of {ROUNDS_PER_BLOCK} rounds; ns per call, median (min-max) of block medians",
        blocks[0].len()
    );
    println!(
        "{:<32} {:>9} {:>19} {:>14} {:>12}",
        "id", "median", "block min-max", "vs edgemark", "vs floor"
    );
    for (row, (b, m)) in rows.iter().zip(blocks.iter().zip(&med)) {
        let lo = b.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = b.iter().copied().fold(0.0, f64::max);
        println!(
            "{:<32} {:>9.1} {:>9.1}-{:<9.1} {:>13.2}x {:>11.2}x",
            format!("peers/{}", row.id()),
            m,
            lo,
            hi,
            m / record,
            m / floor
        );
    }
    // The same ratios per block, so that the spread of a ratio is seen.
    let ratio = |a: &str, b: &str| -> (f64, f64, f64) {
        let mut r: Vec<f64> = blocks[idx(a)]
            .iter()
            .zip(&blocks[idx(b)])
            .map(|(x, y)| x / y)
            .collect();
        let lo = r.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = r.iter().copied().fold(0.0, f64::max);
        (median(&mut r), lo, hi)
    };
    println!("ratios, median (min-max) over blocks:");
    for (a, b) in [
        ("edgemark_record", "floor_clock_cas"),
        ("edgemark_record_counter", "edgemark_record"),
        ("lttng_ust_id", "edgemark_record"),
        ("lttng_ust_id_ts", "edgemark_record"),
        ("lttng_ust_disabled", "edgemark_record"),
        ("iceoryx2_publish", "edgemark_record"),
        ("tracing_ring", "edgemark_record"),
    ] {
        let (m, lo, hi) = ratio(a, b);
        println!("  {a:<24} / {b:<16} {m:>6.2}x ({lo:.2}-{hi:.2})");
    }
}

// ---------------------------------------------------------------------------
// Visibility: from just before a call here until another process sees it.

/// The control page both processes map: word 0 counts the pings the
/// observer has seen (it stores, this process waits for it).
// A plain word in a page of two processes' own: the sync facade is for the
// protocol and does not apply.
struct Control {
    map: memmap2::MmapRaw,
}

impl Control {
    fn open(path: &Path, create: bool) -> Control {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(create)
            .open(path)
            .expect("the control page");
        if create {
            f.set_len(4096).expect("size the control page");
        }
        Control {
            map: memmap2::MmapRaw::map_raw(&f).expect("map the control page"),
        }
    }

    fn seen(&self) -> &std::sync::atomic::AtomicU64 {
        let p = self.map.as_mut_ptr().cast::<u64>();
        assert!(p.is_aligned(), "a mapping is page-aligned");
        // SAFETY: 1. `p` is the start of a live mapping of 4096 bytes, kept
        // alive by `self.map` as long as the returned reference; 2. it is
        // aligned (checked above); 3. the word is only ever accessed
        // atomically, by this process and the observer.
        unsafe { std::sync::atomic::AtomicU64::from_ptr(p) }
    }
}

/// Which system ping `k` belongs to: pairs of pings, edgemark first in
/// even pairs, iceoryx2 first in odd ones.
fn is_edgemark_ping(k: usize) -> bool {
    (k / 2) % 2 == k % 2
}

/// Child role `observer`: attach the region read-only, subscribe, then for
/// each ping in turn poll until it is visible, take the time, and count it
/// seen. Writes the times (ns, `CLOCK_MONOTONIC`) to `observed.bin`.
fn observer_main() {
    use std::sync::atomic::Ordering;
    let dir = PathBuf::from(std::env::var_os(VIS_DIR).expect("visibility dir"));
    let prefix = std::env::var(SERVICE).expect("service prefix");
    let tokens: Vec<Token> = std::fs::read_to_string(dir.join("tokens"))
        .expect("the tokens")
        .lines()
        .map(|l| l.parse().expect("a token"))
        .collect();
    let pings = tokens.len() * MARKS_PER_REQUEST * 2;
    let rec = edgemark::Viewer::attach(dir.join("vis.region")).expect("attach the region");
    let node = iox_node();
    let sub = samples_service(&node, &prefix)
        .subscriber_builder()
        .create()
        .expect("a subscriber");
    let control = Control::open(&dir.join("control"), false);
    let mut seen_at = Vec::with_capacity(pings);
    // The publisher's probe (see `visibility`) tells that we are connected.
    loop {
        if let Some(s) = sub.receive().expect("receive") {
            assert_eq!(s.payload()[0], u64::MAX, "the probe comes first");
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    println!("ready");
    std::io::stdout().flush().expect("stdout");
    if std::env::var_os("EDGEMARK_PEERS_WARM").is_some() {
        for t in &tokens {
            black_box(rec.snapshot(*t));
        }
    }
    // The harness's own buffers are touched before the pings, so that
    // their first-touch faults stay out of the measured time.
    let mut polls = vec![1u32; pings];
    polls.fill(0);
    seen_at.resize(pings, 1);
    seen_at.clear();
    let faults_before = minor_faults();
    let (mut em, mut iox) = (0usize, 0u64);
    for (k, polls) in polls.iter_mut().enumerate() {
        if is_edgemark_ping(k) {
            let token = tokens[em / MARKS_PER_REQUEST];
            let edge = EDGES[(em % MARKS_PER_REQUEST) / 4];
            let event = Event::ALL[em % 4];
            loop {
                let s = rec.snapshot(token);
                *polls += 1;
                if s.segment(edge, 0).and_then(|s| s.get(event)).is_some() {
                    break;
                }
                std::hint::spin_loop();
            }
            em += 1;
        } else {
            loop {
                *polls += 1;
                if let Some(s) = sub.receive().expect("receive") {
                    assert_eq!(s.payload()[0], iox, "samples arrive in order");
                    break;
                }
                std::hint::spin_loop();
            }
            iox += 1;
        }
        seen_at.push(monotonic_ns());
        // Release: publishes nothing but the count itself; pairs with the
        // Acquire load in `visibility`, which starts the next ping only
        // after this one was seen.
        control.seen().store(k as u64 + 1, Ordering::Release);
    }
    let faults = minor_faults() - faults_before;
    let mut bytes: Vec<u8> = seen_at.iter().flat_map(|t| t.to_le_bytes()).collect();
    bytes.extend(polls.iter().flat_map(|p| u64::from(*p).to_le_bytes()));
    bytes.extend(faults.to_le_bytes());
    std::fs::write(dir.join("observed.bin"), bytes).expect("write the times");
}

fn minor_faults() -> u64 {
    // SAFETY: `getrusage` writes one `rusage` into the zeroed value we own.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u.ru_minflt as u64
    }
}

fn percentiles(v: &mut [u64]) -> [u64; 5] {
    v.sort_unstable();
    let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)];
    [at(0.5), at(0.9), at(0.99), at(0.999), v[v.len() - 1]]
}

/// Runs `pings` pings of each system, interleaved, and prints both
/// systems' percentiles.
fn visibility(prefix: &str, pings: usize) {
    use std::sync::atomic::Ordering;
    let pings = pings.div_ceil(MARKS_PER_REQUEST) * MARKS_PER_REQUEST;
    let requests = pings / MARKS_PER_REQUEST;
    let dir = tempfile::tempdir_in(edgemark::default_dir()).expect("a directory");
    let rec = Recorder::builder()
        .edge(0, 1)
        .edge(1, 2)
        .slots(requests as u32)
        .create(dir.path().join("vis.region"))
        .expect("create the region");
    let tokens: Vec<Token> = (0..requests)
        .map(|_| rec.begin().expect("a free slot"))
        .collect();
    let text: String = tokens.iter().map(|t| format!("{t}\n")).collect();
    std::fs::write(dir.path().join("tokens"), text).expect("write the tokens");
    let control = Control::open(&dir.path().join("control"), true);
    let node = iox_node();
    let publisher = samples_service(&node, prefix)
        .publisher_builder()
        .create()
        .expect("a publisher");
    let mut child = Command::new(std::env::current_exe().expect("own path"))
        .env(ROLE, "observer")
        .env(SERVICE, prefix)
        .env(VIS_DIR, dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the observer");
    // The observer's subscriber connects at one of the publisher's next
    // sends: send probes until one is delivered; the observer drains it
    // before it says it is ready.
    let deadline = Instant::now() + Duration::from_secs(20);
    while publisher.send_copy([u64::MAX; 4]).expect("send a probe") == 0 {
        assert!(Instant::now() < deadline, "the observer never connected");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().expect("stdout")),
        &mut line,
    )
    .expect("the observer starts");
    assert_eq!(line.trim(), "ready", "the observer starts");
    let marks = marks();
    let mut sent_at = vec![1u64; 2 * pings];
    sent_at.clear();
    let (mut em, mut iox) = (0usize, 0u64);
    for k in 0..2 * pings {
        let t0 = monotonic_ns();
        if is_edgemark_ping(k) {
            let o = rec.record(
                tokens[em / MARKS_PER_REQUEST],
                marks[em % MARKS_PER_REQUEST],
            );
            assert_eq!(o, Outcome::Recorded);
            em += 1;
        } else {
            let s = publisher.loan_uninit().expect("loan");
            let s = s.write_payload([iox, t0, 0, 0]);
            assert_eq!(s.send().expect("send"), 1, "the observer is subscribed");
            iox += 1;
        }
        sent_at.push(t0);
        // Acquire: pairs with the observer's Release store of the count.
        while control.seen().load(Ordering::Acquire) <= k as u64 {
            std::hint::spin_loop();
        }
    }
    let status = child.wait().expect("the observer exits");
    assert!(status.success(), "the observer failed: {status}");
    let bytes = std::fs::read(dir.path().join("observed.bin")).expect("the times");
    let words: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect();
    assert_eq!(
        words.len(),
        4 * pings + 1,
        "a time and a poll count per ping"
    );
    let (seen_at, rest) = words.split_at(2 * pings);
    let (polls, faults) = rest.split_at(2 * pings);
    println!(
        "diag: the observer's minor page faults during the pings: {}",
        faults[0]
    );
    for sys in [true, false] {
        let mid: Vec<u64> = sent_at
            .iter()
            .zip(seen_at)
            .enumerate()
            .filter(|(k, _)| is_edgemark_ping(*k) == sys)
            .map(|(_, (a, b))| b.saturating_sub(*a))
            .collect();
        let band = |lo: u64, hi: u64| mid.iter().filter(|l| **l >= lo && **l < hi).count();
        println!(
            "diag: {} pings 1-2 us {}, 2-5 us {}, 5-20 us {}, 20-200 us {}, over 200 us {}",
            if sys { "edgemark" } else { "iceoryx2" },
            band(1000, 2000),
            band(2000, 5000),
            band(5000, 20000),
            band(20000, 200000),
            band(200000, u64::MAX)
        );
    }
    let ppe: Vec<u64> = (0..2 * pings)
        .filter(|k| is_edgemark_ping(*k))
        .map(|k| polls[k])
        .collect();
    let ppi: Vec<u64> = (0..2 * pings)
        .filter(|k| !is_edgemark_ping(*k))
        .map(|k| polls[k])
        .collect();
    println!(
        "diag: polls per ping edgemark mean {:.1} max {}, iceoryx2 mean {:.1} max {}",
        ppe.iter().sum::<u64>() as f64 / ppe.len() as f64,
        ppe.iter().max().unwrap(),
        ppi.iter().sum::<u64>() as f64 / ppi.len() as f64,
        ppi.iter().max().unwrap()
    );
    let (mut em_lat, mut iox_lat) = (Vec::new(), Vec::new());
    for (k, (t0, t1)) in sent_at.iter().zip(seen_at).enumerate() {
        let lat = t1.saturating_sub(*t0);
        if is_edgemark_ping(k) {
            em_lat.push(lat);
        } else {
            iox_lat.push(lat);
        }
    }
    println!();
    println!(
        "visibility: from just before the call until another process sees it, \
         {pings} pings of each, interleaved; ns"
    );
    println!(
        "{:<44} {:>8} {:>8} {:>8} {:>8} {:>9}",
        "", "p50", "p90", "p99", "p99.9", "max"
    );
    for (name, v) in [
        (
            "edgemark record -> snapshot in another process",
            &mut em_lat,
        ),
        ("iceoryx2 send -> receive in another process", &mut iox_lat),
    ] {
        let p = percentiles(v);
        println!(
            "{name:<44} {:>8} {:>8} {:>8} {:>8} {:>9}",
            p[0], p[1], p[2], p[3], p[4]
        );
    }
}

fn main() {
    // iceoryx2 warns in every process that it found no config file and
    // uses its defaults, which is what the bench wants; IOX2_LOG_LEVEL
    // still overrides this.
    set_log_level_from_env_or(LogLevel::Error);
    match std::env::var(ROLE).as_deref() {
        Ok("iox-sub") => return iox_sub_main(),
        Ok("observer") => return observer_main(),
        _ => {}
    }
    let full = full_run();
    let prefix = format!("edgemark-peers-{}", std::process::id());
    let dir = tempfile::tempdir_in(edgemark::default_dir()).expect("a region directory");
    let session = lttng::Session::start(dir.path(), TRACE_MIB, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("LTTng-UST: {e}"));

    let mut rows: Vec<Box<dyn Row>> = vec![
        Box::new(Floor::new()),
        Box::new(EdgemarkRow::new(
            "edgemark_record",
            dir.path(),
            Clock::Monotonic,
        )),
        Box::new(EdgemarkRow::new(
            "edgemark_record_counter",
            dir.path(),
            Clock::Counter,
        )),
        Box::new(LttngRow(Tracepoint::Id, 0)),
        Box::new(LttngRow(Tracepoint::IdTs, 0)),
        Box::new(LttngRow(Tracepoint::Disabled, 0)),
        Box::new(IoxRow::spawn(&prefix)),
        Box::new(TracingRow::install()),
    ];

    if env_usize("EDGEMARK_PEERS_CRITERION", 1) != 0 {
        let mut c = Criterion::default()
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2))
            .sample_size(20)
            .configure_from_args();
        criterion_rows(&mut c, &mut rows);
        c.final_summary();
    }

    let rounds = env_usize("EDGEMARK_PEERS_ROUNDS", if full { 200 } else { 1 });
    let chunk = if full { CHUNK } else { 64 };
    let blocks = interleaved(&mut rows, rounds, chunk);
    print_interleaved(&rows, &blocks, rounds, chunk);
    let traced: u64 = rows.iter().map(|r| r.traced()).sum();
    drop(rows);

    let counts = session
        .stop_and_count()
        .unwrap_or_else(|e| panic!("LTTng-UST: {e}"));
    println!(
        "LTTng-UST session: {traced} events fired at enabled tracepoints, {} in the trace \
         (which keeps the last {TRACE_MIB} MiB per stream), {} discarded by the tracer",
        counts.recorded, counts.discarded
    );
    assert!(
        counts.recorded > 0,
        "no LTTng event reached the trace: the tracepoints measured nothing"
    );
    session
        .destroy()
        .unwrap_or_else(|e| panic!("LTTng-UST: {e}"));

    let pings = env_usize("EDGEMARK_PEERS_PINGS", if full { 20_000 } else { 64 });
    visibility(&format!("{prefix}/vis"), pings);
}
