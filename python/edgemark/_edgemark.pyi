"""Type stubs of the native module ``edgemark._edgemark`` (re-exported by
``edgemark``)."""

import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union, final

from . import Event
from .stream_edge import StreamEdgeEvent, StreamEdgeKey

_TokenLike = Union["Token", str, bytes, bytearray, memoryview, int, None]
_EventLike = Union[Event, str, int]
#: A path: ``str``, ``bytes`` (``os.fsencode``) or a path-like of either.
_Path = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]
_Bytes = Union[bytes, bytearray, memoryview]
#: A snapshot: ``"from->to:segment"`` to the edge segment's object.
_Snapshot = Dict[str, Dict[str, Any]]

HOST_MONOTONIC: str
MAX_ELAPSED_MS: float
MAX_CHUNK_SEQ: int
OUTCOME_NAMES: Tuple[str, ...]
#: ``(name, is_success)`` of every outcome, in the core's order.
_OUTCOMES: Tuple[Tuple[str, bool], ...]
EVENT_NAMES: Tuple[str, ...]
#: Seconds a stopped ``Exporter`` goes on sending what it holds.
FLUSH_DEADLINE_S: float
__version__: str
__all__ = [
    "Region",
    "Token",
    "Handle",
    "StreamEdgeRecorder",
    "Exporter",
    "RegionShrunkError",
    "RegionNoSpaceError",
    "default_dir",
    "monotonic_ns",
    "elapsed_between",
    "span_plan",
    "_cli_main",
    "HOST_MONOTONIC",
    "MAX_ELAPSED_MS",
    "MAX_CHUNK_SEQ",
    "OUTCOME_NAMES",
    "_OUTCOMES",
    "EVENT_NAMES",
    "FLUSH_DEADLINE_S",
    "__version__",
]

def default_dir() -> str:
    """``/dev/shm`` where it exists, else the system's temporary directory."""

def _cli_main(argv: Sequence[str], command: Sequence[str]) -> int:
    """Runs the ``edgemark`` command line ``argv`` (the first item is the
    program's name) and returns its exit status; ``command`` starts the
    command again (the demo's stage workers)."""

def monotonic_ns() -> int:
    """``CLOCK_MONOTONIC`` now, in nanoseconds: the shared clock ``record`` reads."""

def elapsed_between(
    segment: Optional[Mapping[str, Any]],
    start_event: Union[_EventLike, str],
    end_event: Union[_EventLike, str],
) -> Optional[float]:
    """Milliseconds from ``start_event`` to ``end_event`` in one edge segment
    of a snapshot; ``None`` unless both were recorded, in one clock domain,
    in order (the core's rule)."""

def span_plan(
    events: Sequence[Tuple[str, float, str]], origin_unix_ns: int
) -> Dict[str, Any]:
    """The core's span plan of one edge segment (for ``edgemark.otel``):
    ``events`` are its recorded ``(name, elapsed_ms, clock_domain)`` in
    schema order; ``{"events", "start_unix_ns", "end_unix_ns",
    "clock_domains"}``."""

@final
class Token:
    """One request instance in one region: region ID, slot and generation.

    Travels as ``str(token)``, ``bytes(token)`` (16 bytes) or ``int(token)``;
    pickles; compares and hashes by value.
    """

    def __new__(cls, value: Union["Token", str, _Bytes, int]) -> "Token":
        """A token from any of its forms; ``ValueError`` if ``value`` is none."""
    @staticmethod
    def parse(s: str) -> "Token":
        """The token written as ``str(token)``; ``ValueError`` otherwise."""
    @staticmethod
    def from_bytes(b: _Bytes) -> "Token":
        """The token written as ``bytes(token)``; ``ValueError`` otherwise."""
    @staticmethod
    def from_int(v: int) -> "Token":
        """The token written as ``int(token)``."""
    @property
    def slot(self) -> int: ...
    @property
    def generation(self) -> int: ...
    @property
    def region_id(self) -> int: ...
    def __str__(self) -> str: ...
    def __bytes__(self) -> bytes: ...
    def __int__(self) -> int: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> Tuple[type, Tuple[str]]: ...

