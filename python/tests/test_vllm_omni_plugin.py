"""The parts of the vLLM-Omni plugin that need no vLLM-Omni: loading it,
refusing without vLLM-Omni, the request lookup as another local user would
try it, a stage on a host of its own, and removing what a killed server
left."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

import edgemark
from edgemark import vllm_omni
from edgemark import _channel, _instrument
from edgemark.vllm_omni import _recording, package
from edgemark.vllm_omni._recording import EMIT, Recording

NOBODY = 65534


def as_root():
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            raise RuntimeError("CI=true runs as root: these tests must run there")
        pytest.skip("needs root to make a file of another user's")


@pytest.fixture
def region_env(tmp_path, monkeypatch):
    """A region path of the test's own, named by the user."""
    path = str(tmp_path / "host.region")
    monkeypatch.setenv(vllm_omni.ENV_REGION, path)
    monkeypatch.delenv("_EDGEMARK_VLLM_OMNI_NAMED", raising=False)
    return path


def test_register_without_the_variable_does_nothing(monkeypatch):
    monkeypatch.delenv(vllm_omni.ENV_ENABLE, raising=False)
    vllm_omni.register()
    assert not vllm_omni.is_instrumented()


def test_without_vllm_omni_one_warning_and_nothing_patched(tmp_path):
    # A fresh interpreter: `instrument` says why once per process.
    code = (
        "import logging, sys\n"
        "from edgemark import vllm_omni\n"
        "from edgemark import _instrument\n"
        "_instrument.installed_version = lambda distribution: None\n"
        "logging.basicConfig(stream=sys.stdout, format='%(levelname)s %(message)s')\n"
        "print(vllm_omni.instrument(), vllm_omni.instrument(), vllm_omni.is_instrumented())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout
    lines = out.splitlines()
    assert lines[-1] == "False False False"
    warnings = [line for line in lines if line.startswith("WARNING")]
    assert len(warnings) == 1 and "not installed" in warnings[0] and package.SUPPORTED in warnings[0]


def test_the_supported_range_is_declared_once_and_takes_the_release_candidates():
    assert package._instruments == ("vllm-omni >= 0.30.0, < 0.33",)
    for v in ("0.30.0", "0.31.0rc1", "0.32.0rc1", "0.32.1"):
        assert package.is_supported(v), v
    for v in ("0.28.0", "0.30.0rc1", "0.33.0", "0.33.0rc1", "1.0", "", None, "not a version"):
        assert not package.is_supported(v), v
    # Past the top: recorded when everything checks out, with a warning;
    # below: refused (docs/vllm-omni.md, "Releases").
    for v in ("0.33.0", "0.33.0rc1", "1.0"):
        assert _instrument.newer_than(v, package.SUPPORTED), v
    for v in ("0.28.0", "0.30.0rc1", "0.32.0rc1"):
        assert not _instrument.newer_than(v, package.SUPPORTED), v


def test_event_ids_are_the_cores():
    assert [_recording.EMIT, _recording.SEND, _recording.ACCEPT, _recording.OUTPUT] == [
        int(edgemark.Event.from_name(n)) for n in edgemark.EVENT_NAMES
    ]


# -- the request lookup ------------------------------------------------------


def test_lookup_entries_round_trip_and_reject_other_ids(tmp_path):
    region = edgemark.Region.create(str(tmp_path / "r.region"), edges=[(0, 1)], slots=4)
    token = region.begin()
    directory = str(tmp_path / "r.requests")
    writer = _channel.Writer(directory)
    writer.publish("req-1", token)
    reader = _channel.Reader(directory)
    assert reader.read("req-1") == token
    assert stat.S_IMODE(os.stat(os.path.join(directory, _channel.entry_name("req-1"))).st_mode) == 0o600
    # Another ID under the same file name (a hash collision) is not it.
    with open(os.path.join(directory, _channel.entry_name("req-2")), "wb") as f:
        f.write(str(token).encode() + b"\nreq-1")
    assert reader.read("req-2") is None
    assert reader.read("absent") is None
    writer.withdraw("req-1")
    assert reader.read("req-1") is None


@pytest.mark.parametrize(
    "data",
    [b"garbage\nreq-3", b"\xff\xfe\nreq-3", b"abc\n\xff\xfe", b"no newline", b"", b"x" * 8192],
)
def test_a_garbage_entry_is_no_token(tmp_path, data):
    directory = tmp_path / "r.requests"
    directory.mkdir(mode=0o700)
    (directory / _channel.entry_name("req-3")).write_bytes(data)
    assert _channel.Reader(str(directory)).read("req-3") is None


def test_a_fifo_entry_never_blocks_the_reader(tmp_path):
    directory = tmp_path / "r.requests"
    directory.mkdir(mode=0o700)
    os.mkfifo(directory / _channel.entry_name("req-F"))
    got = []
    t = threading.Thread(target=lambda: got.append(_channel.Reader(str(directory)).read("req-F")), daemon=True)
    t.start()
    t.join(timeout=20)
    assert not t.is_alive(), "the reader blocked on a FIFO"
    assert got == [None]


def test_a_symlinked_entry_is_not_followed(tmp_path):
    region = edgemark.Region.create(str(tmp_path / "r.region"), edges=[(0, 1)], slots=4)
    token = region.begin()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(str(token).encode() + b"\nreq-S")
    directory = tmp_path / "r.requests"
    directory.mkdir(mode=0o700)
    (directory / _channel.entry_name("req-S")).symlink_to(elsewhere)
    assert _channel.Reader(str(directory)).read("req-S") is None


def test_a_directory_others_can_reach_is_refused_at_both_ends(tmp_path):
    # Another user pre-creates the predictable name, open to all: the server
    # publishes nothing there and a stage reads nothing from it.
    directory = tmp_path / "r.requests"
    directory.mkdir()
    os.chmod(directory, 0o777)
    with pytest.raises(_channel.UntrustedError, match="mode 777"):
        _channel.Writer(str(directory))
    with pytest.raises(_channel.UntrustedError):
        _channel.Reader(str(directory)).open()
    assert _channel.Reader(str(directory)).read("req-A") is None
    assert os.listdir(directory) == []


def test_a_directory_of_another_users_is_refused(tmp_path):
    as_root()
    directory = tmp_path / "r.requests"
    directory.mkdir(mode=0o700)
    os.chown(directory, NOBODY, NOBODY)
    with pytest.raises(_channel.UntrustedError, match="belongs to uid"):
        _channel.Writer(str(directory))
    with pytest.raises(_channel.UntrustedError):
        _channel.Reader(str(directory)).open()


def test_a_symlinked_directory_is_never_written_through(tmp_path):
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    link = tmp_path / "r.requests"
    link.symlink_to(target)
    with pytest.raises(OSError):
        _channel.Writer(str(link))
    with pytest.raises(OSError):
        _channel.Reader(str(link)).open()
    assert os.listdir(target) == []


def test_the_owner_removes_only_what_it_made(tmp_path):
    region = edgemark.Region.create(str(tmp_path / "r.region"), edges=[(0, 1)], slots=4)
    directory = tmp_path / "r.requests"
    directory.mkdir(mode=0o700)
    (directory / "not-mine").write_text("x")
    writer = _channel.Writer(str(directory))
    assert writer.created is False
    writer.publish("req-1", region.begin())
    writer.publish("req-2", region.begin())
    writer.withdraw("req-2")
    writer.remove()
    # Its own entry went, the file it never made and the directory it did
    # not create stay.
    assert os.listdir(directory) == ["not-mine"]
    fresh = _channel.Writer(str(tmp_path / "fresh.requests"))
    fresh.publish("req-1", region.begin())
    fresh.remove()
    assert not (tmp_path / "fresh.requests").exists()


def test_the_server_refuses_a_file_in_the_way_of_its_own_name_that_is_no_region(tmp_path, monkeypatch):
    # The name the plugin picks is this server start's alone: a region there
    # is a sibling API server's (attached), anything else is refused.
    path = tmp_path / "edgemark-vllm-omni-1-0123456789abcdef.region"
    path.write_bytes(b"not a region")
    monkeypatch.setenv(vllm_omni.ENV_REGION, str(path))
    monkeypatch.setenv("_EDGEMARK_VLLM_OMNI_NAMED", str(path))
    rec = Recording()
    assert rec.user_named is False
    assert rec.ensure_owner(_recording.edges(2), 4) is None and rec.failed
    assert rec.begin("req-1") is None


def test_a_server_with_an_untrusted_lookup_still_records_its_own_events(tmp_path, region_env, caplog):
    directory = _channel.lookup_dir(region_env)
    os.mkdir(directory)
    os.chmod(directory, 0o777)
    rec = Recording()
    with caplog.at_level(logging.WARNING, logger="edgemark.vllm_omni"):
        token = rec.begin("req-1")
    assert token is not None and os.listdir(directory) == []
    assert sum("cannot be trusted" in r.getMessage() for r in caplog.records) == 1
    rec.record("req-1", 0, 1, _recording.OUTPUT, lambda: True)
    assert rec.close("req-1")["0->1:0"]["consumer_first_nonempty_output_ms"] is not None


def test_with_requests_logged_each_close_says_its_id_trace_and_snapshot(region_env, caplog, monkeypatch):
    monkeypatch.setenv(vllm_omni.ENV_LOG_REQUESTS, "1")
    rec = Recording()
    token = rec.begin("req-logged")
    trace_id = rec.owner.region.traceparent(token).split("-")[1]
    rec.record("req-logged", 0, 1, _recording.EMIT, lambda: True, 3)
    with caplog.at_level(logging.INFO, logger="edgemark.vllm_omni"):
        final = rec.close("req-logged")
        assert rec.close("req-logged") == {}
    (line,) = [r.getMessage() for r in caplog.records if "closed" in r.getMessage()]
    head, snapshot = line.split(": stream_edge_metrics ")
    assert head == f"edgemark: request req-logged closed, trace {trace_id}"
    assert json.loads(snapshot) == final and final["0->1:0"]["first_chunk_seq"] == 3


def test_a_second_close_closes_nothing_and_says_nothing(region_env, caplog, monkeypatch):
    # The cleanup closes the request; the request state's finalizer closes
    # it again later, by its token: one close, one line.
    monkeypatch.setenv(vllm_omni.ENV_LOG_REQUESTS, "1")
    rec = Recording()
    token = rec.begin("req-twice")
    rec.record("req-twice", 0, 1, _recording.EMIT, lambda: True)
    with caplog.at_level(logging.INFO, logger="edgemark.vllm_omni"):
        first = rec.close("req-twice")
        assert rec.close("req-twice", token) == {}
    assert first["0->1:0"]["producer_first_nonempty_emit_ms"] is not None
    assert sum("closed" in r.getMessage() for r in caplog.records) == 1


def test_a_newer_instance_is_not_closed_by_the_older_ones_token(region_env):
    rec = Recording()
    old = rec.begin("req-reused")
    new = rec.begin("req-reused")
    assert rec.close("req-reused", old) == {}
    assert rec.owner.region.is_open(new) and not rec.owner.region.is_open(old)


def test_the_process_line_waits_until_vllms_logging_is_set_up(region_env, caplog, monkeypatch):
    # Inside vLLM (its module loaded) before its logging has a handler, as
    # in an API server that loads plugins before it configures logging: the
    # line is said when the process first uses its region.
    import types

    monkeypatch.setitem(sys.modules, "vllm", sys.modules.get("vllm") or types.ModuleType("vllm"))
    monkeypatch.setattr(logging.getLogger("vllm"), "handlers", [])
    rec = Recording()
    with caplog.at_level(logging.INFO, logger="edgemark.vllm_omni"):
        rec.say("edgemark: recording, the line")
        assert [r.getMessage() for r in caplog.records] == []
        rec.begin("req-1")
        rec.begin("req-2")
    assert [r.getMessage() for r in caplog.records] == ["edgemark: recording, the line"]


def test_without_the_variable_closes_say_nothing(region_env, caplog, monkeypatch):
    monkeypatch.delenv(vllm_omni.ENV_LOG_REQUESTS, raising=False)
    rec = Recording()
    rec.begin("req-quiet")
    with caplog.at_level(logging.DEBUG, logger="edgemark.vllm_omni"):
        rec.close("req-quiet")
    assert caplog.records == []


def test_a_payload_is_content_only_for_what_it_carries():
    from edgemark.vllm_omni._payload import multimodal_has_content, output_has_content

    class Payload:
        # The shape of vLLM-Omni's MultimodalPayload: tensors and metadata.
        def __init__(self, tensors, metadata=None):
            self.tensors, self.metadata = tensors, metadata or {}

    def completion(**kw):
        return SimpleNamespace(**{"token_ids": [], "text": "", **kw})

    assert output_has_content(SimpleNamespace(multimodal_output={}, outputs=[completion(multimodal_output=Payload({"audio": [0.1]}))]))
    assert not output_has_content(
        SimpleNamespace(multimodal_output={}, outputs=[completion(multimodal_output=Payload({"sr": [24000]}, {"sr": 24000}))])
    )
    assert not output_has_content(SimpleNamespace(multimodal_output={"sr": 24000, "meta.finished": [1]}, outputs=[]))
    assert output_has_content(SimpleNamespace(images=["an image"], outputs=[]))
    assert not output_has_content(SimpleNamespace(images=[], outputs=[completion()]))
    assert output_has_content(SimpleNamespace(outputs=[completion(token_ids=[7])]))
    assert not multimodal_has_content(Payload({"audio": []}))
    assert multimodal_has_content({"audio": [[], [0.5]]})
    assert not multimodal_has_content(24000)


# -- the stage side ----------------------------------------------------------


def test_the_region_is_sized_from_the_stages(monkeypatch):
    monkeypatch.delenv(vllm_omni.ENV_SLOTS, raising=False)
    once = _recording.Once()

    def pool(n):
        return SimpleNamespace(stage_vllm_config=SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=n)))

    assert _recording.slots_for([pool(64), pool(32), pool(4)], once) == 400
    assert _recording.slots_for([pool(8)], once) == 256
    assert _recording.slots_for([pool(50000)], once) == 65536
    assert _recording.slots_for([SimpleNamespace()], once) == 1024
    monkeypatch.setenv(vllm_omni.ENV_SLOTS, "77")
    assert _recording.slots_for([pool(64)], once) == 77


