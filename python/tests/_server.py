"""A real server under test as a process group of its own, and the HTTP a
test speaks to it: what the real-server suites share (``real_server/``:
``vllm-omni serve``; ``real_vllm/``: the ``vllm serve`` instances of a P/D
pair), written once.

Test support, standard library only, so it imports with the Python of any
environment the servers run in. ``real_server/server.py`` and
``real_vllm/server.py`` put this directory on ``sys.path`` themselves: CI,
the benches and the tests import them from their own directories.

``ServerProcess`` runs a subclass's ``command()`` in a session of its own,
so that the API server, its engine cores and their workers share one
process group that ``stop`` clears: SIGTERM to the leader, then SIGKILL to
whatever of the group is left.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

HOST = "127.0.0.1"

# The default cache for the environments and the tiny models; tests take
# theirs from an argument or the environment.
DEFAULT_CACHE_DIR = "/var/cache/edgemark"

# What a server's environment needs on the CPU: 1 GiB of KV cache (per
# stage, for vLLM-Omni), no model hub, one OpenMP thread per process.
CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
}


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def bin_dir(python: str | os.PathLike) -> Path:
    """The ``bin`` directory of the environment of `python`."""
    # Not resolved: a venv's python is a symlink to the base interpreter.
    return Path(python).absolute().parent


def group_pids(pgid: int) -> list[int]:
    """Live processes whose process group is `pgid` (from /proc)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # Fields after the command name, which is in parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry))
    return sorted(pids)


class ServerDied(RuntimeError):
    """The server process ended before it was ready."""


class ServerProcess:
    """A server's process group (context manager: start, stop); a subclass
    says its ``command`` and what its environment needs (``server_env``).

    `env` is laid over this process's environment without its ``EDGEMARK_*``
    variables and over ``server_env()``: the edgemark plugins stay off unless
    `env` switches one on. `host` is the address the server listens on.
    """

    #: The command, as the errors name it.
    name = "server"

    def __init__(
        self,
        python: str | os.PathLike,
        port: int,
        env: dict[str, str] | None = None,
        log_path: str | os.PathLike | None = None,
        extra_args: tuple[str, ...] = (),
        host: str = HOST,
    ):
        self.python = Path(python)
        self.host = host
        self.port = int(port)
        self.env = dict(env or {})
        self.log_path = Path(log_path) if log_path is not None else Path(tempfile.mkstemp(suffix=".log")[1])
        self.extra_args = tuple(extra_args)
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None
        self.started_at: float | None = None
        self.ready_after: float | None = None

    # ------------------------------------------------------------ process

    def command(self) -> list[str]:
        raise NotImplementedError

    def server_env(self) -> dict[str, str]:
        """What the server's environment needs, under `env`."""
        return {}

    def environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("EDGEMARK_", "_EDGEMARK_"))}
        env.update(self.server_env())
        env.update(self.env)
        # The environment's bin first, as an activated venv would have it.
        env["PATH"] = f"{bin_dir(self.python)}{os.pathsep}{env.get('PATH', '')}"
        return env

    def start(self):
        if self.proc is not None:
            raise RuntimeError("server already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command(),
                env=self.environ(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self.proc.pid
        self.started_at = time.monotonic()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def group_pids(self) -> list[int]:
        """Live processes of the server's process group (the leader included)."""
        return group_pids(self.pid) if self.pid is not None else []

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_ready(self, timeout: float = 300.0) -> float:
        """Waits until ``GET /health`` answers 200; returns the seconds since
        `start`."""
        if self.proc is None or self.started_at is None:
            raise RuntimeError("server not started")
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                raise ServerDied(
                    f"{self.name} exited with {self.proc.returncode} before it was ready; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if health(self.port, self.host):
                self.ready_after = time.monotonic() - self.started_at
                return self.ready_after
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.name} not ready after {timeout:.0f} s; log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(1.0)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int | None:
        """Sends `sig` to the group leader and waits up to `timeout` for the
        whole group to end; then SIGKILLs whatever of the group is left.
        Returns the leader's exit code (None if it was never started)."""
        if self.proc is None or self.pid is None:
            return None
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        # The leader gone, the processes it started may still be winding down.
        while self.group_pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.group_pids():
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            end = time.monotonic() + 10
            while self.group_pids() and time.monotonic() < end:
                time.sleep(0.2)
        return self.proc.returncode

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ------------------------------------------------------------------ requests


class HTTPError(RuntimeError):
    """A request the server answered with another status than 200."""

    #: The request, as the message names it.
    what = "request"

    def __init__(self, status: int, body: bytes):
        super().__init__(f"{self.what} failed: HTTP {status}: {body[:500]!r}")
        self.status = status
        self.body = body


def health(port: int, host: str = HOST) -> bool:
    """Whether ``GET /health`` answers 200."""
    conn = http.client.HTTPConnection(host, port, timeout=2)
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        resp.read()
        return resp.status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def post(
    port: int,
    path: str,
    body: dict,
    headers: dict[str, str],
    timeout: float,
    error: type[HTTPError] = HTTPError,
    host: str = HOST,
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """``POST path`` with `body` as JSON and `headers`: the connection and
    its response, for the caller to read and close; a status other than 200
    raises `error`."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json", **headers}
        conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            raise error(resp.status, resp.read())
    except BaseException:
        conn.close()
        raise
    return conn, resp
