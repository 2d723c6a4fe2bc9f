"""edgemark: once-only first-event timestamps for the stage edges of a
streaming inference pipeline, recorded by the stage processes straight into
one shared memory-mapped region.

The orchestrator creates a region and begins each request::

    import edgemark
    from edgemark import Event

    path = os.path.join(edgemark.default_dir(), "pipeline.region")
    region = edgemark.Region.create(path, edges=[(0, 1), (1, 2)])
    token = region.begin()          # None if the region is full: fail open
    message["edgemark"] = str(token) if token else None

Each stage worker attaches once, by path, and records what it observes::

    region = edgemark.Region.attach(path)
    token = message["edgemark"]     # a Token, its str, bytes or int, or None
    region.record(token, 0, 1, Event.PRODUCER_FIRST_NONEMPTY_EMIT, chunk_seq=3)

Any process may snapshot; every removal path closes::

    region.snapshot(token)          # {"0->1:0": {..., "producer_first_nonempty_emit_ms": 0.8, ...}}
    final = region.close(token)     # the upstream metrics["stream_edge_metrics"] dict

Recording never raises for runtime conditions: ``record`` returns ``False``
and ``record_outcome`` says why (an ``Outcome``). A hot loop that records
one edge and event of a request resolves them once::

    h = region.handle(token, 1, 2, Event.CONSUMER_FIRST_ACCEPT)
    h.record()                      # no argument to convert
    h.record_elapsed(3.5, "sender") # a value measured elsewhere
"""

from __future__ import annotations

import enum
from typing import Any, Mapping, Optional, Union

from ._edgemark import (
    EVENT_NAMES,
    HOST_MONOTONIC,
    MAX_CHUNK_SEQ,
    MAX_ELAPSED_MS,
    OUTCOME_NAMES,
    Handle,
    Region,
    RegionNoSpaceError,
    RegionShrunkError,
    Token,
    __version__,
    default_dir,
    monotonic_ns,
)

__all__ = [
    "Event",
    "EventLike",
    "Handle",
    "Outcome",
    "Region",
    "RegionNoSpaceError",
    "RegionShrunkError",
    "Token",
    "TokenLike",
    "elapsed_between",
    "default_dir",
    "monotonic_ns",
    "EVENT_NAMES",
    "OUTCOME_NAMES",
    "HOST_MONOTONIC",
    "MAX_CHUNK_SEQ",
    "MAX_ELAPSED_MS",
    "__version__",
]


class Event(enum.IntEnum):
    """The four stream-edge events of the default schema, in schema order.

    A member is an ``int`` (its schema position), so passing it to
    ``Region.record`` costs nothing to convert; ``str(event)`` and
    ``event.event_name`` give the name snapshots use
    (``"producer_first_nonempty_emit"``), and ``event.key`` the snapshot
    field (``"producer_first_nonempty_emit_ms"``).
    """

    #: Producer stage: the first meaningful payload for the edge is ready.
    PRODUCER_FIRST_NONEMPTY_EMIT = 0
    #: Producer side, connector send thread: the put of the first payload
    #: committed.
    EDGE_FIRST_SEND_COMPLETE = 1
    #: Consumer stage, receive thread: the first payload was decoded and
    #: admitted.
    CONSUMER_FIRST_ACCEPT = 2
    #: Consumer stage: the first non-empty output.
    CONSUMER_FIRST_NONEMPTY_OUTPUT = 3

    @property
    def event_name(self) -> str:
        """The event's name as snapshots show it."""
        return self.name.lower()

    @property
    def key(self) -> str:
        """The event's field in a snapshot's edge object (``<name>_ms``)."""
        return self.name.lower() + "_ms"

    @classmethod
    def from_name(cls, name: str) -> "Event":
        """The event called ``name``; ``ValueError`` if there is none."""
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(
                f"unknown event {name!r}; the events are {', '.join(EVENT_NAMES)}"
            ) from None

    def __str__(self) -> str:
        return self.name.lower()

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


