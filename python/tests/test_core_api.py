"""The Python API: tokens, events, outcomes, set-up errors and fail-open
recording."""

from __future__ import annotations

import copy
import json
import os
import pickle
import threading

import pytest

import edgemark
from edgemark import HOST_MONOTONIC, Event, Outcome, Region, Token, elapsed_between

E = Event


@pytest.fixture
def region(tmp_path):
    return Region.create(tmp_path / "api.region", slots=8, domains=["sender"])


# ---------------------------------------------------------------------------
# Tokens.


def test_token_text_bytes_and_int_forms_round_trip(region):
    t = region.begin()
    assert Token.parse(str(t)) == t
    assert Token.from_bytes(bytes(t)) == t
    assert Token.from_int(int(t)) == t
    for form in (t, str(t), bytes(t), int(t)):
        assert Token(form) == t
    assert str(t).startswith("em1.") and len(str(t)) <= 38 and str(t).isascii()
    assert len(bytes(t)) == 16
    assert 0 <= int(t) < 2**128
    assert repr(t) == f"Token('{t}')"
    assert t.slot < 8 and t.generation >= 1
    assert format(t.region_id, "016x") == region.info()["region_id"]


def test_token_pickles_and_hashes_by_value(region):
    t = region.begin()
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        u = pickle.loads(pickle.dumps(t, protocol=proto))
        assert u == t and hash(u) == hash(t) and u is not t
    assert copy.copy(t) == t and copy.deepcopy(t) == t
    t2 = region.begin()
    assert t2 != t
    assert len({t, Token.parse(str(t)), t2}) == 2
    assert (t == str(t)) is False


def test_token_travels_in_a_msgpack_message(region):
    msgpack = pytest.importorskip("msgpack")
    t = region.begin()
    wire = msgpack.packb({"request_id": "r-1", "edgemark": str(t), "edgemark_b": bytes(t)})
    back = msgpack.unpackb(wire)
    assert Token.parse(back["edgemark"]) == t
    assert Token.from_bytes(back["edgemark_b"]) == t
    # The recording calls take the received forms as they are.
    assert region.record(back["edgemark"], 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT)
    assert region.record(back["edgemark_b"], 0, 1, E.EDGE_FIRST_SEND_COMPLETE)


def test_token_travels_in_json(region):
    t = region.begin()
    back = json.loads(json.dumps({"edgemark": str(t)}))
    assert Token(back["edgemark"]) == t


@pytest.mark.parametrize(
    "bad",
    ["", "em1", "em2.00000000000000ab.2a.7", "em1.zz.1.1", "em1.1.1.1.1", "em1." + "f" * 17 + ".1.1"],
)
def test_token_parse_refuses_what_is_no_token(bad):
    with pytest.raises(ValueError):
        Token.parse(bad)
    with pytest.raises(ValueError):
        Token(bad)


def test_token_from_bytes_and_int_refuse_bad_values():
    with pytest.raises(ValueError):
        Token.from_bytes(b"\x00" * 15)
    with pytest.raises(ValueError):
        Token(b"\x00" * 17)
    with pytest.raises(ValueError):
        Token(-1)
    with pytest.raises(ValueError):
        Token(2**128)
    with pytest.raises(TypeError):
        Token(1.5)


# ---------------------------------------------------------------------------
# Events and outcomes.


def test_events_are_the_core_schema_in_order(region):
    assert [e.event_name for e in Event] == list(edgemark.EVENT_NAMES) == region.events
    assert [int(e) for e in Event] == [0, 1, 2, 3]
    assert str(E.CONSUMER_FIRST_ACCEPT) == "consumer_first_accept"
    assert f"{E.CONSUMER_FIRST_ACCEPT}" == "consumer_first_accept"
    assert E.CONSUMER_FIRST_ACCEPT.key == "consumer_first_accept_ms"
    assert Event.from_name("edge_first_send_complete") is E.EDGE_FIRST_SEND_COMPLETE
    with pytest.raises(ValueError):
        Event.from_name("first_token")


