"""Records vLLM-Omni's stream-edge events into an edgemark region, with no
change to vLLM-Omni's code.

Install ``edgemark[vllm-omni]`` and set ``EDGEMARK_VLLM_OMNI=1``: vLLM-Omni
loads this module's ``register`` in every one of its processes (its
``vllm_omni.general_plugins`` entry point group), and ``register`` wraps the
call sites below. Every response then carries
``metrics["stream_edge_metrics"]``, the upstream stream-edge dict.

Where each event is observed:

=====================================  ==========================================================
call site (vLLM-Omni 0.30)             what the wrapper records
=====================================  ==========================================================
``ClientRequestState.__init__``        API server: begins the request (``Region.begin``) and
                                       publishes its token under the request ID
``_enqueue_chunk_payload``             producer stage: ``producer_first_nonempty_emit`` (before
                                       the payload is queued), with the chunk sequence
``send_full_payload_outputs``          producer stage, full-payload mode: the same event
``_send_single_request``               producer's send thread: ``edge_first_send_complete``
                                       after ``connector.put`` succeeded (a failed put records
                                       nothing)
``_poll_single_request``               consumer's receive thread: ``consumer_first_accept`` after
                                       the payload was admitted (with the payload the
                                       ``_recv_*_result`` helpers returned)
``cleanup_finished_request``           every stage: forgets the freed request in that process
``OrchestratorBase.__init__``          API server: creates the region, sized from the stages
``OrchestratorBase._route_output``     API server: ``consumer_first_nonempty_output`` of the edge
                                       into the stage that produced a non-empty output
``_forward_to_next_stage_unguarded``   API server: emit and send complete (once vLLM-Omni
                                       stamped the submission) of a hand-off that the
                                       orchestrator makes itself (first write wins)
``OmniBase._process_single_result``    API server: puts the snapshot into the response metrics
``OmniBase._log_summary_and_cleanup``, API server: closes the request; the final snapshot is
``Omni.abort``                         left on the request state as ``stream_edge_metrics``
=====================================  ==========================================================

The token reaches the stage processes through a lookup keyed by vLLM-Omni's
external request ID (the ID its connectors key payloads with): the API server
writes one small file per open request into a directory beside the region,
and removes it at close. A stage process reads it once per request instance
and caches it; a record refused because the token's request is closed makes
it read the file again, so a request ID reused by a later request instance
records into the new instance and never into the old one. See
docs/vllm-omni.md for why this channel and not another.

Nothing here ever raises into vLLM-Omni: a wrapper that fails records
nothing and calls through; vLLM-Omni's own exceptions pass unchanged.
Outside the supported versions, or when a wrapped attribute is missing or
has another signature, ``instrument`` logs one warning and patches nothing.
"""

from __future__ import annotations

import atexit
import collections
import hashlib
import inspect
import logging
import os
import re
import shutil
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._edgemark import Region, Token, default_dir

__all__ = [
    "ENV_ENABLE",
    "ENV_REGION",
    "ENV_SLOTS",
    "SUPPORTED",
    "clean",
    "instrument",
    "is_instrumented",
    "register",
    "uninstrument",
]

_log = logging.getLogger("edgemark.vllm_omni")

#: Set to ``1`` to record; anything else leaves vLLM-Omni untouched.
ENV_ENABLE = "EDGEMARK_VLLM_OMNI"
#: The region file of this deployment. The API-server process sets it when it
#: loads the plugin (before it starts the stage processes, which inherit it);
#: set it yourself to choose the file.
ENV_REGION = "EDGEMARK_VLLM_OMNI_REGION"
#: Requests the region holds open at once; by default sized from the stages'
#: ``max_num_seqs`` (four times their sum, at least 256, at most 65536).
ENV_SLOTS = "EDGEMARK_VLLM_OMNI_SLOTS"
#: The vLLM-Omni versions this plugin wraps: ``(lowest, first unsupported)``.
SUPPORTED: Tuple[Tuple[int, int], Tuple[int, int]] = ((0, 30), (0, 31))
_SUPPORTED_TEXT = "vllm-omni >= 0.30, < 0.31"

_PREFIX = "edgemark-vllm-omni-"
_STAGES = 8
_MIN_SLOTS, _MAX_SLOTS, _FALLBACK_SLOTS = 256, 65536, 1024
_CACHE = 4096
_RETRY_ATTACH_S = 2.0
_RETRY_MISSING_S = 1.0
_RETRY_CLOSED_S = 0.05

_EMIT = 0  # producer_first_nonempty_emit
_SEND = 1  # edge_first_send_complete
_ACCEPT = 2  # consumer_first_accept
_OUTPUT = 3  # consumer_first_nonempty_output


