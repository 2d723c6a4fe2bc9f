//! The upstream recorder's test cases, as behaviour, written once over a
//! [`Pipeline`] so that they run both in one process and with every worker
//! observation made by a real worker process.

#![allow(dead_code, unreachable_pub, unused_macros)]

/// One `#[test]` per upstream case, each on a fresh pipeline made by
/// `$make` (`InProcess::new()` or `Processes::new()`).
macro_rules! upstream_case_tests {
    ($make:expr) => {
        upstream_case_tests!(@each $make;
            case_01_two_stage_flow_each_event_once,
            case_02_failed_send,
            case_02_failed_admission,
            case_03_empty_terminal_payload,
            case_04_consumer_buffering,
            case_05_isolation_and_fencing,
            case_06_cross_clock_deltas_and_detached_snapshots,
            case_07_zero_versus_missing_and_order,
            case_08_close_fences_late_events_and_id_reuse,
            case_09_every_cleanup_path_releases,
            case_10_incremental_detached_response_snapshots,
            case_11_invalid_elapsed_times,
        );
    };
    (@each $make:expr; $($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            common::$name(&mut $make);
        }
    )*};
}

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use edgemark::{Edge, Event, Event::*, Mark, Outcome, Recorder, RequestState, Snapshot, Token};
use serde_json::Value;

/// Clock domains the cases use besides `host_monotonic`.
pub const DOMAINS: [&str; 4] = ["sender", "receiver", "segment_clock", "edge12_clock"];
pub const E01: Edge = Edge::new(0, 1);
pub const E12: Edge = Edge::new(1, 2);

/// One observation a stage makes.
#[derive(Clone, Copy, Debug)]
pub struct Obs {
    pub edge: Edge,
    pub segment: u32,
    pub event: Event,
    pub meaningful: bool,
    pub chunk: Option<u64>,
    /// `Some((ms, domain))` records a value measured elsewhere; `None` reads
    /// the shared clock.
    pub at: Option<(f64, &'static str)>,
}

pub fn obs(edge: Edge, event: Event) -> Obs {
    Obs {
        edge,
        segment: 0,
        event,
        meaningful: true,
        chunk: None,
        at: None,
    }
}

impl Obs {
    pub fn ms(mut self, ms: f64) -> Obs {
        self.at = Some((ms, "host_monotonic"));
        self
    }
    pub fn in_domain(mut self, domain: &'static str) -> Obs {
        let ms = self.at.map_or(0.0, |a| a.0);
        self.at = Some((ms, domain));
        self
    }
    pub fn seg(mut self, s: u32) -> Obs {
        self.segment = s;
        self
    }
    pub fn chunk(mut self, c: u64) -> Obs {
        self.chunk = Some(c);
        self
    }
    pub fn meaningful(mut self, m: bool) -> Obs {
        self.meaningful = m;
        self
    }
    pub fn mark(&self) -> Mark {
        let mut m = Mark::new(self.edge, self.event)
            .segment(self.segment)
            .meaningful(self.meaningful);
        if let Some(c) = self.chunk {
            m = m.chunk_seq(c);
        }
        m
    }
    /// The stage that makes this observation.
    pub fn stage(&self) -> u32 {
        match self.event {
            ProducerFirstNonemptyEmit | EdgeFirstSendComplete => self.edge.from,
            ConsumerFirstAccept | ConsumerFirstNonemptyOutput => self.edge.to,
        }
    }
}

/// A pipeline: the orchestrator's recorder plus a way for stages to record.
pub trait Pipeline {
    /// The orchestrator's recorder (begin, close, snapshot).
    fn owner(&self) -> &Recorder;
    /// A stage records an observation.
    fn record(&mut self, token: Token, o: Obs) -> Outcome;
    /// A stage starts a segment.
    fn start_segment(&mut self, token: Token, edge: Edge, segment: u32) -> Outcome;
}

pub fn builder() -> edgemark::RegionBuilder {
    let mut b = Recorder::builder().edge(0, 1).edge(1, 2).slots(16);
    for d in DOMAINS {
        b = b.domain(d);
    }
    b
}

/// Records straight into the orchestrator's recorder.
pub struct InProcess {
    pub rec: Recorder,
}

impl InProcess {
    pub fn new() -> InProcess {
        InProcess {
            rec: builder().create_in_memory().unwrap(),
        }
    }
}

pub fn record_with(rec: &Recorder, token: Token, o: Obs) -> Outcome {
    match o.at {
        Some((ms, d)) => rec.record_elapsed(token, o.mark(), ms, d),
        None => rec.record(token, o.mark()),
    }
}

impl Pipeline for InProcess {
    fn owner(&self) -> &Recorder {
        &self.rec
    }
    fn record(&mut self, token: Token, o: Obs) -> Outcome {
        record_with(&self.rec, token, o)
    }
    fn start_segment(&mut self, token: Token, edge: Edge, segment: u32) -> Outcome {
        self.rec.start_segment(token, edge, segment)
    }
}

/// The `edgemark` command, built by the `edgemark-cli` crate of this
/// workspace into the same target directory as this test (`cargo test` from
/// the workspace root builds it before any test runs).
pub fn edgemark_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    // target/<profile>/deps/<test> -> target/<profile>/edgemark
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("edgemark"))
        .expect("a test binary inside a target directory");
    assert!(
        bin.is_file(),
        "{} is missing: these tests drive the `edgemark` command; run `cargo test` from the \
         workspace root, or `cargo build -p edgemark-cli` first",
        bin.display()
    );
    bin
}

