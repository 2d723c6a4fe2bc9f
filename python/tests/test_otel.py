"""``edgemark.otel.add_snapshot`` on spans of the real OpenTelemetry SDK,
read back through its in-memory exporter.

The SDK is in the ``test`` extra, which the test command installs: these
tests always run.
"""

from __future__ import annotations

import json
import time

import pytest

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import edgemark
from edgemark import Event
from edgemark.otel import add_snapshot


@pytest.fixture
def tracer():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("edgemark-test"), exporter
    provider.shutdown()


def _request():
    """A closed request of a real region: edge 0->1 in the region's clock,
    edge 1->2 partly measured elsewhere."""
    region = edgemark.Region.in_memory(edges=[(0, 1), (1, 2)], domains=["worker"])
    token = region.begin()
    assert region.record(token, 0, 1, Event.PRODUCER_FIRST_NONEMPTY_EMIT, chunk_seq=2, elapsed_ms=1.0)
    assert region.record(token, 0, 1, Event.EDGE_FIRST_SEND_COMPLETE, elapsed_ms=1.25)
    assert region.record(token, 0, 1, Event.CONSUMER_FIRST_ACCEPT, elapsed_ms=4.0)
    assert region.record(token, 1, 2, Event.PRODUCER_FIRST_NONEMPTY_EMIT, elapsed_ms=5.0)
    assert region.record(
        token, 1, 2, Event.EDGE_FIRST_SEND_COMPLETE, elapsed_ms=0.5, clock_domain="worker"
    )
    assert region.record(token, 1, 2, Event.CONSUMER_FIRST_ACCEPT, elapsed_ms=6.0)
    return region.close(token)


def test_each_boundary_is_an_event_at_its_absolute_time(tracer):
    t, exporter = tracer
    snap = _request()
    origin = time.time_ns()
    with t.start_as_current_span("request", start_time=origin) as span:
        assert add_snapshot(span, snap) == 6
    (done,) = exporter.get_finished_spans()
    events = [(e.name, e.timestamp, dict(e.attributes)) for e in done.events]
    e01 = [e for e in events if e[2]["edgemark.edge"] == "0->1"]
    assert [e[0] for e in e01] == [
        "producer_first_nonempty_emit",
        "edge_first_send_complete",
        "consumer_first_accept",
    ]
    assert [e[1] - origin for e in e01] == [1_000_000, 1_250_000, 4_000_000]
    assert e01[1][2]["edgemark.since_previous_ms"] == 0.25
    assert e01[1][2]["edgemark.previous_event"] == "producer_first_nonempty_emit"
    assert e01[0][2]["edgemark.segment"] == 0
    assert e01[0][2]["edgemark.clock_domain"] == "host_monotonic"

    e12 = {e[0]: e for e in events if e[2]["edgemark.edge"] == "1->2"}
    foreign = e12["edge_first_send_complete"]
    # Measured elsewhere: at the origin, its relative time kept, and never
    # subtracted from or to a value of the region's clock.
    assert foreign[1] == origin
    assert foreign[2]["edgemark.placed_at_origin"] is True
    assert foreign[2]["edgemark.elapsed_ms"] == 0.5
    assert foreign[2]["edgemark.clock_domain"] == "worker"
    assert "edgemark.since_previous_ms" not in foreign[2]
    accept = e12["consumer_first_accept"]
    assert "edgemark.since_previous_ms" not in accept[2]
    # Within one segment, events come in time order.
    times = [e[1] for e in events if e[2]["edgemark.edge"] == "1->2"]
    assert times == sorted(times)


def test_an_explicit_origin_and_the_json_text(tracer):
    t, exporter = tracer
    snap = _request()
    with t.start_as_current_span("request") as span:
        n = add_snapshot(span, json.dumps(snap), origin_unix_ns=1_700_000_000_000_000_000)
    assert n == 6
    (done,) = exporter.get_finished_spans()
    first = done.events[0]
    assert first.name == "producer_first_nonempty_emit"
    assert first.timestamp == 1_700_000_000_001_000_000


def test_a_span_not_recording_gets_nothing_and_bad_input_is_refused(tracer):
    from opentelemetry import trace

    snap = _request()
    assert add_snapshot(trace.INVALID_SPAN, snap) == 0
    t, _ = tracer
    with t.start_as_current_span("request") as span:
        with pytest.raises(TypeError):
            add_snapshot(span, [1, 2])
        with pytest.raises(ValueError):
            add_snapshot(span, snap, origin_unix_ns=-1)
        assert add_snapshot(span, {}) == 0


def test_a_closed_request_of_drain_closed_carries_its_origin(tracer):
    t, exporter = tracer
    region = edgemark.Region.in_memory(edges=[(0, 1)])
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    token = region.begin(traceparent=parent)
    assert region.record(token, 0, 1, Event.PRODUCER_FIRST_NONEMPTY_EMIT, elapsed_ms=2.0)
    region.close(token)
    (closed,) = region.drain_closed()
    with t.start_as_current_span("request") as span:
        assert add_snapshot(span, closed) == 1
    (done,) = exporter.get_finished_spans()
    assert done.events[0].timestamp == closed["origin_unix_ns"] + 2_000_000
