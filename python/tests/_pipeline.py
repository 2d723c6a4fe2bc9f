"""The synthetic pipeline of the upstream recorder's tests, through the Python API.

The cases are written once over a ``Pipeline``: the orchestrator's region
(begin, snapshot, close) plus a way for stages to record. ``InProcess``
records straight into the orchestrator's region; ``Processes`` sends every
observation to the stage's own worker process (started with the ``spawn``
method), which attached to the region file by path and records into it
itself. Tokens travel to the workers in their text form, as they would
inside a dispatch message.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import _workers
from edgemark import HOST_MONOTONIC, Event, Region, Token

#: Clock domains the cases use besides host_monotonic.
DOMAINS = ("sender", "receiver", "segment_clock", "edge12_clock")
E01 = (0, 1)
E12 = (1, 2)
PRODUCER = Event.PRODUCER_FIRST_NONEMPTY_EMIT
SEND = Event.EDGE_FIRST_SEND_COMPLETE
ACCEPT = Event.CONSUMER_FIRST_ACCEPT
OUTPUT = Event.CONSUMER_FIRST_NONEMPTY_OUTPUT


def create_region(path) -> Region:
    return Region.create(path, edges=[E01, E12], slots=16, domains=DOMAINS)


def in_memory_region() -> Region:
    return Region.in_memory(edges=[E01, E12], slots=16, domains=DOMAINS)


@dataclasses.dataclass(frozen=True)
class Obs:
    """One observation a stage makes."""

    edge: Tuple[int, int]
    event: Event
    segment: int = 0
    meaningful: bool = True
    chunk_seq: Optional[int] = None
    #: A value measured elsewhere, in ``domain``; ``None`` reads the shared
    #: clock.
    elapsed_ms: Optional[float] = None
    domain: str = HOST_MONOTONIC

    def ms(self, ms: float) -> "Obs":
        return dataclasses.replace(self, elapsed_ms=ms)

    def in_domain(self, domain: str) -> "Obs":
        return dataclasses.replace(self, domain=domain)

    def seg(self, s: int) -> "Obs":
        return dataclasses.replace(self, segment=s)

    def chunk(self, c: int) -> "Obs":
        return dataclasses.replace(self, chunk_seq=c)

    def empty(self, nonempty: bool = False) -> "Obs":
        return dataclasses.replace(self, meaningful=nonempty)

    def kwargs(self) -> dict:
        kw: dict = dict(meaningful=self.meaningful, segment=self.segment)
        if self.chunk_seq is not None:
            kw["chunk_seq"] = self.chunk_seq
        if self.elapsed_ms is not None:
            kw["elapsed_ms"] = self.elapsed_ms
            kw["clock_domain"] = self.domain
        return kw

    def stage(self) -> int:
        """The stage that makes this observation."""
        if self.event in (PRODUCER, SEND):
            return self.edge[0]
        return self.edge[1]


def obs(edge: Tuple[int, int], event: Event) -> Obs:
    return Obs(edge, event)


def record_with(region: Region, token, o: Obs) -> str:
    return region.record_outcome(token, o.edge[0], o.edge[1], o.event, **o.kwargs())


class Pipeline:
    """The orchestrator's region plus a way for stages to record."""

    name = "abstract"
    owner: Region

    def record(self, token: Token, o: Obs) -> str:
        raise NotImplementedError

    def start_segment(self, token: Token, edge: Tuple[int, int], segment: int) -> str:
        raise NotImplementedError


class InProcess(Pipeline):
    """Records straight into the orchestrator's region."""

    name = "in_process"

    def __init__(self) -> None:
        self.owner = in_memory_region()

    def record(self, token, o):
        return record_with(self.owner, token, o)

    def start_segment(self, token, edge, segment):
        return self.owner.start_segment_outcome(token, edge[0], edge[1], segment)


# ---------------------------------------------------------------------------
# Stage worker processes.


