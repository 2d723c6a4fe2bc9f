"""The async-chunk transfer adapter: the stage transport of most deploy files.

Under the default model runner with ``async_chunk: true``, each stage's
scheduler builds an ``OmniChunkTransferAdapter``; chunks leave through
``save_async`` (the scheduler hands a step's output over), the adapter's save
thread (``_send_single_request_for_generation``: the stage's processor
builds the payload, then ``connector.put``), and arrive through its receive
thread (``_poll_single_request``: ``connector.get``, then
``_commit_received_chunk`` admits the chunk under the receiver lock).

=================================================  ==========================================
call site                                          records
=================================================  ==========================================
``save_async`` (and ``save_async_batch``, 0.32)    ``producer_first_nonempty_emit`` when the
                                                   step's output for the edge has content,
                                                   with the chunk ID the adapter's next put
                                                   of the request carries
``_send_single_request_for_generation``            ``edge_first_send_complete`` after a put
                                                   that succeeded (the adapter advanced its
                                                   chunk counter, or sent the terminal chunk)
``_commit_received_chunk``                         ``consumer_first_accept`` when it admitted
                                                   (returned ``True``) a chunk with content
                                                   besides its ``meta`` flags
``OmniARScheduler._free_request``,                 the stage freed the request: forgotten in
``OmniGenerationScheduler._free_request``          this process; a host-local request closed
=================================================  ==========================================

The edge is the adapter's own: ``stage -> stage + 1`` on the send side,
``stage - 1 -> stage`` on the receive side (it polls ``stage - 1``'s keys).
The request is vLLM-Omni's external request ID (``request.external_req_id``),
which keys the connector's payloads and the API server's lookup.
"""

from __future__ import annotations

from typing import Any, Callable

from .._instrument import Target
from ._payload import chunk_has_content, has_content, stage, traceparent_of
from ._recording import ACCEPT, EMIT, SEND, Recording

_ADAPTER = "vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter"
_CLS = "OmniChunkTransferAdapter"


def _external_id(request: Any) -> Any:
    rid = getattr(request, "external_req_id", None)
    return rid if rid is not None else getattr(request, "request_id", None)


def _record_emit(rec: Recording, host: Any, output: Any, request: Any, new_token_ids: Any) -> None:
    rid = _external_id(request)
    frm = stage(host.connector.stage_id)
    if not isinstance(rid, str) or frm is None:
        return
    key = (frm, frm + 1, EMIT)
    if rec.is_done(rid, key):
        return
    rec.record(
        rid,
        frm,
        frm + 1,
        EMIT,
        lambda: has_content(output) or has_content(new_token_ids),
        host.put_req_chunk.get(rid, 0),
        lambda: traceparent_of(request),
    )


def wrap_save_async(orig: Callable, rec: Recording) -> Callable:
    requests = rec.requests

    def save_async(self, multimodal_output=None, request=None, *args, **kwargs):
        try:
            # The steady state of a stream, inline: this request's emit on
            # this edge is already recorded (anything unexpected takes the
            # full path below).
            req = requests.get(request.external_req_id)
            if req is not None:
                frm = self.connector.stage_id
                if (frm, frm + 1, EMIT) in req.done:
                    return orig(self, multimodal_output, request, *args, **kwargs)
        except Exception:  # noqa: BLE001
            pass
        try:
            new_token_ids = args[1] if len(args) > 1 else kwargs.get("new_token_ids")
            _record_emit(rec, self, multimodal_output, request, new_token_ids)
        except Exception as e:  # noqa: BLE001 - recording never fails a request
            rec.once.debug("w-emit", "edgemark: producer emit not recorded: %r", e)
        return orig(self, multimodal_output, request, *args, **kwargs)

    return save_async


def wrap_save_async_batch(orig: Callable, rec: Recording) -> Callable:
    def save_async_batch(self, entries, *args, **kwargs):
        try:
            for entry in entries:
                _record_emit(
                    rec, self, entry.get("multimodal_output"), entry.get("request"), entry.get("new_token_ids")
                )
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-emit", "edgemark: producer emit not recorded: %r", e)
        return orig(self, entries, *args, **kwargs)

    return save_async_batch


def _task_has_content(task: dict) -> bool:
    if "payload" in task:
        # Built beforehand by the batch processor (0.32).
        return chunk_has_content(task["payload"])
    return has_content(task.get("multimodal_output")) or has_content(task.get("new_token_ids"))


