"""What edgemark's serving-framework plugins (``edgemark.vllm_omni``,
``edgemark.vllm``) share beyond the instrumentor (``_instrument``): the event
numbers, log lines said once, the region of a host (named by a variable or
by the plugin, created or attached, removed at exit by its creator), and the
requests a process begins (``Owner``) with the lookup other processes find
their tokens in (``_channel``).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import stat
import sys
import threading
import time
from typing import Any, Dict, Iterable, Optional, Set, Tuple

from . import Event, _channel
from ._edgemark import Region, Token, default_dir

# The event numbers, from the core's table.
EMIT = int(Event.PRODUCER_FIRST_NONEMPTY_EMIT)
SEND = int(Event.EDGE_FIRST_SEND_COMPLETE)
ACCEPT = int(Event.CONSUMER_FIRST_ACCEPT)
OUTPUT = int(Event.CONSUMER_FIRST_NONEMPTY_OUTPUT)

#: How long an attach waits for a region another process is creating at the
#: same path (its header is written after the file appears).
ATTACH_WAIT_S = 5.0


class Once:
    """Log lines said once per process, on ``log``."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self._said: Set[str] = set()

    def warn(self, what: str, msg: str, *args: Any) -> None:
        if what not in self._said:
            self._said.add(what)
            self.log.warning(msg, *args)

    def debug(self, what: str, msg: str, *args: Any) -> None:
        if what not in self._said:
            self._said.add(what)
            self.log.debug(msg, *args)


def env_int(var: str, once: Once, lo: int, hi: int) -> Optional[int]:
    """The integer variable ``var``, clamped to ``[lo, hi]``; ``None`` when
    unset or not a number (said once)."""
    v = os.environ.get(var)
    if not v:
        return None
    try:
        n = int(v)
    except ValueError:
        once.warn(var, "edgemark: %s=%r is not a number, using the default", var, v)
        return None
    return min(max(n, lo), hi)


def region_path(var: str, prefix: str, marker: str) -> Tuple[str, bool]:
    """This host's region file, and whether the user named it (``var``).
    The first process that loads the plugin (the API server) names it
    ``<default dir>/<prefix><pid>.region`` when nobody did, and says so in
    the variable ``marker``; the processes it starts inherit both."""
    path = os.environ.get(var)
    if path:
        return path, os.environ.get(marker) != path
    path = os.path.join(default_dir(), f"{prefix}{os.getpid()}.region")
    os.environ[var] = path
    # Child processes inherit both: the name is the plugin's, not the user's.
    os.environ[marker] = path
    return path, False


def named_by_parent(path: str, prefix: str) -> bool:
    """Whether ``path`` is the name the plugin gives the region of this
    process's parent (``<default dir>/<prefix><parent pid>.region``): a vLLM
    launcher started with several API servers names the region when it
    loads its plugins, and each API server it starts inherits the name; the
    first to create it owns it, the others attach."""
    return path == os.path.join(default_dir(), f"{prefix}{os.getppid()}.region")


