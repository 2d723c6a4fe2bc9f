"""One vLLM-Omni stage process on the adapter path, for the plugin tests:
the scheduler's ``OmniChunkTransferAdapter`` (the transport of every deploy
file with ``async_chunk: true`` under the default model runner) over the
real SharedMemoryConnector, with real vLLM ``Request`` objects, no model,
no GPU.

    python _vllm_omni_adapter_stage.py STAGE_ID

It loads the plugins as a stage's engine core does (under vLLM-Omni's name
for that process, vLLM's plugin group only: ``EngineCore.__init__``),
prints ``{"ready": true, ...}``, then answers one JSON command per stdin
line with one JSON line:

- ``{"op": "save", "rid": R, "kind": K, "finished": F}``: the scheduler
  hands the adapter one step's output (``data``: tokens and hidden states;
  ``empty``: nothing) through ``save_async``; waits until the save thread
  is done with it. The stage's processor (``processor`` below) turns an
  output with content into a payload and an empty one into none;
- ``{"op": "register", "rid": R}``: the scheduler registers R for chunks
  (``load_async``);
- ``{"op": "wait", "rid": R}``: waits until the receive thread admitted a
  chunk of R (or 30 s), and with ``"accepted": true`` until the plugin
  recorded this stage's accept of R;
- ``{"op": "free", "rid": R}``: the scheduler frees R;
- ``{"op": "exit"}``.
"""

from __future__ import annotations

import os
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _vllm_omni_stage_support import (  # noqa: E402
    answer_commands,
    chunk_adapter,
    engine_core_request,
    load_plugins_as_engine_core,
    print_json,
    wait_accept_recorded,
)


def processor(transfer_manager, multimodal_output, request, is_finished, **_):
    """The stage's payload builder (``custom_process_next_stage_input_func``):
    a payload from an output with content, none from an empty one."""
    from vllm_omni.data_entry_keys import OmniPayloadStruct

    if not multimodal_output:
        return None
    payload = OmniPayloadStruct()
    payload.embed = {"hidden": multimodal_output["hidden"]}
    return payload


def vllm_request(rid: str, trace_headers=None):
    """A scheduler-side vLLM request, as the engine core builds it."""
    from vllm.v1.request import Request

    request = Request.from_engine_core_request(engine_core_request(rid, [1, 2, 3], trace_headers), block_hasher=None)
    request.external_req_id = rid
    return request


def output(kind: str):
    import torch

    return {"hidden": torch.ones(2, 4)} if kind == "data" else None


def make_adapter(stage_id: int, connector: dict):
    module = __name__ if __name__ != "__main__" else "_vllm_omni_adapter_stage"
    return chunk_adapter(stage_id, "ar", connector, f"{module}.processor", max_num_seqs=8)


def wait_saved(adapter) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not adapter._pending_save_reqs and not any(t.in_flight for t in list(adapter._sender_tokens.values())):
            time.sleep(0.02)
            if not adapter._pending_save_reqs:
                return
        time.sleep(0.005)


def free(request) -> None:
    """The scheduler frees a finished request. Its own bookkeeping needs a
    whole scheduler; the plugin follows the call whatever the body does, and
    vLLM-Omni's exception passes unchanged."""
    from vllm_omni.core.sched.omni_ar_scheduler import OmniARScheduler

    try:
        OmniARScheduler._free_request(SimpleNamespace(), request)
    except (AttributeError, AssertionError):
        pass


def serve(stage_id: int, connector: dict) -> None:
    from vllm.v1.request import RequestStatus

    load_plugins_as_engine_core(stage_id)
    from edgemark import vllm_omni

    adapter = make_adapter(stage_id, connector)
    requests = {}
    print_json({"ready": True, "instrumented": vllm_omni.is_instrumented()})

    def handle(op: str, cmd: dict):
        rid = cmd.get("rid")
        if rid is not None and rid not in requests:
            requests[rid] = vllm_request(rid, cmd.get("trace_headers"))
        request = requests.get(rid)
        if op == "save":
            if cmd.get("finished"):
                request.status = RequestStatus.FINISHED_STOPPED
            adapter.save_async(output(cmd["kind"]), request, False, new_token_ids=[])
            wait_saved(adapter)
            return {"puts": adapter.put_req_chunk.get(rid, 0)}
        if op == "register":
            adapter.load_async(request)
            return {"ok": True}
        if op == "wait":
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and rid not in adapter._finished_load_reqs:
                time.sleep(0.005)
            got = rid in adapter._finished_load_reqs
            # The chunk is admitted inside `_commit_received_chunk`; the
            # receive thread records its accept when that call returns.
            if cmd.get("accepted"):
                # Wait for the stamp itself, so that the output routed next
                # follows it however long that thread waits.
                wait_accept_recorded(rid, stage_id, deadline)
            else:
                # A scheduler takes the request a model step later: so does
                # this stage.
                time.sleep(0.05)
            adapter._finished_load_reqs.discard(rid)
            return {"admitted": got, "chunks": adapter.get_req_chunk.get(rid, 0)}
        if op == "free":
            free(request)
            requests.pop(rid, None)
            return {"ok": True}
        return None

    answer_commands(handle, adapter.shutdown)

if __name__ == "__main__":
    # (The second argument, the worker type, is the mixin stage's; the
    # adapter's stages here are autoregressive.)
    serve(int(sys.argv[1]), {"name": "SharedMemoryConnector", "extra": {}})
