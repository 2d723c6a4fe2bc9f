"""``edgemark.stream_edge`` handles in real processes (spawn): racing first
writes, late handles of closed and reused requests, the shared clock across
processes, one attach per process."""

from __future__ import annotations

import pytest

import _se as _se_workers
from _se import CTX, Workers
from edgemark import Region, monotonic_ns
from edgemark.stream_edge import RequestStreamEdgeEvents, StreamEdgeEvent, StreamEdgeKey

E = StreamEdgeEvent
K01 = StreamEdgeKey(0, 1)


@pytest.fixture(scope="module")
def workers():
    w = Workers(stages=(0, 1))
    yield w
    w.stop()


def test_racing_processes_exactly_one_first_write_wins(tmp_path):
    region = Region.create(tmp_path / "race.region", edges=[(0, 1)], slots=64)
    n_procs, n_requests = 4, 50
    requests = [RequestStreamEdgeEvents(region=region) for _ in range(n_requests)]
    handles = [ev.start_segment(K01) for ev in requests]
    go = CTX.Barrier(n_procs)
    results = CTX.Queue()
    procs = [
        CTX.Process(target=_se_workers.race, args=(handles, i, go, results)) for i in range(n_procs)
    ]
    for p in procs:
        p.start()
    wins = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    for r, ev in enumerate(requests):
        winners = [i for i, won in wins if won[r]]
        assert len(winners) == 1, (r, winners)
        seg = ev.close()["0->1:0"]
        # The value and the chunk are the winner's.
        assert seg["producer_first_nonempty_emit_ms"] == _se_workers.race_value(winners[0], r)
        assert seg["first_chunk_seq"] == winners[0]


def test_a_closed_request_records_nothing_from_any_process(tmp_path, workers):
    region = Region.create(tmp_path / "closed.region", edges=[(0, 1)], slots=1)
    ev = RequestStreamEdgeEvents(region=region)
    h = ev.start_segment(K01)
    assert workers[0].ask("record", h, E.PRODUCER_EMIT, dict(elapsed_ms=1.0, clock_domain="host_monotonic", meaningful=True))
    ev.close()
    for stage, event in ((0, E.SEND_COMPLETE), (1, E.CONSUMER_ACCEPT)):
        assert workers[stage].ask("record", h, event, dict(meaningful=True)) is False
        # Upstream's order: a closed request returns False before the
        # arguments are looked at.
        bad = dict(elapsed_ms=float("nan"), clock_domain="host_monotonic", meaningful=True)
        assert workers[stage].ask("record", h, event, bad) is False
    # The slot now holds a newer request: the old handle cannot reach it.
    fresh = RequestStreamEdgeEvents(region=region)
    assert fresh.token.slot == h.token.slot
    assert workers[1].ask("record", h, E.CONSUMER_ACCEPT, dict(meaningful=True)) is False
    assert fresh.snapshot() == {}
    assert workers[1].ask("record", fresh.start_segment(K01), E.CONSUMER_ACCEPT, dict(meaningful=True))
    fresh.close()


def test_a_bad_argument_raises_in_the_recording_process_and_leaves_no_state(tmp_path, workers):
    region = Region.create(tmp_path / "bad.region", edges=[(0, 1)], slots=2)
    ev = RequestStreamEdgeEvents(region=region)
    h = ev.start_segment(K01)
    with pytest.raises(ValueError, match="finite"):
        workers[0].ask("record", h, E.PRODUCER_EMIT, dict(elapsed_ms=-1.0, clock_domain="host_monotonic", meaningful=True))
    assert ev.snapshot() == {}
    ev.close()


def test_the_shared_clock_is_read_in_the_recording_process(tmp_path, workers):
    region = Region.create(tmp_path / "clock.region", edges=[(0, 1)], slots=2)
    t0 = monotonic_ns()
    ev = RequestStreamEdgeEvents(region=region)
    t1 = monotonic_ns()
    ok, c0, c1 = workers[1].ask("record_timed", ev.start_segment(K01), E.CONSUMER_ACCEPT, dict(meaningful=True))
    assert ok
    seg = ev.close()["0->1:0"]
    us = round(seg["consumer_first_accept_ms"] * 1000)
    assert (c0 - t1) // 1000 - 1 <= us <= (c1 - t0) // 1000 + 1
    assert seg["clock_domains"] == {"consumer_first_accept": "host_monotonic"}


def test_a_process_attaches_a_region_once_however_many_handles_it_gets(tmp_path, workers):
    region = Region.create(tmp_path / "once.region", edges=[(0, 1)], slots=32)
    for _ in range(20):
        ev = RequestStreamEdgeEvents(region=region)
        assert workers[0].ask("record", ev.start_segment(K01), E.PRODUCER_EMIT, dict(meaningful=True))
        ev.close()
    attached = workers[0].ask("attached")
    assert attached.count(region.path) == 1


def test_segments_started_by_the_owner_fence_handles_in_other_processes(tmp_path, workers):
    region = Region.create(tmp_path / "seg.region", edges=[(0, 1)], slots=2)
    ev = RequestStreamEdgeEvents(region=region)
    s0 = ev.start_segment(K01)
    assert workers[0].ask("record", s0, E.PRODUCER_EMIT, dict(meaningful=True))
    s1 = ev.start_segment(StreamEdgeKey(0, 1, 1))
    # A late record for segment 0 arriving after segment 1 began: refused,
    # and segment 0 keeps what it had.
    assert workers[0].ask("record", s0, E.SEND_COMPLETE, dict(meaningful=True)) is False
    assert workers[0].ask("record", s1, E.PRODUCER_EMIT, dict(meaningful=True))
    snap = ev.close()
    assert set(snap) == {"0->1:0", "0->1:1"}
    assert snap["0->1:0"]["edge_first_send_complete_ms"] is None
