//! The `edgemark` command, run as a real process.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn edgemark(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgemark"))
        .args(args)
        .output()
        .expect("run edgemark")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn the_demo_runs_a_pipeline_end_to_end_and_its_snapshots_hold() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("snapshots.jsonl");
    let out = edgemark(&[
        "demo",
        "--requests",
        "80",
        "--concurrency",
        "8",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = stdout(&out);
    assert!(
        table.starts_with("edgemark demo: 80 requests closed"),
        "{table}"
    );
    for needle in [
        "edge 0->1 (segment 0)",
        "edge 1->2 (segment 0)",
        "emit -> send complete",
        "send complete -> accept",
        "accept -> first output",
        "record outcomes in the stage workers:",
        "recorded",
        "not_meaningful",
    ] {
        assert!(table.contains(needle), "{needle:?} missing from\n{table}");
    }
    let lines: Vec<Value> = std::fs::read_to_string(&json)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 80, "one snapshot per closed request");
    let mut with_01 = 0;
    let mut second = 0;
    for snap in &lines {
        let m = snap.as_object().unwrap();
        for (key, seg) in m {
            assert!(
                key.starts_with("0->1:") || key.starts_with("1->2:"),
                "{key}"
            );
            let f = |e: &str| seg[format!("{e}_ms")].as_f64();
            // Causal order within one clock domain: the send completes after
            // the emit that produced the chunk, output comes after accept.
            if let (Some(a), Some(b)) = (
                f("producer_first_nonempty_emit"),
                f("edge_first_send_complete"),
            ) {
                assert!(a <= b, "{key}: {seg}");
            }
            if let (Some(a), Some(b)) = (
                f("consumer_first_accept"),
                f("consumer_first_nonempty_output"),
            ) {
                assert!(a <= b, "{key}: {seg}");
            }
            for v in ["internal", "external", "request_id"] {
                assert!(!seg.to_string().contains(v));
            }
        }
        with_01 += usize::from(m.contains_key("0->1:0"));
        second += usize::from(m.contains_key("0->1:1"));
    }
    // "edge 0->1 (segment 0), 77 requests"
    let count_in_table = |prefix: &str| -> usize {
        let line = table.lines().find(|l| l.starts_with(prefix)).unwrap();
        let n = line
            .rsplit(", ")
            .next()
            .unwrap()
            .trim_end_matches(" requests");
        n.parse().unwrap()
    };
    assert_eq!(count_in_table("edge 0->1 (segment 0),"), with_01);
    let second_in_table: usize = table
        .lines()
        .find_map(|l| l.strip_prefix("requests with a second segment: "))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(second_in_table, second);
}

#[test]
fn create_inspect_begin_record_close_from_the_shell() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r.region");
    let ps = p.to_str().unwrap();
    let o = edgemark(&[
        "create", ps, "--edge", "0->1", "--edge", "1:2", "--slots", "8", "--domain", "gpu",
    ]);
    assert!(o.status.success());
    let token = stdout(&edgemark(&["begin", ps])).trim().to_owned();
    let rec = |args: &[&str]| {
        let mut a = vec!["record", ps, &token];
        a.extend_from_slice(args);
        stdout(&edgemark(&a)).trim().to_owned()
    };
    assert_eq!(
        rec(&["0->1", "producer_first_nonempty_emit", "--chunk-seq", "3"]),
        "recorded"
    );
    assert_eq!(rec(&["0:1", "producer_first_nonempty_emit"]), "duplicate");
    assert_eq!(
        rec(&["0:1", "consumer_first_accept", "--not-meaningful"]),
        "not_meaningful"
    );
    // The spellings of earlier versions still work.
    assert_eq!(
        rec(&["0->1", "consumer_first_accept", "--empty", "--chunk", "1"]),
        "not_meaningful"
    );
    assert_eq!(
        rec(&[
            "1->2",
            "consumer_first_accept",
            "--elapsed-ms",
            "4.5",
            "--domain",
            "gpu"
        ]),
        "recorded"
    );
    assert_eq!(
        stdout(&edgemark(&["start-segment", ps, &token, "0:1", "1"])).trim(),
        "started"
    );
    let inspect: Value =
        serde_json::from_slice(&edgemark(&["inspect", ps, "--json"]).stdout).unwrap();
    assert_eq!(inspect["slots"], 8);
    assert_eq!(inspect["open_requests"], 1);
    assert_eq!(inspect["free_slots"], 7);
    assert_eq!(
        inspect["domains"],
        serde_json::json!(["host_monotonic", "gpu"])
    );
    assert_eq!(inspect["open"][0]["token"], token.as_str());
    let text = stdout(&edgemark(&["inspect", ps]));
    assert!(text.contains("edges      0->1, 1->2"), "{text}");
    let last: Value = serde_json::from_slice(&edgemark(&["close", ps, &token]).stdout).unwrap();
    assert_eq!(last["0->1:0"]["first_chunk_seq"], 3);
    assert_eq!(last["1->2:0"]["consumer_first_accept_ms"], 4.5);
    assert_eq!(
        last["1->2:0"]["clock_domains"]["consumer_first_accept"],
        "gpu"
    );
    assert_eq!(rec(&["0->1", "edge_first_send_complete"]), "closed");
    assert_eq!(stdout(&edgemark(&["snapshot", ps, &token])).trim(), "{}");
}

