"""This process's recording state, in one object (``Recording``): the
region, the requests this process began (``Owner``, in the API server, and
host-local requests on a stage's own host), and what a stage process knows
of each request instance."""

from __future__ import annotations

import collections
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from .. import _channel, _lifecycle
from .._edgemark import Region, Token
from .._lifecycle import ACCEPT, EMIT, OUTPUT, SEND, Owner, create_or_attach

log = logging.getLogger("edgemark.vllm_omni")

__all__ = ["ACCEPT", "EMIT", "OUTPUT", "SEND", "Owner", "Recording", "StageRequest", "Once", "log"]

SPEC = _lifecycle.Spec("EDGEMARK_VLLM_OMNI", "edgemark-vllm-omni-", log, "stream-edge events are")

#: Set to ``1`` to record; anything else leaves vLLM-Omni untouched.
ENV_ENABLE = SPEC.env
#: The region file of this host. Unset, the first process that loads the
#: plugin (the launcher, or the API server) names one for this server start
#: (``<default dir>/edgemark-vllm-omni-<pid>-<random>.region``) before it
#: starts the API servers and stage processes, which inherit it; set it
#: yourself to choose the file (on a host that runs stages only, set it for
#: ``edgemark export`` to find the region).
ENV_REGION = SPEC.env_region
#: Requests the region holds open at once; by default sized from the
#: stages' ``max_num_seqs`` and data parallel ranks (four times the sum of
#: their products, at least 256, at most 65536).
ENV_SLOTS = SPEC.env_slots
#: Every request is closed at most this many seconds after it began
#: (default 600), whatever happened to the processes that would close it;
#: counted as ``expired_requests``.
ENV_MAX_OPEN = SPEC.env_max_open
#: Set to ``1`` for one INFO line per closed request in the API server's
#: log: its request ID, its trace ID, and its final ``stream_edge_metrics``
#: (how a user of the HTTP endpoints, whose responses do not carry it,
#: finds one request's snapshot and its trace).
ENV_LOG_REQUESTS = "EDGEMARK_VLLM_OMNI_LOG_REQUESTS"

PREFIX = SPEC.file_prefix
STAGES = 8
MIN_SLOTS, MAX_SLOTS, FALLBACK_SLOTS = 256, 65536, 1024
#: Request instances a stage process remembers.
CACHE = 4096
RETRY_MISSING_S = 1.0
RETRY_CLOSED_S = 0.05


class Once(_lifecycle.Once):
    """Log lines said once per process, on this plugin's logger."""

    def __init__(self) -> None:
        super().__init__(log)


def edges(stages: int) -> List[Tuple[int, int]]:
    """The directed edges a region declares for ``stages`` stages."""
    if stages <= STAGES:
        return [(a, b) for a in range(stages) for b in range(stages) if a != b]
    forward = [(a, b) for a in range(stages) for b in range(a + 1, stages)]
    return forward if len(forward) <= 64 else [(a, a + 1) for a in range(min(stages - 1, 64))]


def env_slots(once: _lifecycle.Once) -> Optional[int]:
    return _lifecycle.env_int(ENV_SLOTS, once, 1, MAX_SLOTS)


def slots_for(pools: List[Any], once: _lifecycle.Once) -> int:
    """Requests the region holds open at once for these stage pools:
    ``EDGEMARK_VLLM_OMNI_SLOTS``, else four times the sum over the stages of
    ``max_num_seqs`` times data parallel ranks (at least 256, at most
    65536), else 1024."""
    slots = env_slots(once)
    if slots is not None:
        return slots
    total = 0
    for pool in pools:
        cfg = getattr(pool, "stage_vllm_config", None)
        n = getattr(getattr(cfg, "scheduler_config", None), "max_num_seqs", None)
        dp = getattr(getattr(cfg, "parallel_config", None), "data_parallel_size", 1)
        if isinstance(n, int) and n > 0:
            total += n * (dp if isinstance(dp, int) and dp > 0 else 1)
    return min(max(4 * total, MIN_SLOTS), MAX_SLOTS) if total else FALLBACK_SLOTS


