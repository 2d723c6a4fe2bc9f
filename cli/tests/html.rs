//! The latency page, as a person makes and opens it: `edgemark demo --html`
//! and `edgemark report SNAPSHOTS.jsonl --html`, its structure checked
//! against the snapshots it was made from, then (where chromium is
//! installed) rendered headless to a screenshot and a dumped DOM.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};

/// Bins of every histogram on the page.
const BINS: usize = 20;
const EVENTS: [&str; 4] = [
    "producer_first_nonempty_emit",
    "edge_first_send_complete",
    "consumer_first_accept",
    "consumer_first_nonempty_output",
];

fn edgemark(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgemark"))
        .args(args)
        .output()
        .expect("run edgemark")
}

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The value of attribute `name` in the first tag of `html`.
fn attr<'a>(html: &'a str, name: &str) -> Option<&'a str> {
    let tag = &html[..html.find('>')?];
    let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    Some(&tag[at..at + tag[at..].find('"')?])
}

/// Each element that opens with `open` (for example `<svg class="chart
/// hist"`), up to its closing `</svg>`.
fn elements<'a>(html: &'a str, open: &str) -> Vec<&'a str> {
    html.match_indices(open)
        .map(|(i, _)| {
            let rest = &html[i..];
            &rest[..rest.find("</svg>").map_or(rest.len(), |e| e + 6)]
        })
        .collect()
}

/// One histogram as drawn: edge, metric, the count it claims, its bars'
/// counts.
#[derive(Debug)]
struct Drawn {
    edge: String,
    metric: String,
    values: usize,
    bars: Vec<usize>,
}

fn histograms(html: &str) -> Vec<Drawn> {
    elements(html, r#"<svg class="chart hist""#)
        .into_iter()
        .map(|svg| Drawn {
            edge: attr(svg, "data-edge").unwrap().replace("-&gt;", "->"),
            metric: attr(svg, "data-metric").unwrap().replace("-&gt;", "->"),
            values: attr(svg, "data-values").unwrap().parse().unwrap(),
            bars: elements(svg, r#"<rect class="bar""#)
                .iter()
                .map(|b| attr(b, "data-count").unwrap().parse().unwrap())
                .collect(),
        })
        .collect()
}

/// The waterfall for `which` ("typical" or "slowest"): its line and the
/// edge segments of its rows.
fn waterfall<'a>(html: &'a str, which: &str) -> (usize, Vec<String>, &'a str) {
    let svg = elements(
        html,
        &format!("<svg class=\"chart waterfall\" id=\"waterfall-{which}\""),
    );
    assert_eq!(svg.len(), 1, "one {which} waterfall");
    let svg = svg[0];
    let rows = svg
        .match_indices(&format!(r#"<g class="wf-row" data-request="{which}""#))
        .map(|(i, _)| attr(&svg[i..], "data-edge").unwrap().replace("-&gt;", "->"))
        .collect();
    (attr(svg, "data-line").unwrap().parse().unwrap(), rows, svg)
}

/// The snapshots of a JSON lines file, by line number (1-based), blank
/// lines skipped.
fn snapshots(text: &str) -> Vec<(usize, Value)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let v: Value = serde_json::from_str(l).unwrap();
            let v = v.get("stream_edge_metrics").cloned().unwrap_or(v);
            (i + 1, v)
        })
        .collect()
}

fn value(seg: &Value, event: &str) -> Option<(f64, String)> {
    let ms = seg[format!("{event}_ms")].as_f64()?;
    Some((ms, seg["clock_domains"][event].as_str()?.to_owned()))
}

