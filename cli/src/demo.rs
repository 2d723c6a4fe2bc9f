//! `edgemark demo`: a simulated three-stage pipeline (0 -> 1 -> 2, in the
//! manner of thinker -> talker -> code2wav) recording into one region from
//! real worker processes.
//!
//! The orchestrator (this process) creates the region, starts one worker
//! process per stage, begins requests at a target concurrency and hands each
//! worker the request's token inside its dispatch message (a line on the
//! worker's standard input). Stage workers pass chunks to the next stage
//! over Unix datagram sockets (the "connector"); each worker has a receive
//! thread, an engine thread and a send thread, and records the four events
//! from whichever thread observes them. Nothing is sent back to the
//! orchestrator except "request done". The orchestrator closes every request
//! (completed or aborted) and summarises the final snapshots.

use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use edgemark::{Edge, Event, Mark, Outcome, Recorder, Snapshot, Token};

/// Stages of the demo pipeline.
pub(crate) const STAGES: u32 = 3;

/// Options of `edgemark demo`.
#[derive(Clone, Debug)]
pub(crate) struct DemoOptions {
    pub(crate) requests: u32,
    pub(crate) concurrency: u32,
    pub(crate) json: Option<PathBuf>,
    pub(crate) keep: bool,
    pub(crate) seed: u64,
    pub(crate) quiet: bool,
}

/// A small deterministic generator (SplitMix64): the demo's jitter.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// `base` milliseconds plus or minus `spread`, as a duration.
    pub(crate) fn ms(&mut self, base: f64, spread: f64) -> Duration {
        let v = base + spread * (2.0 * self.unit() - 1.0);
        Duration::from_secs_f64(v.max(0.05) / 1000.0)
    }
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

/// What the orchestrator tells every stage about a request.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Plan {
    /// Non-empty chunks stage 0 produces.
    chunks: u32,
    /// Stage 0 sends an empty heartbeat before its first chunk.
    heartbeat: bool,
    /// Stage 0's first put fails and is retried.
    fail_first_send: bool,
    /// Stage 1 fails to admit the first chunk it receives.
    fail_first_admission: bool,
}

impl Plan {
    fn encode(&self) -> String {
        format!(
            "{} {} {} {}",
            self.chunks,
            u8::from(self.heartbeat),
            u8::from(self.fail_first_send),
            u8::from(self.fail_first_admission)
        )
    }
    fn decode(w: &[&str]) -> Option<Plan> {
        let b = |s: &str| s == "1";
        Some(Plan {
            chunks: w.first()?.parse().ok()?,
            heartbeat: b(w.get(1)?),
            fail_first_send: b(w.get(2)?),
            fail_first_admission: b(w.get(3)?),
        })
    }
}

/// A chunk on the connector from stage `from` to stage `from + 1`.
#[derive(Clone, Copy, Debug)]
struct Chunk {
    token: Token,
    segment: u32,
    seq: u64,
    nonempty: bool,
    last: bool,
}

impl Chunk {
    fn encode(&self) -> String {
        format!(
            "{} {} {} {} {}",
            self.token,
            self.segment,
            self.seq,
            u8::from(self.nonempty),
            u8::from(self.last)
        )
    }
    fn decode(s: &str) -> Option<Chunk> {
        let w: Vec<&str> = s.split_whitespace().collect();
        Some(Chunk {
            token: w.first()?.parse().ok()?,
            segment: w.get(1)?.parse().ok()?,
            seq: w.get(2)?.parse().ok()?,
            nonempty: *w.get(3)? == "1",
            last: *w.get(4)? == "1",
        })
    }
}

fn socket_path(dir: &Path, stage: u32) -> PathBuf {
    dir.join(format!("stage{stage}.sock"))
}

// ---------------------------------------------------------------------------
// The orchestrator.

struct Workers {
    children: Vec<Child>,
    stdins: Vec<ChildStdin>,
}

