"""``Region.expire``: requests open longer than a bound are closed as
``close`` closes them (their final values reach ``drain_closed``, the
events they lack ``None``) and counted once in ``expired_requests``;
younger requests stay open. And ``Region.recorded``, the fenced read of one
event that a close decision made by two parties needs."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import time

import pytest

from edgemark import Event as E
from edgemark import Region

HOUR = 3600.0


def make(tmp_path, name="r.region", **kw):
    kw.setdefault("edges", [(0, 1), (1, 2)])
    kw.setdefault("slots", 16)
    kw.setdefault("closed_entries", 64)
    return Region.create(tmp_path / name, **kw)


def drained(region):
    """Every closed request in the ring, by token text."""
    out = {}
    while True:
        got = region.drain_closed()
        if not got:
            return out
        out.update({str(c["token"]): c for c in got})


def test_requests_open_for_the_bound_are_closed_drained_with_missing_events_none_and_counted(tmp_path):
    region = make(tmp_path)
    busy = region.begin()
    idle = region.begin()
    assert region.record(busy, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, chunk_seq=5)
    assert region.record(busy, 0, 1, E.EDGE_FIRST_SEND_COMPLETE)
    assert region.record(busy, 1, 2, E.CONSUMER_FIRST_ACCEPT, elapsed_ms=2.5, clock_domain="receiver")
    seen = region.snapshot(busy)

    # No request is an hour old.
    assert region.expire(HOUR) == 0
    assert region.is_open(busy) and region.is_open(idle)
    assert region.counters()["expired_requests"] == 0

    # Every request open when the call starts is at least 0 s old.
    assert region.expire(0) == 2
    assert region.expire(0.0) == 0
    assert region.open_requests() == []
    for t in (busy, idle):
        assert not region.is_open(t)
        assert region.record_outcome(t, 0, 1, E.CONSUMER_FIRST_ACCEPT) == "closed"
        assert region.close(t) == {}

    closed = drained(region)
    assert set(closed) == {str(busy), str(idle)}
    final = closed[str(busy)]["snapshot"]
    e01 = final["0->1:0"]
    assert e01["first_chunk_seq"] == 5
    assert e01["producer_first_nonempty_emit_ms"] == seen["0->1:0"]["producer_first_nonempty_emit_ms"]
    assert e01["edge_first_send_complete_ms"] == seen["0->1:0"]["edge_first_send_complete_ms"]
    assert e01["consumer_first_accept_ms"] is None
    assert e01["consumer_first_nonempty_output_ms"] is None
    e12 = final["1->2:0"]
    assert e12["consumer_first_accept_ms"] == 2.5
    assert e12["producer_first_nonempty_emit_ms"] is None
    assert closed[str(idle)]["snapshot"] == {}

    counters = region.counters()
    assert counters["expired_requests"] == 2
    assert counters["closed_requests"] == 2
    assert region.report()["expired_requests"] == 2


def test_a_request_younger_than_the_bound_stays_open(tmp_path):
    bound = 0.1
    region = make(tmp_path)
    for attempt in range(20):
        old = region.begin()
        time.sleep(2 * bound)
        young_begun = time.monotonic()
        young = region.begin()
        n = region.expire(bound)
        if time.monotonic() - young_begun >= bound:
            # The machine stalled for the whole bound between the young
            # request's begin and the expiry: it may have been old enough.
            region.close(old)
            region.close(young)
            continue
        assert n == 1
        assert not region.is_open(old)
        assert region.is_open(young)
        # Once it has been open for the bound, it expires too.
        time.sleep(bound)
        assert region.expire(bound) == 1
        assert not region.is_open(young)
        assert region.counters()["expired_requests"] == 2
        return
    pytest.fail("the machine never ran the test in time")


def test_requests_of_a_killed_process_expire(tmp_path):
    region = make(tmp_path)
    script = textwrap.dedent(
        """
        import os, signal, sys
        from edgemark import Event as E, Region
        r = Region.attach(sys.argv[1])
        ts = [r.begin() for _ in range(3)]
        r.record(ts[0], 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, chunk_seq=1)
        print(" ".join(str(t) for t in ts), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    p = subprocess.run(
        [sys.executable, "-c", script, str(region.path)], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == -9, p.stderr
    tokens = p.stdout.split()
    assert len(tokens) == 3
    assert all(region.is_open(t) for t in tokens)
    assert region.expire(0) == 3
    assert not any(region.is_open(t) for t in tokens)
    closed = drained(region)
    assert set(closed) == set(tokens)
    e01 = closed[tokens[0]]["snapshot"]["0->1:0"]
    assert e01["first_chunk_seq"] == 1
    assert e01["producer_first_nonempty_emit_ms"] is not None
    assert e01["edge_first_send_complete_ms"] is None
    assert region.counters()["expired_requests"] == 3


@pytest.mark.parametrize("bad", [-1.0, -1e-9, math.nan, -math.inf])
def test_a_negative_or_nan_bound_is_a_value_error(tmp_path, bad):
    region = make(tmp_path)
    t = region.begin()
    with pytest.raises(ValueError, match="older_than_s"):
        region.expire(bad)
    assert region.is_open(t)


def test_an_infinite_bound_closes_nothing_and_a_bound_is_a_number(tmp_path):
    region = make(tmp_path)
    t = region.begin()
    assert region.expire(math.inf) == 0
    assert region.expire(10**9) == 0
    with pytest.raises(TypeError):
        region.expire("1")  # type: ignore[arg-type]
    assert region.is_open(t)


def test_a_read_only_attach_may_not_expire_but_sees_the_counter(tmp_path):
    region = make(tmp_path)
    region.begin()
    viewer = Region.attach(region.path, read_only=True)
    with pytest.raises(PermissionError):
        viewer.expire(0)
    assert region.expire(0) == 1
    assert viewer.counters()["expired_requests"] == 1
    assert viewer.info() is not None


def test_a_disabled_region_expires_nothing():
    assert Region.disabled().expire(0) == 0
    assert Region.disabled().counters()["expired_requests"] == 0


def test_recorded_says_whether_the_event_is_in(tmp_path):
    region = make(tmp_path)
    t = region.begin()
    assert region.recorded(t, 0, 1, E.EDGE_FIRST_SEND_COMPLETE) is False
    assert region.record(t, 0, 1, E.EDGE_FIRST_SEND_COMPLETE)
    assert region.recorded(t, 0, 1, E.EDGE_FIRST_SEND_COMPLETE) is True
    assert region.recorded(t, 0, 1, "edge_first_send_complete", segment=0) is True
    assert region.recorded(t, 0, 1, E.CONSUMER_FIRST_NONEMPTY_OUTPUT) is False
    assert region.recorded(t, 1, 2, E.EDGE_FIRST_SEND_COMPLETE) is False
    assert region.recorded(t, 0, 1, E.EDGE_FIRST_SEND_COMPLETE, segment=1) is False
    # The close decision: the other party records and looks, and sees both.
    assert region.record(t, 0, 1, E.CONSUMER_FIRST_NONEMPTY_OUTPUT)
    assert region.recorded(t, 0, 1, E.EDGE_FIRST_SEND_COMPLETE)
    viewer = Region.attach(region.path, read_only=True)
    assert viewer.recorded(t, 0, 1, E.CONSUMER_FIRST_NONEMPTY_OUTPUT)
    region.close(t)
    # Runtime conditions are False, never an exception.
    assert region.recorded(t, 0, 1, E.EDGE_FIRST_SEND_COMPLETE) is False
    assert region.recorded(None, 0, 1, E.EDGE_FIRST_SEND_COMPLETE) is False
    assert region.recorded("garbage", 0, 1, E.EDGE_FIRST_SEND_COMPLETE) is False
    assert region.recorded(t, 5, 6, E.EDGE_FIRST_SEND_COMPLETE) is False
    assert region.recorded(t, 0, 2**40, E.EDGE_FIRST_SEND_COMPLETE) is False
    assert region.recorded(t, 0, 1, E.EDGE_FIRST_SEND_COMPLETE, segment=2**40) is False
    assert Region.disabled().recorded(t, 0, 1, E.EDGE_FIRST_SEND_COMPLETE) is False
    other = make(tmp_path, "other.region")
    assert other.recorded(t, 0, 1, E.EDGE_FIRST_SEND_COMPLETE) is False


def test_recorded_refuses_arguments_of_the_wrong_kind(tmp_path):
    region = make(tmp_path)
    t = region.begin()
    with pytest.raises(ValueError):
        region.recorded(t, 0, 1, "no_such_event")
    with pytest.raises(ValueError):
        region.recorded(t, -1, 1, E.EDGE_FIRST_SEND_COMPLETE)
    with pytest.raises(ValueError):
        region.recorded(t, 0, 1, E.EDGE_FIRST_SEND_COMPLETE, segment=-1)
    with pytest.raises(TypeError):
        region.recorded(t, "0", 1, E.EDGE_FIRST_SEND_COMPLETE)  # type: ignore[arg-type]