/// What the page must draw for these snapshots, computed here from the JSON
/// alone: per edge, 4 event histograms (host_monotonic values of segment 0)
/// and 3 delta histograms (same domain, in order); and the lines of the
/// typical (median total, nearest rank) and slowest request.
fn expected(snaps: &[(usize, Value)], edges: &[&str]) -> (Vec<(String, usize)>, usize, usize) {
    let mut counts = Vec::new();
    for edge in edges {
        let segs: Vec<&Value> = snaps
            .iter()
            .filter_map(|(_, s)| s.get(format!("{edge}:0")))
            .collect();
        for e in EVENTS {
            let n = segs
                .iter()
                .filter(|s| value(s, e).is_some_and(|(_, d)| d == "host_monotonic"))
                .count();
            counts.push((format!("{edge} {e}"), n));
        }
        for w in EVENTS.windows(2) {
            let n = segs
                .iter()
                .filter(|s| match (value(s, w[0]), value(s, w[1])) {
                    (Some((a, da)), Some((b, db))) => da == db && b >= a,
                    _ => false,
                })
                .count();
            counts.push((format!("{edge} {} delta", w[0]), n));
        }
    }
    let mut totals: Vec<(f64, usize)> = snaps
        .iter()
        .filter_map(|(line, s)| {
            let latest = s
                .as_object()?
                .values()
                .flat_map(|seg| EVENTS.iter().filter_map(|e| value(seg, e)))
                .filter(|(_, d)| d == "host_monotonic")
                .map(|(ms, _)| ms)
                .reduce(f64::max)?;
            Some((latest, *line))
        })
        .collect();
    totals.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let typical = totals[totals.len().div_ceil(2) - 1].1;
    (counts, typical, totals.last().unwrap().1)
}

/// Checks every histogram against the expected counts: 20 bars each when
/// it has values, none otherwise, and bars that hold every value.
fn check_histograms(html: &str, counts: &[(String, usize)]) -> usize {
    let drawn = histograms(html);
    assert_eq!(
        drawn.len(),
        counts.len(),
        "one histogram per edge and metric"
    );
    let mut bars = 0;
    for (d, (what, n)) in drawn.iter().zip(counts) {
        assert!(what.starts_with(&d.edge), "{what} vs {d:?}");
        assert_eq!(d.values, *n, "{what}: {d:?}");
        assert_eq!(d.bars.iter().sum::<usize>(), *n, "{what}: {d:?}");
        assert_eq!(d.bars.len(), if *n > 0 { BINS } else { 0 }, "{what}");
        bars += d.bars.len();
    }
    bars
}

/// Renders the page in headless chromium, if installed: a screenshot and
/// the DOM after its script ran. `None` (said on standard error) without
/// chromium.
fn render(page: &Path, dir: &Path, screenshot: &Path) -> Option<String> {
    let chromium = Path::new("/usr/bin/chromium");
    if !chromium.exists() {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED rendering {}: chromium is not installed (apt-get install chromium)",
            page.display()
        );
        return None;
    }
    let run = |what: &[String]| {
        let out = Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--window-size=1400,1800",
            ])
            .arg(format!(
                "--user-data-dir={}",
                dir.join("chromium-profile").display()
            ))
            .args(what)
            .arg(format!("file://{}", page.display()))
            .output()
            .expect("run chromium");
        assert!(out.status.success(), "chromium: {out:?}");
        out
    };
    run(&[format!("--screenshot={}", screenshot.display())]);
    let png = std::fs::read(screenshot).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    assert!(png.len() > 10_000, "a screenshot with something on it");
    let dom = run(&["--dump-dom".to_owned()]);
    Some(String::from_utf8_lossy(&dom.stdout).into_owned())
}

