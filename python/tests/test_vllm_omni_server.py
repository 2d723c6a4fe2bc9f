"""A real ``vllm-omni serve``, started as a user starts it, recording
through the installed plugin: nothing loaded, patched or called by hand.

The server runs the Qwen3-TTS pipeline (talker -> code2wav, stage 0 -> 1,
``async_chunk: true``: the transfer adapter's path) on the CPU, from a tiny
random-weight model (``real_server/tiny_tts.py``) and the test CPU platform
(``real_server/cpu_platform``, installed in the environment). The user's
steps: ``EDGEMARK_VLLM_OMNI=1`` (and ``EDGEMARK_VLLM_OMNI_LOG_REQUESTS=1``
for the per-request log line) with their trace store (Arize Phoenix) named
the standard way (``OTEL_EXPORTER_OTLP_ENDPOINT``), start the server, send
requests: the server sends its region's spans itself, nothing runs beside
it. Then, per request: the four events on ``0->1:0`` in the orders
causality fixes, the request closed, one trace with the events in Phoenix;
and after SIGTERM the exporter's flush said, the region and its lookup
gone, every server process ended.

Requests: WAV responses one at a time, streamed responses, two at once,
and a streamed one whose client disconnects after its first audio. The
speech endpoint names each request itself, ``speech-<16 hex>``, new for
every request (unique to the run, as vLLM-Omni's shared-memory connector,
which names global files by request ID, needs); each request is known by the
close line that appears after it (the two at once, by the two).

Needs vllm-omni with the CPU platform installed, Arize Phoenix in the
environment ``EDGEMARK_OTEL_VENV`` names. ``EDGEMARK_TTS_MODEL`` names where the tiny model is
kept between runs (default: a temporary directory). Where one is missing
the module is skipped, unless ``EDGEMARK_REQUIRE_VLLM_OMNI=1`` or
``EDGEMARK_REQUIRE_OTEL=1`` (CI sets both), which makes it fail. Every
process started is stopped by its saved pid (its process group), on failure
too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import _live
from _live import (
    EDGE,
    EVENTS,
    http_get,
    missing,
    need_vllm_omni,
    phoenix_bin,
    phoenix_spans,
)

HERE = os.path.dirname(os.path.abspath(__file__))
SUPPORT = os.path.join(HERE, "real_server")
#: A bound on each wait, never a timing that is asserted.
PATIENCE_S = 900.0


need_vllm_omni()
if importlib.util.find_spec("edgemark_test_omni_cpu") is None:
    missing("the test CPU platform is not installed (real_server/server.py's install_cpu_platform)")
PHOENIX = phoenix_bin()
#: The server's exporter, elected among its processes: (pid, region, URL).
_ELECTED = re.compile(r"edgemark: this process \(pid (\d+)\) sends the closed requests of (\S+) as spans to (\S+)")
#: What it said when SIGTERM stopped it.
_STOPPED = re.compile(
    r"edgemark: the exporter of (\S+) stopped: (\d+) closed request\(s\) taken, (\d+) span\(s\) sent, (\d+) request"
)

sys.path.insert(0, SUPPORT)
import server as omni  # noqa: E402  (test support, beside this file)
import tiny_tts  # noqa: E402


# ---------------------------------------------------------------------------
# Processes the test starts, stopped by their saved pid.


class Proc:
    """A process in its own process group, its output in a file."""

    def __init__(self, name: str, argv: list, log_dir: str, env: dict) -> None:
        self.name = name
        self.log_path = os.path.join(log_dir, f"{name}.log")
        with open(self.log_path, "wb") as out:
            self.p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.pid = self.p.pid

    def output(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.p.wait(timeout=30)


def wait_for(what: str, check, timeout: float = PATIENCE_S, on_fail=lambda: ""):
    return _live.wait_for(what, check, timeout, on_fail)


def server_processes(pid: int) -> list:
    """The pids of ``pid``'s process group that still run."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                if int(fields[2]) == pid and fields[0] != b"Z":
                    out.append(int(entry))
    return out