def test_outcomes_are_the_core_outcomes():
    assert [o.value for o in Outcome] == list(edgemark.OUTCOME_NAMES)
    assert Outcome.RECORDED == "recorded" and str(Outcome.STALE_SEGMENT) == "stale_segment"
    assert Outcome.RECORDED.is_success and Outcome.STARTED.is_success
    assert not Outcome.DUPLICATE.is_success
    assert Outcome("closed") is Outcome.CLOSED


def test_the_enums_are_made_from_the_core_tables():
    # One member per entry of the native module's tables, named as the
    # entry in capitals, in the core's order.
    assert [(o.name, o.value) for o in Outcome] == [(n.upper(), n) for n in edgemark.OUTCOME_NAMES]
    assert [(e.name, e.value) for e in Event] == [(n.upper(), i) for i, n in enumerate(edgemark.EVENT_NAMES)]
    # Success is the core's word: exactly the outcomes that change state.
    assert {o for o in Outcome if o.is_success} == {Outcome.RECORDED, Outcome.STARTED}
    # They are the package's own classes: they pickle, print and compare as
    # declared ones do.
    for member in (Outcome.FAULTED, Event.CONSUMER_FIRST_NONEMPTY_OUTPUT):
        assert pickle.loads(pickle.dumps(member)) is member
    assert Outcome.__module__ == Event.__module__ == "edgemark"
    assert repr(Event.CONSUMER_FIRST_ACCEPT) == "<Event.CONSUMER_FIRST_ACCEPT: 2>"
    assert isinstance(Event.CONSUMER_FIRST_ACCEPT, int) and isinstance(Outcome.BUSY, str)
    assert "core" in (Outcome.__doc__ or "") and "core" in (Event.__doc__ or "")


def test_the_event_class_type_checkers_read_is_the_one_made_at_import():
    # edgemark/__init__.py writes Event's members out under TYPE_CHECKING
    # (a class made at import is no type to a type checker); they must be
    # the members made from the core's table, by name and value.
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(edgemark))
    declared = [
        (stmt.targets[0].id, ast.literal_eval(stmt.value))
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        for cls in node.body
        if isinstance(cls, ast.ClassDef) and cls.name == "Event"
        for stmt in cls.body
        if isinstance(stmt, ast.Assign)
    ]
    assert declared == [(e.name, e.value) for e in Event]


def test_a_str_enum_member_names_its_event_by_its_text(region):
    from edgemark.stream_edge import StreamEdgeEvent

    t = region.begin()
    assert region.record_outcome(t, 0, 1, StreamEdgeEvent.SEND_COMPLETE) == "recorded"
    assert region.record_outcome(t, 0, 1, "edge_first_send_complete") == "duplicate"
    h = region.handle(t, 0, 1, StreamEdgeEvent.PRODUCER_EMIT)
    assert h.record() and not region.record(t, 0, 1, Event.PRODUCER_FIRST_NONEMPTY_EMIT)


def test_event_enum_name_and_int_are_the_same_event(region):
    t = region.begin()
    assert region.record_outcome(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, elapsed_ms=1.0) == "recorded"
    assert region.record_outcome(t, 0, 1, "producer_first_nonempty_emit", elapsed_ms=2.0) == "duplicate"
    assert region.record_outcome(t, 0, 1, 0, elapsed_ms=3.0) == "duplicate"
    assert region.snapshot(t)["0->1:0"]["producer_first_nonempty_emit_ms"] == 1.0


def test_unknown_event_is_a_programmer_error(region):
    t = region.begin()
    with pytest.raises(ValueError, match="first_token"):
        region.record(t, 0, 1, "first_token")
    with pytest.raises(ValueError):
        region.record(t, 0, 1, 4)
    with pytest.raises(ValueError):
        region.record(t, 0, 1, "PRODUCER_FIRST_NONEMPTY_EMIT")
    with pytest.raises(TypeError):
        region.record(t, 0, 1, 1.0)
    assert region.snapshot(t) == {}


