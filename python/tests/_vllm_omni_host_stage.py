"""One process of the two-host vLLM-Omni test (``test_vllm_omni_hosts.py``):
vLLM-Omni's async-chunk transfer adapter (``OmniChunkTransferAdapter``, the
scheduler's path) over its real ``MooncakeTransferEngineConnector`` on CPU
over TCP, no model, no GPU.

    python _vllm_omni_host_stage.py api
    python _vllm_omni_host_stage.py producer HOST ZMQ_PORT
    python _vllm_omni_host_stage.py consumer HOST SENDER_HOST ZMQ_PORT

Each loads the plugins as the process it stands for does (``api``: the API
server, through vLLM-Omni's loader; ``producer``, ``consumer``: a stage's
engine core, under vLLM-Omni's name for it, vLLM's group only), so the
edgemark plugin instruments it when ``EDGEMARK_VLLM_OMNI=1``; prints one
JSON line ``{"ready": true, ...}``, then answers one JSON command per stdin
line with one JSON line on stdout (vLLM logs to stdout too: the answer is
the line that starts with ``{"reply"``).

``api``, the API-server side:

- ``{"op": "begin", "rid": R}``: a real ``ClientRequestState(R)`` (the
  plugin begins the request in this host's region); answers the plugin's
  traceparent for R, and the next stage's engine request, built by vLLM-Omni's
  own ``build_engine_core_request_from_tokens`` as its orchestrator builds a
  downstream stage's request (the plugin puts the traceparent in its
  ``trace_headers``), encoded with vLLM's msgpack encoder as it travels to a
  stage's engine core;
- ``{"op": "close", "rid": R}``: the API server is done with R.

``producer``, stage 0 (an AR stage that sends chunks):

- ``{"op": "send", "rid": R, "codes": [...]}``: a stage-0 scheduler
  ``Request`` for R (made once), one decode step's output with these codec
  ids handed to ``save_async``, as the AR scheduler does; then the request
  finishes and its terminal chunk is handed over; waits until the adapter's
  send thread is done with both.

``consumer``, stage 1 (a generation stage that receives chunks):

- ``{"op": "receive", "engine_request": B64}``: the engine request decoded
  as the stage's engine core decodes it, the scheduler ``Request`` made from
  it (``OmniRequest.from_engine_core_request``), put in the waiting queue;
  then scheduler ticks (``process_pending_chunks``, a schedule of the
  requests whose chunk is ready, ``postprocess_scheduler_output``,
  ``restore_queues``) until the upstream is exhausted; answers what the
  scheduled request carried;
- ``{"op": "free"}``: the request finishes and the generation scheduler
  frees it (``_free_request``, then the adapter's ``cleanup``), as
  ``OmniGenerationScheduler.update_from_output`` does.

Every side: ``{"op": "exit"}``.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from types import SimpleNamespace
from typing import Any

from _vllm_omni_stage_support import answer_commands, chunk_adapter, engine_core_request, load_plugins_as_engine_core

#: How long a step waits for the other host (a bound, not a timing).
PATIENCE_S = 60.0


def next_stage_input(transfer_manager: Any, multimodal_output: Any, request: Any, is_finished: bool = False):
    """The producer stage's ``custom_process_next_stage_input_func``: the
    decode step's codec ids (and its hidden state) become the next stage's
    chunk, as vLLM-Omni's ``*2code2wav_async_chunk`` processors do."""
    import torch
    from vllm_omni.data_entry_keys import CodesStruct, OmniPayloadStruct

    if not isinstance(multimodal_output, dict):
        return None
    codes = (multimodal_output.get("codes") or {}).get("audio")
    if not isinstance(codes, torch.Tensor) or codes.numel() == 0:
        return None
    return OmniPayloadStruct(codes=CodesStruct(audio=codes.flatten()), hidden=multimodal_output.get("hidden"))


