//! `edgemark export --otlp` against real OpenTelemetry parts: the rotel
//! collector (its debug log read back), Arize Phoenix (its REST API read
//! back), and two simulated hosts (network namespaces, each with its own
//! `/dev/shm`) whose exporters send one cross-host request's spans into one
//! Phoenix.
//!
//! The https tests make their CA, server and client certificates with
//! Debian's `openssl` command, start Phoenix with TLS, and read its spans
//! back over TLS.
//!
//! rotel and Phoenix are found in the Python virtual environment named by
//! `EDGEMARK_OTEL_VENV` (`.ci/run` builds one: `pip install rotel
//! arize-phoenix`; rotel's binary needs Debian's `libpython3.11`). Where they are missing, each test says so and
//! passes without running, unless `EDGEMARK_REQUIRE_OTEL=1` (CI sets it),
//! which makes it fail. The two-host test also needs root, `ip` and
//! `unshare`. Every process started is stopped by its saved pid (its
//! process group), and every namespace and link made is deleted by its
//! saved name, on failure too.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgemark::{Edge, Event, Mark, Recorder, TraceContext};
use serde_json::Value;

const EDGEMARK: &str = env!("CARGO_BIN_EXE_edgemark");
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
fn missing(what: &str) {
    if required() {
        panic!("EDGEMARK_REQUIRE_OTEL=1 but {what}");
    }
    eprintln!(
        "SKIPPED: {what} (set EDGEMARK_OTEL_VENV to the environment that has them; \
         EDGEMARK_REQUIRE_OTEL=1 fails instead)"
    );
}