fn assert_one_line_error(o: &Output, what: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{what}: {err}");
    assert!(err.starts_with("edgemark: "), "{what}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{what}: {err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
}

#[test]
fn every_command_refuses_missing_foreign_and_corrupt_files_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.region");
    let foreign = dir.path().join("foreign.region");
    std::fs::write(
        &foreign,
        (0..10_000u32)
            .map(|i| (i * 7919 % 251) as u8)
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    let corrupt = dir.path().join("corrupt.region");
    assert!(
        edgemark(&[
            "create",
            corrupt.to_str().unwrap(),
            "--edge",
            "0->1",
            "--slots",
            "4"
        ])
        .status
        .success()
    );
    poke(&corrupt, 4, 1 << 40); // the slot count
    let empty = dir.path().join("empty.region");
    std::fs::write(&empty, b"").unwrap();
    let token = "em1.0000000000000001.0.1";
    for file in [&missing, &foreign, &corrupt, &empty] {
        let f = file.to_str().unwrap();
        for args in [
            vec!["inspect", f],
            vec!["inspect", f, "--json"],
            vec!["begin", f],
            vec!["record", f, token, "0->1", "consumer_first_accept"],
            vec!["start-segment", f, token, "0->1", "1"],
            vec!["snapshot", f, token],
            vec!["close", f, token],
            vec!["batch", f],
            vec!["watch", f, "--count", "1"],
            vec!["reclaim", f],
            vec!["export", f, "--listen", "127.0.0.1:0", "--serve-for", "0"],
        ] {
            assert_one_line_error(&edgemark(&args), &format!("{args:?}"));
        }
    }
    let exists = edgemark(&["create", corrupt.to_str().unwrap(), "--edge", "0->1"]);
    assert_one_line_error(&exists, "create over an existing file");
}

fn poke(path: &Path, word: u64, value: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&value.to_le_bytes(), word * 8).unwrap();
}

