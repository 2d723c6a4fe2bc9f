"""The upstream recorder's test cases through the Python API,
with the same values, once in one process and once with every stage
observation recorded by a real stage process that attached by path."""

from __future__ import annotations

import json
import math

import pytest

from _pipeline import (
    ACCEPT,
    E01,
    E12,
    OK,
    OUTPUT,
    PRODUCER,
    SEND,
    Delivery,
    InProcess,
    Orchestrator,
    Processes,
    Workers,
    deliver,
    ms,
    obs,
    record_with,
    response_metrics,
)
from edgemark import Event, Outcome, Region, elapsed_between


@pytest.fixture(scope="module")
def workers():
    w = Workers()
    yield w
    w.stop()


@pytest.fixture(params=["in_process", "processes"])
def p(request, tmp_path):
    if request.param == "in_process":
        return InProcess()
    return Processes(request.getfixturevalue("workers"), tmp_path / "cases.region")


def test_case_01_two_stage_flow_each_event_once(p):
    # Recording off: a disabled region keeps no state at all.
    off = Region.disabled()
    assert off.begin() is None
    t_off = p.owner.begin()
    for o in [obs(E01, PRODUCER).ms(10.0).chunk(3), obs(E01, SEND).ms(12.0)]:
        assert record_with(off, t_off, o) == Outcome.DISABLED
        assert record_with(off, None, o) == "disabled"
    assert off.snapshot(t_off) == {}
    assert not off.is_open(t_off)
    p.owner.close(t_off)

    # Recording on.
    orch_ids = {"external-req-7": "internal-req-7"}
    token = p.owner.begin()
    assert deliver(p, token, OK) == ["recorded"] * 4
    assert deliver(p, token, OK) == ["duplicate"] * 4
    assert p.record(token, obs(E01, PRODUCER).ms(99.0).chunk(9)) == "duplicate"
    assert p.record(token, obs(E01, OUTPUT).ms(100.0)) == "duplicate"
    s = p.owner.snapshot(token)
    assert ms(s, "0->1:0", PRODUCER) == 10.0
    assert ms(s, "0->1:0", OUTPUT) == 25.0
    assert s["0->1:0"]["first_chunk_seq"] == 3
    assert elapsed_between(s["0->1:0"], PRODUCER, SEND) == 2.0
    text = json.dumps(s)
    for external, internal in orch_ids.items():
        assert external not in text and internal not in text, text
    assert str(token) not in text
    p.owner.close(token)


def test_case_02_failed_send(p):
    t = p.owner.begin()
    assert deliver(p, t, Delivery(send_ok=False)) == ["recorded"]
    s = p.owner.close(t)
    assert ms(s, "0->1:0", PRODUCER) == 10.0
    for e in (SEND, ACCEPT, OUTPUT):
        assert ms(s, "0->1:0", e) is None, e
        assert s["0->1:0"][e.key] is None


def test_case_02_failed_admission(p):
    t = p.owner.begin()
    assert deliver(p, t, Delivery(admit_ok=False)) == ["recorded"] * 2
    s = p.owner.close(t)
    assert ms(s, "0->1:0", SEND) == 12.0
    assert s["0->1:0"][ACCEPT.key] is None
    assert s["0->1:0"][OUTPUT.key] is None


def test_case_03_empty_terminal_payload(p):
    t = p.owner.begin()
    assert deliver(p, t, Delivery(nonempty=False)) == ["not_meaningful"] * 4
    assert p.owner.snapshot(t) == {}
    assert p.owner.snapshot_json(t) == "{}"
    assert p.owner.close_json(t) == "{}"


def test_case_04_consumer_buffering(p):
    t = p.owner.begin()
    assert deliver(p, t, Delivery(output=False)) == ["recorded"] * 3
    s = p.owner.snapshot(t)
    assert ms(s, "0->1:0", ACCEPT) == 14.0
    assert s["0->1:0"][OUTPUT.key] is None
    out = deliver(p, t, OK)
    assert out[3] == "recorded"
    assert out[:3] == ["duplicate"] * 3
    s = p.owner.close(t)
    assert ms(s, "0->1:0", OUTPUT) == 25.0
    assert ms(s, "0->1:0", ACCEPT) == 14.0