_CLOSED = re.compile(r"edgemark: request (\S+) closed, trace (\S+): stream_edge_metrics (\{.*\})\s*$")
_RECORDING = re.compile(r"edgemark: recording vLLM-Omni stream-edge events .* in (\S+), pid (\d+): (.*) call sites patched; region (\S+)")


def closed_lines(log: str) -> dict:
    """Request ID -> (trace ID, final snapshot), from the plugin's lines."""
    out = {}
    for line in log.splitlines():
        m = _CLOSED.search(line)
        if m:
            out[m.group(1)] = (m.group(2), json.loads(m.group(3)))
    return out


# ---------------------------------------------------------------------------
# The run, once per module.


@pytest.fixture(scope="module")
def run():
    work = tempfile.mkdtemp(prefix="edgemark-serve-")
    procs: list = []
    out: dict = {}
    server = None
    try:
        model_dir = os.environ.get("EDGEMARK_TTS_MODEL") or os.path.join(work, "tiny-qwen3-tts")
        tiny_tts.make(model_dir)

        phoenix_port = omni.free_port()
        phoenix_env = _live.phoenix_env("127.0.0.1", phoenix_port, omni.free_port(), os.path.join(work, "phoenix"))
        phoenix = Proc("phoenix", [PHOENIX, "serve"], work, phoenix_env)
        procs.append(phoenix)
        phoenix_url = f"http://127.0.0.1:{phoenix_port}"

        # As a user switches the plugin on, and names their trace store as
        # for any OpenTelemetry instrumentation; nothing else.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("EDGEMARK_", "_EDGEMARK_", "OTEL_"))}
        env.update(
            EDGEMARK_VLLM_OMNI="1",
            EDGEMARK_VLLM_OMNI_LOG_REQUESTS="1",
            OTEL_EXPORTER_OTLP_ENDPOINT=phoenix_url,
            OTEL_SERVICE_NAME="edgemark-serve-test",
            OTEL_BSP_SCHEDULE_DELAY="100",
        )
        server = omni.OmniServer(
            python=sys.executable,
            model_dir=model_dir,
            deploy_file=os.path.join(SUPPORT, "qwen3_tts_cpu.yaml"),
            port=omni.free_port(),
            env=env,
            log_path=os.path.join(work, "server.log"),
        )
        server.start()
        server.wait_ready(PATIENCE_S)
        out["server_pid"] = server.pid

        def log() -> str:
            with open(server.log_path, errors="replace") as f:
                return f.read()

        said = [m for m in (_RECORDING.search(line) for line in log().splitlines()) if m]
        out["said"] = [(m.group(1), int(m.group(2)), m.group(3), m.group(4)) for m in said]
        regions = {m.group(4) for m in said}
        assert len(regions) == 1, f"the plugin's lines name {regions}\n{log()[-5000:]}"
        region = out["region"] = regions.pop()
        wait_for("Phoenix to answer /healthz", lambda: (http_get(phoenix_url + "/healthz") or (0,))[0] == 200)
        # Exactly one process of the server exports the region.
        out["elected"] = wait_for(
            "the server's exporter started",
            lambda: _ELECTED.findall(log()),
            120,
            lambda: log()[-5000:],
        )

        # The speech endpoint names each request itself (`speech-<hex>`, new
        # for every request, so unique to the run): each request is told
        # from the others by the close line that appears after it.
        def close_lines() -> dict:
            return closed_lines(log())

        def new_closes(before: dict, n: int) -> list:
            got = wait_for(
                f"{n} new close line(s) in the server's log",
                lambda: (lambda c: [r for r in c if r not in before] if len(c) >= len(before) + n else None)(
                    close_lines()
                ),
                on_fail=lambda: log()[-5000:],
            )
            assert len(got) == n, got
            return got

        port = server.port
        text = "Hello from the edgemark test."
        kinds: dict = {}
        bodies: dict = {}

        def sent(kind: str, call, before: dict, **kw) -> None:
            body = call(port, text, max_new_tokens=32, **kw)
            (rid,) = new_closes(before, 1)
            kinds[rid], bodies[rid] = kind, body

        for _ in range(3):
            sent("wav", omni.speech_wav, close_lines())
        for _ in range(2):
            sent("stream", omni.speech_stream, close_lines())
        # Two at once: a WAV and a streamed request.
        before = close_lines()
        pair: dict = {}
        threads = [
            threading.Thread(target=lambda: pair.__setitem__("wav", omni.speech_wav(port, text, max_new_tokens=32))),
            threading.Thread(target=lambda: pair.__setitem__("stream", omni.speech_stream(port, text, max_new_tokens=32))),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(PATIENCE_S)
        for rid in new_closes(before, 2):
            kinds[rid] = "pair"
        out["pair"] = pair
        # A streamed request whose client leaves after its first audio.
        before = close_lines()
        out["disconnect"] = omni.speech_stream_disconnect(port, text, max_new_tokens=400, after_events=1)
        (rid,) = new_closes(before, 1)
        kinds[rid] = "disconnect"
        out["ids"], out["bodies"] = kinds, bodies
        closed = close_lines()
        out["closed"] = {rid: closed[rid] for rid in kinds}

        # One trace per request in Phoenix, with its edge's events.
        def traces():
            got = {}
            for m, (trace_id, _) in out["closed"].items():
                spans = phoenix_spans(phoenix_url, trace_id)
                names = {e.get("name") for s in spans for e in s.get("events") or []}
                if not set(EVENTS) <= names:
                    return None
                got[m] = spans
            return got

        out["spans"] = wait_for("every request's trace in Phoenix", traces, on_fail=lambda: log()[-5000:])
        # The region's families on the server's own /metrics, and in a real
        # Prometheus that scrapes it.
        out["metrics"] = _live.server_metrics(f"http://127.0.0.1:{port}/metrics")
        prometheus = _live.Prometheus(f"127.0.0.1:{port}", os.path.join(work, "prometheus"))
        procs.append(prometheus)
        first_outputs = 'edgemark_boundary_elapsed_seconds_count{edge="0->1",event="consumer_first_nonempty_output"}'
        out["prometheus"] = wait_for(
            "Prometheus to hold every request's first output",
            lambda: (lambda r: r if r and float(r[0]["value"][1]) >= len(kinds) else None)(
                prometheus.query(first_outputs)
            ),
            on_fail=lambda: open(prometheus.log_path, errors="replace").read()[-3000:],
        )
        import edgemark

        out["open_before_stop"] = edgemark.Region.attach(region).open_requests()

        # SIGTERM, as a service manager stops the server.
        pids_before = server_processes(server.pid)
        out["processes"] = len(pids_before)
        out["stop"] = server.stop(signal.SIGTERM, PATIENCE_S)
        deadline = time.monotonic() + 120
        while server_processes(server.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        out["left"] = server_processes(server.pid)
        out["region_after"] = os.path.exists(region)
        out["lookup_after"] = os.path.exists(region[: -len(".region")] + ".requests")
        out["log"] = log()
        yield out
    finally:
        if server is not None:
            with contextlib.suppress(Exception):
                server.stop(signal.SIGKILL, 60)
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(work, ignore_errors=True)


def _ms(snapshot: dict, event: str):
    return (snapshot.get(EDGE) or {}).get(f"{event}_ms")


def test_every_process_of_the_server_says_what_it_patched(run):
    said = run["said"]  # (process name, pid, what was patched, region)
    pids = [pid for _, pid, _, _ in said]
    assert len(pids) == len(set(pids)), said  # one line per process
    # The API server is `MainProcess` until vLLM names it `APIServer`.
    kinds = {"MainProcess": "APIServer"}
    by_kind = sorted((kinds.get(n, n.split("_")[0].split("-")[0]), what) for n, _, what, _ in said)
    assert by_kind == [
        # The API server: its name is no role's, so every call site.
        ("APIServer", "orchestrator, transfer adapter, model runner connector"),
        ("StageEngineCoreProc", "transfer adapter, model runner connector"),
        ("StageEngineCoreProc", "transfer adapter, model runner connector"),
        ("VllmWorker", "model runner connector"),
        ("VllmWorker", "model runner connector"),
    ], said
    assert {region for _, _, _, region in said} == {run["region"]}


def test_every_request_records_all_four_events_on_the_edge(run):
    for mine, (_, final) in run["closed"].items():
        assert set(final) == {EDGE}, (mine, final)
        missing = [e for e in EVENTS if _ms(final, e) is None]
        assert missing == [], (mine, run["ids"][mine], final)
        assert final[EDGE]["from_stage"] == 0 and final[EDGE]["to_stage"] == 1


def test_the_events_keep_the_orders_causality_fixes(run):
    # Send complete and accept are stamped in different processes when
    # their calls return: either may come first.
    for mine, (_, final) in run["closed"].items():
        emit, send, accept, output = (_ms(final, e) for e in EVENTS)
        assert emit <= send <= output and emit <= accept <= output, (mine, final)


def test_the_responses_are_audio(run):
    kinds = run["ids"]
    wavs = [b for r, b in run["bodies"].items() if kinds[r] == "wav"] + [run["pair"]["wav"]]
    streams = [b for r, b in run["bodies"].items() if kinds[r] == "stream"] + [run["pair"]["stream"]]
    assert len(wavs) == 4 and len(streams) == 3
    for body in wavs:
        assert omni.wav_samples(body) > 0
    for events in streams:
        assert len(omni.pcm_of(events)) > 0, events[:3]
        assert events[-1][0] == "speech.audio.done", events[-3:]
    # The client that left had audio before it left.
    assert len(omni.pcm_of(run["disconnect"])) > 0


def test_every_request_closed_the_disconnected_one_too(run):
    assert sorted(run["ids"].values()) == sorted(["wav"] * 3 + ["stream"] * 2 + ["pair"] * 2 + ["disconnect"])
    assert set(run["closed"]) == set(run["ids"])
    # Nothing of the run's left open in the region (the test's requests
    # were the only ones).
    assert run["open_before_stop"] == []


def test_the_server_s_own_metrics_carry_the_region_s_families(run):
    text = run["metrics"]
    _live.one_set_of_families(text)
    assert _live.sample(text, "edgemark_closed_requests_total") >= len(run["ids"])
    # Every request's first output on the edge, in its boundary histogram.
    count = [
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("edgemark_boundary_elapsed_seconds_count{")
        and 'edge="0->1"' in line
        and 'event="consumer_first_nonempty_output"' in line
    ]
    assert count and count[0] >= len(run["ids"]), count
    # A real Prometheus scraped them: one series, every request served.
    [series] = run["prometheus"]
    assert float(series["value"][1]) == len(run["ids"]), series
    # vLLM's own families are there too, unchanged.
    assert "vllm:" in text
    _live.promtool_check(_live.edgemark_part(text))


def test_one_process_of_the_server_exported_its_region_and_flushed_at_sigterm(run):
    # Elected once, in the region the plugin's lines name, toward Phoenix.
    [(pid, region, url)] = run["elected"]
    assert region == run["region"]
    assert url.endswith("/v1/traces")
    # At SIGTERM it sent what it held and left nothing: the region went.
    [(region, taken, sent, left)] = _STOPPED.findall(run["log"])
    assert region == run["region"]
    assert int(taken) >= len(run["ids"]) and int(sent) >= 2 * len(run["ids"]) and int(left) == 0, (taken, sent, left)
    assert "not sent by any exporter" not in run["log"]


def test_each_request_is_one_trace_with_its_events(run):
    for mine, spans in run["spans"].items():
        requests = [s for s in spans if s.get("name") == "edgemark request"]
        assert len(requests) == 1, (mine, [s.get("name") for s in spans])
        edges = [s for s in spans if s.get("name") == "edgemark 0->1"]
        assert len(edges) == 1 and edges[0].get("parent_id") == requests[0]["context"]["span_id"], mine
        assert [e.get("name") for e in edges[0].get("events") or []] != []
        assert {e.get("name") for e in edges[0]["events"]} >= set(EVENTS), mine



def test_sigterm_removes_the_region_and_its_lookup_and_ends_every_process(run):
    assert run["processes"] >= 3 and run["left"] == []
    assert not run["region_after"] and not run["lookup_after"]