def wrap_send(orig: Callable, rec: Recording) -> Callable:
    requests = rec.requests

    def _send_single_request_for_generation(self, task, sender_token=None, *args, **kwargs):
        try:
            request = task["request"]
            # The steady state, inline: this edge's send already recorded.
            req = requests.get(request.external_req_id)
            if req is not None:
                frm = self.connector.stage_id
                if (frm, frm + 1, SEND) in req.done:
                    return orig(self, task, sender_token, *args, **kwargs)
        except Exception:  # noqa: BLE001
            pass
        try:
            request = task["request"]
            rid = request.external_req_id
            frm = stage(self.connector.stage_id)
            key = (frm, frm + 1, SEND) if frm is not None else None
            if key is None or rec.is_done(rid, key):
                return orig(self, task, sender_token, *args, **kwargs)
            before = self.put_req_chunk.get(rid, 0)
            terminal_before = getattr(sender_token, "terminal_sent", False)
        except Exception:  # noqa: BLE001 - not a task the wrapper knows
            return orig(self, task, sender_token, *args, **kwargs)
        result = orig(self, task, sender_token, *args, **kwargs)
        try:
            after = self.put_req_chunk.get(rid)
            # A put that succeeded advanced the chunk counter, unless it was
            # the terminal chunk, whose cleanup removed the counter: then the
            # sender generation says it was sent.
            sent = (after is not None and after > before) or (
                not terminal_before and getattr(sender_token, "terminal_sent", False) is True
            )
            if sent and isinstance(rid, str):
                rec.record(rid, frm, frm + 1, SEND, lambda: _task_has_content(task), None, lambda: traceparent_of(request))
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-send", "edgemark: send complete not recorded: %r", e)
        return result

    return _send_single_request_for_generation


def wrap_commit(orig: Callable, rec: Recording) -> Callable:
    requests = rec.requests

    def _commit_received_chunk(self, request, result, *args, **kwargs):
        admitted = orig(self, request, result, *args, **kwargs)
        if admitted is True:
            try:
                # The steady state, inline: this edge's accept already recorded.
                req = requests.get(request.external_req_id)
                if req is not None:
                    to = kwargs["stage_id"]
                    if (to - 1, to, ACCEPT) in req.done:
                        return admitted
            except Exception:  # noqa: BLE001
                pass
            try:
                rid = _external_id(request)
                to = stage(kwargs.get("stage_id"))
                if isinstance(rid, str) and to:
                    key = (to - 1, to, ACCEPT)
                    if not rec.is_done(rid, key):
                        rec.record(
                            rid,
                            to - 1,
                            to,
                            ACCEPT,
                            lambda: chunk_has_content(result[0]),
                            None,
                            lambda: traceparent_of(request),
                        )
            except Exception as e:  # noqa: BLE001
                rec.once.debug("w-accept", "edgemark: consumer accept not recorded: %r", e)
        return admitted

    return _commit_received_chunk


def wrap_free(orig: Callable, rec: Recording) -> Callable:
    def _free_request(self, request, *args, **kwargs):
        try:
            return orig(self, request, *args, **kwargs)
        finally:
            try:
                rid = _external_id(request)
                if isinstance(rid, str):
                    rec.stage_freed(rid)
            except Exception as e:  # noqa: BLE001
                rec.once.debug("w-free", "edgemark: a freed request not followed: %r", e)

    return _free_request


TARGETS = (
    Target(_ADAPTER, _CLS, "save_async",
           ("self", "multimodal_output", "request", "is_segment_finished", "new_token_ids"), wrap_save_async),
    Target(_ADAPTER, _CLS, "_send_single_request_for_generation", ("self", "task", "sender_token"), wrap_send),
    Target(_ADAPTER, _CLS, "_commit_received_chunk", ("self", "request", "result"), wrap_commit),
    # Of 0.32 only: wrapped where it exists.
    Target(_ADAPTER, _CLS, "save_async_batch", ("self", "entries"), wrap_save_async_batch, optional=True),
    Target("vllm_omni.core.sched.omni_ar_scheduler", "OmniARScheduler", "_free_request",
           ("self", "request"), wrap_free),
    Target("vllm_omni.core.sched.omni_generation_scheduler", "OmniGenerationScheduler", "_free_request",
           ("self", "request"), wrap_free),
)  # fmt: skip
