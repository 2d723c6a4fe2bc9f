//! Expiry of open requests (`Recorder::expire_open`): a bound on how long a
//! request stays open, through the ordinary close, each expired request
//! counted once however many expirers run; requests whose age this process
//! cannot judge are left alone.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use edgemark::trace::ClosedRequest;
use edgemark::{
    AttachOptions, Edge, Event::*, Mark, Outcome, Recorder, RequestState, Token, Viewer,
};

const E01: Edge = Edge::new(0, 1);
const HOUR: Duration = Duration::from_secs(3600);

fn drain_all(rec: &Recorder) -> Vec<ClosedRequest> {
    let mut out = Vec::new();
    loop {
        let d = rec.drain_closed(16, &mut out).unwrap();
        assert_eq!(d.lost, 0);
        if d.caught_up {
            return out;
        }
    }
}

fn peek(path: &Path, at: u64) -> u64 {
    let f = std::fs::File::open(path).unwrap();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, at).unwrap();
    u64::from_le_bytes(b)
}

fn poke(path: &Path, at: u64, value: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&value.to_le_bytes(), at).unwrap();
}

#[test]
fn requests_open_for_the_bound_are_closed_drained_with_missing_events_null_and_counted() {
    let rec = Recorder::builder()
        .edge(0, 1)
        .slots(8)
        .closed_entries(16)
        .create_in_memory()
        .unwrap();
    let busy = rec.begin().unwrap();
    let idle = rec.begin().unwrap();
    let emit = Mark::new(E01, ProducerFirstNonemptyEmit).chunk_seq(7);
    assert_eq!(rec.record(busy, emit), Outcome::Recorded);
    assert_eq!(
        rec.record(busy, Mark::new(E01, EdgeFirstSendComplete)),
        Outcome::Recorded
    );

    // No request is an hour old: nothing is closed or counted.
    let r = rec.expire_open(HOUR).unwrap();
    assert_eq!((r.expired, r.unjudged), (0, 0));
    assert_eq!(rec.open_requests().unwrap().len(), 2);
    assert_eq!(rec.counters().expired_requests, 0);
    let seen = rec.snapshot(busy);

    // Every request open when the call starts is at least 0 s old.
    let r = rec.expire_open(Duration::ZERO).unwrap();
    assert_eq!((r.expired, r.unjudged), (2, 0));
    assert!(rec.open_requests().unwrap().is_empty());
    for t in [busy, idle] {
        assert_eq!(rec.snapshot(t).state(), RequestState::Gone);
        assert_eq!(
            rec.record(t, Mark::new(E01, ConsumerFirstAccept)),
            Outcome::Closed,
            "late records of an expired request are refused"
        );
        // Closing it again is the idempotent close of a closed request.
        assert_eq!(rec.close(t).state(), RequestState::Gone);
    }
    // A second expiry finds nothing left.
    assert_eq!(rec.expire_open(Duration::ZERO).unwrap().expired, 0);

    // Each reached the readers as any close hands a request over.
    let got = drain_all(&rec);
    let tokens: HashSet<Token> = got.iter().map(ClosedRequest::token).collect();
    assert_eq!(tokens, HashSet::from([busy, idle]));
    let last = got.iter().find(|c| c.token() == busy).unwrap().snapshot();
    assert_eq!(last.state(), RequestState::Closed);
    let seg = last.segment(E01, 0).unwrap();
    let before = seen.segment(E01, 0).unwrap();
    for e in [ProducerFirstNonemptyEmit, EdgeFirstSendComplete] {
        assert!(seg.elapsed_ms(e).is_some(), "{e}");
        assert_eq!(seg.elapsed_ms(e), before.elapsed_ms(e), "{e}");
    }
    assert_eq!(seg.first_chunk_seq(), Some(7));
    let json = serde_json::to_value(last).unwrap();
    assert!(json["0->1:0"]["consumer_first_accept_ms"].is_null());
    assert!(json["0->1:0"]["consumer_first_nonempty_output_ms"].is_null());
    let idle_last = got.iter().find(|c| c.token() == idle).unwrap().snapshot();
    assert!(idle_last.is_empty());

    // Counted as expired, and as closed (with their values in the
    // histograms) as every close counts.
    let c = rec.counters();
    assert_eq!((c.expired_requests, c.closed_requests), (2, 2));
    let emitted = rec
        .histograms()
        .unwrap()
        .into_iter()
        .find(|h| h.metric == "producer_first_nonempty_emit")
        .unwrap();
    assert_eq!(emitted.histogram.count, 1);
    let report = serde_json::to_value(rec.report().unwrap().unwrap()).unwrap();
    assert_eq!(report["expired_requests"], 2);
    // The slots are free for new requests.
    assert!(rec.begin().is_ok());
}

