"""The region's families on a server's own ``/metrics`` (``edgemark._metrics``),
with the real ``prometheus_client`` registries vLLM's ``/metrics`` serves:
the global kind beside a server's own metrics, and the multiprocess kind of
``--api-server-count N`` over a real ``PROMETHEUS_MULTIPROC_DIR``. One set
of families however often the registry is asked for, the region's counts,
``promtool check metrics`` clean, and nothing (never an error) where there
is no region.

The P/D plugin's ``Recording`` is built as its API server wrapper builds it.
"""

from __future__ import annotations

import os

import pytest

import edgemark
from _live import edgemark_part, one_set_of_families, promtool_check, sample

# The `test` extra's, and every vLLM environment's.
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client import multiprocess

from edgemark import _metrics
from edgemark.vllm._recording import Recording


@pytest.fixture
def rec(tmp_path, monkeypatch):
    for k in list(os.environ):
        if k.startswith(("EDGEMARK_", "_EDGEMARK_", "OTEL_")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("EDGEMARK_VLLM", "1")
    monkeypatch.setenv("EDGEMARK_VLLM_REGION", str(tmp_path / "metrics.region"))
    r = Recording()
    assert r.start(None) is not None
    yield r
    r.owner.release()


def close(rec, n: int) -> None:
    region = rec.owner.region
    for _ in range(n):
        t = region.begin()
        assert region.record(t, 0, 1, edgemark.Event.PRODUCER_FIRST_NONEMPTY_EMIT)
        assert region.close(t) is not None


def test_the_multiprocess_registry_gets_one_set_of_the_region_s_families(rec, tmp_path, monkeypatch):
    mp = tmp_path / "multiproc"
    mp.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(mp))

    def get_prometheus_registry():
        # As vLLM's does in multiprocess mode: a new registry at each call.
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry

    wrapped = _metrics.wrap_registry(get_prometheus_registry, rec)
    close(rec, 3)
    registry = wrapped()
    text = generate_latest(registry).decode()
    one_set_of_families(text)
    assert sample(text, "edgemark_closed_requests_total") == 3
    promtool_check(edgemark_part(text))
    # Read at each scrape.
    close(rec, 2)
    assert sample(generate_latest(registry).decode(), "edgemark_closed_requests_total") == 5
    # No file of ours in the multiprocess directory.
    assert all(not f.startswith("edgemark") for f in os.listdir(mp))


def test_the_global_registry_keeps_the_server_s_own_metrics_and_gets_ours_once(rec):
    registry = CollectorRegistry()
    served = Counter("vllm_requests_served", "The server's own counter", registry=registry)
    served.inc()
    wrapped = _metrics.wrap_registry(lambda: registry, rec)
    close(rec, 1)
    for _ in range(3):
        # vLLM asks once per app; a second app, or a second call, adds nothing.
        assert wrapped() is registry
    text = generate_latest(registry).decode()
    one_set_of_families(text)
    assert sample(text, "vllm_requests_served_total") == 1
    assert sample(text, "edgemark_closed_requests_total") == 1
    promtool_check(text)


def test_no_region_gives_no_family_and_no_error(rec):
    registry = CollectorRegistry()
    _metrics.wrap_registry(lambda: registry, rec)()
    rec.owner.release()
    text = generate_latest(registry).decode()
    assert "edgemark_" not in text


def test_a_region_that_cannot_be_read_leaves_the_scrape_whole(rec, caplog):
    registry = CollectorRegistry()
    Counter("vllm_other", "The server's own counter", registry=registry).inc()
    _metrics.wrap_registry(lambda: registry, rec)()

    class Broken:
        def prometheus_text(self):
            raise OSError("the region file was truncated")

    owner = rec.owner
    rec.owner = None
    rec._region, rec._next_check = Broken(), float("inf")
    try:
        text = generate_latest(registry).decode()
    finally:
        rec.owner = owner
    assert "edgemark_" not in text
    assert sample(text, "vllm_other_total") == 1
    assert "left out of /metrics" in caplog.text


def test_the_multiprocess_route_vllm_mounts_serves_the_region_s_families(rec, tmp_path, monkeypatch):
    # vLLM's /metrics route in multiprocess mode: prometheus_fastapi_
    # instrumentator's, which makes a registry of its own at each scrape.
    # It comes with vLLM: CI runs this file in each vLLM-Omni environment
    # (EDGEMARK_REQUIRE_VLLM_OMNI=1, where its absence fails); the plain
    # test environment has no vLLM and skips it.
    try:
        import httpx  # noqa: F401 - fastapi's TestClient needs it
        import prometheus_fastapi_instrumentator  # noqa: F401
    except ImportError as e:
        if os.environ.get("EDGEMARK_REQUIRE_VLLM_OMNI") == "1" or os.environ.get("EDGEMARK_REQUIRE_VLLM") == "1":
            raise
        pytest.skip(f"vLLM's /metrics route is not installed here: {e}")
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from prometheus_fastapi_instrumentator import Instrumentator

    mp = tmp_path / "multiproc"
    mp.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(mp))
    import prometheus_fastapi_instrumentator.instrumentation as inst

    monkeypatch.setattr(inst, "CollectorRegistry", inst.CollectorRegistry)  # put back after the test

    def get_prometheus_registry():
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry

    registry = _metrics.wrap_registry(get_prometheus_registry, rec)()
    app = FastAPI()
    Instrumentator(registry=registry).expose(app)
    close(rec, 4)
    text = TestClient(app).get("/metrics").text
    one_set_of_families(text)
    assert sample(text, "edgemark_closed_requests_total") == 4
    # Hooked once: a second registry asked for adds no second collector.
    _metrics.wrap_registry(get_prometheus_registry, rec)()
    one_set_of_families(TestClient(app).get("/metrics").text)
