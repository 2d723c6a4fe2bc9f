"""A real ``vllm-omni serve --api-server-count 2``, started as a user
starts it, records every request, whichever API server serves it.

With ``--api-server-count N`` vLLM-Omni's launcher starts the stage engine
cores once and N API-server processes, each with an orchestrator of its
own; the kernel spreads the client connections over the N listeners. The
plugin is switched on as a user does (``EDGEMARK_VLLM_OMNI=1``, with
``EDGEMARK_VLLM_OMNI_LOG_REQUESTS=1`` for the per-request close line), with
the plugin's default region naming: the launcher, the first process to load
the plugin, names the region and every process it starts inherits the name;
each API server creates or attaches that one region and holds a shared
``flock`` on it while it lives.

The server runs the Qwen3-TTS pipeline of the single-API-server test
(``test_vllm_omni_server.py``: talker -> code2wav, stage 0 -> 1, the
transfer adapter's path) on the CPU from the tiny random-weight model. The
test sends WAV and streamed requests, one at a time and two at once, each
on a connection of its own, until both API servers have served some (at
least ``MIN_REQUESTS``, at most ``MAX_REQUESTS``). Which API server served a
request, and the request's ID, come from vLLM-Omni's own ``[SpeechE2E]``
line (``--enable-log-requests`` logs it at INFO, with the process's
``(APIServer pid=N)`` prefix); each served request must have the plugin's
close line, from the same API server, with the four events on ``0->1:0`` in
the orders causality fixes, as the single-API-server test asserts them.
Also: every process's log line names one region, the launcher's name for
it; each API server says it patched the orchestrator and holds a shared
lock on the region; nothing is left open; after SIGTERM every process of
the server has ended and the region and its request lookup are gone. The
trace store is named the standard way (``OTEL_EXPORTER_OTLP_ENDPOINT``, Arize
Phoenix): exactly one of the two API servers exports the region, and every
request's trace is in Phoenix with one request span, never two; the
server's own ``/metrics`` (vLLM's multiprocess mode) has the region's
families once, counting every request whichever API server answers.

Needs vllm-omni with the CPU platform installed (``real_server/``) and
Arize Phoenix in the environment ``EDGEMARK_OTEL_VENV`` names;
``EDGEMARK_TTS_MODEL`` names where the tiny model is kept between runs
(default: a temporary directory). Skipped where vllm-omni or the platform is
missing, unless ``EDGEMARK_REQUIRE_VLLM_OMNI=1`` (CI), which makes it fail.
Every process started is stopped by its saved pid (its process group), on
failure too; region files the server left under its launcher's pid are
removed after they were looked for, and so are the directories vLLM-Omni
leaves for its stage engine cores (``server.remove_wake_dirs``).
"""

from __future__ import annotations

import contextlib
import glob
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
from _live import EDGE, EVENTS, missing, need_vllm_omni, phoenix_bin

HERE = os.path.dirname(os.path.abspath(__file__))
SUPPORT = os.path.join(HERE, "real_server")
#: A bound on each wait, never a timing that is asserted.
PATIENCE_S = 900.0
#: How long after the last response the test waits for the close lines of
#: the served requests (each is logged by the API server that served it,
#: around the time the response ends): a bound, not a timing.
CLOSE_PATIENCE_S = 60.0
API_SERVERS = 2
#: Requests sent at least, and at most while one API server has served none
#: (the kernel spreads connections by a hash of their addresses: after 16
#: requests the chance that all went to one of two servers is 2**-15).
MIN_REQUESTS, MAX_REQUESTS = 8, 16
TEXT = "Hello from the edgemark test."
PREFIX = "edgemark-vllm-omni-"


need_vllm_omni()
if importlib.util.find_spec("edgemark_test_omni_cpu") is None:
    missing("the test CPU platform is not installed (real_server/server.py's install_cpu_platform)")

PHOENIX = phoenix_bin()

sys.path.insert(0, SUPPORT)
import server as omni  # noqa: E402  (test support, beside this file)
import tiny_tts  # noqa: E402

import edgemark  # noqa: E402

# The plugin's own lines (as test_vllm_omni_server.py reads them).
_CLOSED = re.compile(r"edgemark: request (\S+) closed, trace (\S+): stream_edge_metrics (\{.*\})\s*$")
_CLOSED_TRACE = re.compile(r"edgemark: request \S+ closed, trace ([0-9a-f]{32}):", re.M)
_ELECTED = re.compile(r"edgemark: this process \(pid (\d+)\) sends the closed requests of (\S+)")
_RECORDING = re.compile(r"edgemark: recording vLLM-Omni stream-edge events .* in (\S+), pid (\d+): (.*) call sites patched; region (\S+)")