impl Workers {
    fn dispatch(&mut self, line: &str) -> Result<()> {
        for s in &mut self.stdins {
            writeln!(s, "{line}").context("a stage worker exited")?;
            s.flush()?;
        }
        Ok(())
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stdins.clear();
        for c in &mut self.children {
            // Workers exit on end of input; give them a moment, then insist.
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What a worker reports on its standard output.
enum Report {
    Done(Token),
    Outcomes(BTreeMap<String, u64>),
}

/// The result of a demo run.
pub(crate) struct DemoResult {
    pub(crate) finals: Vec<(Snapshot, bool)>,
    pub(crate) outcomes: BTreeMap<String, u64>,
    pub(crate) region: Option<PathBuf>,
    pub(crate) elapsed: Duration,
    pub(crate) counters: edgemark::Counters,
}

pub(crate) fn run(opts: &DemoOptions) -> Result<DemoResult> {
    if opts.requests == 0 || opts.concurrency == 0 {
        bail!("--requests and --concurrency must be at least 1");
    }
    let started = Instant::now();
    let dir = tempfile::Builder::new()
        .prefix("edgemark-demo-")
        .tempdir_in(edgemark::default_dir())
        .context("cannot make a directory for the demo region")?;
    let path = dir.path().join("demo.region");
    let rec = Recorder::builder()
        .edge(0, 1)
        .edge(1, 2)
        .slots(opts.concurrency.max(64).next_power_of_two())
        .create(&path)?;

    let exe = std::env::current_exe().context("cannot find the edgemark executable")?;
    let (tx, rx) = mpsc::channel::<Report>();
    let mut workers = Workers {
        children: Vec::new(),
        stdins: Vec::new(),
    };
    for stage in 0..STAGES {
        let mut child = Command::new(&exe)
            .arg("stage-worker")
            .arg("--stage")
            .arg(stage.to_string())
            .arg("--region")
            .arg(&path)
            .arg("--dir")
            .arg(dir.path())
            .arg("--seed")
            .arg((opts.seed ^ (u64::from(stage + 1) * 0x1000_0001)).to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start a stage worker")?;
        workers.stdins.push(child.stdin.take().expect("piped"));
        let out = BufReader::new(child.stdout.take().expect("piped"));
        workers.children.push(child);
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let w: Vec<&str> = line.split_whitespace().collect();
                let report = match w.first().copied() {
                    Some("done") => w.get(1).and_then(|t| t.parse().ok()).map(Report::Done),
                    Some("outcomes") => {
                        let map = w[1..]
                            .iter()
                            .filter_map(|kv| kv.split_once('='))
                            .filter_map(|(k, v)| Some((k.to_owned(), v.parse().ok()?)))
                            .collect();
                        Some(Report::Outcomes(map))
                    }
                    _ => None,
                };
                if let Some(r) = report {
                    if tx.send(r).is_err() {
                        break;
                    }
                }
            }
        });
    }
    drop(tx);
    // Wait until every stage is listening on its connector socket.
    let ready_by = Instant::now() + Duration::from_secs(10);
    while !(1..STAGES).all(|s| socket_path(dir.path(), s).exists()) {
        if Instant::now() > ready_by {
            bail!("the stage workers did not start");
        }
        std::thread::sleep(Duration::from_millis(5));
    }

    let progress = if opts.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        let p = indicatif::ProgressBar::new(u64::from(opts.requests));
        p.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} {bar:40} {pos}/{len} requests  {elapsed_precise} {msg}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        p
    };

    let mut rng = Rng::new(opts.seed);
    let mut begun = 0u32;
    // Open requests: token -> (began, abort at, second segment at, aborted).
    struct Open {
        abort_at: Option<Instant>,
        segment_at: Option<Instant>,
    }
    let mut open: HashMap<Token, Open> = HashMap::new();
    let mut finals: Vec<(Snapshot, bool)> = Vec::with_capacity(opts.requests as usize);
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while finals.len() < opts.requests as usize {
        if Instant::now() > deadline {
            bail!(
                "the demo pipeline stalled with {} requests open",
                open.len()
            );
        }
        while begun < opts.requests && (open.len() as u32) < opts.concurrency {
            let token = match rec.begin() {
                Ok(t) => t,
                Err(o) => bail!("begin refused: {o}"),
            };
            begun += 1;
            let plan = Plan {
                chunks: 4 + (rng.next() % 5) as u32,
                heartbeat: rng.chance(0.3),
                fail_first_send: rng.chance(0.08),
                fail_first_admission: rng.chance(0.05),
            };
            let now = Instant::now();
            let abort_at = rng.chance(0.06).then(|| now + rng.ms(60.0, 50.0));
            let segment_at =
                (abort_at.is_none() && rng.chance(0.1)).then(|| now + rng.ms(90.0, 20.0));
            workers.dispatch(&format!("req {token} {}", plan.encode()))?;
            open.insert(
                token,
                Open {
                    abort_at,
                    segment_at,
                },
            );
        }
        // Control operations that are due.
        let now = Instant::now();
        let mut aborted = Vec::new();
        for (t, o) in open.iter_mut() {
            if o.segment_at.is_some_and(|at| at <= now) {
                o.segment_at = None;
                // A new input segment: fence the old one on both edges, then
                // tell the stages.
                rec.start_segment(*t, Edge::new(0, 1), 1);
                rec.start_segment(*t, Edge::new(1, 2), 1);
                workers.dispatch(&format!("seg {t} 1"))?;
            }
            if o.abort_at.is_some_and(|at| at <= now) {
                aborted.push(*t);
            }
        }
        for t in aborted {
            open.remove(&t);
            // The abort path closes the request exactly as completion does.
            finals.push((rec.close(t), true));
            workers.dispatch(&format!("abort {t}"))?;
            progress.inc(1);
        }
        match rx.recv_timeout(Duration::from_millis(2)) {
            Ok(Report::Done(t)) => {
                if open.remove(&t).is_some() {
                    finals.push((rec.close(t), false));
                    progress.inc(1);
                }
            }
            Ok(Report::Outcomes(_)) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("every stage worker exited"),
        }
    }
    progress.finish_and_clear();
    // End of input tells the workers to report their outcomes and exit.
    workers.stdins.clear();
    let mut reported = 0;
    let report_by = Instant::now() + Duration::from_secs(10);
    while reported < STAGES && Instant::now() < report_by {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Report::Outcomes(map)) => {
                reported += 1;
                for (k, v) in map {
                    *outcomes.entry(k).or_default() += v;
                }
            }
            Ok(Report::Done(_)) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    if reported < STAGES {
        bail!("only {reported} of {STAGES} stage workers reported their outcomes");
    }
    drop(workers);

    if let Some(p) = &opts.json {
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?,
        );
        for (s, _) in &finals {
            serde_json::to_writer(&mut f, s)?;
            writeln!(f)?;
        }
        f.flush()?;
    }
    let counters = rec.counters();
    let region = if opts.keep {
        let kept = dir.keep();
        Some(kept.join("demo.region"))
    } else {
        None
    };
    Ok(DemoResult {
        finals,
        outcomes,
        region,
        elapsed: started.elapsed(),
        counters,
    })
}