#[test]
fn a_request_younger_than_the_bound_stays_open() {
    const BOUND: Duration = Duration::from_millis(100);
    let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    for attempt in 0.. {
        let old = rec.begin().unwrap();
        std::thread::sleep(2 * BOUND);
        let young_begun = Instant::now();
        let young = rec.begin().unwrap();
        let r = rec.expire_open(BOUND).unwrap();
        if young_begun.elapsed() >= BOUND {
            // This machine stalled for the whole bound between the young
            // request's begin and the expiry's reading of the clock: the
            // young request may have been old enough. Try again.
            assert!(attempt < 20, "the machine never ran the test in time");
            rec.close(old);
            rec.close(young);
            continue;
        }
        assert_eq!(r.expired, 1);
        assert_eq!(rec.snapshot(old).state(), RequestState::Gone);
        assert_eq!(rec.snapshot(young).state(), RequestState::Open);
        // Once it has been open for the bound, it expires too.
        std::thread::sleep(BOUND);
        assert_eq!(rec.expire_open(BOUND).unwrap().expired, 1);
        assert_eq!(rec.snapshot(young).state(), RequestState::Gone);
        assert_eq!(rec.counters().expired_requests, 2);
        break;
    }
}

#[test]
fn requests_whose_origin_is_on_another_clock_are_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.region");
    let rec = Recorder::builder().edge(0, 1).create(&path).unwrap();
    let mine = rec.begin().unwrap();
    // The header now names another boot (word 12, the boot ID's low half):
    // a process that attaches is told its clock is not the region's.
    poke(&path, 12 * 8, peek(&path, 12 * 8) ^ 1);
    let foreign = AttachOptions::new()
        .allow_foreign_clock(true)
        .attach(&path)
        .unwrap();
    assert!(!foreign.info().unwrap().shares_clock);
    // Its begin sets an origin on its own clock.
    let theirs = foreign.begin().unwrap();

    // It cannot tell any request's age: it closes nothing.
    let r = foreign.expire_open(Duration::ZERO).unwrap();
    assert_eq!((r.expired, r.unjudged), (0, 2));
    // A process of the region's clock closes its own, not that one.
    let r = rec.expire_open(Duration::ZERO).unwrap();
    assert_eq!((r.expired, r.unjudged), (1, 1));
    assert_eq!(rec.snapshot(mine).state(), RequestState::Gone);
    assert_eq!(rec.snapshot(theirs).state(), RequestState::Open);
    assert_eq!(rec.counters().expired_requests, 1);
}

#[test]
fn a_disabled_recorder_expires_nothing() {
    let r = Recorder::disabled().expire_open(Duration::ZERO).unwrap();
    assert_eq!((r.expired, r.unjudged), (0, 0));
}

