"""Two simulated hosts for the tests that cross hosts: network namespaces
joined by a bridge, each with its own ``/dev/shm`` in a mount namespace of
its own (as ``cli/tests/otlp.rs`` makes them), processes run inside a host
and stopped by their saved pid (their process group), Arize Phoenix on the
bridge, one ``edgemark export --otlp`` per host, and reading Phoenix's spans.

Shared by ``test_vllm_omni_hosts.py`` and ``test_vllm_pd_hosts.py``. Every
namespace and link made is deleted by its saved name in ``Hosts.close``.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import threading
import time

import _live
from _live import http_get, phoenix_spans

#: How long a step waits for something to happen before failing (a bound
#: on a wait, never a timing that is asserted).
PATIENCE_S = 600.0


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
        #: Every line of its standard output so far.
        self.said: list = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.p.stdout:
            self.said.append(line)
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

    def output(self) -> str:
        """Its standard output so far, whole."""
        return "".join(self.said)

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

    def __init__(self, log_dir: str, shm_size: str = "256m") -> None:
        """``shm_size``: each host's ``/dev/shm`` (vLLM's multiprocess
        executor asks 240 MiB of it per engine core)."""
        self.log_dir = log_dir
        self.namespaces: list = []
        self.links: list = []
        self.procs: list = []
        self._next_port = 20000
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
                 f"mount -t tmpfs -o size={shm_size} tmpfs /dev/shm && echo up && exec sleep 100000"],
            )
            assert holder.line().strip() == "up", holder.log()
            self.holder[h] = holder

    def port(self) -> int:
        """A TCP port for a listener inside either host. The hosts'
        network namespaces are new, so nothing listens there but what the
        test starts: ports are counted up from 20000, below the range
        (32768-60999 by default) that the kernel gives connections and
        ``bind(0)``."""
        self._next_port += 1
        return self._next_port

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
    """Arize Phoenix (``binary``, its ``phoenix`` command) on the bridge's
    address, reachable from both hosts."""

    def __init__(self, hosts: Hosts, work: str, binary: str) -> None:
        ip_ = hosts.bridge_ip
        self.port = free_port(ip_)
        env = _live.phoenix_env(ip_, self.port, free_port(ip_), os.path.join(work, "phoenix"))
        self.proc = hosts.spawn("phoenix", [binary, "serve"], env)
        self.url = f"http://{ip_}:{self.port}"

    def wait_up(self) -> None:
        wait_for("Phoenix to answer /healthz", lambda: (http_get(self.url + "/healthz") or (0,))[0] == 200)

    def spans(self, trace_id: str) -> list:
        return phoenix_spans(self.url, trace_id)


def start_exporter(hosts: Hosts, h: str, url: str, region: str, edgemark: str) -> str:
    """``edgemark export REGION --otlp URL`` (``edgemark``: the command)
    inside host ``h``, with the host's service and host name; returns the
    URL of its ``/metrics`` (on the host's address, reachable over the
    bridge)."""
    env = {
        **os.environ,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_SERVICE_NAME": f"edgemark-host-{h}",
        "OTEL_RESOURCE_ATTRIBUTES": f"host.name=host-{h}",
    }
    argv = [edgemark, "export", region, "--otlp", url, "--listen", f"{hosts.addr[h]}:0"]
    p = hosts.on(h, f"export-{h}", argv, env)
    said = p.line() + p.line()
    assert said.startswith("sending closed requests"), f"host {h}: {said!r}\n{p.log()}"
    metrics = [w for w in said.split() if w.startswith("http://") and w.endswith("/metrics")]
    assert metrics, f"host {h}: {said!r}"
    return metrics[0]


# ---------------------------------------------------------------------------
# Reading spans.


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
