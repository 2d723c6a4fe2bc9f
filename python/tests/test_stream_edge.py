"""``edgemark.stream_edge`` in one process: the upstream module's names and
contract, what edgemark adds (handles that pickle, the shared clock), and
where it fails open."""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import pickle
import subprocess
import sys
import typing

import pytest

import edgemark
from edgemark import Region, monotonic_ns
from edgemark import stream_edge
from edgemark.stream_edge import (
    RequestStreamEdgeEvents,
    StreamEdgeEvent,
    StreamEdgeKey,
    StreamEdgeRecorder,
    StreamEdgeSnapshot,
)

E = StreamEdgeEvent
K01 = StreamEdgeKey(0, 1)


@pytest.fixture
def region(tmp_path):
    return Region.create(tmp_path / "se.region", edges=[(0, 1), (1, 2)], slots=8, domains=["device"])


def test_events_are_str_members_named_as_snapshots_name_them():
    assert [e.value for e in StreamEdgeEvent] == list(edgemark.EVENT_NAMES)
    assert [e.name for e in StreamEdgeEvent] == [
        "PRODUCER_EMIT",
        "SEND_COMPLETE",
        "CONSUMER_ACCEPT",
        "CONSUMER_OUTPUT",
    ]
    assert all(isinstance(e, str) for e in StreamEdgeEvent)
    assert StreamEdgeEvent("edge_first_send_complete") is E.SEND_COMPLETE


def test_key_is_frozen_hashable_and_defaults_to_segment_zero():
    k = StreamEdgeKey(0, 1)
    assert k.segment_index == 0
    assert k == StreamEdgeKey(0, 1, 0)
    assert {k: 1}[StreamEdgeKey(0, 1)] == 1
    assert StreamEdgeKey(1, 0) != k
    with pytest.raises(dataclasses.FrozenInstanceError):
        k.segment_index = 2  # type: ignore[misc]


@pytest.mark.parametrize("args", [(-1, 1), (0, -1), (0, 1, -1), (2, 2)])
def test_key_refuses_negative_values_and_equal_stages(args):
    with pytest.raises(ValueError, match="distinct non-negative stages"):
        StreamEdgeKey(*args)


def test_snapshot_typed_dict_has_the_snapshot_fields(region):
    ev = RequestStreamEdgeEvents(region=region)
    h = ev.start_segment(K01)
    assert h.record(E.PRODUCER_EMIT, meaningful=True)
    seg = ev.snapshot()["0->1:0"]
    assert list(seg) == list(typing.get_type_hints(StreamEdgeSnapshot))


def test_values_come_back_as_given_to_the_microsecond(region):
    ev = RequestStreamEdgeEvents(region=region)
    h = ev.start_segment(K01)
    values = {E.PRODUCER_EMIT: 10.0, E.SEND_COMPLETE: 12.345, E.CONSUMER_ACCEPT: 0.001, E.CONSUMER_OUTPUT: 86_400_000.5}
    for e, v in values.items():
        assert h.record(e, elapsed_ms=v, clock_domain="device", meaningful=True)
    seg = ev.close()["0->1:0"]
    for e, v in values.items():
        assert seg[e.value + "_ms"] == v
        assert type(seg[e.value + "_ms"]) is float


def test_integer_elapsed_times_are_milliseconds_too(region):
    ev = RequestStreamEdgeEvents(region=region)
    assert ev.start_segment(K01).record(E.PRODUCER_EMIT, elapsed_ms=10, clock_domain="device", meaningful=True)
    assert ev.snapshot()["0->1:0"]["producer_first_nonempty_emit_ms"] == 10.0


def test_record_without_elapsed_ms_reads_the_shared_clock(region):
    t0 = monotonic_ns()
    ev = RequestStreamEdgeEvents(region=region)
    t1 = monotonic_ns()
    h = ev.start_segment(K01)
    c0 = monotonic_ns()
    assert h.record(E.CONSUMER_ACCEPT, meaningful=True)
    c1 = monotonic_ns()
    seg = ev.close()["0->1:0"]
    assert seg["clock_domains"] == {"consumer_first_accept": "host_monotonic"}
    us = round(seg["consumer_first_accept_ms"] * 1000)
    assert (c0 - t1) // 1000 - 1 <= us <= (c1 - t0) // 1000 + 1


