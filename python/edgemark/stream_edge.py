"""A drop-in for vLLM-Omni's ``vllm_omni.metrics.stream_edge``, recording
into an edgemark region.

Adopting it is one import::

    # from vllm_omni.metrics.stream_edge import RequestStreamEdgeEvents, StreamEdgeEvent, StreamEdgeKey
    from edgemark.stream_edge import RequestStreamEdgeEvents, StreamEdgeEvent, StreamEdgeKey

The names, call shapes and results are the upstream module's: one
``RequestStreamEdgeEvents`` per request, ``start_segment(key)`` returns a
``StreamEdgeRecorder``, ``recorder.record(event, *, elapsed_ms,
clock_domain, meaningful, chunk_seq=None)`` returns ``True`` for the first
write of an event and ``False`` for anything it does not record,
``snapshot()`` is the ``metrics["stream_edge_metrics"]`` dict and ``close()``
is the one call of every cleanup path.

What edgemark adds: a ``StreamEdgeRecorder`` pickles to a couple of hundred
bytes (region path, token, key) and records from any process on the host
that unpickles it, straight into the shared region, so the orchestrator
sends it to a stage worker inside the dispatch message it already sends and
no observation travels back. ``elapsed_ms`` may be left out: the record then
reads the region's shared clock (the time since the request began). Where it
differs from upstream, and why: docs/vllm-omni.md.

``RequestStreamEdgeEvents()`` records into a process-wide default region:
the region file named by the environment variable ``EDGEMARK_REGION`` if
set, else one this process creates on first use under
``edgemark.default_dir()`` (owner-only) with every directed edge among
stages ``0..DEFAULT_STAGES-1``. That file is removed when this process
exits normally; a process that is killed leaves it behind, and
``edgemark reclaim --remove-if-abandoned PATH`` removes it once its creator
is gone (docs/vllm-omni.md). ``RequestStreamEdgeEvents(region=r)``
records into ``r``.
"""

from __future__ import annotations

import atexit
import enum
import logging
import os
import secrets
import threading
import weakref
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple, TypedDict

from . import elapsed_between as _elapsed_between
from ._edgemark import Region, StreamEdgeRecorder, default_dir

__all__ = [
    "DEFAULT_SEGMENTS",
    "DEFAULT_SLOTS",
    "DEFAULT_STAGES",
    "ENV_REGION",
    "RequestStreamEdgeEvents",
    "StreamEdgeEvent",
    "StreamEdgeKey",
    "StreamEdgeRecorder",
    "StreamEdgeSnapshot",
    "default_region",
    "set_default_region",
]

_log = logging.getLogger("edgemark.stream_edge")

#: The environment variable naming the region file the default region
#: attaches to.
ENV_REGION = "EDGEMARK_REGION"
#: Stages of the default region a process creates: every directed edge among
#: stages ``0..DEFAULT_STAGES-1`` is declared (8 stages: 56 edges of the 64 a
#: region can declare), so any pipeline of up to eight stages, forward or
#: backward edges, records without declaring anything.
DEFAULT_STAGES = 8
#: Requests the default region holds open at once; a request that begins
#: when all are taken runs unrecorded (its records return ``False``).
DEFAULT_SLOTS = 1024
#: The newest segments the default region keeps per edge of a request.
DEFAULT_SEGMENTS = 4


class StreamEdgeSnapshot(TypedDict):
    """One edge segment of a snapshot, under its key ``"from->to:segment"``."""

    from_stage: int
    to_stage: int
    segment_index: int
    first_chunk_seq: Optional[int]
    clock_domains: Dict[str, str]
    producer_first_nonempty_emit_ms: Optional[float]
    edge_first_send_complete_ms: Optional[float]
    consumer_first_accept_ms: Optional[float]
    consumer_first_nonempty_output_ms: Optional[float]


class StreamEdgeEvent(str, enum.Enum):
    """The four first events of a stream edge; the values are their names in
    snapshots (and the region's schema)."""

    #: Producer stage: the first meaningful payload for the edge is ready.
    PRODUCER_EMIT = "producer_first_nonempty_emit"
    #: Producer side, connector send thread: the put of the first payload
    #: committed.
    SEND_COMPLETE = "edge_first_send_complete"
    #: Consumer stage, receive thread: the first payload was decoded and
    #: admitted.
    CONSUMER_ACCEPT = "consumer_first_accept"
    #: Consumer stage: its first non-empty output.
    CONSUMER_OUTPUT = "consumer_first_nonempty_output"


@dataclass(frozen=True)
class StreamEdgeKey:
    """One segment of one directed stage edge: ``from_stage -> to_stage``,
    segment ``segment_index`` (0 unless the edge's owner starts another)."""

    from_stage: int
    to_stage: int
    segment_index: int = 0

    def __post_init__(self) -> None:
        if (
            min(self.from_stage, self.to_stage, self.segment_index) < 0
            or self.from_stage == self.to_stage
        ):
            raise ValueError(
                "A stream edge requires distinct non-negative stages and a non-negative segment"
            )