def test_case_05_isolation_and_fencing(p):
    a = p.owner.begin()
    b = p.owner.begin()
    assert p.record(a, obs(E01, PRODUCER).ms(10.0)) == "recorded"
    assert p.start_segment(a, E01, 1) == "started"
    assert p.record(a, obs(E01, PRODUCER).ms(5.0).in_domain("segment_clock").seg(1)) == "recorded"
    # The old segment-0 handle is fenced.
    assert p.record(a, obs(E01, SEND).ms(12.0).seg(0)) == "stale_segment"
    assert p.record(a, obs(E12, ACCEPT).ms(20.0).in_domain("edge12_clock")) == "recorded"
    assert p.record(b, obs(E01, PRODUCER).ms(1.0)) == "recorded"

    sa = p.owner.snapshot(a)
    sb = p.owner.snapshot(b)
    assert ms(sa, "0->1:0", PRODUCER) == 10.0
    assert sa["0->1:0"][SEND.key] is None
    assert ms(sa, "0->1:1", PRODUCER) == 5.0
    assert sa["0->1:1"]["clock_domains"]["producer_first_nonempty_emit"] == "segment_clock"
    assert ms(sa, "1->2:0", ACCEPT) == 20.0
    assert sa["1->2:0"]["clock_domains"]["consumer_first_accept"] == "edge12_clock"
    assert ms(sb, "0->1:0", PRODUCER) == 1.0
    assert list(sb) == ["0->1:0"], "B sees nothing of A"
    # Starting segment 0 again is refused as retired (upstream raised).
    assert p.start_segment(a, E01, 0) == "stale_segment"
    assert p.start_segment(a, E01, 1) == "stale_segment"
    p.owner.close(a)
    p.owner.close(b)


def test_case_06_cross_clock_deltas_and_detached_snapshots(p):
    t = p.owner.begin()
    assert p.record(t, obs(E01, PRODUCER).ms(100.0).in_domain("sender")) == "recorded"
    assert p.record(t, obs(E01, SEND).ms(103.0).in_domain("sender")) == "recorded"
    assert p.record(t, obs(E01, ACCEPT).ms(5.0).in_domain("receiver")) == "recorded"
    first = p.owner.snapshot(t)
    seg = first["0->1:0"]
    assert elapsed_between(seg, SEND, ACCEPT) is None
    assert elapsed_between(seg, ACCEPT, OUTPUT) is None
    # Mutate what was handed out.
    seg["producer_first_nonempty_emit_ms"] = 1.0
    seg["clock_domains"]["edge_first_send_complete"] = "receiver"
    del first["0->1:0"]
    nxt = p.owner.snapshot(t)
    assert ms(nxt, "0->1:0", PRODUCER) == 100.0
    assert nxt["0->1:0"]["clock_domains"]["edge_first_send_complete"] == "sender"
    assert elapsed_between(nxt["0->1:0"], PRODUCER, SEND) == 3.0
    p.owner.close(t)


def test_case_07_zero_versus_missing_and_order(p):
    t = p.owner.begin()
    assert p.record(t, obs(E01, PRODUCER).ms(10.0)) == "recorded"
    assert p.record(t, obs(E01, SEND).ms(0.0)) == "recorded"
    s = p.owner.close(t)
    assert ms(s, "0->1:0", SEND) == 0.0
    assert isinstance(s["0->1:0"][SEND.key], float)
    assert s["0->1:0"][ACCEPT.key] is None
    assert elapsed_between(s["0->1:0"], PRODUCER, SEND) is None