def test_clock_domain_without_elapsed_ms_is_a_programmer_error(region):
    t = region.begin()
    with pytest.raises(ValueError, match="elapsed_ms"):
        region.record(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, clock_domain="sender")
    # Naming the shared clock is the same as naming none.
    assert region.record(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, clock_domain=HOST_MONOTONIC)


# ---------------------------------------------------------------------------
# Recording fails open.


def test_record_returns_true_only_when_it_recorded(region):
    t = region.begin()
    assert region.record(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, chunk_seq=3) is True
    assert region.record(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, chunk_seq=4) is False
    assert region.record(t, 0, 1, E.EDGE_FIRST_SEND_COMPLETE, meaningful=False) is False
    s = region.snapshot(t)["0->1:0"]
    assert s["first_chunk_seq"] == 3
    assert s["edge_first_send_complete_ms"] is None


def test_shared_clock_value_is_elapsed_from_begin(region):
    before = edgemark.monotonic_ns()
    t = region.begin()
    after_begin = edgemark.monotonic_ns()
    assert region.record(t, 1, 2, E.CONSUMER_FIRST_ACCEPT)
    after = edgemark.monotonic_ns()
    seg = region.snapshot(t)["1->2:0"]
    v = seg["consumer_first_accept_ms"]
    assert type(v) is float
    assert seg["clock_domains"] == {"consumer_first_accept": "host_monotonic"}
    assert 0.0 <= v <= (after - before) / 1e6 + 0.001
    assert v >= 0.0 and (after_begin - before) >= 0


@pytest.mark.parametrize(
    "call, outcome",
    [
        (lambda r, t: r.record_outcome(None, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT), "disabled"),
        (lambda r, t: r.record_outcome("garbage", 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT), "invalid"),
        (lambda r, t: r.record_outcome(b"short", 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT), "invalid"),
        (lambda r, t: r.record_outcome([1, 2], 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT), "invalid"),
        (lambda r, t: r.record_outcome(-5, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT), "invalid"),
        (lambda r, t: r.record_outcome(t, 2, 3, E.PRODUCER_FIRST_NONEMPTY_EMIT), "unknown_edge"),
        (lambda r, t: r.record_outcome(t, 1, 0, E.PRODUCER_FIRST_NONEMPTY_EMIT), "unknown_edge"),
        (lambda r, t: r.record_outcome(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, elapsed_ms=1.0, clock_domain="bad\nname"), "unknown_domain"),
        (lambda r, t: r.record_outcome(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, elapsed_ms=1.0, clock_domain="x" * 33), "unknown_domain"),
        (lambda r, t: r.record_outcome(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, elapsed_ms=1e12), "out_of_range"),
        (lambda r, t: r.record_outcome(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, chunk_seq=edgemark.MAX_CHUNK_SEQ + 1), "out_of_range"),
        (lambda r, t: r.record_outcome(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, segment=1), "segment_not_started"),
        (lambda r, t: r.start_segment_outcome(t, 0, 1, 0), "stale_segment"),
        (lambda r, t: r.start_segment_outcome(None, 0, 1, 1), "disabled"),
        (lambda r, t: r.start_segment_outcome(t, 5, 6, 1), "unknown_edge"),
    ],
)
def test_runtime_conditions_are_outcomes_that_leave_no_state(region, call, outcome):
    t = region.begin()
    assert call(region, t) == outcome
    assert region.snapshot(t) == {}


def test_foreign_token_is_refused(tmp_path, region):
    other = Region.create(tmp_path / "other.region", slots=2)
    t = other.begin()
    assert region.record_outcome(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT) == "foreign_token"
    assert region.snapshot(t) == {} and region.close(t) == {}
    assert not region.is_open(t) and other.is_open(t)


