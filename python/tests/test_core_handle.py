"""Region.handle: one request, edge and event resolved once; and the one
signature that record and record_outcome share."""

import inspect

import pytest

import edgemark
from edgemark import Event, Handle, Outcome, Region

E = Event


def test_handle_records_once_then_refuses_as_duplicate():
    region = Region.in_memory()
    t = region.begin()
    h = region.handle(t, 0, 1, E.EDGE_FIRST_SEND_COMPLETE)
    assert h.token == t
    assert h.record() is True
    assert h.record() is False
    assert h.record_outcome() == Outcome.DUPLICATE
    seg = region.snapshot(t)["0->1:0"]
    assert seg["edge_first_send_complete_ms"] is not None
    assert seg["clock_domains"] == {"edge_first_send_complete": "host_monotonic"}
    # The same cell through Region.record is the same duplicate.
    assert region.record_outcome(t, 0, 1, E.EDGE_FIRST_SEND_COMPLETE) == "duplicate"


def test_handle_record_elapsed_keeps_the_value_and_domain():
    region = Region.in_memory()
    t = region.begin()
    h = region.handle(t, 1, 2, "consumer_first_accept")
    assert h.record_elapsed_outcome(-1.0, "sender") == "invalid"
    assert h.record_elapsed(float("nan")) is False
    assert h.record_elapsed(3.5, "sender") is True
    assert h.record_elapsed(4.0, "sender") is False
    seg = region.snapshot(t)["1->2:0"]
    assert seg["consumer_first_accept_ms"] == 3.5
    assert seg["clock_domains"]["consumer_first_accept"] == "sender"


def test_handle_keeps_segment_and_chunk_seq():
    region = Region.in_memory()
    t = region.begin()
    assert region.handle(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, segment=1).record_outcome() == (
        "segment_not_started"
    )
    assert region.start_segment(t, 0, 1, 1)
    h = region.handle(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, segment=1, chunk_seq=7)
    assert h.record() is True
    assert region.snapshot(t)["0->1:1"]["first_chunk_seq"] == 7


def test_handle_after_close_is_refused():
    region = Region.in_memory()
    t = region.begin()
    h = region.handle(t, 0, 1, E.CONSUMER_FIRST_ACCEPT)
    region.close(t)
    assert h.record_outcome() == "closed"
    assert h.record() is False


@pytest.mark.parametrize(
    "token, why",
    [(None, "disabled"), ("garbage", "invalid"), (b"\x00" * 3, "invalid")],
)
def test_handle_of_no_token_records_nothing(token, why):
    region = Region.in_memory()
    h = region.handle(token, 0, 1, E.CONSUMER_FIRST_ACCEPT)
    assert h.token is None
    assert h.record_outcome() == why
    assert h.record() is False and h.record_elapsed(1.0) is False


def test_handle_of_disabled_region_records_nothing():
    h = Region.disabled().handle("em1.0000000000000001.0.1", 0, 1, E.CONSUMER_FIRST_ACCEPT)
    assert h.record_outcome() == "disabled"
    assert h.record_elapsed_outcome(1.0) == "disabled"
    assert "disabled" in repr(h)


def test_handle_raises_what_record_raises_for_programmer_errors():
    region = Region.in_memory()
    t = region.begin()
    with pytest.raises(ValueError):
        region.handle(t, 0, 1, "no_such_event")
    with pytest.raises(ValueError):
        region.handle(t, 0, 1, 9)
    with pytest.raises(ValueError):
        region.handle(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, chunk_seq=-1)
    with pytest.raises(TypeError):
        region.handle(t, 0, 1, 1.5)
    # An undeclared edge is a runtime outcome, as for record.
    assert region.handle(t, 5, 6, E.CONSUMER_FIRST_ACCEPT).record_outcome() == "unknown_edge"


def test_handle_repr_names_edge_event_and_token():
    region = Region.in_memory()
    t = region.begin()
    r = repr(region.handle(t, 0, 1, E.CONSUMER_FIRST_ACCEPT))
    assert "0->1:0 consumer_first_accept" in r and str(t) in r
    assert isinstance(region.handle(t, 0, 1, 0), Handle)