def test_start_segment_of_the_current_segment_is_another_handle_on_it(region):
    ev = RequestStreamEdgeEvents(region=region)
    a = ev.start_segment(K01)
    b = ev.start_segment(StreamEdgeKey(0, 1, 0))
    assert a.record(E.PRODUCER_EMIT, meaningful=True)
    assert not b.record(E.PRODUCER_EMIT, meaningful=True), "the same cell: a duplicate"
    assert b.record(E.SEND_COMPLETE, meaningful=True)
    assert set(ev.snapshot()) == {"0->1:0"}


def test_a_newer_segment_fences_the_old_handles_and_an_older_one_is_retired(region):
    ev = RequestStreamEdgeEvents(region=region)
    s0 = ev.start_segment(K01)
    s3 = ev.start_segment(StreamEdgeKey(0, 1, 3))
    assert not s0.record(E.PRODUCER_EMIT, meaningful=True)
    assert s3.record(E.PRODUCER_EMIT, meaningful=True)
    assert list(ev.snapshot()) == ["0->1:3"]
    for older in (0, 2):
        with pytest.raises(ValueError, match="retired"):
            ev.start_segment(StreamEdgeKey(0, 1, older))
    # Other edges keep their own segments.
    assert ev.start_segment(StreamEdgeKey(1, 2)).record(E.PRODUCER_EMIT, meaningful=True)


def test_start_segment_after_close_is_released(region):
    ev = RequestStreamEdgeEvents(region=region)
    ev.close()
    with pytest.raises(RuntimeError, match="released"):
        ev.start_segment(K01)


def test_start_segment_takes_a_key(region):
    with pytest.raises(TypeError):
        RequestStreamEdgeEvents(region=region).start_segment((0, 1))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(elapsed_ms=-0.5, clock_domain="device"), "finite"),
        (dict(elapsed_ms=math.nan, clock_domain="device"), "finite"),
        (dict(elapsed_ms=-math.inf, clock_domain="device"), "finite"),
        (dict(elapsed_ms=1.0, clock_domain=""), "clock domain"),
        (dict(elapsed_ms=1.0, clock_domain="   "), "clock domain"),
        (dict(elapsed_ms=1.0), "clock domain"),
        (dict(clock_domain="device"), "needs elapsed_ms"),
        (dict(elapsed_ms=1.0, clock_domain="device", chunk_seq=-1), "non-negative"),
    ],
)
def test_bad_arguments_raise_on_an_open_request_and_leave_no_state(region, kwargs, match):
    ev = RequestStreamEdgeEvents(region=region)
    h = ev.start_segment(K01)
    with pytest.raises(ValueError, match=match):
        h.record(E.PRODUCER_EMIT, meaningful=True, **kwargs)
    assert ev.snapshot() == {}
    # Upstream's order: an empty payload, then a closed request, return
    # False before the arguments are looked at.
    assert h.record(E.PRODUCER_EMIT, meaningful=False, **kwargs) is False
    ev.close()
    assert h.record(E.PRODUCER_EMIT, meaningful=True, **kwargs) is False


def test_a_domain_name_the_core_refuses_raises_like_a_blank_one(region):
    # The core says which names name a domain: one over 32 bytes or with a
    # control character is refused as a blank one is.
    ev = RequestStreamEdgeEvents(region=region)
    h = ev.start_segment(K01)
    for name in ("d" * 33, "bad\nname", "\u202eevil"):
        with pytest.raises(ValueError, match="clock domain"):
            h.record(E.PRODUCER_EMIT, elapsed_ms=1.0, clock_domain=name, meaningful=True)
    assert ev.snapshot() == {}
    assert h.record(E.PRODUCER_EMIT, elapsed_ms=1.0, clock_domain="d" * 32, meaningful=True)
    ev.close()
    assert h.record(E.SEND_COMPLETE, elapsed_ms=1.0, clock_domain="d" * 33, meaningful=True) is False


@pytest.mark.parametrize("event", ["no_such_event", None, 3.5, 17])
def test_an_unknown_event_raises_value_error(region, event):
    ev = RequestStreamEdgeEvents(region=region)
    with pytest.raises(ValueError, match="Unknown stream-edge event"):
        ev.start_segment(K01).record(event, meaningful=True)
    assert ev.snapshot() == {}


