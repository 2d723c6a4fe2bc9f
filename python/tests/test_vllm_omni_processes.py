"""The vLLM-Omni plugin as each process of a real server loads it: through
the entry point groups vLLM and vLLM-Omni read (never ``register`` called by
hand), under the process names they give, with vLLM's logging as vLLM sets
it up. Each case runs in a fresh interpreter: the plugin patches classes
process-wide, once per process.

Needs ``vllm-omni`` installed; skipped where it is not, unless
``EDGEMARK_REQUIRE_VLLM_OMNI=1`` (CI), which makes that a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

if importlib.util.find_spec("vllm_omni") is None:
    if os.environ.get("EDGEMARK_REQUIRE_VLLM_OMNI") == "1":
        raise RuntimeError("EDGEMARK_REQUIRE_VLLM_OMNI=1 but vllm_omni is not installed")
    pytest.skip("vllm-omni is not installed", allow_module_level=True)

# Loads the plugin groups as the named process does, then prints what is
# patched (by role) as its last line.
_LOAD = """
import json, multiprocessing, sys
name, group = sys.argv[1], sys.argv[2]
multiprocessing.current_process().name = name
# vLLM's logging, as its processes set it up before loading plugins: at
# import (0.30), or from the engine's configuration (0.32).
import vllm.logger
if hasattr(vllm.logger, "configure_logging"):
    from vllm.config.logging import LoggingConfig
    vllm.logger.configure_logging(LoggingConfig())
if group == "vllm":
    # A stage's engine core: EngineCore.__init__ loads vLLM's group only.
    from vllm.plugins import load_general_plugins
    load_general_plugins()
else:
    # The API server and model workers: vLLM-Omni's loader (both groups).
    from vllm_omni.plugins import load_omni_general_plugins
    load_omni_general_plugins()
from edgemark import vllm_omni
from edgemark.vllm_omni import adapter, orchestrator, runner
def wrapped(targets):
    import importlib
    out = []
    for t in targets:
        mod = importlib.import_module(t.module)
        owner = mod if t.cls is None else getattr(mod, t.cls)
        f = owner.__dict__.get(t.attr)
        out.append(f is not None and hasattr(f, "__wrapped__"))
    return out