def own_regular_file(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def attach(path: str, wait: float = ATTACH_WAIT_S) -> Region:
    """Attaches the region at ``path``, waiting up to ``wait`` seconds while
    another process is still writing its header."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return Region.attach(path)
        except ValueError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def create_or_attach(path: str, edges: Iterable[Tuple[int, int]], slots: int, user_named: bool) -> Tuple[Region, bool]:
    """The region at ``path``: created here (``True``), or a region file the
    user named and this user owns, attached (``False``). A file at a name
    the plugin chose, or one another user owns, is refused."""
    try:
        return Region.create(path, edges=list(edges), slots=slots), True
    except FileExistsError:
        if not user_named:
            raise _channel.UntrustedError(f"{path} already exists and is not this server's") from None
        if not own_regular_file(path):
            raise _channel.UntrustedError(f"{path} is not a regular file this user owns") from None
        return attach(path), False


def remove_files(path: str, creator: int, writer: Optional[_channel.Writer]) -> None:
    # A forked child inherits the hook: only the creator removes its files.
    if os.getpid() != creator:
        return
    if writer is not None:
        writer.remove()
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


def say(log: logging.Logger, message: str) -> bool:
    """Says ``message`` now (``True``) if vLLM's logging is set up or vLLM
    is not loaded; ``False`` when it should wait (a vLLM API server loads
    its plugins before it configures logging, and a line said then is
    lost)."""
    if logging.getLogger("vllm").handlers or "vllm" not in sys.modules:
        log.info("%s", message)
        return True
    return False


def traceparent_in(headers: Any) -> Optional[str]:
    """The ``traceparent`` in a mapping of trace headers (name compared
    without case), or ``None``."""
    if not headers:
        return None
    try:
        value = headers.get("traceparent")
        if value is None:
            for k, v in headers.items():
                if isinstance(k, str) and k.lower() == "traceparent":
                    value = v
                    break
    except AttributeError:
        return None
    return value if isinstance(value, str) else None


class Owner:
    """The requests this process began, by request ID (``Region.begin`` for
    each), with the lookup other processes of the host read their tokens
    from."""

    def __init__(
        self,
        path: str,
        edges: Iterable[Tuple[int, int]],
        slots: int,
        user_named: bool,
        once: Once,
        log: logging.Logger,
        log_requests: bool = False,
    ) -> None:
        self.path = path
        self.region, created = create_or_attach(path, edges, slots, user_named)
        self.writer: Optional[_channel.Writer] = None
        try:
            self.writer = _channel.Writer(_channel.lookup_dir(path))
        except OSError as e:
            once.warn(
                "lookup",
                "edgemark: the request lookup %s cannot be trusted, other processes record nothing: %s",
                _channel.lookup_dir(path),
                e,
            )
        if created or self.writer is not None:
            atexit.register(remove_files, path if created else "", os.getpid(), self.writer)
        self.log = log
        self.tokens: Dict[str, Token] = {}
        self.log_requests = log_requests
        #: Request IDs begun under a caller's trace context.
        self.parented: Set[str] = set()
        self.lock = threading.Lock()

    def begin(self, request_id: str, traceparent: Optional[str], once: Once) -> Optional[Token]:
        token = self.region.begin(traceparent, strict=False)
        if token is None:
            once.warn("full", "edgemark: the region is full, a request runs unrecorded")
            return None
        if self.writer is not None:
            try:
                self.writer.publish(request_id, token)
            except OSError as e:
                # Unpublished, no other process could record or close it:
                # closed now rather than left holding its slot.
                self.region.close(token)
                once.warn(
                    "publish",
                    "edgemark: the request lookup %s takes no entry, requests run unrecorded: %s",
                    _channel.lookup_dir(self.path),
                    e,
                )
                return None
        with self.lock:
            old = self.tokens.pop(request_id, None)
            self.tokens[request_id] = token
            if traceparent:
                self.parented.add(request_id)
            else:
                self.parented.discard(request_id)
        if old is not None:
            # The ID was reused while its earlier instance was open.
            self.region.close(old)
        return token

    def close(self, request_id: str, token: Optional[Token] = None) -> Dict[str, Any]:
        """Closes ``request_id``'s instance (``token``'s, if given; nothing
        if another instance holds the ID now). Returns the final snapshot."""
        with self.lock:
            current = self.tokens.get(request_id)
            if token is None:
                token = current
            if token is None or current != token:
                # Closed already: by an earlier close, or by the begin of a
                # newer instance under the ID (the map holds every open
                # token this process began).
                return {}
            del self.tokens[request_id]
            self.parented.discard(request_id)
            if self.writer is not None:
                self.writer.withdraw(request_id)
        traceparent = self.region.traceparent(token) if self.log_requests else None
        final = self.region.close(token)
        if final is None:
            return {}
        if self.log_requests:
            self.log.info(
                "edgemark: request %s closed, trace %s: stream_edge_metrics %s",
                request_id,
                traceparent.split("-")[1] if traceparent else "-",
                json.dumps(final, sort_keys=True, separators=(",", ":")),
            )
        return final

    def forget_closed(self) -> int:
        """Forgets the requests that another process closed (their tokens
        no longer open), withdrawing their lookup entries; how many."""
        with self.lock:
            gone = [(rid, t) for rid, t in self.tokens.items() if not self.region.is_open(t)]
            for rid, _ in gone:
                del self.tokens[rid]
                self.parented.discard(rid)
        if self.writer is not None:
            for rid, _ in gone:
                self.writer.withdraw(rid)
        return len(gone)