/// `edgemark batch PATH` with `input` on standard input; its output lines.
fn batch(path: &Path, input: &[u8]) -> Vec<String> {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_edgemark"))
        .arg("batch")
        .arg(path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout(&out).lines().map(str::to_owned).collect()
}

fn region(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("r.region");
    let o = edgemark(&[
        "create",
        p.to_str().unwrap(),
        "--edge",
        "0:1",
        "--edge",
        "1:2",
        "--slots",
        "4",
        "--domain",
        "gpu",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    p
}

#[test]
fn batch_answers_a_bad_line_with_an_error_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let p = region(dir.path());
    let token = stdout(&edgemark(&["begin", p.to_str().unwrap()]))
        .trim()
        .to_owned();
    let mut input = Vec::new();
    input.extend_from_slice(b"record \xff\xfe 0:1 producer_first_nonempty_emit\n");
    // A line may end in CR LF.
    input.extend_from_slice(
        format!("record {token} 0:1 producer_first_nonempty_emit --chunk-seq 7\r\n").as_bytes(),
    );
    input.extend_from_slice(b"\n");
    input.extend_from_slice(b"fly away\n");
    input.extend_from_slice(format!("record {token} 0-1 consumer_first_accept\n").as_bytes());
    input.extend_from_slice(format!("record {token} 0:1 no_such_event\n").as_bytes());
    input.extend_from_slice(format!("record {token} '0->1 consumer_first_accept\n").as_bytes());
    input.extend_from_slice(
        format!("record {token} 0:1 consumer_first_accept --elapsed-ms 2\n").as_bytes(),
    );
    input.extend_from_slice(
        format!("record {token} 0:1 consumer_first_accept --bogus\n").as_bytes(),
    );
    input.extend_from_slice(b"record\n");
    input.extend_from_slice(b"begin --help\n");
    // The line ends at the end of input, without a newline.
    input.extend_from_slice(format!("snapshot {token}").as_bytes());
    let lines = batch(&p, &input);
    assert_eq!(lines.len(), 12, "{lines:#?}");
    assert!(
        lines[0].starts_with("error the line is not UTF-8"),
        "{}",
        lines[0]
    );
    assert_eq!(lines[1], "recorded");
    assert_eq!(lines[2], "error empty line");
    assert!(
        lines[3].starts_with("error unrecognized subcommand 'fly'"),
        "{}",
        lines[3]
    );
    assert!(
        lines[4].starts_with("error invalid value '0-1' for '<EDGE>'"),
        "{}",
        lines[4]
    );
    assert_eq!(
        lines[5],
        "error the region's schema has no event \"no_such_event\""
    );
    assert_eq!(lines[6], "error unbalanced quotes");
    assert!(lines[7].contains("--domain"), "{}", lines[7]);
    assert!(lines[8].contains("'--bogus'"), "{}", lines[8]);
    assert!(
        lines[9].starts_with("error the following required arguments were not provided: <TOKEN>"),
        "{}",
        lines[9]
    );
    assert!(lines[10].starts_with("error "), "{}", lines[10]);
    let snap: Value = serde_json::from_str(&lines[11]).unwrap();
    assert_eq!(snap["0->1:0"]["first_chunk_seq"], 7);
    for l in &lines {
        assert!(!l.contains('\n') && !l.contains("panicked"), "{l}");
    }
}

#[test]
fn batch_takes_the_command_lines_grammar_and_both_edge_forms() {
    let dir = tempfile::tempdir().unwrap();
    let p = region(dir.path());
    let lines = batch(&p, b"begin\n");
    let t = &lines[0];
    let script = format!(
        "record {t} 0->1 producer_first_nonempty_emit --chunk-seq 4\n\
         record {t} '0->1' producer_first_nonempty_emit --chunk-seq 5\n\
         record {t} 0:1 edge_first_send_complete --not-meaningful\n\
         record {t} 1:2 consumer_first_accept --elapsed-ms 4.5 --domain gpu\n\
         start-segment {t} 0:1 1\n\
         start {t} \"1->2\" 1\n\
         record {t} 0:1 consumer_first_accept --segment 1\n\
         record {t} 0:1 consumer_first_accept --segment 0\n\
         close {t}\n\
         close {t}\n"
    );
    let lines = batch(&p, script.as_bytes());
    assert_eq!(
        &lines[..8],
        [
            "recorded",
            "duplicate",
            "not_meaningful",
            "recorded",
            "started",
            "started",
            "recorded",
            "stale_segment",
        ],
        "{lines:#?}"
    );
    let last: Value = serde_json::from_str(&lines[8]).unwrap();
    assert_eq!(last["0->1:0"]["first_chunk_seq"], 4);
    assert!(last["0->1:0"]["edge_first_send_complete_ms"].is_null());
    assert_eq!(last["1->2:0"]["consumer_first_accept_ms"], 4.5);
    assert!(last["0->1:1"]["consumer_first_accept_ms"].is_number());
    // Closing again is a mistake the batch names (the library's close is
    // idempotent and would answer an empty snapshot).
    assert!(
        lines[9].starts_with("error request") && lines[9].contains("is not open"),
        "{}",
        lines[9]
    );
}

#[test]
fn a_region_of_another_user_needs_allow_foreign_owner() {
    let dir = tempfile::tempdir().unwrap();
    let p = region(dir.path());
    let ps = p.to_str().unwrap();
    // Only root can give a file away.
    if std::os::unix::fs::chown(&p, Some(65534), None).is_err() {
        eprintln!("SKIPPED: not allowed to give a file to another user here");
        return;
    }
    // Commands that write are refused, and told once how to go on.
    for args in [vec!["begin", ps], vec!["batch", ps], vec!["reclaim", ps]] {
        let o = edgemark(&args);
        assert_one_line_error(&o, &format!("{args:?}"));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("belongs to uid 65534"), "{err}");
        assert_eq!(err.matches("foreign").count(), 1, "{err}");
        assert!(err.contains("pass --allow-foreign-owner"), "{err}");
    }
    // Commands that only read cannot change the file, and need no flag
    // (and still take it).
    let token = "em1.0000000000000001.0.1";
    for args in [
        vec!["inspect", ps],
        vec!["inspect", ps, "--json", "--allow-foreign-owner"],
        vec!["watch", ps, "--count", "1"],
        vec!["snapshot", ps, token],
    ] {
        let o = edgemark(&args);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let token = stdout(&edgemark(&["begin", ps, "--allow-foreign-owner"]));
    assert!(token.starts_with("em1."), "{token}");
}

#[test]
fn create_takes_the_clock_and_inspect_shows_it() {
    let dir = tempfile::tempdir().unwrap();
    let mono = dir.path().join("mono.region");
    let m = mono.to_str().unwrap();
    let o = edgemark(&["create", m, "--edge", "0:1"]);
    assert!(o.status.success(), "{o:?}");
    assert!(stdout(&o).contains("clock   monotonic"), "{}", stdout(&o));
    let o = edgemark(&["inspect", m, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["clock"]["kind"], "monotonic");

    let counter = dir.path().join("counter.region");
    let c = counter.to_str().unwrap();
    let o = edgemark(&["create", c, "--edge", "0:1", "--clock", "counter"]);
    assert!(o.status.success(), "{o:?}");
    let out = stdout(&o);
    // Either the counter, or the fallback and a note saying so.
    let kind = if out.contains("clock   counter") {
        "counter"
    } else {
        assert!(out.contains("clock   monotonic"), "{out}");
        assert!(out.contains("not trusted on this machine"), "{out}");
        "monotonic"
    };
    let o = edgemark(&["inspect", c, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["clock"]["kind"], kind);
    assert!(stdout(&edgemark(&["inspect", c])).contains(&format!("clock      {kind}, boot")));

    let o = edgemark(&["create", c, "--edge", "0:1", "--clock", "sundial"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("sundial"));
}

/// Runs `edgemark ARGS`, reads the first line of its output, closes the
/// pipe, and returns how the command ended: what a `| head -1` does.
fn first_line_then_close(args: &[&str]) -> (String, Output) {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_edgemark"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    {
        let mut r = std::io::BufReader::new(child.stdout.take().unwrap());
        r.read_line(&mut first).unwrap();
    }
    (first, child.wait_with_output().unwrap())
}

fn assert_quiet_success(o: &Output, what: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{what}: {err}");
    assert_eq!(err, "", "{what}");
}

/// A region with `open` requests open (begun by a `batch` that has exited).
fn busy_region(dir: &Path, open: usize) -> std::path::PathBuf {
    let p = dir.join("busy.region");
    let o = edgemark(&["create", p.to_str().unwrap(), "--edge", "0:1"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let tokens = batch(&p, "begin\n".repeat(open).as_bytes());
    assert!(tokens.iter().all(|t| t.starts_with("em1.")));
    p
}

#[test]
fn export_for_longer_than_any_duration_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = region(dir.path());
    let p = p.to_str().unwrap();
    for bad in ["1e20", "inf", "-1", "NaN"] {
        let o = edgemark(&["export", p, "--listen", "127.0.0.1:0", "--serve-for", bad]);
        assert_one_line_error(&o, bad);
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("--serve-for"),
            "{bad}"
        );
    }
}

#[test]
fn watch_with_an_interval_longer_than_any_duration_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = region(dir.path());
    let p = p.to_str().unwrap();
    for bad in ["1e30", "0", "-2", "inf"] {
        let o = edgemark(&["watch", p, "--interval", bad, "--count", "2"]);
        assert_one_line_error(&o, bad);
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("--interval"),
            "{bad}"
        );
    }
}

#[test]
fn inspect_into_a_pipe_closed_early_stops_quietly() {
    let dir = tempfile::tempdir().unwrap();
    // More output than a pipe holds (about 40 bytes per open request).
    let p = busy_region(dir.path(), 3000);
    let (first, o) = first_line_then_close(&["inspect", p.to_str().unwrap()]);
    assert!(first.starts_with("region "), "{first}");
    assert_quiet_success(&o, "inspect | head -1");
}

#[test]
fn watch_into_a_pipe_closed_early_stops_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let p = region(dir.path());
    let (first, o) = first_line_then_close(&[
        "watch",
        p.to_str().unwrap(),
        "--count",
        "3",
        "--interval",
        "0.2",
    ]);
    assert!(first.starts_with("region "), "{first:?}");
    assert_quiet_success(&o, "watch --count 3 | head -1");
}

#[test]
fn batch_into_a_pipe_closed_early_stops_quietly() {
    use std::io::{BufRead, Write};
    let dir = tempfile::tempdir().unwrap();
    let p = region(dir.path());
    let mut child = Command::new(env!("CARGO_BIN_EXE_edgemark"))
        .arg("batch")
        .arg(&p)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"snapshot em1.0000000000000001.0.1\n")
        .unwrap();
    let mut first = String::new();
    {
        let mut r = std::io::BufReader::new(child.stdout.take().unwrap());
        r.read_line(&mut first).unwrap();
    }
    assert_eq!(first, "{}\n");
    // The reader is gone; the next answer has nowhere to go.
    let _ = stdin.write_all(b"snapshot em1.0000000000000001.0.1\n");
    drop(stdin);
    assert_quiet_success(&child.wait_with_output().unwrap(), "batch | head -1");
}

