//! The upstream recorder's cases again, with every stage observation made by
//! a real worker process (`edgemark batch`, one per stage) that attached to
//! the region by path; the test process is the orchestrator. Then races
//! between real processes.

#[macro_use]
mod common;

use common::{E01, Processes, Worker, obs};
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
        assert!(
            outcomes
                .iter()
                .all(|o| matches!(o, Outcome::Recorded | Outcome::Duplicate))
        );
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

#[test]
fn processes_register_clock_domains_at_run_time_until_the_table_is_full() {
    let p = Processes::new();
    let mut workers: Vec<Worker> = (0..4).map(|_| Worker::spawn(&p.path)).collect();
    let events = [
        ProducerFirstNonemptyEmit,
        EdgeFirstSendComplete,
        ConsumerFirstAccept,
        ConsumerFirstNonemptyOutput,
    ];
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    // Each round names three new domains: workers 0 and 1 race to register
    // one name, workers 2 and 3 each register their own, all at once. The
    // table holds 32: pad it so that after the full rounds one entry is left
    // for the last round's three names.
    while (edgemark::limits::MAX_DOMAINS - p.rec.domains().len()) % 3 != 1 {
        let pad = format!("pad_{}", p.rec.domains().len());
        p.rec.register_domain(&pad).unwrap();
    }
    let base = p.rec.domains().len();
    let full_rounds = (edgemark::limits::MAX_DOMAINS - base) / 3;
    assert!(full_rounds >= 5, "{base} domains before the rounds");
    for round in 0..=full_rounds {
        let t = p.rec.begin().unwrap();
        let shared = leak(format!("shared_{round}"));
        let names = [
            shared,
            shared,
            leak(format!("own_{round}_2")),
            leak(format!("own_{round}_3")),
        ];
        for (w, worker) in workers.iter_mut().enumerate() {
            let o = obs(E01, events[w]).ms(1.0 + w as f64).in_domain(names[w]);
            worker.send(&common::record_line(t, &o));
        }
        let outcomes: Vec<Outcome> = workers
            .iter_mut()
            .map(|w| common::outcome_named(&w.read()))
            .collect();
        let domains = p.rec.domains();
        let snap = p.rec.close(t);
        if round < full_rounds {
            assert!(
                outcomes.iter().all(|&o| o == Outcome::Recorded),
                "{outcomes:?}"
            );
            let seg = snap.segment(E01, 0).unwrap();
            for (w, e) in events.iter().enumerate() {
                assert_eq!(seg.domain(*e), Some(names[w]), "round {round} worker {w}");
            }
            // One name, one id, whichever process registered it.
            assert_eq!(seg.elapsed_between(events[0], events[1]), Some(1.0));
            assert_eq!(seg.elapsed_between(events[1], events[2]), None);
            assert_eq!(domains.len(), base + 3 * (round + 1), "{domains:?}");
        } else {
            // The last free entry went to one of the three names.
            assert_eq!(domains.len(), edgemark::limits::MAX_DOMAINS, "{domains:?}");
            let won: Vec<&str> = names
                .iter()
                .copied()
                .filter(|n| domains.iter().any(|d| d == n))
                .collect();
            assert!(!won.is_empty(), "{domains:?}");
            for (w, o) in outcomes.iter().enumerate() {
                let want = if won.contains(&names[w]) {
                    Outcome::Recorded
                } else {
                    Outcome::DomainTableFull
                };
                assert_eq!(*o, want, "worker {w}: {outcomes:?}");
            }
            let refused = outcomes
                .iter()
                .filter(|&&o| o == Outcome::DomainTableFull)
                .count() as u64;
            let c = p.rec.counters();
            let counted = c
                .refused
                .iter()
                .find(|(o, _)| *o == Outcome::DomainTableFull)
                .unwrap()
                .1;
            assert_eq!(counted, refused);
        }
        for n in names {
            assert!(
                domains.iter().filter(|d| *d == n).count() <= 1,
                "{domains:?}"
            );
        }
    }
}

#[test]
fn a_killed_workers_requests_expire_through_the_ordinary_close() {
    let p = Processes::new();
    let mut doomed = Worker::spawn(&p.path);
    let theirs: Vec<edgemark::Token> = (0..2)
        .map(|_| doomed.ask("begin").parse().unwrap())
        .collect();
    let line = common::record_line(theirs[0], &obs(E01, ProducerFirstNonemptyEmit).chunk(4));
    assert_eq!(common::outcome_named(&doomed.ask(&line)), Outcome::Recorded);
    // Killed (SIGKILL, then reaped) before it could close them.
    drop(doomed);
    for t in &theirs {
        assert_eq!(p.rec.snapshot(*t).state(), RequestState::Open);
    }
    // No request is an hour old; every one is as old as no time at all.
    let hour = std::time::Duration::from_secs(3600);
    assert_eq!(p.rec.expire_open(hour).unwrap().expired, 0);
    assert_eq!(
        p.rec
            .expire_open(std::time::Duration::ZERO)
            .unwrap()
            .expired,
        2
    );
    for t in &theirs {
        assert_eq!(p.rec.snapshot(*t).state(), RequestState::Gone);
    }
    let c = p.rec.counters();
    assert_eq!((c.expired_requests, c.closed_requests), (2, 2));
    // The closed requests reach a reader as any close hands them over: the
    // worker's value kept, the events it never got null.
    let mut out = Vec::new();
    while !p.rec.drain_closed(16, &mut out).unwrap().caught_up {}
    assert_eq!(out.len(), 2);
    let first = out.iter().find(|c| c.token() == theirs[0]).unwrap();
    let seg = first.snapshot().segment(E01, 0).unwrap();
    assert_eq!(seg.first_chunk_seq(), Some(4));
    assert!(seg.get(ProducerFirstNonemptyEmit).is_some());
    assert_eq!(seg.get(ConsumerFirstNonemptyOutput), None);
    let second = out.iter().find(|c| c.token() == theirs[1]).unwrap();
    assert!(second.snapshot().is_empty());
}
