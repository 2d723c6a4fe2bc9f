"""A real P/D pair on one host: two ``vllm serve`` instances on the CPU
handing requests over through NixlConnector, recording through the
installed plugin as a user switches it on (``EDGEMARK_VLLM=1``, both given
the same ``EDGEMARK_VLLM_REGION``): nothing loaded, patched or called by
hand.

A client does a P/D proxy's two steps for each request (prefill with
``max_tokens`` 1 and ``do_remote_decode``, then decode with the returned
``kv_transfer_params``), the same ``X-Request-Id`` and ``traceparent`` to
both, each request in a trace of its own. Requests: ten one at a time, two
at once, and one whose client never sends the decode step (aborted between
prefill and decode: the prefill instance's KV lease expires). Then, per
request, from the region's closed requests, by trace: all four events on
``0->1:0`` in the orders causality fixes, on the one host clock; the aborted
one closed with the events after emit null. And each process says its one
line; after SIGTERM the region is gone.

Each instance runs one unbound OpenMP thread (``server.py``): with vLLM's
default binding, two instances on a 2-core machine spin on the same cores
and NIXL's hand-offs wait for the lease (docs/vllm.md).

Needs vLLM with NIXL (``.ci/vllm-cpu-env``, ``.ci/vllm-nixl``) and builds
the tiny model (``real_vllm/tiny_qwen3.py``) into ``EDGEMARK_QWEN3_MODEL``
(default: a temporary directory). Where vLLM or NIXL is missing the module
is skipped, unless ``EDGEMARK_REQUIRE_VLLM=1``, which makes it fail. Every
process started is stopped by its process group, on failure too.
"""

from __future__ import annotations

import os
import re
import secrets
import sys
import threading

import pytest

import edgemark
from _live import EDGE, EVENTS, load_support, need_vllm_nixl, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
SUPPORT = os.path.join(HERE, "real_vllm")
#: A bound on each wait, never a timing that is asserted.
PATIENCE_S = 900.0
#: How long the prefill instance keeps a request's blocks for a decode that
#: does not come (NIXL's ``kv_lease_duration``, 30 s by default). The decode
#: instance's heartbeats extend it only once its side-channel handshake with
#: the prefill instance is done. On a 2-core machine with other jobs
#: running, single hand-offs took 24 s and more, and a lease that expires
#: before the decode side has read makes that request an aborted one; the
#: aborted request of the test waits this long to close.
LEASE_S = 120
#: A bound on each HTTP step of a request, never a timing that is asserted.
STEP_S = 600.0


need_vllm_nixl()
pd = load_support(SUPPORT, "real_vllm_server", "server.py")
tiny = load_support(SUPPORT, "real_vllm_tiny_qwen3", "tiny_qwen3.py")


def traceparent() -> str:
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


@pytest.fixture(scope="module")
def model():
    with tiny.made(os.environ.get("EDGEMARK_QWEN3_MODEL")) as where:
        yield where


@pytest.fixture(scope="module")
def pair(model, tmp_path_factory):
    """The two instances, started together, and the region both record into."""
    tmp = tmp_path_factory.mktemp("pd")
    region = str(tmp / "pd.region")
    # VLLM_PLUGINS: vLLM's allow-list, so that the vLLM-Omni plugins this
    # environment also carries stay out of a plain vLLM server.
    env = {"EDGEMARK_VLLM": "1", "EDGEMARK_VLLM_REGION": region, "VLLM_PLUGINS": "edgemark_vllm"}
    # The first hand-off between a new pair does NIXL's side-channel
    # handshake; it is done once, before the requests the test counts, and
    # retried (vLLM waits 5 s for the handshake's reply).
    with pd.started_pair(
        sys.executable, model, tmp, env, {"kv_lease_duration": LEASE_S}, patience=PATIENCE_S, step_timeout=STEP_S
    ) as (prefill, decode):
        yield prefill, decode, region


def test_every_request_records_the_hand_off_and_an_aborted_one_closes_without_it(pair):
    prefill, decode, region_path = pair
    model_name = pd.model_name(prefill.port)
    traces = {}

    def one(name, salt):
        tp = traceparent()
        traces[name] = tp.split("-")[1]
        first, second = pd.pd_complete(
            prefill.port, decode.port, pd.prompt_of(167, salt), 8, request_id=f"pd-{name}", traceparent=tp,
            model=model_name, timeout=STEP_S,
        )
        assert first["kv_transfer_params"]["remote_request_id"].startswith(f"cmpl-pd-{name}-")
        assert second["usage"]["completion_tokens"] == 8

    for i in range(10):
        one(f"seq{i}", i)
    errors = []

    def guarded(name, salt):
        try:
            one(name, salt)
        except BaseException as e:  # noqa: BLE001 - raised below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(f"both{i}", 100 + i)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    # Aborted between prefill and decode: the proxy never sends step two.
    tp = traceparent()
    traces["aborted"] = tp.split("-")[1]
    body = pd.completion_body(model_name, pd.prompt_of(167, 999), 8)
    first = pd.prefill(prefill.port, body, "pd-aborted", tp, timeout=STEP_S)
    assert first["kv_transfer_params"]["do_remote_prefill"] is True

    region = edgemark.Region.attach(region_path)
    closed = {}

    def all_closed():
        for c in region.drain_closed(1000):
            closed[c["trace_id"]] = c
        return set(traces.values()) <= set(closed)

    wait_for(f"{len(traces)} closed requests (the aborted one after its {LEASE_S} s lease)", all_closed, PATIENCE_S)
    for name, trace in traces.items():
        seg = closed[trace]["snapshot"][EDGE]
        at = {e: seg[e + "_ms"] for e in EVENTS}
        emit, send, accept, output = (at[e] for e in EVENTS)
        if name == "aborted":
            assert emit is not None and (send, accept, output) == (None, None, None), (name, at)
            continue
        assert None not in at.values(), (name, at)
        # One host, one clock: every event on the host's monotonic clock.
        assert set(seg["clock_domains"].values()) == {edgemark.HOST_MONOTONIC}, (name, seg)
        assert emit <= send, (name, at)
        assert emit <= accept <= output, (name, at)
    assert region.open_requests() == []


def test_each_process_says_its_one_line(pair):
    prefill, decode, region_path = pair
    for srv in (prefill, decode):
        text = srv.log_text()
        lines = re.findall(r"edgemark: recording the P/D KV hand-off \(vllm [^)]*\) in (\S+), pid (\d+): (.*)", text)
        where = {name.rstrip(","): rest for name, pid, rest in lines}
        assert any(n.startswith("EngineCore") for n in where), text[-3000:]
        assert any(not n.startswith("EngineCore") for n in where), text[-3000:]
        assert len(lines) == len({pid for _, pid, _ in lines}), "one line per process"
        assert all(region_path in rest for rest in where.values())
        assert "not one edgemark follows" not in text


def test_the_region_is_gone_after_sigterm(pair):
    prefill, decode, region_path = pair
    assert os.path.exists(region_path)
    decode.stop()
    prefill.stop()
    assert prefill.group_pids() == [] and decode.group_pids() == []
    assert not os.path.exists(region_path)