def stage_worker(conn) -> None:
    """A stage process: attaches to region files by path and runs the
    commands it is sent, answering each with the outcome's name."""
    regions: Dict[str, Region] = {}

    def command(msg: tuple) -> str:
        op, path, token_text = msg[0], msg[1], msg[2]
        region = regions.get(path)
        if region is None:
            region = regions[path] = Region.attach(path)
        # The token arrives as text, as inside a dispatch message.
        token = Token.parse(token_text)
        if op == "record":
            _, _, _, from_stage, to_stage, event_name, kwargs = msg
            return region.record_outcome(token, from_stage, to_stage, event_name, **kwargs)
        if op == "start":
            _, _, _, from_stage, to_stage, segment = msg
            return region.start_segment_outcome(token, from_stage, to_stage, segment)
        raise RuntimeError(f"unknown command {op!r}")

    _workers.serve(conn, command)


class Workers(_workers.Workers):
    """One worker process per stage (``stage_worker``), started with the
    spawn method."""

    def __init__(self, stages=(0, 1, 2)) -> None:
        super().__init__(stage_worker, stages)


class Processes(Pipeline):
    """Every stage observation is recorded by that stage's own process."""

    name = "processes"

    def __init__(self, workers: Workers, path) -> None:
        self.workers = workers
        self.path = str(path)
        self.owner = create_region(self.path)

    def record(self, token, o):
        # The event travels by name: the workers exercise the string form.
        return self.workers[o.stage()].ask(
            "record", self.path, str(token), o.edge[0], o.edge[1], str(o.event), o.kwargs()
        )

    def start_segment(self, token, edge, segment):
        return self.workers[edge[0]].ask("start", self.path, str(token), edge[0], edge[1], segment)


# ---------------------------------------------------------------------------
# The synthetic delivery and the orchestrator stand-in.


@dataclasses.dataclass(frozen=True)
class Delivery:
    send_ok: bool = True
    admit_ok: bool = True
    output: bool = True
    nonempty: bool = True


OK = Delivery()


def deliver(p: Pipeline, token, d: Delivery) -> List[str]:
    """Over edge 0->1: emit at 10.0 (chunk 3), then send complete at 12.0 if
    the send succeeded, then accept at 14.0 if admission succeeded, then
    first output at 25.0 if the consumer produced output. Each observation is
    meaningful only when the payload is non-empty."""
    m = d.nonempty
    out = [p.record(token, obs(E01, PRODUCER).ms(10.0).chunk(3).empty(m))]
    if not d.send_ok:
        return out
    out.append(p.record(token, obs(E01, SEND).ms(12.0).empty(m)))
    if not d.admit_ok:
        return out
    out.append(p.record(token, obs(E01, ACCEPT).ms(14.0).empty(m)))
    if d.output:
        out.append(p.record(token, obs(E01, OUTPUT).ms(25.0).empty(m)))
    return out


def ms(snapshot: dict, key: str, event: Event):
    """The value of ``event`` in the edge segment ``key`` (None if missing)."""
    return snapshot.get(key, {}).get(event.key)


class Orchestrator:
    """A stand-in for the orchestrator's request table: external request IDs
    to tokens, with the one removal helper every path calls."""

    def __init__(self, region: Region) -> None:
        self.region = region
        self.states: Dict[str, Token] = {}

    def add(self, external_id: str) -> Token:
        token = self.region.begin()
        assert token is not None
        self.states[external_id] = token
        return token

    def remove(self, external_id: str, reason: str) -> Optional[dict]:
        """A removal for ``reason`` (completion, abort, disconnect, timeout,
        stage error): each goes through ``drop_request``."""
        assert reason
        return self.drop_request(external_id)

    def drop_request(self, external_id: str) -> Optional[dict]:
        token = self.states.pop(external_id, None)
        if token is None:
            return None
        return self.region.close(token)


def response_metrics(region: Region, token) -> Optional[dict]:
    """A response builder in the upstream manner: stream-edge metrics only
    when recording is on."""
    return region.snapshot(token) if region.enabled else None

