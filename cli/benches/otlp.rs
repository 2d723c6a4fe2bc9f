//! Export throughput: how many closed requests per second one
//! `edgemark export --otlp` process sustains into a real collector (rotel,
//! exporting to its blackhole, so that the figure is the exporter's).
//!
//! A producer thread closes requests (one event on each of two edges: three
//! spans each) as fast as it can for a while, so that the exporter is
//! saturated; then it stops, and the run ends when the exporter has taken
//! every request and emptied its queue. The figure is the requests the
//! collector accepted (spans / 3) over that time: the exporter's capacity.
//! Entries the ring overwrote before the exporter took them, and spans
//! dropped, are reported beside it.
//!
//! Then the overload runs: closes paced at 1x, 2x and 4x that capacity for
//! the same while; each reports the share of closed requests delivered and
//! the requests (and spans) per second the collector accepted while the
//! closes went on, as a share of the capacity (the target: at least 90 % at
//! 2x).
//!
//! rotel comes from the virtual environment `EDGEMARK_OTEL_VENV` names (as
//! for `cli/tests/otlp.rs`); without it the bench says so and does nothing.
//! `cargo bench -p edgemark-cli --bench otlp` runs it for 5 s;
//! `cargo test --benches` for 1 s.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use edgemark::{Edge, Event, Mark, Recorder};

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn scrape(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body
}

fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} in\n{text}"))
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let Some(venv) = std::env::var_os("EDGEMARK_OTEL_VENV").map(PathBuf::from) else {
        println!("otlp export bench: EDGEMARK_OTEL_VENV is not set (no rotel): skipped");
        return;
    };
    let rotel = std::fs::read_dir(venv.join("lib"))
        .ok()
        .and_then(|d| {
            d.flatten()
                .map(|e| e.path().join("site-packages/rotel/rotel-agent"))
                .find(|p| p.is_file())
        })
        .expect("rotel in EDGEMARK_OTEL_VENV");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _rotel = Killed(
        Command::new(rotel)
            .args(["start", "--exporter", "blackhole"])
            .arg("--otlp-http-endpoint")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--otlp-grpc-endpoint")
            .arg(format!("127.0.0.1:{}", free_port()))
            .arg("--log-file")
            .arg(dir.path().join("rotel.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let up = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            up.elapsed() < Duration::from_secs(30),
            "rotel did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let path = dir.path().join("bench.region");
    let rec = Recorder::builder()
        .edge(0, 1)
        .edge(1, 2)
        .slots(1024)
        .create(&path)
        .unwrap();
    let mut exporter = Killed(
        Command::new(env!("CARGO_BIN_EXE_edgemark"))
            .arg("export")
            .arg(&path)
            .args(["--otlp", &format!("http://127.0.0.1:{port}")])
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let mut out = exporter.0.stdout.take().unwrap();
    let mut said = Vec::new();
    let mut b = [0u8; 1];
    while !String::from_utf8_lossy(&said).contains("/metrics\n") {
        assert_eq!(out.read(&mut b).unwrap(), 1, "the exporter ended");
        said.push(b[0]);
    }
    let said = String::from_utf8(said).unwrap();
    let metrics: SocketAddr = said
        .lines()
        .find_map(|l| l.strip_prefix("serving http://")?.strip_suffix("/metrics"))
        .unwrap()
        .parse()
        .unwrap();

    let produce_for = if full {
        Duration::from_secs(5)
    } else {
        Duration::from_secs(1)
    };
    // Saturated: the producer closes as fast as it can; the figure is the
    // exporter's capacity.
    let capacity = run(&rec, metrics, produce_for, None);
    println!(
        "otlp export into rotel: {} requests closed in {:.1} s; {} exported ({} spans) \
         in {:.2} s = {:.0} closed requests/s; closed_lost {}, spans dropped {}",
        capacity.closed,
        produce_for.as_secs_f64(),
        capacity.exported,
        capacity.spans,
        capacity.elapsed,
        capacity.exported as f64 / capacity.elapsed,
        capacity.lost,
        capacity.dropped
    );
    // The capacity the overload runs are measured against: what the
    // collector accepted per second while the producer was closing (the
    // exporter shares the machine with the producer, as it does in them).
    let c = capacity.exported_during as f64 / produce_for.as_secs_f64();
    println!("otlp export capacity while closing: {c:.0} requests/s");
    // Overload: closes paced at 1x, 2x and 4x that capacity. The exporter
    // takes only what its queue has room for; the ring drops the rest
    // (counted by the closes that overwrite it), so what it spends is spent
    // on what it sends.
    for k in [1.0, 2.0, 4.0] {
        let r = run(&rec, metrics, produce_for, Some(k * c));
        let out = r.exported_during as f64 / produce_for.as_secs_f64();
        println!(
            "otlp overload {k}x ({:.0} closes/s): {} closed, {} delivered ({:.0} %), \
             {:.0} requests/s out while closing = {:.0} % of capacity, {:.0} spans/s; \
             closed_lost {}",
            k * c,
            r.closed,
            r.exported,
            100.0 * r.exported as f64 / r.closed.max(1) as f64,
            out,
            100.0 * out / c,
            r.spans_during as f64 / produce_for.as_secs_f64(),
            r.lost
        );
    }
}

/// What one run did (each figure for this run alone).
struct Run {
    closed: u64,
    /// Requests the collector accepted (spans / 3).
    exported: u64,
    spans: u64,
    /// Exported while the producer was closing.
    exported_during: u64,
    spans_during: u64,
    /// Closed requests the ring overwrote (the region's count).
    lost: u64,
    dropped: u64,
    /// Seconds from the start to the queue's last batch.
    elapsed: f64,
}

/// Closes requests for `produce_for`, as fast as possible or paced at
/// `rate` per second, then waits until the exporter has taken or lost
/// every one and sent its queue.
fn run(rec: &Recorder, metrics: SocketAddr, produce_for: Duration, rate: Option<f64>) -> Run {
    let before = scrape(metrics);
    let spans_before = sample(&before, "edgemark_otlp_exported_spans_total");
    let requests_before = sample(&before, "edgemark_otlp_requests_total");
    let dropped_total = |m: &str| -> f64 {
        m.lines()
            .filter(|l| l.starts_with("edgemark_otlp_dropped_spans_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let dropped_before = dropped_total(&before);
    let lost_before = rec.counters().closed_lost;
    let (e01, e12) = (Edge::new(0, 1), Edge::new(1, 2));
    let start = Instant::now();
    let mut closed = 0u64;
    while start.elapsed() < produce_for {
        let due = match rate {
            Some(r) => (r * start.elapsed().as_secs_f64()) as u64,
            None => closed + 64,
        };
        while closed < due {
            let Ok(t) = rec.begin() else { continue };
            rec.record(
                t,
                Mark::new(e01, Event::ProducerFirstNonemptyEmit).chunk_seq(0),
            );
            rec.record(t, Mark::new(e12, Event::ConsumerFirstAccept));
            rec.close(t);
            closed += 1;
        }
        if rate.is_some() {
            std::thread::sleep(Duration::from_micros(500));
        } else {
            // The producer leaves the exporter its own core's worth of
            // time on a small machine: a close rate far above any
            // collector's.
            std::thread::yield_now();
        }
    }
    let during = scrape(metrics);
    let spans_during = sample(&during, "edgemark_otlp_exported_spans_total") - spans_before;
    // Until the exporter has taken (or the ring lost) everything and sent
    // its queue.
    let waited = Instant::now();
    loop {
        let m = scrape(metrics);
        let requests = sample(&m, "edgemark_otlp_requests_total") - requests_before;
        let lost = rec.counters().closed_lost - lost_before;
        let queued = sample(&m, "edgemark_otlp_queue_spans");
        if requests as u64 + lost >= closed && queued == 0.0 {
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(120),
            "the exporter did not catch up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let elapsed = start.elapsed().as_secs_f64();
    // The last batch's answer.
    std::thread::sleep(Duration::from_millis(200));
    let m = scrape(metrics);
    let spans = (sample(&m, "edgemark_otlp_exported_spans_total") - spans_before) as u64;
    Run {
        closed,
        exported: spans / 3,
        spans,
        exported_during: spans_during as u64 / 3,
        spans_during: spans_during as u64,
        lost: rec.counters().closed_lost - lost_before,
        dropped: (dropped_total(&m) - dropped_before) as u64,
        elapsed,
    }
}