def test_full_region_begins_none_and_the_request_runs_unrecorded(tmp_path):
    r = Region.create(tmp_path / "small.region", slots=2)
    a, b = r.begin(), r.begin()
    assert a is not None and b is not None
    c = r.begin()
    assert c is None
    assert r.record(c, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT) is False
    assert r.record_outcome(c, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT) == "disabled"
    assert r.snapshot(c) == {} and r.close(c) == {} and r.start_segment(c, 0, 1, 1) is False
    assert r.counters()["refused"]["region_full"] == 1
    r.close(a)
    assert r.begin() is not None


def test_reused_slot_never_takes_an_old_token(tmp_path):
    r = Region.create(tmp_path / "one.region", slots=1)
    old = r.begin()
    r.close(old)
    new = r.begin()
    assert new.slot == old.slot and new != old
    assert r.record_outcome(old, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT) in ("closed", "reused")
    assert r.snapshot(new) == {}
    assert r.snapshot(old) == {} and r.close(old) == {}
    assert r.is_open(new)


def test_disabled_region_is_off_and_cheap():
    off = Region.disabled()
    assert not off.enabled and off.path is None and off.info() is None
    assert off.begin() is None
    assert off.record(None, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT) is False
    # Disabled, it does not even look at the event.
    assert off.record_outcome("x", 0, 1, "anything") == "disabled"
    assert off.start_segment_outcome(None, 0, 1, 1) == "disabled"
    assert off.snapshot(None) == {} and off.close(None) == {}
    assert off.open_requests() == [] and off.snapshot_open() == []
    assert off.edges == [] and off.events == [] and off.domains == []
    assert repr(off) == "Region.disabled()"


# ---------------------------------------------------------------------------
# Snapshots.


def test_snapshots_are_detached_dicts(region):
    t = region.begin()
    region.record(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, elapsed_ms=10.0)
    a = region.snapshot(t)
    a["0->1:0"]["producer_first_nonempty_emit_ms"] = 99.0
    a["0->1:0"]["clock_domains"].clear()
    b = region.snapshot(t)
    assert b["0->1:0"]["producer_first_nonempty_emit_ms"] == 10.0
    assert b["0->1:0"]["clock_domains"] == {"producer_first_nonempty_emit": "host_monotonic"}
    assert a is not b


def test_segments_appear_in_declared_edge_then_segment_order(region):
    t = region.begin()
    region.record(t, 1, 2, E.CONSUMER_FIRST_ACCEPT, elapsed_ms=3.0)
    assert region.start_segment(t, 0, 1, 2)
    region.record(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, segment=2, elapsed_ms=2.0)
    assert not region.start_segment(t, 0, 1, 1)
    s = region.snapshot(t)
    assert list(s) == ["0->1:2", "1->2:0"]
    assert s["0->1:2"]["segment_index"] == 2
    assert region.close(t) == s


def test_close_is_idempotent_and_returns_the_final_snapshot(region):
    t = region.begin()
    region.record(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, elapsed_ms=1.5)
    final = json.loads(region.close_json(t))
    assert final["0->1:0"]["producer_first_nonempty_emit_ms"] == 1.5
    assert region.close(t) == {} and region.close_json(t) == "{}"
    assert region.record_outcome(t, 0, 1, E.EDGE_FIRST_SEND_COMPLETE) == "closed"


def test_values_keep_microseconds(region):
    t = region.begin()
    region.record(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, elapsed_ms=0.1)
    region.record(t, 0, 1, E.EDGE_FIRST_SEND_COMPLETE, elapsed_ms=0.3)
    region.record(t, 0, 1, E.CONSUMER_FIRST_ACCEPT, elapsed_ms=1.0004)
    seg = region.snapshot(t)["0->1:0"]
    assert seg["consumer_first_accept_ms"] == 1.0
    # In whole microseconds, as the core stores them: 0.2, not 0.19999999999999998.
    assert elapsed_between(seg, E.PRODUCER_FIRST_NONEMPTY_EMIT, E.EDGE_FIRST_SEND_COMPLETE) == 0.2


