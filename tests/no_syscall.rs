//! The record path makes no system call.
//!
//! The test re-executes its own binary under `strace -f`, with
//! `EDGEMARK_NO_SYSCALL_CHILD` set so that the child runs the record loop
//! instead: it sets up a file-backed region, makes one marker system call (a
//! `stat` of a path that does not exist), runs 100,000 first-write records,
//! 100,000 duplicate records and 100,000 duplicate `record_elapsed` calls,
//! makes a second marker call, and checks the outcomes. The parent then
//! reads the trace and asserts that no thread made a system call between
//! the two markers. (Reading `CLOCK_MONOTONIC` through the vDSO is not a
//! system call, so it never shows in a trace; a clock source without a vDSO
//! path would, and would fail this test.)
//!
//! Without strace the test is skipped with a message, unless the `CI`
//! environment variable is set: under CI a missing strace is a failure.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use edgemark::{Edge, Event, Mark, Outcome, Recorder};

use edgemark::clock::Clock;

const CHILD: &str = "EDGEMARK_NO_SYSCALL_CHILD";
const BEGIN_MARKER: &str = "/edgemark-no-syscall-marker/begin";
const END_MARKER: &str = "/edgemark-no-syscall-marker/end";
const EDGES: [Edge; 2] = [Edge::new(0, 1), Edge::new(1, 2)];
/// Requests in the loop: 8 first writes each, 100,000 in all.
const REQUESTS: usize = 12_500;
const DOMAIN: &str = "worker_local";

#[test]
fn record_loop_makes_no_system_call() {
    traced("record_loop_makes_no_system_call", Clock::Monotonic);
}

#[test]
fn counter_record_loop_makes_no_system_call() {
    traced("counter_record_loop_makes_no_system_call", Clock::Counter);
}

/// Runs the record loop on a region with `clock` under strace, as the test
/// `test_name` re-executed (the child runs the loop itself).
fn traced(test_name: &str, clock: Clock) {
    if let Some(dir) = std::env::var_os(CHILD) {
        record_loop(Path::new(&dir), clock);
        return;
    }

    let under_ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
    if let Err(why) = strace_works() {
        if under_ci {
            panic!("{why}; CI must install strace (apt-get install -y strace)");
        }
        // Straight to stderr, past the harness's capture, so the skip shows.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED {test_name}: {why} (install strace to run it; under CI=true this fails)"
        );
        return;
    }

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("strace.log");
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("strace")
        .arg("-f")
        .arg("-o")
        .arg(&log)
        .arg(&exe)
        .args(["--exact", test_name, "--test-threads=1", "--nocapture"])
        .env(CHILD, dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the traced child failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let trace = std::fs::read_to_string(&log).unwrap();
    let between = calls_between_markers(&trace);
    assert!(
        between.is_empty(),
        "the record loop made {} system call(s):\n{}",
        between.len(),
        between.join("\n")
    );
}

/// Whether strace is installed and may trace a child here.
fn strace_works() -> Result<(), String> {
    match Command::new("strace")
        .args(["-o", "/dev/null", "true"])
        .output()
    {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err("strace is not installed".to_owned())
        }
        Err(e) => Err(format!("strace could not be run: {e}")),
        Ok(o) if !o.status.success() => Err(format!(
            "strace cannot trace here: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Ok(_) => Ok(()),
    }
}

/// The trace lines strictly between the two markers that show a system call
/// being made. Completions of calls begun before the first marker
/// (`<... futex resumed>`), signal deliveries and exits are not calls made
/// in the loop.
fn calls_between_markers(trace: &str) -> Vec<String> {
    let lines: Vec<&str> = trace.lines().collect();
    let begin = lines
        .iter()
        .position(|l| l.contains(BEGIN_MARKER))
        .expect("the first marker is in the trace");
    let end = lines
        .iter()
        .position(|l| l.contains(END_MARKER))
        .expect("the second marker is in the trace");
    assert!(begin < end, "the markers are in order");
    lines[begin + 1..end]
        .iter()
        .filter(|l| {
            let call = l
                .split_once(' ')
                .map_or(**l, |(_pid, rest)| rest)
                .trim_start();
            !(call.starts_with("<...") || call.starts_with("---") || call.starts_with("+++"))
        })
        .map(|l| l.to_string())
        .collect()
}

/// The child: a region set up, then the markers around the record loop.
fn record_loop(dir: &Path, clock: Clock) {
    let rec = Recorder::builder()
        .edge(0, 1)
        .edge(1, 2)
        .slots(16_384)
        .domain(DOMAIN)
        .clock(clock)
        .create(dir.join("no-syscall.region"))
        .unwrap();
    if rec.clock() != Some(clock) {
        // The counter is not trusted here: the loop runs on the fallback.
        let _ = writeln!(
            std::io::stderr(),
            "NOTE: the {clock} clock is not trusted here; the loop reads the {} clock",
            rec.clock().unwrap()
        );
    }
    let marks: Vec<Mark> = EDGES
        .iter()
        .flat_map(|&e| Event::ALL.map(|ev| Mark::new(e, ev).chunk_seq(9)))
        .collect();
    // Warm-up: one request through every call of the loop.
    let warm = rec.begin().unwrap();
    for &m in &marks {
        rec.record(warm, m);
        rec.record(warm, m);
        rec.record_elapsed(warm, m, 1.0, DOMAIN);
    }
    rec.close(warm);
    let tokens: Vec<_> = (0..REQUESTS).map(|_| rec.begin().unwrap()).collect();

    let (mut recorded, mut duplicate, mut other) = (0u64, 0u64, 0u64);
    marker(BEGIN_MARKER);
    for pass in 0..3 {
        for &t in &tokens {
            for &m in &marks {
                let o = if pass < 2 {
                    rec.record(t, m)
                } else {
                    rec.record_elapsed(t, m, 2.5, DOMAIN)
                };
                match o {
                    Outcome::Recorded => recorded += 1,
                    Outcome::Duplicate => duplicate += 1,
                    _ => other += 1,
                }
            }
        }
    }
    marker(END_MARKER);

    let n = (REQUESTS * marks.len()) as u64;
    assert_eq!(n, 100_000);
    assert_eq!((recorded, duplicate, other), (n, 2 * n, 0));
}

/// A system call that is easy to find in a trace: a `stat` of a path that
/// does not exist.
fn marker(path: &str) {
    let _ = std::hint::black_box(std::fs::metadata(PathBuf::from(path)));
}