#[test]
fn inspect_onto_a_full_device_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = region(dir.path());
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_edgemark"))
        .args(["inspect", p.to_str().unwrap()])
        .stdout(full)
        .output()
        .unwrap();
    assert_one_line_error(&o, "inspect > /dev/full");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("cannot write to standard output: No space left on device"),
        "{err}"
    );
}

#[test]
fn watch_through_a_pipe_is_plain_text() {
    let dir = tempfile::tempdir().unwrap();
    let p = region(dir.path());
    let o = edgemark(&[
        "watch",
        p.to_str().unwrap(),
        "--count",
        "2",
        "--interval",
        "0.05",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = stdout(&o);
    assert!(!text.contains('\x1b'), "{text:?}");
    // Two refreshes, a blank line between them.
    assert_eq!(text.matches("region ").count(), 2, "{text}");
    assert!(text.contains("\n\nregion "), "{text}");
}

#[test]
fn closing_a_request_twice_or_in_another_region_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let a = region(dir.path());
    let b = dir.path().join("b.region");
    let o = edgemark(&["create", b.to_str().unwrap(), "--edge", "0:1"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let token_of_b = stdout(&edgemark(&["begin", b])).trim().to_owned();
    let o = edgemark(&["close", a, &token_of_b]);
    assert_one_line_error(&o, "close A TOKEN_OF_B");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("foreign region"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // The request in B is untouched, and closes once.
    let first = edgemark(&["close", b, &token_of_b]);
    assert!(first.status.success());
    assert_eq!(stdout(&first).trim(), "{}");
    let again = edgemark(&["close", b, &token_of_b]);
    assert_one_line_error(&again, "close twice");
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("is not open"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    // In a batch, the same answers are error lines, and the batch goes on.
    let b_path = Path::new(b);
    let lines = batch(
        b_path,
        format!("close {token_of_b}\nclose em1.0000000000000001.0.1\nbegin\n").as_bytes(),
    );
    assert!(lines[0].starts_with("error request"), "{lines:?}");
    assert!(lines[1].starts_with("error foreign region"), "{lines:?}");
    assert!(lines[2].starts_with("em1."), "{lines:?}");
}

#[test]
fn demo_refuses_an_output_path_it_cannot_write_before_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let nowhere = dir.path().join("no-such-dir");
    for option in ["--html", "--json"] {
        let file = nowhere.join("out");
        let o = edgemark(&[
            "demo",
            "--quiet",
            "--requests",
            "1000000",
            option,
            file.to_str().unwrap(),
        ]);
        assert_one_line_error(&o, option);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&format!("cannot write {}", file.display())),
            "{err}"
        );
        // Nothing ran: no region, no summary.
        assert_eq!(stdout(&o), "", "{option}");
    }
}

#[test]
fn demo_says_its_concurrency_bound_in_its_own_terms() {
    let o = edgemark(&["demo", "--quiet", "--concurrency", "2000000"]);
    assert_one_line_error(&o, "--concurrency 2000000");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--concurrency 2000000"), "{err}");
    assert!(!err.contains("slot"), "{err}");
}

#[test]
fn demo_names_its_region_at_the_start_and_keeps_it_tidy_and_private() {
    use std::os::unix::fs::PermissionsExt;
    let o = edgemark(&["demo", "--quiet", "--keep", "--requests", "20"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = stdout(&o);
    let region = out
        .lines()
        .find_map(|l| l.strip_prefix("region kept at "))
        .map(std::path::PathBuf::from)
        .unwrap();
    let dir = region.parent().unwrap().to_owned();
    struct Gone(std::path::PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _gone = Gone(dir.clone());
    let err = String::from_utf8_lossy(&o.stderr);
    let shown = region.display().to_string();
    let first = err.lines().next().unwrap_or("");
    assert!(first.contains(&shown), "{err}");
    assert!(err.contains(&format!("edgemark top {shown}")), "{err}");
    assert!(err.contains(&format!("edgemark export {shown}")), "{err}");
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["demo.region"]);
}

#[test]
fn demo_and_report_say_where_they_wrote_the_page() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("s.jsonl");
    let page = dir.path().join("demo.html");
    let o = edgemark(&[
        "demo",
        "--quiet",
        "--requests",
        "20",
        "--json",
        json.to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = stdout(&o);
    assert!(
        out.contains(&format!("latency page written to {}\n", page.display())),
        "{out}"
    );
    assert!(
        out.contains(&format!("snapshots written to {}\n", json.display())),
        "{out}"
    );
    assert!(std::fs::metadata(&page).unwrap().len() > 0);
    let report = dir.path().join("report.html");
    let o = edgemark(&[
        "report",
        json.to_str().unwrap(),
        "--html",
        report.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        stdout(&o),
        format!("latency page written to {}\n", report.display())
    );
}

#[test]
fn create_names_the_edge_it_refuses_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r.region");
    let p = p.to_str().unwrap();
    let o = edgemark(&[
        "create", p, "--edge", "0:1", "--edge", "1:2", "--edge", "0->1",
    ]);
    assert_one_line_error(&o, "twice");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("edge 0->1 is declared twice"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = edgemark(&["create", p, "--edge", "0:1", "--edge", "2:2"]);
    assert_one_line_error(&o, "itself");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("edge 2->2 joins stage 2 to itself"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn a_negative_count_is_refused_as_negative() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r.region");
    let p = p.to_str().unwrap();
    for (args, option) in [
        (
            vec!["create", p, "--edge", "0:1", "--slots", "-1"],
            "--slots",
        ),
        (
            vec!["create", p, "--edge", "0:1", "--segments", "-3"],
            "--segments",
        ),
        (vec!["demo", "--requests", "-5"], "--requests"),
        (
            vec!["create", p, "--edge", "0:1", "--closed-entries", "-1"],
            "--closed-entries",
        ),
    ] {
        let o = edgemark(&args);
        assert!(!o.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(option), "{args:?}: {err}");
        assert!(
            err.contains("a count cannot be negative"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("-- -"), "{args:?}: {err}");
    }
}

#[test]
fn closed_entries_out_of_range_says_that_0_means_no_ring() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r.region");
    let p = p.to_str().unwrap();
    let o = edgemark(&["create", p, "--edge", "0:1", "--closed-entries", "2000000"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("between 0 (no ring) and 1048576"), "{err}");
    let o = edgemark(&["create", p, "--edge", "0:1", "--closed-entries", "0"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn reclaim_says_when_it_closed_a_live_owners_request() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r.region");
    // This process owns the requests, and lives on.
    let rec = edgemark::Recorder::builder()
        .edge(0, 1)
        .slots(4)
        .create(&p)
        .unwrap();
    let locked = rec.begin().unwrap();
    let other = rec.begin().unwrap();
    // As if another process died inside a segment start on `locked`: its
    // slot's head word says "segmenting (state 3), held by a dead pid".
    let mut child = Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    let info = rec.info().unwrap();
    let head_at = info.slots_offset + u64::from(locked.slot()) * info.slot_stride;
    let head = (u64::from(locked.generation()) << 32) | (u64::from(dead_pid) << 8) | 3;
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(&head.to_le_bytes(), head_at).unwrap();

    let o = edgemark(&["reclaim", p.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = stdout(&o);
    assert!(
        out.starts_with("freed 1 slots (0 of dead owners, 1 left locked"),
        "{out}"
    );
    assert!(
        out.contains("closed 1 requests of live owners")
            && out.contains("their values are discarded"),
        "{out}"
    );
    assert_eq!(rec.snapshot(locked).state(), edgemark::RequestState::Gone);
    assert_eq!(rec.snapshot(other).state(), edgemark::RequestState::Open);
    // A plain reclaim of a dead holder says nothing of live owners.
    let o = edgemark(&["reclaim", p.to_str().unwrap()]);
    assert_eq!(stdout(&o).lines().count(), 1, "{}", stdout(&o));
}

#[test]
fn batch_help_lists_every_command_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = region(dir.path());
    let lines = batch(&p, b"help\nbegin\n");
    assert_eq!(lines.len(), 2, "{lines:?}");
    let help = &lines[0];
    assert!(
        help.starts_with("commands: begin [--traceparent TRACEPARENT] | traceparent TOKEN | record TOKEN EDGE EVENT"),
        "{help}"
    );
    for needle in [
        "[--chunk-seq N]",
        "[--not-meaningful]",
        "start-segment TOKEN EDGE SEGMENT",
        "snapshot TOKEN",
        "close TOKEN",
    ] {
        assert!(help.contains(needle), "{needle} missing from {help}");
    }
    assert!(lines[1].starts_with("em1."), "{lines:?}");
}

#[test]
fn both_readmes_give_the_same_install_command() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let install = |readme: &str| -> Vec<String> {
        std::fs::read_to_string(root.join(readme))
            .unwrap()
            .lines()
            // Installing the bindings from this tree (the plugin's extra,
            // installed from the package index, is another command).
            .filter(|l| l.contains("pip install") && l.contains("./python"))
            .map(|l| l.split('#').next().unwrap().trim().to_owned())
            .collect()
    };
    let (top, python) = (install("README.md"), install("python/README.md"));
    assert_eq!(top.len(), 1, "{top:?}");
    assert_eq!(top, python);
}

#[test]
fn snapshot_reads_a_region_on_a_read_only_mount() {
    let dir = tempfile::tempdir().unwrap();
    let p = region(dir.path());
    let token = stdout(&edgemark(&["begin", p.to_str().unwrap()]))
        .trim()
        .to_owned();
    // A private mount namespace in which the directory is bound read-only
    // over itself (root only; CI runs as root).
    let script = format!(
        "mount --bind -o ro '{d}' '{d}' || exit 77\n'{bin}' snapshot '{p}' {token}\n",
        d = dir.path().display(),
        bin = env!("CARGO_BIN_EXE_edgemark"),
        p = p.display(),
    );
    let o = Command::new("unshare")
        .args(["--mount", "sh", "-c", &script])
        .output()
        .unwrap();
    if !matches!(o.status.code(), Some(0 | 1)) {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs as root and can mount: {o:?}"
        );
        eprintln!("SKIPPED: no read-only bind mount here ({o:?})");
        return;
    }
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(stdout(&o).trim(), "{}");
}

#[test]
fn begin_takes_a_traceparent_and_traceparent_prints_the_requests_own() {
    let dir = tempfile::tempdir().unwrap();
    let p = region(dir.path());
    let path = p.to_str().unwrap();
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let o = edgemark(&["begin", path, "--traceparent", tp]);
    assert!(o.status.success(), "{o:?}");
    let token = stdout(&o).trim().to_owned();
    let o = edgemark(&["traceparent", path, &token]);
    assert!(o.status.success(), "{o:?}");
    let mine = stdout(&o).trim().to_owned();
    let parts: Vec<&str> = mine.split('-').collect();
    assert_eq!(parts[..2], ["00", "4bf92f3577b34da6a3ce929d0e0e4736"]);
    assert_ne!(parts[2], "00f067aa0ba902b7");
    assert_eq!(parts[3], "01");
    // Malformed: refused with the format, and no request begun.
    let o = edgemark(&["begin", path, "--traceparent", "00-abc-01"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("00-<32 hex digits>-<16 hex digits>-<2 hex digits>"),
        "{err}"
    );
    // A closed request has no context to hand on.
    assert!(edgemark(&["close", path, &token]).status.success());
    let o = edgemark(&["traceparent", path, &token]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("not open"));
}

/// The region's report has one encoding: `inspect --json` prints the
/// library's `RegionReport` key by key, and the Prometheus text and the
/// `inspect` text show every row of its table of counters and gauges
/// (`edgemark::report::METRICS`) with the same values. (Python's
/// `Region.report()` is checked against `inspect --json` in
/// python/tests/test_core_report.py.)
#[test]
fn inspect_json_and_the_scrape_say_what_the_report_says() {
    use edgemark::prometheus::{self, Format};
    use edgemark::report::{METRICS, MetricKind, MetricValue};
    use edgemark::{Edge, Event, GiveUp, Mark, Recorder};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.region");
    let rec = Recorder::builder()
        .edge(0, 1)
        .edge(1, 2)
        .slots(8)
        .segments(2)
        .closed_entries(2)
        .domain("gpu")
        .create(&path)
        .unwrap();
    let e01 = Edge::new(0, 1);
    // A closed request, a late record for it, a refused value, a dropped
    // segment, a registered domain, a malformed trace context, and more
    // closes than the ring holds, drained so that the loss is counted.
    let done = rec.begin().unwrap();
    rec.record(
        done,
        Mark::new(e01, Event::ProducerFirstNonemptyEmit).chunk_seq(1),
    );
    rec.close(done);
    rec.record(done, Mark::new(e01, Event::EdgeFirstSendComplete));
    let open = rec.begin().unwrap();
    rec.record_elapsed(
        open,
        Mark::new(e01, Event::ConsumerFirstAccept),
        -1.0,
        "gpu",
    );
    rec.record_elapsed(
        open,
        Mark::new(e01, Event::ConsumerFirstAccept),
        1.0,
        "late",
    );
    for s in 1..=3 {
        rec.start_segment(open, e01, s);
    }
    rec.begin_with_traceparent("00-not-a-trace").unwrap();
    for _ in 0..3 {
        rec.close(rec.begin().unwrap());
    }
    let mut drained = Vec::new();
    rec.drain_closed(16, &mut drained).unwrap();
    // A registered reader: two requests given up (retries, refused), two
    // overwritten while it held them and settled after all (one
    // acknowledged, one given up as its queue was full), then one taken
    // and not yet settled beside one not yet taken. It stays registered.
    let reader = rec.closed_reader().unwrap();
    let take = |n: usize| {
        let mut out = Vec::new();
        reader.take(n, &mut out).unwrap();
        assert_eq!(out.len(), n);
        out.iter().map(|c| c.claim()).collect::<Vec<_>>()
    };
    let close_two = || {
        for _ in 0..2 {
            rec.close(rec.begin().unwrap());
        }
    };
    close_two();
    let held = take(2);
    assert!(reader.give_up(held[0], GiveUp::RetriesExhausted));
    assert!(reader.give_up(held[1], GiveUp::Refused));
    close_two();
    let held = take(2);
    close_two();
    assert!(!reader.acknowledge(held[0]));
    assert!(!reader.give_up(held[1], GiveUp::QueueFull));
    take(1);

    let report = rec.report().unwrap().unwrap();
    let c = &report.counters;
    assert!(c.closed_lost > 0 && c.dropped_segments > 0 && c.bad_trace_contexts == 1);
    assert_eq!(report.occupancy.open_requests, 2);
    let g = c.closed_given_up;
    assert_eq!(
        (
            c.closed_acknowledged,
            g.queue_full,
            g.retries_exhausted,
            g.refused
        ),
        (1, 1, 1, 1)
    );
    assert_eq!(
        (c.closed_overwritten_taken, c.closed_settled_overwritten),
        (2, 2)
    );
    let o = &report.occupancy;
    assert_eq!(
        (o.closed_unread, o.closed_unacknowledged, o.closed_readers),
        (1, 1, 1)
    );
    let expected = serde_json::to_value(&report).unwrap();

    let mut inspect: Value =
        serde_json::from_slice(&edgemark(&["inspect", path.to_str().unwrap(), "--json"]).stdout)
            .unwrap();
    assert_eq!(inspect["open"].as_array().unwrap().len(), 2);
    inspect.as_object_mut().unwrap().remove("open");
    let (got, want) = (inspect.as_object().unwrap(), expected.as_object().unwrap());
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    for (k, v) in want {
        assert_eq!(&got[k], v, "inspect --json {k}");
    }
    assert_eq!(
        got["domains"],
        serde_json::json!(["host_monotonic", "gpu", "late"])
    );
    assert_eq!(got["clock"]["shared_with_this_process"], true);

    // Every row of the report's table, in each output: the JSON under its
    // key, the Prometheus text under its family (each reason a sample), the
    // `inspect` text on a line of its own with its total.
    let text = prometheus::render(&rec, Format::Text);
    let sample = |line: &str| -> u64 {
        let hits: Vec<u64> = text
            .lines()
            .filter_map(|l| l.strip_prefix(line)?.strip_prefix(' ')?.parse().ok())
            .collect();
        assert_eq!(hits.len(), 1, "{line} in\n{text}");
        hits[0]
    };
    let shown = stdout(&edgemark(&["inspect", path.to_str().unwrap()]));
    // The report's keys after its info's are the table's, in its order.
    let info = serde_json::to_value(&report.info).unwrap();
    let rest: Vec<&str> = want
        .keys()
        .map(String::as_str)
        .filter(|k| info.get(k).is_none())
        .collect();
    assert_eq!(rest, METRICS.iter().map(|m| m.key).collect::<Vec<_>>());
    for m in METRICS {
        let value = m.value(&report.counters, &report.occupancy);
        let (family, kind) = match m.kind {
            MetricKind::Counter => (format!("{}_total", m.prometheus), "counter"),
            _ => (m.prometheus.to_owned(), "gauge"),
        };
        assert!(
            text.contains(&format!(
                "# HELP {family} {}\n# TYPE {family} {kind}\n",
                m.help
            )),
            "{family} in\n{text}"
        );
        match (&value, m.label) {
            (MetricValue::ByLabel(by), Some(label)) => {
                assert!(!by.is_empty(), "{}", m.key);
                for (reason, n) in by {
                    let line = format!("{family}{{{label}=\"{reason}\"}}");
                    assert_eq!(sample(&line), *n, "{line}");
                    assert_eq!(want[m.key][*reason], *n, "{} {reason}", m.key);
                }
                assert_eq!(want[m.key].as_object().unwrap().len(), by.len());
            }
            (MetricValue::One(n), None) => {
                assert_eq!(sample(&family), *n, "{family}");
                assert_eq!(want[m.key], *n, "{}", m.key);
            }
            other => panic!("{}: {other:?}", m.key),
        }
        let line = shown
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(m.key))
            .unwrap_or_else(|| panic!("{} in\n{shown}", m.key));
        let total = line.split_whitespace().nth(2).unwrap();
        assert_eq!(
            total.trim_end_matches(':'),
            value.total().to_string(),
            "{line}"
        );
    }
    drop(reader);
}

/// docs/cli.md's table of the report's counters and gauges is the
/// library's (`edgemark::report::METRICS`), row for row: a counter added to
/// the table and not to the docs, or the other way round, fails here, with
/// the rows to paste.
#[test]
fn the_docs_list_every_counter_of_the_report_as_the_library_names_it() {
    use edgemark::report::{METRICS, MetricKind};

    let rows: String = METRICS
        .iter()
        .map(|m| {
            let (family, kind) = match m.kind {
                MetricKind::Counter => (format!("{}_total", m.prometheus), "counter"),
                _ => (m.prometheus.to_owned(), "gauge"),
            };
            let (key, family) = match m.label {
                Some(l) => (
                    format!("`{}` (by {l})", m.key),
                    format!("`{family}{{{l}}}`"),
                ),
                None => (format!("`{}`", m.key), format!("`{family}`")),
            };
            format!("| {key} | {family} | {kind} | {} |\n", m.help)
        })
        .collect();
    let table = format!(
        "| key (JSON, Python, `inspect`) | Prometheus | kind | what it counts |\n\
         |---|---|---|---|\n{rows}\n"
    );
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/cli.md")).unwrap();
    assert!(
        docs.contains(&table),
        "docs/cli.md should hold the table of the report's counters as:\n{table}"
    );
}
