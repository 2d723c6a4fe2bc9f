//! `edgemark top` in a real terminal: the command runs inside a tmux pane
//! while this process records into the region it shows, and the test reads
//! the pane as a person would see it.
//!
//! Without tmux these tests say so on standard error and pass; CI installs
//! it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use edgemark::{Edge, Event::*, Mark, Outcome, Recorder, Token};

const E01: Edge = Edge::new(0, 1);

/// Whether tmux can run here; if not, says so where it is seen (outside the
/// test harness's capture) and the caller returns.
fn have_tmux(test: &str) -> bool {
    let ok = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED {test}: tmux is not installed (apt-get install tmux)"
        );
    }
    ok
}

/// A tmux server of our own (its own socket) with one pane (160x50 unless
/// said) running `sh script`, killed on drop.
struct Pane {
    socket: PathBuf,
}

impl Pane {
    /// Runs `edgemark top REGION ARGS` in the pane, then prints
    /// `TOP-EXITED <status>` and keeps the pane open.
    fn top(dir: &Path, region: &Path, args: &str) -> Pane {
        Pane::top_sized(dir, region, args, (160, 50))
    }

    /// [`Pane::top`] in a pane of `(columns, lines)`.
    fn top_sized(dir: &Path, region: &Path, args: &str, size: (u16, u16)) -> Pane {
        let script = dir.join("run.sh");
        std::fs::write(
            &script,
            format!(
                "'{}' top '{}' {args}\necho TOP-EXITED $?\nsleep 120\n",
                env!("CARGO_BIN_EXE_edgemark"),
                region.display()
            ),
        )
        .unwrap();
        let pane = Pane {
            socket: dir.join("tmux.sock"),
        };
        let out = pane.tmux(&[
            "new-session",
            "-d",
            "-x",
            &size.0.to_string(),
            "-y",
            &size.1.to_string(),
            "sh",
            script.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "tmux: {out:?}");
        pane
    }

    fn tmux(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("-f")
            .arg("/dev/null")
            .args(args)
            .output()
            .expect("run tmux")
    }

    fn capture(&self) -> String {
        String::from_utf8_lossy(&self.tmux(&["capture-pane", "-p"]).stdout).into_owned()
    }

    fn keys(&self, keys: &str) {
        assert!(self.tmux(&["send-keys", keys]).status.success());
    }

    /// The pane once `ready` holds for it; fails with the last capture after
    /// a generous 20 s.
    fn wait_for(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let screen = self.capture();
            if ready(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "waited for {what}; the pane shows:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Pane {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-server"]);
    }
}

/// The words of the table row whose words begin with `start` (table borders
/// stripped).
fn row(screen: &str, start: &[&str]) -> Option<Vec<String>> {
    screen.lines().find_map(|line| {
        let words: Vec<String> = line
            .split_whitespace()
            .map(|w| w.trim_matches('│').to_owned())
            .filter(|w| !w.is_empty())
            .collect();
        (words.len() >= start.len() && words.iter().zip(start).all(|(w, s)| w == s))
            .then_some(words)
    })
}

fn region(dir: &Path, slots: u32) -> (PathBuf, Recorder) {
    let path = dir.join("pipeline.region");
    let rec = Recorder::builder()
        .edge(0, 1)
        .edge(1, 2)
        .slots(slots)
        .create(&path)
        .unwrap();
    (path, rec)
}

fn at(rec: &Recorder, t: Token, event: edgemark::Event, ms: f64) {
    assert_eq!(
        rec.record_elapsed(t, Mark::new(E01, event), ms, "host_monotonic"),
        Outcome::Recorded
    );
}