// ---------------------------------------------------------------------------
// A stage worker.

/// A step the engine thread performs when it is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Stage 0: emit chunk `n` (heartbeats and the terminal marker included).
    Emit { token: Token, n: u32 },
    /// Stages 1 and 2: produce output for an admitted chunk.
    Produce { chunk: ChunkKey },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ChunkKey {
    token: Token,
    segment: u32,
    seq: u64,
    nonempty: bool,
    last: bool,
}

#[derive(Debug, PartialEq, Eq)]
struct Due(Instant, u64, Step);

impl Ord for Due {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // A min-heap on time, then insertion order.
        (o.0, o.1).cmp(&(self.0, self.1))
    }
}
impl PartialOrd for Due {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

#[derive(Debug, Default)]
struct ReqState {
    plan: Option<Plan>,
    segment: u32,
    admitted: u32,
    admission_failed: bool,
    sent_failed: bool,
}

struct Shared {
    stage: u32,
    rec: Recorder,
    requests: Mutex<HashMap<Token, ReqState>>,
    queue: Mutex<(BinaryHeap<Due>, u64)>,
    wake: Condvar,
    outcomes: Mutex<BTreeMap<&'static str, u64>>,
    rng: Mutex<Rng>,
}

impl Shared {
    fn record(
        &self,
        token: Token,
        edge: Edge,
        segment: u32,
        event: Event,
        nonempty: bool,
        seq: Option<u64>,
    ) {
        let mut mark = Mark::new(edge, event).segment(segment).meaningful(nonempty);
        if let Some(s) = seq {
            mark = mark.chunk_seq(s);
        }
        let o = self.rec.record(token, mark);
        self.count(o);
    }
    fn count(&self, o: Outcome) {
        *self
            .outcomes
            .lock()
            .expect("outcomes")
            .entry(o.name())
            .or_default() += 1;
    }
    fn ms(&self, base: f64, spread: f64) -> Duration {
        self.rng.lock().expect("rng").ms(base, spread)
    }
    fn schedule(&self, after: Duration, step: Step) {
        let mut q = self.queue.lock().expect("queue");
        q.1 += 1;
        let n = q.1;
        q.0.push(Due(Instant::now() + after, n, step));
        self.wake.notify_one();
    }
    fn segment_of(&self, token: Token) -> Option<u32> {
        self.requests
            .lock()
            .expect("requests")
            .get(&token)
            .map(|r| r.segment)
    }
}

/// Runs one stage worker until its standard input ends.
pub(crate) fn stage_worker(stage: u32, region: &Path, dir: &Path, seed: u64) -> Result<()> {
    if stage >= STAGES {
        bail!("stage {stage} is not a stage of the demo pipeline");
    }
    let rec = Recorder::attach(region)?;
    let shared = Arc::new(Shared {
        stage,
        rec,
        requests: Mutex::new(HashMap::new()),
        queue: Mutex::new((BinaryHeap::new(), 0)),
        wake: Condvar::new(),
        outcomes: Mutex::new(BTreeMap::new()),
        rng: Mutex::new(Rng::new(seed)),
    });
    let (send_tx, send_rx) = mpsc::channel::<Chunk>();

    // The receive thread: chunks from the previous stage.
    if stage > 0 {
        let sock =
            UnixDatagram::bind(socket_path(dir, stage)).context("cannot bind the connector")?;
        let sh = Arc::clone(&shared);
        std::thread::spawn(move || receive_loop(&sh, &sock));
    }
    // The send thread: puts chunks to the next stage.
    if stage + 1 < STAGES {
        let sh = Arc::clone(&shared);
        let next = socket_path(dir, stage + 1);
        std::thread::spawn(move || send_loop(&sh, &next, &send_rx));
    }
    // The engine thread.
    {
        let sh = Arc::clone(&shared);
        let send_tx = send_tx.clone();
        std::thread::spawn(move || engine_loop(&sh, &send_tx));
    }

    // Dispatch messages from the orchestrator.
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line?;
        let w: Vec<&str> = line.split_whitespace().collect();
        let Some(token) = w.get(1).and_then(|t| t.parse::<Token>().ok()) else {
            continue;
        };
        match w[0] {
            "req" => {
                let plan = Plan::decode(&w[2..]);
                shared.requests.lock().expect("requests").insert(
                    token,
                    ReqState {
                        plan,
                        ..ReqState::default()
                    },
                );
                if stage == 0 {
                    // Prefill before the first chunk.
                    shared.schedule(shared.ms(55.0, 25.0), Step::Emit { token, n: 0 });
                }
            }
            "seg" => {
                if let Some(r) = shared.requests.lock().expect("requests").get_mut(&token) {
                    r.segment = w.get(2).and_then(|s| s.parse().ok()).unwrap_or(r.segment);
                }
            }
            "abort" => {
                shared.requests.lock().expect("requests").remove(&token);
            }
            _ => {}
        }
    }
    // End of input: report and exit.
    let outcomes = shared.outcomes.lock().expect("outcomes").clone();
    let mut out = std::io::stdout().lock();
    let kv: Vec<String> = outcomes.iter().map(|(k, v)| format!("{k}={v}")).collect();
    writeln!(out, "outcomes {}", kv.join(" "))?;
    out.flush()?;
    Ok(())
}

