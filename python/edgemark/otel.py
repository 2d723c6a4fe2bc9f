"""edgemark's values as OpenTelemetry span events, for a process that
already traces with the OpenTelemetry SDK (for example a vLLM-Omni
orchestrator with tracing on).

``add_snapshot(span, snapshot)`` adds the events ``edgemark export --otlp``
puts on its edge spans to the caller's own span: one event per recorded
boundary of each edge segment, named for the event
(``producer_first_nonempty_emit``, ...), at its absolute time: the
request's origin on the wall clock plus the elapsed time. Each event's
attributes give the edge (``edgemark.edge``: ``"0->1"``), the segment, the
relative time (``edgemark.elapsed_ms``), its clock domain, and the delta
from the previous recorded event of the segment when both share one clock
domain (``edgemark.since_previous_ms``); values of two domains are never
subtracted. A value measured in a foreign clock domain (anywhere but
``host_monotonic``) is placed at the origin, its relative time kept in
``edgemark.elapsed_ms``, marked ``edgemark.placed_at_origin``.

The module needs only ``opentelemetry-api`` (the extra ``otel``), and not
even that to import: it calls the span it is given.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional, Tuple, Union

from . import _edgemark as _native

__all__ = ["add_snapshot", "HOST_MONOTONIC"]

#: The region's shared clock domain; values in any other were measured
#: elsewhere.
HOST_MONOTONIC = "host_monotonic"

_Snapshot = Union[Mapping[str, Mapping[str, Any]], str, bytes]


def _segments(snapshot: _Snapshot) -> Tuple[Mapping[str, Mapping[str, Any]], Any]:
    """The snapshot's segments, and the origin it carries (a closed request
    of ``Region.drain_closed`` does), as it is: ``_origin`` checks it."""
    if isinstance(snapshot, (str, bytes, bytearray)):
        snapshot = json.loads(snapshot)
    if not isinstance(snapshot, Mapping):
        raise TypeError(
            "snapshot must be a snapshot dict (Region.close, Region.snapshot), "
            "a closed request of Region.drain_closed, or a snapshot's JSON "
            f"text, not {type(snapshot).__name__}"
        )
    if "snapshot" in snapshot and "origin_unix_ns" in snapshot:
        return _segments(snapshot["snapshot"])[0], snapshot["origin_unix_ns"]
    return snapshot, None


def _origin(span: Any, carried: Any, origin_unix_ns: Optional[int]) -> int:
    origin: Any
    if origin_unix_ns is not None:
        origin = origin_unix_ns
    else:
        # The origin a closed request carries, else the span's start (the
        # SDK's spans have one): the caller's span began with the request.
        origin = carried
        if origin is None:
            origin = getattr(span, "start_time", None)
        if origin is None:
            raise ValueError(
                "add_snapshot: pass origin_unix_ns (the request's begin on the wall "
                "clock, time.time_ns()): this span has no start time to take it from"
            )
    if isinstance(origin, bool) or not isinstance(origin, int) or origin < 0:
        raise ValueError(f"origin_unix_ns must be a non-negative int, not {origin!r}")
    return origin


def add_snapshot(
    span: Any,
    snapshot: _Snapshot,
    origin_unix_ns: Optional[int] = None,
) -> int:
    """Adds the snapshot's boundaries to ``span`` as span events; returns how
    many it added.

    ``snapshot`` is a snapshot dict as ``Region.close`` or
    ``Region.snapshot`` return it (the upstream ``stream_edge_metrics``
    map), its JSON text, or a closed request as ``Region.drain_closed``
    returns it (which carries its origin). ``origin_unix_ns`` is the
    request's origin on the wall clock (``time.time_ns()`` taken with
    ``Region.begin``); without it, a closed request's own is taken, else the
    span's start time (the SDK's spans have one), so a span started when the
    request began needs none.

    Events of one segment are added in time order (schema order among
    equal times), segments in the snapshot's order. A span that is not
    recording gets nothing (0 is returned).
    """
    segments, carried = _segments(snapshot)
    is_recording = getattr(span, "is_recording", None)
    if is_recording is not None and not is_recording():
        return 0
    origin = _origin(span, carried, origin_unix_ns)
    added = 0
    for key, seg in segments.items():
        if not isinstance(seg, Mapping):
            raise TypeError(f"snapshot[{key!r}] is not an edge segment dict")
        edge = f"{seg.get('from_stage')}->{seg.get('to_stage')}"
        index = int(seg.get("segment_index", 0))
        domains = seg.get("clock_domains") or {}
        recorded = [
            (field[: -len("_ms")], float(value), str(domains.get(field[: -len("_ms")], HOST_MONOTONIC)))
            for field, value in seg.items()
            if field.endswith("_ms") and value is not None
        ]
        # Placement, time order and deltas are the core's span plan, the
        # one `edgemark export --otlp` follows.
        plan = _native.span_plan(recorded, origin)
        for event in plan["events"]:
            attributes: dict = {
                "edgemark.edge": edge,
                "edgemark.segment": index,
                "edgemark.elapsed_ms": event["elapsed_ms"],
                "edgemark.clock_domain": event["clock_domain"],
            }
            if event["placed_at_origin"]:
                attributes["edgemark.placed_at_origin"] = True
            if event["previous_event"] is not None:
                attributes["edgemark.since_previous_ms"] = event["since_previous_ms"]
                attributes["edgemark.previous_event"] = event["previous_event"]
            span.add_event(event["name"], attributes=attributes, timestamp=event["at_unix_ns"])
            added += 1
    return added