def closes(log: str) -> dict:
    """Request ID -> (pid of the process that logged it, final snapshot)."""
    out = {}
    for line in log.splitlines():
        m = _CLOSED.search(line)
        if m:
            who = omni.log_process(line)
            out[m.group(1)] = (who[1] if who else None, json.loads(m.group(3)))
    return out


def closes_of(speech_id: str, closed: dict) -> list:
    """The close lines of a request the endpoint named ``speech_id`` (the
    engine adds ``-<8 hex>`` to it)."""
    return [c for rid, c in closed.items() if rid == speech_id or rid.startswith(speech_id + "-")]


def region_flocks(path: str) -> list:
    """(mode, pid) of every ``flock`` held on ``path``'s file, from
    ``/proc/locks``."""
    st = os.stat(path)
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    out = []
    with open("/proc/locks") as f:
        for line in f:
            fields = line.split()
            if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":
                continue  # a waiter, or not a flock
            dev = fields[5].split(":")
            with contextlib.suppress(ValueError, IndexError):
                if (int(dev[0], 16), int(dev[1], 16), int(dev[2])) == want:
                    out.append((fields[3], int(fields[4])))
    return out


def launcher_files(pid: int) -> list:
    """Files and folders in the region directory whose name the plugin
    would give them for the launcher ``pid`` (its region, its lookup)."""
    base = os.path.join(edgemark.default_dir(), f"{PREFIX}{pid}")
    return sorted(glob.glob(base + ".*") + glob.glob(base + "-*"))


# ---------------------------------------------------------------------------
# The run, once per module.