def hidden_for(codes: list) -> "Any":
    """The hidden state the producer sends with ``codes``: derived from
    them, so the consumer can check what arrived."""
    import torch

    return torch.arange(len(codes) * 4, dtype=torch.float32).reshape(len(codes), 4) + float(sum(codes))


def reply(**kw: Any) -> None:
    print(json.dumps({"reply": True, **kw}), flush=True)


def reply_with(answer: dict) -> None:
    reply(**answer)


def region_exists() -> bool:
    path = os.environ.get("EDGEMARK_VLLM_OMNI_REGION")
    return bool(path) and os.path.exists(path)


def plugin_state() -> dict:
    from edgemark import vllm_omni

    return {"instrumented": vllm_omni.is_instrumented(), "region_exists": region_exists()}


def make_adapter(stage_id: int, worker_type: str, extra: dict, processor: str | None):
    """A real ``OmniChunkTransferAdapter`` over the connector ``extra``
    names, with the least vllm_config it reads (as vLLM-Omni's CPU unit
    tests build one)."""
    connector = {"name": "MooncakeTransferEngineConnector", "extra": extra}
    adapter = chunk_adapter(stage_id, worker_type, connector, processor, max_num_seqs=4)
    # The adapter reads ``connector.stage_id``. vLLM-Omni 0.30's Mooncake
    # connector never sets it (0.32's does, from its config, as the shared
    # memory connector always did), so the adapter cannot run over it there:
    # it is set here, from the same config, before any chunk moves.
    shim = not hasattr(adapter.connector, "stage_id")
    if shim:
        adapter.connector.stage_id = adapter.connector.config.get("stage_id", -1)
    return adapter, shim


def mooncake_extra(**kw: Any) -> dict:
    # CPU memory that is not pinned ("cpu" pins, which needs a GPU driver),
    # a small pool, TCP, explicit addresses.
    return {"memory_pool_device": "cpu:0", "memory_pool_size": 16 * 1024 * 1024, "protocol": "tcp", **kw}


def engine_request(rid: str, prompt: list, trace_headers: Any = None):
    """A stage-0 engine request as vLLM's input processor leaves it: the
    client's ID kept as ``external_req_id``, an internal ID of its own."""
    from vllm.v1.engine.input_processor import InputProcessor

    req = engine_core_request(rid, prompt, trace_headers)
    InputProcessor.assign_request_id(req)
    return req


# ---------------------------------------------------------------------------
# The API-server side.


def run_api() -> None:
    from edgemark import vllm_omni
    from vllm.sampling_params import SamplingParams
    from vllm.v1.serial_utils import MsgpackEncoder
    from vllm_omni.engine import orchestrator
    from vllm_omni.entrypoints.client_request_state import ClientRequestState

    reply(ready=True, **plugin_state())
    states: dict = {}
    encoder = MsgpackEncoder()

    def handle(op: str, cmd: dict):
        rid = cmd.get("rid")
        if op == "begin":
            states[rid] = ClientRequestState(rid)
            traceparent_of = getattr(vllm_omni, "traceparent_of", None)
            traceparent = traceparent_of(rid) if traceparent_of is not None else None
            # The next stage's request, as the orchestrator builds it for a
            # stage fed by tokens (its request ID is the client's).
            req = orchestrator.build_engine_core_request_from_tokens(
                request_id=rid,
                prompt={"prompt_token_ids": [0]},
                params=SamplingParams(max_tokens=1),
            )
            req.external_req_id = req.request_id
            # Sent as built: the trace context is the plugin's to add.
            built = dict(req.trace_headers) if req.trace_headers else None
            frames = encoder.encode(req)
            return dict(
                traceparent=traceparent,
                has_traceparent_of=traceparent_of is not None,
                built_trace_headers=built,
                engine_request=[base64.b64encode(bytes(f)).decode("ascii") for f in frames],
                **plugin_state(),
            )
        if op == "close":
            close_request = getattr(vllm_omni, "close_request", None)
            closed = close_request(rid) if close_request is not None else None
            states.pop(rid, None)
            return dict(closed=closed is not None, has_close_request=close_request is not None)
        return None

    answer_commands(handle, reply=reply_with)


