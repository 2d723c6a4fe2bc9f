"""The server's own export (``edgemark._export``), with real processes and a
real trace store: several API servers (each builds the P/D plugin's
``Recording`` as its wrappers do, with the ``OTEL_*`` variables a user
sets) share one region; exactly one of them sends its closed requests to
Arize Phoenix, another takes over when that one is SIGKILLed, a server
stopped by SIGTERM sends what it holds and lets its region go, and one
stopped while the collector is down says what it leaves and keeps the file
for the next exporter. What ``configured`` makes of the variables is
checked case by case.

Needs Arize Phoenix in the environment ``EDGEMARK_OTEL_VENV`` names; the
module is skipped without it, unless ``EDGEMARK_REQUIRE_OTEL=1``.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time

import pytest

import edgemark
from edgemark import _export
from _live import http_get, phoenix_bin, phoenix_env, phoenix_spans, wait_for

#: A bound on each wait, never a timing that is asserted.
PATIENCE_S = 120.0

PHOENIX = phoenix_bin()

#: An API server as the P/D plugin's wrappers drive it, with logging on
#: standard error: makes (or attaches) the region EDGEMARK_VLLM_REGION
#: names and serves until SIGTERM (an exit through its exit handlers, as
#: vLLM's server makes one) or SIGKILL.
SERVER = r"""
import logging, signal, sys, threading
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
from edgemark.vllm._recording import Recording
rec = Recording()
rec.start(None)
print("ready", flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
threading.Event().wait()
"""

ELECTED = re.compile(r"edgemark: this process \(pid (\d+)\) sends the closed requests of (\S+) as spans to (\S+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A process in a process group of its own, its standard error in a
    file; stopped by its saved pid."""

    def __init__(self, argv, env, log_path, pipe: bool = False) -> None:
        self.log_path = log_path
        with open(log_path, "wb") as err:
            # With ``pipe``, standard output is read by the test (one line:
            # the servers say nothing more there); else it goes to the file.
            self.p = subprocess.Popen(
                argv, stdout=subprocess.PIPE if pipe else err, stderr=err, stdin=subprocess.DEVNULL, env=env,
                text=True, process_group=0,
            )  # fmt: skip
        self.pid = self.p.pid

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def signal(self, sig: int) -> None:
        if self.p.poll() is None:
            os.killpg(self.pid, sig)

    def stop(self) -> None:
        self.signal(signal.SIGKILL)
        self.p.wait(timeout=PATIENCE_S)


@pytest.fixture
def procs():
    started: list = []
    yield started
    for p in started:
        p.stop()


@pytest.fixture
def phoenix(tmp_path, procs):
    def start(port: int) -> Proc:
        env = phoenix_env("127.0.0.1", port, free_port(), str(tmp_path / "phoenix"))
        p = Proc([PHOENIX, "serve"], env, str(tmp_path / f"phoenix-{len(procs)}.log"))
        procs.append(p)
        url = f"http://127.0.0.1:{port}"
        wait_for("Phoenix to answer /healthz", lambda: (http_get(url + "/healthz") or (0,))[0] == 200, PATIENCE_S, p.log)
        return p

    return start


def server_env(region: str, collector: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EDGEMARK_", "_EDGEMARK_", "OTEL_"))}
    env.update(
        EDGEMARK_VLLM="1",
        EDGEMARK_VLLM_REGION=region,
        OTEL_EXPORTER_OTLP_ENDPOINT=collector,
        OTEL_SERVICE_NAME="edgemark-export-test",
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    return env


def start_server(procs, tmp_path, name: str, env: dict) -> Proc:
    p = Proc([sys.executable, "-c", SERVER], env, str(tmp_path / f"{name}.log"), pipe=True)
    procs.append(p)
    line = p.p.stdout.readline()
    assert line.strip() == "ready", f"{name} said {line!r}\n{p.log()}"
    return p


def elected(servers) -> list:
    return [s for s in servers if ELECTED.search(s.log())]


def close_requests(region: str, n: int) -> list:
    """``n`` requests begun, recorded and closed in ``region`` (as any
    process of the host records), each in a trace of its own; their
    trace IDs."""
    r = edgemark.Region.attach(region)
    traces = []
    for _ in range(n):
        trace = secrets.token_hex(16)
        t = r.begin(f"00-{trace}-{secrets.token_hex(8)}-01")
        assert t is not None
        assert r.record(t, 0, 1, edgemark.Event.PRODUCER_FIRST_NONEMPTY_EMIT)
        assert r.close(t) is not None
        traces.append(trace)
    return traces


def in_phoenix(url: str, traces) -> bool:
    return all(any(s["name"] == "edgemark request" for s in phoenix_spans(url, t)) for t in traces)


def test_one_of_several_servers_exports_and_another_takes_over_when_it_dies(tmp_path, procs, phoenix):
    port = free_port()
    phoenix(port)
    url = f"http://127.0.0.1:{port}"
    region = str(tmp_path / "shared.region")
    env = server_env(region, url)
    servers = [start_server(procs, tmp_path, f"server-{i}", env) for i in range(3)]
    wait_for("one server elected", lambda: elected(servers), PATIENCE_S)
    first = close_requests(region, 5)
    wait_for("the first requests in Phoenix", lambda: in_phoenix(url, first), PATIENCE_S, lambda: servers[0].log())
    # Each server tries the election at every tick (2 s): after several, still one.
    time.sleep(3 * 2.0)
    [leader] = elected(servers)
    assert int(ELECTED.search(leader.log()).group(1)) == leader.pid
    assert ELECTED.search(leader.log()).group(3) == url + "/v1/traces"

    leader.stop()
    rest = [s for s in servers if s is not leader]
    wait_for("another server elected once the first died", lambda: elected(rest), PATIENCE_S)
    after = close_requests(region, 5)
    wait_for("the requests closed after the kill in Phoenix", lambda: in_phoenix(url, after), PATIENCE_S)
    time.sleep(3 * 2.0)
    assert len(elected(rest)) == 1, [s.log() for s in rest]


def test_a_stopped_server_sends_what_it_holds_and_its_region_goes(tmp_path, procs, phoenix):
    port = free_port()
    phoenix(port)
    url = f"http://127.0.0.1:{port}"
    region = str(tmp_path / "alone.region")
    # Made by the server: its last server out removes it.
    s = start_server(procs, tmp_path, "server", server_env(region, url))
    wait_for("the server elected", lambda: elected([s]), PATIENCE_S)
    traces = close_requests(region, 20)
    # Taken by the exporter (sent or not yet): the stop sends what it holds.
    wait_for("every request taken", lambda: edgemark.Region.attach(region).report()["closed_unread"] == 0, PATIENCE_S)
    s.signal(signal.SIGTERM)
    assert s.p.wait(timeout=PATIENCE_S) == 0, s.log()
    wait_for("every request in Phoenix", lambda: in_phoenix(url, traces), PATIENCE_S)
    said = re.search(r"the exporter of \S+ stopped: (\d+) closed request\(s\) taken, (\d+) span\(s\) sent, (\d+) request", s.log())
    assert said, s.log()
    # A request span and its edge's span each.
    assert [int(g) for g in said.groups()] == [20, 40, 0], s.log()
    assert "not sent by any exporter" not in s.log()
    assert not os.path.exists(region), "a region whose requests were all sent stays after its last server"


def holding_unsent(procs, tmp_path, name: str, n: int):
    """A server elected for the region ``<name>.region``, its collector
    down (nothing listens at its port), holding ``n`` closed requests its
    exporter took and could not send: (server, collector port and URL,
    region, trace IDs)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    region = str(tmp_path / f"{name}.region")
    s = start_server(procs, tmp_path, "server", server_env(region, url))
    wait_for("the server elected", lambda: elected([s]), PATIENCE_S)
    traces = close_requests(region, n)
    wait_for(
        "every request taken by the exporter and not acknowledged",
        lambda: edgemark.Region.attach(region).report()["closed_unacknowledged"] == n,
        PATIENCE_S,
    )
    return s, port, url, region, traces


def test_a_server_stopped_while_the_collector_is_down_keeps_its_region_for_the_next_exporter(tmp_path, procs, phoenix):
    s, port, url, region, traces = holding_unsent(procs, tmp_path, "kept", 4)
    s.signal(signal.SIGTERM)
    assert s.p.wait(timeout=PATIENCE_S) == 0, s.log()
    assert re.search(r"4 closed request\(s\) of \S+ not sent by any exporter yet", s.log()), s.log()
    assert os.path.exists(region), "removed with closed requests no exporter sent"
    # The next exporter of it (here a server started again on it) sends them.
    phoenix(port)
    again = start_server(procs, tmp_path, "again", server_env(region, url))
    wait_for("the server started again elected", lambda: elected([again]), PATIENCE_S)
    wait_for("what the stopped server left in Phoenix", lambda: in_phoenix(url, traces), PATIENCE_S, again.log)


def test_settings_that_cannot_be_used_are_said_and_the_server_serves(tmp_path, procs):
    region = str(tmp_path / "bad.region")
    env = server_env(region, "not a url")
    s = start_server(procs, tmp_path, "server", env)
    wait_for(
        "the refusal said", lambda: "the OTLP settings cannot be used" in s.log(), PATIENCE_S, s.log
    )
    # It records still.
    assert close_requests(region, 1)
    assert not elected([s])
    s.signal(signal.SIGTERM)
    assert s.p.wait(timeout=PATIENCE_S) == 0, s.log()


@pytest.mark.parametrize(
    "env, vllm, on, said",
    [
        ({}, None, False, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, None, True, None),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, None, True, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, None, False, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "console,otlp"}, None, True, None),
        # vLLM's --otlp-traces-endpoint: vLLM puts it in the variable, over gRPC unless told.
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317"}, "http://c:4317", False, "over grpc"),
        ({}, "http://c:4317", False, "over grpc"),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"},
            "http://c:4318/v1/traces",
            True,
            None,
        ),
        # A variable the user set for edgemark beside vLLM's own gRPC endpoint.
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, "http://c:4317", True, None),
    ],
)
def test_what_the_variables_ask_for(env, vllm, on, said):
    got_on, why = _export.configured(env, vllm)
    assert got_on == on
    if said is None:
        assert why is None
    else:
        assert why is not None and said in why


def test_a_collector_down_at_start_and_up_later_gets_every_request(tmp_path, procs, phoenix):
    port = free_port()  # nothing listens there yet
    url = f"http://127.0.0.1:{port}"
    region = str(tmp_path / "later.region")
    s = start_server(procs, tmp_path, "server", server_env(region, url))
    wait_for("the server elected", lambda: elected([s]), PATIENCE_S)
    traces = close_requests(region, 6)
    wait_for("the collector's absence said", lambda: "cannot connect" in s.log(), PATIENCE_S, s.log)
    phoenix(port)
    wait_for("every request in Phoenix once it is up", lambda: in_phoenix(url, traces), PATIENCE_S, s.log)
    counters = edgemark.Region.attach(region).counters()
    assert counters["closed_acknowledged"] == 6 and counters["closed_lost"] == 0, counters


def test_what_a_sigkilled_server_took_and_did_not_send_reaches_the_host_s_exporter(tmp_path, procs, phoenix):
    s, port, url, region, traces = holding_unsent(procs, tmp_path, "killed", 5)
    s.stop()  # SIGKILL: no flush, no word
    assert os.path.exists(region)
    phoenix(port)
    # The host's exporter of the directory: it adopts what the dead one took.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_BSP_SCHEDULE_DELAY"] = "100"
    exporter = Proc(
        [sys.executable, "-m", "edgemark", "export", "--dir", str(tmp_path), "--otlp", url],
        env,
        str(tmp_path / "export-dir.log"),
    )
    procs.append(exporter)
    wait_for("what the killed server took, in Phoenix", lambda: in_phoenix(url, traces), PATIENCE_S, exporter.log)
    counters = edgemark.Region.attach(region).counters()
    assert counters["closed_acknowledged"] == 5 and counters["closed_lost"] == 0, counters