@final
class Handle:
    """One edge and event of one request, resolved once by ``Region.handle``."""
    @property
    def token(self) -> Optional[Token]: ...
    def record(self) -> bool:
        """Records the event now on the shared clock; ``True`` if this call did."""
    def record_outcome(self) -> str:
        """``record`` that returns the outcome's name."""
    def record_elapsed(self, elapsed_ms: float, clock_domain: str = "host_monotonic") -> bool:
        """Records a value measured elsewhere; ``True`` if this call did."""
    def record_elapsed_outcome(self, elapsed_ms: float, clock_domain: str = "host_monotonic") -> str:
        """``record_elapsed`` that returns the outcome's name."""

@final
class StreamEdgeRecorder:
    """One segment of one edge of one request, as
    ``edgemark.stream_edge.RequestStreamEdgeEvents.start_segment`` returns
    it; pickles, and records from the process that unpickles it."""

    def __new__(
        cls, region: Optional["Region"], token: _TokenLike, key: StreamEdgeKey
    ) -> "StreamEdgeRecorder": ...
    def record(
        self,
        event: Union[StreamEdgeEvent, str],
        *,
        elapsed_ms: Optional[float] = None,
        clock_domain: Optional[str] = None,
        meaningful: bool,
        chunk_seq: Optional[int] = None,
    ) -> bool:
        """Records the first ``event``; ``True`` only if this call did."""
    @property
    def key(self) -> StreamEdgeKey: ...
    @property
    def token(self) -> Optional[Token]: ...
    @property
    def recording(self) -> bool: ...
    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]: ...

@final
class Exporter:
    """The OTLP exporter ``edgemark export --otlp`` runs, on a native thread
    of this process that never takes the GIL: the closed requests of one
    region file as spans, at least once, every loss counted."""

    @staticmethod
    def start(path: _Path, endpoint: Optional[str] = None) -> "Exporter":
        """Starts exporting the region file at ``path`` with the ``OTEL_*``
        variables (``endpoint``: the collector's base URL over them);
        ``ValueError`` for settings that cannot be used, ``OSError`` when the
        file cannot be attached or read as a registered reader."""
    @property
    def url(self) -> str:
        """The traces URL it posts to."""
    def running(self) -> bool:
        """Whether its thread still runs."""
    def counts(self) -> Dict[str, Any]:
        """Its counts: ``requests``, ``exported``, ``queued``, ``adopted``,
        ``left_unsent``, ``failures``, ``tls_failures``, ``dropped_retries``,
        ``dropped_rejected``, ``torn_or_unwritten``, ``unsampled`` and
        ``up``."""
    def stop(self) -> Dict[str, Any]:
        """Stops it, waits (without the GIL) while it sends what it holds for
        at most ``FLUSH_DEADLINE_S``, and returns its counts."""

class RegionShrunkError(OSError):
    """A sweep met a region file truncated under this process."""

class RegionNoSpaceError(OSError):
    """A sweep met a page of a sparse region that its full file system could
    not provide when this process wrote it (not a truncation)."""

