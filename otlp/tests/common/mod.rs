//! What the exporter's tests share: a local collector that answers every
//! post the same way, a region file with closed requests in it, an
//! exporter of it to the collector and its stop, a wait for what an
//! assertion reads, and the notes the exporter logs.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use edgemark::{Edge, Event, Mark, Recorder};
use edgemark_otlp::{Exporter, ExporterBuilder};

/// A collector on a free local port that reads each post and answers it
/// with `status` and a body of `body_len` bytes; counts the posts.
pub(crate) fn collector(status: &'static str, body_len: usize) -> (String, Arc<Mutex<usize>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let posts = Arc::new(Mutex::new(0));
    let counted = Arc::clone(&posts);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let counted = Arc::clone(&counted);
            std::thread::spawn(move || {
                let mut reader = BufReader::new(&conn);
                loop {
                    // The head, then the body its Content-Length says.
                    let mut len = 0usize;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let l = line.to_ascii_lowercase();
                        if let Some(v) = l.strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap();
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0; len];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    *counted.lock().unwrap() += 1;
                    let head = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/x-protobuf\r\n\
                         content-length: {body_len}\r\n\r\n"
                    );
                    // The exporter stops reading at its limit and closes
                    // the connection: the rest of the write fails.
                    let mut out = &conn;
                    if out.write_all(head.as_bytes()).is_err()
                        || out.write_all(&vec![0u8; body_len]).is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (url, posts)
}

/// A URL where nothing listens: every post fails to connect.
pub(crate) fn nobody() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", listener.local_addr().unwrap())
}

/// A region at `path` with a ring of closed requests, and `n` requests
/// closed in it, each with a value on its one edge (two spans each).
pub(crate) fn region_with_closed(path: &Path, n: usize) -> Recorder {
    let rec = Recorder::builder().edge(0, 1).create(path).unwrap();
    close(&rec, n);
    rec
}

/// Closes `n` requests in `rec`, each with a value on edge 0->1.
pub(crate) fn close(rec: &Recorder, n: usize) {
    for _ in 0..n {
        let t = rec.begin().unwrap();
        rec.record(
            t,
            Mark::new(Edge::new(0, 1), Event::ProducerFirstNonemptyEmit),
        );
        rec.close(t);
    }
}

/// An exporter of the region file at `path` to the collector at `url`,
/// the environment's variables ignored, sending what it takes after
/// 10 ms: the tests' exporter, to which one adds its own settings before
/// `start()`.
pub(crate) fn exporter_of(path: &Path, url: impl Into<String>) -> ExporterBuilder {
    Exporter::builder(path)
        .with_endpoint(url)
        .with_env(|_| None)
        .with_schedule_delay(Duration::from_millis(10))
}

/// Stops `exporter` and waits for its run to end, which must have ended
/// without a panic.
pub(crate) fn stop(exporter: Exporter) {
    exporter.stopper().stop();
    assert!(exporter.join());
}

/// Waits until `check` gives a value, which it returns. The bound only
/// keeps a broken exporter from hanging the test.
pub(crate) fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let give_up = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < give_up, "never: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The notes logged so far through the `log` facade, `(target, level,
/// text)`, by every test of the binary (filter on what names yours).
pub(crate) fn notes() -> Vec<(String, log::Level, String)> {
    logger().0.lock().unwrap().clone()
}

struct Capture(Mutex<Vec<(String, log::Level, String)>>);

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        self.0
            .lock()
            .unwrap()
            .push((r.target().to_owned(), r.level(), r.args().to_string()));
    }
    fn flush(&self) {}
}

/// The capturing logger, installed on first use.
fn logger() -> &'static Capture {
    static LOGGER: OnceLock<&'static Capture> = OnceLock::new();
    LOGGER.get_or_init(|| {
        let l: &'static Capture = Box::leak(Box::new(Capture(Mutex::new(Vec::new()))));
        log::set_logger(l).unwrap();
        log::set_max_level(log::LevelFilter::Trace);
        l
    })
}

/// Installs the capturing logger (before an exporter starts, so that its
/// first notes are kept).
pub(crate) fn capture_notes() {
    logger();
}
