"""Real P/D pairs in the deployment shapes whose processes are more than one
of each: a prefill instance with two API servers (``--api-server-count 2``)
and a prefill instance with two data parallel ranks on one host
(``--data-parallel-size 2``), each beside a plain decode instance, the
installed plugin switched on as a user does it (``EDGEMARK_VLLM=1``, one
region named for both instances).

Per shape: requests at once from several clients, each a P/D proxy's two
steps under a trace of its own; every request's four events on ``0->1:0``
in the orders causality fixes; every request closed where it ended (none by
the bound: ``expired_requests`` 0), no begin refused, nothing left open;
the region's families once on the prefill instance's own ``/metrics``.

Needs what ``test_vllm_pd.py`` needs (vLLM with NIXL, the tiny Qwen3 in
``EDGEMARK_QWEN3_MODEL``); skipped without, unless ``EDGEMARK_REQUIRE_VLLM=1``.
Every process started is stopped by its process group, on failure too.
"""

from __future__ import annotations

import os
import secrets
import sys
import threading

import pytest

import edgemark
from _live import (
    EDGE,
    EVENTS,
    edgemark_part,
    load_support,
    need_vllm_nixl,
    one_set_of_families,
    promtool_check,
    sample,
    server_metrics,
    wait_for,
)

HERE = os.path.dirname(os.path.abspath(__file__))
SUPPORT = os.path.join(HERE, "real_vllm")
#: A bound on each wait, never a timing that is asserted.
PATIENCE_S = 900.0
#: A bound on each HTTP step of a request, never a timing that is asserted.
STEP_S = 600.0
#: The prefill instance's KV lease (see test_vllm_pd.py), as long as a
#: request's step may take: a shape that runs three engine cores on a loaded
#: 2-core machine took over 100 s to hand some requests over, and a lease
#: that expires first makes an aborted request of one the test counts as
#: handed over. Nothing here waits for a lease to expire.
LEASE_S = int(STEP_S)
#: Requests per shape, and clients at once.
N, AT_ONCE = 12, 3

need_vllm_nixl()
pd = load_support(SUPPORT, "real_vllm_server", "server.py")
tiny = load_support(SUPPORT, "real_vllm_tiny_qwen3", "tiny_qwen3.py")


@pytest.fixture(scope="module")
def model():
    with tiny.made(os.environ.get("EDGEMARK_QWEN3_MODEL")) as where:
        yield where


SHAPES = {
    "api-server-count-2": ("--api-server-count", "2"),
    "data-parallel-2": ("--data-parallel-size", "2"),
}


@pytest.fixture(params=sorted(SHAPES))
def pair(request, model, tmp_path):
    region = str(tmp_path / "pd.region")
    env = {"EDGEMARK_VLLM": "1", "EDGEMARK_VLLM_REGION": region, "VLLM_PLUGINS": "edgemark_vllm"}
    with pd.started_pair(
        sys.executable, model, tmp_path, env, {"kv_lease_duration": LEASE_S}, SHAPES[request.param],
        patience=PATIENCE_S, step_timeout=STEP_S,
    ) as (prefill, decode):  # fmt: skip
        yield request.param, prefill, decode, region


def test_every_request_is_recorded_and_closed_where_it_ended(pair):
    shape, prefill, decode, region_path = pair
    model_name = pd.model_name(prefill.port)
    traces: list = []
    errors: list = []
    lock = threading.Lock()

    def client(k: int) -> None:
        for i in range(k, N, AT_ONCE):
            tp = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
            with lock:
                traces.append(tp.split("-")[1])
            try:
                _, second = pd.pd_complete(
                    prefill.port, decode.port, pd.prompt_of(167, 500 + i), 4, request_id=f"pd-{shape}-{i}",
                    traceparent=tp, model=model_name, timeout=STEP_S,
                )  # fmt: skip
                assert second["usage"]["completion_tokens"] == 4
            except BaseException as e:  # noqa: BLE001 - raised below, in the test's thread
                errors.append(e)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(AT_ONCE)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    region = edgemark.Region.attach(region_path)
    closed: dict = {}

    def all_closed() -> bool:
        for c in region.drain_closed(1000):
            closed[c["trace_id"]] = c
        return set(traces) <= set(closed)

    wait_for(f"{len(traces)} closed requests ({shape})", all_closed, PATIENCE_S)
    for trace in traces:
        seg = closed[trace]["snapshot"][EDGE]
        at = {e: seg[e + "_ms"] for e in EVENTS}
        emit, send, accept, output = (at[e] for e in EVENTS)
        assert None not in at.values(), (shape, trace, at)
        assert emit <= send and emit <= accept <= output, (shape, trace, at)
    wait_for("nothing open", lambda: region.open_requests() == [], PATIENCE_S)
    counters = region.counters()
    assert counters["refused"]["region_full"] == 0, counters
    assert counters["expired_requests"] == 0, counters
    # Every closed request drained once per trace (the warm-up's too): no
    # request begun twice, by two API servers or two ranks.
    assert counters["closed_requests"] == len(closed), (counters, len(closed))
    # The region's families on the prefill instance's own /metrics (with two
    # API servers, vLLM's multiprocess mode): one set of them, the whole
    # region's counts, whichever process answers the scrape.
    for _ in range(4):
        text = server_metrics(f"http://{pd.HOST}:{prefill.port}/metrics")
        one_set_of_families(text)
        assert sample(text, "edgemark_closed_requests_total") == counters["closed_requests"], shape
        promtool_check(edgemark_part(text))
