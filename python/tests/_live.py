"""What the tests against live components share (a real vLLM-Omni, Arize
Phoenix, the ``edgemark`` command): how they are found or skipped, and how a
test waits for them and reads them over HTTP.

A missing component skips the module, unless ``EDGEMARK_REQUIRE_VLLM_OMNI=1``,
``EDGEMARK_REQUIRE_VLLM=1`` or ``EDGEMARK_REQUIRE_OTEL=1`` (CI sets them for
the steps that have the component), which makes it a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

#: The edge each real pipeline of the tests records into (P/D: prefill to
#: decode; vLLM-Omni: stage 0 to stage 1), and its four events in order.
EDGE = "0->1:0"
EVENTS = (
    "producer_first_nonempty_emit",
    "edge_first_send_complete",
    "consumer_first_accept",
    "consumer_first_nonempty_output",
)


_REQUIRE = ("EDGEMARK_REQUIRE_VLLM_OMNI", "EDGEMARK_REQUIRE_VLLM", "EDGEMARK_REQUIRE_OTEL")


def required() -> bool:
    return any(os.environ.get(v) == "1" for v in _REQUIRE)


def missing(what: str) -> None:
    """Skips the calling module for ``what``, or fails where CI requires it."""
    if required():
        raise RuntimeError(f"{'/'.join(v for v in _REQUIRE if os.environ.get(v) == '1')}=1 but {what}")
    pytest.skip(what, allow_module_level=True)


def need_vllm_omni() -> None:
    """Skips where vllm-omni is not installed (the plain test run): only
    ``EDGEMARK_REQUIRE_VLLM_OMNI=1`` makes that a failure."""
    if importlib.util.find_spec("vllm_omni") is None:
        if os.environ.get("EDGEMARK_REQUIRE_VLLM_OMNI") == "1":
            raise RuntimeError("EDGEMARK_REQUIRE_VLLM_OMNI=1 but vllm_omni is not installed")
        pytest.skip("vllm-omni is not installed", allow_module_level=True)


def need_vllm_nixl() -> None:
    """Skips where vLLM or NIXL is not installed (the plain test run): only
    ``EDGEMARK_REQUIRE_VLLM=1`` makes that a failure."""
    for module, what in (("vllm", "vllm is not installed"), ("nixl", "nixl is not installed (.ci/vllm-nixl)")):
        if importlib.util.find_spec(module) is None:
            if os.environ.get("EDGEMARK_REQUIRE_VLLM") == "1":
                raise RuntimeError(f"EDGEMARK_REQUIRE_VLLM=1 but {what}")
            pytest.skip(what, allow_module_level=True)


def load_support(directory: str, name: str, file: str):
    """The test-support module ``directory/file``, imported as ``name``
    (the support directories are not packages: each also runs with the
    Python of the environment under test)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(directory, file))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def phoenix_bin() -> str:
    """Arize Phoenix's command, in the environment ``EDGEMARK_OTEL_VENV`` names."""
    venv = os.environ.get("EDGEMARK_OTEL_VENV")
    if not venv:
        missing("EDGEMARK_OTEL_VENV is not set: no Phoenix")
    p = os.path.join(venv, "bin", "phoenix")
    if not os.path.isfile(p):
        missing(f"arize-phoenix is not installed in {venv}")
    return p


def edgemark_bin() -> str:
    """The ``edgemark`` command: ``EDGEMARK_CLI``, else the workspace's debug build."""
    p = os.environ.get("EDGEMARK_CLI") or os.path.join(ROOT, "target", "debug", "edgemark")
    if not os.path.isfile(p):
        missing(f"no edgemark command at {p} (cargo build -p edgemark-cli, or set EDGEMARK_CLI)")
    return p


def wait_for(what: str, check, timeout: float, on_fail=lambda: ""):
    """``check()``'s first true value, polled; an ``AssertionError`` naming
    ``what`` (and ``on_fail()``) after ``timeout`` seconds: a bound on a
    wait, never a timing that is asserted."""
    deadline = time.monotonic() + timeout
    while True:
        v = check()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout}s for {what}\n{on_fail()}")
        time.sleep(0.2)


