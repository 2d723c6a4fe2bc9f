"""What the vLLM-Omni stage processes of the plugin tests share
(``_vllm_omni_stage.py``, ``_vllm_omni_adapter_stage.py``,
``_vllm_omni_host_stage.py``): the loop that answers one JSON command per
stdin line with one JSON line on stdout, the plugins loaded as a stage's
engine core loads them, a stage's engine request and chunk transfer adapter
as vLLM-Omni builds them, and the wait for the plugin's accept stamp.

Imported by name from the scripts' directory (a script's own directory is
on its ``sys.path``); vLLM and vLLM-Omni are imported only when used.
"""

from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace
from typing import Any, Callable, Optional


def print_json(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def answer_commands(
    handle: Callable[[str, dict], Optional[dict]],
    shutdown: Callable[[], None] = lambda: None,
    reply: Callable[[dict], None] = print_json,
) -> None:
    """Answers each JSON command on stdin (``{"op": ..., ...}``) with
    ``reply(handle(op, cmd))``; an op ``handle`` does not know (it returns
    ``None``) with an error. ``{"op": "exit"}`` runs ``shutdown``, is
    answered ``{"ok": true}`` and ends the loop."""
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "exit":
            shutdown()
            reply({"ok": True})
            return
        answer = handle(op, cmd)
        reply({"error": f"unknown op {op}"} if answer is None else answer)


def load_plugins_as_engine_core(stage_id: int) -> None:
    """Loads the plugins as a stage's engine core does: vLLM-Omni starts it
    under this name and loads only vLLM's group there
    (``EngineCore.__init__``), so the plugin patches the call sites of that
    role only."""
    import multiprocessing

    multiprocessing.current_process().name = f"StageEngineCoreProc_stage{stage_id}_replica0"
    from vllm.plugins import load_general_plugins

    load_general_plugins()


def engine_core_request(rid: str, prompt: list, trace_headers: Any = None):
    """A stage's engine request for ``rid`` (at most 8 tokens of output, no
    multimodal features), as the engine core receives it."""
    from vllm.sampling_params import SamplingParams
    from vllm_omni.engine import OmniEngineCoreRequest

    return OmniEngineCoreRequest(
        request_id=rid,
        prompt_token_ids=list(prompt),
        mm_features=None,
        sampling_params=SamplingParams(max_tokens=8),
        pooling_params=None,
        arrival_time=time.time(),
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
        trace_headers=trace_headers,
    )


def chunk_adapter(stage_id: int, worker_type: str, connector: dict, processor: Optional[str], max_num_seqs: int):
    """A real ``OmniChunkTransferAdapter`` (the scheduler's async-chunk
    transport) over ``connector`` (``{"name": ..., "extra": ...}``), with the
    least vllm_config it reads, as vLLM-Omni's CPU unit tests build one;
    ``processor`` names the stage's ``custom_process_next_stage_input_func``."""
    from vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter import (
        OmniChunkTransferAdapter,
    )

    model_config = SimpleNamespace(
        stage_connector_config=connector,
        stage_id=stage_id,
        worker_type=worker_type,
        async_chunk=True,
        max_model_len=4096,
        custom_process_next_stage_input_func=processor,
    )
    scheduler_config = SimpleNamespace(max_num_seqs=max_num_seqs)
    return OmniChunkTransferAdapter(SimpleNamespace(model_config=model_config, scheduler_config=scheduler_config))


def wait_accept_recorded(rid: str, stage_id: int, deadline: float) -> None:
    """Waits until this stage's plugin recorded (or gave up recording) its
    accept of ``rid`` on the edge into it, or until ``deadline``."""
    from edgemark.vllm_omni import instrumentor
    from edgemark.vllm_omni._recording import ACCEPT

    rec = instrumentor.recording
    if rec is None:
        return
    key = (stage_id - 1, stage_id, ACCEPT)
    while time.monotonic() < deadline and not rec.is_done(rid, key):
        time.sleep(0.005)