#[test]
fn top_shows_edges_and_open_requests_live_and_q_restores_the_terminal() {
    if !have_tmux("top_shows_edges_and_open_requests_live_and_q_restores_the_terminal") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (path, rec) = region(dir.path(), 32);
    // Open before top starts: half way along edge 0->1.
    let first = rec.begin().unwrap();
    at(&rec, first, ProducerFirstNonemptyEmit, 3.0);
    at(&rec, first, EdgeFirstSendComplete, 4.0);
    // Closed before top starts: not among the requests closed since.
    let before = rec.begin().unwrap();
    at(&rec, before, ProducerFirstNonemptyEmit, 400.0);
    rec.close(before);

    let pane = Pane::top(dir.path(), &path, "--interval 0.2");
    let one = pane.wait_for("the open request", |s| s.contains(&first.to_string()));
    for needle in [
        "edge 0->1",
        "edge 1->2",
        "refreshed every 0.2 s",
        "occupancy 1/32 slots",
        "emit -> send complete",
        "accept -> first output",
    ] {
        assert!(one.contains(needle), "{needle:?} missing from\n{one}");
    }
    let open = row(&one, &[&first.to_string()]).expect("the open request's row");
    // Token, age, edges reached, then the four events of 0->1 and of 1->2.
    assert_eq!(open[2], "1/2", "{open:?}");
    assert_eq!(&open[3..], ["3.0", "4.0", "-", "-", "-", "-", "-", "-"]);
    assert_eq!(row(&one, &["0->1", "emit"]).unwrap()[2], "0", "{one}");

    // Close one request with known values, close the first, begin another
    // and refuse one of its records as a duplicate.
    let done = rec.begin().unwrap();
    at(&rec, done, ProducerFirstNonemptyEmit, 12.0);
    at(&rec, done, EdgeFirstSendComplete, 14.0);
    at(&rec, done, ConsumerFirstAccept, 16.0);
    at(&rec, done, ConsumerFirstNonemptyOutput, 20.0);
    rec.close(done);
    rec.close(first);
    // A late record on a closed request: refused, and counted by reason.
    assert_eq!(
        rec.record(first, Mark::new(E01, ConsumerFirstAccept)),
        Outcome::Closed
    );
    let later = rec.begin().unwrap();
    assert_eq!(
        rec.record(later, Mark::new(Edge::new(1, 2), ProducerFirstNonemptyEmit)),
        Outcome::Recorded
    );

    // One refresh reads the histograms, then sweeps the slots: wait for one
    // that began after all of the above.
    let two = pane.wait_for("the view to follow the region", |s| {
        s.contains(&later.to_string())
            && !s.contains(&first.to_string())
            && row(s, &["0->1", "emit"]).is_some_and(|r| r[2] == "2")
    });
    assert_ne!(one, two);
    // Two requests closed since top started; the one closed before is not
    // counted. Quantiles come from the histogram buckets, interpolated
    // inside the bucket that holds the rank: the emits, 3 ms and 12 ms, lie
    // in (2.5, 5] and (10, 25]; the median's rank, 1, ends the first bucket;
    // p95's, 1.9, is 0.9 of the way through the second.
    let emit = row(&two, &["0->1", "emit"]).unwrap();
    assert_eq!(emit[2..6], ["2", "5.00", "23.50", "24.70"], "{two}");
    let output = row(&two, &["0->1", "first", "output"]).unwrap();
    assert_eq!(output[3..5], ["1", "17.50"], "{two}");
    let delta = row(&two, &["0->1", "accept", "->", "first", "output"]).unwrap();
    assert_eq!(delta[5], "1", "one delta closed: {two}");
    let refused = two
        .lines()
        .find(|l| l.starts_with("refused per second"))
        .unwrap();
    assert!(
        refused.contains("closed") && refused.contains("(1)"),
        "{two}"
    );
    let later_row = row(&two, &[&later.to_string()]).unwrap();
    assert_eq!(later_row[2], "1/2");
    assert_eq!(&later_row[3..7], ["-", "-", "-", "-"], "nothing on 0->1");

    pane.keys("q");
    let after = pane.wait_for("top to exit", |s| s.contains("TOP-EXITED"));
    assert!(after.contains("TOP-EXITED 0"), "{after}");
    // The alternate screen is gone: nothing of top's view is left.
    assert!(!after.contains("occupancy"), "{after}");
    drop(rec);
}

#[test]
fn top_scrolls_the_open_requests_and_ctrl_c_quits() {
    if !have_tmux("top_scrolls_the_open_requests_and_ctrl_c_quits") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (path, rec) = region(dir.path(), 128);
    let tokens: Vec<Token> = (0..80).map(|_| rec.begin().unwrap()).collect();
    let pane = Pane::top(dir.path(), &path, "--interval 0.2");
    let one = pane.wait_for("the open requests", |s| s.contains("of 80"));
    assert!(one.contains(" 1-"), "{one}");
    let shown = |s: &str| tokens.iter().filter(|t| s.contains(&t.to_string())).count();
    let page = shown(&one);
    assert!(page > 5 && page < 80, "a page of rows: {page}\n{one}");
    pane.keys("NPage");
    let two = pane.wait_for("the next page", |s| s.contains(&format!(" {}-", page + 1)));
    assert_eq!(shown(&two), page, "{two}");
    pane.keys("Down");
    pane.wait_for("one row down", |s| s.contains(&format!(" {}-", page + 2)));
    pane.keys("C-c");
    let after = pane.wait_for("top to exit", |s| s.contains("TOP-EXITED"));
    assert!(after.contains("TOP-EXITED 0"), "{after}");
    drop(rec);
}