@pytest.fixture(scope="module")
def run():
    work = tempfile.mkdtemp(prefix="edgemark-api-servers-")
    out: dict = {"started": time.monotonic()}
    server = phoenix = None
    try:
        model_dir = os.environ.get("EDGEMARK_TTS_MODEL") or os.path.join(work, "tiny-qwen3-tts")
        tiny_tts.make(model_dir)
        phoenix_port = omni.free_port()
        phoenix_url = f"http://127.0.0.1:{phoenix_port}"
        with open(os.path.join(work, "phoenix.log"), "wb") as plog:
            phoenix = subprocess.Popen(
                [PHOENIX, "serve"], stdout=plog, stderr=subprocess.STDOUT, start_new_session=True,
                env=_live.phoenix_env("127.0.0.1", phoenix_port, omni.free_port(), os.path.join(work, "phoenix")),
            )  # fmt: skip

        # As a user switches the plugin on: two variables, nothing else (no
        # region named: the plugin names it).
        env = {k: v for k, v in os.environ.items() if not k.startswith(("EDGEMARK_", "_EDGEMARK_", "OTEL_"))}
        env.update(
            EDGEMARK_VLLM_OMNI="1",
            EDGEMARK_VLLM_OMNI_LOG_REQUESTS="1",
            OTEL_EXPORTER_OTLP_ENDPOINT=phoenix_url,
            OTEL_BSP_SCHEDULE_DELAY="100",
        )
        server = omni.OmniServer(
            python=sys.executable,
            model_dir=model_dir,
            deploy_file=os.path.join(SUPPORT, "qwen3_tts_cpu.yaml"),
            port=omni.free_port(),
            env=env,
            log_path=os.path.join(work, "server.log"),
            # --enable-log-requests: the endpoint's [SpeechE2E] line of
            # each request at INFO, with the API server's pid.
            extra_args=("--api-server-count", str(API_SERVERS), "--enable-log-requests"),
        )
        server.start()
        out["ready_after"] = server.wait_ready(PATIENCE_S)
        out["launcher"] = server.pid

        def log() -> str:
            with open(server.log_path, errors="replace") as f:
                return f.read()

        def tail() -> str:
            return log()[-5000:]

        out["api_servers"] = _live.wait_for(
            f"{API_SERVERS} 'Starting vLLM API server' lines",
            lambda: (lambda a: a if len(a) >= API_SERVERS else None)(omni.api_servers(log())),
            PATIENCE_S,
            tail,
        )

        # Requests, each on a connection of its own, until both API
        # servers have served some.
        port = server.port
        replies: list = []  # (kind, body)
        errors: list = []

        def send(kind: str) -> None:
            try:
                if kind == "wav":
                    replies.append((kind, omni.speech_wav(port, TEXT, max_new_tokens=32)))
                else:
                    replies.append((kind, omni.speech_stream(port, TEXT, max_new_tokens=32)))
            except Exception as e:  # noqa: BLE001 - reported by the test
                errors.append((kind, repr(e)))

        def served_all(n: int):
            got = omni.speech_requests(log())
            return got if len(got) >= n else None

        sent = 0
        served: dict = {}
        while sent < MAX_REQUESTS:
            # One WAV, one streamed, then a WAV and a streamed at once.
            send("wav")
            send("stream")
            pair = [threading.Thread(target=send, args=(k,)) for k in ("wav", "stream")]
            for t in pair:
                t.start()
            for t in pair:
                t.join(PATIENCE_S)
            sent += 4
            served = _live.wait_for(f"{sent} [SpeechE2E] lines", lambda: served_all(sent - len(errors)), PATIENCE_S, tail)
            if sent >= MIN_REQUESTS and {pid for pid, _, _ in served.values()} >= set(out["api_servers"].values()):
                break
        out["sent"], out["replies"], out["errors"], out["served"] = sent, replies, errors, served

        # Every served request's close line, waited for with a bound (a
        # request recorded by no process has none: the test says which).
        deadline = time.monotonic() + CLOSE_PATIENCE_S
        while True:
            closed = closes(log())
            if all(closes_of(rid, closed) for rid in served) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        out["closed"] = closed

        # Every request's trace in Phoenix, from the one exporting API server.
        traces = sorted(set(_CLOSED_TRACE.findall(log())))
        out["traces"] = traces

        def in_phoenix():
            got = {t: [x for x in _live.phoenix_spans(phoenix_url, t) if x["name"] == "edgemark request"] for t in traces}
            return got if all(got.values()) else None

        out["phoenix"] = _live.wait_for("every request's trace in Phoenix", in_phoenix, PATIENCE_S, tail)
        # The region's families on the server's own /metrics, scraped a few
        # times (the kernel spreads the connections over both API servers).
        out["metrics"] = [_live.server_metrics(f"http://127.0.0.1:{port}/metrics") for _ in range(6)]

        text = log()
        said = [m for m in (_RECORDING.search(line) for line in text.splitlines()) if m]
        out["said"] = [(m.group(1), int(m.group(2)), m.group(3), m.group(4)) for m in said]
        out["warnings"] = [line for line in text.splitlines() if "WARNING" in line and "edgemark:" in line]
        regions = {m.group(4) for m in said}
        region = out["region"] = regions.pop() if len(regions) == 1 else None
        out["regions"] = sorted(regions | ({region} if region else set()))
        if region is not None and os.path.exists(region):
            out["flocks"] = region_flocks(region)
            attached = edgemark.Region.attach(region)
            out["open_before_stop"] = attached.open_requests()
            del attached

        # SIGTERM, as a service manager stops the server.
        out["processes"] = len(server.group_pids())
        t = time.monotonic()
        out["stop"] = server.stop(signal.SIGTERM, PATIENCE_S)
        out["stop_s"] = time.monotonic() - t
        out["left"] = server.group_pids()
        out["region_after"] = region is not None and os.path.exists(region)
        out["lookup_after"] = region is not None and os.path.exists(region[: -len(".region")] + ".requests")
        out["launcher_files_after"] = launcher_files(server.pid)
        out["log"] = log()
        out["total_s"] = time.monotonic() - out["started"]
        by: dict = {}
        for pid, _, _ in served.values():
            by[pid] = by.get(pid, 0) + 1
        print(
            f"ready after {out['ready_after']:.0f} s, {sent} requests (per API server pid: {by}), "
            f"stopped in {out['stop_s']:.0f} s, {out['total_s']:.0f} s in all"
        )
        yield out
    finally:
        if server is not None:
            with contextlib.suppress(Exception):
                server.stop(signal.SIGKILL, 60)
            # vLLM-Omni's own leftovers (real_server/README.md).
            with contextlib.suppress(OSError):
                omni.remove_wake_dirs(server.log_path.read_text(errors="replace"))
            # What the server left under its launcher's name (looked for
            # above): removed, so that a failed run leaves nothing behind.
            if server.pid is not None:
                for p in launcher_files(server.pid):
                    with contextlib.suppress(OSError):
                        if os.path.isdir(p) and not os.path.islink(p):
                            shutil.rmtree(p)
                        else:
                            os.unlink(p)
        if phoenix is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(phoenix.pid, signal.SIGKILL)
            phoenix.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)


def _ms(snapshot: dict, event: str):
    return (snapshot.get(EDGE) or {}).get(f"{event}_ms")


