"""A prefill instance whose data parallel ranks run on two nodes: rank 0
and the API server on node A (``vllm serve --data-parallel-size 2
--data-parallel-size-local 1``), rank 1 on node B (``vllm serve --headless
--data-parallel-start-rank 1``), two network namespaces joined by a bridge,
each with its own ``/dev/shm`` (``_hosts.py``); a decode instance on node A,
NixlConnector between them over TCP, the installed plugin switched on as a
user does it (``EDGEMARK_VLLM=1``, each node's own region).

Requests are sent to each rank (vLLM's ``X-data-parallel-rank`` header),
each under a trace of its own. Per request:

- prefilled by rank 0: all four events in node A's region, in the orders
  causality fixes;
- prefilled by rank 1: node A's region holds the request its API server
  began, joined by the decode instance there (accept, first output, and no
  emit: nothing on A prefilled it), closed by that API server once the
  first output is in; node B's engine core, with no API server on its node,
  made B's region and began its own request there (emit, and send complete
  from its worker when the decode instance read the KV), closed there;

no request closed by the bound on either node, none refused, nothing left
open, and B's engine core said once that it begins its own requests.

Needs vLLM with NIXL, root, ``ip``, ``unshare`` and ``nsenter``; skipped
where one is missing, unless ``EDGEMARK_REQUIRE_VLLM=1``. Every process
started is stopped by its saved pid (its process group), every namespace and
link deleted by its saved name, on failure too.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import shutil
import sys
import tempfile
import time

import pytest

from _hosts import Hosts, wait_for
from _live import EDGE, EVENTS, load_support, missing, need_vllm_nixl

HERE = os.path.dirname(os.path.abspath(__file__))
SUPPORT = os.path.join(HERE, "real_vllm")
#: A bound on each HTTP step of a request, never a timing that is asserted.
STEP_S = 600.0
#: NIXL's lease on a prefilled request's blocks (see test_vllm_pd.py).
LEASE_S = 120
#: Requests per rank.
PER_RANK = 3
EMIT, SEND, ACCEPT, OUTPUT = EVENTS

need_vllm_nixl()
if os.geteuid() != 0:
    missing("the two-node test needs root (network and mount namespaces)")
for _tool in ("ip", "unshare", "nsenter"):
    if shutil.which(_tool) is None:
        missing(f"the two-node test needs `{_tool}` (iproute2, util-linux)")
pd = load_support(SUPPORT, "real_vllm_server", "server.py")
tiny = load_support(SUPPORT, "real_vllm_tiny_qwen3", "tiny_qwen3.py")

#: Reads a region inside a node: its closed requests (taken), how many are
#: open, its counters, as one JSON reply.
READ = r"""
import json, sys, edgemark
r = edgemark.Region.attach(sys.argv[1])
closed = [{"trace_id": c["trace_id"], "snapshot": c["snapshot"]} for c in r.drain_closed(4096)]
print(json.dumps({"reply": {"closed": closed, "open": len(r.open_requests()), "counters": r.counters()}}), flush=True)
"""


def region_of(h: str) -> str:
    return f"/dev/shm/edgemark-pd-node-{h}.region"


def node_env(h: str, addr: str) -> dict:
    # UCX over the node's own interface: its loopback is no other node's.
    # VLLM_HOST_IP: the node's address, which vLLM otherwise finds by a
    # route to the outside that a test node has not (and falls back to
    # 0.0.0.0, where its engine's workers cannot connect).
    return {
        "VLLM_HOST_IP": addr,
        "GLOO_SOCKET_IFNAME": "eth0",
        "EDGEMARK_VLLM": "1",
        "EDGEMARK_VLLM_REGION": region_of(h),
        "VLLM_PLUGINS": "edgemark_vllm",
        "UCX_NET_DEVICES": "eth0",
        "PYTHONUNBUFFERED": "1",
    }


class Node:
    """What a node's region holds, read from inside the node; its closed
    requests kept across reads (reading takes them)."""

    def __init__(self, hosts: Hosts, h: str) -> None:
        self.hosts, self.h = hosts, h
        self.closed: list = []
        self.last: dict = {}
        self._n = 0

    def read(self) -> dict:
        self._n += 1
        p = self.hosts.on(self.h, f"read-{self.h}-{self._n}", [sys.executable, "-c", READ, region_of(self.h)])
        try:
            self.last = p.reply()["reply"]
        finally:
            p.stop()
        self.closed += self.last["closed"]
        return self.last


def events_of(snapshot: dict) -> dict:
    seg = snapshot[EDGE]
    return {e: seg[e + "_ms"] for e in EVENTS}


def present(snapshot: dict) -> set:
    return {e for e, v in events_of(snapshot).items() if v is not None}


def on_rank(prefill: pd.VllmServer, decode: pd.VllmServer, rank: int, rid: str, tp, model: str, salt: int):
    """Both steps of a P/D proxy, the prefill step sent to data parallel
    rank ``rank`` (``X-data-parallel-rank``); the prefill response."""
    body = pd.completion_body(model, pd.prompt_of(167, salt), 4)
    first = dict(body)
    first.update(
        max_tokens=1,
        stream=False,
        kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                            "remote_block_ids": None, "remote_host": None, "remote_port": None},
    )  # fmt: skip
    headers = {"X-Request-Id": rid, "X-data-parallel-rank": str(rank)}
    if tp is not None:
        headers["traceparent"] = tp
    conn, resp = pd.post(prefill.port, "/v1/completions", first, headers, STEP_S, pd.CompletionError, prefill.host)
    try:
        out = json.loads(resp.read())
    finally:
        conn.close()
    params = out.get("kv_transfer_params")
    assert params, out
    second = pd.decode(decode.port, body, params, rid, tp, decode.host, STEP_S)
    assert second["usage"]["completion_tokens"] == 4, second
    return params


@pytest.fixture(scope="module")
def model():
    with tiny.made(os.environ.get("EDGEMARK_QWEN3_MODEL")) as where:
        yield where


@pytest.fixture(scope="module")
def run(model):
    work = tempfile.mkdtemp(prefix="edgemark-pd-nodes-")
    # Node A runs two instances, each of whose engine cores asks 240 MiB
    # of /dev/shm.
    hosts = Hosts(work, shm_size="2g")
    out: dict = {}
    try:
        a, b = hosts.addr["a"], hosts.addr["b"]
        rpc = hosts.port()
        dp = ("--data-parallel-size", "2", "--data-parallel-size-local", "1",
              "--data-parallel-address", a, "--data-parallel-rpc-port", str(rpc))  # fmt: skip
        kv = {"kv_lease_duration": LEASE_S}
        head = pd.VllmServer(sys.executable, model, hosts.port(), hosts.port(), env=node_env("a", a), kv_extra=kv,
                             extra_args=dp, nice=5, host=a)  # fmt: skip
        # Rank 1's side channel is its port plus its rank: two ports kept.
        side_b = hosts.port()
        hosts.port()
        headless = pd.VllmServer(sys.executable, model, hosts.port(), side_b, env=node_env("b", b), kv_extra=kv,
                                 extra_args=(*dp, "--headless", "--data-parallel-start-rank", "1"), nice=5,
                                 host=b)  # fmt: skip
        decode = pd.VllmServer(sys.executable, model, hosts.port(), hosts.port(), env=node_env("a", a), nice=5, host=a)
        procs = {
            "prefill-head": hosts.on("a", "prefill-head", head.command(), head.environ()),
            "prefill-headless": hosts.on("b", "prefill-headless", headless.command(), headless.environ()),
            "decode": hosts.on("a", "decode", decode.command(), decode.environ()),
        }
        out["headless"] = procs["prefill-headless"]

        def up(srv) -> bool:
            for name, proc in procs.items():
                if proc.p.poll() is not None:
                    text = logged(proc)
                    errors = "\n".join([line for line in text.splitlines() if "ERROR" in line or "Error" in line][:80])
                    raise AssertionError(f"{name} ended (exit {proc.p.returncode}):\n{errors}\n{text[-3000:]}")
            return pd.health(srv.port, srv.host)

        for srv in (head, decode):
            wait_for(f"vllm serve on {srv.host}:{srv.port} to answer /health", lambda: up(srv))
        name = pd.model_name(head.port, a)
        # The first hand-off from each rank does NIXL's side-channel
        # handshake with the decode instance, retried (vLLM waits 5 s for
        # its reply): done before the requests the test counts.
        for rank in (0, 1):
            for attempt in range(5):
                try:
                    on_rank(head, decode, rank, f"pd-nodes-warm-{rank}-{attempt}", None, name, 4242 + rank)
                    break
                except pd.CompletionError:
                    if attempt == 4:
                        raise
                    time.sleep(1.0)
        nodes = {"a": Node(hosts, "a"), "b": Node(hosts, "b")}
        out["nodes"] = nodes
        out["traces"] = traces = {}
        for i in range(2 * PER_RANK):
            rank = i % 2
            tp = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
            params = on_rank(head, decode, rank, f"pd-nodes-{i}", tp, name, i)
            assert params["remote_engine_id"].endswith(f"_dp{rank}"), params
            traces[tp.split("-")[1]] = rank

        def settled() -> bool:
            for n in nodes.values():
                n.read()
            closed_a = {c["trace_id"] for c in nodes["a"].closed}
            sent_b = [c for c in nodes["b"].closed if present(c["snapshot"]) == {EMIT, SEND}]
            return (
                set(traces) <= closed_a
                and len(sent_b) >= PER_RANK
                and all(n.last["open"] == 0 for n in nodes.values())
            )

        wait_for("every request closed on both nodes, nothing open", settled, LEASE_S + STEP_S)
        yield out
    finally:
        hosts.close()
        shutil.rmtree(work, ignore_errors=True)


def test_each_rank_s_requests_are_recorded_on_the_node_that_ran_them(run):
    nodes, traces = run["nodes"], run["traces"]
    by_trace = {c["trace_id"]: c["snapshot"] for c in nodes["a"].closed}
    for trace, rank in traces.items():
        at = events_of(by_trace[trace])
        if rank == 0:
            assert None not in at.values(), (trace, at)
            assert at[EMIT] <= at[SEND] and at[EMIT] <= at[ACCEPT] <= at[OUTPUT], (trace, at)
        else:
            # Prefilled on node B: node A's request holds the decode side.
            assert present(by_trace[trace]) == {ACCEPT, OUTPUT}, (trace, at)
            assert at[ACCEPT] <= at[OUTPUT], (trace, at)
    # Node B's own requests: emit and send complete of each hand-off its
    # rank ran (the warm-up's too), on its one clock.
    b = [events_of(c["snapshot"]) for c in nodes["b"].closed if present(c["snapshot"]) == {EMIT, SEND}]
    assert len(b) >= PER_RANK, nodes["b"].closed
    assert all(e[EMIT] <= e[SEND] for e in b)


def test_no_request_was_closed_by_the_bound_or_refused_on_either_node(run):
    for h, node in run["nodes"].items():
        counters = node.last["counters"]
        assert counters["expired_requests"] == 0, (h, counters)
        assert counters["refused"]["region_full"] == 0, (h, counters)
        assert node.last["open"] == 0, h


def logged(proc) -> str:
    """Everything ``proc`` wrote so far (vLLM logs to standard output)."""
    lines = []
    while True:
        try:
            line = proc.lines.get_nowait()
        except queue.Empty:
            break
        if line is not None:
            lines.append(line)
    with open(proc.err_path, errors="replace") as f:
        return "".join(lines) + f.read()


def test_the_headless_engine_core_says_it_begins_its_own_requests(run):
    text = logged(run["headless"])
    said = [line for line in text.splitlines() if "no API server of this instance records on this host" in line]
    assert len(said) == 1, text[-4000:]
    assert region_of("b") in said[0]