def test_case_08_close_fences_late_events_and_id_reuse(p):
    owner = p.owner
    orch = Orchestrator(owner)
    t = orch.add("req-1")
    assert p.record(t, obs(E01, PRODUCER).ms(10.0)) == "recorded"
    before = owner.snapshot(t)
    last = orch.drop_request("req-1")
    assert ms(last, "0->1:0", PRODUCER) == 10.0
    assert not owner.is_open(t)
    # Released twice: idempotent.
    assert owner.close(t) == {}
    assert p.record(t, obs(E01, SEND).ms(12.0)) == "closed"
    assert owner.snapshot_json(t) == "{}"
    assert ms(before, "0->1:0", PRODUCER) == 10.0
    # Switching recording on again for the released request is refused.
    assert p.start_segment(t, E01, 1) == "closed"
    # The same external ID again is a fresh instance.
    t2 = orch.add("req-1")
    assert t2 != t
    assert owner.snapshot(t2) == {}
    assert owner.is_open(t2)
    late = p.record(t, obs(E01, SEND).ms(12.0))
    assert late in ("closed", "reused"), late
    assert owner.snapshot(t2) == {}
    orch.drop_request("req-1")


@pytest.mark.parametrize("path", ["normal", "client_disconnect", "timeout", "stage_error"])
def test_case_09_every_cleanup_path_releases(p, path):
    owner = p.owner
    orch = Orchestrator(owner)
    t = orch.add(path)
    assert p.record(t, obs(E01, PRODUCER).ms(10.0)) == "recorded"
    # Whatever the reason, the path calls the one removal helper.
    last = orch.remove(path, path)
    assert ms(last, "0->1:0", PRODUCER) == 10.0
    assert not orch.states, "request state is gone"
    assert not owner.is_open(t)
    assert owner.snapshot_json(t) == "{}"
    assert p.record(t, obs(E01, SEND).ms(12.0)) == "closed"
    assert owner.open_requests() == []


def test_case_10_incremental_detached_response_snapshots(p):
    t = p.owner.begin()
    assert response_metrics(Region.disabled(), t) is None
    assert p.record(t, obs(E01, PRODUCER).ms(10.0)) == "recorded"
    first = response_metrics(p.owner, t)
    assert first["0->1:0"]["edge_first_send_complete_ms"] is None
    assert p.record(t, obs(E01, SEND).ms(12.0)) == "recorded"
    second = response_metrics(p.owner, t)
    assert second["0->1:0"]["producer_first_nonempty_emit_ms"] == 10.0
    assert second["0->1:0"]["edge_first_send_complete_ms"] == 12.0
    assert first["0->1:0"]["edge_first_send_complete_ms"] is None
    p.owner.close(t)


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan], ids=["negative", "inf", "nan"])
def test_case_11_invalid_elapsed_times(p, bad):
    t = p.owner.begin()
    assert p.record(t, obs(E01, PRODUCER).ms(bad)) == "invalid"
    assert p.owner.snapshot(t) == {}
    # The cell is untouched: a valid value still records.
    assert p.record(t, obs(E01, PRODUCER).ms(1.0)) == "recorded"
    p.owner.close(t)


def test_snapshot_dict_is_the_core_json_exactly(p):
    """The dict is json.loads of the core's own JSON: same keys, same order,
    floats stay floats, missing is None."""
    t = p.owner.begin()
    deliver(p, t, Delivery(output=False))
    s = p.owner.snapshot(t)
    assert s == json.loads(p.owner.snapshot_json(t))
    assert list(s["0->1:0"]) == [
        "from_stage",
        "to_stage",
        "segment_index",
        "first_chunk_seq",
        "clock_domains",
        "producer_first_nonempty_emit_ms",
        "edge_first_send_complete_ms",
        "consumer_first_accept_ms",
        "consumer_first_nonempty_output_ms",
    ]
    assert json.dumps(s, separators=(",", ":")) == p.owner.snapshot_json(t)
    seg = s["0->1:0"]
    for e in (PRODUCER, SEND, ACCEPT):
        assert type(seg[e.key]) is float
    assert seg[Event.CONSUMER_FIRST_NONEMPTY_OUTPUT.key] is None
    assert type(seg["first_chunk_seq"]) is int
    assert seg["from_stage"] == 0 and seg["to_stage"] == 1 and seg["segment_index"] == 0
    assert p.owner.close(t) == s
