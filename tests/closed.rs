//! The ring of closed requests and the trace context: what a close hands
//! to the readers, losses when they fall behind, several reader processes,
//! read-only and broken regions.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use edgemark::trace::ClosedRequest;
use edgemark::{Edge, Event, Mark, Outcome, Recorder, RequestState, TraceContext, Viewer};

const E01: Edge = Edge::new(0, 1);
const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn drain_all(rec: &Recorder) -> (Vec<ClosedRequest>, u64) {
    let mut out = Vec::new();
    let mut lost = 0;
    loop {
        let d = rec.drain_closed(7, &mut out).unwrap();
        lost += d.lost;
        if d.caught_up || d.pending.is_some() {
            return (out, lost);
        }
    }
}

#[test]
fn a_closed_request_reaches_a_reader_once_with_its_context_and_final_values() {
    let rec = Recorder::builder()
        .edge(0, 1)
        .edge(1, 2)
        .create_in_memory()
        .unwrap();
    let parent: TraceContext = TP.parse().unwrap();
    let t = rec.begin_traced(Some(parent)).unwrap();
    let mine = rec.trace_context(t).unwrap();
    assert_eq!(mine.trace_id(), parent.trace_id());
    assert_ne!(mine.span_id(), parent.span_id());
    assert_eq!(mine.flags(), 1);
    let emit = Mark::new(E01, Event::ProducerFirstNonemptyEmit).chunk_seq(3);
    assert_eq!(rec.record(t, emit), Outcome::Recorded);
    let other = Mark::new(Edge::new(1, 2), Event::EdgeFirstSendComplete);
    assert!(rec.record_elapsed(t, other, 12.5, "talker").is_success());
    let before = edgemark::clock::monotonic_ns();
    let last = rec.close(t);
    assert_eq!(last.state(), RequestState::Closed);
    // Closed: no context to hand on any more.
    assert_eq!(rec.trace_context(t), None);

    let (got, lost) = drain_all(&rec);
    assert_eq!((got.len(), lost), (1, 0));
    let c = &got[0];
    assert_eq!(c.token(), t);
    assert_eq!(c.trace_id(), parent.trace_id());
    assert_eq!(c.parent_span_id(), Some(parent.span_id()));
    assert_eq!(c.parent_context(), Some(parent));
    assert_eq!(c.span_id(), mine.span_id());
    assert_eq!(c.context(), mine);
    assert_eq!(c.trace_flags(), 1);
    assert_eq!(c.snapshot().to_json(), last.to_json());
    assert_eq!(c.snapshot().state(), RequestState::Closed);
    let seg = c.snapshot().segment(E01, 0).unwrap();
    assert_eq!(seg.first_chunk_seq(), Some(3));
    assert!(c.closed_unix_ns() >= c.origin_unix_ns());
    assert!(c.closed_ms() * 1e6 <= (edgemark::clock::monotonic_ns() - before) as f64 + 1e9);
    // Taken once: a second drain finds nothing.
    let mut again = Vec::new();
    let d = rec.drain_closed(10, &mut again).unwrap();
    assert_eq!(
        (d.taken, d.lost, d.pending, d.caught_up),
        (0, 0, None, true)
    );
    assert!(again.is_empty());
    assert_eq!(rec.counters().closed_lost, 0);
}

#[test]
fn a_request_begun_without_a_context_starts_its_own_trace() {
    let rec = Recorder::builder().edge(0, 1).create_in_memory().unwrap();
    let a = rec.begin().unwrap();
    let b = rec.begin_traced(None).unwrap();
    let (ca, cb) = (rec.trace_context(a).unwrap(), rec.trace_context(b).unwrap());
    assert_ne!(ca.trace_id(), cb.trace_id());
    assert_ne!(ca.trace_id(), [0; 16]);
    assert!(ca.sampled());
    rec.close(a);
    rec.close(b);
    let (got, _) = drain_all(&rec);
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|c| c.parent_span_id().is_none()));
    assert_eq!(got[0].trace_id(), ca.trace_id());
    assert_eq!(got[1].trace_id(), cb.trace_id());
    // A reused slot's token no longer names the old request's context.
    let c = rec.begin().unwrap();
    assert_eq!(rec.trace_context(a), None);
    assert!(rec.trace_context(c).is_some());
}