# ---------------------------------------------------------------------------
# The process-wide default region and the regions handles attach to.

_lock = threading.Lock()
_default: Optional[Region] = None
#: Regions attached by path in this process (by unpickled handles), and the
#: default region under its path, so that a handle attaches once per process.
_attached: Dict[str, Region] = {}
_warned = False


def _all_pairs(stages: int):
    return [(a, b) for a in range(stages) for b in range(stages) if a != b]


def _create_default() -> Region:
    path = os.environ.get(ENV_REGION)
    if path:
        return Region.attach(path)
    path = os.path.join(
        default_dir(), f"edgemark-stream-edge-{os.getpid()}-{secrets.token_hex(4)}.region"
    )
    region = Region.create(
        path, edges=_all_pairs(DEFAULT_STAGES), slots=DEFAULT_SLOTS, segments=DEFAULT_SEGMENTS
    )
    atexit.register(_remove_file, path, os.getpid())
    return region


def _remove_file(path: str, creator: int) -> None:
    # A child forked from the creator inherits this hook: only the creator
    # removes the file. Attached processes keep their mapping.
    if os.getpid() == creator:
        try:
            os.unlink(path)
        except OSError:
            pass


def default_region() -> Region:
    """The process-wide region ``RequestStreamEdgeEvents()`` records into:
    attached from ``$EDGEMARK_REGION`` if set, else created on first use
    (see the module's documentation) or set by ``set_default_region``.

    Raises what ``Region.attach`` or ``Region.create`` raise; call it at
    start-up to fail early. ``RequestStreamEdgeEvents()`` itself never
    raises for it: it logs one warning and runs unrecorded.
    """
    global _default
    region = _default
    if region is not None:
        return region
    with _lock:
        if _default is None:
            region = _create_default()
            if region.path is not None:
                _attached.setdefault(region.path, region)
            _default = region
        return _default


def set_default_region(region: Optional[Region]) -> None:
    """Makes ``region`` the default region (``None``: back to the
    environment or a new one on next use), for a deployment that creates
    its own with the edges and capacity it needs."""
    global _default
    with _lock:
        _default = region
        if region is not None and region.path is not None:
            _attached.setdefault(region.path, region)


def _default_or_disabled() -> Region:
    global _warned
    try:
        return default_region()
    except (OSError, ValueError) as e:
        # Telemetry never fails a request: record nothing, say so once.
        if not _warned:
            _warned = True
            _log.warning("edgemark: no default region, stream-edge metrics are off: %s", e)
        return Region.disabled()


def _attach(path: str) -> Optional[Region]:
    region = _attached.get(path)
    if region is not None:
        return region
    with _lock:
        region = _attached.get(path)
        if region is None:
            try:
                # A region of another boot or time namespace still takes
                # values measured elsewhere; shared-clock records return
                # False there.
                region = Region.attach(path, allow_foreign_clock=True)
            except (OSError, ValueError) as e:
                _log.debug("edgemark: cannot attach %s, the handle records nothing: %s", path, e)
                return None
            _attached[path] = region
        return region


def _restore(
    path: Optional[str],
    token: Optional[str],
    from_stage: int,
    to_stage: int,
    segment_index: int,
) -> StreamEdgeRecorder:
    """Unpickles a ``StreamEdgeRecorder``: attaches the region by path (once
    per process) and resolves the handle. A region that cannot be attached
    gives a handle that records nothing (fail open)."""
    key = StreamEdgeKey(from_stage, to_stage, segment_index)
    region = _attach(path) if path is not None and token is not None else None
    return StreamEdgeRecorder(region, token, key)


_U32 = 1 << 32


def _close_if_mine(region: Region, token, pid: int):
    # A forked child holds copies of its parent's requests; only the process
    # that began a request closes it when the request is dropped unclosed.
    if os.getpid() != pid:
        return {}
    for _ in range(3):
        final = region.close(token)
        if final is not None:
            return final
    return {}


def _traceparent(headers: Optional[Mapping[str, str]]) -> Optional[str]:
    """The ``traceparent`` value of a header mapping (names compared without
    case), or ``None``."""
    if not headers:
        return None
    try:
        for name, value in headers.items():
            if isinstance(name, str) and name.lower() == "traceparent" and isinstance(value, str):
                return value
    except Exception:  # a caller's odd mapping must not fail the request
        return None
    return None


# ---------------------------------------------------------------------------
# One request's events.


