"""The vLLM-Omni plugin past one host: two simulated hosts (network
namespaces joined by a bridge, each with its own ``/dev/shm`` in a mount
namespace of its own, as in ``cli/tests/otlp.rs``), real vLLM-Omni stage
processes on each side on the async-chunk adapter path, one chunk crossing
over vLLM-Omni's own ``MooncakeTransferEngineConnector`` (CPU, TCP), one
``edgemark export --otlp`` per host, and Arize Phoenix joining the hosts'
spans by trace ID.

- Host A: the API-server side (a real ``ClientRequestState``: the plugin
  begins the request in host A's region and gives its traceparent) and
  stage 0's process (the producer: ``save_async``, its send thread,
  ``connector.put``).
- Host B: stage 1's process (the consumer: ``process_pending_chunks``, the
  receive thread, ``connector.get``, the commit; then the generation
  scheduler's ``_free_request``). Its scheduler ``Request`` is made from the
  engine request the API side built and encoded, carrying the traceparent in
  ``trace_headers``; host B's plugin finds no token for it in its own
  region and begins a host-local request under that context.

Needs vllm-omni with ``mooncake-transfer-engine-non-cuda`` (and Debian's
``libibverbs1``), Arize Phoenix in the environment named by
``EDGEMARK_OTEL_VENV``, the ``edgemark`` command (``EDGEMARK_CLI``, else the
workspace's ``target/debug/edgemark``), root, ``ip``, ``unshare`` and
``nsenter``. Where one is missing the module is skipped, unless
``EDGEMARK_REQUIRE_VLLM_OMNI=1`` or ``EDGEMARK_REQUIRE_OTEL=1`` (CI sets both),
which makes it fail. Every process started is stopped by its saved pid (its
process group), every namespace and link is deleted by its saved name, on
failure too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import sys
import tempfile

import pytest

import _hosts
from _hosts import Hosts, attr, event_names, named, tree, wait_for
from _live import edgemark_bin, metric, missing, need_vllm_omni, phoenix_bin

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STAGE = os.path.join(HERE, "_vllm_omni_host_stage.py")
RID = "req-hosts-1"
CODES = [11, 12, 13, 14, 15]


need_vllm_omni()
if importlib.util.find_spec("mooncake") is None:
    missing("mooncake-transfer-engine-non-cuda is not installed (vLLM-Omni's Mooncake connector needs it)")


PHOENIX = phoenix_bin()
EDGEMARK = edgemark_bin()
if os.geteuid() != 0:
    missing("the two-host test needs root (network and mount namespaces)")
for _tool in ("ip", "unshare", "nsenter"):
    if shutil.which(_tool) is None:
        missing(f"the two-host test needs `{_tool}` (iproute2, util-linux)")


# ---------------------------------------------------------------------------
# Processes, stopped by their saved pid.


# ---------------------------------------------------------------------------
# Two hosts.


def region_of(h: str) -> str:
    return f"/dev/shm/edgemark-host-{h}.region"


def start_exporter(hosts: Hosts, h: str, url: str) -> str:
    """``edgemark export`` of host ``h``'s region toward ``url``; the URL of
    its ``/metrics``."""
    return _hosts.start_exporter(hosts, h, url, region_of(h), EDGEMARK)


def stage_env(h: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEMARK_VLLM_OMNI")}
    env.update(
        EDGEMARK_VLLM_OMNI="1",
        EDGEMARK_VLLM_OMNI_REGION=region_of(h),
        EDGEMARK_VLLM_OMNI_SLOTS="256",
        PYTHONUNBUFFERED="1",
        # Neither host reaches a hub, nor needs to.
        HF_HUB_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    return env


def joined(spans: list, a_span: str) -> bool:
    """Whether Phoenix holds both hosts' request spans and the edge spans
    with the stage events (emit, send complete on A; accept on B)."""
    reqs = named(spans, "edgemark request")
    events = {e for s in spans for e in event_names(s)}
    return (
        any(s["context"]["span_id"] == a_span for s in reqs)
        and any(s.get("parent_id") == a_span for s in reqs)
        and {"producer_first_nonempty_emit", "edge_first_send_complete", "consumer_first_accept"} <= events
    )


@pytest.fixture(scope="module")
def run():
    """The scenario, once: both hosts, one request across them; what each
    process answered and what Phoenix holds."""
    work = tempfile.mkdtemp(prefix="edgemark-hosts-")
    hosts = Hosts(work)
    out: dict = {"addr": dict(hosts.addr), "work": work}
    try:
        phoenix = _hosts.Phoenix(hosts, work, PHOENIX)
        py = sys.executable
        api = hosts.on("a", "api-a", [py, STAGE, "api"], stage_env("a"))
        # Both stages are given the deployment's base port; vLLM-Omni
        # resolves the edge's sender port from it on each side.
        producer = hosts.on("a", "stage0-a", [py, STAGE, "producer", hosts.addr["a"], "50100"], stage_env("a"))
        consumer = hosts.on(
            "b", "stage1-b", [py, STAGE, "consumer", hosts.addr["b"], hosts.addr["a"], "50100"], stage_env("b")
        )
        out["api_ready"] = api.reply()
        out["producer_ready"] = producer.reply()
        out["consumer_ready"] = consumer.reply()
        phoenix.wait_up()

        # Host A: the request begins in the API server.
        out["begin"] = begun = api.ask(op="begin", rid=RID)
        exporters: dict = {}
        if hosts.exists("a", region_of("a")):
            exporters["a"] = start_exporter(hosts, "a", phoenix.url)
        # Host B's stage takes the request and waits for its chunk; host A's
        # stage 0 sends one chunk and the terminal.
        consumer.send(op="receive", engine_request=begun["engine_request"])
        out["send"] = producer.ask(op="send", rid=RID, codes=CODES)
        out["receive"] = consumer.reply()
        if "b" not in exporters and hosts.exists("b", region_of("b")):
            exporters["b"] = start_exporter(hosts, "b", phoenix.url)
        out["free"] = consumer.ask(op="free")
        out["close"] = api.ask(op="close", rid=RID)
        for h in ("a", "b"):
            if h not in exporters and hosts.exists(h, region_of(h)):
                exporters[h] = start_exporter(hosts, h, phoenix.url)
        out["exporters"] = sorted(exporters)

        tp = begun.get("traceparent")
        out["spans"] = []
        if tp and len(exporters) == 2:
            _, trace_id, a_span, _ = tp.split("-")
            out["trace_id"], out["a_span"] = trace_id, a_span
            out["spans"] = wait_for(
                f"both hosts' spans of trace {trace_id} in Phoenix",
                lambda: (lambda s: s if joined(s, a_span) else None)(phoenix.spans(trace_id)),
            )
            # Every span each host's exporter had sent, read back: the
            # assertions see all of them.
            def settled():
                sent = {h: metric(u, "edgemark_otlp_exported_spans_total") for h, u in exporters.items()}
                queued = sum(metric(u, "edgemark_otlp_queue_spans") for u in exporters.values())
                spans = phoenix.spans(trace_id)
                return (spans, sent) if queued == 0 and len(spans) == sum(sent.values()) else None

            out["spans"], out["exported"] = wait_for("Phoenix to hold every span the exporters sent", settled)
            print(f"Phoenix's span tree of trace {trace_id}:\n{tree(out['spans'])}", file=sys.stderr)
        for p in (api, producer, consumer):
            with contextlib.suppress(Exception):
                p.send(op="exit")
        yield out
    finally:
        hosts.close()
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------
# What crossed.


def test_each_stage_process_is_instrumented_on_its_host(run):
    for k in ("api_ready", "producer_ready", "consumer_ready"):
        assert run[k]["instrumented"] is True, k
    assert run["producer_ready"]["connector"] == run["consumer_ready"]["connector"] == "MooncakeTransferEngineConnector"
    # Each connector on its own host's address.
    assert run["producer_ready"]["host"] == run["addr"]["a"]
    assert run["consumer_ready"]["host"] == run["addr"]["b"]
    assert run["consumer_ready"]["sender"] == [run["addr"]["a"], run["producer_ready"]["zmq_port"]]
    assert run["addr"]["a"] != run["addr"]["b"]


def test_the_chunk_crossed_the_hosts_intact(run):
    send, recv = run["send"], run["receive"]
    # Stage 0 put the data chunk and the terminal, both accepted.
    assert send["sent"] is True
    assert send["puts"] == {"ok": 2, "failed": 0}
    # Stage 1 took both off the connector: one schedule with the data, then
    # the upstream was exhausted.
    assert recv["done"] is True
    # The data chunk was scheduled first (the terminal then wakes the request
    # once more, with no new codes).
    assert recv["scheduled"]
    got = recv["scheduled"][0]
    assert got["prompt_token_ids"] == CODES
    sys.path.insert(0, HERE)
    try:
        from _vllm_omni_host_stage import hidden_for
    finally:
        sys.path.remove(HERE)
    assert got["hidden"] == hidden_for(CODES).tolist()
    # The adapter's keys are the external request ID on both sides.
    assert send["external_req_id"] == recv["external_req_id"] == RID
    assert send["request_id"] != RID  # stage 0's engine core renamed it


def test_the_stage_on_the_other_host_gets_the_traceparent(run):
    tp = run["begin"]["traceparent"]
    assert run["begin"]["has_traceparent_of"] is True, "edgemark.vllm_omni has no traceparent_of"
    assert tp and len(tp.split("-")) == 4
    # The API server's plugin put it in the next stage's engine request as
    # vLLM-Omni's orchestrator builds it...
    assert run["begin"]["built_trace_headers"] == {"traceparent": tp}
    # ... and it reached host B's scheduler Request through vLLM's encoding.
    assert run["receive"]["trace_headers"] == {"traceparent": tp}


def test_each_host_has_its_own_region(run):
    assert run["begin"]["region_exists"] is True
    assert run["free"]["region_exists"] is True
    assert run["exporters"] == ["a", "b"]


# ---------------------------------------------------------------------------
# Phoenix.


def test_the_hosts_spans_are_one_trace_in_phoenix(run):
    assert run["close"]["has_close_request"] is True, "edgemark.vllm_omni has no close_request"
    spans = run["spans"]
    assert spans, "no spans of the request's trace in Phoenix"
    trace_id, a_span = run["trace_id"], run["a_span"]
    assert all(s["context"]["trace_id"] == trace_id for s in spans)
    reqs = named(spans, "edgemark request")
    a_req = [s for s in reqs if s["context"]["span_id"] == a_span]
    b_req = [s for s in reqs if s.get("parent_id") == a_span]
    assert len(a_req) == 1 and len(b_req) == 1, spans
    a_req, b_req = a_req[0], b_req[0]
    # A's request began the trace; B's is its child, in B's own region.
    assert not a_req.get("parent_id")
    assert attr(a_req, "edgemark.region") != attr(b_req, "edgemark.region")
    a_kids = [s for s in spans if s.get("parent_id") == a_span and s is not b_req]
    b_kids = [s for s in spans if s.get("parent_id") == b_req["context"]["span_id"]]
    a_events = {e for s in a_kids for e in event_names(s)}
    b_events = {e for s in b_kids for e in event_names(s)}
    # Host A recorded the producer's events; host B the consumer's accept.
    assert {"producer_first_nonempty_emit", "edge_first_send_complete"} <= a_events, a_kids
    assert "consumer_first_accept" in b_events, b_kids
    assert "consumer_first_accept" not in a_events
    # Both hosts name the same edge, stage 0 -> stage 1; on A, the emit came
    # before the send completed (one host, one clock).
    assert {s["name"] for s in a_kids + b_kids if s is not b_req} == {"edgemark 0->1"}
    a_edge = [s for s in a_kids if "producer_first_nonempty_emit" in event_names(s)][0]
    times = {e["name"]: e["timestamp"] for e in a_edge["events"]}
    assert times["producer_first_nonempty_emit"] <= times["edge_first_send_complete"]
    assert not {"producer_first_nonempty_emit", "edge_first_send_complete"} & b_events
    # Each host's spans came through its own exporter (its own service and
    # host name: Phoenix's span API returns no resource attributes, so the
    # exporters' counts and the regions tell the hosts apart).
    region = {h: attr(r, "edgemark.region") for h, r in (("a", a_req), ("b", b_req))}
    for h in ("a", "b"):
        mine = [s for s in spans if attr(s, "edgemark.region") == region[h]]
        assert run["exported"][h] == len(mine) >= 2, (h, run["exported"])