# ---------------------------------------------------------------------------
# Stage 0: the producer.


def wait_sent(adapter, external_req_id: str) -> bool:
    """Until the send thread is done with every chunk of the request (the
    terminal's put cleans the sender state up)."""
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        if not adapter._pending_save_reqs and not adapter.has_active_sender(external_req_id):
            return True
        time.sleep(0.005)
    return False


def run_producer(host: str, zmq_port: int) -> None:
    import torch
    from vllm.v1.request import RequestStatus
    from vllm_omni.request import OmniRequest

    adapter, shim = make_adapter(
        0,
        "ar",
        mooncake_extra(role="sender", host=host, zmq_port=zmq_port),
        "_vllm_omni_host_stage.next_stage_input",
    )
    connector = adapter.connector
    reply(
        ready=True,
        connector=type(connector).__name__,
        host=connector.host,
        zmq_port=connector.zmq_port,
        stage_id_shim=shim,
        **plugin_state(),
    )
    puts = {"ok": 0, "failed": 0}
    orig_put = connector.put

    def counting_put(*a, **kw):
        out = orig_put(*a, **kw)
        puts["ok" if out[0] else "failed"] += 1
        return out

    # Counted on the instance only: whatever the plugin wraps is the class's.
    connector.put = counting_put

    def handle(op: str, cmd: dict):
        if op != "send":
            return None
        rid, codes = cmd["rid"], cmd["codes"]
        request = OmniRequest.from_engine_core_request(engine_request(rid, [1, 2, 3]), None)
        # One decode step: a token committed, its codec ids the output.
        request.append_output_token_ids(7)
        request.num_computed_tokens = request.num_tokens
        step_output = {"codes": {"audio": torch.tensor(codes, dtype=torch.long)}, "hidden": hidden_for(codes)}
        adapter.save_async(step_output, request, False, new_token_ids=[7])
        # The request stops: its terminal chunk, no output of its own.
        request.status = RequestStatus.FINISHED_STOPPED
        adapter.save_async(None, request, False)
        sent = wait_sent(adapter, request.external_req_id)
        return dict(
            sent=sent,
            puts=dict(puts),
            request_id=request.request_id,
            external_req_id=request.external_req_id,
            **plugin_state(),
        )

    answer_commands(handle, adapter.shutdown, reply_with)


# ---------------------------------------------------------------------------
# Stage 1: the consumer.


def make_generation_scheduler():
    """An ``OmniGenerationScheduler`` made without ``__init__`` (as
    vLLM-Omni's unit tests make theirs), with what its ``_free_request``
    reads: vLLM's own KV cache manager over a one-layer cache, its encoder
    cache manager, no KV connector."""
    import torch
    from vllm.v1.core.encoder_cache_manager import EncoderCacheManager
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm_omni.core.sched.omni_generation_scheduler import OmniGenerationScheduler

    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float32)
    kv_config = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
    sched = OmniGenerationScheduler.__new__(OmniGenerationScheduler)
    sched.input_coordinator = None
    sched.connector = None
    sched.ec_connector = None
    sched._inflight_prefills = set()
    sched.encoder_cache_manager = EncoderCacheManager(cache_size=0)
    sched.kv_cache_manager = KVCacheManager(
        kv_config, max_model_len=4096, scheduler_block_size=16, hash_block_size=16, enable_caching=False
    )
    sched.finished_req_ids = set()
    sched.finished_req_ids_dict = None
    sched.defer_block_free = False
    sched.requests = {}
    # Read by vllm 0.32's _free_request: no auxiliary output connector, no
    # KV fetch stages tracked.
    sched.aux_output_connector = None
    sched._kv_fetch_stages = None
    return sched