def test_record_outcome_takes_exactly_what_record_takes():
    region = Region.in_memory()
    t = region.begin()
    assert region.record_outcome(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, True, 3, 0, 1.0, "x") == "recorded"
    assert region.record_outcome(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, meaningful=False) == "not_meaningful"
    assert region.snapshot(t)["0->1:0"]["first_chunk_seq"] == 3
    for bad in [dict(bogus=1), dict(token=t)]:
        with pytest.raises(TypeError):
            region.record_outcome(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, **bad)
        with pytest.raises(TypeError):
            region.record(t, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, **bad)
    with pytest.raises(TypeError):
        region.record_outcome(t, 0, 1)
    with pytest.raises(ValueError):
        region.record_outcome(t, 0, 1, "no_such_event")
    # Errors name the arguments as record declares them.
    with pytest.raises(TypeError, match="clock_domain"):
        region.record_outcome(t, 0, 1, 0, clock_domain=5)


def test_outcome_of_record_is_per_call_not_per_region():
    # record_outcome returns the outcome of its own call, whichever region
    # or call ran before on the thread.
    a, b = Region.in_memory(), Region.in_memory()
    ta, tb = a.begin(), b.begin()
    assert a.record(ta, 0, 1, 0) is True
    assert b.record_outcome(tb, 0, 1, 0) == "recorded"
    assert a.record_outcome(ta, 0, 1, 0) == "duplicate"
    assert b.record_outcome(None, 0, 1, 0) == "disabled"
    assert set(o for o in edgemark.OUTCOME_NAMES) == {o.value for o in Outcome}


def test_record_event_as_int_enum_member_or_plain_int():
    region = Region.in_memory()
    t = region.begin()
    assert region.record(t, 0, 1, int(E.CONSUMER_FIRST_ACCEPT)) is True
    assert region.record(t, 0, 1, E.CONSUMER_FIRST_ACCEPT) is False
    for bad in (-1, 4, 2**70):
        with pytest.raises(ValueError):
            region.record(t, 0, 1, bad)
    assert inspect.isclass(Handle)


def _raised(call):
    """What ``call()`` raised: its type, message and notes."""
    try:
        call()
    except Exception as e:  # noqa: BLE001 - compared, not handled
        return type(e), str(e), getattr(e, "__notes__", None)
    raise AssertionError("no exception")


def _as_record_outcome(record, args, kwargs=None):
    """What ``record(*args, **kwargs)`` raised, as ``record_outcome`` would
    say it: a message that names the method names the one called."""
    kind, message, notes = _raised(lambda: record(*args, **(kwargs or {})))
    return kind, message.replace("Region.record()", "Region.record_outcome()"), notes


def test_record_outcome_raises_exactly_what_record_raises():
    # record_outcome declares record's arguments and takes record's path:
    # an error is record's own, message and note (which argument)
    # included; a message that names the method names the one called.
    region = Region.in_memory()
    t = region.begin()
    bad = [
        (t, "0", 1, E.PRODUCER_FIRST_NONEMPTY_EMIT),
        (t, 0, -1, E.PRODUCER_FIRST_NONEMPTY_EMIT),
        (t, 1.0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT),
        (t, 0, 1, "no_such_event"),
        (t, 0, 1, 4),
        (t, 0, 1, 2**70),
        (t, 0, 1, 1.5),
        (t, 0, 1),
        (t, 0, 1, 0, True, None, 0, None, None, "extra"),
    ]
    for args in bad:
        assert _raised(lambda: region.record_outcome(*args)) == _as_record_outcome(region.record, args), args
    # A stage beyond 32 bits raises nothing: both refuse it the same way.
    big = (t, 0, 2**40, E.PRODUCER_FIRST_NONEMPTY_EMIT)
    assert region.record(*big) is False
    assert region.record_outcome(*big) == "unknown_edge"
    for kwargs in [dict(segment="0"), dict(meaningful=None), dict(bogus=1), dict(token=t)]:
        expected = _as_record_outcome(region.record, (t, 0, 1, 0), kwargs)
        assert _raised(lambda: region.record_outcome(t, 0, 1, 0, **kwargs)) == expected, kwargs


def test_record_takes_stages_and_events_of_any_int_object():
    # Small ints are read by address, everything else as PyO3 converts an
    # int: a stage beyond the small ints, a bool, an int subclass, an event
    # of another IntEnum all record as their values.
    import enum

    class Stage(enum.IntEnum):
        A = 300
        B = 70_000

    class Other(enum.IntEnum):
        FIRST = 0
        SECOND = 1

    region = Region.in_memory(edges=[(0, 1), (300, 70_000)])
    t = region.begin()
    assert region.record(t, 300, 70_000, E.PRODUCER_FIRST_NONEMPTY_EMIT) is True
    assert region.record_outcome(t, Stage.A, Stage.B, Other.SECOND) == "recorded"
    assert region.record_outcome(t, 300, 70_000, 1) == "duplicate"
    assert region.record(t, False, True, Other.FIRST) is True
    assert region.record_outcome(t, 0, True, E.PRODUCER_FIRST_NONEMPTY_EMIT) == "duplicate"
    assert region.record_outcome(t, 1, 0, E.PRODUCER_FIRST_NONEMPTY_EMIT) == "unknown_edge"
    assert region.record_outcome(t, 300, 301, E.PRODUCER_FIRST_NONEMPTY_EMIT) == "unknown_edge"
    seg = region.snapshot(t)["300->70000:0"]
    assert seg["producer_first_nonempty_emit_ms"] is not None
    assert seg["edge_first_send_complete_ms"] is not None
    assert region.snapshot(t)["0->1:0"]["producer_first_nonempty_emit_ms"] is not None


