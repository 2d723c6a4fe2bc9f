//! Dead owners: requests whose owner process died are found by the owner's
//! identity (pid and start time) and freed; live owners are left alone.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;

use common::Worker;
use edgemark::{Edge, Event::*, Mark, Outcome, Recorder, RequestState, Token};

const E01: Edge = Edge::new(0, 1);

fn region(slots: u32) -> (tempfile::TempDir, std::path::PathBuf, Recorder) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.region");
    let rec = Recorder::builder()
        .edge(0, 1)
        .slots(slots)
        .create(&path)
        .unwrap();
    (dir, path, rec)
}

/// The byte offset of word `word` of slot `slot`.
fn slot_word(rec: &Recorder, slot: u32, word: u64) -> u64 {
    let info = rec.info().unwrap();
    info.slots_offset + u64::from(slot) * info.slot_stride + word * 8
}

fn poke(path: &Path, at: u64, value: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&value.to_le_bytes(), at).unwrap();
}

fn peek(path: &Path, at: u64) -> u64 {
    let f = std::fs::File::open(path).unwrap();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, at).unwrap();
    u64::from_le_bytes(b)
}

fn begin_in(w: &mut Worker) -> Token {
    w.ask("begin").parse().unwrap()
}

#[test]
fn a_killed_owners_requests_are_freed_and_a_live_owners_are_not() {
    let (_d, path, rec) = region(8);
    let mut live = Worker::spawn(&path);
    let mut doomed = Worker::spawn(&path);
    let kept: Vec<Token> = (0..3).map(|_| begin_in(&mut live)).collect();
    let lost: Vec<Token> = (0..2).map(|_| begin_in(&mut doomed)).collect();
    let mine = rec.begin().unwrap();
    for t in kept.iter().chain(&lost) {
        assert_eq!(
            rec.record_elapsed(
                *t,
                Mark::new(E01, ProducerFirstNonemptyEmit),
                1.0,
                "host_monotonic"
            ),
            Outcome::Recorded
        );
    }
    assert_eq!(
        rec.reclaim_dead_owners().unwrap().freed(),
        0,
        "everyone is alive"
    );
    drop(doomed); // SIGKILL, then reaped
    let r = rec.reclaim_dead_owners().unwrap();
    assert_eq!((r.dead_owners, r.dead_holders), (2, 0));
    for t in &lost {
        assert_eq!(rec.snapshot(*t).state(), RequestState::Gone);
        assert_eq!(
            rec.record(*t, Mark::new(E01, ConsumerFirstAccept)),
            Outcome::Closed,
            "late records of a reclaimed request are refused"
        );
    }
    for t in kept.iter().chain([&mine]) {
        assert_eq!(rec.snapshot(*t).state(), RequestState::Open);
    }
    assert_eq!(
        rec.snapshot(kept[0])
            .segment(E01, 0)
            .unwrap()
            .elapsed_ms(ProducerFirstNonemptyEmit),
        Some(1.0)
    );
    assert_eq!(
        rec.reclaim_dead_owners().unwrap().freed(),
        0,
        "reclaim is idempotent"
    );
    // The freed slots are reusable: 8 slots, 4 open.
    let more: Vec<Token> = (0..4).map(|_| rec.begin().unwrap()).collect();
    assert_eq!(more.len(), 4);
    assert_eq!(rec.begin(), Err(Outcome::RegionFull));
    // The live owner can still close its own requests.
    assert!(live
        .ask(&format!("close {}", kept[0]))
        .contains("\"0->1:0\""));
}

#[test]
fn a_reused_pid_does_not_pass_for_the_owner() {
    let (_d, path, rec) = region(4);
    let t = rec.begin().unwrap();
    let other = rec.begin().unwrap();
    // The slot's owner is this (live) process; pretend its pid belonged to
    // a process that started at another time, as a reused pid would.
    let at = slot_word(&rec, t.slot(), 3);
    let start = peek(&path, at);
    assert_ne!(start, 0);
    poke(&path, at, start + 12345);
    let r = rec.reclaim_dead_owners().unwrap();
    assert_eq!(r.dead_owners, 1);
    assert_eq!(rec.snapshot(t).state(), RequestState::Gone);
    assert_eq!(rec.snapshot(other).state(), RequestState::Open);
}

