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
from typing import TYPE_CHECKING, Any, Type, TypeVar, Union

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
    _OUTCOMES,
    __version__,
    default_dir,
    elapsed_between,
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


_E = TypeVar("_E", bound="_Event")


class _Event(enum.IntEnum):
    """The four stream-edge events of the default schema, in schema order:
    made at import from the core's table (``EVENT_NAMES``), one member per
    event, named as the event in capitals, valued by its position.

    A member is an ``int`` (its schema position), so passing it to
    ``Region.record`` costs nothing to convert; ``str(event)`` and
    ``event.event_name`` give the name snapshots use
    (``"producer_first_nonempty_emit"``), and ``event.key`` the snapshot
    field (``"producer_first_nonempty_emit_ms"``). What each event means is
    documented with the core's ``edgemark::Event``.
    """

    @property
    def event_name(self) -> str:
        """The event's name as snapshots show it."""
        return EVENT_NAMES[self.value]

    @property
    def key(self) -> str:
        """The event's field in a snapshot's edge object (``<name>_ms``)."""
        return self.event_name + "_ms"

    @classmethod
    def from_name(cls: Type[_E], name: str) -> _E:
        """The event called ``name``; ``ValueError`` if there is none."""
        try:
            return cls(EVENT_NAMES.index(name))
        except ValueError:
            raise ValueError(
                f"unknown event {name!r}; the events are {', '.join(EVENT_NAMES)}"
            ) from None

    def __str__(self) -> str:
        return self.event_name

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


class _Outcome(str, enum.Enum):
    """What a recording call did: made at import from the core's table of
    outcomes (``OUTCOME_NAMES``, in its order), one member per outcome,
    named as the outcome in capitals. Members are strings and compare equal
    to the names ``Region.record_outcome`` returns. What each outcome means
    is documented with the core's ``edgemark::Outcome``.

    Only ``RECORDED`` and ``STARTED`` mean that state changed.
    """

    @property
    def is_success(self) -> bool:
        """Whether the call changed state."""
        return self in _SUCCESS

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


def _enum(base: Any, name: str, members: Any) -> Any:
    """A subclass of ``base`` named ``edgemark.<name>`` with ``members``
    (``(NAME, value)`` pairs): it pickles and prints as if it were declared
    here."""
    made = base(name, members, module=__name__, qualname=name)
    made.__doc__ = base.__doc__
    return made


if TYPE_CHECKING:
    # What a type checker reads (a class made at import is no type to it):
    # the members the core's ``Event::ALL`` makes below, written out.
    # tests/test_core_api.py checks that they are the ones made at import.
    @enum.unique
    class Event(_Event):
        """The stream-edge events (see ``_Event``)."""

        PRODUCER_FIRST_NONEMPTY_EMIT = 0
        EDGE_FIRST_SEND_COMPLETE = 1
        CONSUMER_FIRST_ACCEPT = 2
        CONSUMER_FIRST_NONEMPTY_OUTPUT = 3

else:
    #: The stream-edge events, from the core's ``Event::ALL``.
    Event = _enum(_Event, "Event", [(n.upper(), i) for i, n in enumerate(EVENT_NAMES)])
#: The outcomes, from the core's ``Outcome::ALL``.
Outcome = _enum(_Outcome, "Outcome", [(n.upper(), n) for n, _ in _OUTCOMES])
_SUCCESS = frozenset(Outcome(n) for n, ok in _OUTCOMES if ok)


#: What the recording calls accept as a token: a ``Token``, its text, bytes
#: (``bytes``, ``bytearray`` or ``memoryview``) or integer, or ``None`` (the
#: request runs unrecorded).
TokenLike = Union[Token, str, bytes, bytearray, memoryview, int, None]
#: What the recording calls accept as an event: an ``Event`` or its name.
EventLike = Union[Event, str]