/// One worker process per stage, each attached to the region by path
/// (`edgemark batch PATH`), fed one command per line.
pub struct Processes {
    pub rec: Recorder,
    pub path: PathBuf,
    _dir: tempfile::TempDir,
    workers: HashMap<u32, Worker>,
}

pub struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    pub fn spawn(path: &Path) -> Worker {
        let mut child = Command::new(edgemark_bin())
            .arg("batch")
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn edgemark batch");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Worker {
            child,
            stdin,
            stdout,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends one command without waiting for its reply.
    pub fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Reads the reply to the oldest command not yet answered.
    pub fn read(&mut self) -> String {
        let mut reply = String::new();
        self.stdout.read_line(&mut reply).unwrap();
        assert!(!reply.is_empty(), "worker exited");
        reply.trim_end().to_owned()
    }

    /// Sends one command and returns its reply line.
    pub fn ask(&mut self, line: &str) -> String {
        self.send(line);
        self.read()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn outcome_named(name: &str) -> Outcome {
    Outcome::from_name(name).unwrap_or_else(|| panic!("worker said {name:?}"))
}

pub fn record_line(token: Token, o: &Obs) -> String {
    let mut line = format!(
        "record {token} {}:{} {} --segment {}",
        o.edge.from,
        o.edge.to,
        o.event.name(),
        o.segment
    );
    if let Some(c) = o.chunk {
        line += &format!(" --chunk-seq {c}");
    }
    if !o.meaningful {
        line += " --not-meaningful";
    }
    if let Some((ms, d)) = o.at {
        line += &format!(" --elapsed-ms {ms} --domain {d}");
    }
    line
}

impl Processes {
    pub fn new() -> Processes {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cases.region");
        let rec = builder().create(&path).unwrap();
        Processes {
            rec,
            path,
            _dir: dir,
            workers: HashMap::new(),
        }
    }

    pub fn worker(&mut self, stage: u32) -> &mut Worker {
        let path = self.path.clone();
        self.workers
            .entry(stage)
            .or_insert_with(|| Worker::spawn(&path))
    }
}

impl Pipeline for Processes {
    fn owner(&self) -> &Recorder {
        &self.rec
    }
    fn record(&mut self, token: Token, o: Obs) -> Outcome {
        let line = record_line(token, &o);
        outcome_named(&self.worker(o.stage()).ask(&line))
    }
    fn start_segment(&mut self, token: Token, edge: Edge, segment: u32) -> Outcome {
        let line = format!("start {token} {edge} {segment}");
        outcome_named(&self.worker(edge.from).ask(&line))
    }
}

/// The upstream tests' synthetic two-stage delivery over edge 0->1:
/// emit at 10.0 (chunk 3), then send complete at 12.0 if the send
/// succeeded, then accept at 14.0 if admission succeeded, then first output
/// at 25.0 if the consumer produced output. Each observation is meaningful
/// only when the payload is non-empty.
#[derive(Clone, Copy, Debug)]
pub struct Delivery {
    pub send_ok: bool,
    pub admit_ok: bool,
    pub output: bool,
    pub nonempty: bool,
}

pub const OK: Delivery = Delivery {
    send_ok: true,
    admit_ok: true,
    output: true,
    nonempty: true,
};

pub fn deliver(p: &mut dyn Pipeline, token: Token, d: Delivery) -> Vec<Outcome> {
    let mut out = Vec::new();
    let m = d.nonempty;
    out.push(
        p.record(
            token,
            obs(E01, ProducerFirstNonemptyEmit)
                .ms(10.0)
                .chunk(3)
                .meaningful(m),
        ),
    );
    if !d.send_ok {
        return out;
    }
    out.push(p.record(
        token,
        obs(E01, EdgeFirstSendComplete).ms(12.0).meaningful(m),
    ));
    if !d.admit_ok {
        return out;
    }
    out.push(p.record(token, obs(E01, ConsumerFirstAccept).ms(14.0).meaningful(m)));
    if d.output {
        out.push(p.record(
            token,
            obs(E01, ConsumerFirstNonemptyOutput).ms(25.0).meaningful(m),
        ));
    }
    out
}

/// The `"0->1:0"` object of a snapshot's JSON.
pub fn edge_json(s: &Snapshot, key: &str) -> Value {
    s.to_json().get(key).cloned().unwrap_or(Value::Null)
}

pub fn ms(s: &Snapshot, key: &str, event: Event) -> Value {
    edge_json(s, key)[format!("{}_ms", event.name())].clone()
}

/// A stand-in for the orchestrator's request table: external request IDs to
/// tokens, with the one removal helper every path calls.
pub struct Orchestrator<'a> {
    pub rec: &'a Recorder,
    pub states: HashMap<String, Token>,
}

impl<'a> Orchestrator<'a> {
    pub fn new(rec: &'a Recorder) -> Orchestrator<'a> {
        Orchestrator {
            rec,
            states: HashMap::new(),
        }
    }
    pub fn add(&mut self, external_id: &str) -> Token {
        let t = self.rec.begin().unwrap();
        self.states.insert(external_id.to_owned(), t);
        t
    }
    /// A removal for `reason` (completion, abort, disconnect, timeout,
    /// stage error): each goes through [`Orchestrator::drop_request`].
    pub fn remove(&mut self, external_id: &str, reason: &str) -> Option<Snapshot> {
        assert!(!reason.is_empty());
        self.drop_request(external_id)
    }
    /// The one removal helper: close, then forget, whatever the reason.
    pub fn drop_request(&mut self, external_id: &str) -> Option<Snapshot> {
        let t = self.states.remove(external_id)?;
        Some(self.rec.close(t))
    }
}

// ---------------------------------------------------------------------------
// The cases.

pub fn case_01_two_stage_flow_each_event_once(p: &mut dyn Pipeline) {
    // Recording off: a disabled recorder keeps no state at all.
    let off = Recorder::disabled();
    let t_off = p.owner().begin().unwrap();
    for o in [
        obs(E01, ProducerFirstNonemptyEmit).ms(10.0).chunk(3),
        obs(E01, EdgeFirstSendComplete).ms(12.0),
    ] {
        assert_eq!(record_with(&off, t_off, o), Outcome::Disabled);
    }
    assert!(off.snapshot(t_off).is_empty());
    assert_eq!(off.snapshot(t_off).state(), RequestState::Gone);
    p.owner().close(t_off);

    // Recording on.
    let mut orch_ids = HashMap::new();
    let token = p.owner().begin().unwrap();
    orch_ids.insert("external-req-7", ("internal-req-7", token));
    assert_eq!(deliver(p, token, OK), vec![Outcome::Recorded; 4]);
    assert_eq!(deliver(p, token, OK), vec![Outcome::Duplicate; 4]);
    assert_eq!(
        p.record(token, obs(E01, ProducerFirstNonemptyEmit).ms(99.0).chunk(9)),
        Outcome::Duplicate
    );
    assert_eq!(
        p.record(token, obs(E01, ConsumerFirstNonemptyOutput).ms(100.0)),
        Outcome::Duplicate
    );
    let s = p.owner().snapshot(token);
    assert_eq!(ms(&s, "0->1:0", ProducerFirstNonemptyEmit), 10.0);
    assert_eq!(ms(&s, "0->1:0", ConsumerFirstNonemptyOutput), 25.0);
    assert_eq!(edge_json(&s, "0->1:0")["first_chunk_seq"], 3);
    let seg = s.segment(E01, 0).unwrap();
    assert_eq!(
        seg.elapsed_between(ProducerFirstNonemptyEmit, EdgeFirstSendComplete),
        Some(2.0)
    );
    let text = serde_json::to_string(&s).unwrap();
    for (external, (internal, _)) in &orch_ids {
        assert!(
            !text.contains(external) && !text.contains(internal),
            "{text}"
        );
    }
    assert!(!text.contains(&token.to_string()));
    p.owner().close(token);
}

pub fn case_02_failed_send(p: &mut dyn Pipeline) {
    let t = p.owner().begin().unwrap();
    let d = Delivery {
        send_ok: false,
        ..OK
    };
    assert_eq!(deliver(p, t, d), vec![Outcome::Recorded]);
    let s = p.owner().close(t);
    assert_eq!(ms(&s, "0->1:0", ProducerFirstNonemptyEmit), 10.0);
    for e in [
        EdgeFirstSendComplete,
        ConsumerFirstAccept,
        ConsumerFirstNonemptyOutput,
    ] {
        assert_eq!(ms(&s, "0->1:0", e), Value::Null, "{e}");
    }
}

pub fn case_02_failed_admission(p: &mut dyn Pipeline) {
    let t = p.owner().begin().unwrap();
    let d = Delivery {
        admit_ok: false,
        ..OK
    };
    assert_eq!(deliver(p, t, d), vec![Outcome::Recorded; 2]);
    let s = p.owner().close(t);
    assert_eq!(ms(&s, "0->1:0", EdgeFirstSendComplete), 12.0);
    assert_eq!(ms(&s, "0->1:0", ConsumerFirstAccept), Value::Null);
    assert_eq!(ms(&s, "0->1:0", ConsumerFirstNonemptyOutput), Value::Null);
}

pub fn case_03_empty_terminal_payload(p: &mut dyn Pipeline) {
    let t = p.owner().begin().unwrap();
    let d = Delivery {
        nonempty: false,
        ..OK
    };
    assert_eq!(deliver(p, t, d), vec![Outcome::NotMeaningful; 4]);
    assert_eq!(serde_json::to_string(&p.owner().snapshot(t)).unwrap(), "{}");
    assert_eq!(serde_json::to_string(&p.owner().close(t)).unwrap(), "{}");
}

pub fn case_04_consumer_buffering(p: &mut dyn Pipeline) {
    let t = p.owner().begin().unwrap();
    let d = Delivery {
        output: false,
        ..OK
    };
    assert_eq!(deliver(p, t, d), vec![Outcome::Recorded; 3]);
    let s = p.owner().snapshot(t);
    assert_eq!(ms(&s, "0->1:0", ConsumerFirstAccept), 14.0);
    assert_eq!(ms(&s, "0->1:0", ConsumerFirstNonemptyOutput), Value::Null);
    let out = deliver(p, t, OK);
    assert_eq!(out[3], Outcome::Recorded);
    assert_eq!(&out[..3], &[Outcome::Duplicate; 3]);
    let s = p.owner().close(t);
    assert_eq!(ms(&s, "0->1:0", ConsumerFirstNonemptyOutput), 25.0);
    assert_eq!(ms(&s, "0->1:0", ConsumerFirstAccept), 14.0);
}

pub fn case_05_isolation_and_fencing(p: &mut dyn Pipeline) {
    let a = p.owner().begin().unwrap();
    let b = p.owner().begin().unwrap();
    assert_eq!(
        p.record(a, obs(E01, ProducerFirstNonemptyEmit).ms(10.0)),
        Outcome::Recorded
    );
    assert_eq!(p.start_segment(a, E01, 1), Outcome::Started);
    assert_eq!(
        p.record(
            a,
            obs(E01, ProducerFirstNonemptyEmit)
                .ms(5.0)
                .in_domain("segment_clock")
                .seg(1)
        ),
        Outcome::Recorded
    );
    // The old segment-0 handle is fenced.
    assert_eq!(
        p.record(a, obs(E01, EdgeFirstSendComplete).ms(12.0).seg(0)),
        Outcome::StaleSegment
    );
    assert_eq!(
        p.record(
            a,
            obs(E12, ConsumerFirstAccept)
                .ms(20.0)
                .in_domain("edge12_clock")
        ),
        Outcome::Recorded
    );
    assert_eq!(
        p.record(b, obs(E01, ProducerFirstNonemptyEmit).ms(1.0)),
        Outcome::Recorded
    );

    let sa = p.owner().snapshot(a);
    let sb = p.owner().snapshot(b);
    assert_eq!(ms(&sa, "0->1:0", ProducerFirstNonemptyEmit), 10.0);
    assert_eq!(ms(&sa, "0->1:0", EdgeFirstSendComplete), Value::Null);
    assert_eq!(ms(&sa, "0->1:1", ProducerFirstNonemptyEmit), 5.0);
    assert_eq!(
        edge_json(&sa, "0->1:1")["clock_domains"]["producer_first_nonempty_emit"],
        "segment_clock"
    );
    assert_eq!(ms(&sa, "1->2:0", ConsumerFirstAccept), 20.0);
    assert_eq!(
        edge_json(&sa, "1->2:0")["clock_domains"]["consumer_first_accept"],
        "edge12_clock"
    );
    assert_eq!(ms(&sb, "0->1:0", ProducerFirstNonemptyEmit), 1.0);
    assert_eq!(sb.segments().len(), 1, "B sees nothing of A");
    // Starting segment 0 again is refused as retired.
    assert_eq!(p.start_segment(a, E01, 0), Outcome::StaleSegment);
    assert_eq!(p.start_segment(a, E01, 1), Outcome::StaleSegment);
    p.owner().close(a);
    p.owner().close(b);
}

pub fn case_06_cross_clock_deltas_and_detached_snapshots(p: &mut dyn Pipeline) {
    let t = p.owner().begin().unwrap();
    assert_eq!(
        p.record(
            t,
            obs(E01, ProducerFirstNonemptyEmit)
                .ms(100.0)
                .in_domain("sender")
        ),
        Outcome::Recorded
    );
    assert_eq!(
        p.record(
            t,
            obs(E01, EdgeFirstSendComplete)
                .ms(103.0)
                .in_domain("sender")
        ),
        Outcome::Recorded
    );
    assert_eq!(
        p.record(
            t,
            obs(E01, ConsumerFirstAccept).ms(5.0).in_domain("receiver")
        ),
        Outcome::Recorded
    );
    let first = p.owner().snapshot(t);
    let seg = first.segment(E01, 0).unwrap();
    assert_eq!(
        seg.elapsed_between(EdgeFirstSendComplete, ConsumerFirstAccept),
        None
    );
    assert_eq!(
        seg.elapsed_between(ConsumerFirstAccept, ConsumerFirstNonemptyOutput),
        None
    );
    // Mutate what was handed out.
    let mut json = first.to_json();
    json["0->1:0"]["producer_first_nonempty_emit_ms"] = Value::from(1.0);
    drop(first);
    assert_eq!(json["0->1:0"]["producer_first_nonempty_emit_ms"], 1.0);
    let next = p.owner().snapshot(t);
    assert_eq!(ms(&next, "0->1:0", ProducerFirstNonemptyEmit), 100.0);
    assert_eq!(
        next.segment(E01, 0)
            .unwrap()
            .elapsed_between(ProducerFirstNonemptyEmit, EdgeFirstSendComplete),
        Some(3.0)
    );
    p.owner().close(t);
}

pub fn case_07_zero_versus_missing_and_order(p: &mut dyn Pipeline) {
    let t = p.owner().begin().unwrap();
    assert_eq!(
        p.record(t, obs(E01, ProducerFirstNonemptyEmit).ms(10.0)),
        Outcome::Recorded
    );
    assert_eq!(
        p.record(t, obs(E01, EdgeFirstSendComplete).ms(0.0)),
        Outcome::Recorded
    );
    let s = p.owner().close(t);
    assert_eq!(ms(&s, "0->1:0", EdgeFirstSendComplete), 0.0);
    assert_eq!(ms(&s, "0->1:0", ConsumerFirstAccept), Value::Null);
    assert_eq!(
        s.segment(E01, 0)
            .unwrap()
            .elapsed_between(ProducerFirstNonemptyEmit, EdgeFirstSendComplete),
        None
    );
}

pub fn case_08_close_fences_late_events_and_id_reuse(p: &mut dyn Pipeline) {
    let owner = p.owner().clone();
    let mut orch = Orchestrator::new(&owner);
    let t = orch.add("req-1");
    assert_eq!(
        p.record(t, obs(E01, ProducerFirstNonemptyEmit).ms(10.0)),
        Outcome::Recorded
    );
    let before = owner.snapshot(t);
    let last = orch.drop_request("req-1").unwrap();
    assert_eq!(last.state(), RequestState::Closed);
    assert_eq!(ms(&last, "0->1:0", ProducerFirstNonemptyEmit), 10.0);
    // Released twice: idempotent.
    let again = owner.close(t);
    assert!(again.is_empty());
    assert_eq!(again.state(), RequestState::Gone);
    assert_eq!(
        p.record(t, obs(E01, EdgeFirstSendComplete).ms(12.0)),
        Outcome::Closed
    );
    assert_eq!(serde_json::to_string(&owner.snapshot(t)).unwrap(), "{}");
    assert_eq!(ms(&before, "0->1:0", ProducerFirstNonemptyEmit), 10.0);
    // Switching recording on again for the released request is refused.
    assert_eq!(p.start_segment(t, E01, 1), Outcome::Closed);
    // The same external ID again is a fresh instance.
    let t2 = orch.add("req-1");
    assert_ne!(t2, t);
    assert!(owner.snapshot(t2).is_empty());
    assert_eq!(owner.snapshot(t2).state(), RequestState::Open);
    let late = p.record(t, obs(E01, EdgeFirstSendComplete).ms(12.0));
    assert!(matches!(late, Outcome::Closed | Outcome::Reused), "{late}");
    assert!(owner.snapshot(t2).is_empty());
    orch.drop_request("req-1");
}

/// The four removal paths of the upstream orchestrator (normal completion,
/// client disconnect, timeout, stage error) and the synchronous abort that
/// upstream missed all reach the same close.
pub fn case_09_every_cleanup_path_releases(p: &mut dyn Pipeline) {
    let owner = p.owner().clone();
    for path in [
        "normal",
        "abort",
        "client_disconnect",
        "timeout",
        "stage_error",
    ] {
        let mut orch = Orchestrator::new(&owner);
        let t = orch.add(path);
        assert_eq!(
            p.record(t, obs(E01, ProducerFirstNonemptyEmit).ms(10.0)),
            Outcome::Recorded
        );
        // Whatever the reason, the path calls the one removal helper.
        let last = orch.remove(path, path).unwrap();
        assert_eq!(last.state(), RequestState::Closed, "{path}");
        assert!(orch.states.is_empty(), "{path}: request state is gone");
        assert_eq!(
            serde_json::to_string(&owner.snapshot(t)).unwrap(),
            "{}",
            "{path}"
        );
        assert_eq!(
            p.record(t, obs(E01, EdgeFirstSendComplete).ms(12.0)),
            Outcome::Closed,
            "{path}"
        );
    }
    assert!(owner.open_requests().unwrap().is_empty());
}

/// A response builder in the upstream manner: stream-edge metrics only when
/// recording is on.
pub fn response_metrics(rec: &Recorder, t: Token) -> Option<Value> {
    rec.is_enabled().then(|| rec.snapshot(t).to_json())
}

pub fn case_10_incremental_detached_response_snapshots(p: &mut dyn Pipeline) {
    let t = p.owner().begin().unwrap();
    assert_eq!(response_metrics(&Recorder::disabled(), t), None);
    assert_eq!(
        p.record(t, obs(E01, ProducerFirstNonemptyEmit).ms(10.0)),
        Outcome::Recorded
    );
    let first = response_metrics(p.owner(), t).unwrap();
    assert_eq!(first["0->1:0"]["edge_first_send_complete_ms"], Value::Null);
    assert_eq!(
        p.record(t, obs(E01, EdgeFirstSendComplete).ms(12.0)),
        Outcome::Recorded
    );
    let second = response_metrics(p.owner(), t).unwrap();
    assert_eq!(second["0->1:0"]["producer_first_nonempty_emit_ms"], 10.0);
    assert_eq!(second["0->1:0"]["edge_first_send_complete_ms"], 12.0);
    assert_eq!(first["0->1:0"]["edge_first_send_complete_ms"], Value::Null);
    p.owner().close(t);
}

pub fn case_11_invalid_elapsed_times(p: &mut dyn Pipeline) {
    for bad in [-1.0, f64::INFINITY, f64::NAN] {
        let t = p.owner().begin().unwrap();
        assert_eq!(
            p.record(t, obs(E01, ProducerFirstNonemptyEmit).ms(bad)),
            Outcome::Invalid,
            "{bad}"
        );
        assert_eq!(serde_json::to_string(&p.owner().snapshot(t)).unwrap(), "{}");
        // The cell is untouched: a valid value still records.
        assert_eq!(
            p.record(t, obs(E01, ProducerFirstNonemptyEmit).ms(1.0)),
            Outcome::Recorded
        );
        p.owner().close(t);
    }
}

/// A deterministic generator (SplitMix64) for the tests' case streams.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