def test_events_may_be_given_by_value_or_as_edgemark_events(region):
    ev = RequestStreamEdgeEvents(region=region)
    h = ev.start_segment(K01)
    assert h.record("producer_first_nonempty_emit", meaningful=True)
    assert h.record(edgemark.Event.EDGE_FIRST_SEND_COMPLETE, meaningful=True)
    assert not h.record(E.SEND_COMPLETE, meaningful=True)


def test_meaningful_is_read_for_its_truth(region):
    ev = RequestStreamEdgeEvents(region=region)
    h = ev.start_segment(K01)
    assert not h.record(E.PRODUCER_EMIT, meaningful=())
    assert not h.record(E.PRODUCER_EMIT, meaningful=0)
    assert ev.snapshot() == {}
    assert h.record(E.PRODUCER_EMIT, meaningful=(7,))


def test_chunk_seq_is_kept_by_the_winning_producer_write_only(region):
    ev = RequestStreamEdgeEvents(region=region)
    h = ev.start_segment(K01)
    assert h.record(E.SEND_COMPLETE, meaningful=True, chunk_seq=11)
    assert ev.snapshot()["0->1:0"]["first_chunk_seq"] is None
    assert h.record(E.PRODUCER_EMIT, meaningful=True, chunk_seq=3)
    assert not h.record(E.PRODUCER_EMIT, meaningful=True, chunk_seq=9)
    assert ev.snapshot()["0->1:0"]["first_chunk_seq"] == 3


@pytest.mark.parametrize("chunk", [edgemark.MAX_CHUNK_SEQ + 1, 2**64, 2**200])
def test_a_chunk_seq_beyond_the_cell_is_false_not_an_error(region, chunk):
    ev = RequestStreamEdgeEvents(region=region)
    h = ev.start_segment(K01)
    assert h.record(E.PRODUCER_EMIT, meaningful=True, chunk_seq=chunk) is False
    assert ev.snapshot() == {}
    assert region.counters()["refused"]["out_of_range"] >= 1


def test_an_elapsed_time_beyond_the_cell_is_false(region):
    ev = RequestStreamEdgeEvents(region=region)
    h = ev.start_segment(K01)
    assert h.record(E.PRODUCER_EMIT, elapsed_ms=edgemark.MAX_ELAPSED_MS * 2, clock_domain="device", meaningful=True) is False
    assert ev.snapshot() == {}


def test_an_undeclared_edge_or_stage_beyond_32_bits_records_nothing(region):
    ev = RequestStreamEdgeEvents(region=region)
    for key in (StreamEdgeKey(3, 4), StreamEdgeKey(1, 0), StreamEdgeKey(0, 2**40), StreamEdgeKey(0, 1, 2**40)):
        h = ev.start_segment(key)
        assert h.record(E.PRODUCER_EMIT, meaningful=True) is False, key
    assert ev.snapshot() == {}


def test_a_full_region_runs_the_request_unrecorded(tmp_path):
    region = Region.create(tmp_path / "one.region", edges=[(0, 1)], slots=1)
    first = RequestStreamEdgeEvents(region=region)
    second = RequestStreamEdgeEvents(region=region)
    assert first.token is not None and second.token is None
    h = second.start_segment(K01)
    assert not h.recording
    assert h.record(E.PRODUCER_EMIT, meaningful=True) is False
    assert h.record(E.PRODUCER_EMIT, elapsed_ms=math.nan, clock_domain="x", meaningful=True) is False
    assert second.snapshot() == {}
    assert second.elapsed_between(K01, E.PRODUCER_EMIT, E.SEND_COMPLETE) is None
    assert second.close() == {}
    # Travels and stays unrecorded.
    assert pickle.loads(pickle.dumps(h)).record(E.PRODUCER_EMIT, meaningful=True) is False
    assert region.counters()["refused"]["region_full"] == 1
    assert first.start_segment(K01).record(E.PRODUCER_EMIT, meaningful=True)


def test_a_disabled_region_records_nothing():
    ev = RequestStreamEdgeEvents(region=Region.disabled())
    assert ev.token is None
    assert ev.start_segment(K01).record(E.PRODUCER_EMIT, meaningful=True) is False
    assert ev.snapshot() == {} and ev.close() == {}


