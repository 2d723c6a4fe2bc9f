"""This process's recording state, in one object (``Recording``): the
region, the requests this process began (``Owner``, in the API server, and
host-local requests on a stage's own host), and what a stage process knows
of each request instance."""

from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from .. import _channel, _plugin_common
from .._edgemark import Region, Token
from .._plugin_common import ACCEPT, EMIT, OUTPUT, SEND, Owner, create_or_attach, own_regular_file, remove_files, say

log = logging.getLogger("edgemark.vllm_omni")

__all__ = ["ACCEPT", "EMIT", "OUTPUT", "SEND", "Owner", "Recording", "StageRequest", "Once", "log"]

#: Set to ``1`` to record; anything else leaves vLLM-Omni untouched.
ENV_ENABLE = "EDGEMARK_VLLM_OMNI"
#: The region file of this host. The API-server process sets it when it
#: loads the plugin (before it starts the stage processes, which inherit
#: it); set it yourself to choose the file (on a host that runs stages only,
#: set it for ``edgemark export`` to find the region).
ENV_REGION = "EDGEMARK_VLLM_OMNI_REGION"
#: Requests the region holds open at once; by default sized from the
#: stages' ``max_num_seqs`` (four times their sum, at least 256, at most
#: 65536).
ENV_SLOTS = "EDGEMARK_VLLM_OMNI_SLOTS"
#: Set to ``1`` for one INFO line per closed request in the API server's
#: log: its request ID, its trace ID, and its final ``stream_edge_metrics``
#: (how a user of the HTTP endpoints, whose responses do not carry it,
#: finds one request's snapshot and its trace).
ENV_LOG_REQUESTS = "EDGEMARK_VLLM_OMNI_LOG_REQUESTS"

PREFIX = "edgemark-vllm-omni-"
STAGES = 8
MIN_SLOTS, MAX_SLOTS, FALLBACK_SLOTS = 256, 65536, 1024
#: Request instances a stage process remembers.
CACHE = 4096
RETRY_ATTACH_S = 2.0
RETRY_MISSING_S = 1.0
RETRY_CLOSED_S = 0.05


class Once(_plugin_common.Once):
    """Log lines said once per process, on this plugin's logger."""

    def __init__(self) -> None:
        super().__init__(log)


def edges(stages: int) -> List[Tuple[int, int]]:
    """The directed edges a region declares for ``stages`` stages."""
    if stages <= STAGES:
        return [(a, b) for a in range(stages) for b in range(stages) if a != b]
    forward = [(a, b) for a in range(stages) for b in range(a + 1, stages)]
    return forward if len(forward) <= 64 else [(a, a + 1) for a in range(min(stages - 1, 64))]


def env_slots(once: Once) -> Optional[int]:
    return _plugin_common.env_int(ENV_SLOTS, once, 1, MAX_SLOTS)


def slots_for(pools: List[Any], once: Once) -> int:
    """Requests the region holds open at once for these stage pools:
    ``EDGEMARK_VLLM_OMNI_SLOTS``, else four times the sum of the stages'
    ``max_num_seqs`` (at least 256, at most 65536), else 1024."""
    slots = env_slots(once)
    if slots is not None:
        return slots
    total = 0
    for pool in pools:
        cfg = getattr(pool, "stage_vllm_config", None)
        n = getattr(getattr(cfg, "scheduler_config", None), "max_num_seqs", None)
        if isinstance(n, int) and n > 0:
            total += n
    return min(max(4 * total, MIN_SLOTS), MAX_SLOTS) if total else FALLBACK_SLOTS


def region_path() -> Tuple[str, bool]:
    """This host's region file, and whether the user named it. The first
    process that loads the plugin (the API server) names it when nobody did;
    the stage processes it starts inherit the name."""
    return _plugin_common.region_path(ENV_REGION, PREFIX, "_EDGEMARK_VLLM_OMNI_NAMED")


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


