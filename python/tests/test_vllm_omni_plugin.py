"""The parts of the vLLM-Omni plugin that need no vLLM-Omni: loading it,
refusing without vLLM-Omni, and removing what a killed server left."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from types import SimpleNamespace

import edgemark
from edgemark import vllm_omni


def test_register_without_the_variable_does_nothing(monkeypatch):
    monkeypatch.delenv(vllm_omni.ENV_ENABLE, raising=False)
    vllm_omni.register()
    assert not vllm_omni.is_instrumented()


def test_without_vllm_omni_one_warning_and_nothing_patched(tmp_path):
    # A fresh interpreter: `instrument` says why once per process.
    code = (
        "import logging, sys\n"
        "from edgemark import vllm_omni\n"
        "vllm_omni._installed_version = lambda: None\n"
        "logging.basicConfig(stream=sys.stdout, format='%(levelname)s %(message)s')\n"
        "print(vllm_omni.instrument(), vllm_omni.instrument(), vllm_omni.is_instrumented())\n"
    )
    # Run elsewhere than the sources, whose package lacks the built module.
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout
    lines = out.splitlines()
    assert lines[-1] == "False False False"
    warnings = [line for line in lines if line.startswith("WARNING")]
    assert len(warnings) == 1 and "not installed" in warnings[0] and "0.30" in warnings[0]


def test_clean_removes_only_what_dead_servers_left(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = os.getpid()
    for pid in (dead.pid, live):
        region = edgemark.Region.create(str(tmp_path / f"edgemark-vllm-omni-{pid}.region"), edges=[(0, 1)], slots=4)
        del region
        (tmp_path / f"edgemark-vllm-omni-{pid}.requests").mkdir()
        (tmp_path / f"edgemark-vllm-omni-{pid}.requests" / "entry").write_text("x")
    (tmp_path / "other.region").write_text("not the plugin's")
    out = subprocess.run(
        [sys.executable, "-m", "edgemark.vllm_omni", "clean", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path.parent,
    ).stdout
    left = sorted(os.listdir(tmp_path))
    assert left == sorted(["other.region", f"edgemark-vllm-omni-{live}.region", f"edgemark-vllm-omni-{live}.requests"])
    assert out.count("removed ") == 2 and str(dead.pid) in out


def test_lookup_entries_round_trip_and_reject_other_ids(tmp_path):
    region = edgemark.Region.create(str(tmp_path / "r.region"), edges=[(0, 1)], slots=4)
    token = region.begin()
    name = vllm_omni._entry_name("req-1")
    (tmp_path / name).write_bytes(str(token).encode() + b"\nreq-1")
    assert vllm_omni._read_entry(str(tmp_path), "req-1") == token
    # Another ID under the same file name (a hash collision) is not it.
    (tmp_path / vllm_omni._entry_name("req-2")).write_bytes(str(token).encode() + b"\nreq-1")
    assert vllm_omni._read_entry(str(tmp_path), "req-2") is None
    (tmp_path / vllm_omni._entry_name("req-3")).write_bytes(b"garbage\nreq-3")
    assert vllm_omni._read_entry(str(tmp_path), "req-3") is None
    assert vllm_omni._read_entry(str(tmp_path), "absent") is None


def test_the_logger_is_the_modules():
    assert vllm_omni._log is logging.getLogger("edgemark.vllm_omni")


def test_the_region_is_sized_from_the_stages(monkeypatch):
    monkeypatch.delenv(vllm_omni.ENV_SLOTS, raising=False)

    def pool(n):
        return SimpleNamespace(stage_vllm_config=SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=n)))

    assert vllm_omni._slots_for([pool(64), pool(32), pool(4)]) == 400
    assert vllm_omni._slots_for([pool(8)]) == 256
    assert vllm_omni._slots_for([pool(50000)]) == 65536
    assert vllm_omni._slots_for([SimpleNamespace()]) == 1024
    monkeypatch.setenv(vllm_omni.ENV_SLOTS, "77")
    assert vllm_omni._slots_for([pool(64)]) == 77


def test_a_stage_without_its_region_records_nothing_and_says_so_once(tmp_path, caplog):
    rec = vllm_omni._Recorder(str(tmp_path / "absent.region"))
    vllm_omni._said.discard("attach")
    with caplog.at_level(logging.DEBUG, logger="edgemark.vllm_omni"):
        for _ in range(3):
            assert rec.record("req", 0, 1, 0, lambda: True) is None
    said = [r for r in caplog.records if "no region" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.DEBUG


def test_a_stage_without_the_token_records_nothing(tmp_path):
    path = str(tmp_path / "r.region")
    region = edgemark.Region.create(path, edges=[(0, 1)], slots=4)
    token = region.begin()
    rec = vllm_omni._Recorder(path)
    rec.record("unknown-request", 0, 1, 0, lambda: True)
    assert region.snapshot(token) == {}
