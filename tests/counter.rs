//! Regions whose shared clock is the time-stamp counter
//! ([`Clock::Counter`]): creation where the counter is trusted and where it
//! is not, the rate check at attach, the refusal of `host_monotonic` values
//! measured elsewhere, and an origin and a record taken in two real
//! processes against `CLOCK_MONOTONIC` readings around them.
//!
//! A process distrusts the counter when [`DISTRUST_COUNTER_ENV`] is `1`;
//! the tests use it to run a process where the counter is "not trusted" on
//! any machine. The child processes are this test binary re-executed with
//! [`CHILD`] naming what to do.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use edgemark::{AttachError, Edge, Event, Mark, Outcome, Recorder, Token};

use edgemark::clock::{Clock, DISTRUST_COUNTER_ENV, monotonic_ns};

/// Set in a child: `"<test name>"`; the region path and token follow in
/// [`REGION`] and [`TOKEN`].
const CHILD: &str = "EDGEMARK_COUNTER_CHILD";
const REGION: &str = "EDGEMARK_COUNTER_REGION";
const TOKEN: &str = "EDGEMARK_COUNTER_TOKEN";
const E01: Edge = Edge::new(0, 1);
const EMIT: Event = Event::ProducerFirstNonemptyEmit;
/// Byte offsets of the header's clock-kind and counter-rate words.
const CLOCK_KIND_AT: u64 = 19 * 8;
const COUNTER_RATE_AT: u64 = 20 * 8;

/// Whether this process does not trust the counter: exactly when a region
/// asked for it gets the monotonic clock.
fn counter_untrusted_here() -> bool {
    let rec = Recorder::builder()
        .edge(0, 1)
        .clock(Clock::Counter)
        .create_in_memory()
        .unwrap();
    rec.clock() != Some(Clock::Counter)
}

fn skip(test: &str) {
    // Straight to stderr, past the harness's capture, so the skip shows.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: the kernel does not trust the time-stamp counter here"
    );
}

fn counter_region(dir: &Path) -> Recorder {
    Recorder::builder()
        .edge(0, 1)
        .domain("worker_local")
        .clock(Clock::Counter)
        .create(dir.join("counter.region"))
        .unwrap()
}

/// Runs this binary's test `test` as a child with `env`, and returns its
/// stdout; fails the test if the child fails.
fn child(test: &str, env: &[(&str, String)]) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--test-threads=1", "--nocapture"])
        .env(CHILD, test);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "child {test} failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// What follows `tag` on its line of `out`.
fn tagged<'a>(out: &'a str, tag: &str) -> &'a str {
    out.lines()
        // The harness may print the test's name on the same line first.
        .find_map(|l| l.find(tag).map(|i| &l[i + tag.len()..]))
        .unwrap_or_else(|| panic!("no {tag:?} line in:\n{out}"))
}

fn in_child(test: &str) -> bool {
    std::env::var(CHILD).is_ok_and(|t| t == test)
}

/// The child's records: an event, after sleeping so many milliseconds.
const STEPS: [(Event, u64); 3] = [
    (EMIT, 0),
    (Event::EdgeFirstSendComplete, 3),
    (Event::ConsumerFirstAccept, 30),
];