def test_elapsed_between_needs_both_one_domain_and_order(region):
    t = region.begin()
    region.record(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, elapsed_ms=4.0, clock_domain="sender")
    region.record(t, 0, 1, E.EDGE_FIRST_SEND_COMPLETE, elapsed_ms=4.0, clock_domain="sender")
    region.record(t, 0, 1, E.CONSUMER_FIRST_ACCEPT, elapsed_ms=9.0)
    seg = region.snapshot(t)["0->1:0"]
    P, S, A, O = E.PRODUCER_FIRST_NONEMPTY_EMIT, E.EDGE_FIRST_SEND_COMPLETE, E.CONSUMER_FIRST_ACCEPT, E.CONSUMER_FIRST_NONEMPTY_OUTPUT
    assert elapsed_between(seg, P, S) == 0.0
    assert elapsed_between(seg, "producer_first_nonempty_emit", "edge_first_send_complete") == 0.0
    assert elapsed_between(seg, S, A) is None  # different clock domains
    assert elapsed_between(seg, A, O) is None  # output missing
    assert elapsed_between(None, P, S) is None
    assert elapsed_between({}, P, S) is None


def test_open_requests_and_snapshot_open_sweep_the_region(region):
    ts = [region.begin() for _ in range(3)]
    region.record(ts[1], 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, elapsed_ms=7.0)
    assert sorted(map(str, region.open_requests())) == sorted(map(str, ts))
    swept = dict(region.snapshot_open())
    assert set(swept) == set(ts)
    assert swept[ts[1]]["0->1:0"]["producer_first_nonempty_emit_ms"] == 7.0
    assert swept[ts[0]] == {}
    for t in ts:
        region.close(t)
    assert region.open_requests() == []


def test_counters_count_refusals_and_closes(region):
    t = region.begin()
    region.record(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, elapsed_ms=-1.0)
    region.close(t)
    region.record(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT)
    c = region.counters()
    assert c["refused"]["invalid"] == 1 and c["refused"]["closed"] == 1
    assert c["closed_requests"] == 1
    assert set(c["refused"]) <= set(edgemark.OUTCOME_NAMES)


def test_threads_record_concurrently(region):
    tokens = [region.begin() for _ in range(8)]
    results = []

    def work(i):
        won = 0
        for _ in range(200):
            for t in tokens:
                won += region.record(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, elapsed_ms=float(i))
        results.append(won)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sum(results) == len(tokens), "each cell is won exactly once"
    for t in tokens:
        assert region.close(t)["0->1:0"]["producer_first_nonempty_emit_ms"] in (0.0, 1.0, 2.0, 3.0)


# ---------------------------------------------------------------------------
# Set-up errors.


def test_create_never_overwrites(tmp_path):
    path = tmp_path / "r.region"
    Region.create(path)
    with pytest.raises(FileExistsError):
        Region.create(path)
    with pytest.raises(FileExistsError):
        Region.create(str(path))


def test_create_refuses_a_symlink(tmp_path):
    target = tmp_path / "target"
    link = tmp_path / "link.region"
    os.symlink(target, link)
    with pytest.raises(OSError):
        Region.create(link)
    assert not target.exists()


def test_create_in_a_missing_directory_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        Region.create(tmp_path / "missing" / "r.region")


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(edges=[]),
        dict(edges=[(0, 0)]),
        dict(edges=[(0, 1), (0, 1)]),
        dict(edges=[(0, 1, 2)]),
        dict(edges=["0->1"]),
        dict(slots=0),
        dict(segments=0),
        dict(domains=[""]),
        dict(domains=["x" * 33]),
    ],
)
def test_create_refuses_bad_declarations(tmp_path, kwargs):
    with pytest.raises((ValueError, TypeError)):
        Region.create(tmp_path / "bad.region", **kwargs)
    assert not (tmp_path / "bad.region").exists()


def test_create_defaults(tmp_path):
    r = Region.create(tmp_path / "d.region")
    info = r.info()
    assert r.edges == [(0, 1), (1, 2)]
    assert info["slots"] == 4096 and info["segments"] == 4
    assert r.domains == ["host_monotonic"]
    assert r.path == str(tmp_path / "d.region")
    assert (os.stat(r.path).st_mode & 0o777) == 0o600
    assert info["clock"]["shared_with_this_process"] is True and info["creator_pid"] == os.getpid()