fn engine_loop(sh: &Shared, send: &mpsc::Sender<Chunk>) {
    loop {
        let step = {
            let mut q = sh.queue.lock().expect("queue");
            loop {
                let now = Instant::now();
                match q.0.peek() {
                    Some(Due(at, _, _)) if *at <= now => break q.0.pop().expect("peeked").2,
                    Some(Due(at, _, _)) => {
                        let wait = *at - now;
                        q = sh.wake.wait_timeout(q, wait).expect("queue").0;
                    }
                    None => q = sh.wake.wait(q).expect("queue"),
                }
            }
        };
        match step {
            Step::Emit { token, n } => emit(sh, send, token, n),
            Step::Produce { chunk } => produce(sh, send, chunk),
        }
    }
}

/// Stage 0's model loop: an optional empty heartbeat, the non-empty chunks,
/// then an empty terminal marker.
fn emit(sh: &Shared, send: &mpsc::Sender<Chunk>, token: Token, n: u32) {
    let Some((plan, segment)) = sh
        .requests
        .lock()
        .expect("requests")
        .get(&token)
        .and_then(|r| Some((r.plan?, r.segment)))
    else {
        return; // aborted
    };
    let heartbeats = u32::from(plan.heartbeat);
    let total = heartbeats + plan.chunks + 1;
    let nonempty = n >= heartbeats && n < total - 1;
    let last = n == total - 1;
    let seq = u64::from(n);
    sh.record(
        token,
        Edge::new(0, 1),
        segment,
        Event::ProducerFirstNonemptyEmit,
        nonempty,
        Some(seq),
    );
    let _ = send.send(Chunk {
        token,
        segment,
        seq,
        nonempty,
        last,
    });
    if !last {
        sh.schedule(sh.ms(14.0, 6.0), Step::Emit { token, n: n + 1 });
    }
}