def http_get(url: str):
    """``(status, body)``, or ``None`` while nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except Exception:  # noqa: BLE001 - not answering (yet)
        return None


def phoenix_env(host: str, port: int, grpc_port: int, work: str) -> dict:
    """The environment Arize Phoenix's ``phoenix serve`` runs with: this
    process's, listening on ``host:port`` (and ``grpc_port``), its data in
    ``work``, no telemetry of its own."""
    return {
        **os.environ,
        "PHOENIX_HOST": host,
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_WORKING_DIR": str(work),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }


def phoenix_spans(url: str, trace_id: str) -> list:
    """The spans Phoenix at ``url`` holds for ``trace_id``."""
    got = http_get(f"{url}/v1/projects/default/spans?trace_id={trace_id}&limit=1000")
    if not got or got[0] != 200:
        return []
    return json.loads(got[1]).get("data") or []


def metric(url: str, name: str) -> float:
    """The value of the unlabelled sample ``name`` in the scrape at ``url``."""
    got = http_get(url)
    assert got and got[0] == 200, url
    for line in got[1].splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} in\n{got[1]}")


def server_metrics(url: str) -> str:
    """The classic text a server's ``/metrics`` at ``url`` answers (no
    ``Accept`` header: what ``promtool check metrics`` reads)."""
    got = http_get(url)
    assert got and got[0] == 200, f"{url}: {got}"
    return got[1]


def edgemark_part(text: str) -> str:
    """The lines of the edgemark families in a scrape (``edgemark_*`` samples
    and their HELP and TYPE lines), in order."""
    keep = []
    for line in text.splitlines():
        name = line.split()[2] if line.startswith(("# HELP ", "# TYPE ")) and len(line.split()) > 2 else line
        if name.startswith("edgemark_"):
            keep.append(line)
    return "\n".join(keep) + "\n"


def promtool_check(text: str) -> None:
    """``promtool check metrics`` (Debian's prometheus package) passes on
    ``text``; skipped where promtool is missing unless a real run is
    required (``missing``)."""
    import shutil
    import subprocess

    tool = shutil.which("promtool")
    if tool is None:
        missing("promtool is not installed (Debian's prometheus package)")
    out = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"promtool check metrics:\n{out.stdout}{out.stderr}\n{text[:3000]}"


def one_set_of_families(text: str) -> dict:
    """The edgemark families of a scrape by name, each with its TYPE line
    counted: exactly one each (no family repeated), else an assertion."""
    types: dict = {}
    for line in text.splitlines():
        if line.startswith("# TYPE edgemark_"):
            name = line.split()[2]
            types[name] = types.get(name, 0) + 1
    assert types, f"no edgemark family in\n{text[:3000]}"
    assert all(n == 1 for n in types.values()), {k: n for k, n in types.items() if n != 1}
    return types


def sample(text: str, name: str) -> float:
    """The value of the unlabelled sample ``name`` in ``text``."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no sample {name} in\n{text[:3000]}")


class Prometheus:
    """A real Prometheus server (Debian's package) scraping ``target``
    (``host:port``, its ``/metrics``) every second, on a free port, its data
    in ``work``; stopped by its saved pid (``stop``)."""

    def __init__(self, target: str, work: str) -> None:
        import shutil
        import socket
        import subprocess

        binary = shutil.which("prometheus")
        if binary is None:
            missing("prometheus is not installed (Debian's prometheus package)")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        os.makedirs(work, exist_ok=True)
        config = os.path.join(work, "prometheus.yml")
        with open(config, "w") as f:
            f.write(
                "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: server\n"
                f"    static_configs:\n      - targets: ['{target}']\n"
            )
        self.log_path = os.path.join(work, "prometheus.log")
        with open(self.log_path, "wb") as log:
            self.p = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={os.path.join(work, 'data')}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.pid = self.p.pid
        self.url = f"http://127.0.0.1:{self.port}"

    def query(self, expr: str) -> list:
        """The instant vector ``expr`` gives now (``[]`` while it answers
        nothing)."""
        import urllib.parse

        got = http_get(f"{self.url}/api/v1/query?query={urllib.parse.quote(expr)}")
        if not got or got[0] != 200:
            return []
        return json.loads(got[1]).get("data", {}).get("result") or []

    def stop(self) -> None:
        import signal

        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait(timeout=60)