def register() -> None:
    """The ``vllm_omni.general_plugins`` entry point: ``instrument()`` when
    ``EDGEMARK_VLLM_OMNI=1``, else nothing. Never raises."""
    try:
        if os.environ.get(ENV_ENABLE) == "1":
            instrument()
    except Exception as e:  # noqa: BLE001 - a plugin must not stop vLLM-Omni
        _log.warning("edgemark: the vLLM-Omni plugin did not load: %s", e)


# ---------------------------------------------------------------------------
# Where the token lives: the region and the lookup beside it.


def _lookup_dir(region_path: str) -> str:
    base = region_path[: -len(".region")] if region_path.endswith(".region") else region_path
    return base + ".requests"


def _entry_name(request_id: str) -> str:
    return hashlib.blake2b(request_id.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _read_entry(directory: str, request_id: str) -> Optional[Token]:
    try:
        with open(os.path.join(directory, _entry_name(request_id)), "rb") as f:
            data = f.read(4096)
    except OSError:
        return None
    token, _, rid = data.partition(b"\n")
    if rid.decode("utf-8", "surrogatepass") != request_id:
        return None
    try:
        return Token(token.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        return None


class _Owner:
    """The API-server side: the region this process created, and the token
    of each open request under its request ID."""

    def __init__(self, path: str, stages: int, slots: int) -> None:
        self.path = path
        self.dir = _lookup_dir(path)
        self.pid = os.getpid()
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        try:
            self.region = Region.create(path, edges=_edges(stages), slots=slots)
        except FileExistsError:
            # A region the deployment created and named in EDGEMARK_VLLM_OMNI_REGION:
            # recorded into, and left in place at exit.
            self.region = Region.attach(path)
        else:
            atexit.register(_remove_region, path, self.dir, self.pid)
        self.tokens: Dict[str, Token] = {}
        self.lock = threading.Lock()

    def begin(self, request_id: str) -> Optional[Token]:
        token = self.region.begin()
        if token is None:
            _warn_once("full", "edgemark: the region is full, a request runs unrecorded")
            return None
        name = _entry_name(request_id)
        tmp = os.path.join(self.dir, f".{name}.{threading.get_ident()}")
        with open(tmp, "wb") as f:
            f.write(str(token).encode("ascii") + b"\n" + request_id.encode("utf-8", "surrogatepass"))
        os.replace(tmp, os.path.join(self.dir, name))
        with self.lock:
            old = self.tokens.pop(request_id, None)
            self.tokens[request_id] = token
        if old is not None:
            # vLLM-Omni reused an ID whose earlier instance never closed.
            self.region.close(old)
        return token

    def close(self, request_id: str, token: Token) -> Dict[str, Any]:
        with self.lock:
            if self.tokens.get(request_id) == token:
                del self.tokens[request_id]
                try:
                    os.unlink(os.path.join(self.dir, _entry_name(request_id)))
                except OSError:
                    pass
        rec = _recorder
        if rec is not None:
            # What this process recorded for the instance (the consumer's
            # output) is done with it: a later instance starts afresh.
            with rec.lock:
                rec.requests.pop(request_id, None)
        final = self.region.close(token)
        return final if final is not None else {}


def _edges(stages: int) -> List[Tuple[int, int]]:
    if stages <= _STAGES:
        return [(a, b) for a in range(stages) for b in range(stages) if a != b]
    forward = [(a, b) for a in range(stages) for b in range(a + 1, stages)]
    return forward if len(forward) <= 64 else [(a, a + 1) for a in range(min(stages - 1, 64))]


def _remove_region(path: str, directory: str, creator: int) -> None:
    # A forked child inherits the hook: only the creator removes its files.
    if os.getpid() == creator:
        try:
            os.unlink(path)
        except OSError:
            pass
        shutil.rmtree(directory, ignore_errors=True)


@dataclass
class _Request:
    """One request instance as a stage process knows it."""

    token: Optional[Token]
    #: When the lookup was last read for it.
    checked: float
    #: (from, to, event) that need no more records from this process.
    done: set
    #: Closed, and no newer instance was found at ``checked``.
    dead: bool = False


class _Recorder:
    """The stage side, in every process: attaches the region by path once,
    finds a request's token by its ID, and records each event once."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.dir = _lookup_dir(path)
        self.region: Optional[Region] = None
        self.next_attach = 0.0
        # The module's cache: the wrappers' fast paths read it directly.
        self.requests = _requests
        self.lock = threading.Lock()

    def _region(self) -> Optional[Region]:
        region = self.region
        if region is not None:
            return region
        owner = _owner
        if owner is not None and owner.path == self.path:
            self.region = owner.region
            return owner.region
        now = time.monotonic()
        if now < self.next_attach:
            return None
        self.next_attach = now + _RETRY_ATTACH_S
        try:
            self.region = Region.attach(self.path)
        except (OSError, ValueError) as e:
            _debug_once("attach", "edgemark: no region at %s, this process records nothing yet: %s", self.path, e)
            return None
        return self.region

    def _lookup(self, request_id: str) -> Optional[Token]:
        owner = _owner
        if owner is not None and owner.path == self.path:
            return owner.tokens.get(request_id)
        return _read_entry(self.dir, request_id)

    def _request(self, request_id: str) -> _Request:
        req = self.requests.get(request_id)
        if req is not None and (req.token is not None or time.monotonic() < req.checked + _RETRY_MISSING_S):
            return req
        token = self._lookup(request_id)
        if token is None:
            _debug_once("token", "edgemark: no token for request %r, it records nothing here", request_id)
        req = _Request(token, time.monotonic(), set())
        with self.lock:
            self.requests[request_id] = req
            while len(self.requests) > _CACHE:
                self.requests.popitem(last=False)
        return req

    def _refresh(self, request_id: str, req: _Request) -> Optional[_Request]:
        """The newer instance under ``request_id`` when ``req``'s request
        is closed, or ``None``. A closed request with no newer instance is
        looked up again at most every ``_RETRY_CLOSED_S``."""
        now = time.monotonic()
        if req.dead and now < req.checked + _RETRY_CLOSED_S:
            return None
        newer = self._lookup(request_id)
        if newer is None or newer == req.token:
            req.dead, req.checked = True, now
            return None
        fresh = _Request(newer, now, set())
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
    ) -> None:
        region = self._region()
        if region is None:
            return
        req = self._request(request_id)
        if req.token is None:
            return
        key = (from_stage, to_stage, event)
        if key in req.done:
            return
        if not meaningful():
            return
        if region.record(req.token, from_stage, to_stage, event, chunk_seq=chunk_seq) or region.is_open(req.token):
            # Recorded, or refused for good while the request is open (a
            # duplicate from another process, an edge the region lacks).
            req.done.add(key)
            return
        newer = self._refresh(request_id, req)
        if newer is None:
            req.done.add(key)
        elif region.record(newer.token, from_stage, to_stage, event, chunk_seq=chunk_seq) or region.is_open(newer.token):
            newer.done.add(key)


_owner: Optional[_Owner] = None
_recorder: Optional[_Recorder] = None
#: The request instances this process knows, by request ID (``_Recorder``).
_requests: "collections.OrderedDict[str, _Request]" = collections.OrderedDict()
_state_lock = threading.Lock()
_said: set = set()


def _warn_once(what: str, msg: str, *args: Any) -> None:
    if what not in _said:
        _said.add(what)
        _log.warning(msg, *args)


def _debug_once(what: str, msg: str, *args: Any) -> None:
    if what not in _said:
        _said.add(what)
        _log.debug(msg, *args)


def _region_path() -> str:
    path = os.environ.get(ENV_REGION)
    if not path:
        # The first process that loads the plugin (the API server) names the
        # region; the stage processes it starts inherit the name.
        path = os.path.join(default_dir(), f"{_PREFIX}{os.getpid()}.region")
        os.environ[ENV_REGION] = path
    return path


def _get_recorder() -> _Recorder:
    global _recorder
    rec = _recorder
    if rec is None:
        with _state_lock:
            if _recorder is None:
                _recorder = _Recorder(_region_path())
            rec = _recorder
    return rec


def _get_owner(stages: int = _STAGES, slots: Optional[int] = None) -> Optional[_Owner]:
    """The region this API-server process owns, created on first use."""
    global _owner
    owner = _owner
    if owner is not None:
        return owner
    with _state_lock:
        if _owner is None:
            path = _region_path()
            try:
                _owner = _Owner(path, stages, slots or _env_slots() or _FALLBACK_SLOTS)
            except (OSError, ValueError) as e:
                _warn_once("create", "edgemark: cannot create the region %s, stream-edge metrics are off: %s", path, e)
                return None
            _log.info("edgemark: recording stream-edge events into %s", path)
        return _owner


def _env_slots() -> Optional[int]:
    v = os.environ.get(ENV_SLOTS)
    if not v:
        return None
    try:
        n = int(v)
    except ValueError:
        _warn_once("slots", "edgemark: %s=%r is not a number, using the default", ENV_SLOTS, v)
        return None
    return min(max(n, 1), _MAX_SLOTS)


# ---------------------------------------------------------------------------
# What the wrappers read off vLLM-Omni's objects.


def _has_content(value: Any) -> bool:
    if value is None:
        return False
    numel = getattr(value, "numel", None)
    if callable(numel):
        return numel() > 0
    if isinstance(value, (list, tuple, dict, set, str, bytes)):
        return len(value) > 0
    return True


def _payload_meaningful(host: Any, payload: Any) -> bool:
    """A payload the consumer can act on, by vLLM-Omni's own helper: an empty
    terminal marker or a metadata-only wake-up is not meaningful."""
    if isinstance(payload, dict):
        return bool(host._payload_is_consumable(payload))
    return payload is not None


def _output_has_content(output: Any) -> bool:
    mm = getattr(output, "multimodal_output", None)
    if isinstance(mm, dict):
        if any(_has_content(v) for v in mm.values()):
            return True
    elif _has_content(mm):
        return True
    for completion in getattr(output, "outputs", None) or ():
        if _has_content(getattr(completion, "token_ids", None)) or _has_content(getattr(completion, "text", None)):
            return True
    return False


def _stage(value: Any) -> Optional[int]:
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if n >= 0 else None


def _put_key_request(put_key: Any) -> Optional[str]:
    # vLLM-Omni keys a payload "<external request id>_<stage>_<chunk>".
    if not isinstance(put_key, str):
        return None
    parts = put_key.rsplit("_", 2)
    return parts[0] if len(parts) == 3 else None


# ---------------------------------------------------------------------------
# The wrappers. Each calls through exactly once, whatever happens in its own
# code, and passes vLLM-Omni's return value and exceptions on unchanged.
#
# The three that run for every chunk start with a fast path: once a runner
# has recorded (or given up on) its event of a request, the request's ID is
# in a set on the runner (``_edgemark_emitted``, ``_sent``, ``_accepted``),
# and the wrapper costs one membership test and the call through. The sets
# hold vLLM-Omni's own ID for the call (the fast path resolves nothing);
# ``cleanup_finished_request`` empties them of a freed request.


def _mark_done(host: Any, attr: str, request_id: Any, key: Tuple[int, int, int]) -> None:
    """Remembers on the runner that its event ``key`` of ``request_id`` needs
    nothing more, once the recorder says so: the fast path's set."""
    req = _requests.get(request_id)
    if req is None or key not in req.done:
        return
    done = host.__dict__.get(attr)
    if done is None or len(done) >= _CACHE:
        done = host.__dict__[attr] = set()
    done.add(request_id)


def _wrap_enqueue(orig: Callable) -> Callable:
    def _enqueue_chunk_payload(self, request, payload_data, *, wait_for_delivery=False):
        try:
            if request.request_id in self._edgemark_emitted:
                return orig(self, request, payload_data, wait_for_delivery=wait_for_delivery)
        except Exception:  # noqa: BLE001 - then take the recording path
            pass
        try:
            _record_emit(self, request, payload_data)
        except Exception as e:  # noqa: BLE001
            _debug_once("w-emit", "edgemark: producer emit not recorded: %r", e)
        return orig(self, request, payload_data, wait_for_delivery=wait_for_delivery)

    return _enqueue_chunk_payload


def _record_emit(host: Any, request: Any, payload: Any) -> None:
    # The external request ID, as vLLM-Omni's `_resolve_external_req_id`
    # resolves it (its mapping, the request's, its own ID).
    raw = getattr(request, "request_id", None) or getattr(request, "req_id", None)
    rid = host._request_ids_mapping.get(raw) if raw is not None else None
    if rid is None:
        rid = getattr(request, "external_req_id", None)
        if rid is None:
            rid = raw
    frm, to = _stage(host._stage_id), _stage(host._next_stage_id)
    if not isinstance(rid, str) or frm is None or to is None:
        return
    _get_recorder().record(
        rid, frm, to, _EMIT, lambda: _payload_meaningful(host, payload), host._put_req_chunk.get(rid, 0)
    )
    if raw == rid:
        _mark_done(host, "_edgemark_emitted", rid, (frm, to, _EMIT))


def _wrap_send_full(orig: Callable) -> Callable:
    def send_full_payload_outputs(self, scheduler_output, outputs, *args, **kwargs):
        try:
            if self._omni_connector is not None and isinstance(outputs, dict):
                rec = _get_recorder()
                for req_id, value in outputs.items():
                    raw, request = value if isinstance(value, tuple) and len(value) == 2 else (value, None)
                    rid = self._resolve_external_req_id(request, req_id)
                    rec.record(
                        rid,
                        int(self._stage_id),
                        int(self._next_stage_id),
                        _EMIT,
                        lambda raw=raw: _has_content(raw),
                        self._put_req_chunk.get(req_id, 0),
                    )
        except Exception as e:  # noqa: BLE001
            _debug_once("w-full", "edgemark: producer emit not recorded: %r", e)
        return orig(self, scheduler_output, outputs, *args, **kwargs)

    return send_full_payload_outputs


def _wrap_send(orig: Callable) -> Callable:
    def _send_single_request(self, task):
        ok = orig(self, task)
        if ok is not True:
            return ok
        try:
            if task["request_id"] in self._edgemark_sent:
                return ok
        except Exception:  # noqa: BLE001 - no set yet: the recording path
            pass
        try:
            _record_send(self, task)
        except Exception as e:  # noqa: BLE001
            _debug_once("w-send", "edgemark: send complete not recorded: %r", e)
        return ok

    return _send_single_request


def _record_send(host: Any, task: dict) -> None:
    rid = _put_key_request(task.get("put_key")) or task.get("request_id")
    frm, to = _stage(task.get("stage_id")), _stage(task.get("next_stage_id"))
    if isinstance(rid, str) and frm is not None and to is not None and host._omni_connector is not None:
        data = task.get("data")
        _get_recorder().record(rid, frm, to, _SEND, lambda: _payload_meaningful(host, data))
        if task.get("request_id") == rid:
            _mark_done(host, "_edgemark_sent", rid, (frm, to, _SEND))


#: The receive helpers whose result says what a poll admitted.
_RECV = ("_recv_async_chunk_result", "_recv_full_payload_result")


def _wrap_poll(orig: Callable) -> Callable:
    def _poll_single_request(self, req_id, *, publish_ready=True):
        try:
            if req_id in self._edgemark_accepted:
                return orig(self, req_id, publish_ready=publish_ready)
        except Exception:  # noqa: BLE001 - then take the recording path
            pass
        return _poll_and_record(orig, self, req_id, publish_ready)

    return _poll_single_request


def _poll_and_record(orig: Callable, host: Any, req_id: Any, publish_ready: bool):
    """A poll whose accept is not recorded yet: it sees what the receive
    helpers return, through bound methods set on this runner for the call
    (only its receive thread polls it), and records the accept."""
    received: list = []
    shadowed = []
    try:
        for name in _RECV:
            bound = getattr(host, name)

            def capture(connector, from_stage, to_stage, key, *args, _bound=bound, **kwargs):
                result = _bound(connector, from_stage, to_stage, key, *args, **kwargs)
                received.append((from_stage, to_stage, result))
                return result

            host.__dict__[name] = capture
            shadowed.append(name)
    except Exception as e:  # noqa: BLE001
        _debug_once("w-accept", "edgemark: consumer accept not recorded: %r", e)
    try:
        admitted = orig(host, req_id, publish_ready=publish_ready)
    finally:
        for name in shadowed:
            host.__dict__.pop(name, None)
    try:
        if admitted is True and received and received[-1][2]:
            frm, to, (payload, _size) = _stage(received[-1][0]), _stage(received[-1][1]), received[-1][2]
            if frm is not None and to is not None:
                rid = host._request_ids_mapping.get(req_id, req_id)
                if host._async_chunk:
                    meaningful = lambda: _payload_meaningful(host, payload)  # noqa: E731
                else:
                    meaningful = lambda: _has_content(payload)  # noqa: E731
                _get_recorder().record(rid, frm, to, _ACCEPT, meaningful)
                if rid == req_id:
                    _mark_done(host, "_edgemark_accepted", rid, (frm, to, _ACCEPT))
    except Exception as e:  # noqa: BLE001
        _debug_once("w-accept", "edgemark: consumer accept not recorded: %r", e)
    return admitted


def _wrap_cleanup_request(orig: Callable) -> Callable:
    def cleanup_finished_request(self, req_id):
        try:
            rec = _recorder
            if rec is not None:
                # The request is done in this stage: a later request under
                # the same ID is another instance, looked up afresh.
                ids = {req_id, self._request_ids_mapping.get(req_id, req_id)}
                with rec.lock:
                    for rid in ids:
                        rec.requests.pop(rid, None)
                for attr in ("_edgemark_emitted", "_edgemark_sent", "_edgemark_accepted"):
                    done = self.__dict__.get(attr)
                    if done is not None:
                        done.difference_update(ids)
        except Exception as e:  # noqa: BLE001
            _debug_once("w-cleanup", "edgemark: stage cleanup not followed: %r", e)
        return orig(self, req_id)

    return cleanup_finished_request


def _slots_for(pools: List[Any]) -> int:
    """Requests the region holds open at once for these stage pools:
    ``EDGEMARK_VLLM_OMNI_SLOTS``, else four times the sum of the stages'
    ``max_num_seqs`` (at least 256, at most 65536), else 1024."""
    slots = _env_slots()
    if slots is not None:
        return slots
    total = 0
    for pool in pools:
        cfg = getattr(pool, "stage_vllm_config", None)
        n = getattr(getattr(cfg, "scheduler_config", None), "max_num_seqs", None)
        if isinstance(n, int) and n > 0:
            total += n
    return min(max(4 * total, _MIN_SLOTS), _MAX_SLOTS) if total else _FALLBACK_SLOTS


def _wrap_orchestrator_init(orig: Callable) -> Callable:
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        try:
            pools = list(getattr(self, "stage_pools", None) or ())
            _get_owner(len(pools) or _STAGES, _slots_for(pools))
        except Exception as e:  # noqa: BLE001
            _debug_once("w-init", "edgemark: region not created at start-up: %r", e)

    return __init__


def _wrap_route(orig: Callable) -> Callable:
    async def _route_output(self, stage_id, replica_id, output, req_state, stage_metrics, *args, **kwargs):
        try:
            s = _stage(stage_id)
            if s:
                rid = getattr(output, "request_id", None)
                if isinstance(rid, str):
                    _get_recorder().record(rid, s - 1, s, _OUTPUT, lambda: _output_has_content(output))
        except Exception as e:  # noqa: BLE001
            _debug_once("w-output", "edgemark: consumer output not recorded: %r", e)
        return await orig(self, stage_id, replica_id, output, req_state, stage_metrics, *args, **kwargs)

    return _route_output


def _wrap_forward(orig: Callable) -> Callable:
    async def _forward_to_next_stage_unguarded(self, req_id, src_stage_id, output, req_state, *args, **kwargs):
        edge = submitted = None
        try:
            s = _stage(src_stage_id)
            if s is not None and isinstance(req_id, str):
                edge = (s, s + 1)
                submitted = req_state.stage_submit_ts.get(s + 1)
                _get_recorder().record(req_id, s, s + 1, _EMIT, lambda: _output_has_content(output))
        except Exception as e:  # noqa: BLE001
            _debug_once("w-fwd", "edgemark: hand-off not recorded: %r", e)
        result = await orig(self, req_id, src_stage_id, output, req_state, *args, **kwargs)
        try:
            # vLLM-Omni stamps the next stage's submission when it succeeded;
            # a hand-off that failed (a dead stage) returns without one.
            after = req_state.stage_submit_ts.get(edge[1]) if edge is not None else None
            if after is not None and after != submitted:
                _get_recorder().record(req_id, edge[0], edge[1], _SEND, lambda: _output_has_content(output))
        except Exception as e:  # noqa: BLE001
            _debug_once("w-fwd", "edgemark: hand-off not recorded: %r", e)
        return result

    return _forward_to_next_stage_unguarded


def _close_state(state: Any, request_id: Any) -> Optional[Dict[str, Any]]:
    token = state.__dict__.pop("_edgemark_token", None) if state is not None else None
    owner = _owner
    if token is None or owner is None or not isinstance(request_id, str):
        return None
    final = owner.close(request_id, token)
    state.stream_edge_metrics = final
    return final


def _close_by_finalizer(owner: _Owner, request_id: str, token: Token, pid: int) -> None:
    if os.getpid() == pid:
        owner.close(request_id, token)


def _wrap_state_init(orig: Callable) -> Callable:
    def __init__(self, request_id, *args, **kwargs):
        orig(self, request_id, *args, **kwargs)
        try:
            owner = _get_owner()
            if owner is not None and isinstance(request_id, str):
                token = owner.begin(request_id)
                if token is not None:
                    self.__dict__["_edgemark_token"] = token
                    # A state dropped without cleanup still frees its slot.
                    weakref.finalize(self, _close_by_finalizer, owner, request_id, token, os.getpid())
        except Exception as e:  # noqa: BLE001
            _debug_once("w-begin", "edgemark: request not begun: %r", e)

    return __init__


def _wrap_result(orig: Callable) -> Callable:
    def _process_single_result(self, result, *args, **kwargs):
        out = orig(self, result, *args, **kwargs)
        try:
            metrics = getattr(out, "metrics", None)
            owner = _owner
            if isinstance(metrics, dict) and owner is not None:
                state = self.request_states.get(getattr(result, "request_id", None))
                token = getattr(state, "_edgemark_token", None) if state is not None else None
                if token is not None:
                    metrics["stream_edge_metrics"] = owner.region.snapshot(token)
        except Exception as e:  # noqa: BLE001
            _debug_once("w-result", "edgemark: no stream_edge_metrics in a response: %r", e)
        return out

    return _process_single_result


def _wrap_cleanup(orig: Callable) -> Callable:
    def _log_summary_and_cleanup(self, request_id, *args, **kwargs):
        try:
            _close_state(self.request_states.get(request_id), request_id)
        except Exception as e:  # noqa: BLE001
            _debug_once("w-close", "edgemark: close failed: %r", e)
        return orig(self, request_id, *args, **kwargs)

    return _log_summary_and_cleanup


def _wrap_abort(orig: Callable) -> Callable:
    def abort(self, request_id, *args, **kwargs):
        try:
            ids = [request_id] if isinstance(request_id, str) else list(request_id)
            for rid in ids:
                _close_state(self.request_states.get(rid), rid)
            request_id = ids if not isinstance(request_id, str) else request_id
        except Exception as e:  # noqa: BLE001
            _debug_once("w-abort", "edgemark: close on abort failed: %r", e)
        return orig(self, request_id, *args, **kwargs)

    return abort


# ---------------------------------------------------------------------------
# The targets, checked all together before any is patched.

_TRANSPORT = "vllm_omni.distributed.omni_connectors.model_runner.omni_connector_payload_transport"
_ORCH = "vllm_omni.engine.orchestrator"
_RECV_PARAMS = ("self", "connector", "from_stage", "to_stage", "connector_get_key", "metadata")


@dataclass(frozen=True)
class _Target:
    module: str
    cls: str
    attr: str
    #: The parameter names the wrapper relies on, in order (``None``: any).
    params: Optional[Tuple[str, ...]]
    #: ``None``: checked, not patched (the receive helpers a poll shadows).
    wrap: Optional[Callable[[Callable], Callable]]
    is_async: bool = False


_TARGETS: Tuple[_Target, ...] = (
    _Target(_TRANSPORT, "_OmniConnectorPayloadTransportMixin", "_enqueue_chunk_payload",
            ("self", "request", "payload_data", "wait_for_delivery"), _wrap_enqueue),
    _Target(_TRANSPORT, "_OmniConnectorPayloadTransportMixin", "send_full_payload_outputs",
            ("self", "scheduler_output", "outputs"), _wrap_send_full),
    _Target(_TRANSPORT, "_OmniConnectorPayloadTransportMixin", "_send_single_request",
            ("self", "task"), _wrap_send),
    _Target(_TRANSPORT, "_OmniConnectorPayloadTransportMixin", "_recv_async_chunk_result",
            _RECV_PARAMS, None),
    _Target(_TRANSPORT, "_OmniConnectorPayloadTransportMixin", "_recv_full_payload_result",
            _RECV_PARAMS, None),
    _Target(_TRANSPORT, "_OmniConnectorPayloadTransportMixin", "_poll_single_request",
            ("self", "req_id", "publish_ready"), _wrap_poll),
    _Target("vllm_omni.distributed.omni_connectors.model_runner.omni_connector_runtime",
            "_OmniConnectorRuntimeMixin", "cleanup_finished_request", ("self", "req_id"), _wrap_cleanup_request),
    _Target(_ORCH, "OrchestratorBase", "__init__", None, _wrap_orchestrator_init),
    _Target(_ORCH, "OrchestratorBase", "_route_output",
            ("self", "stage_id", "replica_id", "output", "req_state", "stage_metrics"), _wrap_route, True),
    _Target(_ORCH, "OrchestratorBase", "_forward_to_next_stage_unguarded",
            ("self", "req_id", "src_stage_id", "output", "req_state"), _wrap_forward, True),
    _Target("vllm_omni.entrypoints.client_request_state", "ClientRequestState", "__init__",
            ("self", "request_id", "external_request_id", "queue", "final_stage_id"), _wrap_state_init),
    _Target("vllm_omni.entrypoints.omni_base", "OmniBase", "_process_single_result",
            ("self", "result", "stage_id", "metrics"), _wrap_result),
    _Target("vllm_omni.entrypoints.omni_base", "OmniBase", "_log_summary_and_cleanup",
            ("self", "request_id", "reason"), _wrap_cleanup),
    _Target("vllm_omni.entrypoints.omni", "Omni", "abort", ("self", "request_id"), _wrap_abort),
)  # fmt: skip

#: (class, attribute, original) of every patch in place.
_patched: List[Tuple[type, str, Callable]] = []
#: Whether this process's vLLM-Omni was found unsupported (said once).
_refused = False
_instrument_lock = threading.Lock()


def _installed_version() -> Optional[str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm-omni")
    except PackageNotFoundError:
        return None


def _version_tuple(text: str) -> Optional[Tuple[int, int]]:
    m = re.match(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _resolve(target: _Target) -> Tuple[type, Callable]:
    """The class and the function a target wraps; ``LookupError`` saying
    what is missing or has changed."""
    import importlib

    module = importlib.import_module(target.module)
    cls = getattr(module, target.cls, None)
    if not isinstance(cls, type):
        raise LookupError(f"{target.module}.{target.cls} is missing")
    func = cls.__dict__.get(target.attr)
    if not inspect.isfunction(func):
        raise LookupError(f"{target.cls}.{target.attr} is missing")
    if target.is_async != inspect.iscoroutinefunction(func):
        raise LookupError(f"{target.cls}.{target.attr} is {'not ' if target.is_async else ''}a coroutine function")
    if target.params is not None:
        names = tuple(inspect.signature(func).parameters)[: len(target.params)]
        if names != target.params:
            raise LookupError(f"{target.cls}.{target.attr} takes {names}, expected {target.params}")
    return cls, func


def is_instrumented() -> bool:
    """Whether this process's vLLM-Omni is patched."""
    return bool(_patched)


def instrument() -> bool:
    """Wraps vLLM-Omni's call sites in this process. Idempotent: a second
    call does nothing. Returns whether the call sites are patched.

    Outside ``SUPPORTED``, or when any wrapped attribute is missing or has
    another signature, logs one warning and patches nothing (and later calls
    in this process return ``False`` without another warning).
    """
    global _refused
    with _instrument_lock:
        if _patched:
            return True
        if _refused:
            return False
        ver = _installed_version()
        parsed = _version_tuple(ver) if ver else None
        if parsed is None or not (SUPPORTED[0] <= parsed < SUPPORTED[1]):
            _refused = True
            _log.warning(
                "edgemark: vllm-omni %s is not supported (%s); stream-edge events are not recorded",
                ver or "(not installed)",
                _SUPPORTED_TEXT,
            )
            return False
        try:
            resolved = [(t, *_resolve(t)) for t in _TARGETS]
        except (LookupError, ImportError, ValueError, TypeError) as e:
            _refused = True
            _log.warning(
                "edgemark: vllm-omni %s has changed where the plugin hooks in (%s); nothing is patched",
                ver,
                e,
            )
            return False
        for target, cls, func in resolved:
            if target.wrap is None:
                continue
            wrapper = target.wrap(func)
            wrapper.__wrapped__ = func  # type: ignore[attr-defined]
            wrapper.__qualname__ = func.__qualname__
            wrapper.__doc__ = func.__doc__
            setattr(cls, target.attr, wrapper)
            _patched.append((cls, target.attr, func))
        # The API server names the region now, before it starts the stage
        # processes that inherit the name.
        _region_path()
        return True


def uninstrument() -> None:
    """Puts back every function ``instrument`` replaced. Idempotent. The
    region, if this process created one, stays until the process exits."""
    with _instrument_lock:
        while _patched:
            cls, attr, func = _patched.pop()
            setattr(cls, attr, func)


# ---------------------------------------------------------------------------
# Regions left by killed servers.

_NAME = re.compile(re.escape(_PREFIX) + r"(\d+)\.(region|requests)$")


def clean(directory: Optional[str] = None) -> List[str]:
    """Removes the regions (and their request lookups) of API servers that
    no longer run, found by the pid in their names under ``directory``
    (default ``edgemark.default_dir()``). Returns the paths removed."""
    directory = directory or default_dir()
    removed = []
    for name in sorted(os.listdir(directory)):
        m = _NAME.match(name)
        if not m or _alive(int(m.group(1))):
            continue
        path = os.path.join(directory, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except OSError as e:
            _log.warning("edgemark: cannot remove %s: %s", path, e)
            continue
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _main(argv: List[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m edgemark.vllm_omni",
        description="The edgemark plugin for vLLM-Omni: remove regions that killed servers left behind.",
    )
    parser.add_argument("command", choices=["clean"], help="clean: remove the regions of servers that no longer run")
    parser.add_argument("--dir", default=None, help="where to look (default: edgemark's default directory)")
    args = parser.parse_args(argv)
    for path in clean(args.dir):
        print(f"removed {path}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