class Outcome(str, enum.Enum):
    """What a recording call did. Members are strings and compare equal to
    the names ``Region.record_outcome`` returns.

    Only ``RECORDED`` and ``STARTED`` mean that state changed.
    """

    #: The first write of this event for this request, edge and segment.
    RECORDED = "recorded"
    #: ``start_segment`` started the segment.
    STARTED = "started"
    #: An earlier write of the same event, edge and segment won.
    DUPLICATE = "duplicate"
    #: The payload was not meaningful: nothing was written.
    NOT_MEANINGFUL = "not_meaningful"
    #: The segment was retired by a newer one (or, for ``start_segment``, is
    #: not newer than the current one).
    STALE_SEGMENT = "stale_segment"
    #: The segment has not been started on this edge.
    SEGMENT_NOT_STARTED = "segment_not_started"
    #: The request is closed.
    CLOSED = "closed"
    #: The token's slot now holds a newer request.
    REUSED = "reused"
    #: This process does not share the region's clock, or the event is
    #: declared in another clock domain.
    CLOCK_MISMATCH = "clock_mismatch"
    #: A negative, infinite or NaN elapsed time, or a value that is no token.
    INVALID = "invalid"
    #: An elapsed time or chunk sequence beyond what a cell holds, or too many
    #: segments started on one edge.
    OUT_OF_RANGE = "out_of_range"
    #: The edge is not declared in the region.
    UNKNOWN_EDGE = "unknown_edge"
    #: The event is not in the region's schema.
    UNKNOWN_EVENT = "unknown_event"
    #: The clock-domain name cannot name a domain (empty or blank, over 32
    #: bytes, or with a control or invisible format character such as a
    #: bidirectional control); any other name is registered on
    #: first use.
    UNKNOWN_DOMAIN = "unknown_domain"
    #: The token belongs to another region.
    FOREIGN_TOKEN = "foreign_token"
    #: ``begin`` found no free slot.
    REGION_FULL = "region_full"
    #: Another control operation held the request's slot for too long.
    BUSY = "busy"
    #: A word of the slot holds bits edgemark never writes.
    CORRUPT = "corrupt"
    #: Recording is off: the region is disabled, or the token is ``None``.
    DISABLED = "disabled"
    #: The region's clock-domain table is full (32 domains, declared and
    #: registered together), so a new domain name could not be registered.
    DOMAIN_TABLE_FULL = "domain_table_full"
    #: The region was attached read-only: this handle does not write it.
    READ_ONLY = "read_only"
    #: This process's mapping of the region lost a page (the file was
    #: truncated under it, or a sparse region's file system was full):
    #: ``begin``, ``start_segment`` and ``close`` refuse; attach again.
    FAULTED = "faulted"

    @property
    def is_success(self) -> bool:
        """Whether the call changed state."""
        return self in (Outcome.RECORDED, Outcome.STARTED)

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


#: What the recording calls accept as a token: a ``Token``, its text, bytes
#: (``bytes``, ``bytearray`` or ``memoryview``) or integer, or ``None`` (the
#: request runs unrecorded).
TokenLike = Union[Token, str, bytes, bytearray, memoryview, int, None]
#: What the recording calls accept as an event: an ``Event`` or its name.
EventLike = Union[Event, str]


def _event_name(event: Union[Event, str, int]) -> str:
    if isinstance(event, Event):
        return event.name.lower()
    if isinstance(event, str):
        return event
    if isinstance(event, int):
        return Event(event).name.lower()
    raise TypeError(f"an event is an edgemark.Event or its name, not {type(event).__name__}")


def elapsed_between(
    segment: Optional[Mapping[str, Any]],
    start_event: EventLike,
    end_event: EventLike,
) -> Optional[float]:
    """Milliseconds from ``start_event`` to ``end_event`` in one edge segment
    of a snapshot (the dict under a key such as ``"0->1:0"``).

    ``None`` unless both events were recorded, in the same clock domain
    (hence from the same origin), and the end is not before the start. The
    difference is taken in whole microseconds, as the core stores them, so
    it equals the core's ``elapsed_between`` exactly. ``segment`` may be
    ``None`` (``snapshot.get("0->1:0")`` of an edge with no event yet).
    """
    if not segment:
        return None
    a, b = _event_name(start_event), _event_name(end_event)
    va, vb = segment.get(a + "_ms"), segment.get(b + "_ms")
    if va is None or vb is None:
        return None
    domains = segment.get("clock_domains") or {}
    da, db = domains.get(a), domains.get(b)
    if da is None or da != db:
        return None
    ua, ub = round(va * 1000), round(vb * 1000)
    if ub < ua:
        return None
    return (ub - ua) / 1000
