"""The upstream recorder's test cases through ``edgemark.stream_edge``, with
the upstream values and call shapes: once in one process, and once with
every record made by the stage process that observes the event, through a
handle it received pickled. Each runs against a region given to
``RequestStreamEdgeEvents(region=...)`` and against the process-wide
default region (``RequestStreamEdgeEvents()``)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from _se import ClientRequestState, Orchestrator, Remote, Workers
from edgemark import Region
from edgemark.stream_edge import RequestStreamEdgeEvents, StreamEdgeEvent, StreamEdgeKey

#: The clock domains the upstream cases name.
DOMAINS = ("orchestrator.segment-0", "segment-1", "worker", "sender", "receiver")


@pytest.fixture(scope="module")
def workers():
    w = Workers()
    yield w
    w.stop()


@pytest.fixture(scope="module")
def given_region(tmp_path_factory):
    path = tmp_path_factory.mktemp("se") / "cases.region"
    return Region.create(path, edges=[(0, 1), (1, 2)], slots=64, domains=DOMAINS)


@dataclass
class Setup:
    """How a case makes requests and where their handles record."""

    region: object  # the region for RequestStreamEdgeEvents(region=...), None for the default
    remote: object  # None, or the Workers that record

    def events(self) -> RequestStreamEdgeEvents:
        return RequestStreamEdgeEvents(region=self.region)

    def request(self, request_id, external_request_id=None) -> ClientRequestState:
        return ClientRequestState(request_id, external_request_id, region=self.region)

    def stage(self, handle):
        """The handle as the stage that observes each event uses it."""
        return handle if self.remote is None else Remote(self.remote, handle)


@pytest.fixture(
    params=[
        ("given", "in_process"),
        ("given", "processes"),
        ("default", "in_process"),
        ("default", "processes"),
    ],
    ids=lambda p: "-".join(p),
)
def s(request):
    region_kind, mode = request.param
    region = request.getfixturevalue("given_region") if region_kind == "given" else None
    remote = request.getfixturevalue("workers") if mode == "processes" else None
    return Setup(region, remote)


def observe(recorder, event, elapsed_ms, *, clock_domain="orchestrator.segment-0", meaningful=True, chunk_seq=None):
    return recorder.record(
        event, elapsed_ms=elapsed_ms, clock_domain=clock_domain, meaningful=meaningful, chunk_seq=chunk_seq
    )


@dataclass
class SyntheticTwoStagePipeline:
    """One payload over an edge: emit at 10.0 (chunk 3), send complete at
    12.0 if the send succeeded, accept at 14.0 if admission succeeded, first
    output at 25.0 if the consumer produced output; meaningful only when the
    payload is non-empty."""

    send_success: bool = True
    accept_success: bool = True
    output_ready: bool = True

    def deliver(self, edge, payload):
        meaningful = bool(payload)
        observe(edge, StreamEdgeEvent.PRODUCER_EMIT, 10.0, meaningful=meaningful, chunk_seq=3)
        if not self.send_success:
            return None
        observe(edge, StreamEdgeEvent.SEND_COMPLETE, 12.0, meaningful=meaningful)
        if not self.accept_success:
            return None
        observe(edge, StreamEdgeEvent.CONSUMER_ACCEPT, 14.0, meaningful=meaningful)
        output = payload if self.output_ready else ()
        observe(edge, StreamEdgeEvent.CONSUMER_OUTPUT, 25.0, meaningful=bool(output))
        return output


def test_case_01_two_stage_flow_records_each_event_once(s):
    request = s.request("internal", external_request_id="external")
    assert request.stream_edge_events is None
    events = request.enable_stream_edge_metrics()
    key = StreamEdgeKey(0, 1)
    edge = s.stage(events.start_segment(key))
    pipeline = SyntheticTwoStagePipeline()
    assert pipeline.deliver(edge, (7,)) == (7,)
    assert pipeline.deliver(edge, (8,)) == (8,)
    assert not observe(edge, StreamEdgeEvent.PRODUCER_EMIT, 99.0, chunk_seq=9)
    assert not observe(edge, StreamEdgeEvent.CONSUMER_OUTPUT, 100.0)
    record = events.snapshot()["0->1:0"]
    assert record["producer_first_nonempty_emit_ms"] == 10.0
    assert record["edge_first_send_complete_ms"] == 12.0
    assert record["consumer_first_accept_ms"] == 14.0
    assert record["consumer_first_nonempty_output_ms"] == 25.0
    assert record["first_chunk_seq"] == 3
    assert record["clock_domains"] == {e.value: "orchestrator.segment-0" for e in StreamEdgeEvent}
    assert events.elapsed_between(key, StreamEdgeEvent.PRODUCER_EMIT, StreamEdgeEvent.SEND_COMPLETE) == 2.0
    text = json.dumps(events.snapshot())
    assert "internal" not in text
    assert "external" not in text
    assert str(events.token) not in text
    request.release_stream_edge_metrics()


@pytest.mark.parametrize("failure", ["send", "admission"])
def test_case_02_failed_handoff_leaves_unreached_events_null(s, failure):
    events = s.events()
    edge = s.stage(events.start_segment(StreamEdgeKey(0, 1)))
    pipeline = SyntheticTwoStagePipeline(send_success=failure != "send", accept_success=failure != "admission")
    assert pipeline.deliver(edge, (7,)) is None
    record = events.snapshot()["0->1:0"]
    assert record["producer_first_nonempty_emit_ms"] == 10.0
    assert record["edge_first_send_complete_ms"] == (12.0 if failure == "admission" else None)
    assert record["consumer_first_accept_ms"] is None
    assert record["consumer_first_nonempty_output_ms"] is None
    events.close()


def test_case_03_empty_terminal_does_not_create_first_events(s):
    events = s.events()
    edge = s.stage(events.start_segment(StreamEdgeKey(0, 1)))
    assert SyntheticTwoStagePipeline().deliver(edge, ()) == ()
    assert events.snapshot() == {}
    assert events.close() == {}


def test_case_04_consumer_buffering_does_not_count_as_first_output(s):
    events = s.events()
    edge = s.stage(events.start_segment(StreamEdgeKey(0, 1)))
    assert SyntheticTwoStagePipeline(output_ready=False).deliver(edge, (7,)) == ()
    record = events.snapshot()["0->1:0"]
    assert record["consumer_first_accept_ms"] == 14.0
    assert record["consumer_first_nonempty_output_ms"] is None
    assert SyntheticTwoStagePipeline().deliver(edge, (8,)) == (8,)
    record = events.snapshot()["0->1:0"]
    assert record["consumer_first_nonempty_output_ms"] == 25.0
    assert record["consumer_first_accept_ms"] == 14.0
    events.close()


def test_case_05_edges_requests_and_segments_are_isolated_and_old_segments_are_fenced(s):
    first = s.events()
    second = s.events()
    old = s.stage(first.start_segment(StreamEdgeKey(0, 1, 0)))
    assert observe(old, StreamEdgeEvent.PRODUCER_EMIT, 10.0)
    current = s.stage(first.start_segment(StreamEdgeKey(0, 1, 1)))
    assert observe(current, StreamEdgeEvent.PRODUCER_EMIT, 5.0, clock_domain="segment-1")
    assert not observe(old, StreamEdgeEvent.SEND_COMPLETE, 12.0)
    other_edge = s.stage(first.start_segment(StreamEdgeKey(1, 2)))
    assert observe(other_edge, StreamEdgeEvent.CONSUMER_ACCEPT, 20.0, clock_domain="worker")
    other_request = s.stage(second.start_segment(StreamEdgeKey(0, 1)))
    assert observe(other_request, StreamEdgeEvent.PRODUCER_EMIT, 1.0)
    snap = first.snapshot()
    assert snap["0->1:0"]["producer_first_nonempty_emit_ms"] == 10.0
    assert snap["0->1:0"]["edge_first_send_complete_ms"] is None
    assert snap["0->1:1"]["producer_first_nonempty_emit_ms"] == 5.0
    assert snap["0->1:1"]["clock_domains"] == {"producer_first_nonempty_emit": "segment-1"}
    assert snap["1->2:0"]["consumer_first_accept_ms"] == 20.0
    assert snap["1->2:0"]["clock_domains"] == {"consumer_first_accept": "worker"}
    assert set(snap) == {"0->1:0", "0->1:1", "1->2:0"}
    assert second.snapshot()["0->1:0"]["producer_first_nonempty_emit_ms"] == 1.0
    assert list(second.snapshot()) == ["0->1:0"]
    with pytest.raises(ValueError, match="retired"):
        first.start_segment(StreamEdgeKey(0, 1, 0))
    first.close()
    second.close()


def test_case_06_cross_clock_deltas_are_unset_and_snapshots_are_detached(s):
    events = s.events()
    key = StreamEdgeKey(0, 1)
    edge = s.stage(events.start_segment(key))
    observe(edge, StreamEdgeEvent.PRODUCER_EMIT, 100.0, clock_domain="sender")
    observe(edge, StreamEdgeEvent.SEND_COMPLETE, 103.0, clock_domain="sender")
    observe(edge, StreamEdgeEvent.CONSUMER_ACCEPT, 5.0, clock_domain="receiver")
    assert events.elapsed_between(key, StreamEdgeEvent.SEND_COMPLETE, StreamEdgeEvent.CONSUMER_ACCEPT) is None
    assert events.elapsed_between(key, StreamEdgeEvent.CONSUMER_ACCEPT, StreamEdgeEvent.CONSUMER_OUTPUT) is None
    snapshot = events.snapshot()
    snapshot["0->1:0"]["clock_domains"].clear()
    snapshot["0->1:0"]["producer_first_nonempty_emit_ms"] = 999.0
    assert events.snapshot()["0->1:0"]["producer_first_nonempty_emit_ms"] == 100.0
    assert events.snapshot()["0->1:0"]["clock_domains"]["edge_first_send_complete"] == "sender"
    assert events.elapsed_between(key, StreamEdgeEvent.PRODUCER_EMIT, StreamEdgeEvent.SEND_COMPLETE) == 3.0
    events.close()


def test_case_07_zero_elapsed_time_is_observed_and_negative_order_has_no_delta(s):
    events = s.events()
    key = StreamEdgeKey(0, 1)
    edge = s.stage(events.start_segment(key))
    assert observe(edge, StreamEdgeEvent.PRODUCER_EMIT, 10.0)
    assert observe(edge, StreamEdgeEvent.SEND_COMPLETE, 0.0)
    record = events.snapshot()["0->1:0"]
    assert record["edge_first_send_complete_ms"] == 0.0
    assert record["consumer_first_accept_ms"] is None
    assert events.elapsed_between(key, StreamEdgeEvent.PRODUCER_EMIT, StreamEdgeEvent.SEND_COMPLETE) is None
    events.close()


def test_case_08_finalization_fences_late_events_and_external_id_reuse(s):
    request = s.request("old", external_request_id="external")
    events = request.enable_stream_edge_metrics()
    edge = s.stage(events.start_segment(StreamEdgeKey(0, 1)))
    assert observe(edge, StreamEdgeEvent.PRODUCER_EMIT, 10.0)
    snapshot = events.snapshot()
    request.release_stream_edge_metrics()
    request.release_stream_edge_metrics()
    assert not observe(edge, StreamEdgeEvent.SEND_COMPLETE, 12.0)
    assert events.snapshot() == {}
    assert snapshot["0->1:0"]["producer_first_nonempty_emit_ms"] == 10.0
    with pytest.raises(RuntimeError, match="released"):
        request.enable_stream_edge_metrics()
    with pytest.raises(RuntimeError, match="released"):
        events.start_segment(StreamEdgeKey(0, 1))
    replacement = s.request("new", external_request_id="external")
    fresh = replacement.enable_stream_edge_metrics()
    assert fresh.snapshot() == {}
    # The old handle cannot write into the new instance, however late.
    assert not observe(edge, StreamEdgeEvent.SEND_COMPLETE, 12.0)
    assert fresh.snapshot() == {}
    replacement.release_stream_edge_metrics()


@pytest.mark.parametrize("reason", ["normal", "client_disconnect", "timeout", "stage_error", "abort"])
def test_case_09_every_cleanup_path_releases(s, reason):
    omni = Orchestrator()
    request = s.request("internal")
    events = request.enable_stream_edge_metrics()
    edge = s.stage(events.start_segment(StreamEdgeKey(0, 1)))
    assert observe(edge, StreamEdgeEvent.PRODUCER_EMIT, 10.0)
    omni.request_states = {"internal": request}
    if reason == "abort":
        omni.abort("internal")
    else:
        omni._log_summary_and_cleanup("internal", reason=reason)
    assert omni.request_states == {}
    assert events.snapshot() == {}
    assert not observe(edge, StreamEdgeEvent.SEND_COMPLETE, 12.0)
    assert not events.region.is_open(events.token)
    with pytest.raises(RuntimeError, match="released"):
        request.enable_stream_edge_metrics()


def test_case_10_response_snapshot_is_incremental_detached_and_absent_by_default(s):
    omni = Orchestrator()
    request = s.request("internal")
    omni.request_states = {"internal": request}
    assert "stream_edge_metrics" not in omni.response_metrics("internal")
    events = request.enable_stream_edge_metrics()
    edge = s.stage(events.start_segment(StreamEdgeKey(0, 1)))
    observe(edge, StreamEdgeEvent.PRODUCER_EMIT, 10.0)
    first = omni.response_metrics("internal")["stream_edge_metrics"]
    assert first["0->1:0"]["edge_first_send_complete_ms"] is None
    observe(edge, StreamEdgeEvent.SEND_COMPLETE, 12.0)
    second = omni.response_metrics("internal")["stream_edge_metrics"]
    assert second["0->1:0"]["producer_first_nonempty_emit_ms"] == 10.0
    assert second["0->1:0"]["edge_first_send_complete_ms"] == 12.0
    assert first["0->1:0"]["edge_first_send_complete_ms"] is None
    omni.abort("internal")


@pytest.mark.parametrize("elapsed_ms", [-1.0, float("inf"), float("nan")], ids=["negative", "inf", "nan"])
def test_case_11_invalid_elapsed_time_is_rejected_without_state(s, elapsed_ms):
    events = s.events()
    edge = s.stage(events.start_segment(StreamEdgeKey(0, 1)))
    with pytest.raises(ValueError, match="finite"):
        observe(edge, StreamEdgeEvent.PRODUCER_EMIT, elapsed_ms)
    assert events.snapshot() == {}
    # The cell is untouched: a valid value still records.
    assert observe(edge, StreamEdgeEvent.PRODUCER_EMIT, 1.0)
    assert events.close()["0->1:0"]["producer_first_nonempty_emit_ms"] == 1.0

