//! The `/metrics` server of `edgemark export` against clients that hold
//! connections idle, send too much, send nonsense, speak HTTP/1.0, use
//! other methods or pipeline: each a real `edgemark export` process spoken
//! to over raw TCP.

mod http;

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use edgemark::Recorder;
use http::{Exporter, assert_full_metrics, connect, read_reply, request, scrape};

/// A region with one closed request and one open one, served.
fn served() -> (tempfile::TempDir, Exporter) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.region");
    let rec = Recorder::builder()
        .edge(0, 1)
        .slots(64)
        .create(&path)
        .unwrap();
    let t = rec.begin().unwrap();
    rec.record(
        t,
        edgemark::Mark::new(
            edgemark::Edge::new(0, 1),
            edgemark::Event::ProducerFirstNonemptyEmit,
        ),
    );
    rec.close(t);
    rec.begin().unwrap();
    let server = Exporter::start(&path);
    (dir, server)
}

/// Everything the server sends on `s` until it closes the connection (or
/// 10 s pass); a reset counts as the end.
fn read_all(mut s: TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

#[test]
fn a_scrape_answers_with_every_metric_in_the_classic_text_format() {
    let (_dir, server) = served();
    let reply = scrape(server.addr);
    assert_full_metrics(&reply);
    assert_eq!(
        reply.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert!(reply.body.contains("\nedgemark_open_requests 1\n"));
    assert!(reply.body.contains("\nedgemark_closed_requests_total 1\n"));
    assert!(reply.body.contains("\nedgemark_free_slots 63\n"));
    // Prometheus asks for OpenMetrics first and gets it.
    let mut s = connect(server.addr);
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let open_metrics = read_reply(&mut BufReader::new(s), true);
    assert_eq!(open_metrics.status, "HTTP/1.1 200 OK");
    assert!(
        open_metrics
            .header("content-type")
            .unwrap()
            .starts_with("application/openmetrics-text; version=1.0.0")
    );
    assert!(open_metrics.body.ends_with("# EOF\n"));
    assert_eq!(
        request(server.addr, "GET", "/nope").status,
        "HTTP/1.1 404 Not Found"
    );
    // The root points a person with a browser to the metrics (docs/cli.md).
    let root = request(server.addr, "GET", "/");
    assert_eq!(root.status, "HTTP/1.1 200 OK");
    assert!(root.body.contains("/metrics"), "{}", root.body);
    assert!(!root.body.contains("edgemark_"), "{}", root.body);
}

#[test]
fn head_answers_like_get_without_a_body_and_other_methods_get_405() {
    let (_dir, server) = served();
    let get = scrape(server.addr);
    let head = request(server.addr, "HEAD", "/metrics");
    assert_eq!(head.status, "HTTP/1.1 200 OK");
    assert_eq!(head.header("content-type"), get.header("content-type"));
    assert_eq!(
        head.header("content-length"),
        Some(get.body.len().to_string().as_str())
    );
    // Nothing follows the head: the server closes without a body.
    let mut s = connect(server.addr);
    write!(
        s,
        "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let raw = String::from_utf8(read_all(s)).unwrap();
    assert!(raw.ends_with("\r\n\r\n"), "{raw}");
    for method in ["POST", "PUT", "DELETE"] {
        let r = request(server.addr, method, "/metrics");
        assert_eq!(r.status, "HTTP/1.1 405 Method Not Allowed", "{method}");
        assert_eq!(r.header("allow"), Some("GET, HEAD"), "{method}");
    }
}

#[test]
fn http_1_0_is_answered_and_closed() {
    let (_dir, server) = served();
    let mut s = connect(server.addr);
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let raw = String::from_utf8(read_all(s)).unwrap();
    assert!(raw.starts_with("HTTP/1.0 200 OK\r\n"), "{raw}");
    assert!(raw.contains("\nedgemark_free_slots 63\n"), "{raw}");
}

#[test]
fn two_pipelined_requests_on_one_connection_are_both_answered() {
    let (_dir, server) = served();
    let mut s = connect(server.addr);
    s.write_all(
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let first = read_reply(&mut r, true);
    let second = read_reply(&mut r, true);
    assert_full_metrics(&first);
    assert_full_metrics(&second);
    assert_eq!(first.body, second.body);
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
}

#[test]
fn a_megabyte_header_is_refused_and_the_next_scrape_answers() {
    let (_dir, server) = served();
    let mut s = connect(server.addr);
    let mut req = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Junk: ".to_vec();
    req.extend_from_slice(&vec![b'a'; 1 << 20]);
    req.extend_from_slice(b"\r\n\r\n");
    // The server may close before it has read everything: a failed write
    // is one of the allowed answers.
    let _ = s.write_all(&req);
    let raw = String::from_utf8_lossy(&read_all(s)).into_owned();
    assert!(
        raw.is_empty() || raw.starts_with("HTTP/1.1 431 "),
        "the server answered {raw:?}"
    );
    assert!(!raw.contains("edgemark_"), "{raw}");
    assert_full_metrics(&scrape(server.addr));
}

#[test]
fn a_garbage_request_line_gets_400_and_the_next_scrape_answers() {
    let (_dir, server) = served();
    for garbage in [
        &b"\x00\xff\xfe garbage \x01\r\n\r\n"[..],
        b"GET\r\n\r\n",
        b"GET /metrics HTTP/9.9\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n",
    ] {
        let mut s = connect(server.addr);
        s.write_all(garbage).unwrap();
        let raw = String::from_utf8_lossy(&read_all(s)).into_owned();
        assert!(
            raw.starts_with("HTTP/1.1 400 ") || raw.starts_with("HTTP/1.1 505 ") || raw.is_empty(),
            "{garbage:?} got {raw:?}"
        );
        assert!(!raw.contains("edgemark_"), "{raw}");
    }
    assert_full_metrics(&scrape(server.addr));
}

#[test]
fn a_client_that_stalls_inside_its_request_head_is_closed() {
    let (_dir, server) = served();
    let mut s = connect(server.addr);
    s.write_all(b"GET /metr").unwrap();
    let t = Instant::now();
    let raw = read_all(s);
    // The head's deadline is 3 s; 10 s is the read timeout of `connect`.
    assert!(t.elapsed() < Duration::from_secs(9), "{:?}", t.elapsed());
    assert!(!String::from_utf8_lossy(&raw).contains("edgemark_"));
}

#[test]
fn idle_connections_do_not_starve_scrapes() {
    let (_dir, server) = served();
    // 500 connections that send nothing, and 20 more each with half a
    // request head.
    let mut idle: Vec<TcpStream> = (0..500).map(|_| connect(server.addr)).collect();
    for _ in 0..20 {
        let mut s = connect(server.addr);
        s.write_all(b"GET /metrics HT").unwrap();
        idle.push(s);
    }
    for i in 0..20 {
        let t = Instant::now();
        let reply = scrape(server.addr);
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "scrape {i} took {:?}",
            t.elapsed()
        );
        assert_full_metrics(&reply);
    }
    let at_once: Vec<_> = (0..50)
        .map(|_| {
            let addr = server.addr;
            std::thread::spawn(move || scrape(addr))
        })
        .collect();
    for h in at_once {
        assert_full_metrics(&h.join().unwrap());
    }
    drop(idle);
    let t = Instant::now();
    let reply = scrape(server.addr);
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_full_metrics(&reply);
}

/// Raises this process's limit of open files to at least `want`, or panics
/// saying why it cannot.
fn raise_open_files(want: u64) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_none_or(|c| c >= want) {
        return;
    }
    // Above the hard limit only root may go.
    let maximum = limit.maximum.map(|m| m.max(want));
    let raised = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(want),
            maximum,
        },
    );
    assert!(
        raised.is_ok(),
        "this test opens {want} files; the limit is {:?} and cannot be raised (ulimit -n)",
        limit
    );
}