@dataclass
class StageRequest:
    """One request instance as a stage process knows it."""

    token: Optional[Token]
    #: When the lookup was last read for it.
    checked: float
    #: (from, to, event) that need no more records from this process.
    done: Set[Tuple[int, int, int]] = field(default_factory=set)
    #: Closed, and no newer instance was found at ``checked``.
    dead: bool = False
    #: Begun by this process, on its own host's region, under the trace
    #: context its request carried: closed when its stage frees it.
    local: bool = False


class Recording(_lifecycle.Recording):
    """Everything this process records with: one per process, made by the
    instrumentor, handed to every wrapper. The lifecycle (the region, its
    name, hold and bound, the lookup) is ``_lifecycle.Recording``'s."""

    spec = SPEC

    def __init__(self, uninstrument: Callable[[], None] = lambda: None) -> None:
        super().__init__(uninstrument)
        #: The request instances this process knows, by request ID. Never
        #: rebound: the wrappers hold it for their fast path.
        self.requests: "collections.OrderedDict[str, StageRequest]" = collections.OrderedDict()
        #: Whether this host's region has no API server (its lookup was
        #: never made): only then does a stage begin requests of its own.
        self._stage_only: Optional[bool] = None

    def log_requests(self) -> bool:
        return os.environ.get(ENV_LOG_REQUESTS) == "1"

    def forget_all(self) -> None:
        with self.lock:
            self.requests.clear()
        self._stage_only = None

    # -- the API server -----------------------------------------------------

    def begin(self, request_id: str, traceparent: Optional[str] = None) -> Optional[Token]:
        """Begins ``request_id`` as the API server (creating the region on
        first use); ``None`` if it runs unrecorded."""
        owner = self.ensure_owner(edges(STAGES), env_slots(self.once) or FALLBACK_SLOTS)
        return owner.begin(request_id, traceparent) if owner is not None else None

    def reparent(self, request_id: str, traceparent: str) -> None:
        """Begins ``request_id`` again under the caller's ``traceparent``
        when it was begun without one and nothing was recorded yet (the
        trace context reaches the plugin after the request state exists)."""
        owner = self.owner
        if owner is None or request_id in owner.parented:
            return
        token = owner.tokens.get(request_id)
        if token is None or owner.region.snapshot(token):
            return
        owner.close(request_id, token)
        self.forget(request_id)
        new = owner.begin(request_id, traceparent)
        if new is not None:
            # The state's finalizer holds the first token: it closes this.
            owner.succeeded(token, new)

    def traceparent(self, request_id: str) -> Optional[str]:
        """The ``traceparent`` the API server hands ``request_id``'s stages."""
        owner = self.owner
        if owner is None:
            return None
        token = owner.tokens.get(request_id)
        return owner.region.traceparent(token) if token is not None else None

    def close(self, request_id: str, token: Optional[Token] = None) -> Dict[str, Any]:
        """Closes a request the API server began; its final snapshot."""
        owner = self.owner
        if owner is None:
            return {}
        # What this process recorded for the instance (the consumer's
        # output) is done with it: a later instance starts afresh.
        self.forget(request_id)
        return owner.close(request_id, token)

    def close_later(self, request_id: str, token: Token) -> None:
        """Closes a request the API server began on the next periodic tick:
        what a finalizer does (the garbage collector may run it inside a
        section that holds the owner's lock, in the same thread)."""
        owner = self.owner
        if owner is not None:
            owner.close_later(request_id, token)

    # -- every process ------------------------------------------------------

    def forget(self, request_id: str) -> Optional[StageRequest]:
        with self.lock:
            return self.requests.pop(request_id, None)

    def stage_freed(self, request_id: str) -> None:
        """A stage freed ``request_id``: a later request under the same ID is
        another instance, and a host-local request is closed."""
        req = self.forget(request_id)
        if req is not None and req.local and req.token is not None:
            region = self._region
            if region is not None:
                region.close(req.token)

    def stage_only(self) -> bool:
        """Whether this host's region has no API server: no lookup beside
        it (an API server makes one with the region). Only a stage on such
        a host begins requests of its own; on the API server's host a
        request the lookup lacks was closed, or is not this host's."""
        if self.owner is not None:
            return False
        if self._stage_only is None:
            self._stage_only = not os.path.isdir(_channel.lookup_dir(self.path))
        return self._stage_only

    def host_region(self) -> Optional[Region]:
        """This host's region, created here when no process on the host
        made it (a host that runs stages only), held for this process's
        life, its open requests bounded by this process's tick."""
        region = self.region()
        if region is not None or _lifecycle.own_regular_file(self.path):
            return region
        with self.lock:
            if self._region is not None:
                return self._region
            try:
                region, hold, created = create_or_attach(
                    self.path, edges(STAGES), env_slots(self.once) or FALLBACK_SLOTS, True
                )
            except (OSError, ValueError) as e:
                self.said.warn("host", "edgemark: cannot create this host's region %s: %s", self.path, e)
                return None
            self.say_pending()
            self.host_hold = hold
            import atexit

            atexit.register(hold.release, created)
            if created:
                log.info("edgemark: recording this host's stages into %s", self.path)
            self._region, self._identity = region, hold.identity
            self._stage_only = True
            self._start_ticker()
            return region

    def _request(self, request_id: str, traceparent: Callable[[], Optional[str]]) -> Optional[StageRequest]:
        req = self.requests.get(request_id)
        if req is not None and (req.token is not None or time.monotonic() < req.checked + RETRY_MISSING_S):
            return req
        region = self.region()
        token = self.lookup(request_id) if region is not None else None
        local = False
        if token is None:
            tp = traceparent()
            if tp is not None and self.stage_only():
                # A stage on a host the API server is not on: a request of
                # this host's own, under the context the request carried.
                region = region or self.host_region()
                if region is not None:
                    token = region.begin(tp, strict=False)
                    local = token is not None
            if token is None:
                self.once.debug("token", "edgemark: no token for request %r, it records nothing here", request_id)
        req = StageRequest(token, time.monotonic(), local=local)
        with self.lock:
            self.requests[request_id] = req
            while len(self.requests) > CACHE:
                _, evicted = self.requests.popitem(last=False)
                if evicted.local and evicted.token is not None and self._region is not None:
                    self._region.close(evicted.token)
        return req

    def _refresh(self, request_id: str, req: StageRequest) -> Optional[StageRequest]:
        """The newer instance under ``request_id`` when ``req``'s request
        is closed, or ``None``. A closed request with no newer instance is
        looked up again at most every ``RETRY_CLOSED_S``."""
        now = time.monotonic()
        if req.local or (req.dead and now < req.checked + RETRY_CLOSED_S):
            return None
        newer = self.lookup(request_id)
        if newer is None or newer == req.token:
            req.dead, req.checked = True, now
            return None
        fresh = StageRequest(newer, now)
        with self.lock:
            self.requests[request_id] = fresh
        return fresh

    def record(
        self,
        request_id: str,
        from_stage: int,
        to_stage: int,
        event: int,
        meaningful: Callable[[], bool],
        chunk_seq: Optional[int] = None,
        traceparent: Callable[[], Optional[str]] = lambda: None,
    ) -> None:
        """Records ``event`` of ``request_id`` on ``from_stage -> to_stage``
        once ``meaningful()`` says the payload counts; at most once per
        process and instance, whatever the outcome."""
        req = self._request(request_id, traceparent)
        if req is None or req.token is None:
            return
        key = (from_stage, to_stage, event)
        if key in req.done:
            return
        if not meaningful():
            return
        region = self._region
        if region is None:
            return
        if region.record(req.token, from_stage, to_stage, event, chunk_seq=chunk_seq) or region.is_open(req.token):
            # Recorded, or refused for good while the request is open (a
            # duplicate from another process, an edge the region lacks).
            req.done.add(key)
            return
        newer = self._refresh(request_id, req)
        if newer is None:
            req.done.add(key)
        elif region.record(newer.token, from_stage, to_stage, event, chunk_seq=chunk_seq) or region.is_open(
            newer.token
        ):
            newer.done.add(key)

    def is_done(self, request_id: Any, key: Tuple[int, int, int]) -> bool:
        """The wrappers' fast path: nothing more to record for ``key``."""
        req = self.requests.get(request_id)
        return req is not None and key in req.done
