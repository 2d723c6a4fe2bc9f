"""The model runner's connector mixin: the transport of the v2 native data
plane (the Qwen3-TTS deploy files with ``model_runner: v2``) and of
full-payload mode.

=====================================  ==============================================================
call site                              records
=====================================  ==============================================================
``_enqueue_chunk_payload``             producer stage: ``producer_first_nonempty_emit`` (before the
                                       payload is queued), with the chunk sequence; meaningful by
                                       vLLM-Omni's ``_payload_is_consumable``
``send_full_payload_outputs``          producer stage, full-payload mode: the same event, for each
                                       output with content
``_send_single_request``               producer's send thread: ``edge_first_send_complete`` after
                                       ``connector.put`` succeeded (a failed put records nothing)
``_poll_single_request``, with what    consumer's receive thread: ``consumer_first_accept`` when the
``_recv_async_chunk_result`` /         poll admitted the payload (returned ``True``)
``_recv_full_payload_result`` return
``cleanup_finished_request``           every stage: the runner freed the request
=====================================  ==============================================================

The receive helpers are wrapped on the class: while a poll that has not
recorded its accept runs, they hand their result to that thread's poll
wrapper. An instance's own override of a helper is called as it always is
(and its result is then not seen).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from .._instrument import Target
from ._payload import has_content, mixin_payload_meaningful, put_key_request, stage
from ._recording import ACCEPT, EMIT, SEND, Recording

_TRANSPORT = "vllm_omni.distributed.omni_connectors.model_runner.omni_connector_payload_transport"
_MIXIN = "_OmniConnectorPayloadTransportMixin"
_RECV_PARAMS = ("self", "connector", "from_stage", "to_stage", "connector_get_key", "metadata")

class _Received(threading.local):
    """Per receive thread: where the receive helpers put their results
    while a recording poll runs (``sink``), else ``None``. The class
    attribute is the default: a missing attribute of a ``threading.local``
    would cost an exception per lookup (about 0.8 us)."""

    sink: Optional[list] = None


_received = _Received()


def _external_id(host: Any, request: Any) -> Any:
    # As vLLM-Omni's `_resolve_external_req_id` resolves it: its mapping,
    # the request's, its own ID.
    raw = getattr(request, "request_id", None) or getattr(request, "req_id", None)
    rid = host._request_ids_mapping.get(raw) if raw is not None else None
    if rid is None:
        rid = getattr(request, "external_req_id", None)
        if rid is None:
            rid = raw
    return rid


def wrap_enqueue(orig: Callable, rec: Recording) -> Callable:
    requests = rec.requests

    def _enqueue_chunk_payload(self, request, payload_data, *, wait_for_delivery=False):
        try:
            # The steady state, inline: the request's ID as `_external_id`
            # resolves it (an attribute missing takes the full path), its
            # emit on this edge already recorded.
            raw = request.request_id
            if raw:
                rid = self._request_ids_mapping.get(raw)
                if rid is None:
                    rid = request.external_req_id
                    if rid is None:
                        rid = raw
                req = requests.get(rid)
                if req is not None and (self._stage_id, self._next_stage_id, EMIT) in req.done:
                    return orig(self, request, payload_data, wait_for_delivery=wait_for_delivery)
        except Exception:  # noqa: BLE001
            pass
        try:
            rid = _external_id(self, request)
            frm, to = stage(self._stage_id), stage(self._next_stage_id)
            if isinstance(rid, str) and frm is not None and to is not None and not rec.is_done(rid, (frm, to, EMIT)):
                rec.record(
                    rid,
                    frm,
                    to,
                    EMIT,
                    lambda: mixin_payload_meaningful(self, payload_data),
                    self._put_req_chunk.get(rid, 0),
                )
        except Exception as e:  # noqa: BLE001 - recording never fails a request
            rec.once.debug("w-emit", "edgemark: producer emit not recorded: %r", e)
        return orig(self, request, payload_data, wait_for_delivery=wait_for_delivery)

    return _enqueue_chunk_payload


def wrap_send_full(orig: Callable, rec: Recording) -> Callable:
    def send_full_payload_outputs(self, scheduler_output, outputs, *args, **kwargs):
        try:
            if self._omni_connector is not None and isinstance(outputs, dict):
                frm, to = stage(self._stage_id), stage(self._next_stage_id)
                for req_id, value in outputs.items():
                    raw, request = value if isinstance(value, tuple) and len(value) == 2 else (value, None)
                    rid = self._resolve_external_req_id(request, req_id)
                    if isinstance(rid, str) and frm is not None and to is not None:
                        rec.record(
                            rid, frm, to, EMIT, lambda raw=raw: has_content(raw), self._put_req_chunk.get(req_id, 0)
                        )
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-full", "edgemark: producer emit not recorded: %r", e)
        return orig(self, scheduler_output, outputs, *args, **kwargs)

    return send_full_payload_outputs


def wrap_send(orig: Callable, rec: Recording) -> Callable:
    requests = rec.requests

    def _send_single_request(self, task):
        ok = orig(self, task)
        if ok is not True:
            return ok
        try:
            # The steady state, inline: the request of the put key
            # (``<external id>_<stage>_<chunk>``), its send on this edge
            # already recorded.
            parts = task["put_key"].rsplit("_", 2)
            if len(parts) == 3:
                req = requests.get(parts[0])
                if req is not None and (task["stage_id"], task["next_stage_id"], SEND) in req.done:
                    return ok
        except Exception:  # noqa: BLE001
            pass
        try:
            rid = put_key_request(task.get("put_key")) or task.get("request_id")
            frm, to = stage(task.get("stage_id")), stage(task.get("next_stage_id"))
            if isinstance(rid, str) and frm is not None and to is not None and not rec.is_done(rid, (frm, to, SEND)):
                if self._omni_connector is not None:
                    data = task.get("data")
                    rec.record(rid, frm, to, SEND, lambda: mixin_payload_meaningful(self, data))
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-send", "edgemark: send complete not recorded: %r", e)
        return ok

    return _send_single_request


def wrap_recv(orig: Callable, rec: Recording) -> Callable:
    def _recv(self, connector, from_stage, to_stage, connector_get_key, *args, **kwargs):
        result = orig(self, connector, from_stage, to_stage, connector_get_key, *args, **kwargs)
        sink = _received.sink
        if sink is not None:
            sink.append((from_stage, to_stage, result))
        return result

    return _recv


def wrap_poll(orig: Callable, rec: Recording) -> Callable:
    requests = rec.requests

    def _poll_single_request(self, req_id, *, publish_ready=True):
        try:
            # The steady state, inline: this edge's accept already recorded.
            req = requests.get(self._request_ids_mapping.get(req_id, req_id))
            if req is not None:
                to = self._stage_id
                if (to - 1, to, ACCEPT) in req.done:
                    return orig(self, req_id, publish_ready=publish_ready)
        except Exception:  # noqa: BLE001
            pass
        try:
            to = stage(self._stage_id)
            rid = self._request_ids_mapping.get(req_id, req_id)
            if to is None or rec.is_done(rid, (to - 1, to, ACCEPT)):
                return orig(self, req_id, publish_ready=publish_ready)
        except Exception:  # noqa: BLE001 - then take the recording path
            pass
        sink = []  # the list `_received.sink` is declared as
        outer = _received.sink
        _received.sink = sink
        try:
            admitted = orig(self, req_id, publish_ready=publish_ready)
        finally:
            _received.sink = outer
        try:
            if admitted is True and sink and sink[-1][2]:
                frm, to, (payload, _size) = stage(sink[-1][0]), stage(sink[-1][1]), sink[-1][2]
                if frm is not None and to is not None:
                    rid = self._request_ids_mapping.get(req_id, req_id)
                    if self._async_chunk:
                        meaningful = lambda: mixin_payload_meaningful(self, payload)  # noqa: E731
                    else:
                        meaningful = lambda: has_content(payload)  # noqa: E731
                    rec.record(rid, frm, to, ACCEPT, meaningful)
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-accept", "edgemark: consumer accept not recorded: %r", e)
        return admitted

    return _poll_single_request


def wrap_cleanup(orig: Callable, rec: Recording) -> Callable:
    def cleanup_finished_request(self, req_id):
        try:
            # The request is done in this stage: a later request under the
            # same ID is another instance, looked up afresh.
            for rid in {req_id, self._request_ids_mapping.get(req_id, req_id)}:
                rec.stage_freed(rid)
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-cleanup", "edgemark: stage cleanup not followed: %r", e)
        return orig(self, req_id)

    return cleanup_finished_request


TARGETS = (
    Target(_TRANSPORT, _MIXIN, "_enqueue_chunk_payload",
           ("self", "request", "payload_data", "wait_for_delivery"), wrap_enqueue),
    Target(_TRANSPORT, _MIXIN, "send_full_payload_outputs", ("self", "scheduler_output", "outputs"), wrap_send_full),
    Target(_TRANSPORT, _MIXIN, "_send_single_request", ("self", "task"), wrap_send),
    Target(_TRANSPORT, _MIXIN, "_recv_async_chunk_result", _RECV_PARAMS, wrap_recv),
    Target(_TRANSPORT, _MIXIN, "_recv_full_payload_result", _RECV_PARAMS, wrap_recv),
    Target(_TRANSPORT, _MIXIN, "_poll_single_request", ("self", "req_id", "publish_ready"), wrap_poll),
    Target("vllm_omni.distributed.omni_connectors.model_runner.omni_connector_runtime",
           "_OmniConnectorRuntimeMixin", "cleanup_finished_request", ("self", "req_id"), wrap_cleanup),
)  # fmt: skip