#[test]
fn a_slot_left_locked_by_a_dead_process_is_freed_and_a_live_holder_is_waited_for() {
    let (_d, path, rec) = region(4);
    let t = rec.begin().unwrap();
    let u = rec.begin().unwrap();
    // A process that has exited: spawn one and reap it.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    let head = |t: Token, holder: u32, state: u64| {
        (u64::from(t.generation()) << 32) | (u64::from(holder) << 8) | state
    };
    // As if a close (state 4) died holding t's slot, and a live process
    // (this one) is inside a segment start (state 3) on u's.
    poke(&path, slot_word(&rec, t.slot(), 0), head(t, dead_pid, 4));
    poke(
        &path,
        slot_word(&rec, u.slot(), 0),
        head(u, std::process::id(), 3),
    );
    // A live holder: close waits about a second, then says so and leaves
    // the request open.
    assert_eq!(rec.close(u).state(), RequestState::Busy);
    assert_eq!(rec.snapshot(u).state(), RequestState::Open);
    let r = rec.reclaim_dead_owners().unwrap();
    assert_eq!((r.dead_owners, r.dead_holders), (0, 1));
    assert_eq!(
        rec.snapshot(u).state(),
        RequestState::Open,
        "records still land while segmenting"
    );
    assert_eq!(
        rec.record_elapsed(
            u,
            Mark::new(E01, ConsumerFirstAccept),
            2.0,
            "host_monotonic"
        ),
        Outcome::Recorded
    );
    // t's slot is free again: with u open, three more fit in four slots.
    let slots: Vec<u32> = (0..3).map(|_| rec.begin().unwrap().slot()).collect();
    assert!(slots.contains(&t.slot()), "{slots:?}");
    assert_eq!(rec.begin(), Err(Outcome::RegionFull));
    let busy = rec
        .counters()
        .refused
        .iter()
        .find(|(o, _)| *o == Outcome::Busy)
        .unwrap()
        .1;
    assert_eq!(busy, 1);
    assert_eq!(
        rec.counters()
            .refused
            .iter()
            .find(|(o, _)| *o == Outcome::RegionFull)
            .unwrap()
            .1,
        1
    );
}

#[test]
fn a_header_never_published_is_not_initialised_and_can_be_created_again() {
    let (_d, path, rec) = region(4);
    drop(rec);
    // As if the creator died after writing every field but the version.
    poke(&path, 8, 0);
    let e = Recorder::attach(&path).unwrap_err();
    assert!(matches!(e, edgemark::AttachError::NotInitialised), "{e}");
    assert!(e.to_string().contains("remove the file"));
    std::fs::remove_file(&path).unwrap();
    let rec = Recorder::builder().edge(0, 1).create(&path).unwrap();
    assert!(rec.begin().is_ok());
}

#[test]
fn the_reclaim_command_reports_what_it_freed() {
    let (_d, path, rec) = region(4);
    let mut doomed = Worker::spawn(&path);
    let _lost = begin_in(&mut doomed);
    let _mine = rec.begin().unwrap();
    drop(doomed);
    let out = std::process::Command::new(common::edgemark_bin())
        .arg("reclaim")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "freed 1 slots (1 of dead owners, 0 left locked by dead processes)"
    );
    assert_eq!(rec.open_requests().unwrap().len(), 1);
}

#[test]
fn close_takes_over_from_a_start_that_died_holding_the_slot_and_keeps_its_values() {
    let (_d, path, rec) = region(4);
    let t = rec.begin().unwrap();
    for (e, ms) in [
        (ProducerFirstNonemptyEmit, 3.0),
        (EdgeFirstSendComplete, 5.0),
    ] {
        assert_eq!(
            rec.record_elapsed(t, Mark::new(E01, e), ms, "host_monotonic"),
            Outcome::Recorded
        );
    }
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    // As if a process died inside start_segment (state 3) on t's slot.
    let head = (u64::from(t.generation()) << 32) | (u64::from(dead) << 8) | 3;
    poke(&path, slot_word(&rec, t.slot(), 0), head);
    // A start never takes over (it could not repair a half-done relay)...
    assert_eq!(rec.start_segment(t, E01, 1), Outcome::Busy);
    // ...close does, seals the whole slot, and keeps the recorded values.
    let last = rec.close(t);
    assert_eq!(last.state(), RequestState::Closed);
    let seg = last.segment(E01, 0).unwrap();
    assert_eq!(seg.elapsed_ms(ProducerFirstNonemptyEmit), Some(3.0));
    assert_eq!(seg.elapsed_ms(EdgeFirstSendComplete), Some(5.0));
    assert_eq!(rec.counters().closed_requests, 1);
    let emit = rec
        .histograms()
        .unwrap()
        .into_iter()
        .find(|h| h.edge == E01 && h.metric == "producer_first_nonempty_emit")
        .unwrap();
    assert_eq!(emit.histogram.count, 1);
    assert_eq!(
        rec.record(t, Mark::new(E01, ConsumerFirstAccept)),
        Outcome::Closed
    );
}

#[test]
fn a_region_shared_across_pid_namespaces_judges_no_pid() {
    let (_d, path, rec) = region(4);
    let mut doomed = Worker::spawn(&path);
    let lost = begin_in(&mut doomed);
    drop(doomed);
    let t = rec.begin().unwrap();
    // As if the region had been created in another pid namespace: this
    // attach marks it, for every process, as shared across namespaces.
    poke(&path, 18 * 8, peek(&path, 18 * 8) ^ 0x5a5a);
    let other = Recorder::attach(&path).unwrap();
    assert_eq!(
        other.reclaim_dead_owners().unwrap().freed(),
        0,
        "no pid is judged"
    );
    assert_eq!(
        rec.reclaim_dead_owners().unwrap().freed(),
        0,
        "not even by the creator now"
    );
    assert_eq!(rec.snapshot(lost).state(), RequestState::Open);
    // A dead holder's lock is not taken over either: close says Busy.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let head = (u64::from(t.generation()) << 32) | (u64::from(dead) << 8) | 3;
    poke(&path, slot_word(&rec, t.slot(), 0), head);
    assert_eq!(rec.close(t).state(), RequestState::Busy);
    // The caller's own judgement still works.
    let r = rec.reclaim_where(|_| true, |_| true).unwrap();
    assert_eq!(r.freed(), 2);
}
