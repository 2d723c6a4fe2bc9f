"""Real P/D pairs deployed the way containers run them: each ``vllm serve``
PID 1 of a PID namespace of its own (``unshare --pid --fork --mount-proc``),
the pair sharing one ``/dev/shm`` (a directory made for the test and bound
over ``/dev/shm`` in each instance's mount namespace, as a pod's shared
memory volume is), NixlConnector between them, the installed plugin switched
on as a user does it (``EDGEMARK_VLLM=1``); instances SIGKILLed as the OOM
killer does it, and started again in new namespaces.

``TestContainers``, one pair with the plugin's default region names (no
``EDGEMARK_VLLM_REGION``):

- each instance's API server is PID 1 inside, and each names its own region
  (``edgemark-vllm-1-<16 hex>.region``, its lookup directory beside it);
  per request, by trace, the prefill instance's region holds emit and send
  complete, the decode instance's accept and first output;
- the prefill instance SIGKILLed with a request open, started again in a new
  namespace: it names a new region and records; ``python -m edgemark.vllm
  clean``, run in a container of its own over the same ``/dev/shm`` while
  both instances serve, removes the killed instance's region and lookup and
  nothing else, and both live regions record afterwards;
- SIGTERM to each PID 1 ends its container and leaves no region behind.

``TestLeaks``, one pair sharing one named region (``EDGEMARK_VLLM_REGION``),
8 slots, ``EDGEMARK_VLLM_MAX_OPEN_S`` = 60:

- the decode instance SIGKILLed while it decodes some requests and others
  wait for it: every request it left open closes within the bound (counted
  in ``expired_requests``); after its restart, 4 x 8 requests all record all
  four events, no begin is refused (``refused.region_full`` 0), and no
  request stays open;
- the named region outlives whichever server stops first and is removed
  with the last one.

Regions are read from inside the instance's own PID namespace (``nsenter``):
an attach for writing from another one would mark the region's pids as not
judged (docs/limitations.md), which the deployment under test does not do.
Each instance runs one unbound OpenMP thread (``real_vllm/server.py``), the
prefill instance a long KV lease, as in ``test_vllm_pd.py``.

Needs vLLM with NIXL (``.ci/vllm-cpu-env``, ``.ci/vllm-nixl``), root,
``unshare``, ``nsenter`` and ``mount`` (util-linux), and builds the tiny
model (``real_vllm/tiny_qwen3.py``) into ``EDGEMARK_QWEN3_MODEL`` (default:
a temporary directory). Where one is missing the module is skipped, unless
``EDGEMARK_REQUIRE_VLLM=1``, which makes it fail. Every process started is
stopped through its namespace's PID 1 and its process group, on failure too,
and each shared directory is removed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from _live import EDGE, EVENTS, load_support, missing, need_vllm_nixl, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
SUPPORT = os.path.join(HERE, "real_vllm")
#: A bound on each wait for a server, never a timing that is asserted.
PATIENCE_S = 900.0
#: A bound on each HTTP step of a request, never a timing that is asserted.
STEP_S = 600.0
#: The prefill instance's KV lease (see test_vllm_pd.py).
LEASE_S = 120
#: A bound on a server's own exit after SIGTERM.
STOP_S = 120.0
#: The leak pair: its region's slots, the bound on open requests, and what
#: the bound may be late by on a loaded 2-core machine (the plugin checks
#: every few seconds). The bound is above the slowest hand-off seen here (a
#: new pair's first one took over 30 s on the loaded machine, and 30 s
#: closed it early); the wait for it runs while the killed instance starts
#: again, which takes longer.
SLOTS = 8
MAX_OPEN_S = 60
EXPIRE_SLACK_S = 30.0
#: The leak pair's prefill lease: far longer than the bound, so that a
#: request the killed decode instance left open is closed by the bound, not
#: by NIXL releasing its blocks.
LEAK_LEASE_S = 300
#: Tokens a decode of the leak test's first requests generates: enough for
#: the decode instance to be busy with them when it is killed.
LONG_TOKENS = 1500
#: Long requests decoding (two at a time) when the decode instance is killed.
LONG_REQUESTS = 4
#: Requests prefilled and never handed over: the decode instance dies first.
HELD_REQUESTS = 2
PREFILL_EVENTS, DECODE_EVENTS = EVENTS[:2], EVENTS[2:]
#: The name the plugin gives a region in a container (its API server is PID 1).
REGION_NAME = re.compile(r"edgemark-vllm-1-[0-9a-f]{16}\.region")
#: What either plugin names in the default directory.
PLUGIN_FILE = re.compile(r"edgemark-vllm-.*\.(region|requests)")
#: Each instance's ``/dev/shm``: the pair's shared directory, bound over it.
BIND = 'mount --bind "$0" /dev/shm && exec "$@"'


need_vllm_nixl()
if os.geteuid() != 0:
    missing("the deployment test needs root (PID and mount namespaces)")
TOOLS = {}
for _tool in ("unshare", "nsenter", "mount", "sh"):
    TOOLS[_tool] = shutil.which(_tool)
    if TOOLS[_tool] is None:
        missing(f"the deployment test needs `{_tool}` (util-linux)")
pd = load_support(SUPPORT, "real_vllm_server", "server.py")
tiny = load_support(SUPPORT, "real_vllm_tiny_qwen3", "tiny_qwen3.py")

_salts = itertools.count(1000)


def traceparent() -> str:
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def plain_env() -> dict:
    """This environment without edgemark's variables (no region named by hand)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("EDGEMARK_", "_EDGEMARK_"))}