def test_close_is_idempotent_returns_the_final_snapshot_and_fences_every_handle(region):
    ev = RequestStreamEdgeEvents(region=region)
    h = ev.start_segment(K01)
    travelled = pickle.loads(pickle.dumps(h))
    assert h.record(E.PRODUCER_EMIT, elapsed_ms=10.0, clock_domain="device", meaningful=True)
    final = ev.close()
    assert final["0->1:0"]["producer_first_nonempty_emit_ms"] == 10.0
    assert ev.close() == {}
    assert ev.snapshot() == {}
    assert ev.elapsed_between(K01, E.PRODUCER_EMIT, E.PRODUCER_EMIT) is None
    assert not h.record(E.SEND_COMPLETE, meaningful=True)
    assert not travelled.record(E.SEND_COMPLETE, meaningful=True)
    assert not region.is_open(h.token)


def test_elapsed_between_matches_upstream(region):
    ev = RequestStreamEdgeEvents(region=region)
    h = ev.start_segment(K01)
    h.record(E.PRODUCER_EMIT, elapsed_ms=10.5, clock_domain="device", meaningful=True)
    h.record(E.SEND_COMPLETE, elapsed_ms=12.75, clock_domain="device", meaningful=True)
    h.record(E.CONSUMER_ACCEPT, elapsed_ms=13.0, clock_domain="host_monotonic", meaningful=True)
    assert ev.elapsed_between(K01, E.PRODUCER_EMIT, E.SEND_COMPLETE) == 2.25
    assert ev.elapsed_between(K01, E.SEND_COMPLETE, E.PRODUCER_EMIT) is None
    assert ev.elapsed_between(K01, E.SEND_COMPLETE, E.CONSUMER_ACCEPT) is None
    assert ev.elapsed_between(K01, E.PRODUCER_EMIT, E.PRODUCER_EMIT) == 0.0
    assert ev.elapsed_between(StreamEdgeKey(1, 2), E.PRODUCER_EMIT, E.SEND_COMPLETE) is None


def test_a_handle_pickles_small_and_records_where_it_is_unpickled(region):
    ev = RequestStreamEdgeEvents(region=region)
    h = ev.start_segment(StreamEdgeKey(1, 2))
    wire = pickle.dumps(h)
    assert len(wire) <= 300, len(wire)
    back = pickle.loads(wire)
    assert isinstance(back, StreamEdgeRecorder)
    assert back.key == StreamEdgeKey(1, 2)
    assert back.token == h.token
    assert back.record(E.CONSUMER_ACCEPT, meaningful=True)
    assert ev.snapshot()["1->2:0"]["consumer_first_accept_ms"] is not None
    assert region.path in stream_edge._attached


def test_a_handle_on_an_in_memory_region_does_not_pickle():
    h = RequestStreamEdgeEvents(region=Region.in_memory()).start_segment(K01)
    with pytest.raises(TypeError, match="in-memory"):
        pickle.dumps(h)


def test_an_unattachable_region_gives_a_handle_that_records_nothing(tmp_path):
    path = tmp_path / "gone.region"
    region = Region.create(path, edges=[(0, 1)], slots=2)
    wire = pickle.dumps(RequestStreamEdgeEvents(region=region).start_segment(K01))
    os.unlink(path)
    stream_edge._attached.pop(str(path), None)
    back = pickle.loads(wire)
    assert back.record(E.PRODUCER_EMIT, meaningful=True) is False


def test_a_request_dropped_without_close_is_closed_when_collected(region):
    ev = RequestStreamEdgeEvents(region=region)
    token = ev.token
    h = ev.start_segment(K01)
    assert region.is_open(token)
    del ev
    gc.collect()
    assert not region.is_open(token)
    assert not h.record(E.PRODUCER_EMIT, meaningful=True)


def test_default_region_declares_every_directed_pair_of_the_default_stages():
    region = stream_edge.default_region()
    n = stream_edge.DEFAULT_STAGES
    assert sorted(region.edges) == [(a, b) for a in range(n) for b in range(n) if a != b]
    assert region.info()["slots"] == stream_edge.DEFAULT_SLOTS
    assert region.path.startswith(edgemark.default_dir())
    assert os.stat(region.path).st_mode & 0o077 == 0, "owner-only"
    assert RequestStreamEdgeEvents().region is region


