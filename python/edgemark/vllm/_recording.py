"""This process's recording state, in one object (``Recording``): the
region, the requests this process began (the API server's ``Owner``), and
what the scheduler and the model worker know of each request of the
prefill -> decode hand-off (``PD``).

Who begins and who closes (see docs/vllm.md):

- the API server that receives a request *begins* it: a prefill request
  (``kv_transfer_params["do_remote_decode"]``) always, under the request's
  ``traceparent``, published in the lookup under its request ID (the
  internal one, with vLLM's random suffix: what the decode side gets as
  ``remote_request_id``); a decode request (``remote_request_id`` set) only
  when the lookup has no open request under that ID (the prefill side is on
  another host, or records into another region): a request of its own, under
  the same ``traceparent``. When the lookup has it, the decode side *joins*
  it instead (a marker beside the entry) and records into the prefill
  side's request;
- the API server that began a request is its closer of last resort, from
  when it sees the request finish (``finished``, ``aborted``): a decode
  request of its own at once; a prefill request once nothing more can come
  (``decide_close``: no emit here, or no send side of its instance left on
  the host, or a joined decode side's first output in), else again after
  each KV lease while its instance's send side lives. The bound on open
  requests (``<PREFIX>_MAX_OPEN_S`` from ``begin``) stays the last resort.
  Where nothing of its instance on the host can record a request (no
  scheduler side, no lookup), the API server begins nothing and says so;
- the request *closes* when nothing more can be recorded for it: on the
  prefill side, after send complete when no decode side joined, or when a
  joined decode side has recorded its first output; when the request was
  not handed over (aborted, or finished with nothing to send); when its KV
  lease expired before a decode side read it (the later events stay
  null). On the decode side: after the first output once send complete is
  in; when the request finishes without a first output; always, for a
  request of its own.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Set

from .. import _lifecycle
from .._edgemark import Token
from .._lifecycle import ACCEPT, EMIT, OUTPUT, SEND, Once, Owner

log = logging.getLogger("edgemark.vllm")

SPEC = _lifecycle.Spec("EDGEMARK_VLLM", "edgemark-vllm-", log, "the P/D hand-off is")

#: Set to ``1`` to record; anything else leaves vLLM untouched.
ENV_ENABLE = SPEC.env
#: The region file. Give both instances of a P/D pair on one host the same
#: path: they record into one region, on one clock. Unset, each server start
#: names its own (``<default dir>/edgemark-vllm-<pid>-<random>.region``),
#: which the processes it starts inherit.
ENV_REGION = SPEC.env_region
#: Requests the region holds open at once (default: four times the
#: instance's ``max_num_seqs`` times its data parallel ranks, at least 256,
#: at most 65536).
ENV_SLOTS = SPEC.env_slots
#: Every request is closed at most this many seconds after it began
#: (default 600), whatever happened to the processes that would close it;
#: counted as ``expired_requests``.
ENV_MAX_OPEN = SPEC.env_max_open

PREFIX = SPEC.file_prefix
#: The edge: the prefill instance is stage 0, the decode instance stage 1.
PREFILL, DECODE = 0, 1
EDGES = [(PREFILL, DECODE)]
MIN_SLOTS, MAX_SLOTS, FALLBACK_SLOTS = 256, 65536, 1024
#: Requests a scheduler or worker process remembers.
CACHE = 4096
RETRY_MISSING_S = 1.0
#: How long after the API server saw a request finish it asks whether the
#: request can still get events (``Recording.decide_close``): what its
#: engine core records comes before the output the API server sees, and a
#: decode side on this host joins as its request arrives.
SETTLE_S = 2.0
#: NixlConnector's KV lease unless its ``kv_connector_extra_config`` says
#: ``kv_lease_duration`` (vLLM's default); a decode side that waits renews
#: it with heartbeats.
LEASE_S = 30.0
#: The parts of this plugin a process announces (``_presence``).
SCHEDULER_PART, SENDER_PART, API_PART = "pd-scheduler", "pd-sender", "pd-api"


def kv_params(request: Any) -> Optional[Dict[str, Any]]:
    """The request's ``kv_transfer_params``: the engine's ``Request``
    attribute, or an ``EngineCoreRequest``'s sampling parameters'."""
    params = getattr(request, "kv_transfer_params", None)
    if params is None:
        sp = getattr(request, "sampling_params", None)
        extra = getattr(sp, "extra_args", None)
        if isinstance(extra, dict):
            params = extra.get("kv_transfer_params")
    return params if isinstance(params, dict) else None


def side_of(params: Optional[Dict[str, Any]]) -> Optional[str]:
    """``"prefill"`` for a request the prefill instance hands over,
    ``"decode"`` for one that takes a prefill instance's KV, else ``None``."""
    if not params:
        return None
    if params.get("do_remote_decode"):
        return "prefill"
    if isinstance(params.get("remote_request_id"), str):
        return "decode"
    return None


