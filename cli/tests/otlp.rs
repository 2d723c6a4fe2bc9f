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
//! saved name, on failure too. How each part is started, stopped and read
//! back is in `otel/`, which the tests share.

mod otel;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use edgemark::{Edge, Event, Mark, Recorder, TraceContext};
use otel::hosts::{Net, ip};
use otel::pki::tls_phoenix;
use otel::spans::{attr, deltas_within_one_domain, event_times, named, tree};
use otel::{
    EDGEMARK, Exporter, Phoenix, Proc, closed_requests, free_port, get, missing, one_request,
    phoenix, region, region_in, region_report, rotel, run, start_exporter,
    start_exporter_logging_to, start_phoenix, start_rotel, unread_bytes_at, value_in, wait_for,
};
use rustix::process::Signal;
use serde_json::Value;

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
    let exporter = start_exporter(
        &region,
        &url,
        dir.path(),
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_SERVICE_NAME", "edgemark-test"),
        ],
    );
    let rec = Recorder::attach(&region).unwrap();
    let (trace_id, parent) = one_request(&rec);

    let log = rotel.wait_log("the trace in rotel's debug log", |log| {
        log.contains("edgemark 0->1")
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
    exporter.wait_exported(2.0);
    assert_eq!(exporter.metric("edgemark_otlp_ring_lost_total"), 0.0);
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
    let mut exporter = start_exporter(
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
    let (before, _) = one_request(&rec);
    rotel.wait_log("the first trace in rotel", |log| log.contains(&before));

    // The collector goes away. Requests keep closing (no close waits for
    // the exporter), more than its queue holds.
    rotel.proc.stop();
    let mut down = Vec::new();
    for _ in 0..60 {
        down.push(one_request(&rec).0);
    }
    exporter.wait_metric(
        "a failed post",
        "edgemark_otlp_export_failures_total",
        |v| v > 0.0,
    );
    assert!(exporter.metric("edgemark_otlp_export_failures_total") > 0.0);
    assert_eq!(exporter.metric("edgemark_otlp_collector_up"), 0.0);
    assert!(
        exporter.proc.running(),
        "the exporter runs on while the collector is down"
    );

    // Back on the same port: what closes after the restart arrives.
    let rotel = start_rotel(&bin, dir.path(), port, 1);
    let (after, _) = one_request(&rec);
    rotel.wait_log("the trace closed after the restart in rotel", |log| {
        log.contains(&after)
    });
    // And every one closed while it was down: the queue's, then the
    // ring's.
    rotel.wait_log("the 60 traces closed while rotel was down", |log| {
        down.iter().all(|t| log.contains(t.as_str()))
    });
    let ring = region_report(&region);
    assert_eq!(ring["closed_lost"], 0, "{ring}");
    assert_eq!(ring["closed_given_up"]["queue_full"], 0, "{ring}");
    exporter.wait_metric(
        "the collector counted up again",
        "edgemark_otlp_collector_up",
        |v| v == 1.0,
    );
    assert_eq!(exporter.metric("edgemark_otlp_ring_lost_total"), 0.0);
}

// ---------------------------------------------------------------------------
// Phoenix, one host.

#[test]
fn phoenix_returns_the_request_span_and_its_edge_spans() {
    let Some(bin) = phoenix() else { return };
    let dir = tempfile::tempdir().unwrap();
    let phoenix = start_phoenix(&bin, dir.path(), "127.0.0.1");
    let region = region(dir.path());
    let url = phoenix.url();
    let exporter = start_exporter(
        &region,
        &url,
        dir.path(),
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    );
    let rec = Recorder::attach(&region).unwrap();
    let (trace_id, parent) = one_request(&rec);
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
    exporter.wait_exported(2.0);
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
    let url = phoenix.url();

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
    let a_out = a.wait_with_output();
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

// ---------------------------------------------------------------------------
// At least once: exporters stopped or killed with requests taken and not
// yet acknowledged, while the collector is up, down or paused (slow: its
// socket takes the post, and no answer comes).

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
fn an_exporter_stopped_with(sig: Signal, collector: Collector) {
    let Some(bin) = rotel() else { return };
    let dir = tempfile::tempdir().unwrap();
    let region = region(dir.path());
    let port = free_port("127.0.0.1");
    let url = format!("http://127.0.0.1:{port}");
    let mut rotel = (collector != Collector::Down).then(|| start_rotel(&bin, dir.path(), port, 0));
    if collector == Collector::Slow {
        rotel.as_ref().unwrap().proc.signal(Signal::STOP);
    }
    let envs = [
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "8"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "60000"),
    ];
    let first_err = dir.path().join("first.err");
    let mut first = start_exporter_logging_to(&region, &url, &first_err, &envs);
    let rec = Recorder::attach(&region).unwrap();
    let mut traces = Vec::new();
    for _ in 0..20 {
        traces.push(one_request(&rec).0);
    }
    first.wait_metric(
        "the first exporter taking all 20",
        "edgemark_otlp_requests_total",
        |v| v == 20.0,
    );
    first.proc.signal(sig);
    let status = first.proc.wait_exit();
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
        Collector::Slow => rotel.as_ref().unwrap().proc.signal(Signal::CONT),
        Collector::Up => {}
    }
    let rotel = rotel.unwrap();
    for _ in 0..5 {
        traces.push(one_request(&rec).0);
    }
    let second_err = dir.path().join("second.err");
    let mut second = start_exporter_logging_to(&region, &url, &second_err, &envs);
    rotel.wait_log("every trace in rotel", |log| {
        traces.iter().all(|t| log.contains(t.as_str()))
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
    second.terminate();
}

#[test]
fn sigterm_with_the_collector_up_loses_nothing() {
    an_exporter_stopped_with(Signal::TERM, Collector::Up);
}

#[test]
fn sigterm_with_the_collector_down_leaves_the_requests_to_the_next_exporter() {
    an_exporter_stopped_with(Signal::TERM, Collector::Down);
}

#[test]
fn sigterm_with_the_collector_slow_leaves_the_requests_to_the_next_exporter() {
    an_exporter_stopped_with(Signal::TERM, Collector::Slow);
}

#[test]
fn sigint_with_the_collector_up_loses_nothing() {
    an_exporter_stopped_with(Signal::INT, Collector::Up);
}

#[test]
fn sigint_with_the_collector_down_leaves_the_requests_to_the_next_exporter() {
    an_exporter_stopped_with(Signal::INT, Collector::Down);
}

#[test]
fn sigint_with_the_collector_slow_leaves_the_requests_to_the_next_exporter() {
    an_exporter_stopped_with(Signal::INT, Collector::Slow);
}

#[test]
fn sigkill_with_the_collector_up_loses_nothing() {
    an_exporter_stopped_with(Signal::KILL, Collector::Up);
}

#[test]
fn sigkill_with_the_collector_down_leaves_the_requests_to_the_next_exporter() {
    an_exporter_stopped_with(Signal::KILL, Collector::Down);
}

#[test]
fn sigkill_with_the_collector_slow_leaves_the_requests_to_the_next_exporter() {
    an_exporter_stopped_with(Signal::KILL, Collector::Slow);
}

/// An exporter killed while its post sits unanswered in Phoenix's socket:
/// Phoenix reads that post once it runs again, and the next exporter
/// sends the same requests again (they were never acknowledged). The
/// segment spans' ids are derived from the request, so Phoenix, which
/// keeps one span per id, ends with each span once.
#[test]
fn a_request_sent_twice_is_one_span_each_in_phoenix() {
    let Some(bin) = phoenix() else { return };
    let dir = tempfile::tempdir().unwrap();
    let region = region(dir.path());
    let phoenix = start_phoenix(&bin, dir.path(), "127.0.0.1");
    let url = phoenix.url();
    phoenix.proc.signal_group(Signal::STOP);
    let envs = [
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "60000"),
    ];
    let mut first = start_exporter_logging_to(&region, &url, &dir.path().join("first.err"), &envs);
    let rec = Recorder::attach(&region).unwrap();
    let mut traces = Vec::new();
    for _ in 0..3 {
        traces.push(one_request(&rec).0);
    }
    wait_for("the post waiting in Phoenix's socket", || {
        unread_bytes_at(phoenix.addr.port()).then_some(())
    });
    first.proc.signal(Signal::KILL);
    first.proc.wait_exit();
    phoenix.proc.signal_group(Signal::CONT);
    let mut second =
        start_exporter_logging_to(&region, &url, &dir.path().join("second.err"), &envs);
    wait_for("the three requests acknowledged", || {
        (region_report(&region)["closed_acknowledged"] == 3).then_some(())
    });
    // A marker after the resend: once Phoenix shows it, it has taken in
    // both copies of the three.
    let (marker, _) = one_request(&rec);
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
    second.terminate();
}

/// `OTEL_EXPORTER_OTLP_COMPRESSION=gzip`: rotel takes the gzip bodies.
#[test]
fn gzip_bodies_reach_rotel() {
    let Some(bin) = rotel() else { return };
    let dir = tempfile::tempdir().unwrap();
    let region = region(dir.path());
    let port = free_port("127.0.0.1");
    let rotel = start_rotel(&bin, dir.path(), port, 0);
    let mut exporter = start_exporter(
        &region,
        &format!("http://127.0.0.1:{port}"),
        dir.path(),
        &[
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    );
    let rec = Recorder::attach(&region).unwrap();
    let (trace, _) = one_request(&rec);
    rotel.wait_log("the gzip-sent trace in rotel", |log| log.contains(&trace));
    assert_eq!(exporter.metric("edgemark_otlp_export_failures_total"), 0.0);
    exporter.wait_exported(2.0);
    assert_eq!(exporter.metric("edgemark_otlp_exported_spans_total"), 2.0);
    exporter.terminate();
}

// ---------------------------------------------------------------------------
// https: Phoenix over TLS, certificates made by `openssl` for the test.

/// Checks that `exporter`, which logs to `log`, fails its posts in TLS and
/// goes on: the failure counted, said once with `said`, the exporter still
/// running, nothing of `trace_id` in Phoenix.
fn refused_in_tls(
    exporter: &mut Exporter,
    log: &Path,
    said: &[&str],
    phoenix: &Phoenix,
    trace_id: &str,
) {
    exporter.wait_metric(
        "a TLS failure counted in /metrics",
        "edgemark_otlp_tls_failures_total",
        |v| v > 0.0,
    );
    // One scrape: the exporter keeps retrying, and counts each failure in
    // both counters at once.
    let body = exporter.scrape();
    let failures = value_in(&body, "edgemark_otlp_export_failures_total");
    assert!(failures >= value_in(&body, "edgemark_otlp_tls_failures_total"));
    assert_eq!(exporter.metric("edgemark_otlp_collector_up"), 0.0);
    assert_eq!(exporter.metric("edgemark_otlp_exported_spans_total"), 0.0);
    let text = wait_for("the TLS failure in the exporter's log", || {
        let t = std::fs::read_to_string(log).unwrap_or_default();
        said.iter().all(|s| t.contains(s)).then_some(t)
    });
    eprintln!("the exporter's log:\n{text}");
    assert!(!text.contains("panicked"), "{text}");
    // Said once, not at each retry.
    assert_eq!(text.matches("retrying with backoff").count(), 1, "{text}");
    // It keeps trying: more failures come, and it still serves /metrics.
    exporter.wait_metric(
        "another failed try",
        "edgemark_otlp_export_failures_total",
        |v| v > failures,
    );
    assert!(exporter.proc.running(), "the exporter stopped:\n{text}");
    assert!(phoenix.spans(trace_id).is_empty());
}

#[test]
fn https_spans_reach_phoenix_through_the_ca_given() {
    let Some((dir, pki, phoenix)) = tls_phoenix(false) else {
        return;
    };
    let region = region(dir.path());
    // By name: SNI and the certificate's DNS name.
    let url = format!("https://localhost:{}", phoenix.addr.port());
    let exporter = start_exporter(
        &region,
        &url,
        dir.path(),
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", &pki.var("ca.pem")),
        ],
    );
    let rec = Recorder::attach(&region).unwrap();
    let (trace_id, parent) = one_request(&rec);
    let spans = phoenix.wait_spans(&trace_id, 2);
    assert_eq!(spans.len(), 2);
    let req = named(&spans, "edgemark request");
    assert_eq!(req.len(), 1);
    assert_eq!(req[0]["parent_id"], parent.as_str());
    assert_eq!(named(&spans, "edgemark 0->1").len(), 1);
    exporter.wait_exported(2.0);
    assert_eq!(exporter.metric("edgemark_otlp_tls_failures_total"), 0.0);
    // Plain http to the same port is not answered as OTLP: the spans came
    // over TLS.
    assert!(get(phoenix.addr, "/healthz").is_none_or(|(s, _)| s != 200));
}

#[test]
fn mutual_tls_delivers_with_the_client_certificate_and_without_it_fails_counted() {
    let Some((dir, pki, phoenix)) = tls_phoenix(true) else {
        return;
    };
    // By address: the certificate's IP address SAN.
    let url = format!("https://{}", phoenix.addr);

    // With the client's key and certificate (the traces forms).
    let with = region_in(dir.path(), "with");
    let with_exporter = start_exporter_logging_to(
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
    let (trace_id, _) = one_request(&rec);
    let spans = phoenix.wait_spans(&trace_id, 2);
    assert_eq!(spans.len(), 2);
    assert_eq!(
        with_exporter.metric("edgemark_otlp_tls_failures_total"),
        0.0
    );

    // Without: Phoenix refuses the connection in TLS.
    let without = region_in(dir.path(), "without");
    let log = dir.path().join("without.err");
    let mut exporter = start_exporter_logging_to(
        &without,
        &url,
        &log,
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", &pki.var("ca.pem")),
        ],
    );
    let rec = Recorder::attach(&without).unwrap();
    let (trace_id, _) = one_request(&rec);
    refused_in_tls(
        &mut exporter,
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
    let Some((dir, pki, phoenix)) = tls_phoenix(false) else {
        return;
    };
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
        let mut exporter = start_exporter_logging_to(&region, &url, &log, &envs);
        let rec = Recorder::attach(&region).unwrap();
        let (trace_id, _) = one_request(&rec);
        refused_in_tls(
            &mut exporter,
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

// ---------------------------------------------------------------------------
// `export --dir`: every region of a directory, as they come and go.

/// `edgemark export --dir DIR --listen 127.0.0.1:0`, with `--otlp URL`
/// when given, its standard error written to `err`.
fn start_dir_exporter(
    dir: &Path,
    url: Option<&str>,
    err: &Path,
    envs: &[(&str, &str)],
) -> Exporter {
    let dir = dir.to_str().unwrap();
    let mut args = vec!["export", "--dir", dir, "--listen", "127.0.0.1:0"];
    if let Some(u) = url {
        args.extend(["--otlp", u]);
    }
    start_exporter_with(&args, err, envs)
}

/// `edgemark ARGS` (an `export` that serves `/metrics`), its standard
/// error written to `err`.
fn start_exporter_with(args: &[&str], err: &Path, envs: &[(&str, &str)]) -> Exporter {
    let err = std::fs::File::create(err).unwrap();
    let mut cmd = Command::new(EDGEMARK);
    cmd.args(args);
    let mut proc = Proc::spawn(
        "edgemark export --dir",
        cmd.envs(envs.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err)),
    );
    let mut out = BufReader::new(proc.child.stdout.take().unwrap());
    let metrics = loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "the exporter ended");
        if let Some(a) = line
            .trim()
            .strip_prefix("serving http://")
            .and_then(|l| l.strip_suffix("/metrics"))
        {
            break a.parse().unwrap();
        }
    };
    // Its later lines (exporters started) are read and dropped, so that a
    // full pipe never holds it.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    Exporter { proc, metrics }
}

/// The value of `name{region="REGION"...}` in a scrape, if present.
fn region_sample(body: &str, name: &str, region: &str) -> Option<f64> {
    let prefix = format!("{name}{{region=\"{region}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str())?.parse().ok())
}

#[test]
fn export_dir_serves_each_region_as_it_comes_and_lets_go_of_removed_ones() {
    let dir = tempfile::tempdir().unwrap();
    let regions = dir.path().join("shm");
    std::fs::create_dir(&regions).unwrap();
    let a = regions.join("a.region");
    let rec_a = Recorder::builder()
        .edge(0, 1)
        .closed_entries(16)
        .create(&a)
        .unwrap();
    one_request(&rec_a);
    std::fs::write(regions.join("notes.txt"), b"not followed").unwrap();
    let err = dir.path().join("export.err");
    let mut exporter = start_dir_exporter(&regions, None, &err, &[]);
    let body = exporter.scrape();
    assert_eq!(
        region_sample(&body, "edgemark_closed_requests_total", "a.region"),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        region_sample(&body, "edgemark_region_ok", "a.region"),
        Some(1.0),
        "{body}"
    );
    assert!(!body.contains("notes.txt"), "{body}");

    // A region that appears later, and a file that is not one.
    let b = regions.join("b.region");
    let rec_b = Recorder::builder()
        .edge(0, 1)
        .closed_entries(16)
        .create(&b)
        .unwrap();
    one_request(&rec_b);
    one_request(&rec_b);
    std::fs::write(regions.join("c.region"), b"not a region").unwrap();
    let body = wait_for("b.region served", || {
        let body = exporter.scrape();
        (region_sample(&body, "edgemark_closed_requests_total", "b.region") == Some(2.0))
            .then_some(body)
    });
    assert_eq!(
        region_sample(&body, "edgemark_region_ok", "c.region"),
        Some(0.0),
        "{body}"
    );
    assert_eq!(
        region_sample(&body, "edgemark_closed_requests_total", "a.region"),
        Some(1.0),
        "{body}"
    );
    // Each family described once, whatever the number of regions.
    for family in [
        "edgemark_open_requests gauge",
        "edgemark_region_ok gauge",
        "edgemark_boundary_elapsed_seconds histogram",
    ] {
        assert_eq!(
            body.matches(&format!("# TYPE {family}\n")).count(),
            1,
            "{family} in {body}"
        );
    }
    let promtool = ["/usr/bin/promtool", "/usr/local/bin/promtool"]
        .into_iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.exists());
    if let Some(promtool) = promtool {
        let mut check = Command::new(promtool)
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        check
            .stdin
            .take()
            .unwrap()
            .write_all(body.as_bytes())
            .unwrap();
        let out = check.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    } else {
        missing("promtool");
    }

    // Removed: let go, no longer served.
    drop(rec_a);
    std::fs::remove_file(&a).unwrap();
    wait_for("a.region let go", || {
        let body = exporter.scrape();
        (!body.contains("region=\"a.region\"")).then_some(())
    });
    // Found again under the same name: served again, from the new file.
    let rec_a = Recorder::builder()
        .edge(0, 1)
        .closed_entries(16)
        .create(&a)
        .unwrap();
    for _ in 0..3 {
        one_request(&rec_a);
    }
    wait_for("the new a.region served", || {
        let body = exporter.scrape();
        (region_sample(&body, "edgemark_closed_requests_total", "a.region") == Some(3.0))
            .then_some(())
    });
    exporter.proc.stop();
    let said = std::fs::read_to_string(&err).unwrap();
    for line in [
        "a.region: found; following it",
        "b.region: found; following it",
        "a.region: removed; let go",
        "c.region: the region file is 12 bytes",
    ] {
        assert!(said.contains(line), "{line} in {said}");
    }
    assert_eq!(
        said.matches("c.region: the region file is 12 bytes")
            .count(),
        1,
        "said once: {said}"
    );
}

#[test]
fn export_dir_sends_every_region_and_what_a_killed_exporter_left() {
    let Some(bin) = rotel() else { return };
    let dir = tempfile::tempdir().unwrap();
    let regions = dir.path().join("shm");
    std::fs::create_dir(&regions).unwrap();
    let a = regions.join("a.region");
    let rec_a = Recorder::builder()
        .edge(0, 1)
        .closed_entries(64)
        .create(&a)
        .unwrap();
    let port = free_port("127.0.0.1");
    let url = format!("http://127.0.0.1:{port}");
    let envs = [
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "2000"),
    ];
    // A server's own exporter took ten requests while the collector was
    // down, and was killed before it sent them.
    let mut first = start_exporter_logging_to(&a, &url, &dir.path().join("first.err"), &envs);
    let mut traces = Vec::new();
    for _ in 0..10 {
        traces.push(one_request(&rec_a).0);
    }
    first.wait_metric(
        "the first exporter taking all ten",
        "edgemark_otlp_requests_total",
        |v| v == 10.0,
    );
    first.proc.signal(Signal::KILL);
    first.proc.wait_exit();
    assert_eq!(region_report(&a)["closed_unacknowledged"], 10);

    let rotel = start_rotel(&bin, dir.path(), port, 0);
    let err = dir.path().join("dir.err");
    let mut exporter = start_dir_exporter(&regions, Some(&url), &err, &envs);
    // A region that appears after the exporter started.
    let b = regions.join("b.region");
    let rec_b = Recorder::builder()
        .edge(0, 1)
        .closed_entries(64)
        .create(&b)
        .unwrap();
    for _ in 0..3 {
        traces.push(one_request(&rec_b).0);
    }
    traces.push(one_request(&rec_a).0);
    rotel.wait_log("every trace of both regions in rotel", |log| {
        traces.iter().all(|t| log.contains(t.as_str()))
    });
    wait_for("every request acknowledged in its region", || {
        (region_report(&a)["closed_acknowledged"] == 11
            && region_report(&b)["closed_acknowledged"] == 3)
            .then_some(())
    });
    for r in [&a, &b] {
        let ring = region_report(r);
        assert_eq!(
            (&ring["closed_lost"], &ring["closed_unacknowledged"]),
            (&Value::from(0), &Value::from(0)),
            "{ring}"
        );
    }
    // Removed: its exporter sends what it holds and is let go.
    drop(rec_b);
    std::fs::remove_file(&b).unwrap();
    wait_for("b.region let go", || {
        std::fs::read_to_string(&err)
            .unwrap()
            .contains("b.region: removed; let go")
            .then_some(())
    });
    exporter.terminate();
    let said = std::fs::read_to_string(&err).unwrap();
    assert!(
        said.contains("10 closed requests that an exporter before this one took and did not send"),
        "{said}"
    );
    assert!(said.contains("export stopped by SIGTERM"), "{said}");
}

#[test]
fn export_dir_refuses_what_it_cannot_follow() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, b"").unwrap();
    for (args, says) in [
        (vec!["--dir", file.to_str().unwrap()], "is not a directory"),
        (
            vec!["--dir", "/nonexistent-edgemark-dir"],
            "cannot read /nonexistent-edgemark-dir",
        ),
        (
            vec!["--dir", dir.path().to_str().unwrap(), "--match", "a/b"],
            "--match takes a file name pattern",
        ),
        (
            vec!["--dir", dir.path().to_str().unwrap(), "--otlp", "not a url"],
            "not a url",
        ),
        (
            vec![
                dir.path().join("r.region").to_str().unwrap(),
                "--dir",
                dir.path().to_str().unwrap(),
            ],
            "cannot be used with",
        ),
        (vec!["--match", "*.region"], "--dir"),
    ] {
        let out = Command::new(EDGEMARK)
            .arg("export")
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.contains(says), "{args:?}: {says} in {e}");
    }
}

