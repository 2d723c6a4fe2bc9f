"""Trace contexts and the ring of closed requests, from Python."""

import subprocess
import sys
import textwrap

import pytest

import edgemark
from edgemark.stream_edge import RequestStreamEdgeEvents, StreamEdgeEvent, StreamEdgeKey

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def make(tmp_path, **kw):
    return edgemark.Region.create(str(tmp_path / "r.region"), edges=[(0, 1), (1, 2)], **kw)


def test_begin_under_a_traceparent_and_hand_the_request_span_downstream(tmp_path):
    region = make(tmp_path)
    t = region.begin(traceparent=TP)
    mine = region.traceparent(t)
    version, trace_id, span_id, flags = mine.split("-")
    assert (version, trace_id, flags) == ("00", "4bf92f3577b34da6a3ce929d0e0e4736", "01")
    assert span_id != "00f067aa0ba902b7" and len(span_id) == 16
    assert region.record(t, 0, 1, edgemark.Event.PRODUCER_FIRST_NONEMPTY_EMIT, chunk_seq=2)
    final = region.close(t)
    assert region.traceparent(t) is None

    closed = region.drain_closed()
    assert len(closed) == 1
    c = closed[0]
    assert str(c["token"]) == str(t)
    assert c["trace_id"] == trace_id
    assert c["span_id"] == span_id
    assert c["parent_span_id"] == "00f067aa0ba902b7"
    assert c["trace_flags"] == 1
    assert c["closed_unix_ns"] >= c["origin_unix_ns"] > 0
    assert c["snapshot"] == final
    assert region.drain_closed() == []


def test_a_malformed_traceparent_is_refused_at_the_boundary_and_counted_on_the_record_path(
    tmp_path,
):
    region = make(tmp_path)
    for bad in ["", "00-xyz", TP.upper(), "00-" + "0" * 32 + "-00f067aa0ba902b7-01"]:
        with pytest.raises(ValueError, match="traceparent"):
            region.begin(traceparent=bad)
    assert region.counters()["bad_trace_contexts"] == 0
    t = region.begin(traceparent="00-xyz", strict=False)
    assert t is not None
    assert region.counters()["bad_trace_contexts"] == 1
    # It began in a new trace of its own.
    assert region.traceparent(t).split("-")[1] != "4bf92f3577b34da6a3ce929d0e0e4736"


def test_without_a_context_each_request_starts_its_own_trace(tmp_path):
    region = make(tmp_path)
    a, b = region.begin(), region.begin()
    assert region.traceparent(a).split("-")[1] != region.traceparent(b).split("-")[1]
    region.close(a)
    region.close(b)
    assert [c["parent_span_id"] for c in region.drain_closed()] == [None, None]


def test_the_drop_in_takes_the_context_from_trace_headers(tmp_path):
    region = make(tmp_path)
    events = RequestStreamEdgeEvents(region, trace_headers={"Traceparent": TP, "x": "y"})
    assert events.traceparent.split("-")[1] == "4bf92f3577b34da6a3ce929d0e0e4736"
    rec = events.start_segment(StreamEdgeKey(0, 1))
    assert rec.record(StreamEdgeEvent.PRODUCER_EMIT, meaningful=True, chunk_seq=0)
    events.close()
    assert events.traceparent is None
    (c,) = region.drain_closed()
    assert c["parent_span_id"] == "00f067aa0ba902b7"
    # A malformed header never fails the request.
    events = RequestStreamEdgeEvents(region, trace_headers={"traceparent": "garbage"})
    assert events.traceparent is not None
    assert region.counters()["bad_trace_contexts"] == 1
    events.close()


def test_a_reader_a_ring_behind_loses_the_oldest_counted(tmp_path):
    region = edgemark.Region.create(
        str(tmp_path / "small.region"), edges=[(0, 1)], slots=4, closed_entries=4
    )
    tokens = []
    for _ in range(10):
        t = region.begin()
        region.close(t)
        tokens.append(str(t))
    got = []
    while True:
        batch = region.drain_closed(3)
        if not batch:
            break
        got += [str(c["token"]) for c in batch]
    assert got == tokens[6:]
    assert region.counters()["closed_lost"] == 6


def test_two_reader_processes_take_each_closed_request_once(tmp_path):
    path = str(tmp_path / "two.region")
    region = edgemark.Region.create(path, edges=[(0, 1)], slots=16, closed_entries=4096)
    stop = tmp_path / "stop"
    reader = textwrap.dedent(
        f"""
        import os, edgemark
        r = edgemark.Region.attach({path!r})
        last = False
        while True:
            stopping = os.path.exists({str(stop)!r})
            while True:
                batch = r.drain_closed(32)
                for c in batch:
                    print(c["token"], flush=True)
                if not batch:
                    break
            if last:
                break
            last = stopping
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", reader], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    closed = []
    for _ in range(2000):
        t = region.begin()
        region.close(t)
        closed.append(str(t))
    stop.write_text("")
    taken = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        taken += out.split()
    assert len(taken) == len(set(taken)), "a closed request was taken twice"
    assert set(taken) <= set(closed)
    assert len(taken) + region.counters()["closed_lost"] == len(closed)