@final
class Region:
    """A handle on a region of once-only first-event timestamps.

    Recording never raises for runtime conditions; set-up errors raise
    ``OSError`` or ``ValueError``.
    """

    @staticmethod
    def create(
        path: _Path,
        edges: Optional[Iterable[Tuple[int, int]]] = ...,  # [(0, 1), (1, 2)]
        slots: int = 4096,
        segments: int = 4,
        domains: Sequence[str] = (),
        group_access: bool = False,
        clock: str = "monotonic",
        sparse: bool = False,
        closed_entries: Optional[int] = None,
    ) -> "Region":
        """Creates a new region file at ``path`` (never over an existing file)
        and reserves its space (``OSError`` ``ENOSPC`` naming the size and
        the file system when it does not fit; ``sparse=True`` skips the
        reservation); ``clock="counter"`` asks for the time-stamp-counter
        shared clock. ``domains`` is a sequence of names (``TypeError`` for
        one ``str``)."""
    @staticmethod
    def in_memory(
        edges: Optional[Iterable[Tuple[int, int]]] = ...,  # [(0, 1), (1, 2)]
        slots: int = 4096,
        segments: int = 4,
        domains: Sequence[str] = (),
    ) -> "Region":
        """A region on the heap, private to this process."""
    @staticmethod
    def attach(
        path: _Path,
        allow_foreign_clock: bool = False,
        allow_foreign_owner: bool = False,
        read_only: bool = False,
    ) -> "Region":
        """Attaches to an existing region file, validating its header."""
    @staticmethod
    def disabled() -> "Region":
        """A region that records nothing (collection off by default)."""
    def begin(self, traceparent: Optional[str] = None, strict: bool = True) -> Optional[Token]:
        """Begins a request, under the W3C ``traceparent`` if given (else in a
        new trace); ``None`` when the region is full or disabled, or this
        process's mapping lost a page (outcome ``faulted``). A malformed
        ``traceparent`` raises ``ValueError``, or with ``strict=False`` is
        ignored and counted (``bad_trace_contexts``)."""
    def traceparent(self, token: _TokenLike) -> Optional[str]:
        """The ``traceparent`` to hand the request's part on another host:
        its trace, its own span as the parent; ``None`` if not open."""
    def drain_closed(self, max: int = 256) -> List[Dict[str, Any]]:
        """Takes up to ``max`` closed requests (each reaches one reader):
        dicts of ``token``, ``trace_id``, ``span_id``, ``parent_span_id``,
        ``trace_flags``, ``origin_unix_ns``, ``closed_unix_ns``,
        ``snapshot``."""
    def record(
        self,
        token: _TokenLike,
        from_stage: int,
        to_stage: int,
        event: _EventLike,
        meaningful: bool = True,
        chunk_seq: Optional[int] = None,
        segment: int = 0,
        elapsed_ms: Optional[float] = None,
        clock_domain: Optional[str] = None,
    ) -> bool:
        """Records the first ``event``; ``True`` only if this call recorded it.

        A negative stage, segment or chunk sequence raises ``ValueError``;
        one of ``2**32`` or more (``2**64`` for ``chunk_seq``) is a refusal:
        ``False``, outcome ``unknown_edge`` for a stage, ``out_of_range``
        for a segment or chunk sequence."""
    def record_outcome(
        self,
        token: _TokenLike,
        from_stage: int,
        to_stage: int,
        event: _EventLike,
        meaningful: bool = True,
        chunk_seq: Optional[int] = None,
        segment: int = 0,
        elapsed_ms: Optional[float] = None,
        clock_domain: Optional[str] = None,
    ) -> str:
        """``record`` that returns the outcome's name (see ``edgemark.Outcome``)."""
    def handle(
        self,
        token: _TokenLike,
        from_stage: int,
        to_stage: int,
        event: _EventLike,
        segment: Optional[int] = None,
        chunk_seq: Optional[int] = None,
    ) -> "Handle":
        """One edge and event of the request, resolved once (``segment``
        ``None``: segment 0)."""
    def register_domain(self, name: str) -> Optional[int]:
        """Registers the clock domain ``name`` and returns its id; ``None``
        when the table is full or the region disabled."""
    def start_segment(
        self, token: _TokenLike, from_stage: int, to_stage: int, segment: int
    ) -> bool:
        """Starts a newer segment on the edge; ``True`` if it started."""
    def start_segment_outcome(
        self, token: _TokenLike, from_stage: int, to_stage: int, segment: int
    ) -> str:
        """``start_segment`` that returns the outcome's name."""
    def snapshot(self, token: _TokenLike) -> _Snapshot:
        """A detached snapshot, as the upstream ``stream_edge_metrics`` dict."""
    def snapshot_json(self, token: _TokenLike) -> str:
        """``snapshot`` as the core's JSON text."""
    def close(self, token: _TokenLike) -> Optional[_Snapshot]:
        """Closes the request (idempotent) and returns its final snapshot;
        ``None`` if another control operation held it for about a second
        (the request is still open: close it again), or if this process's
        mapping lost a page (nothing changed; attach again to close it)."""
    def close_json(self, token: _TokenLike) -> Optional[str]:
        """``close`` returning the final snapshot as JSON text."""
    def is_open(self, token: _TokenLike) -> bool:
        """Whether ``token`` names an open request of this region."""
    def recorded(
        self,
        token: _TokenLike,
        from_stage: int,
        to_stage: int,
        event: _EventLike,
        segment: int = 0,
    ) -> bool:
        """Whether ``event`` is recorded for the open request, read after a
        full memory fence: two parties that each record their event and
        then ask for the other's cannot both miss it (a close decision).
        ``False`` for any runtime condition (closed, stale or foreign
        token, not recorded yet); ``TypeError``/``ValueError`` only for bad
        arguments, as ``record``."""
    def open_requests(self) -> List[Token]:
        """Tokens of every open request (a sweep, without the GIL)."""
    def snapshot_open(self) -> List[Tuple[Token, _Snapshot]]:
        """Snapshots of every open request (a sweep, without the GIL)."""
    def expire(self, older_than_s: float) -> int:
        """Closes every request open for at least ``older_than_s`` seconds,
        as ``close`` closes it (its final values reach ``drain_closed``),
        counts each in ``counters()["expired_requests"]``, and returns how
        many this call closed; requests whose age this process cannot
        judge are left open. ``ValueError`` for a negative or NaN bound,
        ``PermissionError`` on a read-only attach."""
    def reclaim_dead_owners(self) -> Dict[str, Any]:
        """Frees the slots of dead processes: ``{"dead_owners", "dead_holders",
        "unjudged", "live_owners_locked"}`` (``unjudged``: why no pid was
        judged, or ``None``)."""
    def report(self) -> Optional[Dict[str, Any]]:
        """Everything the region says about itself, as ``edgemark inspect
        --json`` prints it: ``info()``'s keys but ``path``, ``counters()``'s,
        then the gauges of the report's table of counters and gauges
        (docs/cli.md, "The report's counters and gauges"); ``None`` when
        disabled."""
    def prometheus_text(self, openmetrics: bool = False) -> str:
        """The region's metrics as Prometheus text, as ``edgemark export
        --listen`` serves them: the classic text format, or OpenMetrics 1.0
        when ``openmetrics``."""
    def counters(self) -> Dict[str, Any]:
        """One key per counter of the report's table of counters and gauges
        (docs/cli.md, "The report's counters and gauges", which says what
        each counts): ``refused`` (by outcome) and ``closed_given_up`` (by
        reason) as dicts, the others ints."""
    def info(self) -> Optional[Dict[str, Any]]:
        """The region's geometry, identity and schema (``path``, ``region_id``,
        ..., ``clock``: ``{"kind", "boot_id", "time_namespace",
        "shared_with_this_process"}``, ``pid_namespaces``, ``closed_ring``);
        ``None`` when disabled. The former keys ``shares_clock``,
        ``mixed_pid_namespaces`` and ``pids_unjudged`` answer with a
        ``DeprecationWarning`` for one release."""
    @property
    def enabled(self) -> bool: ...
    @property
    def path(self) -> Optional[str]:
        """The path as ``os.fsdecode`` gives it (round-trips non-UTF-8 paths)."""
    @property
    def edges(self) -> List[Tuple[int, int]]: ...
    @property
    def events(self) -> List[str]: ...
    @property
    def domains(self) -> List[str]: ...