def test_ten_thousand_requests_through_the_default_region_never_see_an_earlier_one():
    previous = None
    key = StreamEdgeKey(1, 2)
    for i in range(10_000):
        ev = RequestStreamEdgeEvents()
        assert ev.token is not None
        assert ev.snapshot() == {}, i
        h = ev.start_segment(key)
        if previous is not None:
            # The previous request's handle, after its close: refused, and
            # nothing of it shows in this request.
            assert not previous.record(E.CONSUMER_ACCEPT, meaningful=True)
            assert ev.snapshot() == {}, i
        assert h.record(E.PRODUCER_EMIT, meaningful=True, chunk_seq=i)
        final = ev.close()
        assert list(final) == ["1->2:0"]
        assert final["1->2:0"]["first_chunk_seq"] == i
        assert final["1->2:0"]["consumer_first_accept_ms"] is None
        previous = h


def _python(code: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_the_default_region_file_is_removed_when_its_creator_exits():
    code = (
        "import os\n"
        "from edgemark.stream_edge import RequestStreamEdgeEvents\n"
        "os.environ.pop('EDGEMARK_REGION', None)\n"
        "ev = RequestStreamEdgeEvents()\n"
        "print(ev.region.path)\n"
        "assert os.path.exists(ev.region.path)\n"
    )
    out = _python(code, env={"EDGEMARK_REGION": ""})
    assert out.returncode == 0, out.stderr
    path = out.stdout.strip()
    assert path.endswith(".region")
    assert not os.path.exists(path)


def test_the_default_region_attaches_to_edgemark_region(tmp_path):
    path = str(tmp_path / "shared.region")
    region = Region.create(path, edges=[(0, 1)], slots=4)
    code = (
        "from edgemark.stream_edge import RequestStreamEdgeEvents, StreamEdgeEvent, StreamEdgeKey\n"
        "ev = RequestStreamEdgeEvents()\n"
        "print(ev.region.path)\n"
        "print(ev.start_segment(StreamEdgeKey(0, 1)).record(StreamEdgeEvent.PRODUCER_EMIT, meaningful=True))\n"
    )
    out = _python(code, env={"EDGEMARK_REGION": path})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [path, "True"]
    assert os.path.exists(path), "an attached region is not the process's to remove"
    assert region.counters()["closed_requests"] == 1, "closed when the interpreter exits"


def test_a_bad_edgemark_region_fails_open_with_one_warning(tmp_path):
    bad = tmp_path / "not-a-region"
    bad.write_bytes(b"hello")
    code = (
        "import logging\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from edgemark import stream_edge\n"
        "from edgemark.stream_edge import RequestStreamEdgeEvents, StreamEdgeEvent, StreamEdgeKey\n"
        "for _ in range(3):\n"
        "    ev = RequestStreamEdgeEvents()\n"
        "    print(ev.start_segment(StreamEdgeKey(0, 1)).record(StreamEdgeEvent.PRODUCER_EMIT, meaningful=True), ev.snapshot())\n"
        "try:\n"
        "    stream_edge.default_region()\n"
        "except ValueError as e:\n"
        "    print('raises', type(e).__name__)\n"
    )
    out = _python(code, env={"EDGEMARK_REGION": str(bad)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["False {}"] * 3 + ["raises ValueError"]
    assert out.stderr.count("stream-edge metrics are off") == 1, out.stderr


def test_set_default_region_installs_a_region(tmp_path):
    mine = Region.create(tmp_path / "mine.region", edges=[(0, 1)], slots=2)
    before = stream_edge.default_region()
    try:
        stream_edge.set_default_region(mine)
        assert RequestStreamEdgeEvents().region is mine
    finally:
        stream_edge.set_default_region(before)
    assert RequestStreamEdgeEvents().region is before


def test_a_segment_the_region_cannot_start_retires_nothing(region):
    ev = RequestStreamEdgeEvents(region=region)
    s0 = ev.start_segment(K01)
    assert s0.record(E.PRODUCER_EMIT, meaningful=True)
    # Segment 2**32 cannot be held by the region: its handle records
    # nothing, and the edge's current segment is still 0, here as there.
    huge = ev.start_segment(StreamEdgeKey(0, 1, 2**32))
    assert huge.record(E.SEND_COMPLETE, meaningful=True) is False
    assert s0.record(E.SEND_COMPLETE, meaningful=True)
    s1 = ev.start_segment(StreamEdgeKey(0, 1, 1))
    assert s1.record(E.PRODUCER_EMIT, meaningful=True)
    assert s0.record(E.CONSUMER_ACCEPT, meaningful=True) is False, "segment 0 is retired now"
    assert set(ev.snapshot()) == {"0->1:0", "0->1:1"}
    with pytest.raises(ValueError, match="retired"):
        ev.start_segment(K01)