def test_attach_sees_the_same_region(tmp_path):
    owner = Region.create(tmp_path / "a.region", edges=[(0, 1)], slots=4, segments=2, domains=["dev"])
    worker = Region.attach(tmp_path / "a.region")
    assert worker.edges == [(0, 1)] and worker.domains == ["host_monotonic", "dev"]
    assert worker.info()["region_id"] == owner.info()["region_id"]
    t = owner.begin()
    assert worker.record(t, 0, 1, E.CONSUMER_FIRST_ACCEPT, elapsed_ms=2.5, clock_domain="dev")
    assert owner.snapshot(t)["0->1:0"]["clock_domains"]["consumer_first_accept"] == "dev"


def test_clock_domains_are_registered_at_run_time_by_any_process(tmp_path):
    owner = Region.create(tmp_path / "rt.region", edges=[(0, 1)], slots=4)
    worker = Region.attach(tmp_path / "rt.region")
    t = owner.begin()
    # A record naming a new domain registers it; another process finds it.
    assert worker.record_outcome(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, elapsed_ms=1.0, clock_domain="talker.gpu") == Outcome.RECORDED
    assert owner.record(t, 0, 1, E.EDGE_FIRST_SEND_COMPLETE, elapsed_ms=3.5, clock_domain="talker.gpu")
    assert owner.domains == ["host_monotonic", "talker.gpu"] == worker.domains
    assert owner.register_domain("talker.gpu") == 1 == worker.register_domain("talker.gpu")
    seg = owner.snapshot(t)["0->1:0"]
    assert seg["clock_domains"]["edge_first_send_complete"] == "talker.gpu"
    assert elapsed_between(seg, E.PRODUCER_FIRST_NONEMPTY_EMIT, E.EDGE_FIRST_SEND_COMPLETE) == 2.5
    for bad in ["", "   ", "a\nb", "\x1b[2J", "x" * 33]:
        with pytest.raises(ValueError):
            owner.register_domain(bad)
        assert owner.record_outcome(t, 0, 1, E.CONSUMER_FIRST_ACCEPT, elapsed_ms=1.0, clock_domain=bad) == Outcome.UNKNOWN_DOMAIN


def test_a_full_domain_table_fails_open_with_its_own_outcome(tmp_path):
    r = Region.create(tmp_path / "full.region", edges=[(0, 1)], slots=4, domains=["declared"])
    for i in range(2, 32):
        assert r.register_domain(f"d{i}") == i
    assert len(r.domains) == 32
    assert r.register_domain("one.more") is None
    t = r.begin()
    assert r.record_outcome(t, 0, 1, E.CONSUMER_FIRST_ACCEPT, elapsed_ms=1.0, clock_domain="one.more") == Outcome.DOMAIN_TABLE_FULL
    assert r.record(t, 0, 1, E.CONSUMER_FIRST_ACCEPT, elapsed_ms=1.0, clock_domain="d31")
    assert r.counters()["refused"]["domain_table_full"] == 2


def test_attach_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        Region.attach(tmp_path / "missing.region")


@pytest.mark.parametrize(
    "content", [b"", b"not a region", b"\0" * 8192, os.urandom(4096), b"EDGEMARK" * 512]
)
def test_attach_refuses_files_that_are_no_region(tmp_path, content):
    path = tmp_path / "junk.region"
    path.write_bytes(content)
    with pytest.raises(ValueError):
        Region.attach(path)


def test_attach_refuses_a_truncated_region(tmp_path):
    path = tmp_path / "t.region"
    Region.create(path, slots=4)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 8)
    with pytest.raises(ValueError):
        Region.attach(path)


def test_attach_refuses_a_directory(tmp_path):
    with pytest.raises(OSError):
        Region.attach(tmp_path)