#[test]
fn a_reader_a_ring_behind_loses_the_oldest_and_counts_them() {
    let rec = Recorder::builder()
        .edge(0, 1)
        .slots(4)
        .closed_entries(4)
        .create_in_memory()
        .unwrap();
    assert_eq!(rec.info().unwrap().ring_entries, 4);
    let mut tokens = Vec::new();
    for _ in 0..10 {
        let t = rec.begin().unwrap();
        rec.record(t, Mark::new(E01, Event::ProducerFirstNonemptyEmit));
        rec.close(t);
        tokens.push(t);
    }
    // Counted as they were overwritten, by the closes that overwrote
    // them: before any reader came, and not again by the reader.
    assert_eq!(rec.counters().closed_lost, 6);
    let (got, lost) = drain_all(&rec);
    assert_eq!(lost, 0);
    assert_eq!(rec.counters().closed_lost, 6);
    let order: Vec<_> = got.iter().map(ClosedRequest::token).collect();
    assert_eq!(order, tokens[6..]);
    // Closes went on regardless, and the ring goes on after the loss.
    let t = rec.begin().unwrap();
    rec.close(t);
    let (got, lost) = drain_all(&rec);
    assert_eq!((got.len(), lost), (1, 0));
}

#[test]
fn a_region_without_a_ring_closes_as_before_and_drains_nothing() {
    let rec = Recorder::builder()
        .edge(0, 1)
        .closed_entries(0)
        .create_in_memory()
        .unwrap();
    let t = rec.begin().unwrap();
    assert_eq!(rec.close(t).state(), RequestState::Closed);
    let (got, lost) = drain_all(&rec);
    assert_eq!((got.len(), lost), (0, 0));
    assert_eq!(rec.info().unwrap().ring_entries, 0);
}

#[test]
fn a_viewer_reads_the_context_and_only_a_recorder_drains() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.region");
    let owner = Recorder::builder().edge(0, 1).create(&path).unwrap();
    let t = owner.begin_traced(Some(TP.parse().unwrap())).unwrap();
    let viewer = Viewer::attach(&path).unwrap();
    assert_eq!(viewer.trace_context(t), owner.trace_context(t));
    owner.close(t);
    assert_eq!(viewer.trace_context(t), None);
    // `drain_closed` is a recorder's (it moves the shared cursor); a
    // viewer has no such method (the doc test on it does not compile).
    let mut out = Vec::new();
    assert_eq!(owner.drain_closed(4, &mut out).unwrap().taken, 1);
}

#[test]
fn a_pending_close_holds_the_readers_until_skipped() {
    // A closer that died after its claim is simulated by a claim taken
    // through the file: the claim counter is word 24 of the header.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.region");
    let rec = Recorder::builder().edge(0, 1).create(&path).unwrap();
    let bump_claims = || {
        let mut bytes = std::fs::read(&path).unwrap();
        let claims = u64::from_le_bytes(bytes[24 * 8..25 * 8].try_into().unwrap());
        bytes[24 * 8..25 * 8].copy_from_slice(&(claims + 1).to_le_bytes());
        std::fs::write(&path, bytes).unwrap();
    };
    bump_claims();
    let t = rec.begin().unwrap();
    rec.close(t);
    let mut out = Vec::new();
    let d = rec.drain_closed(4, &mut out).unwrap();
    assert_eq!((d.taken, d.pending), (0, Some(0)));
    assert!(rec.skip_closed(0));
    assert!(!rec.skip_closed(0), "the cursor moved on");
    let d = rec.drain_closed(4, &mut out).unwrap();
    assert_eq!((d.taken, d.pending), (1, None));
    assert_eq!(out[0].token(), t);
    assert_eq!(rec.counters().closed_lost, 1);
}

