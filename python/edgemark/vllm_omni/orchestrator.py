"""The API server: the orchestrator, the request state, the engine's
requests to each stage, the response, and the entry points' cleanup.

=====================================  =====================================================
call site                              what the wrapper does
=====================================  =====================================================
``OrchestratorBase.__init__``          creates this host's region, sized from the stages;
                                       if it cannot (``/dev/shm`` too small, say), one
                                       warning and every call site is put back
``ClientRequestState.__init__``        begins the request and publishes its token under
                                       the request ID
``AsyncOmniEngine.                     stage 0's engine request: carries the request's
_build_add_request_message``           ``traceparent`` in ``trace_headers``; a
                                       ``traceparent`` already there becomes the request's
                                       parent
``build_engine_core_request_from_``    every later stage's engine request (the function,
``tokens``                             looked up by name in each module that uses it):
                                       the same ``traceparent``
``OrchestratorBase._route_output``     ``consumer_first_nonempty_output`` of the edge into
                                       the stage that produced a non-empty output
``OrchestratorBase._forward_to_next_`` emit and send complete of a hand-off the
``stage_unguarded``                    orchestrator makes itself (first write wins)
``OmniBase._process_single_result``    puts the snapshot into the response's metrics
``OmniBase._log_summary_and_cleanup``, closes the request; the final snapshot is left on
``Omni.abort``                         the request state as ``stream_edge_metrics``
``get_prometheus_registry``            the registry of the server's ``/metrics`` gets the
(vLLM's ``serve.instrumentator``)      region's families (``edgemark._metrics``)
=====================================  =====================================================
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Callable, Dict, Optional

from .._instrument import Target
from .._metrics import REGISTRY_MODULE, wrap_registry
from ._payload import output_has_content, stage, traceparent_in, traceparent_of
from ._recording import EMIT, OUTPUT, SEND, STAGES, Recording, edges, slots_for

_ORCH = "vllm_omni.engine.orchestrator"


def wrap_orchestrator_init(orig: Callable, rec: Recording) -> Callable:
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        try:
            pools = list(getattr(self, "stage_pools", None) or ())
            rec.ensure_owner(edges(len(pools) or STAGES), slots_for(pools, rec.once))
        except Exception as e:  # noqa: BLE001 - the server serves without it
            rec.once.debug("w-init", "edgemark: region not created at start-up: %r", e)

    return __init__


def _close_by_finalizer(rec: Recording, request_id: str, token: Any, pid: int) -> None:
    # Queued, never closed here: the garbage collector runs a finalizer in
    # whatever thread allocates, possibly inside a section that holds the
    # owner's lock.
    if os.getpid() == pid:
        rec.close_later(request_id, token)


def wrap_state_init(orig: Callable, rec: Recording) -> Callable:
    def __init__(self, request_id, *args, **kwargs):
        orig(self, request_id, *args, **kwargs)
        try:
            if isinstance(request_id, str):
                token = rec.begin(request_id)
                if token is not None:
                    # A state dropped without cleanup still frees its slot.
                    weakref.finalize(self, _close_by_finalizer, rec, request_id, token, os.getpid())
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-begin", "edgemark: request not begun: %r", e)

    return __init__


def _with_traceparent(headers: Any, traceparent: Optional[str]) -> Any:
    """``headers`` with ``traceparent`` set (a new mapping; the caller's is
    never changed); ``headers`` itself when there is nothing to set."""
    if traceparent is None:
        return headers
    merged: Dict[str, str] = {
        k: v for k, v in (dict(headers) if headers else {}).items() if not (isinstance(k, str) and k.lower() == "traceparent")
    }
    merged["traceparent"] = traceparent
    return merged


#: Where ``trace_headers`` sits among ``_build_add_request_message``'s
#: positional parameters (after ``self``).
_TRACE_HEADERS_AT = 9


def wrap_add_request_message(orig: Callable, rec: Recording) -> Callable:
    def _build_add_request_message(self, request_id, *args, **kwargs):
        try:
            if rec.owner is not None and isinstance(request_id, str):
                positional = len(args) > _TRACE_HEADERS_AT
                headers = args[_TRACE_HEADERS_AT] if positional else kwargs.get("trace_headers")
                incoming = traceparent_in(headers)
                if incoming is not None:
                    rec.reparent(request_id, incoming)
                merged = _with_traceparent(headers, rec.traceparent(request_id))
                if positional:
                    args = (*args[:_TRACE_HEADERS_AT], merged, *args[_TRACE_HEADERS_AT + 1 :])
                else:
                    kwargs["trace_headers"] = merged
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-trace", "edgemark: stage 0's request carries no trace context: %r", e)
        return orig(self, request_id, *args, **kwargs)

    return _build_add_request_message


def wrap_build_request(orig: Callable, rec: Recording) -> Callable:
    def build_engine_core_request_from_tokens(request_id, *args, **kwargs):
        request = orig(request_id, *args, **kwargs)
        try:
            if rec.owner is not None and isinstance(request_id, str) and hasattr(request, "trace_headers"):
                headers = request.trace_headers
                if traceparent_of(request) is None:
                    request.trace_headers = _with_traceparent(headers, rec.traceparent(request_id))
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-trace", "edgemark: a stage's request carries no trace context: %r", e)
        return request

    return build_engine_core_request_from_tokens


def wrap_route(orig: Callable, rec: Recording) -> Callable:
    async def _route_output(self, stage_id, replica_id, output, req_state, stage_metrics, *args, **kwargs):
        try:
            s = stage(stage_id)
            if s:
                rid = getattr(output, "request_id", None)
                if isinstance(rid, str):
                    rec.record(rid, s - 1, s, OUTPUT, lambda: output_has_content(output))
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-output", "edgemark: consumer output not recorded: %r", e)
        return await orig(self, stage_id, replica_id, output, req_state, stage_metrics, *args, **kwargs)

    return _route_output


def wrap_forward(orig: Callable, rec: Recording) -> Callable:
    async def _forward_to_next_stage_unguarded(self, req_id, src_stage_id, output, req_state, *args, **kwargs):
        edge = submitted = None
        try:
            s = stage(src_stage_id)
            if s is not None and isinstance(req_id, str):
                edge = (s, s + 1)
                submitted = req_state.stage_submit_ts.get(s + 1)
                rec.record(req_id, s, s + 1, EMIT, lambda: output_has_content(output))
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-fwd", "edgemark: hand-off not recorded: %r", e)
        result = await orig(self, req_id, src_stage_id, output, req_state, *args, **kwargs)
        try:
            # vLLM-Omni stamps the next stage's submission when it succeeded;
            # a hand-off that failed (a dead stage) returns without one.
            after = req_state.stage_submit_ts.get(edge[1]) if edge is not None else None
            if after is not None and after != submitted:
                rec.record(req_id, edge[0], edge[1], SEND, lambda: output_has_content(output))
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-fwd", "edgemark: hand-off not recorded: %r", e)
        return result

    return _forward_to_next_stage_unguarded


def _close(rec: Recording, state: Any, request_id: Any) -> None:
    if state is None or rec.owner is None or not isinstance(request_id, str):
        return
    if request_id not in rec.owner.tokens:
        return
    # The plugin's one output on vLLM-Omni's own object: the upstream
    # recorder's field, for code that read the final snapshot there.
    state.stream_edge_metrics = rec.close(request_id)


def wrap_result(orig: Callable, rec: Recording) -> Callable:
    def _process_single_result(self, result, *args, **kwargs):
        out = orig(self, result, *args, **kwargs)
        try:
            metrics = getattr(out, "metrics", None)
            owner = rec.owner
            if isinstance(metrics, dict) and owner is not None:
                token = owner.tokens.get(getattr(result, "request_id", None))
                if token is not None:
                    metrics["stream_edge_metrics"] = owner.region.snapshot(token)
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-result", "edgemark: no stream_edge_metrics in a response: %r", e)
        return out

    return _process_single_result


def wrap_cleanup(orig: Callable, rec: Recording) -> Callable:
    def _log_summary_and_cleanup(self, request_id, *args, **kwargs):
        try:
            _close(rec, self.request_states.get(request_id), request_id)
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-close", "edgemark: close failed: %r", e)
        return orig(self, request_id, *args, **kwargs)

    return _log_summary_and_cleanup


def wrap_abort(orig: Callable, rec: Recording) -> Callable:
    def abort(self, request_id, *args, **kwargs):
        try:
            ids = [request_id] if isinstance(request_id, str) else list(request_id)
            for rid in ids:
                _close(rec, self.request_states.get(rid), rid)
            request_id = ids if not isinstance(request_id, str) else request_id
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-abort", "edgemark: close on abort failed: %r", e)
        return orig(self, request_id, *args, **kwargs)

    return abort


_BUILD_PARAMS = ("request_id", "prompt", "params")

TARGETS = (
    Target(_ORCH, "OrchestratorBase", "__init__", None, wrap_orchestrator_init),
    Target(_ORCH, "OrchestratorBase", "_route_output",
           ("self", "stage_id", "replica_id", "output", "req_state", "stage_metrics"), wrap_route, True),
    Target(_ORCH, "OrchestratorBase", "_forward_to_next_stage_unguarded",
           ("self", "req_id", "src_stage_id", "output", "req_state"), wrap_forward, True),
    Target(_ORCH, None, "build_engine_core_request_from_tokens", _BUILD_PARAMS, wrap_build_request),
    Target("vllm_omni.engine.duplex_orchestrator", None, "build_engine_core_request_from_tokens", _BUILD_PARAMS,
           wrap_build_request),
    Target("vllm_omni.engine.async_omni_engine", "AsyncOmniEngine", "_build_add_request_message",
           ("self", "request_id", "prompt", "prompt_text", "sampling_params_list", "final_stage_id",
            "final_output_stage_ids", "arrival_time", "lora_request", "tokenization_kwargs", "trace_headers"),
           wrap_add_request_message),
    Target("vllm_omni.entrypoints.client_request_state", "ClientRequestState", "__init__",
           ("self", "request_id", "external_request_id", "queue", "final_stage_id"), wrap_state_init),
    Target("vllm_omni.entrypoints.omni_base", "OmniBase", "_process_single_result",
           ("self", "result", "stage_id", "metrics"), wrap_result),
    Target("vllm_omni.entrypoints.omni_base", "OmniBase", "_log_summary_and_cleanup",
           ("self", "request_id", "reason"), wrap_cleanup),
    Target("vllm_omni.entrypoints.omni", "Omni", "abort", ("self", "request_id"), wrap_abort),
    # The region's families on the server's own /metrics (`_metrics`).
    Target(REGISTRY_MODULE, None, "get_prometheus_registry", (), wrap_registry, optional=True),
)  # fmt: skip