/// rotel's agent binary, shipped inside its wheel.
fn rotel() -> Option<PathBuf> {
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
fn phoenix() -> Option<PathBuf> {
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
struct Proc {
    pid: i32,
    child: std::process::Child,
}

impl Proc {
    fn spawn(name: &'static str, cmd: &mut Command) -> Proc {
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
    fn stop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.pid) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        let _ = self.child.wait();
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A free TCP port on `ip`.
fn free_port(ip: &str) -> u16 {
    TcpListener::bind((ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until `check` says yes, failing with `what` after [`PATIENCE`].
fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(start.elapsed() < PATIENCE, "waited {PATIENCE:?} for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `GET path` of `addr` over HTTP/1.0: the status and the body.
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
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
struct Rotel {
    proc: Proc,
    log: PathBuf,
}

fn start_rotel(bin: &Path, dir: &Path, port: u16, n: u32) -> Rotel {
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
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A Phoenix server on `ip` (its REST API and OTLP/HTTP on one port),
/// over TLS if `tls` (how it is read back) is some.
struct Phoenix {
    proc: Proc,
    addr: SocketAddr,
    tls: Option<Arc<rustls::ClientConfig>>,
}

fn start_phoenix(bin: &Path, dir: &Path, ip: &str) -> Phoenix {
    start_phoenix_with(bin, dir, ip, &[], None)
}

/// [`start_phoenix`] with more of its variables, read back through `tls`
/// if some.
fn start_phoenix_with(
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
    /// `GET path`, over TLS if Phoenix serves it.
    fn get(&self, path: &str) -> Option<(u16, String)> {
        match &self.tls {
            None => get(self.addr, path),
            Some(tls) => get_tls(self.addr, path, tls),
        }
    }

    /// The spans of `trace_id` Phoenix holds.
    fn spans(&self, trace_id: &str) -> Vec<Value> {
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
    fn wait_spans(&self, trace_id: &str, n: usize) -> Vec<Value> {
        wait_for(&format!("{n} spans of trace {trace_id} in Phoenix"), || {
            let s = self.spans(trace_id);
            (s.len() >= n).then_some(s)
        })
    }
}

/// `edgemark export PATH --otlp URL --listen 127.0.0.1:0`, and the address
/// of its `/metrics`.
fn start_exporter(
    region: &Path,
    url: &str,
    dir: &Path,
    envs: &[(&str, &str)],
) -> (Proc, SocketAddr) {
    start_exporter_logging_to(region, url, &dir.join("export.err"), envs)
}

/// [`start_exporter`] with its standard error written to `err`.
fn start_exporter_logging_to(
    region: &Path,
    url: &str,
    err: &Path,
    envs: &[(&str, &str)],
) -> (Proc, SocketAddr) {
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
    let addr = addr.expect("edgemark export says where it serves /metrics");
    (proc, addr)
}

/// The value of the sample `name` in `/metrics` of `addr`.
fn metric(addr: SocketAddr, name: &str) -> f64 {
    value_in(&scrape(addr), name)
}

/// The exporter's /metrics text now: one reading of every counter.
fn scrape(addr: SocketAddr) -> String {
    let (status, body) = get(addr, "/metrics").expect("/metrics answers");
    assert_eq!(status, 200);
    body
}

/// Waits until the exporter at `metrics` counts `spans` exported: the
/// collector answers before the exporter counts its answer.
fn wait_exported(metrics: SocketAddr, spans: f64) {
    wait_for("the spans counted as exported", || {
        (metric(metrics, "edgemark_otlp_exported_spans_total") >= spans).then_some(())
    });
}

fn value_in(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} in\n{body}"))
}

fn run(args: &[&str]) -> String {
    let out = Command::new(EDGEMARK).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "edgemark {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A region with edges 0->1 and 1->2 in `dir`.
fn region(dir: &Path) -> PathBuf {
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

/// Runs one request on `rec`: begun under `traceparent`, every boundary of
/// edge 0->1 recorded on the region's clock, closed.
fn one_request(rec: &Recorder, traceparent: &str) {
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
}

// ---------------------------------------------------------------------------
// What the exporter refuses (no collector needed).

#[test]
fn export_refuses_what_it_cannot_send_before_serving_anything() {
    let dir = tempfile::tempdir().unwrap();
    let region = region(dir.path());
    let refused = |url: Option<&str>, env: &[(&str, &str)]| {
        let mut cmd = Command::new(EDGEMARK);
        cmd.arg("export").arg(&region).arg("--otlp");
        if let Some(u) = url {
            cmd.arg(u);
        }
        for v in [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
        ] {
            cmd.env_remove(v);
        }
        let out = cmd.envs(env.iter().copied()).output().unwrap();
        assert!(!out.status.success());
        assert!(
            out.stdout.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stderr).unwrap()
    };
    let e = refused(
        Some("http://127.0.0.1:4318"),
        &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
    );
    assert!(
        e.contains("OTEL_EXPORTER_OTLP_PROTOCOL=grpc: this exporter speaks OTLP over HTTP with protobuf only"),
        "{e}"
    );
    // TLS settings that cannot be used: a client key without its
    // certificate, a CA file that is not there.
    let key = dir.path().join("client.key");
    std::fs::write(&key, "").unwrap();
    let e = refused(
        Some("https://collector:4318"),
        &[("OTEL_EXPORTER_OTLP_CLIENT_KEY", key.to_str().unwrap())],
    );
    assert!(
        e.contains(
            "OTEL_EXPORTER_OTLP_CLIENT_KEY is set but not OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"
        ),
        "{e}"
    );
    let gone = dir.path().join("gone.pem");
    let e = refused(
        Some("https://collector:4318"),
        &[(
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            gone.to_str().unwrap(),
        )],
    );
    assert!(
        e.contains(&format!(
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE={}: cannot read the file",
            gone.display()
        )),
        "{e}"
    );
    let e = refused(None, &[]);
    assert!(e.contains("--otlp needs the collector's URL"), "{e}");
    // Ports that would have sent to port 80, credentials, fragments,
    // reserved headers: refused at start, the password never printed.
    for port in ["99999", "abc", "0"] {
        let e = refused(Some(&format!("http://127.0.0.1:{port}")), &[]);
        assert!(e.contains("is not a port number"), "{port}: {e}");
    }
    let e = refused(Some("http://user:hunter2@127.0.0.1:4318"), &[]);
    assert!(e.contains("credentials") && !e.contains("hunter2"), "{e}");
    let e = refused(Some("http://127.0.0.1:4318/#frag"), &[]);
    assert!(e.contains("fragment"), "{e}");
    let e = refused(
        Some("http://127.0.0.1:4318"),
        &[("OTEL_EXPORTER_OTLP_HEADERS", "content-length=5")],
    );
    assert!(e.contains("the exporter's own header"), "{e}");
    // A region without a ring of closed requests has nothing to send.
    let bare = dir.path().join("bare.region");
    run(&[
        "create",
        bare.to_str().unwrap(),
        "--edge",
        "0:1",
        "--closed-entries",
        "0",
    ]);
    let out = Command::new(EDGEMARK)
        .arg("export")
        .arg(&bare)
        .args(["--otlp", "http://127.0.0.1:4318"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("keeps no ring of closed requests"), "{e}");
}

// ---------------------------------------------------------------------------
// rotel.

#[test]
fn spans_reach_rotel_with_their_trace_names_events_and_attributes() {
    let Some(bin) = rotel() else { return };
    let dir = tempfile::tempdir().unwrap();
    let region = region(dir.path());
    let port = free_port("127.0.0.1");
    let rotel = start_rotel(&bin, dir.path(), port, 0);
    let url = format!("http://127.0.0.1:{port}");
    let (_exporter, metrics) = start_exporter(
        &region,
        &url,
        dir.path(),
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_SERVICE_NAME", "edgemark-test"),
        ],
    );
    let rec = Recorder::attach(&region).unwrap();
    let (tp, trace_id, parent) = fresh_traceparent();
    one_request(&rec, &tp);

    let log = wait_for("the trace in rotel's debug log", || {
        let log = rotel.log();
        log.contains("edgemark 0->1").then_some(log)
    });
    assert!(
        log.contains(&format!("Trace ID       : {trace_id}")),
        "{log}"
    );
    assert!(log.contains("Name           : edgemark request"), "{log}");
    assert!(log.contains(&format!("Parent ID      : {parent}")), "{log}");
    assert!(log.contains("service.name: Str(edgemark-test)"), "{log}");
    assert!(log.contains("host.name: Str("), "{log}");
    for event in [
        "producer_first_nonempty_emit",
        "edge_first_send_complete",
        "consumer_first_accept",
        "consumer_first_nonempty_output",
    ] {
        assert!(
            log.contains(&format!("-> Name: {event}")),
            "{event} in {log}"
        );
    }
    for attr in [
        "edgemark.edge: Str(0->1)",
        "edgemark.segment: Int(0)",
        "edgemark.chunk_seq: Int(3)",
        "edgemark.clock_domain: Str(host_monotonic)",
        "edgemark.producer_first_nonempty_emit_to_edge_first_send_complete_ms: Double(",
    ] {
        assert!(log.contains(attr), "{attr} in {log}");
    }
    wait_exported(metrics, 2.0);
    assert_eq!(metric(metrics, "edgemark_otlp_ring_lost_total"), 0.0);
}

#[test]
fn a_collector_stopped_and_restarted_blocks_nothing_and_loses_nothing_the_ring_holds() {
    let Some(bin) = rotel() else { return };
    let dir = tempfile::tempdir().unwrap();
    let region = region(dir.path());
    let port = free_port("127.0.0.1");
    let mut rotel = start_rotel(&bin, dir.path(), port, 0);
    let url = format!("http://127.0.0.1:{port}");
    // A small queue, so that the requests closed while the collector is
    // down overflow it: the rest wait in the region's ring.
    let (mut exporter, metrics) = start_exporter(
        &region,
        &url,
        dir.path(),
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "32"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "16"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2000"),
        ],
    );
    let rec = Recorder::attach(&region).unwrap();
    let (tp, before, _) = fresh_traceparent();
    one_request(&rec, &tp);
    wait_for("the first trace in rotel", || {
        rotel.log().contains(&before).then_some(())
    });

    // The collector goes away. Requests keep closing (no close waits for
    // the exporter), more than its queue holds.
    rotel.proc.stop();
    let mut down = Vec::new();
    for _ in 0..60 {
        let (tp, t, _) = fresh_traceparent();
        one_request(&rec, &tp);
        down.push(t);
    }
    wait_for("a failed post", || {
        (metric(metrics, "edgemark_otlp_export_failures_total") > 0.0).then_some(())
    });
    assert!(metric(metrics, "edgemark_otlp_export_failures_total") > 0.0);
    assert_eq!(metric(metrics, "edgemark_otlp_collector_up"), 0.0);
    assert!(
        exporter.running(),
        "the exporter runs on while the collector is down"
    );

    // Back on the same port: what closes after the restart arrives.
    let rotel = start_rotel(&bin, dir.path(), port, 1);
    let (tp, after, _) = fresh_traceparent();
    one_request(&rec, &tp);
    wait_for("the trace closed after the restart in rotel", || {
        rotel.log().contains(&after).then_some(())
    });
    // And every one closed while it was down: the queue's, then the
    // ring's.
    wait_for("the 60 traces closed while rotel was down", || {
        let log = rotel.log();
        down.iter().all(|t| log.contains(t.as_str())).then_some(())
    });
    let ring = region_report(&region);
    assert_eq!(ring["closed_lost"], 0, "{ring}");
    assert_eq!(ring["closed_given_up"]["queue_full"], 0, "{ring}");
    wait_for("the collector counted up again", || {
        (metric(metrics, "edgemark_otlp_collector_up") == 1.0).then_some(())
    });
    assert_eq!(metric(metrics, "edgemark_otlp_ring_lost_total"), 0.0);
}

// ---------------------------------------------------------------------------
// Phoenix, one host.

/// The span of `spans` named `name`.
fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

/// The span tree of `spans` as text, children indented under parents.
fn tree(spans: &[Value]) -> String {
    fn walk(spans: &[Value], parent: Option<&str>, depth: usize, out: &mut String) {
        let mut kids: Vec<&Value> = spans
            .iter()
            .filter(|s| s["parent_id"].as_str() == parent)
            .collect();
        kids.sort_by_key(|s| s["start_time"].as_str().unwrap_or("").to_owned());
        for s in kids {
            let id = s["context"]["span_id"].as_str().unwrap_or("");
            let events: Vec<&str> = s["events"]
                .as_array()
                .map(|e| e.iter().filter_map(|e| e["name"].as_str()).collect())
                .unwrap_or_default();
            out.push_str(&format!(
                "{}{} [span {id}, region {}] {} .. {}{}\n",
                "  ".repeat(depth),
                s["name"].as_str().unwrap_or("?"),
                s["attributes"]["edgemark.region"]
                    .as_str()
                    .or_else(|| s["attributes"]["edgemark"]["region"].as_str())
                    .unwrap_or("?"),
                s["start_time"].as_str().unwrap_or(""),
                s["end_time"].as_str().unwrap_or(""),
                if events.is_empty() {
                    String::new()
                } else {
                    format!("\n{}  events: {}", "  ".repeat(depth), events.join(", "))
                }
            ));
            walk(spans, Some(id), depth + 1, out);
        }
    }
    let ids: Vec<&str> = spans
        .iter()
        .filter_map(|s| s["context"]["span_id"].as_str())
        .collect();
    let mut out = String::new();
    // Roots: spans whose parent is not among them.
    let mut roots: Vec<Option<&str>> = spans
        .iter()
        .map(|s| s["parent_id"].as_str())
        .filter(|p| p.is_none_or(|p| !ids.contains(&p)))
        .collect();
    roots.dedup();
    for r in roots {
        if let Some(p) = r {
            out.push_str(&format!("(remote parent {p})\n"));
        }
        walk(spans, r, usize::from(r.is_some()), &mut out);
    }
    out
}

/// An attribute of a Phoenix span (flat, or nested by its dots).
fn attr<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    let a = &span["attributes"];
    a.get(key).or_else(|| {
        let mut v = a;
        for part in key.split('.') {
            v = v.get(part)?;
        }
        Some(v)
    })
}

/// The event timestamps of a span, in the order given.
fn event_times(span: &Value) -> Vec<String> {
    span["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["timestamp"].as_str().unwrap().to_owned())
        .collect()
}

/// Every delta attribute of `span` joins two values of this span in one
/// clock domain.
fn deltas_within_one_domain(span: &Value) {
    let Some(attrs) = span["attributes"].as_object() else {
        return;
    };
    let flat: Vec<(String, &Value)> = {
        fn flatten<'a>(prefix: &str, v: &'a Value, out: &mut Vec<(String, &'a Value)>) {
            match v.as_object() {
                Some(m) => {
                    for (k, v) in m {
                        let key = if prefix.is_empty() {
                            k.clone()
                        } else {
                            format!("{prefix}.{k}")
                        };
                        flatten(&key, v, out);
                    }
                }
                None => out.push((prefix.to_owned(), v)),
            }
        }
        let mut out = Vec::new();
        for (k, v) in attrs {
            flatten(k, v, &mut out);
        }
        out
    };
    let get = |k: &str| flat.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
    for (k, v) in &flat {
        let Some(pair) = k
            .strip_prefix("edgemark.")
            .and_then(|k| k.strip_suffix("_ms"))
            .and_then(|k| k.split_once("_to_"))
        else {
            continue;
        };
        let (a, b) = pair;
        let da = get(&format!("edgemark.{a}.clock_domain")).expect("the start's domain");
        let db = get(&format!("edgemark.{b}.clock_domain")).expect("the end's domain");
        assert_eq!(da, db, "{k} joins two clock domains");
        let va = get(&format!("edgemark.{a}_ms"))
            .and_then(Value::as_f64)
            .unwrap();
        let vb = get(&format!("edgemark.{b}_ms"))
            .and_then(Value::as_f64)
            .unwrap();
        assert!((vb - va - v.as_f64().unwrap()).abs() < 1e-6, "{k}");
    }
}

#[test]
fn phoenix_returns_the_request_span_and_its_edge_spans() {
    let Some(bin) = phoenix() else { return };
    let dir = tempfile::tempdir().unwrap();
    let phoenix = start_phoenix(&bin, dir.path(), "127.0.0.1");
    let region = region(dir.path());
    let url = format!("http://{}", phoenix.addr);
    let (_exporter, metrics) = start_exporter(
        &region,
        &url,
        dir.path(),
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    );
    let rec = Recorder::attach(&region).unwrap();
    let (tp, trace_id, parent) = fresh_traceparent();
    one_request(&rec, &tp);
    let spans = phoenix.wait_spans(&trace_id, 2);
    eprintln!("Phoenix's span tree of trace {trace_id}:\n{}", tree(&spans));
    assert_eq!(spans.len(), 2);
    let req = named(&spans, "edgemark request");
    assert_eq!(req.len(), 1);
    assert_eq!(req[0]["parent_id"], parent.as_str());
    let edge = named(&spans, "edgemark 0->1");
    assert_eq!(edge.len(), 1);
    assert_eq!(edge[0]["parent_id"], req[0]["context"]["span_id"]);
    let names: Vec<&str> = edge[0]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "producer_first_nonempty_emit",
            "edge_first_send_complete",
            "consumer_first_accept",
            "consumer_first_nonempty_output"
        ]
    );
    let times = event_times(edge[0]);
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert_eq!(
        attr(edge[0], "edgemark.chunk_seq").and_then(Value::as_i64),
        Some(3)
    );
    deltas_within_one_domain(edge[0]);
    wait_exported(metrics, 2.0);
}

// ---------------------------------------------------------------------------
// Two hosts.

/// The stage process of a simulated host (this test binary, started again
/// inside the host's namespaces). Does nothing in a normal run.
#[test]
fn stage_process_of_the_two_host_test() {
    let Ok(role) = std::env::var("EDGEMARK_OTLP_STAGE") else {
        return;
    };
    let region = std::env::var("EDGEMARK_OTLP_REGION").unwrap();
    let peer = std::env::var("EDGEMARK_OTLP_PEER").unwrap();
    let rec = Recorder::attach(&region).unwrap();
    let record_all = |token, edge: Edge| {
        for (i, event) in Event::ALL.into_iter().enumerate() {
            std::thread::sleep(Duration::from_millis(2));
            let mut mark = Mark::new(edge, event);
            if i == 0 {
                mark = mark.chunk_seq(0);
            }
            assert!(rec.record(token, mark).is_success());
        }
    };
    match role.as_str() {
        // Host A: the request begins here; edge 0->1; the token and the
        // request's context cross to B in one message.
        "a" => {
            let token = rec.begin_traced(None).unwrap();
            let ctx = rec.trace_context(token).unwrap();
            record_all(token, Edge::new(0, 1));
            let mut s = TcpStream::connect(peer.as_str()).unwrap();
            writeln!(s, "{token} {ctx}").unwrap();
            let mut reply = String::new();
            BufReader::new(&s).read_line(&mut reply).unwrap();
            assert_eq!(reply.trim(), "done");
            rec.close(token);
            println!("STAGE-A {ctx}");
        }
        // Host B: a local request under A's context; edge 1->2 in B's
        // clock; closed when B's part ends.
        "b" => {
            let listener = TcpListener::bind(peer.as_str()).unwrap();
            println!("listening");
            std::io::stdout().flush().unwrap();
            let (s, _) = listener.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line).unwrap();
            let (_a_token, ctx) = line.trim().split_once(' ').unwrap();
            let ctx: TraceContext = ctx.parse().unwrap();
            let token = rec.begin_traced(Some(ctx)).unwrap();
            record_all(token, Edge::new(1, 2));
            rec.close(token);
            let mine = rec.trace_context(token);
            writeln!(&s, "done").unwrap();
            println!(
                "STAGE-B {}",
                mine.map(|c| c.to_string()).unwrap_or_default()
            );
        }
        other => panic!("EDGEMARK_OTLP_STAGE={other}"),
    }
}

/// Network namespaces, veth links and a bridge, deleted by name when
/// dropped.
#[derive(Default)]
struct Net {
    namespaces: Vec<String>,
    links: Vec<String>,
}

impl Drop for Net {
    fn drop(&mut self) {
        for n in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
        for l in &self.links {
            // A veth went with its namespace: nothing to say then.
            let _ = Command::new("ip").args(["link", "del", l]).output();
        }
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_request_across_two_hosts_is_one_trace_in_phoenix() {
    let Some(bin) = phoenix() else { return };
    if !rustix::process::geteuid().is_root() {
        missing("the two-host test needs root (network and mount namespaces)");
        return;
    }
    for tool in ["ip", "unshare", "nsenter"] {
        if Command::new(tool).arg("-V").output().is_err()
            && Command::new(tool).arg("--version").output().is_err()
        {
            missing(&format!(
                "the two-host test needs `{tool}` (iproute2, util-linux)"
            ));
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    // Names and a subnet of this run's own.
    let id = std::process::id() % 100_000;
    let subnet = format!("10.213.{}", id % 200 + 20);
    let bridge = format!("emb{id}");
    let mut net = Net::default();
    ip(&["link", "add", &bridge, "type", "bridge"]);
    net.links.push(bridge.clone());
    ip(&["addr", "add", &format!("{subnet}.1/24"), "dev", &bridge]);
    ip(&["link", "set", &bridge, "up"]);
    let hosts = ["a", "b"];
    for (i, h) in hosts.iter().enumerate() {
        let ns = format!("em{id}{h}");
        let veth = format!("emv{id}{h}");
        ip(&["netns", "add", &ns]);
        net.namespaces.push(ns.clone());
        ip(&[
            "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ]);
        net.links.push(veth.clone());
        ip(&["link", "set", &veth, "master", &bridge, "up"]);
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{subnet}.{}/24", i + 2),
            "dev",
            "eth0",
        ]);
        ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
    }

    // One Phoenix, on the bridge: both hosts reach it.
    let phoenix = start_phoenix(&bin, dir.path(), &format!("{subnet}.1"));
    let url = format!("http://{}", phoenix.addr);

    // Each host: its own /dev/shm (a tmpfs in its own mount namespace), its
    // region there, its exporter; the exporter's pid is the host's handle.
    let mut exporters = Vec::new();
    for h in hosts {
        let ns = format!("em{id}{h}");
        let script = format!(
            "mount -t tmpfs -o size=64m tmpfs /dev/shm && \
             '{EDGEMARK}' create /dev/shm/host.region --edge 0:1 --edge 1:2 >/dev/null && \
             exec '{EDGEMARK}' export /dev/shm/host.region --otlp '{url}' --listen 127.0.0.1:9464"
        );
        let log = std::fs::File::create(dir.path().join(format!("export-{h}.log"))).unwrap();
        let mut p = Proc::spawn(
            "a host's exporter",
            Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &ns,
                    "unshare",
                    "--mount",
                    "--propagation",
                    "private",
                ])
                .args(["sh", "-c", &script])
                .env("OTEL_BSP_SCHEDULE_DELAY", "100")
                .env("OTEL_SERVICE_NAME", format!("edgemark-host-{h}"))
                .env("OTEL_RESOURCE_ATTRIBUTES", format!("host.name=host-{h}"))
                .stdout(Stdio::piped())
                .stderr(Stdio::from(log)),
        );
        // Both lines it prints (where it sends, where it serves), and its
        // standard output kept open: a closed pipe would end it.
        let mut out = BufReader::new(p.child.stdout.take().unwrap());
        let mut said = String::new();
        for _ in 0..2 {
            out.read_line(&mut said).unwrap();
        }
        assert!(
            said.starts_with("sending closed requests") && said.contains("/metrics"),
            "host {h}: {said:?}"
        );
        exporters.push((p, out));
    }

    // The stages, each inside its host's namespaces (the exporter's).
    let stage = |h: &str, peer: &str| {
        let mut cmd = Command::new("nsenter");
        cmd.arg("-t")
            .arg(exporters[if h == "a" { 0 } else { 1 }].0.pid.to_string())
            .args(["--mount", "--net", "--"])
            .arg(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "stage_process_of_the_two_host_test",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("EDGEMARK_OTLP_STAGE", h)
            .env("EDGEMARK_OTLP_REGION", "/dev/shm/host.region")
            .env("EDGEMARK_OTLP_PEER", peer)
            .stdout(Stdio::piped());
        cmd
    };
    let b_addr = format!("{subnet}.3:7000");
    let mut b = Proc::spawn("host b's stage", &mut stage("b", &b_addr));
    let mut b_out = BufReader::new(b.child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("listening") {
        line.clear();
        assert!(
            b_out.read_line(&mut line).unwrap() > 0,
            "host b's stage ended"
        );
    }
    let a = Proc::spawn("host a's stage", &mut stage("a", &b_addr));
    let a_out = a.wait_with_output_owned();
    let a_line = a_out
        .lines()
        .find_map(|l| l.split_once("STAGE-A ").map(|(_, c)| c.trim().to_owned()))
        .unwrap_or_else(|| panic!("host a's stage said {a_out}"));
    let mut rest = String::new();
    b_out.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("STAGE-B "), "host b's stage said {rest}");
    let a_ctx: TraceContext = a_line.parse().unwrap();
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let trace_id = hex(&a_ctx.trace_id());
    let a_span = hex(&a_ctx.span_id());

    let spans = phoenix.wait_spans(&trace_id, 4);
    eprintln!("Phoenix's span tree of trace {trace_id}:\n{}", tree(&spans));
    assert_eq!(spans.len(), 4, "{spans:#?}");
    assert!(
        spans
            .iter()
            .all(|s| s["context"]["trace_id"] == trace_id.as_str())
    );
    let requests = named(&spans, "edgemark request");
    assert_eq!(requests.len(), 2);
    let a_req = requests
        .iter()
        .find(|s| s["context"]["span_id"] == a_span.as_str())
        .expect("host a's request span");
    let b_req = requests
        .iter()
        .find(|s| s["context"]["span_id"] != a_span.as_str())
        .unwrap();
    // A's request began the trace; B's request is its child.
    assert!(a_req["parent_id"].is_null(), "{a_req}");
    assert_eq!(b_req["parent_id"], a_span.as_str());
    let e01 = named(&spans, "edgemark 0->1");
    let e12 = named(&spans, "edgemark 1->2");
    assert_eq!((e01.len(), e12.len()), (1, 1));
    assert_eq!(e01[0]["parent_id"], a_req["context"]["span_id"]);
    assert_eq!(e12[0]["parent_id"], b_req["context"]["span_id"]);
    // Each host's region is its own.
    assert_ne!(
        attr(a_req, "edgemark.region"),
        attr(b_req, "edgemark.region")
    );
    for edge in [e01[0], e12[0]] {
        let times = event_times(edge);
        assert_eq!(times.len(), 4);
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
        deltas_within_one_domain(edge);
    }
    drop(exporters);
    drop(b);
    drop(net);
}

/// `Child::wait_with_output` for a [`Proc`]: waits, returns its standard
/// output.
trait WaitOwned {
    fn wait_with_output_owned(self) -> String;
}

impl WaitOwned for Proc {
    fn wait_with_output_owned(mut self) -> String {
        let mut out = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            o.read_to_string(&mut out).unwrap();
        }
        let _ = self.child.wait();
        out
    }
}

// ---------------------------------------------------------------------------
// At least once: exporters stopped or killed with requests taken and not
// yet acknowledged, while the collector is up, down or paused (slow: its
// socket takes the post, and no answer comes).

/// The region's report as `edgemark inspect --json` prints it, without its
/// open requests.
fn region_report(region: &Path) -> Value {
    let out = run(&["inspect", region.to_str().unwrap(), "--json"]);
    let mut v: Value = serde_json::from_str(&out).unwrap();
    v.as_object_mut().unwrap().remove("open");
    v
}

/// Closed requests the region counts.
fn closed_requests(region: &Path) -> u64 {
    let ring = region_report(region);
    ring["closed_requests"]
        .as_u64()
        .unwrap_or_else(|| panic!("closed_requests in {ring}"))
}

/// Sends `sig` to the process (not its group).
fn signal(p: &Proc, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(p.pid).unwrap();
    rustix::process::kill_process(pid, sig).unwrap();
}

/// Sends `sig` to the process group of `p` (Phoenix runs workers).
fn signal_group(p: &Proc, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(p.pid).unwrap();
    rustix::process::kill_process_group(pid, sig).unwrap();
}

/// Waits for `p` to exit.
fn wait_exit(p: &mut Proc) -> std::process::ExitStatus {
    wait_for("the exporter to exit", || p.child.try_wait().ok().flatten())
}

/// The collector in a kill test.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Collector {
    Up,
    /// Nothing listens on its port until the second exporter starts.
    Down,
    /// rotel stopped with SIGSTOP: connections are taken by the kernel
    /// and posts sit in its socket, unanswered, until SIGCONT.
    Slow,
}

/// The kill test: an exporter takes 20 closed requests, and is stopped
/// with `sig` with the collector `collector`; 5 more close; a second
/// exporter starts with the collector up. Every closed request reaches
/// rotel, and the region's account is whole: each acknowledged once,
/// nothing lost, nothing left.
fn an_exporter_stopped_with(sig: rustix::process::Signal, collector: Collector) {
    use rustix::process::Signal;
    let Some(bin) = rotel() else { return };
    let dir = tempfile::tempdir().unwrap();
    let region = region(dir.path());
    let port = free_port("127.0.0.1");
    let url = format!("http://127.0.0.1:{port}");
    let mut rotel = (collector != Collector::Down).then(|| start_rotel(&bin, dir.path(), port, 0));
    if collector == Collector::Slow {
        signal(&rotel.as_ref().unwrap().proc, Signal::STOP);
    }
    let envs = [
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "8"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "60000"),
    ];
    let first_err = dir.path().join("first.err");
    let (mut first, metrics) = start_exporter_logging_to(&region, &url, &first_err, &envs);
    let rec = Recorder::attach(&region).unwrap();
    let mut traces = Vec::new();
    for _ in 0..20 {
        let (tp, t, _) = fresh_traceparent();
        one_request(&rec, &tp);
        traces.push(t);
    }
    wait_for("the first exporter taking all 20", || {
        (metric(metrics, "edgemark_otlp_requests_total") == 20.0).then_some(())
    });
    signal(&first, sig);
    let status = wait_exit(&mut first);
    let said = std::fs::read_to_string(&first_err).unwrap();
    if sig == Signal::KILL {
        assert!(!status.success());
    } else {
        assert!(status.success(), "{status:?}: {said}");
        assert!(said.contains("export stopped by SIG"), "{said}");
        if collector != Collector::Up {
            assert!(
                said.contains("20 closed requests not sent by the deadline: 20 left in the ring"),
                "{said}"
            );
        }
    }
    let ring = region_report(&region);
    assert_eq!(ring["closed_lost"], 0, "{ring}");
    if collector != Collector::Up {
        assert_eq!(ring["closed_unacknowledged"], 20, "{ring}");
    }
    match collector {
        Collector::Down => rotel = Some(start_rotel(&bin, dir.path(), port, 1)),
        // What reached its socket is read now, and may arrive twice.
        Collector::Slow => signal(&rotel.as_ref().unwrap().proc, Signal::CONT),
        Collector::Up => {}
    }
    let rotel = rotel.unwrap();
    for _ in 0..5 {
        let (tp, t, _) = fresh_traceparent();
        one_request(&rec, &tp);
        traces.push(t);
    }
    let second_err = dir.path().join("second.err");
    let (mut second, _) = start_exporter_logging_to(&region, &url, &second_err, &envs);
    wait_for("every trace in rotel", || {
        let log = rotel.log();
        traces
            .iter()
            .all(|t| log.contains(t.as_str()))
            .then_some(())
    });
    let ring = wait_for("every request acknowledged", || {
        let r = region_report(&region);
        (r["closed_acknowledged"] == 25).then_some(r)
    });
    assert_eq!(closed_requests(&region), 25);
    assert_eq!(
        (
            &ring["closed_lost"],
            &ring["closed_unread"],
            &ring["closed_unacknowledged"],
            &ring["closed_overwritten_taken"]
        ),
        (
            &Value::from(0),
            &Value::from(0),
            &Value::from(0),
            &Value::from(0)
        ),
        "{ring}"
    );
    assert_eq!(ring["closed_given_up"]["refused"], 0, "{ring}");
    if collector != Collector::Up {
        let said = std::fs::read_to_string(&second_err).unwrap();
        assert!(
            said.contains(
                "20 closed requests that an exporter before this one took and did not send"
            ),
            "{said}"
        );
    }
    signal(&second, Signal::TERM);
    assert!(wait_exit(&mut second).success());
}

#[test]
fn sigterm_with_the_collector_up_loses_nothing() {
    an_exporter_stopped_with(rustix::process::Signal::TERM, Collector::Up);
}

#[test]
fn sigterm_with_the_collector_down_leaves_the_requests_to_the_next_exporter() {
    an_exporter_stopped_with(rustix::process::Signal::TERM, Collector::Down);
}

#[test]
fn sigterm_with_the_collector_slow_leaves_the_requests_to_the_next_exporter() {
    an_exporter_stopped_with(rustix::process::Signal::TERM, Collector::Slow);
}

#[test]
fn sigint_with_the_collector_up_loses_nothing() {
    an_exporter_stopped_with(rustix::process::Signal::INT, Collector::Up);
}

#[test]
fn sigint_with_the_collector_down_leaves_the_requests_to_the_next_exporter() {
    an_exporter_stopped_with(rustix::process::Signal::INT, Collector::Down);
}

#[test]
fn sigint_with_the_collector_slow_leaves_the_requests_to_the_next_exporter() {
    an_exporter_stopped_with(rustix::process::Signal::INT, Collector::Slow);
}

#[test]
fn sigkill_with_the_collector_up_loses_nothing() {
    an_exporter_stopped_with(rustix::process::Signal::KILL, Collector::Up);
}

#[test]
fn sigkill_with_the_collector_down_leaves_the_requests_to_the_next_exporter() {
    an_exporter_stopped_with(rustix::process::Signal::KILL, Collector::Down);
}

#[test]
fn sigkill_with_the_collector_slow_leaves_the_requests_to_the_next_exporter() {
    an_exporter_stopped_with(rustix::process::Signal::KILL, Collector::Slow);
}

/// Whether some TCP connection to local port `port` holds unread bytes
/// (`/proc/net/tcp`'s `rx_queue`): a post waiting in a stopped server's
/// socket.
fn unread_bytes_at(port: u16) -> bool {
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

/// An exporter killed while its post sits unanswered in Phoenix's socket:
/// Phoenix reads that post once it runs again, and the next exporter
/// sends the same requests again (they were never acknowledged). The
/// segment spans' ids are derived from the request, so Phoenix, which
/// keeps one span per id, ends with each span once.
#[test]
fn a_request_sent_twice_is_one_span_each_in_phoenix() {
    use rustix::process::Signal;
    let Some(bin) = phoenix() else { return };
    let dir = tempfile::tempdir().unwrap();
    let region = region(dir.path());
    let phoenix = start_phoenix(&bin, dir.path(), "127.0.0.1");
    let url = format!("http://{}", phoenix.addr);
    signal_group(&phoenix.proc, Signal::STOP);
    let envs = [
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "60000"),
    ];
    let (mut first, _) =
        start_exporter_logging_to(&region, &url, &dir.path().join("first.err"), &envs);
    let rec = Recorder::attach(&region).unwrap();
    let mut traces = Vec::new();
    for _ in 0..3 {
        let (tp, t, _) = fresh_traceparent();
        one_request(&rec, &tp);
        traces.push(t);
    }
    wait_for("the post waiting in Phoenix's socket", || {
        unread_bytes_at(phoenix.addr.port()).then_some(())
    });
    signal(&first, Signal::KILL);
    wait_exit(&mut first);
    signal_group(&phoenix.proc, Signal::CONT);
    let (mut second, _) =
        start_exporter_logging_to(&region, &url, &dir.path().join("second.err"), &envs);
    wait_for("the three requests acknowledged", || {
        (region_report(&region)["closed_acknowledged"] == 3).then_some(())
    });
    // A marker after the resend: once Phoenix shows it, it has taken in
    // both copies of the three.
    let (tp, marker, _) = fresh_traceparent();
    one_request(&rec, &tp);
    phoenix.wait_spans(&marker, 2);
    for t in &traces {
        let spans = phoenix.wait_spans(t, 2);
        let mut ids: Vec<String> = spans
            .iter()
            .map(|s| s["context"]["span_id"].as_str().unwrap_or("").to_owned())
            .collect();
        ids.sort();
        ids.dedup();
        assert_eq!((spans.len(), ids.len()), (2, 2), "trace {t}: {spans:#?}");
    }
    signal(&second, Signal::TERM);
    assert!(wait_exit(&mut second).success());
}

/// `OTEL_EXPORTER_OTLP_COMPRESSION=gzip`: rotel takes the gzip bodies.
#[test]
fn gzip_bodies_reach_rotel() {
    let Some(bin) = rotel() else { return };
    let dir = tempfile::tempdir().unwrap();
    let region = region(dir.path());
    let port = free_port("127.0.0.1");
    let rotel = start_rotel(&bin, dir.path(), port, 0);
    let (mut exporter, metrics) = start_exporter(
        &region,
        &format!("http://127.0.0.1:{port}"),
        dir.path(),
        &[
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    );
    let rec = Recorder::attach(&region).unwrap();
    let (tp, trace, _) = fresh_traceparent();
    one_request(&rec, &tp);
    wait_for("the gzip-sent trace in rotel", || {
        rotel.log().contains(&trace).then_some(())
    });
    assert_eq!(metric(metrics, "edgemark_otlp_export_failures_total"), 0.0);
    wait_exported(metrics, 2.0);
    assert_eq!(metric(metrics, "edgemark_otlp_exported_spans_total"), 2.0);
    signal(&exporter, rustix::process::Signal::TERM);
    assert!(wait_exit(&mut exporter).success());
}

// ---------------------------------------------------------------------------
// https: Phoenix over TLS, certificates made by `openssl` for the test.

/// `openssl ARGS` in `dir`, which must succeed.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The test's CAs and certificates, PEM files in one directory: `ca`
/// signed the server's (for `localhost` and 127.0.0.1) and the client's;
/// `other-ca` signed nothing here.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    /// Made in `dir`, if `openssl` is there.
    fn make(dir: &Path) -> Option<Pki> {
        if Command::new("openssl").arg("version").output().is_err() {
            missing("the openssl command is not installed (Debian: openssl)");
            return None;
        }
        let dir = dir.join("pki");
        std::fs::create_dir_all(&dir).unwrap();
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        for ca in ["ca", "other-ca"] {
            let (key, pem, subj) = (
                format!("{ca}.key"),
                format!("{ca}.pem"),
                format!("/CN=edgemark test {ca}"),
            );
            let mut args = vec!["req", "-x509"];
            args.extend(ec);
            args.extend(["-keyout", &key, "-out", &pem, "-days", "2", "-subj", &subj]);
            args.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
            args.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
            openssl(&dir, &args);
        }
        for (name, ext) in [
            (
                "server",
                "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
            ),
            ("client", "extendedKeyUsage=clientAuth\n"),
        ] {
            let (key, csr, pem, cnf, subj) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.pem"),
                format!("{name}.cnf"),
                format!("/CN=edgemark test {name}"),
            );
            std::fs::write(
                dir.join(&cnf),
                format!("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n{ext}"),
            )
            .unwrap();
            let mut args = vec!["req"];
            args.extend(ec);
            args.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
            openssl(&dir, &args);
            openssl(
                &dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-out",
                    &pem,
                    "-days",
                    "2",
                    "-extfile",
                    &cnf,
                ],
            );
        }
        Some(Pki { dir })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `name`'s path, for a variable.
    fn var(&self, name: &str) -> String {
        self.path(name).to_str().unwrap().to_owned()
    }

    /// A client that trusts `ca` only, offering the client certificate if
    /// `client`.
    fn reader(&self, client: bool) -> Arc<rustls::ClientConfig> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(self.path("ca.pem")).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        // ring, as the exporter's (see otlp/src/config.rs).
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let b = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        Arc::new(if client {
            let chain = CertificateDer::pem_file_iter(self.path("client.pem"))
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_file(self.path("client.key")).unwrap();
            b.with_client_auth_cert(chain, key).unwrap()
        } else {
            b.with_no_client_auth()
        })
    }
}

/// Phoenix serving https with the server certificate of `pki`, asking
/// for a client certificate signed by its CA if `verify_client`.
fn start_tls_phoenix(bin: &Path, dir: &Path, pki: &Pki, verify_client: bool) -> Phoenix {
    let (cert, key, ca) = (
        pki.path("server.pem"),
        pki.path("server.key"),
        pki.path("ca.pem"),
    );
    let mut envs: Vec<(&str, &Path)> = vec![
        ("PHOENIX_TLS_ENABLED_FOR_HTTP", Path::new("true")),
        ("PHOENIX_TLS_CERT_FILE", &cert),
        ("PHOENIX_TLS_KEY_FILE", &key),
    ];
    if verify_client {
        envs.push(("PHOENIX_TLS_CA_FILE", &ca));
        envs.push(("PHOENIX_TLS_VERIFY_CLIENT", Path::new("true")));
    }
    start_phoenix_with(
        bin,
        dir,
        "127.0.0.1",
        &envs,
        Some(pki.reader(verify_client)),
    )
}

/// A region in a directory of its own under `dir`.
fn region_in(dir: &Path, name: &str) -> PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    region(&d)
}

/// Checks that the exporter at `metrics`, which logs to `log`, fails its
/// posts in TLS and goes on: the failure counted, said once with `said`,
/// the exporter still running, nothing of `trace_id` in Phoenix.
fn refused_in_tls(
    exporter: &mut Proc,
    metrics: SocketAddr,
    log: &Path,
    said: &[&str],
    phoenix: &Phoenix,
    trace_id: &str,
) {
    wait_for("a TLS failure counted in /metrics", || {
        (metric(metrics, "edgemark_otlp_tls_failures_total") > 0.0).then_some(())
    });
    // One scrape: the exporter keeps retrying, and counts each failure in
    // both counters at once.
    let body = scrape(metrics);
    let failures = value_in(&body, "edgemark_otlp_export_failures_total");
    assert!(failures >= value_in(&body, "edgemark_otlp_tls_failures_total"));
    assert_eq!(metric(metrics, "edgemark_otlp_collector_up"), 0.0);
    assert_eq!(metric(metrics, "edgemark_otlp_exported_spans_total"), 0.0);
    let text = wait_for("the TLS failure in the exporter's log", || {
        let t = std::fs::read_to_string(log).unwrap_or_default();
        said.iter().all(|s| t.contains(s)).then_some(t)
    });
    eprintln!("the exporter's log:\n{text}");
    assert!(!text.contains("panicked"), "{text}");
    // Said once, not at each retry.
    assert_eq!(text.matches("retrying with backoff").count(), 1, "{text}");
    // It keeps trying: more failures come, and it still serves /metrics.
    wait_for("another failed try", || {
        (metric(metrics, "edgemark_otlp_export_failures_total") > failures).then_some(())
    });
    assert!(exporter.running(), "the exporter stopped:\n{text}");
    assert!(phoenix.spans(trace_id).is_empty());
}

#[test]
fn https_spans_reach_phoenix_through_the_ca_given() {
    let Some(bin) = phoenix() else { return };
    let dir = tempfile::tempdir().unwrap();
    let Some(pki) = Pki::make(dir.path()) else {
        return;
    };
    let phoenix = start_tls_phoenix(&bin, dir.path(), &pki, false);
    let region = region(dir.path());
    // By name: SNI and the certificate's DNS name.
    let url = format!("https://localhost:{}", phoenix.addr.port());
    let (_exporter, metrics) = start_exporter(
        &region,
        &url,
        dir.path(),
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", &pki.var("ca.pem")),
        ],
    );
    let rec = Recorder::attach(&region).unwrap();
    let (tp, trace_id, parent) = fresh_traceparent();
    one_request(&rec, &tp);
    let spans = phoenix.wait_spans(&trace_id, 2);
    assert_eq!(spans.len(), 2);
    let req = named(&spans, "edgemark request");
    assert_eq!(req.len(), 1);
    assert_eq!(req[0]["parent_id"], parent.as_str());
    assert_eq!(named(&spans, "edgemark 0->1").len(), 1);
    wait_exported(metrics, 2.0);
    assert_eq!(metric(metrics, "edgemark_otlp_tls_failures_total"), 0.0);
    // Plain http to the same port is not answered as OTLP: the spans came
    // over TLS.
    assert!(get(phoenix.addr, "/healthz").is_none_or(|(s, _)| s != 200));
}

#[test]
fn mutual_tls_delivers_with_the_client_certificate_and_without_it_fails_counted() {
    let Some(bin) = phoenix() else { return };
    let dir = tempfile::tempdir().unwrap();
    let Some(pki) = Pki::make(dir.path()) else {
        return;
    };
    let phoenix = start_tls_phoenix(&bin, dir.path(), &pki, true);
    // By address: the certificate's IP address SAN.
    let url = format!("https://{}", phoenix.addr);

    // With the client's key and certificate (the traces forms).
    let with = region_in(dir.path(), "with");
    let (_exporter, metrics) = start_exporter_logging_to(
        &with,
        &url,
        &dir.path().join("with.err"),
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", &pki.var("ca.pem")),
            (
                "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
                &pki.var("client.key"),
            ),
            (
                "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
                &pki.var("client.pem"),
            ),
        ],
    );
    let rec = Recorder::attach(&with).unwrap();
    let (tp, trace_id, _) = fresh_traceparent();
    one_request(&rec, &tp);
    let spans = phoenix.wait_spans(&trace_id, 2);
    assert_eq!(spans.len(), 2);
    assert_eq!(metric(metrics, "edgemark_otlp_tls_failures_total"), 0.0);

    // Without: Phoenix refuses the connection in TLS.
    let without = region_in(dir.path(), "without");
    let log = dir.path().join("without.err");
    let (mut exporter, metrics) = start_exporter_logging_to(
        &without,
        &url,
        &log,
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", &pki.var("ca.pem")),
        ],
    );
    let rec = Recorder::attach(&without).unwrap();
    let (tp, trace_id, _) = fresh_traceparent();
    one_request(&rec, &tp);
    refused_in_tls(
        &mut exporter,
        metrics,
        &log,
        &[
            "the collector asked for a client certificate and none is set",
            "retrying with backoff",
        ],
        &phoenix,
        &trace_id,
    );
}