# ---------------------------------------------------------------------------
# Processes and namespaces, from /proc.


def ppid_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def ns_pids(pid: int) -> list:
    """The pid of ``pid`` in each PID namespace it is in, outermost first."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    raise AssertionError(f"no NSpid line for {pid}")


def pid_ns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/pid")


def cmdline(pid: int) -> list:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]


def mapped_regions(pid: int) -> set:
    """The region files ``pid`` maps (their names)."""
    names = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.rstrip("\n").split(maxsplit=5)
            path = fields[5].removesuffix(" (deleted)") if len(fields) == 6 else ""
            if path.endswith(".region"):
                names.add(os.path.basename(path))
    return names


def plugin_files(shm: str) -> set:
    return {n for n in os.listdir(shm) if PLUGIN_FILE.fullmatch(n)}


def lookup_of(region: str) -> str:
    return region.removesuffix(".region") + ".requests"


class NsServer(pd.VllmServer):
    """A ``VllmServer`` as a container runs it: ``vllm serve`` exec'd as PID
    1 of a new PID namespace (``unshare --fork``: the process ``unshare``
    forks is the namespace's PID 1) with its own ``/proc``, and ``shm`` bound
    over ``/dev/shm`` in its mount namespace.

    ``unshare`` itself ignores SIGTERM and forwards nothing, and PID 1 of a
    namespace gets only the signals it handles: ``stop`` signals the PID 1
    and waits for the whole process group (``unshare``, PID 1 and every
    process vLLM started), SIGKILLing what is left after ``timeout``."""

    def __init__(self, shm: str, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.shm = shm
        #: Whether the last ``stop`` saw the group end with no SIGKILL.
        self.ended_by_itself: bool | None = None

    def command(self) -> list:
        return [TOOLS["unshare"], "--pid", "--fork", "--mount-proc", "--", TOOLS["sh"], "-c", BIND, self.shm,
                *super().command()]  # fmt: skip

    def init_pid(self) -> int | None:
        """The namespace's PID 1, by its pid here: ``unshare``'s child."""
        if self.pid is None:
            return None
        for p in self.group_pids():
            if ppid_of(p) == self.pid:
                return p
        return None

    def region(self) -> str | None:
        """The region file its API server (PID 1) maps, if exactly one."""
        init = self.init_pid()
        names = mapped_regions(init) if init else set()
        return names.pop() if len(names) == 1 else None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_S) -> int | None:
        if self.proc is None:
            return None
        init = self.init_pid()
        if init is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, sig)
        deadline = time.monotonic() + timeout
        while self.group_pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.ended_by_itself = not self.group_pids()
        return super().stop(signal.SIGKILL, timeout=10.0)

    def kill(self) -> None:
        """SIGKILL, as the OOM killer or a container runtime gives it: PID 1
        (the kernel then kills the rest of the namespace) and the group."""
        init = self.init_pid()
        if init is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        wait_for(f"the killed group {self.pid} to be gone", lambda: not self.group_pids(), 60.0)


def in_container(shm: str, argv: list, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """``argv`` run as PID 1 of a container of its own over ``shm`` (a
    one-off job in the pod: the operator's clean-up, say)."""
    return subprocess.run(
        [TOOLS["unshare"], "--pid", "--fork", "--mount-proc", "--", TOOLS["sh"], "-c", BIND, shm, *argv],
        capture_output=True, text=True, timeout=timeout, env=plain_env(), cwd="/",
    )  # fmt: skip


# ---------------------------------------------------------------------------
# Reading a region from inside an instance's namespace.

_READ = r"""
import json, sys
import edgemark
r = edgemark.Region.attach(sys.argv[1])
closed = r.drain_closed(100000)
opened = []
for token, snap in r.snapshot_open():
    tp = r.traceparent(token)
    opened.append({"trace_id": tp.split("-")[1] if tp else None, "snapshot": snap})
print(json.dumps({"closed": closed, "open": opened, "counters": r.counters(), "info": r.info()}, default=str))
"""


def read_region(init_pid: int, name: str) -> dict:
    """What the region ``/dev/shm/<name>`` holds, read by a process in the
    PID and mount namespaces of ``init_pid``: its closed requests (taken),
    its open ones by trace, its counters and header."""
    out = subprocess.run(
        [TOOLS["nsenter"], "--target", str(init_pid), "--pid", "--mount", "--",
         sys.executable, "-c", _READ, f"/dev/shm/{name}"],
        capture_output=True, text=True, timeout=120, env=plain_env(), cwd="/",
    )  # fmt: skip
    if out.returncode != 0:
        raise AssertionError(f"reading /dev/shm/{name} in the namespace of {init_pid} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


class Reader:
    """One region's closed requests by trace, taken from inside the
    namespace of ``server``'s PID 1, and what it said last."""

    def __init__(self, server: NsServer, name: str) -> None:
        self.server, self.name = server, name
        self.closed: dict = {}
        self.last: dict = {}
        self.lock = threading.Lock()

    def read(self) -> dict:
        with self.lock:
            init = self.server.init_pid()
            assert init is not None, f"no PID 1 to read {self.name} in:\n{self.server.log_tail()}"
            got = read_region(init, self.name)
            for c in got["closed"]:
                self.closed[c["trace_id"]] = c
            self.last = got
            return got

    def status(self) -> str:
        last = dict(self.last)
        last.pop("closed", None)
        return json.dumps(last, sort_keys=True)[-4000:]

    def wait_closed(self, traces, timeout: float) -> None:
        want = set(traces)
        wait_for(
            f"{len(want)} requests closed in {self.name}",
            lambda: (self.read() and want <= set(self.closed)),
            timeout,
            lambda: f"missing {sorted(want - set(self.closed))}; {self.status()}",
        )


def segment(entry: dict) -> dict:
    return entry["snapshot"].get(EDGE) or {}


def events_of(entry: dict) -> dict:
    seg = segment(entry)
    return {e: seg.get(e + "_ms") for e in EVENTS}


# ---------------------------------------------------------------------------
# Requests.


def send(prefill, decode, name: str, max_tokens: int = 4) -> str:
    """One request through both steps, in a trace of its own; its trace ID."""
    tp = traceparent()
    _, second = pd.pd_complete(
        prefill.port, decode.port, pd.prompt_of(167, next(_salts)), max_tokens, request_id=f"pd-{name}",
        traceparent=tp, model=prefill.model_dir, timeout=STEP_S,
    )
    assert second["usage"]["completion_tokens"] == max_tokens
    return tp.split("-")[1]


def send_many(prefill, decode, prefix: str, n: int, at_once: int, max_tokens: int = 4) -> list:
    """``n`` requests, ``at_once`` at a time; their trace IDs."""
    traces: list = []
    errors: list = []

    def worker(k: int) -> None:
        for i in range(k, n, at_once):
            try:
                traces.append(send(prefill, decode, f"{prefix}{i}", max_tokens))
            except BaseException as e:  # noqa: BLE001 - raised below, in the test's thread
                errors.append(e)
                return

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(at_once)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(traces) == n
    return traces


def assert_split(prefill_reader: Reader, decode_reader: Reader, traces) -> None:
    """Per trace: the prefill instance's region holds emit and send
    complete only, the decode instance's accept and first output only, each
    on the host clock, in the order causality fixes."""
    for reader, mine, others in ((prefill_reader, PREFILL_EVENTS, DECODE_EVENTS),
                                 (decode_reader, DECODE_EVENTS, PREFILL_EVENTS)):  # fmt: skip
        reader.wait_closed(traces, STEP_S)
        for t in traces:
            at = events_of(reader.closed[t])
            assert all(at[e] is not None for e in mine), (reader.name, t, at)
            assert all(at[e] is None for e in others), (reader.name, t, at)
            assert set(segment(reader.closed[t])["clock_domains"].values()) == {"host_monotonic"}, (reader.name, t)
            assert at[mine[0]] <= at[mine[1]], (reader.name, t, at)


@pytest.fixture(scope="module")
def model():
    with tiny.made(os.environ.get("EDGEMARK_QWEN3_MODEL")) as where:
        yield where


@contextlib.contextmanager
def shared_shm():
    """A directory of the host's ``/dev/shm`` that a pair's containers bind
    over theirs; removed afterwards."""
    shm = tempfile.mkdtemp(prefix="edgemark-pd-deploy-", dir="/dev/shm")
    try:
        yield shm
    finally:
        shutil.rmtree(shm, ignore_errors=True)


class Pair:
    """Two containers' instances over one shared ``/dev/shm``."""

    def __init__(self, model: str, shm: str, logs, env: dict, prefill_kv: dict, decode_args=()) -> None:
        self.model, self.shm, self.logs, self.env = model, shm, logs, env
        self.prefill_kv, self.decode_args = prefill_kv, tuple(decode_args)
        self.started: list = []
        self.prefill = self.decode = None
        self._n = itertools.count()

    def new(self, role: str) -> NsServer:
        """A new instance of ``role`` in new namespaces, on new ports, started."""
        srv = NsServer(
            self.shm, sys.executable, self.model, pd.free_port(), pd.free_port(), env=self.env,
            log_path=self.logs / f"{role}-{next(self._n)}.log", nice=5,
            kv_extra=self.prefill_kv if role == "prefill" else None,
            extra_args=self.decode_args if role == "decode" else (),
        )  # fmt: skip
        self.started.append(srv)
        srv.start()
        setattr(self, role, srv)
        return srv

    def warm_up(self) -> None:
        # Each new pairing's first hand-off does NIXL's handshake, retried;
        # a prompt no instance has seen, so that there are blocks to load.
        pd.warm_up(self.prefill.port, self.decode.port, timeout=STEP_S, salt=next(_salts))

    def stop(self) -> None:
        # After a failure too: a server still starting has no SIGTERM
        # handler yet, which a PID 1 then ignores; it is SIGKILLed soon.
        for srv in reversed(self.started):
            srv.stop(timeout=30.0)


# ---------------------------------------------------------------------------
# One pair, default region names.


@pytest.fixture(scope="class")
def containers(model, tmp_path_factory):
    """``TestContainers``' pair: default region names; stopped after the class."""
    logs = tmp_path_factory.mktemp("pd-deploy")
    # VLLM_PLUGINS: vLLM's allow-list, so that the vLLM-Omni plugins this
    # environment also carries stay out of a plain vLLM server.
    env = {"EDGEMARK_VLLM": "1", "VLLM_PLUGINS": "edgemark_vllm"}
    with shared_shm() as shm:
        p = Pair(model, shm, logs, env, {"kv_lease_duration": LEASE_S})
        try:
            p.new("prefill")
            p.new("decode")
            p.prefill.wait_ready(PATIENCE_S)
            p.decode.wait_ready(PATIENCE_S)
            p.warm_up()
            yield p
        finally:
            p.stop()


class TestContainers:
    def readers(self, pair) -> tuple:
        regions = {role: getattr(pair, role).region() for role in ("prefill", "decode")}
        assert all(regions.values()), f"an API server maps no region, or several: {regions}"
        return Reader(pair.prefill, regions["prefill"]), Reader(pair.decode, regions["decode"])

    def test_each_container_names_its_own_region_and_records_its_side(self, containers):
        pair = containers
        namespaces = {pid_ns(os.getpid())}
        for srv in (pair.prefill, pair.decode):
            init = srv.init_pid()
            assert init is not None, srv.log_tail()
            # The API server itself is PID 1 inside (sh exec'd it), in a PID
            # namespace of its own.
            assert ns_pids(init)[-1] == 1 and len(ns_pids(init)) == 2, ns_pids(init)
            assert "serve" in cmdline(init) and pair.model in cmdline(init), cmdline(init)
            namespaces.add(pid_ns(init))
        assert len(namespaces) == 3
        files = plugin_files(pair.shm)
        regions = {n for n in files if n.endswith(".region")}
        assert len(regions) == 2 and all(REGION_NAME.fullmatch(n) for n in regions), (
            f"one region per instance named edgemark-vllm-1-<16 hex>.region; the shared /dev/shm has {sorted(files)}"
        )
        assert files == regions | {lookup_of(n) for n in regions}, sorted(files)
        assert {pair.prefill.region(), pair.decode.region()} == regions
        prefill_reader, decode_reader = self.readers(pair)
        traces = [send(pair.prefill, pair.decode, f"deploy-seq{i}") for i in range(4)]
        traces += send_many(pair.prefill, pair.decode, "deploy-both", 2, at_once=2)
        assert_split(prefill_reader, decode_reader, traces)
        for reader in (prefill_reader, decode_reader):
            assert reader.last["info"]["pid_namespaces"]["mixed"] is False, reader.status()

    def test_a_killed_prefill_restarts_in_a_new_container_and_clean_removes_only_its_region(self, containers):
        pair = containers
        old = pair.prefill
        old_region = old.region()
        assert old_region, "the prefill instance's API server maps no region"
        old_lookup = lookup_of(old_region)
        old_reader = Reader(old, old_region)
        # A request open when the instance dies: prefilled, its decode step
        # never sent (the prefill instance holds it for its lease).
        tp = traceparent()
        body = pd.completion_body(pair.model, pd.prompt_of(167, next(_salts)), 4)
        pd.prefill(old.port, body, "pd-deploy-orphan", tp, timeout=STEP_S)
        wait_for(
            "the prefilled request open in the prefill instance's region",
            lambda: any(o["trace_id"] == tp.split("-")[1] for o in old_reader.read()["open"]),
            STEP_S,
            old_reader.status,
        )
        assert os.listdir(os.path.join(pair.shm, old_lookup)), "its lookup entry"
        old_ns = pid_ns(old.init_pid())
        old.kill()
        # Nothing removed them: a SIGKILLed server runs no exit code.
        assert {old_region, old_lookup} <= plugin_files(pair.shm)

        new = pair.new("prefill")
        new.wait_ready(PATIENCE_S)
        init = new.init_pid()
        assert ns_pids(init)[-1] == 1, ns_pids(init)
        assert pid_ns(init) not in {old_ns, pid_ns(pair.decode.init_pid())}
        new_region = new.region()
        assert new_region and REGION_NAME.fullmatch(new_region) and new_region != old_region, (new_region, old_region)
        live = {new_region, lookup_of(new_region), pair.decode.region(), lookup_of(pair.decode.region())}
        assert plugin_files(pair.shm) == live | {old_region, old_lookup}
        pair.warm_up()

        # The operator's clean-up, a one-off container over the same
        # /dev/shm, the default directory, while both instances serve.
        out = in_container(pair.shm, [sys.executable, "-m", "edgemark.vllm", "clean"])
        said = f"exit {out.returncode}\nstdout:\n{out.stdout}\nstderr:\n{out.stderr[-3000:]}"
        assert out.returncode == 0, said
        removed = [line.split(" ", 1)[1] for line in out.stdout.splitlines() if line.startswith("removed ")]
        assert sorted(removed) == sorted(f"/dev/shm/{n}" for n in (old_region, old_lookup)), said
        assert plugin_files(pair.shm) == live
        # Nothing more is stale: the other plugin's command (the same one),
        # from the host, with the directory given.
        again = subprocess.run(
            [sys.executable, "-m", "edgemark.vllm_omni", "clean", "--dir", pair.shm],
            capture_output=True, text=True, timeout=120, env=plain_env(), cwd="/",
        )  # fmt: skip
        assert again.returncode == 0 and "removed" not in again.stdout, (again.stdout, again.stderr[-3000:])
        assert plugin_files(pair.shm) == live

        # Both live regions attach and record: the restarted instance's and
        # the decode instance's.
        prefill_reader, decode_reader = self.readers(pair)
        traces = [send(pair.prefill, pair.decode, f"deploy-again{i}") for i in range(3)]
        assert_split(prefill_reader, decode_reader, traces)

    def test_sigterm_to_each_pid_1_ends_its_container_and_removes_its_region(self, containers):
        pair = containers
        for srv in (pair.decode, pair.prefill):
            srv.stop(signal.SIGTERM)
            assert srv.ended_by_itself, f"SIGTERM to PID 1 did not end the container:\n{srv.log_tail()}"
        assert plugin_files(pair.shm) == set()


# ---------------------------------------------------------------------------
# One pair, one region named by hand, small and bounded.


@pytest.fixture(scope="class")
def leaky(model, tmp_path_factory):
    """``TestLeaks``' pair: one region named by hand, small and bounded, and
    a thread taking its closed requests; stopped after the class."""
    logs = tmp_path_factory.mktemp("pd-deploy-leaks")
    env = {
        "EDGEMARK_VLLM": "1",
        "VLLM_PLUGINS": "edgemark_vllm",
        "EDGEMARK_VLLM_REGION": "/dev/shm/pd.region",
        "EDGEMARK_VLLM_SLOTS": str(SLOTS),
        "EDGEMARK_VLLM_MAX_OPEN_S": str(MAX_OPEN_S),
    }
    with shared_shm() as shm:
        # The decode instance runs two requests at a time: when it is
        # killed, others wait for it, joined, with no first token.
        p = Pair(model, shm, logs, env, {"kv_lease_duration": LEAK_LEASE_S}, ("--max-num-seqs", "2"))
        p.watching = threading.Event()
        p.read_error = []
        try:
            p.new("prefill")
            p.new("decode")
            p.prefill.wait_ready(PATIENCE_S)
            p.decode.wait_ready(PATIENCE_S)
            # The region's closed requests, taken from inside the prefill
            # instance's container twice a second (its ring holds as many as
            # it has slots).
            p.reader = Reader(p.prefill, "pd.region")

            def watch():
                while not p.watching.wait(0.5):
                    try:
                        p.reader.read()
                    except BaseException as e:  # noqa: BLE001 - reported by the test
                        p.read_error.append(e)

            p.watching_thread = threading.Thread(target=watch, daemon=True)
            p.watching_thread.start()
            p.warm_up()
            yield p
        finally:
            p.watching.set()
            p.stop()


class TestLeaks:
    def test_a_killed_decode_leaves_no_request_open_past_the_bound(self, leaky):
        pair = leaky
        reader = pair.reader
        long_traces: list = []
        errors: list = []

        def long_one(i: int) -> None:
            tp = traceparent()
            long_traces.append(tp.split("-")[1])
            try:
                pd.pd_complete(
                    pair.prefill.port, pair.decode.port, pd.prompt_of(167, next(_salts)), LONG_TOKENS,
                    request_id=f"pd-leak-long{i}", traceparent=tp, model=pair.model, timeout=STEP_S,
                )  # fmt: skip
            except BaseException as e:  # noqa: BLE001 - the decode instance dies under most
                errors.append(e)

        threads = [threading.Thread(target=long_one, args=(i,)) for i in range(LONG_REQUESTS)]
        for t in threads:
            t.start()

        def decoding():
            # A long request decoding on the decode instance (its first
            # token out, not closed), read afresh: the kill lands in it.
            # Or, on a machine fast enough to decode them all between two
            # reads, every one of them closed.
            got = reader.read()
            mine = set(long_traces)
            return len(mine) == LONG_REQUESTS and (
                any(
                    o["trace_id"] in mine and events_of(o)["consumer_first_nonempty_output"] is not None
                    for o in got.get("open", [])
                )
                or mine <= set(reader.closed)
            )

        wait_for("a long request decoding", decoding, STEP_S, reader.status)
        # Requests prefilled, their KV held for a decode instance that dies
        # before the proxy hands them over: open, emit only, with nobody
        # left to close them but the bound. Made so here rather than hoped
        # for from the scheduling of the long requests, which on a fast
        # machine all have their first token before any kill.
        held = []
        for i in range(HELD_REQUESTS):
            tp = traceparent()
            body = pd.completion_body(pair.model, pd.prompt_of(167, next(_salts)), LONG_TOKENS)
            pd.prefill(pair.prefill.port, body, request_id=f"pd-leak-held{i}", traceparent=tp, timeout=STEP_S)
            held.append(tp.split("-")[1])
        pair.decode.kill()
        for t in threads:
            t.join(STEP_S)
        assert len(long_traces) == LONG_REQUESTS
        mine = long_traces + held
        pair.new("decode")  # a new container; ready below
        # Every request the killed instance left open closes within the bound.
        # Each request is begun when the prefill instance's server takes
        # it, which under load can be well after the test sent it; once
        # every client has had its answer (or error), every request that
        # will be begun has been.
        last_begun = time.monotonic()
        wait_for(
            f"the requests the killed decode instance left open closed within {MAX_OPEN_S} s (+{EXPIRE_SLACK_S} s)",
            lambda: set(mine) <= set(reader.closed),
            max(1.0, last_begun + MAX_OPEN_S + EXPIRE_SLACK_S - time.monotonic()),
            lambda: f"missing {sorted(set(mine) - set(reader.closed))}; {reader.status()}",
        )
        left_open = [t for t in mine if events_of(reader.closed[t])["consumer_first_nonempty_output"] is None]
        assert set(held) <= set(left_open), (held, left_open)
        for t in left_open:
            at = events_of(reader.closed[t])
            assert at["producer_first_nonempty_emit"] is not None, (t, at)
        counters = reader.read()["counters"]
        assert counters.get("expired_requests", 0) >= len(left_open), (left_open, counters)

        # The restarted instance, then four times the region's slots.
        pair.decode.wait_ready(PATIENCE_S)
        pair.warm_up()
        traces = send_many(pair.prefill, pair.decode, "leak-after", 4 * SLOTS, at_once=2)
        reader.wait_closed(traces, STEP_S)
        for t in traces:
            at = events_of(reader.closed[t])
            assert None not in at.values(), (t, at)
            assert at["producer_first_nonempty_emit"] <= at["edge_first_send_complete"], (t, at)
            assert at["producer_first_nonempty_emit"] <= at["consumer_first_accept"], (t, at)
            assert at["consumer_first_accept"] <= at["consumer_first_nonempty_output"], (t, at)
        wait_for(
            "no request open",
            lambda: reader.read()["open"] == [],
            MAX_OPEN_S + EXPIRE_SLACK_S,
            reader.status,
        )
        counters = reader.last["counters"]
        assert counters["refused"]["region_full"] == 0, counters
        assert not pair.read_error, pair.read_error

    def test_the_named_region_outlives_either_server_and_goes_with_the_last(self, leaky):
        pair = leaky
        pair.watching.set()
        pair.watching_thread.join(60)
        region = os.path.join(pair.shm, "pd.region")
        assert os.path.exists(region)
        # Both servers hold it: each API server has it mapped.
        for srv in (pair.prefill, pair.decode):
            srv.wait_ready(PATIENCE_S)
            assert srv.region() == "pd.region", (srv.log_path, srv.region())
        pair.prefill.stop(signal.SIGTERM)
        assert pair.prefill.ended_by_itself, pair.prefill.log_tail()
        assert os.path.exists(region), "removed while the decode instance's server held it"
        # Still a region the decode instance's server can use.
        assert read_region(pair.decode.init_pid(), "pd.region")["info"]["slots"] == SLOTS
        pair.decode.stop(signal.SIGTERM)
        assert pair.decode.ended_by_itself, pair.decode.log_tail()
        left = {"pd.region", "pd.requests"} & set(os.listdir(pair.shm))
        assert not left, f"left after the last server's exit: {sorted(left)}"