def test_a_stage_without_its_region_records_nothing_and_says_so_once(region_env, caplog):
    rec = Recording()
    with caplog.at_level(logging.DEBUG, logger="edgemark.vllm_omni"):
        for _ in range(3):
            assert rec.record("req", 0, 1, EMIT, lambda: True) is None
    said = [r for r in caplog.records if "no region" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.DEBUG
    assert not os.path.exists(region_env)


def test_a_stage_without_the_token_records_nothing(region_env):
    region = edgemark.Region.create(region_env, edges=[(0, 1)], slots=4)
    token = region.begin()
    rec = Recording()
    rec.record("unknown-request", 0, 1, EMIT, lambda: True)
    assert region.snapshot(token) == {}


def test_a_stage_finds_the_servers_token_through_the_lookup(region_env):
    server = Recording()
    token = server.begin("req-1")
    stage = Recording()  # another process's, on the same host
    stage.record("req-1", 0, 1, EMIT, lambda: True, 5)
    snap = server.close("req-1")
    assert snap["0->1:0"]["first_chunk_seq"] == 5
    assert token is not None


TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_stage_on_a_host_of_its_own_begins_a_request_under_the_context(region_env):
    # No API server on this host: the stage's request carries the trace
    # context; the stage makes this host's region and a request in it.
    rec = Recording()
    rec.record("req-1", 0, 1, _recording.ACCEPT, lambda: True, None, lambda: TRACE)
    assert os.path.exists(region_env)
    region = edgemark.Region.attach(region_env)
    (token,) = region.open_requests()
    assert region.snapshot(token)["0->1:0"]["consumer_first_accept_ms"] is not None
    assert region.traceparent(token).split("-")[1] == TRACE.split("-")[1]
    # Freed by its stage: closed, and its closed entry names its parent.
    rec.stage_freed("req-1")
    assert region.open_requests() == []
    (closed,) = region.drain_closed()
    assert closed["trace_id"] == TRACE.split("-")[1]
    assert closed["parent_span_id"] == TRACE.split("-")[2]


def test_a_stage_with_no_context_and_no_token_begins_nothing(region_env):
    rec = Recording()
    rec.record("req-1", 0, 1, _recording.ACCEPT, lambda: True, None, lambda: None)
    assert not os.path.exists(region_env)


def test_a_malformed_context_begins_a_request_in_a_new_trace(region_env):
    rec = Recording()
    rec.record("req-1", 0, 1, _recording.ACCEPT, lambda: True, None, lambda: "00-garbage")
    region = edgemark.Region.attach(region_env)
    (token,) = region.open_requests()
    assert region.snapshot(token) != {}
    assert region.counters()["bad_trace_contexts"] == 1


def test_the_logger_is_the_packages():
    assert _recording.log is logging.getLogger("edgemark.vllm_omni")


# -- the wrappers over stand-in call sites: the first call records through
# the full path, later calls take the inline fast path; both call the
# original with the same arguments and hand its result back unchanged.


def _calls_through(wrapped, orig_calls, call, result):
    before = len(orig_calls)
    assert call(wrapped) is result
    assert len(orig_calls) == before + 1
    return orig_calls[-1]


def _original(calls, result):
    def orig(*args, **kwargs):
        calls.append((args, kwargs))
        return result

    return orig


def _wrapper_cases():
    from edgemark.vllm_omni import adapter, runner
    from edgemark.vllm_omni._recording import ACCEPT, SEND

    request = SimpleNamespace(external_req_id="req-w", request_id="req-w", trace_headers=None)
    producer = SimpleNamespace(connector=SimpleNamespace(stage_id=0), put_req_chunk={"req-w": 2})
    consumer = SimpleNamespace(connector=SimpleNamespace(stage_id=1))
    data = {"hidden": [1.0]}
    mixin0 = SimpleNamespace(
        _stage_id=0, _next_stage_id=1, _request_ids_mapping={"req-w": "req-w"}, _put_req_chunk={"req-w": 3},
        _omni_connector=object(), _payload_is_consumable=lambda payload: bool(payload),
    )  # fmt: skip
    task = {"put_key": "req-w_0_3", "stage_id": 0, "next_stage_id": 1, "request_id": "req-w", "data": data}

    def sent(self, task, sender_token=None):
        # A put that succeeded advances the adapter's chunk counter.
        self.put_req_chunk["req-w"] += 1
        return "sent"

    return [
        # (name, factory, original's result, the call, the event it records)
        ("adapter.save_async", adapter.wrap_save_async, "queued",
         lambda f: f(producer, data, request, False, new_token_ids=[7]), EMIT, 2),
        ("adapter.send", adapter.wrap_send, None,
         lambda f: f(producer, {"request": request, "multimodal_output": data}, None), SEND, None),
        ("adapter.commit", adapter.wrap_commit, True,
         lambda f: f(consumer, request, (data, 1), stage_id=1), ACCEPT, None),
        ("runner.enqueue", runner.wrap_enqueue, "enqueued",
         lambda f: f(mixin0, request, data, wait_for_delivery=False), EMIT, 3),
        ("runner.send", runner.wrap_send, True, lambda f: f(mixin0, task), SEND, None),
    ], sent  # fmt: skip


@pytest.mark.parametrize("case", range(5))
def test_a_wrapper_records_once_then_only_calls_through(region_env, case):
    cases, sent = _wrapper_cases()
    name, factory, result, call, event, chunk_seq = cases[case]
    rec = Recording()
    token = rec.begin("req-w")
    calls = []
    orig = _original(calls, result)
    if name == "adapter.send":
        # The adapter's send: the original is what advances the counter.
        def orig(*args, **kwargs):  # noqa: F811
            calls.append((args, kwargs))
            sent(*args, **kwargs)
            return result

    wrapped = factory(orig, rec)
    first = _calls_through(wrapped, calls, call, result)
    seg = rec.owner.region.snapshot(token)["0->1:0"]
    recorded = [e for e in ("producer_first_nonempty_emit_ms", "edge_first_send_complete_ms",
                            "consumer_first_accept_ms") if seg[e] is not None]  # fmt: skip
    assert recorded == [list(edgemark.Event)[event].name.lower() + "_ms"]
    if chunk_seq is not None:
        assert seg["first_chunk_seq"] == chunk_seq
    assert rec.is_done("req-w", (0, 1, event))
    # The steady state: the same arguments reach the original, the result
    # comes back, the record stays the first one.
    for _ in range(3):
        assert _calls_through(wrapped, calls, call, result) == first
    assert rec.owner.region.snapshot(token)["0->1:0"] == seg


def test_a_wrapper_fast_path_falls_back_on_an_unexpected_stage():
    # A stage number that is not an int (a string, as some configs give)
    # misses the inline check and takes the full path, which converts it.
    from edgemark.vllm_omni import adapter

    calls = []
    rec = Recording()
    request = SimpleNamespace(external_req_id="req-s", request_id="req-s", trace_headers=None)
    rec.requests["req-s"] = _recording.StageRequest(None, 0.0, done={(0, 1, EMIT)})
    host = SimpleNamespace(connector=SimpleNamespace(stage_id="0"), put_req_chunk={})
    wrapped = adapter.wrap_save_async(_original(calls, "ok"), rec)
    assert wrapped(host, {"x": [1]}, request, False) == "ok"
    assert calls == [((host, {"x": [1]}, request, False), {})]


def test_the_receive_sink_is_none_in_every_new_thread():
    from edgemark.vllm_omni import runner

    seen = []
    runner._received.sink = ["main thread's"]
    try:
        t = threading.Thread(target=lambda: seen.append(runner._received.sink))
        t.start()
        t.join()
    finally:
        runner._received.sink = None
    assert seen == [None]