/// Stages 1 and 2: turn an admitted chunk into output.
fn produce(sh: &Shared, send: &mpsc::Sender<Chunk>, c: ChunkKey) {
    if sh.segment_of(c.token).is_none() {
        return; // aborted
    }
    let edge_in = Edge::new(sh.stage - 1, sh.stage);
    sh.record(
        c.token,
        edge_in,
        c.segment,
        Event::ConsumerFirstNonemptyOutput,
        c.nonempty,
        None,
    );
    if sh.stage + 1 < STAGES {
        // The talker's output is the next stage's input.
        let edge_out = Edge::new(sh.stage, sh.stage + 1);
        sh.record(
            c.token,
            edge_out,
            c.segment,
            Event::ProducerFirstNonemptyEmit,
            c.nonempty,
            Some(c.seq),
        );
        let _ = send.send(Chunk {
            token: c.token,
            segment: c.segment,
            seq: c.seq,
            nonempty: c.nonempty,
            last: c.last,
        });
    } else if c.last {
        sh.requests.lock().expect("requests").remove(&c.token);
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "done {}", c.token);
        let _ = out.flush();
    }
}

fn send_loop(sh: &Shared, next: &Path, chunks: &mpsc::Receiver<Chunk>) {
    let sock = match UnixDatagram::unbound() {
        Ok(s) => s,
        Err(_) => return,
    };
    let edge = Edge::new(sh.stage, sh.stage + 1);
    for c in chunks {
        // The connector's put: a failed first put is retried.
        let fail = c.nonempty && {
            let mut reqs = sh.requests.lock().expect("requests");
            match reqs.get_mut(&c.token) {
                Some(r)
                    if r.plan.is_some_and(|p| p.fail_first_send)
                        && !r.sent_failed
                        && sh.stage == 0 =>
                {
                    r.sent_failed = true;
                    true
                }
                _ => false,
            }
        };
        if fail {
            std::thread::sleep(sh.ms(3.0, 1.0));
            // The failed put completed nothing: it is not meaningful.
            sh.record(
                c.token,
                edge,
                c.segment,
                Event::EdgeFirstSendComplete,
                false,
                None,
            );
        }
        std::thread::sleep(sh.ms(1.6, 0.8));
        let sent = sock.send_to(c.encode().as_bytes(), next).is_ok();
        sh.record(
            c.token,
            edge,
            c.segment,
            Event::EdgeFirstSendComplete,
            sent && c.nonempty,
            None,
        );
    }
}