def test_vllm_omni_serves_with_two_api_servers_and_both_serve(run):
    assert sorted(run["api_servers"]) == list(range(API_SERVERS)), run["api_servers"]
    assert run["errors"] == [], run["errors"]
    assert len(run["replies"]) == run["sent"] == len(run["served"]), (run["sent"], run["served"])
    assert {status for _, _, status in run["served"].values()} == {"ok"}, run["served"]
    by = {}
    for pid, _, _ in run["served"].values():
        by[pid] = by.get(pid, 0) + 1
    # Both API servers served some of the requests.
    assert set(by) == set(run["api_servers"].values()), by
    for kind, body in run["replies"]:
        if kind == "wav":
            assert omni.wav_samples(body) > 0
        else:
            assert len(omni.pcm_of(body)) > 0 and body[-1][0] == "speech.audio.done", body[-3:]


def test_every_process_records_into_one_region_and_says_so(run):
    said = run["said"]  # (process name, pid, what was patched, region)
    api_pids = set(run["api_servers"].values())
    # Each API server records: it patched the orchestrator's call sites.
    api = sorted((pid, what) for _, pid, what, _ in said if pid in api_pids)
    assert api == sorted((pid, "orchestrator, transfer adapter, model runner connector") for pid in api_pids), (
        said,
        run["warnings"],
    )
    stages = [what for name, _, what, _ in said if name.startswith("StageEngineCoreProc")]
    assert stages == ["transfer adapter, model runner connector"] * 2, said
    # One region, every line naming it; no process refused it.
    assert len(run["regions"]) == 1 and run["region"] is not None, said
    assert run["warnings"] == [], run["warnings"]


def test_the_launcher_names_the_region(run):
    region = run["region"]
    assert region is not None, run["said"]
    assert os.path.dirname(region) == edgemark.default_dir(), region
    assert re.fullmatch(rf"{PREFIX}{run['launcher']}-[0-9a-f]{{16}}\.region", os.path.basename(region)), region


def test_every_request_is_recorded_by_the_api_server_that_served_it(run):
    unrecorded = {}
    for rid, (pid, stream, _) in run["served"].items():
        mine = closes_of(rid, run["closed"])
        if len(mine) != 1:
            unrecorded[rid] = (f"API server pid {pid}", f"stream={stream}", f"{len(mine)} close lines")
    assert unrecorded == {}, (
        f"{len(unrecorded)} of {len(run['served'])} served requests without exactly one close line",
        unrecorded,
        f"API servers {run['api_servers']}",
        run["warnings"],
    )
    for rid, (pid, _, _) in run["served"].items():
        ((closer, final),) = closes_of(rid, run["closed"])
        assert closer == pid, (rid, closer, pid)
        assert set(final) == {EDGE}, (rid, final)
        assert [e for e in EVENTS if _ms(final, e) is None] == [], (rid, final)
        assert final[EDGE]["from_stage"] == 0 and final[EDGE]["to_stage"] == 1


def test_the_events_keep_the_orders_causality_fixes(run):
    for rid in run["served"]:
        for _, final in closes_of(rid, run["closed"]):
            emit, send, accept, output = (_ms(final, e) for e in EVENTS)
            assert None not in (emit, send, accept, output), (rid, final)
            assert emit <= send <= output and emit <= accept <= output, (rid, final)


def test_each_api_server_holds_a_shared_lock_on_the_region(run):
    assert "flocks" in run, (run["regions"], "no region to look at")
    holders = {pid for mode, pid in run["flocks"] if mode == "READ"}
    assert holders >= set(run["api_servers"].values()), (run["flocks"], run["api_servers"])
    assert [f for f in run["flocks"] if f[0] != "READ"] == [], run["flocks"]


def test_nothing_is_left_open(run):
    assert run.get("open_before_stop") == [], run.get("open_before_stop")


def test_sigterm_ends_every_process_and_removes_the_region_and_its_lookup(run):
    assert run["processes"] >= 2 + API_SERVERS and run["left"] == [], run["left"]
    assert run["region"] is not None
    assert not run["region_after"] and not run["lookup_after"]
    assert run["launcher_files_after"] == [], run["launcher_files_after"]


def test_one_api_server_exports_and_every_request_is_in_phoenix_once(run):
    elected = _ELECTED.findall(run["log"])
    # One line, by an API server, about the region.
    assert len(elected) == 1, elected
    (pid, region) = elected[0]
    assert int(pid) in set(run["api_servers"].values()) and region == run["region"], (elected, run["api_servers"])
    assert len(run["traces"]) >= len(run["served"])
    for trace, requests in run["phoenix"].items():
        assert len(requests) == 1, (trace, requests)


def test_the_server_s_own_metrics_have_the_region_s_families_once(run):
    closed = len(run["closed"])
    for text in run["metrics"]:
        _live.one_set_of_families(text)
        assert _live.sample(text, "edgemark_closed_requests_total") == closed
    _live.promtool_check(_live.edgemark_part(run["metrics"][0]))
