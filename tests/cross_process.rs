//! The upstream recorder's cases again, with every stage observation made by
//! a real worker process (`edgemark batch`, one per stage) that attached to
//! the region by path; the test process is the orchestrator. Then races
//! between real processes.

#[macro_use]
mod common;

use common::{obs, Processes, Worker, E01};
use edgemark::{Event::*, Outcome, RequestState};

upstream_case_tests!(Processes::new());

#[test]
fn workers_are_separate_processes_that_attach_by_path() {
    let mut p = Processes::new();
    let a = p.worker(0).pid();
    let b = p.worker(1).pid();
    // Both have attached once they answer.
    assert!(p.worker(1).ask("begin").starts_with("em1."));
    assert_ne!(a, b);
    assert_ne!(a, std::process::id());
    let t = p.rec.begin().unwrap();
    // A worker begins a request of its own, and the orchestrator sees it.
    let theirs: edgemark::Token = p.worker(0).ask("begin").parse().unwrap();
    assert_ne!(theirs, t);
    assert_eq!(p.rec.snapshot(theirs).state(), RequestState::Open);
    assert_eq!(p.rec.owner(theirs).unwrap().pid, u64::from(a));
}

#[test]
fn real_clock_records_from_two_stage_processes_are_ordered() {
    let mut p = Processes::new();
    let t = p.rec.begin().unwrap();
    // Producer process: emit, then send complete; consumer process: accept,
    // then first output. Each reads the region's shared clock itself.
    use common::Pipeline;
    for o in [
        obs(E01, ProducerFirstNonemptyEmit).chunk(0),
        obs(E01, EdgeFirstSendComplete),
        obs(E01, ConsumerFirstAccept),
        obs(E01, ConsumerFirstNonemptyOutput),
    ] {
        assert_eq!(p.record(t, o), Outcome::Recorded, "{o:?}");
    }
    let s = p.rec.close(t);
    let seg = s.segment(E01, 0).unwrap();
    let steps = [
        (ProducerFirstNonemptyEmit, EdgeFirstSendComplete),
        (EdgeFirstSendComplete, ConsumerFirstAccept),
        (ConsumerFirstAccept, ConsumerFirstNonemptyOutput),
    ];
    for (a, b) in steps {
        assert!(seg.elapsed_between(a, b).unwrap() >= 0.0, "{a} -> {b}");
        assert_eq!(seg.domain(a), Some("host_monotonic"));
    }
    assert_eq!(seg.first_chunk_seq(), Some(0));
}

#[test]
fn racing_processes_record_each_event_exactly_once() {
    let p = Processes::new();
    const WORKERS: u64 = 4;
    const ROUNDS: usize = 20;
    let mut workers: Vec<Worker> = (0..WORKERS).map(|_| Worker::spawn(&p.path)).collect();
    for _ in 0..ROUNDS {
        let t = p.rec.begin().unwrap();
        // Every worker gets the same line with its own value; they run
        // concurrently because all lines are written before any reply is read.
        let lines: Vec<String> = (0..WORKERS)
            .map(|w| {
                common::record_line(
                    t,
                    &obs(E01, ProducerFirstNonemptyEmit)
                        .ms(10.0 + w as f64)
                        .chunk(w),
                )
            })
            .collect();
        let mut outcomes = Vec::new();
        for (w, line) in workers.iter_mut().zip(&lines) {
            w.send(line);
        }
        for w in workers.iter_mut() {
            outcomes.push(common::outcome_named(&w.read()));
        }
        let winners: Vec<usize> = (0..outcomes.len())
            .filter(|&i| outcomes[i] == Outcome::Recorded)
            .collect();
        assert_eq!(winners.len(), 1, "{outcomes:?}");
        assert!(outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Recorded | Outcome::Duplicate)));
        let s = p.rec.close(t);
        let seg = s.segment(E01, 0).unwrap();
        let w = winners[0] as u64;
        assert_eq!(
            seg.elapsed_ms(ProducerFirstNonemptyEmit),
            Some(10.0 + w as f64)
        );
        assert_eq!(seg.first_chunk_seq(), Some(w));
    }
}

#[test]
fn orchestrator_snapshots_while_a_worker_records() {
    let mut p = Processes::new();
    let t = p.rec.begin().unwrap();
    use common::Pipeline;
    let mut seen = Vec::new();
    for (i, e) in [
        ProducerFirstNonemptyEmit,
        EdgeFirstSendComplete,
        ConsumerFirstAccept,
        ConsumerFirstNonemptyOutput,
    ]
    .into_iter()
    .enumerate()
    {
        assert_eq!(p.record(t, obs(E01, e).ms(i as f64)), Outcome::Recorded);
        seen.push(p.rec.snapshot(t));
    }
    for (i, s) in seen.iter().enumerate() {
        let seg = s.segment(E01, 0).unwrap();
        let present = [
            ProducerFirstNonemptyEmit,
            EdgeFirstSendComplete,
            ConsumerFirstAccept,
            ConsumerFirstNonemptyOutput,
        ]
        .iter()
        .filter(|e| seg.get(**e).is_some())
        .count();
        assert_eq!(present, i + 1, "snapshot {i} is as of its time");
    }
    // A worker process sees the orchestrator's close.
    p.rec.close(t);
    assert_eq!(
        p.record(t, obs(E01, ConsumerFirstAccept).ms(1.0)),
        Outcome::Closed
    );
}
