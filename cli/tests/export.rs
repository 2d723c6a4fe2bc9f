//! The Prometheus encoding, and the `edgemark export` command serving it:
//! scraped over loopback after a demo run, by a real Prometheus server, and
//! by clients that hold connections idle, flood, stall, pipeline or send
//! nonsense. Every server here is a real `edgemark export` process.

mod http;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use edgemark::prometheus::{self, Format};
use edgemark::{Edge, Event::*, Mark, Recorder};
use http::{Exporter, http_get};
use serde_json::Value;

/// The value of the one sample `name{labels}` in a scrape.
fn sample(text: &str, name_and_labels: &str) -> f64 {
    let hits: Vec<f64> = text
        .lines()
        .filter_map(|l| {
            l.strip_prefix(name_and_labels)?
                .strip_prefix(' ')?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(hits.len(), 1, "{name_and_labels} in\n{text}");
    hits[0]
}

/// Runs the demo, keeps its region, and returns it with the final snapshots.
fn demo(requests: u32) -> (PathBuf, Vec<Value>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("s.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_edgemark"))
        .args([
            "demo",
            "--quiet",
            "--keep",
            "--concurrency",
            "8",
            "--requests",
        ])
        .arg(requests.to_string())
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let region = text
        .lines()
        .find_map(|l| l.strip_prefix("region kept at "))
        .map(PathBuf::from)
        .unwrap();
    let snaps = std::fs::read_to_string(&json)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (region, snaps, dir)
}

struct Kept(PathBuf);
impl Drop for Kept {
    fn drop(&mut self) {
        if let Some(d) = self.0.parent() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// How many final snapshots hold `event` on `edge`, over all segments.
fn values_in(snaps: &[Value], edge: &str, event: &str) -> u64 {
    snaps
        .iter()
        .flat_map(|s| s.as_object().unwrap().iter())
        .filter(|(k, v)| k.starts_with(&format!("{edge}:")) && v[format!("{event}_ms")].is_number())
        .count() as u64
}

#[test]
fn a_scrape_after_a_demo_counts_every_closed_request_once() {
    let (region, snaps, _dir) = demo(60);
    let _kept = Kept(region.clone());
    let server = Exporter::start(&region);
    let (status, first) = http_get(server.addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(first.contains("\nedgemark_free_slots 64\n"), "{first}");
    assert_eq!(sample(&first, "edgemark_closed_requests_total"), 60.0);
    assert_eq!(sample(&first, "edgemark_open_requests"), 0.0);
    for (edge, event) in [
        ("0->1", "producer_first_nonempty_emit"),
        ("1->2", "consumer_first_nonempty_output"),
    ] {
        let want = values_in(&snaps, edge, event) as f64;
        assert!(want > 0.0);
        let labels = format!("{{edge=\"{edge}\",event=\"{event}\"}}");
        assert_eq!(
            sample(
                &first,
                &format!("edgemark_boundary_elapsed_seconds_count{labels}")
            ),
            want
        );
        let inf = format!(
            "edgemark_boundary_elapsed_seconds_bucket{{le=\"+Inf\",edge=\"{edge}\",event=\"{event}\"}}"
        );
        assert_eq!(sample(&first, &inf), want);
    }
    let delta = "edgemark_delta_seconds_count{edge=\"0->1\",from_event=\"consumer_first_accept\",to_event=\"consumer_first_nonempty_output\"}";
    assert!(sample(&first, delta) > 0.0);
    assert!(
        !first.contains("em1."),
        "no token or request identity in labels"
    );
    // Polling again, and restarting the exporter, change nothing.
    let (_, again) = http_get(server.addr, "/metrics");
    assert_eq!(again, first);
    drop(server);
    let restarted = Exporter::start(&region);
    let (_, after) = http_get(restarted.addr, "/metrics");
    assert_eq!(after, first);
    assert_eq!(
        http_get(restarted.addr, "/nope").0,
        "HTTP/1.1 404 Not Found"
    );
}

#[test]
fn the_encoding_runs_in_the_owners_process_and_sees_new_closes() {
    let rec = Recorder::builder()
        .edge(0, 1)
        .slots(4)
        .create_in_memory()
        .unwrap();
    let t = rec.begin().unwrap();
    let text = prometheus::render(&rec, Format::OpenMetrics);
    assert_eq!(sample(&text, "edgemark_open_requests"), 1.0);
    assert_eq!(sample(&text, "edgemark_free_slots"), 3.0);
    rec.record_elapsed(
        t,
        Mark::new(Edge::new(0, 1), ProducerFirstNonemptyEmit),
        7.0,
        "host_monotonic",
    );
    rec.record(
        t,
        Mark::new(Edge::new(0, 1), ConsumerFirstAccept).segment(3),
    );
    rec.close(t);
    let text = prometheus::render(&rec, Format::OpenMetrics);
    assert!(text.ends_with("# EOF\n"));
    assert!(text.contains("# UNIT edgemark_boundary_elapsed_seconds seconds\n"));
    let labels = "{edge=\"0->1\",event=\"producer_first_nonempty_emit\"}";
    let count = format!("edgemark_boundary_elapsed_seconds_count{labels}");
    assert_eq!(sample(&text, &count), 1.0);
    let sum = format!("edgemark_boundary_elapsed_seconds_sum{labels}");
    assert_eq!(sample(&text, &sum), 0.007);
    let bucket = |le: &str| {
        format!(
            "edgemark_boundary_elapsed_seconds_bucket{{le=\"{le}\",edge=\"0->1\",event=\"producer_first_nonempty_emit\"}}"
        )
    };
    assert_eq!(
        (
            sample(&text, &bucket("0.005")),
            sample(&text, &bucket("0.01"))
        ),
        (0.0, 1.0)
    );
    // The classic text differs only where its format does.
    let classic = prometheus::render(&rec, Format::Text);
    assert!(!classic.contains("# EOF") && !classic.contains("# UNIT"));
    assert!(classic.contains(
        "# HELP edgemark_closed_requests_total Requests closed\n\
         # TYPE edgemark_closed_requests_total counter\n\
         edgemark_closed_requests_total 1\n"
    ));
    let samples = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(samples(&classic), samples(&text));
    assert_eq!(
        sample(
            &text,
            "edgemark_refused_records_total{reason=\"segment_not_started\"}"
        ),
        1.0
    );
    assert_eq!(sample(&text, "edgemark_closed_requests_total"), 1.0);
}

#[test]
fn the_export_command_serves_until_its_time_is_up() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r.region");
    Recorder::builder().edge(0, 1).create(&p).unwrap();
    // Long enough for the scrape below on a busy machine; the wait after
    // it is what the test is about.
    let mut server = Exporter::start_for(&p, 10.0);
    let (status, body) = http_get(server.addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(sample(&body, "edgemark_free_slots"), 4096.0);
    let status = server.wait(Duration::from_secs(30));
    assert!(status.success(), "{status}");
    assert!(TcpStream::connect(server.addr).is_err(), "still listening");
}

/// Runs `edgemark ARGS...` to completion and returns its standard output.
fn edgemark(args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_edgemark"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "edgemark {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_exporter_attaches_a_region_file_that_replaced_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r.region");
    let log = dir.path().join("export.log");
    let path = p.as_os_str();
    let create = |slots: &str| {
        edgemark(&[
            "create".as_ref(),
            path,
            "--edge".as_ref(),
            "0:1".as_ref(),
            "--slots".as_ref(),
            slots.as_ref(),
        ])
    };
    let one_request = || {
        let token = edgemark(&["begin".as_ref(), path]);
        edgemark(&["close".as_ref(), path, token.trim().as_ref()]);
    };
    create("8");
    one_request();
    one_request();
    let server = Exporter::start_logged(&p, &log);
    let body = http_get(server.addr, "/metrics").1;
    assert_eq!(sample(&body, "edgemark_closed_requests_total"), 2.0);
    assert_eq!(sample(&body, "edgemark_region_replaced_total"), 0.0);
    assert_eq!(sample(&body, "edgemark_closed_lost_total"), 0.0);
    assert_eq!(sample(&body, "edgemark_closed_acknowledged_total"), 0.0);
    // The ring's losses show without any reader: 8 more closes into its 8
    // entries overwrite the first 2.
    for _ in 0..8 {
        one_request();
    }
    let body = http_get(server.addr, "/metrics").1;
    assert_eq!(sample(&body, "edgemark_closed_requests_total"), 10.0);
    assert_eq!(sample(&body, "edgemark_closed_lost_total"), 2.0);

    // Removed: nothing to serve, and the scrape says so.
    std::fs::remove_file(&p).unwrap();
    let (status, body) = http_get(server.addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(sample(&body, "edgemark_region_ok"), 0.0);
    assert!(!body.contains("edgemark_closed_requests_total"), "{body}");

    // Created again, with another geometry, and used: the scrape shows the
    // new region, not the old counters.
    create("16");
    one_request();
    let body = http_get(server.addr, "/metrics").1;
    assert_eq!(sample(&body, "edgemark_region_ok"), 1.0);
    assert_eq!(sample(&body, "edgemark_closed_requests_total"), 1.0);
    assert_eq!(sample(&body, "edgemark_free_slots"), 16.0);
    assert_eq!(sample(&body, "edgemark_region_replaced_total"), 1.0);

    // Replaced without a gap (a rename over it), found just as well.
    let other = dir.path().join("other.region");
    edgemark(&[
        "create".as_ref(),
        other.as_os_str(),
        "--edge".as_ref(),
        "0:1".as_ref(),
        "--slots".as_ref(),
        "32".as_ref(),
    ]);
    std::fs::rename(&other, &p).unwrap();
    let body = http_get(server.addr, "/metrics").1;
    assert_eq!(sample(&body, "edgemark_free_slots"), 32.0);
    assert_eq!(sample(&body, "edgemark_closed_requests_total"), 0.0);
    assert_eq!(sample(&body, "edgemark_region_replaced_total"), 2.0);
    // OpenMetrics keeps its end marker last.
    let mut s = TcpStream::connect(server.addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    assert!(
        raw.ends_with("edgemark_region_replaced_total 2\n# EOF\n"),
        "{raw}"
    );
    drop(server);

    let said = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines.len(), 3, "{said}");
    assert!(lines[0].contains("the region file is gone"), "{said}");
    assert!(lines[1].contains("now serving region"), "{said}");
    assert!(lines[2].contains("another file replaced region"), "{said}");
}

fn find_prometheus() -> Option<PathBuf> {
    ["/usr/bin/prometheus", "/usr/local/bin/prometheus"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Percent-encodes a PromQL query for a URL.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn a_real_prometheus_server_scrapes_the_histograms() {
    let Some(prom) = find_prometheus() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI installs Debian's prometheus package; it is missing"
        );
        eprintln!("SKIPPED: no prometheus binary here (apt-get install prometheus)");
        return;
    };
    let (region, snaps, dir) = demo(40);
    let _kept = Kept(region.clone());
    let server = Exporter::start(&region);
    let web = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: edgemark\n    static_configs:\n      - targets: ['{}']\n",
            server.addr
        ),
    )
    .unwrap();
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _prometheus = KillOnDrop(
        Command::new(prom)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let query = r#"edgemark_boundary_elapsed_seconds_count{edge="0->1",event="producer_first_nonempty_emit"}"#;
    let want = values_in(&snaps, "0->1", "producer_first_nonempty_emit") as f64;
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut last = String::new();
    loop {
        assert!(
            Instant::now() < deadline,
            "Prometheus never returned the series; last answer: {last}"
        );
        std::thread::sleep(Duration::from_millis(500));
        let Ok(mut s) = TcpStream::connect(web) else {
            continue;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let path = format!("/api/v1/query?query={}", encode(query));
        if write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {web}\r\nConnection: close\r\n\r\n"
        )
        .is_err()
        {
            continue;
        }
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        let Some((_, body)) = text.split_once("\r\n\r\n") else {
            continue;
        };
        last = body.to_owned();
        let Ok(v) = serde_json::from_str::<Value>(body) else {
            continue;
        };
        let result = &v["data"]["result"];
        if let Some(first) = result.get(0) {
            assert_eq!(v["status"], "success");
            assert_eq!(first["metric"]["job"], "edgemark");
            let got: f64 = first["value"][1].as_str().unwrap().parse().unwrap();
            assert_eq!(got, want, "{body}");
            break;
        }
    }
}