def test_in_memory_region_records():
    r = Region.in_memory(edges=[(3, 4)], slots=2)
    t = r.begin()
    assert r.record(t, 3, 4, E.PRODUCER_FIRST_NONEMPTY_EMIT, elapsed_ms=1.0)
    assert r.path is None and "in memory" in repr(r)
    assert list(r.close(t)) == ["3->4:0"]


def test_default_dir_and_version():
    assert os.path.isdir(edgemark.default_dir())
    assert edgemark.__version__.count(".") == 2
    assert edgemark.MAX_ELAPSED_MS > 3600_000.0


# ---------------------------------------------------------------------------
# Arguments at the edges of their types.


@pytest.mark.parametrize("chunk", [edgemark.MAX_CHUNK_SEQ + 1, 2**64, 2**200])
def test_chunk_seq_beyond_64_bits_is_out_of_range_not_overflow(region, chunk):
    t = region.begin()
    emit = E.PRODUCER_FIRST_NONEMPTY_EMIT
    assert region.record_outcome(t, 0, 1, emit, chunk_seq=chunk) == "out_of_range"
    assert region.record(t, 0, 1, emit, chunk_seq=chunk) is False
    assert region.snapshot(t) == {}
    # The events that keep no chunk ignore it, as they ignore any chunk_seq.
    assert region.record_outcome(t, 0, 1, E.EDGE_FIRST_SEND_COMPLETE, chunk_seq=chunk) == "recorded"


def test_negative_chunk_seq_is_a_value_error(region):
    t = region.begin()
    with pytest.raises(ValueError, match="non-negative"):
        region.record(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, chunk_seq=-1)
    assert region.snapshot(t) == {}


def test_a_path_with_a_nul_byte_is_a_value_error(tmp_path):
    bad = str(tmp_path / "a\0b.region")
    with pytest.raises(ValueError, match="NUL"):
        Region.create(bad)
    with pytest.raises(ValueError, match="NUL"):
        Region.attach(bad)
    assert os.listdir(tmp_path) == []


def test_a_region_asks_for_its_shared_clock_and_says_which_it_got(tmp_path):
    mono = Region.create(tmp_path / "m.region")
    assert mono.info()["clock"]["kind"] == "monotonic"
    counter = Region.create(tmp_path / "c.region", clock="counter")
    # The counter where the kernel trusts it; CLOCK_MONOTONIC elsewhere.
    assert counter.info()["clock"]["kind"] in ("counter", "monotonic")
    t = counter.begin()
    assert counter.record(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT)
    v = counter.snapshot(t)["0->1:0"]["producer_first_nonempty_emit_ms"]
    assert 0.0 <= v < 1000.0
    with pytest.raises(ValueError, match="monotonic"):
        Region.create(tmp_path / "x.region", clock="sundial")
    assert not (tmp_path / "x.region").exists()


# ---------------------------------------------------------------------------
# Argument forms and their limits.


def test_a_token_as_bytearray_or_memoryview_is_a_token(region):
    t = region.begin()
    raw = bytes(t)
    for form in (bytearray(raw), memoryview(raw), memoryview(bytearray(raw))):
        assert Token(form) == t
        assert Token.from_bytes(form) == t
    assert region.record(bytearray(raw), 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT)
    assert region.record_outcome(memoryview(raw), 0, 1, E.EDGE_FIRST_SEND_COMPLETE) == "recorded"
    assert region.handle(bytearray(raw), 0, 1, E.CONSUMER_FIRST_ACCEPT).record()
    assert region.start_segment(memoryview(raw), 0, 1, 1)
    assert region.record(bytearray(15), 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT) is False
    assert region.record_outcome(bytearray(15), 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT) == "invalid"
    with pytest.raises(ValueError, match="16 bytes"):
        Token.from_bytes(bytearray(15))
    with pytest.raises(TypeError):
        Token.from_bytes("not bytes")
    assert region.close(memoryview(raw))["0->1:0"]["producer_first_nonempty_emit_ms"] is not None


