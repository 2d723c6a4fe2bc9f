//! Multi-process torture test.
//!
//! Several real processes, each with several threads, run random begin,
//! record, start-segment, snapshot and close against one small region, so
//! that slots are reused constantly. Every worker thread logs each operation
//! before it starts (its intent, with a value unique to the operation) and
//! the outcome it was given, one unbuffered line each. Afterwards the parent
//! closes what is still open and proves, per request instance:
//!
//! - every write reported `Recorded` is in the instance's final snapshot
//!   with its value (unless its segment left the window of kept segments);
//! - no value appears, in a final or a concurrent snapshot, that no worker
//!   wrote for that instance, edge, segment and event;
//! - each cell has at most one winner, and a duplicate implies a winner;
//! - a value a concurrent snapshot saw is the one the final snapshot shows.
//!
//! Two reader processes drain the ring of closed requests meanwhile: each
//! closed request is taken at most once, with its close's final values,
//! and (no worker killed) every close is taken or counted lost.
//!
//! A second run kills random workers with SIGKILL mid-flight; the survivors'
//! results must still hold and no value may be torn.
//!
//! This binary has its own `main` (`harness = false`): run with arguments
//! `worker ...` it is one of the worker processes. `-- --soak SECONDS` runs
//! a longer soak.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::Rng;
use edgemark::{Edge, Event, Mark, Recorder, Token};
use serde_json::Value;

const EDGES: [Edge; 2] = [Edge::new(0, 1), Edge::new(1, 0)];
const SLOTS: u32 = 6;
const KEPT: u32 = 2;
/// Entries of the ring of closed requests: small, so that readers fall a
/// ring behind as well as keep up.
const CLOSED_ENTRIES: u32 = 8;

// ---------------------------------------------------------------------------
// Reader side: drains the ring of closed requests into `out`, one line per
// request taken (`token json`), until `stop` exists; then drains to the end,
// giving up on a claim that stays pending (its closer may have been killed).

