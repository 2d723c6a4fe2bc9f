"""The vLLM-Omni plugin past one host: two simulated hosts (network
namespaces joined by a bridge, each with its own ``/dev/shm`` in a mount
namespace of its own, as in ``cli/tests/otlp.rs``), real vLLM-Omni stage
processes on each side on the async-chunk adapter path, one chunk crossing
over vLLM-Omni's own ``MooncakeTransferEngineConnector`` (CPU, TCP), one
``edgemark export --otlp`` per host, and Arize Phoenix joining the hosts'
spans by trace ID.

- Host A: the API-server side (a real ``ClientRequestState``: the plugin
  begins the request in host A's region and gives its traceparent) and
  stage 0's process (the producer: ``save_async``, its send thread,
  ``connector.put``).
- Host B: stage 1's process (the consumer: ``process_pending_chunks``, the
  receive thread, ``connector.get``, the commit; then the generation
  scheduler's ``_free_request``). Its scheduler ``Request`` is made from the
  engine request the API side built and encoded, carrying the traceparent in
  ``trace_headers``; host B's plugin finds no token for it in its own
  region and begins a host-local request under that context.

Needs vllm-omni with ``mooncake-transfer-engine-non-cuda`` (and Debian's
``libibverbs1``), Arize Phoenix in the environment named by
``EDGEMARK_OTEL_VENV``, the ``edgemark`` command (``EDGEMARK_CLI``, else the
workspace's ``target/debug/edgemark``), root, ``ip``, ``unshare`` and
``nsenter``. Where one is missing the module is skipped, unless
``EDGEMARK_REQUIRE_VLLM_OMNI=1`` or ``EDGEMARK_REQUIRE_OTEL=1`` (CI sets both),
which makes it fail. Every process started is stopped by its saved pid (its
process group), every namespace and link is deleted by its saved name, on
failure too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import _live
from _live import edgemark_bin, http_get, metric, missing, need_vllm_omni, phoenix_bin, phoenix_spans

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STAGE = os.path.join(HERE, "_vllm_omni_host_stage.py")
#: How long a step waits for something to happen before failing (a bound
#: on a wait, never a timing that is asserted).
PATIENCE_S = 600.0
RID = "req-hosts-1"
CODES = [11, 12, 13, 14, 15]


need_vllm_omni()
if importlib.util.find_spec("mooncake") is None:
    missing("mooncake-transfer-engine-non-cuda is not installed (vLLM-Omni's Mooncake connector needs it)")


PHOENIX = phoenix_bin()
EDGEMARK = edgemark_bin()
if os.geteuid() != 0:
    missing("the two-host test needs root (network and mount namespaces)")
for _tool in ("ip", "unshare", "nsenter"):
    if shutil.which(_tool) is None:
        missing(f"the two-host test needs `{_tool}` (iproute2, util-linux)")


# ---------------------------------------------------------------------------
# Processes, stopped by their saved pid.


class Proc:
    """A process in its own process group; its stdout read line by line by
    a thread; the whole group killed by :meth:`stop`."""

    def __init__(self, name: str, argv: list, log_dir: str, env: dict | None = None) -> None:
        self.name = name
        self.err_path = os.path.join(log_dir, f"{name}.err")
        with open(self.err_path, "wb") as err:
            self.p = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                text=True,
                process_group=0,
            )
        self.pid = self.p.pid
        self.lines: "queue.Queue[str | None]" = queue.Queue()
        self.tail: list = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.p.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def line(self, timeout: float = PATIENCE_S) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.name} said nothing for {timeout}s\n{self.log()}") from None
        if line is None:
            raise AssertionError(f"{self.name} ended (exit {self.p.wait()})\n{self.log()}")
        self.tail = (self.tail + [line])[-40:]
        return line

    def reply(self, timeout: float = PATIENCE_S) -> dict:
        """The next JSON reply (vLLM logs to stdout too)."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.line(max(0.1, deadline - time.monotonic()))
            if line.startswith('{"reply"'):
                return json.loads(line)

    def send(self, **cmd) -> None:
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()

    def ask(self, **cmd) -> dict:
        self.send(**cmd)
        return self.reply()

    def log(self) -> str:
        try:
            with open(self.err_path, errors="replace") as f:
                err = f.read()[-4000:]
        except OSError:
            err = ""
        return "stdout:\n" + "".join(self.tail) + "\nstderr:\n" + err

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.p.wait(timeout=30)