#[test]
fn an_origin_and_a_record_in_two_processes_agree_with_the_monotonic_clock() {
    const NAME: &str = "an_origin_and_a_record_in_two_processes_agree_with_the_monotonic_clock";
    if in_child(NAME) {
        // The recording process: attaches (and checks the rate), then
        // records between two readings of CLOCK_MONOTONIC.
        let rec = Recorder::attach(std::env::var(REGION).unwrap()).unwrap();
        let t: Token = std::env::var(TOKEN).unwrap().parse().unwrap();
        assert_eq!(rec.clock(), Some(Clock::Counter));
        for (i, (event, sleep_ms)) in STEPS.into_iter().enumerate() {
            std::thread::sleep(std::time::Duration::from_millis(sleep_ms));
            let before = monotonic_ns();
            let outcome = rec.record(t, Mark::new(E01, event));
            let after = monotonic_ns();
            println!("BRACKET {i} {before} {after} {outcome:?}");
        }
        return;
    }
    if counter_untrusted_here() {
        return skip(NAME);
    }
    let dir = tempfile::tempdir().unwrap();
    let rec = counter_region(dir.path());
    let before_begin = monotonic_ns();
    let t = rec.begin().unwrap();
    let after_begin = monotonic_ns();
    let out = child(
        NAME,
        &[
            (REGION, rec.path().unwrap().display().to_string()),
            (TOKEN, t.to_string()),
        ],
    );
    let snap = rec.close(t);
    let seg = snap.segment(E01, 0).unwrap();
    for (i, (event, _)) in STEPS.into_iter().enumerate() {
        let line = tagged(&out, &format!("BRACKET {i} "));
        let f: Vec<&str> = line.split(' ').collect();
        let (before, after): (u64, u64) = (f[0].parse().unwrap(), f[1].parse().unwrap());
        assert_eq!(f[2], "Recorded");
        let us = seg.elapsed_ms(event).unwrap() * 1000.0;
        // The monotonic bracket of the same elapsed time, widened by 5 µs.
        let low = (before.saturating_sub(after_begin)) as f64 / 1000.0 - 5.0;
        let high = (after - before_begin) as f64 / 1000.0 + 5.0;
        assert!(
            low <= us && us <= high,
            "{event}: {us} µs outside [{low}, {high}]"
        );
        assert_eq!(seg.domain(event), Some("host_monotonic"));
    }
}

#[test]
fn a_process_that_distrusts_the_counter_records_only_values_measured_elsewhere() {
    const NAME: &str =
        "a_process_that_distrusts_the_counter_records_only_values_measured_elsewhere";
    if in_child(NAME) {
        let rec = Recorder::attach(std::env::var(REGION).unwrap()).unwrap();
        let t: Token = std::env::var(TOKEN).unwrap().parse().unwrap();
        let emit = Mark::new(E01, EMIT);
        let accept = Mark::new(E01, Event::ConsumerFirstAccept);
        println!("SHARES {}", rec.info().unwrap().shares_clock);
        println!("RECORD {:?}", rec.record(t, emit));
        println!("BEGIN {:?}", rec.begin().map(|_| ()));
        println!(
            "ELAPSED {:?}",
            rec.record_elapsed(t, accept, 4.0, "worker_local")
        );
        return;
    }
    if counter_untrusted_here() {
        return skip(NAME);
    }
    let dir = tempfile::tempdir().unwrap();
    let rec = counter_region(dir.path());
    let t = rec.begin().unwrap();
    let out = child(
        NAME,
        &[
            (REGION, rec.path().unwrap().display().to_string()),
            (TOKEN, t.to_string()),
            (DISTRUST_COUNTER_ENV, "1".to_owned()),
        ],
    );
    assert_eq!(tagged(&out, "SHARES "), "false");
    assert_eq!(tagged(&out, "RECORD "), "ClockMismatch");
    assert_eq!(tagged(&out, "BEGIN "), "Err(ClockMismatch)");
    assert_eq!(tagged(&out, "ELAPSED "), "Recorded");
    let seg = rec.snapshot(t).segment(E01, 0).cloned().unwrap();
    assert_eq!(seg.elapsed_ms(EMIT), None);
    assert_eq!(seg.elapsed_ms(Event::ConsumerFirstAccept), Some(4.0));
    let mismatches = rec
        .counters()
        .refused
        .iter()
        .find(|(o, _)| *o == Outcome::ClockMismatch)
        .map(|(_, n)| *n);
    assert_eq!(mismatches, Some(2), "the record and the begin are counted");
    // Here the counter is trusted: the same request records.
    assert_eq!(rec.record(t, Mark::new(E01, EMIT)), Outcome::Recorded);
}