#[test]
fn broken_ring_entries_are_lost_and_counted_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.region");
    let rec = Recorder::builder()
        .edge(0, 1)
        .slots(8)
        .closed_entries(8)
        .create(&path)
        .unwrap();
    let info = rec.info().unwrap();
    let ring_at = (info.bytes - u64::from(info.ring_entries) * info.ring_stride) as usize;
    let stride = info.ring_stride as usize;
    for t in (0..8).map(|_| rec.begin().unwrap()).collect::<Vec<_>>() {
        rec.record(t, Mark::new(E01, Event::ProducerFirstNonemptyEmit));
        rec.close(t);
    }
    // Flip one bit in each of entries 1..8 at a different word (entry 0
    // stays whole); entry 7's in its state word.
    let mut bytes = std::fs::read(&path).unwrap();
    for e in 1..8usize {
        let word = if e == 7 { 0 } else { 1 + e * 3 };
        bytes[ring_at + e * stride + word * 8 + 2] ^= 0x10;
    }
    std::fs::write(&path, &bytes).unwrap();
    let (got, lost) = drain_all(&rec);
    assert_eq!(got.len(), 1, "only the whole entry is taken");
    // Six torn entries, lost and counted by the reader; one whose state
    // names a later claim, as if overwritten, is passed over (a real
    // overwrite is counted by the close that made it).
    assert_eq!(lost, 6);
    // Garbage everywhere in the ring: still no panic, and closes go on.
    for b in &mut bytes[ring_at..] {
        *b = 0xa5;
    }
    std::fs::write(&path, &bytes).unwrap();
    let mut out = Vec::new();
    for _ in 0..4 {
        let d = rec.drain_closed(64, &mut out).unwrap();
        if let Some(p) = d.pending {
            rec.skip_closed(p);
        }
    }
    let t = rec.begin().unwrap();
    assert_eq!(rec.close(t).state(), RequestState::Closed);
}

/// Run as a reader process: drains the region until `stop` exists, then
/// once more, printing each token taken.
#[test]
fn ring_reader_child() {
    let (Ok(path), Ok(stop)) = (
        std::env::var("EDGEMARK_RING_READER"),
        std::env::var("EDGEMARK_RING_STOP"),
    ) else {
        return;
    };
    let rec = Recorder::attach(&path).unwrap();
    let mut out = Vec::new();
    let mut last_round = false;
    loop {
        let stopping = std::path::Path::new(&stop).exists();
        loop {
            let d = rec.drain_closed(16, &mut out).unwrap();
            for c in out.drain(..) {
                println!("took {}", c.token());
            }
            if d.caught_up {
                break;
            }
        }
        if last_round {
            break;
        }
        last_round = stopping;
    }
}

#[test]
fn two_reader_processes_never_take_one_closed_request_twice() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("two.region");
    let stop = dir.path().join("stop");
    let rec = Recorder::builder()
        .edge(0, 1)
        .slots(16)
        .closed_entries(64)
        .create(&path)
        .unwrap();
    let exe = std::env::current_exe().unwrap();
    let readers: Vec<_> = (0..2)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "ring_reader_child",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("EDGEMARK_RING_READER", &path)
                .env("EDGEMARK_RING_STOP", &stop)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut closed = Vec::new();
    for i in 0..3000u32 {
        let t = rec.begin().unwrap();
        rec.record(
            t,
            Mark::new(E01, Event::ProducerFirstNonemptyEmit).chunk_seq(i.into()),
        );
        rec.close(t);
        closed.push(t.to_string());
        if i % 64 == 0 {
            std::thread::yield_now();
        }
    }
    std::fs::write(&stop, b"").unwrap();
    let mut taken = Vec::new();
    let mut per_reader = Vec::new();
    for mut r in readers {
        let out = r.stdout.take().unwrap();
        let mine: Vec<String> = BufReader::new(out)
            .lines()
            .map(Result::unwrap)
            // libtest's "test ring_reader_child ... " may share the first
            // line.
            .filter_map(|l| l.split_once("took ").map(|(_, t)| t.to_owned()))
            .collect();
        assert!(r.wait().unwrap().success());
        per_reader.push(mine.len());
        taken.extend(mine);
    }
    let distinct: HashSet<_> = taken.iter().collect();
    assert_eq!(
        distinct.len(),
        taken.len(),
        "a closed request was taken twice"
    );
    let all: HashSet<_> = closed.iter().collect();
    assert!(distinct.iter().all(|t| all.contains(t)));
    let lost = rec.counters().closed_lost;
    assert_eq!(
        taken.len() as u64 + lost,
        closed.len() as u64,
        "every close is taken once or counted lost ({per_reader:?} taken, {lost} lost)"
    );
}