/// The rendered DOM shows the page's script finished and counted what the
/// data calls for.
fn check_rendered(dom: &str, bars: usize, rows: usize) {
    let body = &dom[dom.find("<body").unwrap()..];
    assert_eq!(attr(body, "data-rendered"), Some("ok"), "{body:.600}");
    assert_eq!(attr(body, "data-bars"), Some(bars.to_string().as_str()));
    assert_eq!(
        attr(body, "data-waterfall-rows"),
        Some(rows.to_string().as_str())
    );
    assert!(dom.contains(r#"<p id="errors"></p>"#), "no script error");
}

#[test]
fn demo_html_draws_what_its_snapshots_hold_and_renders_in_a_browser() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("snapshots.jsonl");
    let page = dir.path().join("demo.html");
    ok(&edgemark(&[
        "demo",
        "--requests",
        "60",
        "--concurrency",
        "8",
        "--quiet",
        "--json",
        jsonl.to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
    ]));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    // Self-contained: nothing is fetched from anywhere.
    for remote in ["http://", "https://", "<link", " src="] {
        assert!(!html.contains(remote), "{remote} in the page");
    }
    let snaps = snapshots(&std::fs::read_to_string(&jsonl).unwrap());
    assert_eq!(snaps.len(), 60);
    let (counts, typical, slowest) = expected(&snaps, &["0->1", "1->2"]);
    let bars = check_histograms(&html, &counts);
    assert!(bars >= 10 * BINS, "most histograms have values: {bars}");
    let mut rows = 0;
    for (which, line) in [("typical", typical), ("slowest", slowest)] {
        let (drawn_line, segs, _) = waterfall(&html, which);
        assert_eq!(drawn_line, line, "the {which} request");
        let mut keys: Vec<String> = snaps[line - 1]
            .1
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        keys.sort();
        let mut drawn = segs.clone();
        drawn.sort();
        assert_eq!(drawn, keys, "one row per edge segment of line {line}");
        rows += segs.len();
    }

    // The same snapshots through `report` make the same drawing.
    let again = dir.path().join("report.html");
    ok(&edgemark(&[
        "report",
        jsonl.to_str().unwrap(),
        "--html",
        again.to_str().unwrap(),
    ]));
    let report = std::fs::read_to_string(&again).unwrap();
    let from = |s: &str| s[s.find("<h2>Waterfalls</h2>").unwrap()..].to_owned();
    assert_eq!(from(&html), from(&report));

    if let Some(dom) = render(&page, dir.path(), &dir.path().join("demo.png")) {
        check_rendered(&dom, bars, rows);
    }
}

fn seg(from: u32, to: u32, values: [Option<(f64, &str)>; 4]) -> Value {
    let mut m = serde_json::Map::new();
    m.insert("from_stage".into(), json!(from));
    m.insert("to_stage".into(), json!(to));
    m.insert("segment_index".into(), json!(0));
    m.insert("first_chunk_seq".into(), json!(0));
    let domains: serde_json::Map<String, Value> = EVENTS
        .iter()
        .zip(&values)
        .filter_map(|(e, v)| Some(((*e).to_owned(), json!((*v)?.1))))
        .collect();
    m.insert("clock_domains".into(), Value::Object(domains));
    for (e, v) in EVENTS.iter().zip(&values) {
        m.insert(format!("{e}_ms"), json!(v.map(|v| v.0)));
    }
    Value::Object(m)
}

#[test]
fn report_keeps_clock_domains_apart_and_lists_what_it_leaves_out() {
    const H: &str = "host_monotonic";
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("collected.jsonl");
    // Totals 40, 10, 30, 50 and 20 ms; the slowest (line 4) has its accept
    // on 0->1 in another clock domain. Line 6 recorded nothing; line 5 is
    // wrapped as a metrics object would hold it; line 3 is blank.
    let request = |base: f64, accept_domain: &str| {
        json!({
            "0->1:0": seg(0, 1, [Some((base - 9.0, H)), Some((base - 8.0, H)), Some((base - 7.5, accept_domain)), Some((base - 5.0, H))]),
            "1->2:0": seg(1, 2, [Some((base - 5.0, H)), Some((base - 4.0, H)), None, Some((base, H))]),
        })
    };
    let lines = [
        request(40.0, H).to_string(),
        request(10.0, H).to_string(),
        String::new(),
        request(50.0, "receiver").to_string(),
        json!({"stream_edge_metrics": request(30.0, H)}).to_string(),
        "{}".to_owned(),
        request(20.0, H).to_string(),
    ];
    std::fs::write(&jsonl, lines.join("\n")).unwrap();
    let page = dir.path().join("report.html");
    ok(&edgemark(&[
        "report",
        jsonl.to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
    ]));
    let html = std::fs::read_to_string(&page).unwrap();

    let snaps = snapshots(&lines.join("\n"));
    let (counts, typical, slowest) = expected(&snaps, &["0->1", "1->2"]);
    assert_eq!((typical, slowest), (5, 4), "totals 10, 20, 30, 40, 50");
    let bars = check_histograms(&html, &counts);
    let accept = histograms(&html)
        .into_iter()
        .find(|d| d.edge == "0->1" && d.metric == "accept")
        .unwrap();
    assert_eq!(accept.values, 4, "the receiver-clock accept is left out");
    let send_accept = histograms(&html)
        .into_iter()
        .find(|d| d.edge == "0->1" && d.metric == "send complete -> accept")
        .unwrap();
    assert_eq!(send_accept.values, 4, "no delta across clock domains");
    // 1->2 never accepted: nothing to draw, no bars.
    let none = histograms(&html)
        .into_iter()
        .find(|d| d.edge == "1->2" && d.metric == "accept")
        .unwrap();
    assert!(none.bars.is_empty() && html.contains(r#"class="no-values""#));

    let (_, typical_rows, typical_svg) = waterfall(&html, "typical");
    assert_eq!(typical_rows, ["0->1:0", "1->2:0"]);
    assert_eq!(typical_svg.matches(r#"class="mark""#).count(), 7);
    let (_, slowest_rows, slowest_svg) = waterfall(&html, "slowest");
    assert_eq!(slowest_rows, ["0->1:0", "1->2:0"]);
    // The receiver-clock accept is not drawn, and so neither are the two
    // deltas that would meet it.
    assert_eq!(slowest_svg.matches(r#"class="mark""#).count(), 6);
    assert_eq!(slowest_svg.matches(r#"class="phase""#).count(), 1 + 1);
    let excluded: Vec<&str> = html
        .match_indices(r#"<li class="excluded-event" data-request="slowest">"#)
        .map(|(i, _)| &html[i..i + html[i..].find("</li>").unwrap()])
        .collect();
    assert_eq!(excluded.len(), 1, "{excluded:?}");
    assert!(excluded[0].contains("accept") && excluded[0].contains("receiver"));
    assert!(html.contains(r#"class="note excluded-requests" data-count="1""#));

    if let Some(dom) = render(&page, dir.path(), &dir.path().join("report.png")) {
        check_rendered(&dom, bars, 4);
    }
}

#[test]
fn report_refuses_what_is_not_snapshots_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("never.html");
    let cases: [(&str, &str); 4] = [
        ("{}\n[1, 2]\n", "line 2: not a snapshot"),
        ("{}\nnot json\n", "line 2: not JSON"),
        ("\n\n", "no snapshots"),
        (
            r#"{"0->1:0": {"from_stage": 0, "to_stage": 1, "segment_index": 0, "clock_domains": {}, "producer_first_nonempty_emit_ms": 1.0}}"#,
            "has no clock domain",
        ),
    ];
    for (text, reason) in cases {
        let input = dir.path().join("input.jsonl");
        std::fs::write(&input, text).unwrap();
        let out = edgemark(&[
            "report",
            input.to_str().unwrap(),
            "--html",
            page.to_str().unwrap(),
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{text:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with("edgemark: ") && err.contains(reason),
            "{err}"
        );
        assert!(!page.exists(), "no page for bad input");
    }
    let missing: PathBuf = dir.path().join("missing.jsonl");
    let out = edgemark(&[
        "report",
        missing.to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
}