def slots_for(vllm_config: Any, once: Once) -> int:
    """The region's slots: ``EDGEMARK_VLLM_SLOTS``, else four times the
    requests the instance runs at once (``max_num_seqs`` times its data
    parallel ranks: every rank's engine runs that many), at least 256, at
    most 65536; 1024 when the configuration does not say."""
    slots = _lifecycle.env_int(ENV_SLOTS, once, 1, MAX_SLOTS)
    if slots is not None:
        return slots
    n = getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", None)
    dp = getattr(getattr(vllm_config, "parallel_config", None), "data_parallel_size", 1)
    if isinstance(n, int) and n > 0:
        ranks = dp if isinstance(dp, int) and dp > 0 else 1
        return min(max(4 * n * ranks, MIN_SLOTS), MAX_SLOTS)
    return FALLBACK_SLOTS


def lease_of(vllm_config: Any) -> float:
    """The instance's KV lease in seconds (``kv_lease_duration`` in its
    ``kv_connector_extra_config``), else ``LEASE_S``."""
    kv = getattr(vllm_config, "kv_transfer_config", None)
    extra = getattr(kv, "kv_connector_extra_config", None)
    value = extra.get("kv_lease_duration") if isinstance(extra, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 86400:
        return float(value)
    return LEASE_S


def connector_name(vllm_config: Any) -> Optional[str]:
    """The KV connector the instance is configured with (its
    ``kv_transfer_config.kv_connector``), ``None`` for none."""
    kv = getattr(vllm_config, "kv_transfer_config", None)
    name = getattr(kv, "kv_connector", None) if kv is not None else None
    return name if isinstance(name, str) and name else None


def follows(connector_class_names: Any) -> bool:
    """Whether the plugin follows a connector with these class names (its
    configured name, or the names of its class and bases): NIXL's, which
    hands the decode side the prefill side's request ID as
    ``remote_request_id``. Connectors with the same hooks but another
    vocabulary (Mooncake keys transfers by ``transfer_id``; LMCache and
    offloading connectors hand nothing between instances) are not."""
    return any(isinstance(n, str) and "Nixl" in n for n in connector_class_names)


@dataclass
class PD:
    """One request of the hand-off as a scheduler or worker process knows
    it."""

    #: ``"prefill"`` or ``"decode"``.
    side: str
    #: The ID the request's token is published under: the prefill side's
    #: request ID, or the decode side's own for a request of its own.
    key: str
    token: Optional[Token]
    #: A decode side recording into the prefill side's request.
    shared: bool
    #: When the lookup was read for it.
    checked: float
    #: The events this process recorded, or will not record.
    done: Set[int] = field(default_factory=set)
    closed: bool = False


class Recording(_lifecycle.Recording):
    """Everything this process records with: one per process, made by the
    instrumentor, handed to every wrapper. The lifecycle (the region, its
    name, hold and bound, the lookup) is ``_lifecycle.Recording``'s."""

    spec = SPEC

    def __init__(self, uninstrument: Callable[[], None] = lambda: None) -> None:
        super().__init__(uninstrument)
        #: The requests this process knows, by its own request ID.
        self.requests: "collections.OrderedDict[str, PD]" = collections.OrderedDict()
        #: Decode-side requests registered and waiting for their first
        #: output, by request ID. Never rebound: the scheduler's per-step wrapper
        #: holds it, and does nothing more while it is empty.
        self.awaiting_output: Dict[str, PD] = {}
        #: The API server's KV connector, when it is not one the plugin
        #: follows: its requests are not begun (nothing would close them).
        self.unfollowed: Optional[str] = None
        #: The parts of ``package.PARTS`` refused in this release, with why:
        #: their wrappers are not made (the instrumentor's dict).
        self.broken: Dict[str, str] = {}
        #: The side of each request this API server began and has not seen
        #: finish, by request ID.
        self.begun: Dict[str, str] = {}
        #: The instance's KV lease (``start``).
        self.lease_s = LEASE_S
        #: This engine core begins its own requests: no API server of its
        #: instance on its host (a headless data parallel node).
        self.begins_own = False

    def _forget_requests(self) -> None:
        with self.lock:
            self.requests.clear()
            self.awaiting_output.clear()

    # -- the API server -----------------------------------------------------

    def start(self, vllm_config: Any) -> Optional[Owner]:
        """What the API server does at start-up: the region, sized from
        ``vllm_config``; a configured connector the plugin does not follow
        (or none) is said once, and no request is begun."""
        name = connector_name(vllm_config)
        if vllm_config is not None and not follows([name]):
            self.unfollowed = name or "(none)"
            self.once.warn(
                "unfollowed",
                "edgemark: this instance's KV connector is %s, not one edgemark follows (NixlConnector): its "
                "requests are not begun and nothing of the P/D hand-off is recorded here",
                self.unfollowed,
            )
            return None
        if vllm_config is not None:
            self.lease_s = lease_of(vllm_config)
            endpoint = getattr(getattr(vllm_config, "observability_config", None), "otlp_traces_endpoint", None)
            self.vllm_traces_endpoint = endpoint if isinstance(endpoint, str) else None
        owner = self.ensure_owner(EDGES, slots_for(vllm_config, self.once))
        if owner is not None:
            # The instance's engine cores on this host leave beginning to it.
            self.announce(API_PART)
        return owner

    def begin(self, request_id: str, params: Optional[Dict[str, Any]], traceparent: Optional[str]) -> Optional[Token]:
        """What the API server does with a request as it arrives: begins a
        prefill request; joins a decode request to the prefill side's open
        request on this host, or begins it as a request of its own. The
        token begun, or ``None``."""
        side = side_of(params)
        if side is None or self.unfollowed is not None:
            return None
        owner = self.ensure_owner(EDGES, slots_for(None, self.once))
        if owner is None:
            return None
        if side == "decode":
            remote = params["remote_request_id"]  # type: ignore[index]
            token = self.read_lookup(remote)
            if token is not None and owner.region.is_open(token):
                self._reader.join(remote)
                return None
        if not self.can_record(owner):
            return None
        token = owner.begin(request_id, traceparent)
        if token is not None:
            self.begun[request_id] = side
        return token

    def can_record(self, owner: Owner) -> bool:
        """Whether a request begun now has someone on this host to record
        and close it: a lookup to publish its token in, and a scheduler side
        of this instance (an engine core whose connector is wrapped). If
        not, said (again while it lasts) and nothing is begun."""
        if owner.writer is None:
            self.said.warn(
                "no-lookup",
                "edgemark: requests arrive but the request lookup %s cannot be written, so no engine core could "
                "record or close them: they are not begun",
                _lifecycle._channel.lookup_dir(self.path),
            )
            return False
        self.said.ended("no-lookup")
        if self.present(SCHEDULER_PART) is False:
            self.said.warn(
                "no-scheduler",
                "edgemark: requests arrive but no engine core of this instance records into %s on this host (its "
                "engines run elsewhere, or their connector is not followed): they are not begun here",
                self.path,
            )
            return False
        self.said.ended("no-scheduler")
        return True

    def finished(self, request_id: str) -> None:
        """The API server saw ``request_id`` finish (its last output): the
        request closes once nothing more can come (``decide_close``)."""
        side = self.begun.pop(request_id, None)
        owner = self.owner
        if side is None or owner is None:
            return
        token = owner.tokens.get(request_id)
        if token is None:
            return
        now = time.monotonic()
        owner.close_at(request_id, token, now if side == "decode" else now + SETTLE_S, now)

    def aborted(self, request_ids: Any) -> None:
        """The API server aborted these requests before they finished:
        nothing is handed over, they close."""
        owner = self.owner
        if owner is None:
            return
        now = time.monotonic()
        for rid in request_ids:
            if self.begun.pop(rid, None) is None:
                continue
            token = owner.tokens.get(rid)
            if token is not None:
                owner.close_at(rid, token, now, now)

    def decide_close(self, request_id: str, token: Token, finished: float) -> Optional[float]:
        """A request this API server saw finish, ``SETTLE_S`` on (a prefill
        request; a decode request of its own closes at once): closed when no
        more can come, else asked again later.

        - a decode side on this host joined it: closed once that side's
          first output is in and no send complete can come here (no emit
          was recorded here, or no send side of this instance is left on
          the host); else asked again (the joined side or the send side
          closes it, the bound as the last resort);
        - else, no emit recorded here (its blocks were not kept for a
          decode side by this host's engines: not handed over, or
          prefilled on another node): closed;
        - else closed when no send side of this instance is left on the host
          (no send complete can come); while one lives, asked again after
          each KV lease (a waiting decode side renews it; the lease's
          expiry closes it in the worker).
        """
        owner = self.owner
        if owner is None:
            return None
        region = owner.region
        emit = region.recorded(token, PREFILL, DECODE, EMIT)
        # Without an emit here no send complete can come here.
        sender = self.present(SENDER_PART) if emit else False
        if sender is None:
            # Not told yet (the instance's processes are still announcing).
            return time.monotonic() + SETTLE_S
        if self.joined(request_id):
            if not sender and region.recorded(token, PREFILL, DECODE, OUTPUT):
                return None
            return time.monotonic() + (self.lease_s if sender else SETTLE_S)
        if not sender:
            return None
        return time.monotonic() + self.lease_s + SETTLE_S

    def forget_all(self) -> None:
        self._forget_requests()
        self.begun.clear()

    def tick(self) -> None:
        super().tick()
        # Requests closed by others (their engines), or never seen to finish
        # here: forgotten with their tokens.
        owner = self.owner
        if owner is not None and self.begun:
            for rid in [r for r in self.begun if r not in owner.tokens]:
                self.begun.pop(rid, None)

    def abandon(self, request_id: str, token: Token) -> None:
        """Closes a request the API server began that never reached the
        engine (``add_request`` raised)."""
        owner = self.owner
        if owner is not None:
            owner.close(request_id, token)

    # -- the engine core and the worker --------------------------------------

    def joined(self, request_id: str) -> bool:
        """Whether a decode side joined the request published under
        ``request_id`` (``Reader.join``)."""
        if self._reader_ok is None:
            self.read_lookup(request_id)
        return bool(self._reader_ok) and self._reader.joined(request_id)

    def _remember(self, request_id: str, pd: PD) -> PD:
        with self.lock:
            self.requests[request_id] = pd
            self.requests.move_to_end(request_id)
            while len(self.requests) > CACHE:
                self.requests.popitem(last=False)
        return pd

    def pd_of(self, request: Any) -> Optional[PD]:
        """The hand-off state of the engine's ``request`` (a prefill or a
        decode request), its token looked up once (again after
        ``RETRY_MISSING_S`` while there is none); ``None`` for a request that
        is neither."""
        rid = getattr(request, "request_id", None)
        if not isinstance(rid, str):
            return None
        pd = self.requests.get(rid)
        if pd is not None and (pd.token is not None or time.monotonic() < pd.checked + RETRY_MISSING_S):
            return pd
        params = kv_params(request)
        side = side_of(params)
        if side is None:
            return None
        token, key, shared = None, rid, False
        region = self.region()
        if region is not None:
            # A request of its own, which the API server began when it found
            # no open prefill request to join, comes first; else the prefill
            # side's request, while it is open (an entry whose request closed,
            # its lease expired, stays in the lookup until its owner sweeps).
            token = self.lookup(rid)
            if token is None and side == "decode":
                remote = params["remote_request_id"]  # type: ignore[index]
                found = self.lookup(remote)
                if found is not None and region.is_open(found):
                    token, key, shared = found, remote, True
        if token is None and self.no_api_server(region):
            token = self.begin_own(rid, side, request)
        if token is None:
            self.once.debug("token", "edgemark: no token for request %r, it records nothing here", rid)
        pd = self._remember(rid, PD(side, key, token, shared, time.monotonic()))
        if side == "decode" and token is not None:
            # Watched for its first token from now on, whether or not its KV
            # load is ever reported (nothing to load, a local recompute).
            self.awaiting_output[rid] = pd
        return pd

    def no_api_server(self, region: Any) -> bool:
        """Whether this engine core has no API server of its instance on its
        host to begin its requests (a headless data parallel node, whose
        API server runs on another node): no region file at all, or one
        that no API server of the instance announces itself in."""
        if self.begins_own:
            return True
        if self.owner is not None:
            return False  # the API server's own process: it began what it could
        return region is None or self.checker.present(API_PART, self.instance) is False

    def begin_own(self, request_id: str, side: str, request: Any) -> Optional[Token]:
        """Begins ``request`` here, in this host's region (made if it is not
        there), as an API server would: under the trace context vLLM
        carries in ``trace_headers`` (when its own tracing is on), else one
        of its own. Closed as an API server's (``decide_close``), from the
        engine's own view of the request's end."""
        owner = self.ensure_owner(EDGES, slots_for(None, self.once))
        if owner is None or not self.can_record(owner):
            return None
        if not self.begins_own:
            self.begins_own = True
            self.log.warning(
                "edgemark: no API server of this instance records on this host (a headless node): this engine core "
                "begins and closes its requests in %s itself; their traces join the API server's only where vLLM "
                "carries trace headers (its --otlp-traces-endpoint)",
                self.path,
            )
        token = owner.begin(request_id, _lifecycle.traceparent_in(getattr(request, "trace_headers", None)))
        if token is not None:
            self.begun[request_id] = side
        return token

    def pd_of_sent(self, request_id: str) -> Optional[PD]:
        """The state of a request a worker reports sent (a prefill request,
        its token looked up by its own ID): a worker has only the ID."""
        pd = self.requests.get(request_id)
        if pd is not None and (pd.token is not None or time.monotonic() < pd.checked + RETRY_MISSING_S):
            return pd
        token = self.lookup(request_id) if self.region() is not None else None
        return self._remember(request_id, PD("prefill", request_id, token, False, time.monotonic()))

    def record(self, pd: PD, event: int) -> bool:
        """Records ``event`` of ``pd`` now, at most once per process and
        request; ``True`` if this call recorded it."""
        if event in pd.done or pd.token is None or pd.closed:
            return False
        region = self.region()
        if region is None:
            return False
        # Recorded, or refused for good (recorded by another process, the
        # request closed): either way this process is done with it.
        pd.done.add(event)
        return region.record(pd.token, PREFILL, DECODE, event)

    def has(self, pd: PD, event: int) -> bool:
        """Whether ``event`` is in ``pd``'s request (recorded by any process)."""
        region = self._region if self.owner is None else self.owner.region
        if region is None or pd.token is None:
            return False
        # Fenced: this process's record, then this read, against the other
        # side's record, then its read: at least one side sees both and
        # closes (docs/vllm.md, "Who closes").
        return region.recorded(pd.token, PREFILL, DECODE, event)

    def close(self, pd: PD) -> None:
        """Closes ``pd``'s request (idempotent; a token already closed, by
        this process or another, closes nothing)."""
        if pd.closed or pd.token is None:
            return
        pd.closed = True
        region = self._region if self.owner is None else self.owner.region
        if region is not None:
            region.close(pd.token)

    def forget(self, request_id: str) -> None:
        with self.lock:
            self.requests.pop(request_id, None)
            self.awaiting_output.pop(request_id, None)

    # -- what each side does when -------------------------------------------

    def handed_over(self, request: Any, delay_free: Any, params: Any) -> None:
        """The prefill scheduler finished ``request``: emit when the
        connector keeps its blocks for a decode side (``delay_free`` with
        parameters to hand on); a request not handed over closes. The decode
        scheduler finished ``request``: closes it unless a joined request
        still waits for the prefill side's send complete."""
        pd = self.pd_of(request)
        if pd is None:
            return
        rid = request.request_id
        if pd.side == "prefill":
            if delay_free and params:
                self.record(pd, EMIT)
                if self.begins_own:
                    # Finished here, as its API server would have seen it.
                    self.finished(rid)
            else:
                self.close(pd)
                self.forget(rid)
            return
        self.awaiting_output.pop(rid, None)
        if not pd.shared or not self.has(pd, OUTPUT) or self.has(pd, SEND):
            self.close(pd)
        self.forget(rid)

    def sent(self, request_id: str) -> None:
        """A worker saw the decode side finish reading ``request_id``'s KV
        (send complete); the request closes unless a joined decode side
        has not recorded its first output yet."""
        pd = self.pd_of_sent(request_id)
        if pd is None or pd.token is None:
            return
        self.record(pd, SEND)
        if not self.joined(pd.key) or self.has(pd, OUTPUT):
            self.close(pd)
            self.forget(request_id)

    def expired(self, request_id: str) -> None:
        """A worker released ``request_id``'s blocks with no decode side
        having read them (its lease expired): the request closes, the later
        events null."""
        pd = self.pd_of_sent(request_id)
        if pd is not None:
            self.close(pd)
        self.forget(request_id)

    def accepted(self, request_id: str) -> None:
        """The decode side's KV for ``request_id`` is loaded (a request the
        scheduler registered in this process)."""
        pd = self.requests.get(request_id)
        if pd is None or pd.side != "decode" or pd.token is None:
            return
        self.record(pd, ACCEPT)

    def first_output(self, model_runner_output: Any) -> None:
        """The scheduler's step output: the first token of each request
        waiting for one. ``req_ids`` and ``sampled_token_ids`` line up by
        position in every release; where the output still carries
        ``req_id_to_index`` (up to 0.33) only the waiting requests are
        looked up, else (0.34 on) the step's IDs are walked once, as the
        scheduler itself does."""
        awaiting = self.awaiting_output
        sampled = model_runner_output.sampled_token_ids
        index = getattr(model_runner_output, "req_id_to_index", None)
        if isinstance(index, dict):
            found = [(index.get(rid), rid) for rid in awaiting]
        else:
            # Intersected in C, then only what is found is searched for.
            ids = model_runner_output.req_ids
            found = [(ids.index(rid), rid) for rid in awaiting.keys() & ids]
        for i, rid in found:
            pd = awaiting.get(rid)
            if pd is None or i is None or i >= len(sampled) or len(sampled[i]) == 0:
                continue
            awaiting.pop(rid, None)
            self.record(pd, OUTPUT)
            if pd.shared and self.has(pd, SEND):
                self.close(pd)


__all__ = [
    "ACCEPT",
    "EMIT",
    "ENV_ENABLE",
    "ENV_MAX_OPEN",
    "ENV_REGION",
    "ENV_SLOTS",
    "OUTPUT",
    "PD",
    "Recording",
    "SEND",
    "kv_params",
    "log",
    "side_of",
]