#[test]
fn expirers_and_closers_racing_end_and_count_each_request_once() {
    const N: usize = 48;
    const ROUNDS: u64 = 40;
    let rec = Recorder::builder()
        .edge(0, 1)
        .slots(N as u32)
        .closed_entries(256)
        .create_in_memory()
        .unwrap();
    let mut closed_by_close = 0u64;
    let mut expired = 0u64;
    for round in 0..ROUNDS {
        let tokens: Vec<Token> = (0..N).map(|_| rec.begin().unwrap()).collect();
        for t in &tokens {
            rec.record(*t, Mark::new(E01, ConsumerFirstAccept));
        }
        let start = Barrier::new(3);
        let (a, b, closes) = std::thread::scope(|s| {
            let expirer = || {
                start.wait();
                rec.expire_open(Duration::ZERO).unwrap().expired
            };
            let a = s.spawn(expirer);
            let b = s.spawn(expirer);
            // The ordinary close of every request, in reverse slot order
            // so that it meets the expirers half way.
            let closer = s.spawn(|| {
                start.wait();
                tokens
                    .iter()
                    .rev()
                    .filter(|t| rec.close(**t).state() == RequestState::Closed)
                    .count()
            });
            (a.join().unwrap(), b.join().unwrap(), closer.join().unwrap())
        });
        assert_eq!(
            u64::from(a) + u64::from(b) + closes as u64,
            N as u64,
            "round {round}: expirers {a} and {b}, closer {closes}"
        );
        expired += u64::from(a) + u64::from(b);
        closed_by_close += closes as u64;
        assert!(rec.open_requests().unwrap().is_empty());
    }
    let c = rec.counters();
    assert_eq!(c.expired_requests, expired);
    assert_eq!(c.closed_requests, ROUNDS * N as u64);
    assert_eq!(expired + closed_by_close, ROUNDS * N as u64);
}

/// Run as an expirer process: waits for the start file, then expires
/// every request of the region and prints how many it closed.
#[test]
fn expirer_child() {
    let (Ok(path), Ok(start)) = (
        std::env::var("EDGEMARK_EXPIRER"),
        std::env::var("EDGEMARK_EXPIRER_START"),
    ) else {
        return;
    };
    let rec = Recorder::attach(&path).unwrap();
    println!("ready");
    while !Path::new(&start).exists() {
        std::hint::spin_loop();
    }
    let r = rec.expire_open(Duration::ZERO).unwrap();
    println!("expired {}", r.expired);
}

#[test]
fn two_expirer_processes_never_count_one_request_twice() {
    const N: usize = 1000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("two.region");
    let start = dir.path().join("start");
    let rec = Recorder::builder()
        .edge(0, 1)
        .slots(N as u32)
        .closed_entries(2048)
        .create(&path)
        .unwrap();
    let tokens: HashSet<Token> = (0..N).map(|_| rec.begin().unwrap()).collect();
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "expirer_child",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("EDGEMARK_EXPIRER", &path)
                .env("EDGEMARK_EXPIRER_START", &start)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut outputs: Vec<_> = children
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().unwrap()).lines())
        .collect();
    // Both have attached before either starts.
    for out in &mut outputs {
        assert!(
            out.by_ref()
                .map(Result::unwrap)
                .any(|l| l.contains("ready"))
        );
    }
    std::fs::write(&start, b"").unwrap();
    let mut expired = 0u64;
    for (mut child, out) in children.into_iter().zip(outputs) {
        // Every line, to the end: a child whose output is not read fails
        // on a closed pipe.
        let lines: Vec<String> = out.map(Result::unwrap).collect();
        let n: u64 = lines
            .iter()
            .find_map(|l| l.split_once("expired ").map(|(_, n)| n.trim().to_owned()))
            .expect("the child says what it expired")
            .parse()
            .unwrap();
        assert!(child.wait().unwrap().success());
        expired += n;
    }
    assert_eq!(expired, N as u64, "each request expired by exactly one");
    assert_eq!(rec.counters().expired_requests, N as u64);
    assert_eq!(rec.counters().closed_requests, N as u64);
    let drained: HashSet<Token> = drain_all(&rec).iter().map(ClosedRequest::token).collect();
    assert_eq!(drained, tokens, "each reached the readers once");
}

#[test]
fn a_read_only_attach_sees_the_counter() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.region");
    let rec = Recorder::builder().edge(0, 1).create(&path).unwrap();
    rec.begin().unwrap();
    rec.expire_open(Duration::ZERO).unwrap();
    let viewer = Viewer::attach(&path).unwrap();
    assert_eq!(viewer.counters().expired_requests, 1);
}