def free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def wait_for(what: str, check, timeout: float = PATIENCE_S):
    return _live.wait_for(what, check, timeout)


def ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    assert out.returncode == 0, f"ip {args}: {out.stderr}"


# ---------------------------------------------------------------------------
# Two hosts.


class Hosts:
    """A bridge, and per host a network namespace with a veth on the bridge
    and a process that holds a mount namespace with its own tmpfs
    ``/dev/shm``; everything made is removed by name and pid in
    :meth:`close`."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self.namespaces: list = []
        self.links: list = []
        self.procs: list = []
        ident = os.getpid() % 100_000
        self.subnet = f"10.214.{ident % 200 + 20}"
        self.bridge_ip = f"{self.subnet}.1"
        bridge = f"emhb{ident}"
        ip("link", "add", bridge, "type", "bridge")
        self.links.append(bridge)
        ip("addr", "add", f"{self.bridge_ip}/24", "dev", bridge)
        ip("link", "set", bridge, "up")
        self.addr = {}
        self.holder = {}
        for i, h in enumerate(("a", "b")):
            ns, veth = f"emh{ident}{h}", f"emhv{ident}{h}"
            ip("netns", "add", ns)
            self.namespaces.append(ns)
            ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self.links.append(veth)
            ip("link", "set", veth, "master", bridge, "up")
            self.addr[h] = f"{self.subnet}.{i + 2}"
            ip("-n", ns, "addr", "add", f"{self.addr[h]}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
            holder = self.spawn(
                f"host-{h}",
                ["ip", "netns", "exec", ns, "unshare", "--mount", "--propagation", "private", "sh", "-c",
                 "mount -t tmpfs -o size=256m tmpfs /dev/shm && echo up && exec sleep 100000"],
            )
            assert holder.line().strip() == "up", holder.log()
            self.holder[h] = holder

    def spawn(self, name: str, argv: list, env: dict | None = None) -> Proc:
        p = Proc(name, argv, self.log_dir, env)
        self.procs.append(p)
        return p

    def on(self, h: str, name: str, argv: list, env: dict | None = None) -> Proc:
        """Runs ``argv`` inside host ``h`` (its network and mount namespaces)."""
        return self.spawn(
            name, ["nsenter", "-t", str(self.holder[h].pid), "--mount", "--net", "--", *argv], env
        )

    def exists(self, h: str, path: str) -> bool:
        """Whether ``path`` exists in host ``h``'s mount namespace."""
        return os.path.exists(f"/proc/{self.holder[h].pid}/root{path}")

    def close(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        for n in self.namespaces:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
        for link in self.links:
            # A veth went with its namespace: nothing to say then.
            subprocess.run(["ip", "link", "del", link], capture_output=True)


class Phoenix:
    def __init__(self, hosts: Hosts, work: str) -> None:
        ip_ = hosts.bridge_ip
        self.port = free_port(ip_)
        env = {
            **os.environ,
            "PHOENIX_HOST": ip_,
            "PHOENIX_PORT": str(self.port),
            "PHOENIX_GRPC_PORT": str(free_port(ip_)),
            "PHOENIX_WORKING_DIR": os.path.join(work, "phoenix"),
            "PHOENIX_TELEMETRY_ENABLED": "false",
        }
        self.proc = hosts.spawn("phoenix", [PHOENIX, "serve"], env)
        self.url = f"http://{ip_}:{self.port}"

    def wait_up(self) -> None:
        wait_for("Phoenix to answer /healthz", lambda: (http_get(self.url + "/healthz") or (0,))[0] == 200)

    def spans(self, trace_id: str) -> list:
        return phoenix_spans(self.url, trace_id)


def region_of(h: str) -> str:
    return f"/dev/shm/edgemark-host-{h}.region"


def start_exporter(hosts: Hosts, h: str, url: str) -> str:
    """``edgemark export REGION --otlp URL`` inside host ``h``, with the
    host's service and host name; returns the URL of its ``/metrics`` (on
    the host's address, reachable over the bridge)."""
    env = {
        **os.environ,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_SERVICE_NAME": f"edgemark-host-{h}",
        "OTEL_RESOURCE_ATTRIBUTES": f"host.name=host-{h}",
    }
    argv = [EDGEMARK, "export", region_of(h), "--otlp", url, "--listen", f"{hosts.addr[h]}:0"]
    p = hosts.on(h, f"export-{h}", argv, env)
    said = p.line() + p.line()
    assert said.startswith("sending closed requests"), f"host {h}: {said!r}\n{p.log()}"
    metrics = [w for w in said.split() if w.startswith("http://") and w.endswith("/metrics")]
    assert metrics, f"host {h}: {said!r}"
    return metrics[0]


def tree(spans: list) -> str:
    """The span tree as text, children indented under parents."""
    ids = {s["context"]["span_id"] for s in spans}
    out: list = []

    def walk(parent, depth: int) -> None:
        for s in sorted((s for s in spans if s.get("parent_id") == parent), key=lambda s: s.get("start_time", "")):
            out.append(
                f"{'  ' * depth}{s['name']} [span {s['context']['span_id']}, region {attr(s, 'edgemark.region')}]"
                f" events: {', '.join(event_names(s))}"
            )
            walk(s["context"]["span_id"], depth + 1)

    for root in sorted({s.get("parent_id") for s in spans if s.get("parent_id") not in ids}, key=str):
        if root:
            out.append(f"(remote parent {root})")
        walk(root, 1 if root else 0)
    return "\n".join(out)


def stage_env(h: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEMARK_VLLM_OMNI")}
    env.update(
        EDGEMARK_VLLM_OMNI="1",
        EDGEMARK_VLLM_OMNI_REGION=region_of(h),
        EDGEMARK_VLLM_OMNI_SLOTS="256",
        PYTHONUNBUFFERED="1",
        # Neither host reaches a hub, nor needs to.
        HF_HUB_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    return env


def named(spans: list, name: str) -> list:
    return [s for s in spans if s.get("name") == name]


def event_names(span: dict) -> list:
    return [e.get("name") for e in span.get("events") or []]


def attr(span: dict, key: str):
    a = span.get("attributes") or {}
    if key in a:
        return a[key]
    v = a
    for part in key.split("."):
        if not isinstance(v, dict) or part not in v:
            return None
        v = v[part]
    return v


def joined(spans: list, a_span: str) -> bool:
    """Whether Phoenix holds both hosts' request spans and the edge spans
    with the stage events (emit, send complete on A; accept on B)."""
    reqs = named(spans, "edgemark request")
    events = {e for s in spans for e in event_names(s)}
    return (
        any(s["context"]["span_id"] == a_span for s in reqs)
        and any(s.get("parent_id") == a_span for s in reqs)
        and {"producer_first_nonempty_emit", "edge_first_send_complete", "consumer_first_accept"} <= events
    )


@pytest.fixture(scope="module")
def run():
    """The scenario, once: both hosts, one request across them; what each
    process answered and what Phoenix holds."""
    work = tempfile.mkdtemp(prefix="edgemark-hosts-")
    hosts = Hosts(work)
    out: dict = {"addr": dict(hosts.addr), "work": work}
    try:
        phoenix = Phoenix(hosts, work)
        py = sys.executable
        api = hosts.on("a", "api-a", [py, STAGE, "api"], stage_env("a"))
        # Both stages are given the deployment's base port; vLLM-Omni
        # resolves the edge's sender port from it on each side.
        producer = hosts.on("a", "stage0-a", [py, STAGE, "producer", hosts.addr["a"], "50100"], stage_env("a"))
        consumer = hosts.on(
            "b", "stage1-b", [py, STAGE, "consumer", hosts.addr["b"], hosts.addr["a"], "50100"], stage_env("b")
        )
        out["api_ready"] = api.reply()
        out["producer_ready"] = producer.reply()
        out["consumer_ready"] = consumer.reply()
        phoenix.wait_up()

        # Host A: the request begins in the API server.
        out["begin"] = begun = api.ask(op="begin", rid=RID)
        exporters: dict = {}
        if hosts.exists("a", region_of("a")):
            exporters["a"] = start_exporter(hosts, "a", phoenix.url)
        # Host B's stage takes the request and waits for its chunk; host A's
        # stage 0 sends one chunk and the terminal.
        consumer.send(op="receive", engine_request=begun["engine_request"])
        out["send"] = producer.ask(op="send", rid=RID, codes=CODES)
        out["receive"] = consumer.reply()
        if "b" not in exporters and hosts.exists("b", region_of("b")):
            exporters["b"] = start_exporter(hosts, "b", phoenix.url)
        out["free"] = consumer.ask(op="free")
        out["close"] = api.ask(op="close", rid=RID)
        for h in ("a", "b"):
            if h not in exporters and hosts.exists(h, region_of(h)):
                exporters[h] = start_exporter(hosts, h, phoenix.url)
        out["exporters"] = sorted(exporters)

        tp = begun.get("traceparent")
        out["spans"] = []
        if tp and len(exporters) == 2:
            _, trace_id, a_span, _ = tp.split("-")
            out["trace_id"], out["a_span"] = trace_id, a_span
            out["spans"] = wait_for(
                f"both hosts' spans of trace {trace_id} in Phoenix",
                lambda: (lambda s: s if joined(s, a_span) else None)(phoenix.spans(trace_id)),
            )
            # Every span each host's exporter had sent, read back: the
            # assertions see all of them.
            def settled():
                sent = {h: metric(u, "edgemark_otlp_exported_spans_total") for h, u in exporters.items()}
                queued = sum(metric(u, "edgemark_otlp_queue_spans") for u in exporters.values())
                spans = phoenix.spans(trace_id)
                return (spans, sent) if queued == 0 and len(spans) == sum(sent.values()) else None

            out["spans"], out["exported"] = wait_for("Phoenix to hold every span the exporters sent", settled)
            print(f"Phoenix's span tree of trace {trace_id}:\n{tree(out['spans'])}", file=sys.stderr)
        for p in (api, producer, consumer):
            with contextlib.suppress(Exception):
                p.send(op="exit")
        yield out
    finally:
        hosts.close()
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------
# What crossed.


def test_each_stage_process_is_instrumented_on_its_host(run):
    for k in ("api_ready", "producer_ready", "consumer_ready"):
        assert run[k]["instrumented"] is True, k
    assert run["producer_ready"]["connector"] == run["consumer_ready"]["connector"] == "MooncakeTransferEngineConnector"
    # Each connector on its own host's address.
    assert run["producer_ready"]["host"] == run["addr"]["a"]
    assert run["consumer_ready"]["host"] == run["addr"]["b"]
    assert run["consumer_ready"]["sender"] == [run["addr"]["a"], run["producer_ready"]["zmq_port"]]
    assert run["addr"]["a"] != run["addr"]["b"]


def test_the_chunk_crossed_the_hosts_intact(run):
    send, recv = run["send"], run["receive"]
    # Stage 0 put the data chunk and the terminal, both accepted.
    assert send["sent"] is True
    assert send["puts"] == {"ok": 2, "failed": 0}
    # Stage 1 took both off the connector: one schedule with the data, then
    # the upstream was exhausted.
    assert recv["done"] is True
    # The data chunk was scheduled first (the terminal then wakes the request
    # once more, with no new codes).
    assert recv["scheduled"]
    got = recv["scheduled"][0]
    assert got["prompt_token_ids"] == CODES
    sys.path.insert(0, HERE)
    try:
        from _vllm_omni_host_stage import hidden_for
    finally:
        sys.path.remove(HERE)
    assert got["hidden"] == hidden_for(CODES).tolist()
    # The adapter's keys are the external request ID on both sides.
    assert send["external_req_id"] == recv["external_req_id"] == RID
    assert send["request_id"] != RID  # stage 0's engine core renamed it


def test_the_stage_on_the_other_host_gets_the_traceparent(run):
    tp = run["begin"]["traceparent"]
    assert run["begin"]["has_traceparent_of"] is True, "edgemark.vllm_omni has no traceparent_of"
    assert tp and len(tp.split("-")) == 4
    # The API server's plugin put it in the next stage's engine request as
    # vLLM-Omni's orchestrator builds it...
    assert run["begin"]["built_trace_headers"] == {"traceparent": tp}
    # ... and it reached host B's scheduler Request through vLLM's encoding.
    assert run["receive"]["trace_headers"] == {"traceparent": tp}


def test_each_host_has_its_own_region(run):
    assert run["begin"]["region_exists"] is True
    assert run["free"]["region_exists"] is True
    assert run["exporters"] == ["a", "b"]


# ---------------------------------------------------------------------------
# Phoenix.


def test_the_hosts_spans_are_one_trace_in_phoenix(run):
    assert run["close"]["has_close_request"] is True, "edgemark.vllm_omni has no close_request"
    spans = run["spans"]
    assert spans, "no spans of the request's trace in Phoenix"
    trace_id, a_span = run["trace_id"], run["a_span"]
    assert all(s["context"]["trace_id"] == trace_id for s in spans)
    reqs = named(spans, "edgemark request")
    a_req = [s for s in reqs if s["context"]["span_id"] == a_span]
    b_req = [s for s in reqs if s.get("parent_id") == a_span]
    assert len(a_req) == 1 and len(b_req) == 1, spans
    a_req, b_req = a_req[0], b_req[0]
    # A's request began the trace; B's is its child, in B's own region.
    assert not a_req.get("parent_id")
    assert attr(a_req, "edgemark.region") != attr(b_req, "edgemark.region")
    a_kids = [s for s in spans if s.get("parent_id") == a_span and s is not b_req]
    b_kids = [s for s in spans if s.get("parent_id") == b_req["context"]["span_id"]]
    a_events = {e for s in a_kids for e in event_names(s)}
    b_events = {e for s in b_kids for e in event_names(s)}
    # Host A recorded the producer's events; host B the consumer's accept.
    assert {"producer_first_nonempty_emit", "edge_first_send_complete"} <= a_events, a_kids
    assert "consumer_first_accept" in b_events, b_kids
    assert "consumer_first_accept" not in a_events
    # Both hosts name the same edge, stage 0 -> stage 1; on A, the emit came
    # before the send completed (one host, one clock).
    assert {s["name"] for s in a_kids + b_kids if s is not b_req} == {"edgemark 0->1"}
    a_edge = [s for s in a_kids if "producer_first_nonempty_emit" in event_names(s)][0]
    times = {e["name"]: e["timestamp"] for e in a_edge["events"]}
    assert times["producer_first_nonempty_emit"] <= times["edge_first_send_complete"]
    assert not {"producer_first_nonempty_emit", "edge_first_send_complete"} & b_events
    # Each host's spans came through its own exporter (its own service and
    # host name: Phoenix's span API returns no resource attributes, so the
    # exporters' counts and the regions tell the hosts apart).
    region = {h: attr(r, "edgemark.region") for h, r in (("a", a_req), ("b", b_req))}
    for h in ("a", "b"):
        mine = [s for s in spans if attr(s, "edgemark.region") == region[h]]
        assert run["exported"][h] == len(mine) >= 2, (h, run["exported"])
