"""The instrumentor's checks of what a plugin reads (``Field``, ``Part``)
and its policy for a release newer than the tested range, on a small
framework module written for the test (no vLLM needed)."""

from __future__ import annotations

import logging
import sys
import textwrap

import pytest

from edgemark import _instrument
from edgemark._instrument import Field, Instrumentor, Part, Target

FRAMEWORK = '''
import dataclasses

@dataclasses.dataclass
class Output:
    req_ids: list
    sampled: list

class Request:
    def __init__(self, rid, params):
        self.request_id = rid
        self.kv_transfer_params = params

class Worker:
    def _reap(self, done_sending, extra=None):
        pass

class Engine:
    def step(self, output):
        return output

    def begin(self, request):
        return request

KEYS = {"remote_request_id": 1}
'''


@pytest.fixture
def framework(tmp_path, monkeypatch):
    """``fw_<test>``: a module with the objects a plugin reads, installed
    as release ``version`` (set it on the fixture)."""
    name = f"fw_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(FRAMEWORK))
    monkeypatch.syspath_prepend(str(tmp_path))
    state = {"version": "1.1.0"}
    monkeypatch.setattr(_instrument, "installed_version", lambda dist: state["version"])
    yield name, state
    sys.modules.pop(name, None)


def instrumentor(name, parts, log):
    seen = []

    def wrap(orig, rec):
        def wrapper(self, *a):
            seen.append(orig.__name__)
            return orig(self, *a)

        return wrapper

    class Rec:
        broken = {}

    targets = {
        "all": (
            Target(name, "Engine", "step", ("self", "output"), wrap, part="output"),
            Target(name, "Engine", "begin", ("self", "request"), wrap),
        )
    }
    ins = Instrumentor(
        instruments=(f"{name} >= 1.0, < 2",), targets=targets, make_recording=lambda un: Rec(), log=log, parts=parts
    )
    return ins, seen


def test_each_kind_of_field_is_checked(framework):
    name, _ = framework
    ok = [
        Field(name, "Output", "req_ids"),
        Field(name, "Request", "kv_transfer_params", "init"),
        Field(name, "Worker", "_reap", "method", ("done_sending",)),
        Field(name, None, "remote_request_id", "key"),
    ]
    for f in ok:
        assert _instrument.check_field(f) is None, f
    bad = {
        Field(name, "Output", "req_id_to_index"): "Output.req_id_to_index is missing",
        Field(name, "Request", "trace", "init"): "Request.trace is missing",
        Field(name, "Worker", "_reap", "method", ("finished",)): "takes ('done_sending', 'extra')",
        Field(name, "Worker", "_notifs", "method"): "Worker._notifs is missing",
        Field(name, None, "do_remote_decode", "key"): "is not used any more",
        Field(name, "Gone", "x"): f"{name}.Gone is missing",
        Field("no_such_module_here", "X", "y"): "does not import",
    }
    for f, why in bad.items():
        got = _instrument.check_field(f)
        assert got is not None and why in got, (f, got)


def test_a_part_that_does_not_check_out_is_refused_alone_with_one_warning(framework, caplog):
    name, _ = framework
    parts = {"output": Part((Field(name, "Output", "req_id_to_index"),), "the first output is")}
    ins, seen = instrumentor(name, parts, logging.getLogger("edgemark.test"))
    with caplog.at_level(logging.WARNING, logger="edgemark.test"):
        assert ins.instrument()
    engine = sys.modules[name].Engine()
    engine.step(1)
    engine.begin(2)
    assert seen == ["begin"], "the refused part's call site is not patched; the other one is"
    assert set(ins.broken) == {"output"} and ins.recording.broken is ins.broken
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "the first output is not recorded" in lines[0] and "req_id_to_index" in lines[0]
    ins.uninstrument()


def test_an_essential_part_refuses_everything(framework, caplog):
    name, _ = framework
    parts = {"request": Part((Field(name, None, "do_remote_decode", "key"),), "every event is", essential=True)}
    ins, seen = instrumentor(name, parts, logging.getLogger("edgemark.test"))
    with caplog.at_level(logging.WARNING, logger="edgemark.test"):
        assert not ins.instrument()
        assert not ins.instrument()
    assert not ins.is_instrumented
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "nothing is patched" in lines[0] and "do_remote_decode" in lines[0]


@pytest.mark.parametrize(
    "version, patched, said",
    [
        ("1.1.0", True, None),
        ("2.0.0", True, "is newer than the releases edgemark was tested with"),
        ("2.0.0rc1", True, "is newer than the releases edgemark was tested with"),
        ("0.9.0", False, "is not supported"),
    ],
)
def test_a_newer_release_records_when_everything_checks_out_and_says_the_tested_range(
    framework, caplog, version, patched, said
):
    name, state = framework
    state["version"] = version
    parts = {"output": Part((Field(name, "Output", "req_ids"),), "the first output is")}
    ins, seen = instrumentor(name, parts, logging.getLogger("edgemark.test"))
    with caplog.at_level(logging.WARNING, logger="edgemark.test"):
        assert ins.instrument() is patched
    lines = [r.getMessage() for r in caplog.records]
    if said is None:
        assert lines == [] and not ins.untested
    else:
        assert len(lines) == 1 and said in lines[0] and ">=1.0,<2" in lines[0]
        assert ins.untested is (version.startswith("2"))
    ins.uninstrument()


def test_a_newer_release_whose_call_site_changed_is_refused(framework, caplog):
    name, state = framework
    state["version"] = "3.0.0"
    targets = {"all": (Target(name, "Engine", "step", ("self", "outputs"), lambda o, r: o),)}
    ins = Instrumentor(
        instruments=(f"{name} >= 1.0, < 2",),
        targets=targets,
        make_recording=lambda un: object(),
        log=logging.getLogger("edgemark.test"),
    )
    with caplog.at_level(logging.WARNING, logger="edgemark.test"):
        assert not ins.instrument()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "has changed where edgemark hooks in" in lines[0]


def test_the_vllm_plugin_declares_what_it_reads_by_part():
    from edgemark.vllm import connector, package

    assert set(package.PARTS) == {"request", "output", "accept", "send", "finish"}
    assert [n for n, p in package.PARTS.items() if p.essential] == ["request"]
    (step,) = connector.ENGINE_TARGETS
    assert step.part == "output"
    fields = {f.name for p in package.PARTS.values() for f in p.fields}
    assert "ModelRunnerOutput.req_ids" in fields and "ModelRunnerOutput.req_id_to_index" not in fields
    assert "NixlBaseConnectorWorker._reap_expired_send_leases" in fields