class RequestStreamEdgeEvents:
    """The first-event state of one request instance, in an edgemark region.

    Created where the request's state is created (``ClientRequestState``):
    it begins a request in the region (``region``, or the process-wide
    default region). ``start_segment(key)`` gives the handle stages record
    through, in this process or, pickled, in any other; ``snapshot()``
    reads what they recorded; ``close()`` ends the request and is what every
    cleanup path calls. A request that finds the region full (or disabled)
    runs unrecorded: its handles return ``False``, its snapshots are ``{}``.

    A request that is dropped without ``close`` is closed when it is
    garbage-collected.
    """

    __slots__ = ("_region", "_token", "_segments", "_closed", "_finalizer", "__weakref__")

    def __init__(
        self,
        region: Optional[Region] = None,
        trace_headers: Optional[Mapping[str, str]] = None,
    ) -> None:
        if region is None:
            region = _default_or_disabled()
        self._region = region
        # The caller's W3C trace context, where it has one (vLLM's
        # ``trace_headers``): the request's spans join that trace. A
        # malformed one never fails the request: it is ignored and counted.
        traceparent = _traceparent(trace_headers)
        self._token = region.begin(traceparent, strict=False)
        self._segments: Dict[Tuple[int, int], int] = {}
        self._closed = False
        self._finalizer = (
            weakref.finalize(self, _close_if_mine, region, self._token, os.getpid())
            if self._token is not None
            else None
        )

    @property
    def traceparent(self) -> Optional[str]:
        """The W3C ``traceparent`` to hand the request's part on another host
        (with its token): the request's trace, its own span as the parent.
        ``None`` for an unrecorded or closed request."""
        if self._token is None or self._closed:
            return None
        return self._region.traceparent(self._token)

    @property
    def region(self) -> Region:
        """The region the request records into."""
        return self._region

    @property
    def token(self):
        """The request's ``edgemark.Token``; ``None`` when it runs
        unrecorded."""
        return self._token

    def start_segment(self, key: StreamEdgeKey) -> StreamEdgeRecorder:
        """The handle of ``key``'s edge segment; a newer segment index than
        the edge's current one starts that segment (older segments' handles
        record nothing from then on), the current one gives another handle
        on it.

        Raises ``RuntimeError`` after ``close`` and ``ValueError`` for a
        segment older than the edge's current one (retired).
        """
        if self._closed:
            raise RuntimeError("Request stream-edge metrics have been released")
        if not isinstance(key, StreamEdgeKey):
            raise TypeError(f"start_segment takes a StreamEdgeKey, not {type(key).__name__}")
        edge = (key.from_stage, key.to_stage)
        current = self._segments.get(edge)
        seg = key.segment_index
        if current is not None and seg < current:
            raise ValueError(
                f"Cannot reopen a retired stream-edge segment: {key} is older than segment {current}"
            )
        token = self._token
        # Segment 0 is every edge's first segment in the region; a newer one
        # is started there, once. The edge's current segment here follows
        # the region's: a segment the region did not start (a stage or
        # segment beyond what it holds, an undeclared edge, a closed request
        # or a region this process can no longer write) retires nothing,
        # and its handle records nothing (its records say False).
        if seg > (current or 0):
            if token is None:
                # Unrecorded: nothing to keep consistent with.
                self._segments[edge] = seg
            elif max(key.from_stage, key.to_stage, seg) < _U32 and self._region.start_segment(
                token, key.from_stage, key.to_stage, seg
            ):
                self._segments[edge] = seg
            else:
                _log.debug("edgemark: segment %s was not started; its handle records nothing", key)
                return StreamEdgeRecorder(None, None, key)
        else:
            self._segments[edge] = seg
        return StreamEdgeRecorder(self._region, token, key)

    def snapshot(self) -> Dict[str, StreamEdgeSnapshot]:
        """A detached snapshot, ``metrics["stream_edge_metrics"]``: from
        ``"from->to:segment"`` to a ``StreamEdgeSnapshot`` for every edge
        segment with an event; ``{}`` after ``close``."""
        if self._closed or self._token is None:
            return {}
        return self._region.snapshot(self._token)  # type: ignore[return-value]

    def elapsed_between(
        self, key: StreamEdgeKey, start: StreamEdgeEvent, end: StreamEdgeEvent
    ) -> Optional[float]:
        """Milliseconds from ``start`` to ``end`` on ``key``'s edge segment;
        ``None`` unless both were recorded in the same clock domain and the
        end is not before the start."""
        seg = self.snapshot().get(f"{key.from_stage}->{key.to_stage}:{key.segment_index}")
        return _elapsed_between(seg, _event_value(start), _event_value(end))

    def close(self) -> Dict[str, StreamEdgeSnapshot]:
        """Ends the request: idempotent, never raises. Every handle, in every
        process, records nothing from now on. Returns the final snapshot
        (``{}`` when called again)."""
        if self._closed:
            return {}
        self._closed = True
        self._segments.clear()
        fin = self._finalizer
        if fin is None:
            return {}
        try:
            final = fin()
        except Exception as e:  # noqa: BLE001 - a cleanup path must go on
            _log.debug("edgemark: close failed: %s", e)
            return {}
        return final if final is not None else {}

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._token is not None else "unrecorded"
        return f"RequestStreamEdgeEvents({state}, token={self._token!s})"


def _event_value(event) -> str:
    if isinstance(event, enum.Enum):
        return event.value
    return event