def test_record_and_record_outcome_are_one_path():
    # The same arguments, on two fresh regions in the same state: record's
    # bool is record_outcome's outcome being a success, for every call shape.
    calls = [
        ((0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT), {}),
        ((0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT), {}),
        ((0, 1, "edge_first_send_complete"), dict(chunk_seq=4)),
        ((0, 1, E.CONSUMER_FIRST_ACCEPT), dict(meaningful=False)),
        ((0, 1, E.CONSUMER_FIRST_ACCEPT), dict(segment=1)),
        ((0, 1, E.CONSUMER_FIRST_ACCEPT), dict(segment=2**32)),
        ((0, 2**32, E.CONSUMER_FIRST_ACCEPT), {}),
        ((5, 6, E.CONSUMER_FIRST_ACCEPT), {}),
        ((1, 2, E.CONSUMER_FIRST_ACCEPT), dict(elapsed_ms=-1.0)),
        ((1, 2, E.CONSUMER_FIRST_ACCEPT), dict(elapsed_ms=2.5, clock_domain="gpu")),
        ((1, 2, E.CONSUMER_FIRST_NONEMPTY_OUTPUT), dict(chunk_seq=2**70)),
    ]
    a, b = Region.in_memory(), Region.in_memory()
    ta, tb = a.begin(), b.begin()
    for args, kwargs in calls:
        ok = a.record(ta, *args, **kwargs)
        outcome = b.record_outcome(tb, *args, **kwargs)
        assert ok == (outcome in ("recorded", "started")), (args, kwargs, ok, outcome)
    for token in (None, "not a token", 7):
        assert a.record(token, 0, 1, 0) is False
        assert b.record_outcome(token, 0, 1, 0, chunk_seq=1) == b.record_outcome(token, 0, 1, 0)
    assert Region.disabled().record_outcome(None, 0, 1, 0, segment=2**32) == "disabled"


def test_record_and_record_outcome_show_one_signature_with_its_defaults():
    # What help() and stubtest read: the same parameters, the default
    # segment shown as 0 (not pyo3's `...` for a Rust value).
    sig = inspect.signature(Region.record)
    assert sig == inspect.signature(Region.record_outcome)
    assert sig.parameters["segment"].default == 0
    assert sig.parameters["meaningful"].default is True


def test_record_elapsed_defaults_to_the_core_s_host_monotonic_domain():
    # The default is written out in the binding so that the signature shows
    # it: it must be the core's name.
    for method in (Handle.record_elapsed, Handle.record_elapsed_outcome):
        assert inspect.signature(method).parameters["clock_domain"].default == edgemark.HOST_MONOTONIC
    region = Region.in_memory()
    t = region.begin()
    assert region.handle(t, 1, 2, E.CONSUMER_FIRST_ACCEPT).record_elapsed(2.0) is True
    assert region.snapshot(t)["1->2:0"]["clock_domains"]["consumer_first_accept"] == edgemark.HOST_MONOTONIC


def test_the_stub_writes_each_outcome_method_with_its_plain_method_s_parameters():
    # A stub cannot give two methods one parameter list without turning them
    # into attributes, so `_edgemark.pyi` writes each `X_outcome` beside its
    # `X`; they differ in their return type only.
    import ast
    import pathlib

    stub = pathlib.Path(edgemark._edgemark.__file__).with_name("_edgemark.pyi")
    pairs = 0
    for cls in ast.parse(stub.read_text()).body:
        if not isinstance(cls, ast.ClassDef):
            continue
        methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
        for name, f in methods.items():
            plain = methods.get(name.removesuffix("_outcome"))
            if name.endswith("_outcome") and plain is not None:
                pairs += 1
                assert ast.dump(f.args) == ast.dump(plain.args), f"{cls.name}.{name}"
                assert ast.dump(f.returns) == ast.dump(ast.Name("str", ast.Load())), f"{cls.name}.{name}"
    # record, start_segment (Region); record, record_elapsed (Handle).
    assert pairs == 4