def test_negative_stages_and_segments_raise_value_error_and_too_large_ones_are_refusals(region):
    t = region.begin()
    emit = E.PRODUCER_FIRST_NONEMPTY_EMIT
    for call in (
        lambda: region.record(t, -1, 1, emit),
        lambda: region.record(t, 0, -1, emit, segment=0),
        lambda: region.record(t, 0, 1, emit, segment=-1),
        lambda: region.record_outcome(t, -1, 1, emit),
        lambda: region.start_segment(t, 0, 1, -1),
        lambda: region.handle(t, -1, 1, emit),
        lambda: region.handle(t, 0, 1, emit, segment=-2),
    ):
        with pytest.raises(ValueError, match="non-negative"):
            call()
    # Ints a 32-bit field cannot hold: refused like other values beyond a
    # limit, never OverflowError.
    assert region.record(t, 2**32, 1, emit) is False
    assert region.record_outcome(t, 2**32, 1, emit) == "unknown_edge"
    assert region.record_outcome(t, 0, 2**64, emit) == "unknown_edge"
    assert region.record(t, 0, 1, emit, segment=2**40) is False
    assert region.record_outcome(t, 0, 1, emit, segment=2**40) == "out_of_range"
    assert region.start_segment(t, 0, 1, 2**40) is False
    assert region.start_segment_outcome(t, 0, 1, 2**40) == "out_of_range"
    assert region.start_segment_outcome(t, 2**32, 1, 1) == "unknown_edge"
    assert region.handle(t, 0, 1, emit, segment=2**40).record_outcome() == "out_of_range"
    assert region.handle(t, 2**32, 1, emit).record_outcome() == "unknown_edge"
    # Not ints at all: TypeError.
    with pytest.raises(TypeError):
        region.record(t, "0", 1, emit)
    with pytest.raises(TypeError):
        region.record(t, 0, 1, emit, segment=1.0)
    assert region.snapshot(t) == {}
    assert region.record(t, 0, 1, emit)


def test_domains_must_be_a_sequence_of_names(tmp_path):
    for bad in ("gpu", b"gpu"):
        with pytest.raises(TypeError, match="sequence of clock-domain names"):
            Region.create(tmp_path / "d.region", domains=bad)
        with pytest.raises(TypeError, match="sequence of clock-domain names"):
            Region.in_memory(domains=bad)
    with pytest.raises(TypeError, match="a clock-domain name is a str"):
        Region.in_memory(domains=["gpu", 3])
    assert not (tmp_path / "d.region").exists()
    assert Region.in_memory(domains=("gpu",)).domains == ["host_monotonic", "gpu"]
    assert Region.in_memory(domains=None).domains == ["host_monotonic"]


def test_bytes_paths_and_paths_that_are_not_utf8_round_trip(tmp_path):
    raw = os.path.join(os.fsencode(tmp_path), b"r\xff\xfe.region")
    region = Region.create(raw, edges=[(0, 1)], slots=4)
    assert os.path.exists(raw)
    # The path comes back as os.fsdecode gives it, without a U+FFFD.
    assert region.path == os.fsdecode(raw)
    assert "\ufffd" not in region.path
    assert os.fsencode(region.path) == raw
    assert region.info()["path"] == region.path
    t = region.begin()
    for again in (region.path, raw, os.fsdecode(raw)):
        other = Region.attach(again)
        assert other.record(t, 0, 1, E.CONSUMER_FIRST_ACCEPT) or other.record_outcome(
            t, 0, 1, E.CONSUMER_FIRST_ACCEPT
        ) == "duplicate"
        assert other.path == region.path
    import pathlib

    assert Region.attach(pathlib.Path(os.fsdecode(raw))).path == region.path
    with pytest.raises(FileExistsError):
        Region.create(raw)
    with pytest.raises(TypeError, match="str, bytes or os.PathLike"):
        Region.attach(3)
    with pytest.raises(ValueError, match="NUL"):
        Region.attach(b"a\0b")
