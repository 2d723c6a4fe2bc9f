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
    assert!(
        live.ask(&format!("close {}", kept[0]))
            .contains("\"0->1:0\"")
    );
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

/// Runs the `edgemark` command; gives its exit status and standard output.
fn edgemark(args: &[&std::ffi::OsStr]) -> (bool, String) {
    let out = std::process::Command::new(common::edgemark_bin())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// `edgemark ARGS...` in a new pid namespace (`unshare --pid --fork
/// --mount-proc`), as a process of a container would run it.
fn edgemark_in_another_pid_namespace(args: &[&std::ffi::OsStr]) -> (bool, String) {
    let out = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(common::edgemark_bin())
        .args(args)
        .output()
        .expect("util-linux's unshare");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn pid_namespaces(path: &Path) -> serde_json::Value {
    let (ok, out) = edgemark(&["inspect".as_ref(), "--json".as_ref(), path.as_os_str()]);
    assert!(ok, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["pid_namespaces"].clone()
}

#[test]
fn inspect_shows_and_reclaim_explains_a_region_shared_across_pid_namespaces() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: a new pid namespace needs root (CI runs as root)");
        return;
    }
    let (_d, path, rec) = region(4);
    let p = path.as_os_str();
    let mut doomed = Worker::spawn(&path);
    let lost = begin_in(&mut doomed);
    drop(doomed);
    let judged = serde_json::json!({"mixed": false, "pids_judged": true, "why_not_judged": null});
    assert_eq!(pid_namespaces(&path), judged);
    // A viewer from another pid namespace only looks: it marks nothing.
    let t = rec.begin().unwrap().to_string();
    let (ok, out) = edgemark_in_another_pid_namespace(&["snapshot".as_ref(), p, t.as_ref()]);
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "{}");
    assert_eq!(pid_namespaces(&path), judged);
    assert_eq!(rec.info().unwrap().pids_unjudged, None);
    // A writer from another one turns pid judgement off for everyone, and
    // says so in inspect, text and JSON.
    let (ok, out) = edgemark_in_another_pid_namespace(&["begin".as_ref(), p]);
    assert!(ok, "{out}");
    assert_eq!(
        pid_namespaces(&path),
        serde_json::json!({
            "mixed": true,
            "pids_judged": false,
            "why_not_judged": "mixed_pid_namespaces"
        })
    );
    let info = rec.info().unwrap();
    assert!(info.mixed_pid_namespaces);
    assert_eq!(
        info.pids_unjudged,
        Some(edgemark::report::PidsUnjudged::MixedNamespaces)
    );
    let (ok, out) = edgemark(&["inspect".as_ref(), p]);
    assert!(ok, "{out}");
    let line = out.lines().find(|l| l.starts_with("pids ")).unwrap();
    assert!(
        line.contains("NOT judged") && line.contains("--judge-pids"),
        "{line}"
    );
    // reclaim frees nothing, says why and which option frees them.
    let (ok, out) = edgemark(&["reclaim".as_ref(), p]);
    assert!(ok, "{out}");
    assert!(
        out.starts_with("freed 0 slots: pids are not judged in this region: a process from another pid namespace attached"),
        "{out}"
    );
    assert!(out.contains("--judge-pids"), "{out}");
    assert_eq!(rec.snapshot(lost).state(), RequestState::Open);
    let r = rec.reclaim_dead_owners().unwrap();
    assert_eq!(r.freed(), 0);
    assert_eq!(
        r.unjudged,
        Some(edgemark::report::PidsUnjudged::MixedNamespaces)
    );
    let (ok, out) = edgemark(&["reclaim".as_ref(), "--judge-pids".as_ref(), p]);
    assert!(ok, "{out}");
    assert!(out.starts_with("freed "), "{out}");
    assert_eq!(rec.snapshot(lost).state(), RequestState::Gone);
}

#[test]
fn reclaim_removes_an_abandoned_region_and_keeps_one_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("left.region");
    let p = path.as_os_str();
    // Created by a process that has exited, as a killed orchestrator's
    // default region is.
    let (ok, out) = edgemark(&["create".as_ref(), p, "--edge".as_ref(), "0:1".as_ref()]);
    assert!(ok, "{out}");
    let mut worker = Worker::spawn(&path);
    let _t = begin_in(&mut worker);
    let remove = |p| edgemark(&["reclaim".as_ref(), "--remove-if-abandoned".as_ref(), p]);
    let (ok, out) = remove(p);
    assert!(ok, "{out}");
    assert!(
        out.contains("kept") && out.contains("1 requests of live owners"),
        "{out}"
    );
    assert!(path.exists());
    drop(worker);
    let (ok, out) = remove(p);
    assert!(ok, "{out}");
    assert!(out.starts_with("freed 1 slots"), "{out}");
    assert!(out.contains("removed"), "{out}");
    assert!(!path.exists());
    // A region whose creator runs (this process) is kept.
    let (_d, mine, _rec) = region(4);
    let (ok, out) = remove(mine.as_os_str());
    assert!(ok, "{out}");
    assert!(
        out.contains("its creator (pid") && out.contains("is running"),
        "{out}"
    );
    assert!(mine.exists());
}