fn reader(region: &Path, out: &Path, stop: &Path) {
    let rec = Recorder::attach(region).expect("attach");
    let mut file = std::fs::File::create(out).expect("reader log");
    let mut taken = Vec::new();
    let mut stopping_rounds = 0u32;
    let mut last_pending = None;
    loop {
        let stopping = stop.exists();
        let d = rec.drain_closed(32, &mut taken).expect("drain");
        for c in taken.drain(..) {
            let line = format!(
                "{} {}\n",
                c.token(),
                serde_json::to_string(c.snapshot()).unwrap()
            );
            file.write_all(line.as_bytes()).expect("reader write");
        }
        if !stopping {
            if d.taken == 0 {
                std::thread::yield_now();
            }
            continue;
        }
        if d.caught_up {
            stopping_rounds += 1;
            if stopping_rounds > 2 {
                return;
            }
        }
        if let Some(p) = d.pending {
            // After the run, a claim still pending had its closer killed.
            if last_pending == Some(p) {
                rec.skip_closed(p);
            }
            last_pending = Some(p);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

// ---------------------------------------------------------------------------
// Worker side.

fn worker(region: &Path, log_dir: &Path, id: u64, threads: u64, ops: u64, seed: u64) {
    let rec = Recorder::attach(region).expect("attach");
    std::thread::scope(|s| {
        for t in 0..threads {
            let rec = rec.clone();
            s.spawn(move || {
                let path = log_dir.join(format!("w{id}-t{t}.log"));
                let log = std::fs::File::create(path).expect("log");
                worker_thread(&rec, log, (id << 4) | t, ops, seed ^ (id * 131 + t));
            });
        }
    });
}

fn worker_thread(rec: &Recorder, mut log: std::fs::File, me: u64, ops: u64, seed: u64) {
    // One unbuffered write per line: a killed worker loses no complete line.
    let mut line = |s: String| {
        log.write_all(s.as_bytes()).expect("log write");
    };
    let mut rng = Rng(seed);
    let mut open: Vec<Token> = Vec::new();
    for op in 0..ops {
        if op % 16 == 0 || open.is_empty() {
            open = rec.open_requests().unwrap();
        }
        // A value no other operation in the run uses: microseconds that name
        // the thread and the operation.
        let unique = (me << 24) | op;
        let pick = |rng: &mut Rng, open: &[Token]| open[rng.below(open.len() as u64) as usize];
        let r = rng.below(100);
        if r < 8 || open.is_empty() {
            match rec.begin() {
                Ok(t) => line(format!("B {t}\n")),
                Err(o) => line(format!("b {o}\n")),
            }
        } else if r < 13 {
            let t = pick(&mut rng, &open);
            line(format!("c {unique} {t}\n"));
            let s = rec.close(t);
            let state = format!("{:?}", s.state());
            line(format!(
                "C {unique} {state} {}\n",
                serde_json::to_string(&s).unwrap()
            ));
        } else if r < 17 {
            let t = pick(&mut rng, &open);
            let e = EDGES[rng.below(2) as usize];
            let seg = rng.below(6) as u32;
            line(format!("s {unique} {t} {} {seg}\n", e.from));
            let o = rec.start_segment(t, e, seg);
            line(format!("S {unique} {o}\n"));
        } else if r < 22 {
            let t = pick(&mut rng, &open);
            let s = rec.snapshot(t);
            line(format!("N {t} {}\n", serde_json::to_string(&s).unwrap()));
        } else {
            let t = pick(&mut rng, &open);
            let e = EDGES[rng.below(2) as usize];
            let seg = rng.below(3) as u32;
            let ev = Event::ALL[rng.below(4) as usize];
            let chunk = unique & 0x3f_ffff;
            line(format!("i {unique} {t} {} {seg} {}\n", e.from, ev as u8));
            let mark = Mark::new(e, ev).segment(seg).chunk_seq(chunk);
            let o = rec.record_elapsed(t, mark, unique as f64 / 1000.0, "host_monotonic");
            line(format!("R {unique} {o}\n"));
        }
    }
}

// ---------------------------------------------------------------------------
// Parent side: the log model and the checks.

#[derive(Clone, Debug)]
struct Write_ {
    token: String,
    edge: u32,
    seg: u32,
    event: u8,
    outcome: Option<String>,
}

#[derive(Default)]
struct Logs {
    writes: HashMap<u64, Write_>,
    /// (token, from stage) -> started segment indices.
    started: HashMap<(String, u32), Vec<u32>>,
    /// Tokens with a control operation whose outcome was never logged.
    unresolved: HashSet<String>,
    finals: HashMap<String, Value>,
    snapshots: Vec<(String, Value)>,
    begins: Vec<String>,
    lines: usize,
}

fn read_logs(dir: &Path) -> Logs {
    let mut l = Logs::default();
    let mut pending_start: HashMap<u64, (String, u32, u32)> = HashMap::new();
    let mut pending_close: HashMap<u64, String> = HashMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        // A killed worker may leave a partial last line: only whole lines count.
        let whole = text.rfind('\n').map_or("", |i| &text[..i]);
        for line in whole.lines() {
            l.lines += 1;
            let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
            let w: Vec<&str> = rest.splitn(3, ' ').collect();
            match kind {
                "B" => l.begins.push(w[0].to_owned()),
                "i" => {
                    let f: Vec<&str> = rest.split(' ').collect();
                    l.writes.insert(
                        f[0].parse().unwrap(),
                        Write_ {
                            token: f[1].to_owned(),
                            edge: f[2].parse().unwrap(),
                            seg: f[3].parse().unwrap(),
                            event: f[4].parse().unwrap(),
                            outcome: None,
                        },
                    );
                }
                "R" => {
                    let u: u64 = w[0].parse().unwrap();
                    l.writes.get_mut(&u).unwrap().outcome = Some(w[1].to_owned());
                }
                "s" => {
                    let f: Vec<&str> = rest.split(' ').collect();
                    pending_start.insert(
                        f[0].parse().unwrap(),
                        (
                            f[1].to_owned(),
                            f[2].parse().unwrap(),
                            f[3].parse().unwrap(),
                        ),
                    );
                }
                "S" => {
                    let (t, e, s) = pending_start.remove(&w[0].parse().unwrap()).unwrap();
                    if w[1] == "started" {
                        l.started.entry((t, e)).or_default().push(s);
                    }
                }
                "c" => {
                    pending_close.insert(w[0].parse().unwrap(), w[1].to_owned());
                }
                "C" => {
                    let t = pending_close.remove(&w[0].parse().unwrap()).unwrap();
                    if w[1] == "Closed" {
                        let prev = l
                            .finals
                            .insert(t.clone(), serde_json::from_str(w[2]).unwrap());
                        assert!(prev.is_none(), "{t} was closed twice with a final snapshot");
                    }
                }
                "N" => l
                    .snapshots
                    .push((w[0].to_owned(), serde_json::from_str(w[1]).unwrap())),
                _ => {}
            }
        }
    }
    l.unresolved
        .extend(pending_start.into_values().map(|(t, _, _)| t));
    l.unresolved.extend(pending_close.into_values());
    l
}

/// Every (edge, segment, event, µs, chunk) a snapshot's JSON shows.
fn values(v: &Value) -> Vec<(u32, u32, u8, u64, Option<u64>)> {
    let mut out = Vec::new();
    for (key, seg) in v.as_object().expect("a snapshot is an object") {
        let from = seg["from_stage"].as_u64().unwrap() as u32;
        let index = seg["segment_index"].as_u64().unwrap() as u32;
        assert_eq!(*key, format!("{}->{}:{}", from, seg["to_stage"], index));
        for ev in Event::ALL {
            let ms = &seg[format!("{}_ms", ev.name())];
            if let Some(ms) = ms.as_f64() {
                let us = (ms * 1000.0).round() as u64;
                let chunk = (ev == Event::ProducerFirstNonemptyEmit)
                    .then(|| seg["first_chunk_seq"].as_u64())
                    .flatten();
                out.push((from, index, ev as u8, us, chunk));
            }
        }
    }
    out
}

struct Report {
    recorded: usize,
    checked_instances: usize,
    skipped_instances: usize,
    values_checked: usize,
}

fn verify(l: &Logs, killed: bool) -> Report {
    let mut rep = Report {
        recorded: 0,
        checked_instances: 0,
        skipped_instances: 0,
        values_checked: 0,
    };
    // Each instance began once.
    let mut seen = HashSet::new();
    for b in &l.begins {
        assert!(seen.insert(b), "two begins returned the token {b}");
    }
    // Each cell has at most one winner.
    let mut winners: HashMap<(String, u32, u32, u8), u64> = HashMap::new();
    let mut duplicates: HashSet<(String, u32, u32, u8)> = HashSet::new();
    for (u, w) in &l.writes {
        let cell = (w.token.clone(), w.edge, w.seg, w.event);
        match w.outcome.as_deref() {
            Some("recorded") => {
                rep.recorded += 1;
                assert!(
                    winners.insert(cell.clone(), *u).is_none(),
                    "two winners for {cell:?}"
                );
            }
            Some("duplicate") => {
                duplicates.insert(cell);
            }
            _ => {}
        }
    }
    // A value seen anywhere was written by an operation on that very cell,
    // and was not refused.
    let explain = |token: &str, (e, s, ev, us, chunk): (u32, u32, u8, u64, Option<u64>)| {
        let w = l
            .writes
            .get(&us)
            .unwrap_or_else(|| panic!("{token}: value {us} was never written"));
        assert_eq!(
            (w.token.as_str(), w.edge, w.seg, w.event),
            (token, e, s, ev),
            "value {us} landed in the wrong cell"
        );
        match w.outcome.as_deref() {
            Some("recorded") => {}
            None if killed => {} // its writer died before logging the outcome
            other => panic!("value {us} is present but its writer was told {other:?}"),
        }
        if ev == Event::ProducerFirstNonemptyEmit as u8 {
            assert_eq!(
                chunk,
                Some(us & 0x3f_ffff),
                "the winner's chunk, and only its"
            );
        }
    };
    for (token, final_) in &l.finals {
        for v in values(final_) {
            explain(token, v);
            rep.values_checked += 1;
        }
    }
    let mut final_values: HashMap<(String, u32, u32, u8), u64> = HashMap::new();
    for (token, final_) in &l.finals {
        for (e, s, ev, us, _) in values(final_) {
            final_values.insert((token.clone(), e, s, ev), us);
        }
    }
    for (token, snap) in &l.snapshots {
        for v in values(snap) {
            explain(token, v);
            rep.values_checked += 1;
            if let Some(f) = final_values.get(&(token.clone(), v.0, v.1, v.2)) {
                assert_eq!(*f, v.3, "{token}: a value once seen changed");
            }
        }
    }
    // A duplicate implies a winner.
    for cell in &duplicates {
        assert!(
            winners.contains_key(cell) || killed,
            "{cell:?} refused a duplicate but has no winner"
        );
    }
    // Every recorded write is in its instance's final snapshot, unless its
    // segment was dropped from the window.
    for ((token, e, s, ev), u) in &winners {
        let Some(final_) = l.finals.get(token) else {
            rep.skipped_instances += 1;
            continue;
        };
        if killed && l.unresolved.contains(token) {
            rep.skipped_instances += 1;
            continue;
        }
        let mut started = l
            .started
            .get(&(token.clone(), *e))
            .cloned()
            .unwrap_or_default();
        started.push(0);
        started.sort_unstable();
        let kept: Vec<u32> = started.iter().rev().take(KEPT as usize).copied().collect();
        if !kept.contains(s) {
            continue;
        }
        rep.checked_instances += 1;
        let found = values(final_)
            .into_iter()
            .find(|(fe, fs, fev, _, _)| (fe, fs, fev) == (e, s, ev));
        assert_eq!(
            found.map(|f| f.3),
            Some(*u),
            "{token}: recorded {u} on {e}:{s} event {ev} is missing from the final snapshot"
        );
    }
    rep
}

struct Run {
    processes: u64,
    threads: u64,
    ops: u64,
    seed: u64,
    kill: bool,
}

fn run(cfg: &Run) -> String {
    let dir = tempfile::tempdir().unwrap();
    let region = dir.path().join("torture.region");
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let rec = Recorder::builder()
        .edges(EDGES)
        .slots(SLOTS)
        .segments(KEPT)
        .closed_entries(CLOSED_ENTRIES)
        .create(&region)
        .unwrap();
    let exe = std::env::current_exe().unwrap();
    // Two reader processes drain the ring of closed requests throughout.
    let stop = dir.path().join("stop");
    let readers: Vec<_> = (0..2)
        .map(|i| {
            let out = dir.path().join(format!("reader{i}.log"));
            let child = Command::new(&exe)
                .args(["reader", region.to_str().unwrap(), out.to_str().unwrap()])
                .arg(&stop)
                .stdout(Stdio::null())
                .spawn()
                .unwrap();
            (child, out)
        })
        .collect();
    let mut children: Vec<_> = (0..cfg.processes)
        .map(|id| {
            Command::new(&exe)
                .args(["worker", region.to_str().unwrap(), logs.to_str().unwrap()])
                .args([id, cfg.threads, cfg.ops, cfg.seed].map(|n| n.to_string()))
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut killed = 0;
    if cfg.kill {
        let mut rng = Rng(cfg.seed ^ 0xdead);
        // Kill all but one worker, each at a random moment of its run.
        for c in children.iter_mut().skip(1) {
            std::thread::sleep(Duration::from_millis(20 + rng.below(120)));
            // SAFETY: kill(2) with a pid we spawned and have not waited for.
            unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
            killed += 1;
        }
    }
    for c in &mut children {
        let status = c.wait().unwrap();
        assert!(cfg.kill || status.success(), "a worker failed: {status}");
    }
    // Close what the workers left open; those finals count too.
    let mut logs_model = read_logs(&logs);
    for t in rec.open_requests().unwrap() {
        let s = rec.close(t);
        // A slot whose control operation died with its worker stays locked.
        if s.state() == edgemark::RequestState::Closed {
            logs_model.finals.insert(t.to_string(), s.to_json());
        }
    }
    // The readers: every closed request taken by one reader at most, with
    // exactly the final values its close returned; with no worker killed,
    // each close that freed its slot taken once or counted lost.
    std::fs::write(&stop, b"").unwrap();
    let mut taken: HashMap<String, Value> = HashMap::new();
    for (mut child, out) in readers {
        assert!(child.wait().unwrap().success(), "a reader failed");
        for line in std::fs::read_to_string(out).unwrap().lines() {
            let (token, json) = line.split_once(' ').unwrap();
            let snap: Value = serde_json::from_str(json).unwrap();
            if let Some(final_) = logs_model.finals.get(token) {
                assert_eq!(
                    &snap, final_,
                    "{token}: the ring's values are not its close's"
                );
            } else {
                assert!(cfg.kill, "{token} was taken but never closed");
            }
            let again = taken.insert(token.to_owned(), snap);
            assert!(again.is_none(), "{token} was taken twice");
        }
    }
    let counters = rec.counters();
    if !cfg.kill {
        assert_eq!(
            taken.len() as u64 + counters.closed_lost,
            counters.closed_requests,
            "a close was neither taken nor counted lost"
        );
    }
    assert!(!taken.is_empty(), "the readers took nothing");
    let rep = verify(&logs_model, cfg.kill);
    assert!(
        rep.recorded > 100,
        "the run recorded too little to prove anything"
    );
    assert!(
        rep.checked_instances > 50,
        "too few writes were checked against finals"
    );
    let outcomes: BTreeMap<&str, usize> =
        logs_model
            .writes
            .values()
            .fold(BTreeMap::new(), |mut m, w| {
                *m.entry(w.outcome.as_deref().unwrap_or("unlogged"))
                    .or_default() += 1;
                m
            });
    format!(
        "{} processes x {} threads, {} killed: {} log lines, {} begins, {} finals ({} taken from the ring by 2 readers, {} lost), {} recorded writes checked against finals ({} skipped), {} values explained; outcomes {:?}",
        cfg.processes,
        cfg.threads,
        killed,
        logs_model.lines,
        logs_model.begins.len(),
        logs_model.finals.len(),
        taken.len(),
        counters.closed_lost,
        rep.checked_instances,
        rep.skipped_instances,
        rep.values_checked,
        outcomes
    )
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("reader") {
        reader(
            &PathBuf::from(&args[2]),
            &PathBuf::from(&args[3]),
            &PathBuf::from(&args[4]),
        );
        return;
    }
    if args.get(1).map(String::as_str) == Some("worker") {
        let n = |i: usize| args[i].parse::<u64>().unwrap();
        worker(
            &PathBuf::from(&args[2]),
            &PathBuf::from(&args[3]),
            n(4),
            n(5),
            n(6),
            n(7),
        );
        return;
    }
    // libtest's own flags (--nocapture, test filters, ...) are accepted and
    // ignored, so `cargo test` can pass them to every test binary.
    let soak = args
        .iter()
        .position(|a| a == "--soak")
        .map(|i| args[i + 1].parse::<u64>().expect("--soak SECONDS"));
    let tests: Vec<(&str, Run)> = vec![
        (
            "torture_processes_and_threads_agree_with_every_snapshot",
            Run {
                processes: 3,
                threads: 3,
                ops: 6000,
                seed: 1,
                kill: false,
            },
        ),
        (
            "torture_survivors_hold_when_workers_are_killed",
            Run {
                processes: 4,
                threads: 2,
                ops: 20000,
                seed: 2,
                kill: true,
            },
        ),
    ];
    let mut passed = 0;
    let started = Instant::now();
    println!("\nrunning {} tests", tests.len());
    for (name, cfg) in &tests {
        let summary = run(cfg);
        println!("test {name} ... ok\n    {summary}");
        passed += 1;
    }
    if let Some(secs) = soak {
        let until = Instant::now() + Duration::from_secs(secs);
        let mut seed = 100;
        while Instant::now() < until {
            seed += 1;
            let summary = run(&Run {
                processes: 4,
                threads: 3,
                ops: 20000,
                seed,
                kill: seed % 2 == 0,
            });
            println!("soak seed {seed} ... ok\n    {summary}");
        }
    }
    println!(
        "\ntest result: ok. {passed} passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in {:.2}s\n",
        started.elapsed().as_secs_f64()
    );
}