/// Starts top on a region with one open request, spoils the file with
/// `spoil` while top shows it, and returns the pane once top has exited.
fn spoiled(test: &str, spoil: impl FnOnce(&Path)) -> Option<(String, PathBuf)> {
    if !have_tmux(test) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let (path, rec) = region(dir.path(), 32);
    let t = rec.begin().unwrap();
    let pane = Pane::top(dir.path(), &path, "--interval 0.2");
    pane.wait_for("the open request", |s| s.contains(&t.to_string()));
    // This process's mapping must not be touched once the file is spoilt.
    drop(rec);
    spoil(&path);
    let after = pane.wait_for("top to exit", |s| s.contains("TOP-EXITED"));
    assert!(after.contains("TOP-EXITED 1"), "{after}");
    let messages: Vec<&str> = after
        .lines()
        .filter(|l| l.starts_with("edgemark: "))
        .collect();
    assert_eq!(messages.len(), 1, "{after}");
    assert!(messages[0].contains(path.to_str().unwrap()), "{after}");
    assert!(!after.contains("panicked"), "{after}");
    assert!(!after.contains("occupancy"), "terminal restored:\n{after}");
    Some((messages[0].to_owned(), path))
}

#[test]
fn top_leaves_with_one_line_when_the_region_is_truncated() {
    let Some((message, _)) = spoiled(
        "top_leaves_with_one_line_when_the_region_is_truncated",
        |path| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .unwrap()
                .set_len(4096)
                .unwrap()
        },
    ) else {
        return;
    };
    assert!(message.contains("4096 bytes"), "{message}");
}

#[test]
fn top_leaves_with_one_line_when_the_region_header_is_overwritten() {
    let Some((message, _)) = spoiled(
        "top_leaves_with_one_line_when_the_region_header_is_overwritten",
        |path| {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            f.write_all_at(b"garbage!", 0).unwrap();
        },
    ) else {
        return;
    };
    assert!(message.contains("no longer valid"), "{message}");
}

#[test]
fn top_in_an_80_by_24_terminal_keeps_labels_whole_and_lists_open_requests() {
    if !have_tmux("top_in_an_80_by_24_terminal_keeps_labels_whole_and_lists_open_requests") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (path, rec) = region(dir.path(), 32);
    let tokens: Vec<Token> = (0..12)
        .map(|i| {
            let t = rec.begin().unwrap();
            at(&rec, t, ProducerFirstNonemptyEmit, 1.0 + f64::from(i));
            at(&rec, t, EdgeFirstSendComplete, 2.0 + f64::from(i));
            t
        })
        .collect();
    let pane = Pane::top_sized(dir.path(), &path, "--interval 0.2", (80, 24));
    let screen = pane.wait_for("the open requests", |s| s.contains("of 12"));
    // "send complete" and "send complete -> accept" are told apart: both
    // whole, the first followed by its count of closed requests.
    let send = row(&screen, &["0->1", "send", "complete"]).expect(&screen);
    assert_eq!(send[3], "0", "{screen}");
    assert!(
        row(&screen, &["0->1", "send", "complete", "->", "accept"]).is_some(),
        "{screen}"
    );
    // The pane lists as many rows as its title says, at least one.
    let title = screen
        .lines()
        .find(|l| l.contains("oldest first:"))
        .expect(&screen);
    let range = title
        .split("oldest first: ")
        .nth(1)
        .and_then(|r| r.split(" of ").next())
        .expect(title);
    let (from, to) = range.split_once('-').expect(title);
    let (from, to): (usize, usize) = (from.parse().unwrap(), to.parse().unwrap());
    let listed = tokens
        .iter()
        .filter(|t| screen.contains(&t.to_string()))
        .count();
    assert_eq!(from, 1, "{screen}");
    assert!(listed >= 1, "{screen}");
    assert_eq!(to, listed, "{screen}");
    // A listed request's values on 0->1, whole.
    let (i, t) = tokens
        .iter()
        .enumerate()
        .find(|(_, t)| screen.contains(&t.to_string()))
        .unwrap();
    let listed_row = row(&screen, &[&t.to_string()]).expect(&screen);
    let (emit, send) = (1.0 + i as f64, 2.0 + i as f64);
    assert_eq!(
        listed_row[3..5],
        [format!("{emit:.1}"), format!("{send:.1}")],
        "{screen}"
    );
    pane.keys("q");
    let after = pane.wait_for("top to exit", |s| s.contains("TOP-EXITED"));
    assert!(after.contains("TOP-EXITED 0"), "{after}");
    drop(rec);
}