/// The flow-style list after `key: ` on the line of `manifest` that runs
/// `export` (the manifests write `command` and `args` as JSON arrays,
/// which YAML reads the same).
fn manifest_list(manifest: &str, key: &str) -> Vec<String> {
    let prefix = format!("{key}: ");
    let lines: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix(prefix.as_str()))
        .filter(|l| l.contains("export"))
        .collect();
    assert_eq!(lines.len(), 1, "one edgemark {key} line in\n{manifest}");
    serde_json::from_str(lines[0]).unwrap()
}

#[test]
fn the_kubernetes_manifests_commands_run() {
    let Some(bin) = rotel() else { return };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes");
    for file in ["sidecar.yaml", "node-exporter.yaml"] {
        let manifest = std::fs::read_to_string(root.join(file)).unwrap();
        let args = manifest_list(&manifest, "args");
        assert!(
            manifest.contains("command: [\"edgemark\"]"),
            "{file} runs the edgemark command"
        );
        assert!(
            manifest.contains("- name: OTEL_EXPORTER_OTLP_ENDPOINT"),
            "{file} names the collector the standard way"
        );
        let dir = tempfile::tempdir().unwrap();
        let shm = dir.path().join("shm");
        std::fs::create_dir(&shm).unwrap();
        // A server's region, made before the exporter starts, and one made
        // after (a restart's new name).
        let first = shm.join("edgemark-vllm-omni-1-0123456789abcdef.region");
        let rec = Recorder::builder()
            .edge(0, 1)
            .closed_entries(64)
            .create(&first)
            .unwrap();
        let mut traces = vec![one_request(&rec).0];
        let port = free_port("127.0.0.1");
        let url = format!("http://127.0.0.1:{port}");
        let rotel = start_rotel(&bin, dir.path(), port, 0);
        // The manifest's arguments, with the test's directory and address
        // in place of the pod's.
        let shm_s = shm.to_str().unwrap();
        let args: Vec<&str> = args
            .iter()
            .map(|a| match a.as_str() {
                "/dev/shm" => shm_s,
                "0.0.0.0:9464" => "127.0.0.1:0",
                other => other,
            })
            .collect();
        assert_eq!(args[..3], ["export", "--dir", shm_s], "{file}");
        let mut exporter = start_exporter_with(
            &args,
            &dir.path().join("export.err"),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str()),
                ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            ],
        );
        let second = shm.join("edgemark-vllm-omni-2-fedcba9876543210.region");
        let rec2 = Recorder::builder()
            .edge(0, 1)
            .closed_entries(64)
            .create(&second)
            .unwrap();
        traces.push(one_request(&rec2).0);
        traces.push(one_request(&rec).0);
        rotel.wait_log(&format!("{file}: every trace in rotel"), |log| {
            traces.iter().all(|t| log.contains(t.as_str()))
        });
        let name = |p: &Path| p.file_name().unwrap().to_str().unwrap().to_owned();
        let body = wait_for("both regions served", || {
            let body = exporter.scrape();
            (region_sample(&body, "edgemark_closed_requests_total", &name(&second)) == Some(1.0))
                .then_some(body)
        });
        assert_eq!(
            region_sample(&body, "edgemark_closed_requests_total", &name(&first)),
            Some(2.0),
            "{body}"
        );
        exporter.terminate();
    }
}
