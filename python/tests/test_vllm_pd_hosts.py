"""A real P/D pair across two hosts: the prefill ``vllm serve`` on host A,
the decode one on host B (two network namespaces joined by a bridge, each
with its own ``/dev/shm``: ``_hosts.py``), handing requests over through
NixlConnector over TCP, each recording through the installed plugin into its
own host's region (``EDGEMARK_VLLM=1``, ``EDGEMARK_VLLM_REGION`` in the
host's ``/dev/shm``), and Arize Phoenix joining both hosts' spans by the
trace the client's ``traceparent`` names (the proxy's two steps forward it
to both instances). Each host exports in one of the two ways users run:
host A's server sends its region's spans itself (vLLM's own
``--otlp-traces-endpoint`` over HTTP, nothing beside it: vLLM's
``llm_request`` spans and edgemark's in one trace), host B has ``edgemark
export --otlp`` beside its server.

Per request, in Phoenix: one ``edgemark request`` span from each host, both
children of the client's span, in different regions; host A's edge span
carries emit and send complete, host B's accept and first output; no event
is on both hosts.

Needs vLLM with NIXL, Arize Phoenix in the environment ``EDGEMARK_OTEL_VENV``
names, the ``edgemark`` command (``EDGEMARK_CLI``), root, ``ip``,
``unshare`` and ``nsenter``. Where one is missing the module is skipped,
unless ``EDGEMARK_REQUIRE_VLLM=1``, which makes it fail. Every process started
is stopped by its saved pid (its process group), every namespace and link is
deleted by its saved name, on failure too.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import sys
import tempfile

import pytest

import _hosts
from _hosts import Hosts, attr, event_names, named, tree, wait_for
from _live import edgemark_bin, load_support, metric, missing, need_vllm_nixl, phoenix_bin

HERE = os.path.dirname(os.path.abspath(__file__))
SUPPORT = os.path.join(HERE, "real_vllm")
#: A bound on each HTTP step of a request, never a timing that is asserted.
STEP_S = 600.0
#: NIXL's lease on a prefilled request's blocks (see test_vllm_pd.py).
LEASE_S = 120
REQUESTS = 3
A_EVENTS = {"producer_first_nonempty_emit", "edge_first_send_complete"}
B_EVENTS = {"consumer_first_accept", "consumer_first_nonempty_output"}


need_vllm_nixl()
if os.geteuid() != 0:
    missing("the two-host test needs root (network and mount namespaces)")
for _tool in ("ip", "unshare", "nsenter"):
    if shutil.which(_tool) is None:
        missing(f"the two-host test needs `{_tool}` (iproute2, util-linux)")
PHOENIX = phoenix_bin()
EDGEMARK = edgemark_bin()
pd = load_support(SUPPORT, "real_vllm_server", "server.py")
tiny = load_support(SUPPORT, "real_vllm_tiny_qwen3", "tiny_qwen3.py")


def region_of(h: str) -> str:
    return f"/dev/shm/edgemark-pd-{h}.region"


def start_instance(
    hosts: Hosts, h: str, name: str, model: str, port: int, side_port: int, kv_extra=None, env=None, args=()
):
    """``vllm serve`` inside host ``h``, as ``VllmServer`` would start it
    there, listening (and its NIXL side channel) on the host's address,
    with ``env`` over its environment and ``args`` after its own."""
    srv = pd.VllmServer(
        sys.executable,
        model,
        port,
        side_port,
        # VLLM_PLUGINS: vLLM's allow-list, so that the vLLM-Omni plugins this
        # environment also carries stay out of a plain vLLM server. UCX over
        # the host's own interface: its loopback is no other host's.
        env={
            "EDGEMARK_VLLM": "1",
            "EDGEMARK_VLLM_REGION": region_of(h),
            "VLLM_PLUGINS": "edgemark_vllm",
            "UCX_NET_DEVICES": "eth0",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        },
        kv_extra=kv_extra,
        extra_args=tuple(args),
        nice=5,
        host=hosts.addr[h],
    )
    proc = hosts.on(h, name, srv.command(), srv.environ())
    return srv, proc


@pytest.fixture(scope="module")
def model():
    with tiny.made(os.environ.get("EDGEMARK_QWEN3_MODEL")) as where:
        yield where


@pytest.fixture(scope="module")
def run(model):
    """The scenario, once: both hosts, a warm-up and ``REQUESTS`` requests
    across them, each in a trace of its own; what Phoenix holds."""
    work = tempfile.mkdtemp(prefix="edgemark-pd-hosts-")
    hosts = Hosts(work)
    out: dict = {"addr": dict(hosts.addr)}
    try:
        phoenix = _hosts.Phoenix(hosts, work, PHOENIX)
        a, b = hosts.addr["a"], hosts.addr["b"]
        # Host A's server exports itself: vLLM's own tracing switched on
        # (`--otlp-traces-endpoint`, over HTTP), and the plugin sends the
        # region's spans to the same endpoint, into the same traces.
        in_process = {
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_SERVICE_NAME": "edgemark-host-a",
            "OTEL_RESOURCE_ATTRIBUTES": "host.name=host-a",
        }
        vllm_tracing = ("--otlp-traces-endpoint", phoenix.url + "/v1/traces")
        prefill, prefill_proc = start_instance(
            hosts, "a", "prefill-a", model, hosts.port(), hosts.port(), {"kv_lease_duration": LEASE_S}, in_process,
            vllm_tracing,
        )  # fmt: skip
        decode, _ = start_instance(hosts, "b", "decode-b", model, hosts.port(), hosts.port())
        for srv in (prefill, decode):
            wait_for(f"vllm serve on {srv.host} to answer /health", lambda: pd.health(srv.port, srv.host))
        phoenix.wait_up()
        for h in ("a", "b"):
            assert hosts.exists(h, region_of(h)), f"host {h}'s API server made no region"
        exporters = {"b": _hosts.start_exporter(hosts, "b", phoenix.url, region_of("b"), EDGEMARK)}
        name = pd.model_name(prefill.port, a)

        def one(rid: str, tp=None, max_tokens: int = 8):
            return pd.pd_complete(
                prefill.port, decode.port, pd.prompt_of(167, len(rid)), max_tokens, request_id=rid, traceparent=tp,
                model=name, prefill_host=a, decode_host=b, timeout=STEP_S,
            )

        # The first hand-off between a new pair does NIXL's side-channel
        # handshake; it is done once, before the requests the test counts,
        # and retried (vLLM waits 5 s for the handshake's reply).
        pd.warm_up(prefill.port, decode.port, prefill_host=a, decode_host=b, timeout=STEP_S)
        out["phoenix"] = phoenix.url
        out["traces"] = traces = {}
        for i in range(REQUESTS):
            tp = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
            first, second = one(f"pd-hosts-{i}", tp)
            traces[tp.split("-")[1]] = tp.split("-")[2]
            assert second["usage"]["completion_tokens"] == 8

        def both(trace_id: str, client_span: str):
            spans = phoenix.spans(trace_id)
            reqs = [s for s in named(spans, "edgemark request") if s.get("parent_id") == client_span]
            events = {e for s in spans for e in event_names(s)}
            vllm_spans = [s for s in spans if s["name"] == "llm_request"]
            return spans if len(reqs) == 2 and A_EVENTS | B_EVENTS <= events and vllm_spans else None

        out["spans"] = {t: wait_for(f"both hosts' spans of trace {t} in Phoenix", lambda t=t, c=c: both(t, c))
                        for t, c in traces.items()}

        def settled():
            sent = {h: metric(u, "edgemark_otlp_exported_spans_total") for h, u in exporters.items()}
            queued = sum(metric(u, "edgemark_otlp_queue_spans") for u in exporters.values())
            return sent if queued == 0 else None

        out["exported"] = wait_for("host B's exporter to have sent every span", settled)
        with open(prefill_proc.err_path, errors="replace") as f:
            out["prefill_log"] = prefill_proc.output() + f.read()
        out["spans"] = {t: phoenix.spans(t) for t in traces}
        for t, spans in out["spans"].items():
            print(f"Phoenix's span tree of trace {t}:\n{tree(spans)}", file=sys.stderr)
        yield out
    finally:
        hosts.close()
        shutil.rmtree(work, ignore_errors=True)


def test_each_request_is_one_trace_joined_across_the_hosts(run):
    for trace_id, client_span in run["traces"].items():
        spans = run["spans"][trace_id]
        assert all(s["context"]["trace_id"] == trace_id for s in spans)
        reqs = [s for s in named(spans, "edgemark request") if s.get("parent_id") == client_span]
        assert len(reqs) == 2, tree(spans)
        regions = {attr(r, "edgemark.region") for r in reqs}
        assert len(regions) == 2, "each host records in its own region"
        by_host = {}
        for r in reqs:
            kids = [s for s in spans if s.get("parent_id") == r["context"]["span_id"]]
            assert {s["name"] for s in kids} == {"edgemark 0->1"}, tree(spans)
            by_host[frozenset(e for s in kids for e in event_names(s))] = kids
        # One host holds the prefill side's events, the other the decode
        # side's; none is on both (no delta across hosts).
        assert set(by_host) == {frozenset(A_EVENTS), frozenset(B_EVENTS)}, tree(spans)
        a_edge = by_host[frozenset(A_EVENTS)][0]
        b_edge = by_host[frozenset(B_EVENTS)][0]
        ta = {e["name"]: e["timestamp"] for e in a_edge["events"]}
        tb = {e["name"]: e["timestamp"] for e in b_edge["events"]}
        # Within a host, one clock: the orders causality fixes.
        assert ta["producer_first_nonempty_emit"] <= ta["edge_first_send_complete"]
        assert tb["consumer_first_accept"] <= tb["consumer_first_nonempty_output"]


def test_each_host_exported_its_own_spans(run):
    # Host B through `edgemark export`, host A from inside its server: one
    # process of it (its API server) elected, no exporter beside it.
    assert set(run["exported"]) == {"b"}
    assert run["exported"]["b"] >= 2 * len(run["traces"]), run["exported"]
    said = re.findall(r"edgemark: this process \(pid \d+\) sends the closed requests of (\S+) as spans to (\S+)", run["prefill_log"])
    assert said == [(region_of("a"), run["phoenix"] + "/v1/traces")], run["prefill_log"][-5000:]


def test_vllm_s_own_spans_and_edgemark_s_are_in_one_trace(run):
    # Host A's vLLM traces itself (`--otlp-traces-endpoint`): its request
    # span is in each request's trace beside edgemark's spans of both hosts.
    for trace_id, client_span in run["traces"].items():
        spans = run["spans"][trace_id]
        vllm_spans = [s for s in spans if s["name"] == "llm_request"]
        assert vllm_spans, tree(spans)
        assert all(s["context"]["trace_id"] == trace_id for s in vllm_spans)
        assert named(spans, "edgemark request"), tree(spans)
