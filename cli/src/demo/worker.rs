//! A stage worker process: a receive thread (the connector's receiving
//! side: decode, admission, `consumer_first_accept`), an engine thread (the
//! stage's model, driven by the timer heap) and a send thread (the
//! connector's put, then `edge_first_send_complete`), each recording the
//! events it observes straight into the region.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Write};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use edgemark::{Edge, Event, Mark, Outcome, Recorder, Token};

use super::rng::Rng;
use super::timers::{Step, Timers};
use super::wire::{Chunk, Dispatch, Plan, Report};
use super::{STAGES, socket_path};

#[derive(Debug, Default)]
struct ReqState {
    plan: Option<Plan>,
    segment: u32,
    admitted: u32,
    admission_failed: bool,
    sent_failed: bool,
}

/// What the worker's threads share.
struct Shared {
    stage: u32,
    rec: Recorder,
    requests: Mutex<HashMap<Token, ReqState>>,
    timers: Timers,
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
        timers: Timers::default(),
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
        match Dispatch::decode(&line?) {
            Some(Dispatch::Request(token, plan)) => {
                shared.requests.lock().expect("requests").insert(
                    token,
                    ReqState {
                        plan,
                        ..ReqState::default()
                    },
                );
                if stage == 0 {
                    // Prefill before the first chunk.
                    let prefill = shared.ms(55.0, 25.0);
                    shared.timers.schedule(prefill, Step::Emit { token, n: 0 });
                }
            }
            Some(Dispatch::Segment(token, segment)) => {
                if let Some(r) = shared.requests.lock().expect("requests").get_mut(&token) {
                    r.segment = segment.unwrap_or(r.segment);
                }
            }
            Some(Dispatch::Abort(token)) => {
                shared.requests.lock().expect("requests").remove(&token);
            }
            None => {}
        }
    }
    // End of input: report and exit.
    let outcomes = shared.outcomes.lock().expect("outcomes").clone();
    let outcomes = outcomes
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", Report::Outcomes(outcomes).encode())?;
    out.flush()?;
    Ok(())
}

fn engine_loop(sh: &Shared, send: &mpsc::Sender<Chunk>) {
    loop {
        match sh.timers.next() {
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
    let _ = send.send(Chunk::new(token, segment, seq, nonempty, last));
    if !last {
        let gap = sh.ms(14.0, 6.0);
        sh.timers.schedule(gap, Step::Emit { token, n: n + 1 });
    }
}

/// Stages 1 and 2: turn an admitted chunk into output.
fn produce(sh: &Shared, send: &mpsc::Sender<Chunk>, c: Chunk) {
    if sh.segment_of(c.token()).is_none() {
        return; // aborted
    }
    let edge_in = Edge::new(sh.stage - 1, sh.stage);
    sh.record(
        c.token(),
        edge_in,
        c.segment,
        Event::ConsumerFirstNonemptyOutput,
        c.nonempty(),
        None,
    );
    if sh.stage + 1 < STAGES {
        // The talker's output is the next stage's input.
        let edge_out = Edge::new(sh.stage, sh.stage + 1);
        sh.record(
            c.token(),
            edge_out,
            c.segment,
            Event::ProducerFirstNonemptyEmit,
            c.nonempty(),
            Some(c.seq),
        );
        let _ = send.send(c);
    } else if c.last() {
        sh.requests.lock().expect("requests").remove(&c.token());
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", Report::Done(c.token()).encode());
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
        let fail = c.nonempty() && {
            let mut reqs = sh.requests.lock().expect("requests");
            match reqs.get_mut(&c.token()) {
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
                c.token(),
                edge,
                c.segment,
                Event::EdgeFirstSendComplete,
                false,
                None,
            );
        }
        std::thread::sleep(sh.ms(1.6, 0.8));
        let sent = sock.send_to(c.as_bytes(), next).is_ok();
        sh.record(
            c.token(),
            edge,
            c.segment,
            Event::EdgeFirstSendComplete,
            sent && c.nonempty(),
            None,
        );
    }
}

fn receive_loop(sh: &Shared, sock: &UnixDatagram) {
    let mut buf = [0u8; 256];
    let edge = Edge::new(sh.stage - 1, sh.stage);
    while let Ok(n) = sock.recv(&mut buf) {
        let Some(c) = Chunk::from_bytes(&buf[..n]) else {
            continue;
        };
        // Decode and admission.
        std::thread::sleep(sh.ms(1.2, 0.6));
        let admitted = {
            let mut reqs = sh.requests.lock().expect("requests");
            let Some(r) = reqs.get_mut(&c.token()) else {
                continue; // aborted, or not dispatched here
            };
            let fail = sh.stage == 1
                && c.nonempty()
                && r.plan.is_some_and(|p| p.fail_first_admission)
                && !r.admission_failed;
            if fail {
                r.admission_failed = true;
                false
            } else {
                if c.nonempty() {
                    r.admitted += 1;
                }
                true
            }
        };
        if !admitted {
            // A payload that failed admission does not count.
            sh.record(
                c.token(),
                edge,
                c.segment,
                Event::ConsumerFirstAccept,
                false,
                None,
            );
            continue;
        }
        sh.record(
            c.token(),
            edge,
            c.segment,
            Event::ConsumerFirstAccept,
            c.nonempty(),
            None,
        );
        // The stage's model turns the chunk into output after some compute;
        // the talker buffers, and is slower to start than the vocoder.
        let compute = if sh.stage == 1 {
            sh.ms(9.0, 4.0)
        } else {
            sh.ms(5.0, 2.0)
        };
        sh.timers.schedule(compute, Step::Produce { chunk: c });
    }
}
