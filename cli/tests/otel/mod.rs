//! What the OTLP export tests share: finding rotel and Phoenix, each a
//! process stopped by its saved pid, the `edgemark export --otlp` process
//! and its `/metrics`, regions with requests closed in them, and the reads
//! that check what arrived. `spans` reads Phoenix's spans, `pki` makes the
//! https tests' certificates, `hosts` the two-host test's network.
//!
//! rotel and Phoenix are found in the Python virtual environment named by
//! `EDGEMARK_OTEL_VENV`; where they are missing, [`missing`] says so, and
//! fails under `EDGEMARK_REQUIRE_OTEL=1`.

pub(crate) mod hosts;
pub(crate) mod pki;
pub(crate) mod spans;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgemark::{Edge, Event, Mark, Recorder, TraceContext};
use rustix::process::Signal;
use serde_json::Value;

pub(crate) const EDGEMARK: &str = env!("CARGO_BIN_EXE_edgemark");
/// How long a test waits for something to arrive before failing (not a
/// timing that is asserted: only a bound on a wait for an event).
const PATIENCE: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------------------
// Finding the tools.

/// The virtual environment that holds rotel and Phoenix:
/// `EDGEMARK_OTEL_VENV`, if set.
fn venv() -> Option<PathBuf> {
    std::env::var_os("EDGEMARK_OTEL_VENV")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

fn required() -> bool {
    std::env::var("EDGEMARK_REQUIRE_OTEL").as_deref() == Ok("1")
}

/// Says why a test cannot run: fails under `EDGEMARK_REQUIRE_OTEL=1`,
/// else prints it and lets the test pass without running.
pub(crate) fn missing(what: &str) {
    if required() {
        panic!("EDGEMARK_REQUIRE_OTEL=1 but {what}");
    }
    eprintln!(
        "SKIPPED: {what} (set EDGEMARK_OTEL_VENV to the environment that has them; \
         EDGEMARK_REQUIRE_OTEL=1 fails instead)"
    );
}

/// rotel's agent binary, shipped inside its wheel.
pub(crate) fn rotel() -> Option<PathBuf> {
    let Some(venv) = venv() else {
        missing("EDGEMARK_OTEL_VENV is not set: no rotel");
        return None;
    };
    let lib = venv.join("lib");
    let found = std::fs::read_dir(&lib).ok().and_then(|d| {
        d.flatten()
            .map(|e| e.path().join("site-packages/rotel/rotel-agent"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        missing(&format!("rotel is not installed in {}", venv.display()));
    }
    found
}

/// Phoenix's command.
pub(crate) fn phoenix() -> Option<PathBuf> {
    let Some(venv) = venv() else {
        missing("EDGEMARK_OTEL_VENV is not set: no Phoenix");
        return None;
    };
    let p = venv.join("bin/phoenix");
    if p.is_file() {
        Some(p)
    } else {
        missing(&format!(
            "arize-phoenix is not installed in {}",
            venv.display()
        ));
        None
    }
}

// ---------------------------------------------------------------------------
// Processes, stopped by their saved pid.

/// A process started in its own process group, killed (the whole group)
/// when dropped.
pub(crate) struct Proc {
    pub(crate) pid: i32,
    pub(crate) child: std::process::Child,
}

impl Proc {
    pub(crate) fn spawn(name: &'static str, cmd: &mut Command) -> Proc {
        use std::os::unix::process::CommandExt;
        let child = cmd
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Proc {
            pid: child.id() as i32,
            child,
        }
    }

    /// Stops it and waits for it.
    pub(crate) fn stop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.pid) {
            let _ = rustix::process::kill_process_group(pid, Signal::KILL);
        }
        let _ = self.child.wait();
    }

    pub(crate) fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends `sig` to the process (not its group).
    pub(crate) fn signal(&self, sig: Signal) {
        let pid = rustix::process::Pid::from_raw(self.pid).unwrap();
        rustix::process::kill_process(pid, sig).unwrap();
    }

    /// Sends `sig` to the process group (Phoenix runs workers).
    pub(crate) fn signal_group(&self, sig: Signal) {
        let pid = rustix::process::Pid::from_raw(self.pid).unwrap();
        rustix::process::kill_process_group(pid, sig).unwrap();
    }

    /// Waits for it to exit.
    pub(crate) fn wait_exit(&mut self) -> std::process::ExitStatus {
        wait_for("the exporter to exit", || {
            self.child.try_wait().ok().flatten()
        })
    }

    /// `Child::wait_with_output` for a `Proc`: waits, returns its standard
    /// output.
    pub(crate) fn wait_with_output(mut self) -> String {
        let mut out = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            o.read_to_string(&mut out).unwrap();
        }
        let _ = self.child.wait();
        out
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A free TCP port on `ip`.
pub(crate) fn free_port(ip: &str) -> u16 {
    TcpListener::bind((ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until `check` says yes, failing with `what` after [`PATIENCE`].
pub(crate) fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(start.elapsed() < PATIENCE, "waited {PATIENCE:?} for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

// ---------------------------------------------------------------------------
// Reading over HTTP.

/// `GET path` of `addr` over HTTP/1.0: the status and the body.
pub(crate) fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: */*\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    answer(&raw)
}

/// `GET path` of `addr` over HTTP/1.0 in TLS, the server's certificate
/// checked for `addr`'s IP address: the status and the body.
fn get_tls(addr: SocketAddr, path: &str, tls: &Arc<rustls::ClientConfig>) -> Option<(u16, String)> {
    let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let name = rustls::pki_types::ServerName::from(addr.ip());
    let conn = rustls::ClientConnection::new(Arc::clone(tls), name).ok()?;
    let mut s = rustls::StreamOwned::new(conn, tcp);
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: */*\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    match s.read_to_end(&mut raw) {
        Ok(_) => {}
        // A server that closes without TLS's close_notify: the answer
        // is whole when its body is (HTTP/1.0 ends it with the close).
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(_) => return None,
    }
    answer(&raw)
}

/// The status and the body of an HTTP answer.
fn answer(raw: &[u8]) -> Option<(u16, String)> {
    let text = String::from_utf8_lossy(raw).into_owned();
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Some((status, body))
}

// ---------------------------------------------------------------------------
// The collector, the backend and the exporter.

/// A rotel agent: OTLP/HTTP on `port`, spans written to its debug log.
pub(crate) struct Rotel {
    pub(crate) proc: Proc,
    log: PathBuf,
}

/// A rotel agent of `bin` on local port `port`, its logs in `dir` under
/// the number `n` (one per start in a test).
pub(crate) fn start_rotel(bin: &Path, dir: &Path, port: u16, n: u32) -> Rotel {
    let log = dir.join(format!("rotel-{n}.log"));
    let out = std::fs::File::create(&log).unwrap();
    let proc = Proc::spawn(
        "rotel",
        Command::new(bin)
            .args(["start", "--exporter", "blackhole"])
            .args(["--debug-log", "traces", "--debug-log-verbosity", "detailed"])
            .arg("--otlp-http-endpoint")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--otlp-grpc-endpoint")
            .arg(format!("127.0.0.1:{}", free_port("127.0.0.1")))
            .arg("--log-file")
            .arg(dir.join(format!("rotel-{n}.agent.log")))
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out)),
    );
    // Up when its HTTP receiver answers.
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_for("rotel's OTLP receiver", || {
        TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()
    });
    Rotel { proc, log }
}

impl Rotel {
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until its debug log `has` what the test looks for (`what`);
    /// the log then.
    pub(crate) fn wait_log(&self, what: &str, has: impl Fn(&str) -> bool) -> String {
        wait_for(what, || {
            let log = self.log();
            has(&log).then_some(log)
        })
    }
}

/// A Phoenix server on `ip` (its REST API and OTLP/HTTP on one port),
/// over TLS if `tls` (how it is read back) is some.
pub(crate) struct Phoenix {
    pub(crate) proc: Proc,
    pub(crate) addr: SocketAddr,
    tls: Option<Arc<rustls::ClientConfig>>,
}

pub(crate) fn start_phoenix(bin: &Path, dir: &Path, ip: &str) -> Phoenix {
    start_phoenix_with(bin, dir, ip, &[], None)
}

/// [`start_phoenix`] with more of its variables, read back through `tls`
/// if some.
pub(crate) fn start_phoenix_with(
    bin: &Path,
    dir: &Path,
    ip: &str,
    envs: &[(&str, &Path)],
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Phoenix {
    let port = free_port(ip);
    let log = std::fs::File::create(dir.join("phoenix.log")).unwrap();
    let proc = Proc::spawn(
        "phoenix",
        Command::new(bin)
            .arg("serve")
            .env("PHOENIX_HOST", ip)
            .env("PHOENIX_PORT", port.to_string())
            .env("PHOENIX_GRPC_PORT", free_port(ip).to_string())
            .env("PHOENIX_WORKING_DIR", dir.join("phoenix"))
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .envs(envs.iter().copied())
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log)),
    );
    let addr: SocketAddr = format!("{ip}:{port}").parse().unwrap();
    let phoenix = Phoenix { proc, addr, tls };
    wait_for("Phoenix to answer /healthz", || {
        phoenix.get("/healthz").filter(|(s, _)| *s == 200)
    });
    phoenix
}

impl Phoenix {
    /// Its plain-http URL, where the exporter sends.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `GET path`, over TLS if Phoenix serves it.
    pub(crate) fn get(&self, path: &str) -> Option<(u16, String)> {
        match &self.tls {
            None => get(self.addr, path),
            Some(tls) => get_tls(self.addr, path, tls),
        }
    }

    /// The spans of `trace_id` Phoenix holds.
    pub(crate) fn spans(&self, trace_id: &str) -> Vec<Value> {
        let path = format!("/v1/projects/default/spans?trace_id={trace_id}&limit=1000");
        match self.get(&path) {
            Some((200, body)) => serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v["data"].as_array().cloned())
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// Waits until Phoenix holds `n` spans of `trace_id`.
    pub(crate) fn wait_spans(&self, trace_id: &str, n: usize) -> Vec<Value> {
        wait_for(&format!("{n} spans of trace {trace_id} in Phoenix"), || {
            let s = self.spans(trace_id);
            (s.len() >= n).then_some(s)
        })
    }
}

/// A running `edgemark export PATH --otlp URL --listen 127.0.0.1:0`, and
/// the address of its `/metrics`.
pub(crate) struct Exporter {
    pub(crate) proc: Proc,
    pub(crate) metrics: SocketAddr,
}

/// `edgemark export` of `region` to `url`, with `envs` over the
/// environment, its standard error in `dir`'s `export.err`.
pub(crate) fn start_exporter(
    region: &Path,
    url: &str,
    dir: &Path,
    envs: &[(&str, &str)],
) -> Exporter {
    start_exporter_logging_to(region, url, &dir.join("export.err"), envs)
}

/// [`start_exporter`] with its standard error written to `err`.
pub(crate) fn start_exporter_logging_to(
    region: &Path,
    url: &str,
    err: &Path,
    envs: &[(&str, &str)],
) -> Exporter {
    let err = std::fs::File::create(err).unwrap();
    let mut proc = Proc::spawn(
        "edgemark export",
        Command::new(EDGEMARK)
            .arg("export")
            .arg(region)
            .args(["--otlp", url, "--listen", "127.0.0.1:0"])
            .envs(envs.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err)),
    );
    let mut out = BufReader::new(proc.child.stdout.take().unwrap());
    let mut addr = None;
    for _ in 0..2 {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        if let Some(a) = line
            .trim()
            .strip_prefix("serving http://")
            .and_then(|l| l.strip_suffix("/metrics"))
        {
            addr = Some(a.parse().unwrap());
        }
    }
    let metrics = addr.expect("edgemark export says where it serves /metrics");
    Exporter { proc, metrics }
}

impl Exporter {
    /// The value of the sample `name` in its `/metrics`.
    pub(crate) fn metric(&self, name: &str) -> f64 {
        value_in(&self.scrape(), name)
    }

    /// Its `/metrics` text now: one reading of every counter.
    pub(crate) fn scrape(&self) -> String {
        let (status, body) = get(self.metrics, "/metrics").expect("/metrics answers");
        assert_eq!(status, 200);
        body
    }

    /// Waits until the sample `name` is as `until` wants it (`what`).
    pub(crate) fn wait_metric(&self, what: &str, name: &str, until: impl Fn(f64) -> bool) {
        wait_for(what, || until(self.metric(name)).then_some(()));
    }

    /// Waits until it counts `spans` exported: the collector answers
    /// before the exporter counts its answer.
    pub(crate) fn wait_exported(&self, spans: f64) {
        self.wait_metric(
            "the spans counted as exported",
            "edgemark_otlp_exported_spans_total",
            |v| v >= spans,
        );
    }

    /// Stops it with SIGTERM, which it must end on with success.
    pub(crate) fn terminate(&mut self) {
        self.proc.signal(Signal::TERM);
        assert!(self.proc.wait_exit().success());
    }
}

/// The value of the sample `name` in the `/metrics` text `body`.
pub(crate) fn value_in(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} in\n{body}"))
}

// ---------------------------------------------------------------------------
// Regions and requests.

/// `edgemark ARGS`, which must succeed: its standard output.
pub(crate) fn run(args: &[&str]) -> String {
    let out = Command::new(EDGEMARK).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "edgemark {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A region with edges 0->1 and 1->2 in `dir`.
pub(crate) fn region(dir: &Path) -> PathBuf {
    let p = dir.join("r.region");
    run(&[
        "create",
        p.to_str().unwrap(),
        "--edge",
        "0:1",
        "--edge",
        "1:2",
    ]);
    p
}

/// A region in a directory of its own under `dir`.
pub(crate) fn region_in(dir: &Path, name: &str) -> PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    region(&d)
}

/// The region's report as `edgemark inspect --json` prints it, without its
/// open requests.
pub(crate) fn region_report(region: &Path) -> Value {
    let out = run(&["inspect", region.to_str().unwrap(), "--json"]);
    let mut v: Value = serde_json::from_str(&out).unwrap();
    v.as_object_mut().unwrap().remove("open");
    v
}

/// Closed requests the region counts.
pub(crate) fn closed_requests(region: &Path) -> u64 {
    let ring = region_report(region);
    ring["closed_requests"]
        .as_u64()
        .unwrap_or_else(|| panic!("closed_requests in {ring}"))
}

/// A traceparent with a fresh random trace id and parent span id.
fn fresh_traceparent() -> (String, String, String) {
    let mut b = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut b)
        .unwrap();
    let hex = |s: &[u8]| s.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let (t, p) = (hex(&b[..16]), hex(&b[16..]));
    (format!("00-{t}-{p}-01"), t, p)
}

/// Runs one request on `rec`: begun under a traceparent of a fresh trace,
/// every boundary of edge 0->1 recorded on the region's clock, closed. Its
/// trace id and its parent's span id.
pub(crate) fn one_request(rec: &Recorder) -> (String, String) {
    let (traceparent, trace_id, parent) = fresh_traceparent();
    let ctx: TraceContext = traceparent.parse().unwrap();
    let t = rec.begin_traced(Some(ctx)).unwrap();
    for (i, event) in Event::ALL.into_iter().enumerate() {
        std::thread::sleep(Duration::from_millis(1));
        let mut mark = Mark::new(Edge::new(0, 1), event);
        if i == 0 {
            mark = mark.chunk_seq(3);
        }
        assert!(rec.record(t, mark).is_success());
    }
    assert_eq!(rec.close(t).segments().len(), 1);
    (trace_id, parent)
}

/// Whether some TCP connection to local port `port` holds unread bytes
/// (`/proc/net/tcp`'s `rx_queue`): a post waiting in a stopped server's
/// socket.
pub(crate) fn unread_bytes_at(port: u16) -> bool {
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    tcp.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let local_port = f
            .get(1)
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| u16::from_str_radix(p, 16).ok());
        let rx = f
            .get(4)
            .and_then(|q| q.split(':').nth(1))
            .and_then(|r| u64::from_str_radix(r, 16).ok());
        local_port == Some(port) && rx.is_some_and(|r| r > 0)
    })
}
