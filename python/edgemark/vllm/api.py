"""The API server: ``AsyncLLM``, where each request arrives with its trace
headers and gets its internal request ID.

====================================  ==============================================
call site                             what the wrapper does
====================================  ==============================================
``AsyncLLM.__init__``                 creates (or attaches) the region, sized from
                                      the instance's ``max_num_seqs`` and data
                                      parallel ranks; an instance whose KV
                                      connector the plugin does not follow (or
                                      that has none) begins nothing
``AsyncLLM.add_request``              keeps the request's ``traceparent`` for the
                                      call below (vLLM drops trace headers when its
                                      own tracing is off); closes what it began if
                                      the request never reaches the engine
``AsyncLLM._add_request``             with the internal request ID: begins a prefill
                                      request (published under that ID) or a decode
                                      request of its own, or joins a decode request
                                      to the prefill side's (``_recording``); begins
                                      nothing where no engine core of the instance
                                      records on this host, or with no lookup
``OutputProcessor._finish_request``   a request this process began finished here:
                                      its close is queued (``Recording.finished``)
``OutputProcessor.abort_requests``    the requests it aborted (their internal IDs,
                                      what it returns) close
``get_prometheus_registry``           the registry of the server's ``/metrics`` gets
(``serve.instrumentator.metrics``)    the region's families (``edgemark._metrics``)
====================================  ==============================================

A request fanned out with ``n > 1`` reaches the engine without
``_add_request``: its children are not recorded.
"""

from __future__ import annotations

import contextvars
from typing import Any, Callable, List, Optional, Tuple

from .._edgemark import Token
from .._instrument import Target
from .._metrics import REGISTRY_MODULE, wrap_registry
from .._lifecycle import traceparent_in
from ._recording import Recording, kv_params

_ASYNC_LLM = "vllm.v1.engine.async_llm"
_OUTPUT_PROCESSOR = "vllm.v1.engine.output_processor"

#: Where ``trace_headers`` sits among ``add_request``'s positional
#: parameters after ``params``.
_TRACE_HEADERS_AT = 3

#: The arriving request's ``traceparent`` and the tokens begun for it.
_arriving: "contextvars.ContextVar[Optional[Tuple[Optional[str], List[Tuple[str, Token]]]]]" = contextvars.ContextVar(
    "edgemark_vllm_arriving", default=None
)


def wrap_init(orig: Callable, rec: Recording) -> Callable:
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        try:
            rec.start(getattr(self, "vllm_config", None))
        except Exception as e:  # noqa: BLE001 - the server serves without it
            rec.once.debug("w-init", "edgemark: region not created at start-up: %r", e)

    return __init__


def wrap_add_request(orig: Callable, rec: Recording) -> Callable:
    async def add_request(self, request_id, prompt, params, *args, **kwargs):
        reset = state = None
        try:
            headers = args[_TRACE_HEADERS_AT] if len(args) > _TRACE_HEADERS_AT else kwargs.get("trace_headers")
            state = (traceparent_in(headers), [])
            reset = _arriving.set(state)
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-add", "edgemark: a request's trace context not kept: %r", e)
        try:
            return await orig(self, request_id, prompt, params, *args, **kwargs)
        except BaseException:
            if state is not None:
                for rid, token in state[1]:
                    rec.abandon(rid, token)
            raise
        finally:
            if reset is not None:
                _arriving.reset(reset)

    return add_request


def _traceparent(request: Any) -> Optional[str]:
    state = _arriving.get()
    if state is not None and state[0] is not None:
        return state[0]
    return traceparent_in(getattr(request, "trace_headers", None))


def wrap_internal_add_request(orig: Callable, rec: Recording) -> Callable:
    async def _add_request(self, request, *args, **kwargs):
        try:
            rid = request.request_id
            if isinstance(rid, str):
                token = rec.begin(rid, kv_params(request), _traceparent(request))
                state = _arriving.get()
                if token is not None and state is not None:
                    state[1].append((rid, token))
        except Exception as e:  # noqa: BLE001 - recording never fails a request
            rec.once.debug("w-begin", "edgemark: request not begun: %r", e)
        return await orig(self, request, *args, **kwargs)

    return _add_request


def wrap_finish_request(orig: Callable, rec: Recording) -> Callable:
    begun = rec.begun

    def _finish_request(self, req_state, *args, **kwargs):
        if begun:
            try:
                rid = req_state.request_id
                if rid in begun:
                    rec.finished(rid)
            except Exception as e:  # noqa: BLE001 - recording never fails a request
                rec.once.debug("w-finish", "edgemark: a finished request's close not queued: %r", e)
        return orig(self, req_state, *args, **kwargs)

    return _finish_request


def wrap_abort_requests(orig: Callable, rec: Recording) -> Callable:
    begun = rec.begun

    def abort_requests(self, request_ids, internal, *args, **kwargs):
        aborted = orig(self, request_ids, internal, *args, **kwargs)
        if begun and aborted:
            try:
                rec.aborted(aborted)
            except Exception as e:  # noqa: BLE001
                rec.once.debug("w-abort", "edgemark: an aborted request's close not queued: %r", e)
        return aborted

    return abort_requests


TARGETS = (
    Target(_ASYNC_LLM, "AsyncLLM", "__init__", None, wrap_init),
    Target(_ASYNC_LLM, "AsyncLLM", "add_request",
           ("self", "request_id", "prompt", "params", "arrival_time", "lora_request", "tokenization_kwargs",
            "trace_headers"), wrap_add_request, is_async=True),
    Target(_ASYNC_LLM, "AsyncLLM", "_add_request", ("self", "request", "prompt", "parent_req", "index", "queue"),
           wrap_internal_add_request, is_async=True),
    Target(_OUTPUT_PROCESSOR, "OutputProcessor", "_finish_request", ("self", "req_state"), wrap_finish_request,
           part="finish"),
    Target(_OUTPUT_PROCESSOR, "OutputProcessor", "abort_requests", ("self", "request_ids", "internal"),
           wrap_abort_requests, part="finish"),
    # The region's families on the server's own /metrics (`_metrics`).
    Target(REGISTRY_MODULE, None, "get_prometheus_registry", (), wrap_registry, optional=True),
)  # fmt: skip