fn receive_loop(sh: &Shared, sock: &UnixDatagram) {
    let mut buf = [0u8; 256];
    let edge = Edge::new(sh.stage - 1, sh.stage);
    while let Ok(n) = sock.recv(&mut buf) {
        let Some(c) = std::str::from_utf8(&buf[..n]).ok().and_then(Chunk::decode) else {
            continue;
        };
        // Decode and admission.
        std::thread::sleep(sh.ms(1.2, 0.6));
        let admitted = {
            let mut reqs = sh.requests.lock().expect("requests");
            let Some(r) = reqs.get_mut(&c.token) else {
                continue; // aborted, or not dispatched here
            };
            let fail = sh.stage == 1
                && c.nonempty
                && r.plan.is_some_and(|p| p.fail_first_admission)
                && !r.admission_failed;
            if fail {
                r.admission_failed = true;
                false
            } else {
                if c.nonempty {
                    r.admitted += 1;
                }
                true
            }
        };
        if !admitted {
            // A payload that failed admission does not count.
            sh.record(
                c.token,
                edge,
                c.segment,
                Event::ConsumerFirstAccept,
                false,
                None,
            );
            continue;
        }
        sh.record(
            c.token,
            edge,
            c.segment,
            Event::ConsumerFirstAccept,
            c.nonempty,
            None,
        );
        // The stage's model turns the chunk into output after some compute;
        // the talker buffers, and is slower to start than the vocoder.
        let compute = if sh.stage == 1 {
            sh.ms(9.0, 4.0)
        } else {
            sh.ms(5.0, 2.0)
        };
        sh.schedule(
            compute,
            Step::Produce {
                chunk: ChunkKey {
                    token: c.token,
                    segment: c.segment,
                    seq: c.seq,
                    nonempty: c.nonempty,
                    last: c.last,
                },
            },
        );
    }
}

// ---------------------------------------------------------------------------
// The summary.

/// The nearest-rank percentile of sorted values.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The table the demo prints: per edge, each boundary and each delta between
/// consecutive boundaries, then the requests and the refused records.
pub(crate) fn summary(r: &DemoResult) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let events = Event::ALL;
    let short = ["emit", "send complete", "accept", "first output"];
    let closed = r.finals.len();
    let aborted = r.finals.iter().filter(|(_, a)| *a).count();
    let _ = writeln!(
        s,
        "edgemark demo: {closed} requests closed ({} completed, {aborted} aborted) in {:.1} s",
        closed - aborted,
        r.elapsed.as_secs_f64()
    );
    for edge in [Edge::new(0, 1), Edge::new(1, 2)] {
        let segs: Vec<_> = r
            .finals
            .iter()
            .filter_map(|(snap, _)| snap.segment(edge, 0))
            .collect();
        let _ = writeln!(s, "\nedge {edge} (segment 0), {} requests", segs.len());
        let _ = writeln!(
            s,
            "  {:<34} {:>6} {:>9} {:>9} {:>9}",
            "boundary (ms from request start)", "n", "p50", "p95", "p99"
        );
        let mut row = |name: String, mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            let f = |p| percentile(&v, p).map_or("-".to_owned(), |x| format!("{x:.2}"));
            let _ = writeln!(
                s,
                "  {:<34} {:>6} {:>9} {:>9} {:>9}",
                name,
                v.len(),
                f(50.0),
                f(95.0),
                f(99.0)
            );
        };
        for (e, name) in events.iter().zip(short) {
            row(
                name.to_owned(),
                segs.iter().filter_map(|g| g.elapsed_ms(*e)).collect(),
            );
        }
        for i in 0..3 {
            row(
                format!("{} -> {}", short[i], short[i + 1]),
                segs.iter()
                    .filter_map(|g| g.elapsed_between(events[i], events[i + 1]))
                    .collect(),
            );
        }
    }
    let second = r
        .finals
        .iter()
        .filter(|(snap, _)| snap.segment(Edge::new(0, 1), 1).is_some())
        .count();
    let _ = writeln!(s, "\nrequests with a second segment: {second}");
    let _ = writeln!(s, "record outcomes in the stage workers:");
    for (k, v) in &r.outcomes {
        let _ = writeln!(s, "  {k:<22} {v:>8}");
    }
    let refused: Vec<String> = r
        .counters
        .refused
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(o, n)| format!("{o}={n}"))
        .collect();
    let _ = writeln!(
        s,
        "refused records counted in the region: {}",
        if refused.is_empty() {
            "none".to_owned()
        } else {
            refused.join(", ")
        }
    );
    if let Some(p) = &r.region {
        let _ = writeln!(s, "region kept at {}", p.display());
    }
    s
}
