//! The collector's answer as the exporter judges it, against a local
//! server that answers every post the same way.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use edgemark::{Edge, Event, Mark, Recorder};
use edgemark_otlp::client::MAX_ANSWER;
use edgemark_otlp::{Config, Exporter};

/// A collector on a free local port that reads each post and answers it
/// with `status` and a body of `body_len` bytes; counts the posts.
fn collector(status: &'static str, body_len: usize) -> (String, Arc<Mutex<usize>>) {
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

/// Closes one request with a value on one edge (two spans) into a region
/// at a temporary path, exports it to `url`, and waits until the region
/// says the request was acknowledged or given up. The exporter's counts
/// and the region's counters then.
fn export_one(url: &str) -> (edgemark_otlp::stats::Counts, edgemark::report::Counters) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.region");
    let rec = Recorder::builder().edge(0, 1).create(&path).unwrap();
    let t = rec.begin().unwrap();
    rec.record(
        t,
        Mark::new(Edge::new(0, 1), Event::ProducerFirstNonemptyEmit),
    );
    rec.close(t);
    let env = |k: &str| (k == "OTEL_BSP_SCHEDULE_DELAY").then(|| "10".to_owned());
    let config = Config::new(Some(url), env).unwrap();
    let again = path.clone();
    let exporter = Exporter::start(
        config,
        Recorder::attach(&path).unwrap(),
        path.clone(),
        Box::new(move || Recorder::attach(&again).map_err(Into::into)),
        None,
        None,
    )
    .unwrap();
    let stats = exporter.stats();
    // A bound only against a hang: the request is settled by the answer to
    // its first post.
    let give_up = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let c = rec.counters();
        if c.closed_acknowledged + c.closed_given_up.total() > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "the request was neither acknowledged nor given up: {:?}",
            stats.counts()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The counts are updated before the request is settled.
    (stats.counts(), rec.counters())
}

#[test]
fn a_success_whose_body_is_over_the_limit_is_a_failure_not_retried() {
    let (url, posts) = collector("200 OK", MAX_ANSWER + 1);
    let (counts, region) = export_one(&url);
    assert_eq!(*posts.lock().unwrap(), 1, "posted once, not retried");
    assert_eq!(counts.exported, 0);
    assert_eq!(counts.failures, 1);
    assert_eq!(counts.dropped_rejected, 2);
    assert_eq!(counts.dropped_retries, 0);
    assert!(!counts.up);
    assert_eq!(region.closed_acknowledged, 0);
    assert_eq!(region.closed_given_up.refused, 1);
}

#[test]
fn a_success_whose_body_is_at_the_limit_is_a_success() {
    // Not an export response: read as one that rejects nothing.
    let (url, posts) = collector("200 OK", MAX_ANSWER);
    let (counts, region) = export_one(&url);
    assert_eq!(*posts.lock().unwrap(), 1);
    assert_eq!((counts.exported, counts.failures), (2, 0));
    assert!(counts.up);
    assert_eq!(region.closed_acknowledged, 1);
    assert_eq!(region.closed_given_up.total(), 0);
}