#[test]
fn clients_that_pipeline_and_never_read_do_not_starve_scrapes() {
    // More connections than the server's 1024 places (`MAX_CONNECTIONS` in
    // cli/src/serve.rs): each sends 200 requests at once, with a small
    // receive buffer, and never reads an answer. A server that waits on
    // them for ever has no place left for a scraper.
    const HOSTILE: usize = 1100;
    raise_open_files(HOSTILE as u64 + 256);
    let (_dir, server) = served();
    let pipelined = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(200);
    let hostile: Vec<TcpStream> = (0..HOSTILE)
        .map(|_| {
            use rustix::net::{AddressFamily, SocketType};
            let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
            rustix::net::sockopt::set_socket_recv_buffer_size(&fd, 2048).unwrap();
            rustix::net::connect(&fd, &server.addr).unwrap();
            let mut s = TcpStream::from(fd);
            // What the server has not read yet waits in this side's send
            // buffer; a full one is no reason for the test to block.
            s.set_nonblocking(true).unwrap();
            let _ = s.write(pipelined.as_bytes());
            s
        })
        .collect();
    for i in 0..10 {
        let t = Instant::now();
        let reply = scrape(server.addr);
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "scrape {i} took {:?}",
            t.elapsed()
        );
        assert_full_metrics(&reply);
    }
    // Every hostile connection is closed by the server: by the deadline on
    // writing a response, or to make room for a scraper. Reading what it
    // sent ends at the close (or at a reset, which drops the rest).
    let deadline = Instant::now() + Duration::from_secs(60);
    for (i, mut s) in hostile.into_iter().enumerate() {
        s.set_nonblocking(false).unwrap();
        let mut buf = [0u8; 65536];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "hostile connection {i} is still open");
            s.set_read_timeout(Some(left)).unwrap();
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    panic!("hostile connection {i} is still open")
                }
                Err(_) => break,
            }
        }
    }
    assert_full_metrics(&scrape(server.addr));
}

#[test]
fn a_kept_alive_connection_is_closed_once_idle() {
    let (_dir, server) = served();
    let s = connect(server.addr);
    let mut r = BufReader::new(s);
    r.get_mut()
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert_full_metrics(&read_reply(&mut r, true));
    // Then nothing: the server closes it (3 s idle; 10 s is the read
    // timeout of `connect`).
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
}

#[test]
fn a_connection_is_closed_after_its_hundredth_request() {
    let (_dir, server) = served();
    let s = connect(server.addr);
    let pipelined = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(150);
    let writer = {
        let mut w = s.try_clone().unwrap();
        std::thread::spawn(move || {
            let _ = w.write_all(pipelined.as_bytes());
        })
    };
    let mut r = BufReader::new(s.try_clone().unwrap());
    for i in 1..=100 {
        let reply = read_reply(&mut r, true);
        assert_full_metrics(&reply);
        assert_eq!(
            reply.header("connection"),
            (i == 100).then_some("close"),
            "reply {i}"
        );
    }
    let mut rest = Vec::new();
    let _ = r.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    let _ = s.shutdown(std::net::Shutdown::Both);
    writer.join().unwrap();
}

#[test]
fn promtool_finds_nothing_to_warn_about_in_a_scrape() {
    let (_dir, server) = served();
    let body = scrape(server.addr).body;
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI installs Debian's prometheus package (promtool); it is missing"
            );
            eprintln!("SKIPPED: no promtool on PATH (apt-get install prometheus)");
            return;
        }
        Err(e) => panic!("cannot run promtool: {e}"),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool: {said}");
    assert_eq!(said.trim(), "", "promtool warned");
}