#[test]
fn a_collector_whose_certificate_is_not_trusted_gets_nothing_and_the_failure_is_counted() {
    let Some(bin) = phoenix() else { return };
    let dir = tempfile::tempdir().unwrap();
    let Some(pki) = Pki::make(dir.path()) else {
        return;
    };
    let phoenix = start_tls_phoenix(&bin, dir.path(), &pki, false);
    let url = format!("https://{}", phoenix.addr);
    // Trusting another CA, then the system's roots (the default): neither
    // signed Phoenix's certificate.
    for (name, trust) in [
        ("other-ca", Some(pki.var("other-ca.pem"))),
        ("system", None),
    ] {
        let region = region_in(dir.path(), name);
        let log = dir.path().join(format!("{name}.err"));
        let mut envs = vec![("OTEL_BSP_SCHEDULE_DELAY", "100")];
        if let Some(ca) = &trust {
            envs.push(("OTEL_EXPORTER_OTLP_CERTIFICATE", ca));
        }
        let (mut exporter, metrics) = start_exporter_logging_to(&region, &url, &log, &envs);
        let rec = Recorder::attach(&region).unwrap();
        let (tp, trace_id, _) = fresh_traceparent();
        one_request(&rec, &tp);
        refused_in_tls(
            &mut exporter,
            metrics,
            &log,
            &[
                "the TLS handshake failed: invalid peer certificate: UnknownIssuer",
                "retrying with backoff",
            ],
            &phoenix,
            &trace_id,
        );
    }
}