print(json.dumps({
    "instrumented": vllm_omni.is_instrumented(),
    "api": wrapped(orchestrator.TARGETS),
    "scheduler": wrapped([t for t in adapter.TARGETS if not t.optional]),
    "runner": wrapped(runner.TARGETS),
}))
"""


def load(tmp_path, name: str, group: str, **env_over) -> tuple:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEMARK_VLLM_OMNI")}
    env.update(
        EDGEMARK_VLLM_OMNI="1",
        EDGEMARK_VLLM_OMNI_REGION=str(tmp_path / "host.region"),
        VLLM_NO_USAGE_STATS="1",
        HF_HUB_OFFLINE="1",
    )
    env.update(env_over)
    env = {k: v for k, v in env.items() if v is not None}
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD, name, group], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    return json.loads(lines[-1]), proc.stdout + proc.stderr


def said(output: str) -> list:
    return [line for line in output.splitlines() if "edgemark: recording vLLM-Omni" in line]


def test_the_entry_point_is_in_both_groups_vllm_and_vllm_omni_read():
    from importlib.metadata import entry_points

    for group in ("vllm.general_plugins", "vllm_omni.general_plugins"):
        mine = [ep for ep in entry_points(group=group) if ep.name == "edgemark"]
        assert [ep.value for ep in mine] == ["edgemark.vllm_omni:register"], group


def test_a_stage_engine_core_loading_only_vllms_group_patches_the_adapter_and_runner(tmp_path):
    got, out = load(tmp_path, "StageEngineCoreProc_stage1_replica0", "vllm")
    assert got["instrumented"]
    assert all(got["scheduler"]) and all(got["runner"])
    assert not any(got["api"])
    (line,) = said(out)
    assert "transfer adapter, model runner connector call sites patched" in line
    assert "StageEngineCoreProc_stage1_replica0" in line and str(tmp_path / "host.region") in line


def test_a_model_worker_patches_the_runner_only(tmp_path):
    got, out = load(tmp_path, "VllmWorker-0", "omni")
    assert got["instrumented"] and all(got["runner"])
    assert not any(got["api"]) and not any(got["scheduler"])
    (line,) = said(out)
    assert "model runner connector call sites patched" in line


def test_the_api_server_loads_both_groups_and_patches_once(tmp_path):
    # vLLM-Omni's loader runs vLLM's group, then its own: the entry point is
    # called twice in this process and patches (and says so) once.
    got, out = load(tmp_path, "MainProcess", "omni")
    assert got["instrumented"] and all(got["api"]) and all(got["scheduler"]) and all(got["runner"])
    (line,) = said(out)
    assert "orchestrator, transfer adapter, model runner connector call sites patched" in line


def test_the_line_goes_where_vllm_logs_in_vllms_format(tmp_path):
    # vLLM's default logging: its own handler on the `vllm` logger, its
    # format ("INFO <date> [file:line] message"), nothing set up by hand.
    _, out = load(tmp_path, "StageEngineCoreProc_stage0_replica0", "vllm")
    (line,) = said(out)
    assert re.search(r"\bINFO \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\] edgemark: recording", line), line


def test_under_vllms_level_warning_the_line_is_not_said(tmp_path):
    got, out = load(tmp_path, "StageEngineCoreProc_stage0_replica0", "vllm", VLLM_LOGGING_LEVEL="WARNING")
    assert got["instrumented"] and said(out) == []


def test_a_variable_that_is_not_1_patches_nothing_and_says_why_once(tmp_path):
    got, out = load(tmp_path, "MainProcess", "omni", EDGEMARK_VLLM_OMNI="true")
    assert not got["instrumented"] and not any(got["api"] + got["scheduler"] + got["runner"])
    warned = [line for line in out.splitlines() if "EDGEMARK_VLLM_OMNI='true' is not 1" in line]
    assert len(warned) == 1 and "WARNING" in warned[0]


def test_without_the_variable_nothing_is_patched_or_said(tmp_path):
    got, out = load(tmp_path, "StageEngineCoreProc_stage0_replica0", "vllm", EDGEMARK_VLLM_OMNI=None)
    assert not got["instrumented"] and "edgemark:" not in out


def test_an_allow_list_without_edgemark_leaves_vllm_untouched(tmp_path):
    # VLLM_PLUGINS names the plugins a process may load.
    got, _ = load(tmp_path, "StageEngineCoreProc_stage0_replica0", "vllm", VLLM_PLUGINS="vllm_omni_register_models")
    assert not got["instrumented"]
    got, _ = load(tmp_path, "StageEngineCoreProc_stage0_replica0", "vllm", VLLM_PLUGINS="edgemark")
    assert got["instrumented"]


def test_the_final_audio_in_a_completions_multimodal_payload_is_content():
    from vllm.outputs import CompletionOutput, RequestOutput

    from edgemark.vllm_omni._payload import output_has_content

    mm_outputs = pytest.importorskip("vllm_omni.outputs.mm_outputs")
    payload_cls = getattr(mm_outputs, "MultimodalPayload", None)
    if payload_cls is None:
        pytest.skip("this vllm-omni has no MultimodalPayload")
    import torch

    def out(mm):
        completion = CompletionOutput(index=0, text="", token_ids=[], cumulative_logprob=None, logprobs=None)
        completion.multimodal_output = mm
        ro = RequestOutput(
            request_id="r", prompt=None, prompt_token_ids=[], prompt_logprobs=None, outputs=[completion], finished=True
        )
        ro.multimodal_output = {}
        return ro

    audio = payload_cls(tensors={"audio": torch.zeros(480), "sr": torch.tensor(24000)}, metadata={"sr": 24000})
    assert output_has_content(out(audio))
    only_rate = payload_cls(tensors={"sr": torch.tensor(24000)}, metadata={"sr": 24000})
    assert not output_has_content(out(only_rate))
    assert not output_has_content(out(payload_cls(tensors={"audio": torch.zeros(0)})))
    assert not output_has_content(out(None))