#[test]
fn a_counter_region_asked_for_where_the_counter_is_untrusted_uses_the_monotonic_clock() {
    const NAME: &str =
        "a_counter_region_asked_for_where_the_counter_is_untrusted_uses_the_monotonic_clock";
    if in_child(NAME) {
        let dir = tempfile::tempdir().unwrap();
        let rec = counter_region(dir.path());
        println!("CLOCK {:?}", rec.clock().unwrap());
        let before = monotonic_ns();
        let t = rec.begin().unwrap();
        println!("RECORD {:?}", rec.record(t, Mark::new(E01, EMIT)));
        let after = monotonic_ns();
        let host = Mark::new(E01, Event::ConsumerFirstAccept);
        println!(
            "HOST {:?}",
            rec.record_elapsed(t, host, 1.0, "host_monotonic")
        );
        let us = rec
            .snapshot(t)
            .segment(E01, 0)
            .unwrap()
            .elapsed_ms(EMIT)
            .unwrap()
            * 1000.0;
        println!("WITHIN {}", us <= (after - before) as f64 / 1000.0 + 1.0);
        return;
    }
    // On every machine: the child distrusts the counter.
    let out = child(NAME, &[(DISTRUST_COUNTER_ENV, "1".to_owned())]);
    assert_eq!(tagged(&out, "CLOCK "), "Monotonic");
    assert_eq!(tagged(&out, "RECORD "), "Recorded");
    // A monotonic region takes host_monotonic values measured elsewhere.
    assert_eq!(tagged(&out, "HOST "), "Recorded");
    assert_eq!(tagged(&out, "WITHIN "), "true");
}

#[test]
fn host_monotonic_values_measured_elsewhere_are_refused_in_a_counter_region() {
    if counter_untrusted_here() {
        return skip("host_monotonic_values_measured_elsewhere_are_refused_in_a_counter_region");
    }
    let rec = Recorder::builder()
        .edge(0, 1)
        .clock(Clock::Counter)
        .create_in_memory()
        .unwrap();
    let t = rec.begin().unwrap();
    let emit = Mark::new(E01, EMIT);
    assert_eq!(
        rec.record_elapsed(t, emit, 1.0, "host_monotonic"),
        Outcome::ClockMismatch
    );
    // The shared clock itself records into that domain.
    assert_eq!(rec.record(t, emit), Outcome::Recorded);
    let snap = rec.close(t);
    let seg = snap.segment(E01, 0).unwrap();
    assert_eq!(seg.domain(EMIT), Some("host_monotonic"));
    assert!(seg.elapsed_ms(EMIT).unwrap() < 1000.0);
}

/// A counter region's file with one header word replaced.
fn tampered(at: u64, f: impl FnOnce(u64) -> u64) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = counter_region(dir.path()).path().unwrap().to_owned();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let mut w = [0u8; 8];
    file.read_exact_at(&mut w, at).unwrap();
    let new = f(u64::from_le_bytes(w));
    file.write_all_at(&new.to_le_bytes(), at).unwrap();
    (dir, path)
}

#[test]
fn a_rate_that_differs_from_this_process_measurement_makes_the_clock_foreign() {
    if counter_untrusted_here() {
        return skip("a_rate_that_differs_from_this_process_measurement_makes_the_clock_foreign");
    }
    // 1% off: far beyond what slewing and calibration explain.
    let (_dir, path) = tampered(COUNTER_RATE_AT, |r| r + r / 100);
    let rec = Recorder::attach(&path).unwrap();
    assert_eq!(rec.clock(), Some(Clock::Counter));
    assert!(!rec.info().unwrap().shares_clock);
    assert_eq!(rec.begin(), Err(Outcome::ClockMismatch));
    // An unchanged region is trusted by the same process.
    let dir = tempfile::tempdir().unwrap();
    let good = counter_region(dir.path());
    let again = Recorder::attach(good.path().unwrap()).unwrap();
    assert!(again.info().unwrap().shares_clock);
    let t = again.begin().unwrap();
    assert_eq!(again.record(t, Mark::new(E01, EMIT)), Outcome::Recorded);
}

#[test]
fn a_bad_clock_kind_or_rate_is_a_clear_attach_error() {
    if counter_untrusted_here() {
        return skip("a_bad_clock_kind_or_rate_is_a_clear_attach_error");
    }
    let (_d1, unknown) = tampered(CLOCK_KIND_AT, |_| 7);
    let e = Recorder::attach(&unknown).unwrap_err();
    assert!(matches!(e, AttachError::Geometry(_)), "{e}");
    assert!(e.to_string().contains("clock kind"), "{e}");
    let (_d2, zero) = tampered(COUNTER_RATE_AT, |_| 0);
    let e = Recorder::attach(&zero).unwrap_err();
    assert!(e.to_string().contains("counter rate"), "{e}");
    // A monotonic kind with a counter rate left in the file.
    let (_d3, mixed) = tampered(CLOCK_KIND_AT, |_| 0);
    let e = Recorder::attach(&mixed).unwrap_err();
    assert!(e.to_string().contains("counter rate"), "{e}");
}