def run_consumer(host: str, sender_host: str, sender_port: int) -> None:
    import torch
    from vllm.v1.core.sched.request_queue import SchedulingPolicy, create_request_queue
    from vllm.v1.request import RequestStatus
    from vllm.v1.serial_utils import MsgpackDecoder
    from vllm_omni.engine import OmniEngineCoreRequest
    from vllm_omni.request import OmniRequest

    adapter, shim = make_adapter(
        1,
        "generation",
        # The sender's port as vLLM-Omni resolves it from the stages' shared
        # base port and the edge's source stage.
        mooncake_extra(role="receiver", host=host, sender_host=sender_host, zmq_port=sender_port, from_stage=0),
        None,
    )
    sched = make_generation_scheduler()
    reply(
        ready=True,
        connector=type(adapter.connector).__name__,
        host=adapter.connector.host,
        sender=[adapter.connector.sender_host, adapter.connector.sender_zmq_port],
        stage_id_shim=shim,
        **plugin_state(),
    )
    request = None
    decoder = MsgpackDecoder(OmniEngineCoreRequest)

    def handle(op: str, cmd: dict):
        nonlocal request
        if op == "receive":
            core = decoder.decode([base64.b64decode(f) for f in cmd["engine_request"]])
            request = OmniRequest.from_engine_core_request(core, None)
            sched.requests[request.request_id] = request
            waiting = create_request_queue(SchedulingPolicy.FCFS)
            waiting.add_request(request)
            running: list = []
            scheduled = []
            deadline = time.monotonic() + PATIENCE_S
            while time.monotonic() < deadline:
                adapter.process_pending_chunks(waiting, running, scheduler_requests=sched.requests)
                # The schedule: a request whose chunk is ready runs now.
                ready = [r for r in waiting if r.request_id in adapter.requests_with_ready_chunks]
                for r in ready:
                    info = r.additional_information or {}
                    hidden = info.get("hidden")
                    scheduled.append(
                        {
                            "prompt_token_ids": list(r.prompt_token_ids or []),
                            "hidden": hidden.tolist() if isinstance(hidden, torch.Tensor) else None,
                        }
                    )
                adapter.postprocess_scheduler_output(
                    SimpleNamespace(
                        scheduled_new_reqs=[SimpleNamespace(req_id=r.request_id) for r in ready],
                        scheduled_cached_reqs=None,
                    )
                )
                adapter.restore_queues(waiting, running, scheduler_requests=sched.requests)
                if adapter.is_done_receiving_chunks(request.request_id):
                    break
                time.sleep(0.002)
            return dict(
                done=adapter.is_done_receiving_chunks(request.request_id),
                scheduled=scheduled,
                request_id=request.request_id,
                external_req_id=request.external_req_id,
                trace_headers=dict(request.trace_headers) if request.trace_headers else None,
                **plugin_state(),
            )
        if op == "free":
            # The stage is done with the request: the generation scheduler
            # frees it, then the adapter forgets it.
            request.status = RequestStatus.FINISHED_STOPPED
            sched._free_request(request)
            adapter.cleanup(request.request_id, request.external_req_id)
            return dict(freed=request.request_id not in sched.requests, **plugin_state())
        return None

    answer_commands(handle, adapter.shutdown, reply_with)


def main() -> None:
    role = sys.argv[1]
    if role == "api":
        # The API server loads vLLM-Omni's plugin group (and vLLM's with it).
        from vllm_omni.plugins import load_omni_general_plugins

        load_omni_general_plugins()
    else:
        # A stage's engine core.
        load_plugins_as_engine_core(0 if role == "producer" else 1)
    if role == "api":
        run_api()
    elif role == "producer":
        run_producer(sys.argv[2], int(sys.argv[3]))
    elif role == "consumer":
        run_consumer(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        raise SystemExit(f"unknown role {role}")


if __name__ == "__main__":
    main()
