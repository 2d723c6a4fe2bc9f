//! A raw HTTP/1.1 client over `std::net`, and `edgemark export` processes
//! to talk to.

#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A running `edgemark export PATH --listen 127.0.0.1:0` process, killed
/// when dropped.
pub struct Exporter {
    pub addr: SocketAddr,
    child: Child,
}

impl Exporter {
    /// Serves `region` until dropped.
    pub fn start(region: &Path) -> Exporter {
        Exporter::spawn(region, &[], Stdio::inherit())
    }

    /// Serves `region` until dropped, its standard error going to `log`.
    pub fn start_logged(region: &Path, log: &Path) -> Exporter {
        let log = std::fs::File::create(log).expect("create the exporter's log");
        Exporter::spawn(region, &[], Stdio::from(log))
    }

    /// Serves `region` for `seconds`.
    pub fn start_for(region: &Path, seconds: f64) -> Exporter {
        Exporter::spawn(
            region,
            &["--serve-for", &seconds.to_string()],
            Stdio::inherit(),
        )
    }

    fn spawn(region: &Path, args: &[&str], stderr: Stdio) -> Exporter {
        let mut child = Command::new(env!("CARGO_BIN_EXE_edgemark"))
            .arg("export")
            .arg(region)
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn edgemark export");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("serving http://")
            .and_then(|l| l.strip_suffix("/metrics"))
            .unwrap_or_else(|| panic!("edgemark export said {line:?}"))
            .parse()
            .unwrap();
        Exporter { addr, child }
    }

    /// Waits up to `limit` for the process to exit by itself.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "edgemark export still runs");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One response: its status line, headers (names in lower case) and body.
#[derive(Debug)]
pub struct Reply {
    pub status: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one response from `r`; its body only if `with_body` (a response
/// to HEAD has none). Panics on a malformed response or at end of stream.
pub fn read_reply(r: &mut impl BufRead, with_body: bool) -> Reply {
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    assert!(
        !status.is_empty(),
        "the connection closed before a response"
    );
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').expect("a header line");
        headers.push((name.to_ascii_lowercase(), value.trim().to_owned()));
    }
    let mut reply = Reply {
        status: status.trim_end().to_owned(),
        headers,
        body: String::new(),
    };
    if with_body {
        let length: usize = reply
            .header("content-length")
            .expect("a content-length")
            .parse()
            .unwrap();
        let mut body = vec![0u8; length];
        r.read_exact(&mut body).unwrap();
        reply.body = String::from_utf8(body).unwrap();
    }
    reply
}

/// A connection to `addr` that gives up reading after 10 s.
pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// `METHOD path` on a fresh connection that closes after it.
pub fn request(addr: SocketAddr, method: &str, path: &str) -> Reply {
    let mut s = connect(addr);
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    read_reply(&mut BufReader::new(s), method != "HEAD")
}

/// `GET /metrics` on a fresh connection.
pub fn scrape(addr: SocketAddr) -> Reply {
    request(addr, "GET", "/metrics")
}

/// The status line and the body of `GET path`.
pub fn http_get(addr: SocketAddr, path: &str) -> (String, String) {
    let r = request(addr, "GET", path);
    (r.status, r.body)
}

/// Every metric family of a scrape, in the classic text format.
pub const FAMILIES: [&str; 19] = [
    "edgemark_region_ok",
    "edgemark_boundary_elapsed_seconds",
    "edgemark_delta_seconds",
    "edgemark_refused_records_total",
    "edgemark_closed_given_up_total",
    "edgemark_closed_requests_total",
    "edgemark_reclaimed_requests_total",
    "edgemark_expired_requests_total",
    "edgemark_dropped_segments_total",
    "edgemark_closed_lost_total",
    "edgemark_closed_acknowledged_total",
    "edgemark_closed_overwritten_taken_total",
    "edgemark_closed_settled_overwritten_total",
    "edgemark_bad_trace_contexts_total",
    "edgemark_open_requests",
    "edgemark_free_slots",
    "edgemark_closed_unread",
    "edgemark_closed_unacknowledged",
    "edgemark_closed_readers",
];

/// Asserts that `reply` is a 200 with every metric family in it.
pub fn assert_full_metrics(reply: &Reply) {
    assert_eq!(reply.status, "HTTP/1.1 200 OK", "{reply:?}");
    for family in FAMILIES {
        assert!(
            reply.body.contains(&format!("# TYPE {family} ")),
            "{family} missing from\n{}",
            reply.body
        );
    }
    assert!(
        reply.body.contains("\nedgemark_free_slots "),
        "{}",
        reply.body
    );
}
