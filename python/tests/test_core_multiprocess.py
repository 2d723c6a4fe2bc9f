"""Real processes: stage workers started with the spawn method attach to the
region by path and record into it while the parent snapshots."""

from __future__ import annotations

import multiprocessing

import pytest

import _workers
from _workers import STAGE_MARKS, expected_ms
from edgemark import Event, Region, Token, monotonic_ns

CTX = multiprocessing.get_context("spawn")


def _collect(results, n, timeout=60):
    out = []
    for _ in range(n):
        out.append(results.get(timeout=timeout))
    return out


def _join(procs):
    for p in procs:
        p.join(60)
        assert p.exitcode == 0, f"worker {p.pid} exited with {p.exitcode}"


def test_stage_workers_record_while_the_parent_snapshots(tmp_path):
    path = str(tmp_path / "pipeline.region")
    owner = Region.create(path, slots=64)
    n = 48
    passes = 100
    tokens = [owner.begin() for _ in range(n)]
    go = CTX.Event()
    results = CTX.Queue()
    # Tokens travel as text, as they would inside a dispatch message.
    wire = [str(t) for t in tokens]
    procs = [
        CTX.Process(target=_workers.record_stage, args=(path, stage, wire, go, passes, results))
        for stage in STAGE_MARKS
    ]
    for p in procs:
        p.start()
    go.set()

    # Snapshot while they record: a value, once seen, is seen identically by
    # every later snapshot of that request (S9), and no value is torn.
    seen = {}
    snapshots = 0
    while any(p.is_alive() for p in procs) or snapshots < 3:
        for i, t in enumerate(tokens):
            for key, seg in owner.snapshot(t).items():
                for field, v in seg.items():
                    if field.endswith("_ms") and v is not None:
                        prev = seen.setdefault((i, key, field), v)
                        assert prev == v, (i, key, field, prev, v)
        snapshots += 1
        swept = dict(owner.snapshot_open())
        assert set(swept) == set(tokens)

    reports = _collect(results, len(procs))
    _join(procs)
    for stage, pid, recorded, outcomes in reports:
        # Each cell has exactly one writer, so its first pass wins them all
        # and the later passes are all duplicates.
        assert recorded == n * len(STAGE_MARKS[stage]), (stage, outcomes)
        assert outcomes == {"recorded": recorded, "duplicate": (passes - 1) * recorded}, outcomes

    for i, t in enumerate(tokens):
        final = owner.close(t)
        assert list(final) == ["0->1:0", "1->2:0"]
        for stage, marks in STAGE_MARKS.items():
            for from_stage, to_stage, event in marks:
                seg = final[f"{from_stage}->{to_stage}:0"]
                assert seg[event.key] == expected_ms(i, from_stage, event)
                assert seg["clock_domains"][event.event_name] == "host_monotonic"
        assert final["0->1:0"]["first_chunk_seq"] == i
        assert final["1->2:0"]["first_chunk_seq"] == i
        for (j, key, field), v in seen.items():
            if j == i:
                assert final[key][field] == v
    assert owner.open_requests() == []
    assert owner.counters()["closed_requests"] == n


def test_shared_clock_is_comparable_across_processes(tmp_path):
    path = str(tmp_path / "clock.region")
    owner = Region.create(path)
    before_begin = monotonic_ns()
    t = owner.begin()
    after_begin = monotonic_ns()
    results = CTX.Queue()
    p = CTX.Process(target=_workers.record_on_shared_clock, args=(path, str(t), results))
    p.start()
    ok, w_before, w_after = results.get(timeout=60)
    _join([p])
    assert ok
    v = owner.snapshot(t)["0->1:0"]["consumer_first_accept_ms"]
    # The worker read the same CLOCK_MONOTONIC as the parent's begin: its
    # value lies between the readings around the two calls (to the
    # microsecond the cell keeps).
    low = (w_before - after_begin) / 1e6 - 0.001
    high = (w_after - before_begin) / 1e6 + 0.001
    assert low <= v <= high, (low, v, high)
    owner.close(t)


def test_late_worker_is_refused_after_close_and_reuse(tmp_path):
    path = str(tmp_path / "late.region")
    owner = Region.create(path, slots=1)
    old = owner.begin()
    owner.record(old, 0, 1, Event.PRODUCER_FIRST_NONEMPTY_EMIT, elapsed_ms=10.0)
    assert owner.close(old)["0->1:0"]["producer_first_nonempty_emit_ms"] == 10.0
    new = owner.begin()
    assert new.slot == old.slot
    results = CTX.Queue()
    # The Token object itself is pickled into the spawned process.
    p = CTX.Process(target=_workers.record_late, args=(path, old, results))
    p.start()
    late = results.get(timeout=60)
    _join([p])
    assert late in ("closed", "reused"), late
    assert owner.snapshot(new) == {}
    owner.close(new)


def test_requests_of_a_dead_owner_are_reclaimed(tmp_path):
    path = str(tmp_path / "dead.region")
    owner = Region.create(path, slots=8)
    mine = owner.begin()
    results = CTX.Queue()
    p = CTX.Process(target=_workers.begin_and_exit, args=(path, 3, results))
    p.start()
    theirs = [Token.parse(s) for s in results.get(timeout=60)]
    _join([p])
    assert all(owner.is_open(t) for t in theirs)
    report = owner.reclaim_dead_owners()
    assert report == {"dead_owners": 3, "dead_holders": 0, "unjudged": None, "live_owners_locked": 0}
    assert not any(owner.is_open(t) for t in theirs)
    assert owner.open_requests() == [mine]
    assert owner.counters()["reclaimed_requests"] == 3
    owner.close(mine)


def test_forked_worker_records_through_its_inherited_handle(tmp_path):
    """The fork start method: the child inherits the parent's mapping."""
    fork = multiprocessing.get_context("fork")
    owner = Region.create(tmp_path / "fork.region")
    t = owner.begin()
    results = fork.Queue()
    p = fork.Process(target=_workers.record_with_inherited_region, args=(owner, t, results))
    p.start()
    assert results.get(timeout=60) == "recorded"
    _join([p])
    assert owner.close(t)["1->2:0"]["producer_first_nonempty_emit_ms"] == 3.0


@pytest.fixture(autouse=True)
def _no_stray_children():
    yield
    for child in multiprocessing.active_children():
        child.kill()
        child.join()