class Recording:
    """Everything this process records with: one per process, made by the
    instrumentor, handed to every wrapper."""

    def __init__(self, uninstrument: Callable[[], None] = lambda: None) -> None:
        self.once = Once()
        self.path, self.user_named = region_path()
        self.owner: Optional[Owner] = None
        self._region: Optional[Region] = None
        self._next_attach = 0.0
        self._reader = _channel.Reader(_channel.lookup_dir(self.path))
        self._reader_ok: Optional[bool] = None
        #: The request instances this process knows, by request ID. Never
        #: rebound: the wrappers hold it for their fast path.
        self.requests: "collections.OrderedDict[str, StageRequest]" = collections.OrderedDict()
        self.lock = threading.Lock()
        #: Puts every call site back (the instrumentor's): when this host's
        #: region cannot be made, nothing stays patched.
        self.uninstrument = uninstrument
        #: This process could not create its region as the API server.
        self.failed = False
        #: The process's INFO line, while the logging it goes to is not set
        #: up yet (``say``).
        self._pending: Optional[str] = None

    def say(self, message: str) -> None:
        """Says ``message`` (this process's one INFO line) now if vLLM's
        logging is set up, else when the process first uses its region (the
        API server loads its plugins before it configures logging, and a
        line said then would be lost)."""
        if not say(log, message):
            self._pending = message

    def say_pending(self) -> None:
        message, self._pending = self._pending, None
        if message is not None:
            log.info("%s", message)

    # -- the API server -----------------------------------------------------

    def start_owner(self, stages: int, slots: int) -> Owner:
        """Creates this host's region as the API server (``OSError`` or
        ``ValueError`` if it cannot)."""
        with self.lock:
            if self.owner is None:
                self.owner = Owner(
                    self.path,
                    edges(stages),
                    slots,
                    self.user_named,
                    self.once,
                    log,
                    os.environ.get(ENV_LOG_REQUESTS) == "1",
                )
                self.say_pending()
            return self.owner

    def ensure_owner(self, stages: int, slots: int) -> Optional[Owner]:
        """This host's region as the API server, created on first use. If
        it cannot be created (``/dev/shm`` too small for it, a file in the
        way), says so once and puts every call site back: the server
        serves, unrecorded."""
        owner = self.owner
        if owner is not None or self.failed:
            return owner
        try:
            return self.start_owner(stages, slots)
        except (OSError, ValueError) as e:
            self.failed = True
            self.once.warn(
                "create",
                "edgemark: cannot create the region %s, nothing is patched and stream-edge events are not "
                "recorded: %s",
                self.path,
                e,
            )
            self.uninstrument()
            return None

    def begin(self, request_id: str, traceparent: Optional[str] = None) -> Optional[Token]:
        """Begins ``request_id`` as the API server (creating the region on
        first use); ``None`` if it runs unrecorded."""
        owner = self.ensure_owner(STAGES, env_slots(self.once) or FALLBACK_SLOTS)
        return owner.begin(request_id, traceparent, self.once) if owner is not None else None

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
        owner.begin(request_id, traceparent, self.once)

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

    def region(self, create: bool = False) -> Optional[Region]:
        """This host's region: the API server's own, or attached by path
        (retried every ``RETRY_ATTACH_S``); with ``create``, created here
        when no process on this host made it (a host that runs stages only)."""
        region = self._region
        if region is not None:
            return region
        owner = self.owner
        if owner is not None:
            self._region = owner.region
            return owner.region
        now = time.monotonic()
        if now < self._next_attach and not create:
            return None
        self._next_attach = now + RETRY_ATTACH_S
        try:
            if not own_regular_file(self.path):
                raise FileNotFoundError(f"no region file of this user's at {self.path}")
            self._region = Region.attach(self.path)
            self.say_pending()
        except (OSError, ValueError) as e:
            if create and isinstance(e, FileNotFoundError):
                return self._create_host_region()
            self.once.debug("attach", "edgemark: no region at %s, this process records nothing yet: %s", self.path, e)
            return None
        return self._region

    def _create_host_region(self) -> Optional[Region]:
        with self.lock:
            if self._region is not None:
                return self._region
            try:
                region, created = create_or_attach(
                    self.path, edges(STAGES), env_slots(self.once) or FALLBACK_SLOTS, True
                )
            except (OSError, ValueError) as e:
                self.once.warn("host", "edgemark: cannot create this host's region %s: %s", self.path, e)
                return None
            self.say_pending()
            if created:
                atexit.register(remove_files, self.path, os.getpid(), None)
                log.info("edgemark: recording this host's stages into %s", self.path)
            self._region = region
            return region

    def _lookup(self, request_id: str) -> Optional[Token]:
        owner = self.owner
        if owner is not None:
            return owner.tokens.get(request_id)
        if self._reader_ok is None:
            try:
                self._reader.open()
                self._reader_ok = True
            except FileNotFoundError:
                return None
            except OSError as e:
                self._reader_ok = False
                self.once.warn("lookup", "edgemark: the request lookup cannot be trusted, it is not read: %s", e)
        return self._reader.read(request_id) if self._reader_ok else None

    def _request(self, request_id: str, traceparent: Callable[[], Optional[str]]) -> Optional[StageRequest]:
        req = self.requests.get(request_id)
        if req is not None and (req.token is not None or time.monotonic() < req.checked + RETRY_MISSING_S):
            return req
        region = self.region()
        token = self._lookup(request_id) if region is not None else None
        local = False
        if token is None:
            tp = traceparent()
            if tp is not None and self.owner is None:
                # A stage on a host the API server is not on: a request of
                # this host's own, under the context the request carried.
                region = region or self.region(create=True)
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
        newer = self._lookup(request_id)
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
