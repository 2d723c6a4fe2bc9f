"""Helpers of the ``edgemark.stream_edge`` tests: stage worker processes that
record through unpickled handles, a proxy that sends a handle's records to
them, and stand-ins for the vLLM-Omni request state and orchestrator the
upstream tests used.

A module of its own so that the spawn start method can import the worker
targets by name.
"""

from __future__ import annotations

from typing import Dict, Optional

import _workers
from _workers import CTX  # noqa: F401  (the tests' spawn context)
from edgemark import monotonic_ns
from edgemark import stream_edge
from edgemark.stream_edge import RequestStreamEdgeEvents, StreamEdgeEvent

#: The events a producer stage observes; the consumer observes the others.
PRODUCER_SIDE = (StreamEdgeEvent.PRODUCER_EMIT, StreamEdgeEvent.SEND_COMPLETE)


def stage_worker(conn) -> None:
    """A stage process: receives handles inside messages (unpickling one
    attaches its region by path, once per process) and records through
    them, answering each record with its result or the exception it raised.
    """
    _workers.serve(conn, _command)


def _command(msg: tuple):
    op = msg[0]
    if op == "record":
        _, handle, event, kwargs = msg
        return handle.record(event, **kwargs)
    if op == "record_timed":
        _, handle, event, kwargs = msg
        before = monotonic_ns()
        ok = handle.record(event, **kwargs)
        return (ok, before, monotonic_ns())
    if op == "attached":
        return sorted(stream_edge._attached)
    raise RuntimeError(f"unknown command {op!r}")


class Workers(_workers.Workers):
    """One worker process per stage (``stage_worker``), started with the
    spawn method."""

    def __init__(self, stages=(0, 1, 2)) -> None:
        super().__init__(stage_worker, stages)


class Remote:
    """A handle whose records are made by the stage process that observes
    the event: the handle travels pickled inside the message, as it would
    inside a dispatch message."""

    def __init__(self, workers: Workers, handle) -> None:
        self.workers = workers
        self.handle = handle
        self.key = handle.key

    def record(self, event, **kwargs) -> bool:
        stage = self.key.from_stage if event in PRODUCER_SIDE else self.key.to_stage
        return self.workers[stage].ask("record", self.handle, event, kwargs)


# ---------------------------------------------------------------------------
# Stand-ins for the vLLM-Omni call sites (see docs/vllm-omni.md).


class ClientRequestState:
    """The request state of the orchestrator, with the two methods the
    upstream change added to it; only the import differs."""

    def __init__(self, request_id: str, external_request_id: Optional[str] = None, region=None):
        self.request_id = request_id
        self.external_request_id = external_request_id
        self.stream_edge_events: Optional[RequestStreamEdgeEvents] = None
        self._stream_edge_metrics_closed = False
        self._region = region

    def enable_stream_edge_metrics(self) -> RequestStreamEdgeEvents:
        if self._stream_edge_metrics_closed:
            raise RuntimeError("Request stream-edge metrics have been released")
        if self.stream_edge_events is None:
            self.stream_edge_events = RequestStreamEdgeEvents(region=self._region)
        return self.stream_edge_events

    def release_stream_edge_metrics(self) -> None:
        self._stream_edge_metrics_closed = True
        if self.stream_edge_events is not None:
            self.stream_edge_events.close()


class Orchestrator:
    """The request table and its removal paths; every one of them goes
    through ``_drop_request_state``, the sync ``abort`` included (the path
    the upstream review found skipping the release)."""

    def __init__(self) -> None:
        self.request_states: Dict[str, ClientRequestState] = {}

    def _drop_request_state(self, request_id: str) -> None:
        req_state = self.request_states.get(request_id)
        try:
            if req_state is not None:
                release = getattr(req_state, "release_stream_edge_metrics", None)
                if release is not None:
                    release()
        finally:
            self.request_states.pop(request_id, None)

    def _log_summary_and_cleanup(self, request_id: str, reason: str = "normal") -> None:
        assert reason
        self._drop_request_state(request_id)

    def abort(self, request_id: str) -> None:
        self._drop_request_state(request_id)

    def response_metrics(self, request_id: str) -> dict:
        """The metrics dict of a response, as the response builder fills it."""
        metrics: dict = {}
        req_state = self.request_states[request_id]
        if req_state.stream_edge_events is not None:
            metrics["stream_edge_metrics"] = req_state.stream_edge_events.snapshot()
        return metrics


# ---------------------------------------------------------------------------
# Racing writers.


def race_value(process: int, request: int) -> float:
    """The value process ``process`` records for request ``request``:
    distinct per process, a whole number of microseconds."""
    return request + (process + 1) * 0.125


def race(handles, process: int, go, results) -> None:
    """Records the producer event of every handle once, all processes
    released together; reports which writes won."""
    # Generous: four spawned interpreters start on a busy machine.
    go.wait(300)
    won = [
        h.record(
            StreamEdgeEvent.PRODUCER_EMIT,
            elapsed_ms=race_value(process, r),
            clock_domain="host_monotonic",
            meaningful=True,
            chunk_seq=process,
        )
        for r, h in enumerate(handles)
    ]
    results.put((process, won))
