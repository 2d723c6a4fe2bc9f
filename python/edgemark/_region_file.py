"""A plugin's region file and the requests an API server begins in it,
written once for both serving-framework plugins (``edgemark.vllm``,
``edgemark.vllm_omni``): the file made or attached (``create_or_attach``),
held for the process's life (``Hold``), and the API server's requests with
the lookup other processes read their tokens from and the closes queued for
its periodic duties (``Owner``).

- **Liveness without pids.** Every API server holds ``flock(LOCK_SH)`` on
  the region file for its life; the kernel drops it when the process dies,
  in any PID namespace. A region nobody holds is stale: ``clean`` removes
  it, and a server that exits removes a region only when nobody else holds
  it (``Hold``), and only one a server made (``MADE_BY_SERVER``).
"""

from __future__ import annotations

import atexit
import collections
import errno
import fcntl
import heapq
import itertools
import json
import logging
import os
import stat
import threading
import time
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Set, Tuple

from . import _channel
from ._edgemark import Region, Token
from ._said import Once, Said

#: How long an attach waits for a region another process is creating at the
#: same path (its header is written after the file appears).
ATTACH_WAIT_S = 5.0
#: The fewest closed requests a plugin's region keeps for its exporter.
MIN_CLOSED_ENTRIES = 1024
#: The marker a server that made a region leaves in its lookup.
MADE_BY_SERVER = ".made-by-server"


def own_regular_file(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def file_identity(path: str) -> Optional[Tuple[int, int]]:
    """``(device, inode)`` of the file at ``path`` (not through a symlink),
    or ``None``."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


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


class Hold:
    """This process's shared ``flock`` on a region file: held for the
    process's life, dropped by the kernel when it dies (in any PID
    namespace). ``clean`` removes a file only when it can take the lock
    exclusively, so never one a process holds."""

    #: How long taking the lock waits for a ``clean`` that holds it.
    WAIT_S = 2.0

    def __init__(self, path: str) -> None:
        self.path = path
        self._pid = os.getpid()
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise _channel.UntrustedError(f"{path} is not a regular file this user owns")
            deadline = time.monotonic() + self.WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    # A clean holds it exclusively: it is removing the file
                    # (seen below) or about to let it go.
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
        except BaseException:
            os.close(fd)
            raise
        self._fd: Optional[int] = fd
        self.identity = (st.st_dev, st.st_ino)

    def linked(self) -> bool:
        """Whether ``path`` still names the file held (not removed, not
        replaced)."""
        return self._fd is not None and file_identity(self.path) == self.identity

    def sole(self) -> bool:
        """Whether no other process holds the file: told by taking the lock
        exclusively, which this hold then keeps until ``release``. Only
        just before ``release``: a refused conversion may have dropped the
        shared lock (``flock`` converts by removing first)."""
        if self._fd is None or os.getpid() != self._pid:
            return False
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        return True

    def release(self, remove: bool) -> bool:
        """Lets the file go; with ``remove``, first removes it if no other
        process holds it. ``True`` if it was removed. Only in the process
        that took the lock (a forked child inherits the object, not the
        duty)."""
        fd, self._fd = self._fd, None
        if fd is None or os.getpid() != self._pid:
            return False
        removed = False
        try:
            if remove:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    pass  # another process holds it: it stays
                else:
                    if file_identity(self.path) == self.identity:
                        os.unlink(self.path)
                        removed = True
        except OSError:
            pass
        finally:
            os.close(fd)
        return removed


def closed_entries(slots: int) -> int:
    """The closed requests a plugin's region keeps for its exporter: the
    slot count (the core's default) but never fewer than
    ``MIN_CLOSED_ENTRIES``, so that a small region (a test's, a user's
    ``_SLOTS``) does not lose closes to an exporter that polls once a
    second; at most 4096."""
    return max(min(slots, 4096), MIN_CLOSED_ENTRIES)


def create_or_attach(
    path: str, edges: Iterable[Tuple[int, int]], slots: int, trusted: bool, wait: float = ATTACH_WAIT_S
) -> Tuple[Region, Hold, bool]:
    """The region at ``path``, held: created here (``True``), or, when
    ``trusted`` (the user named it, or the plugin named it for this server
    start), a region file this user owns, attached (``False``). A file at
    an untrusted name is refused. A file removed between its creation and
    the hold (a ``clean`` that judged it stale) is made again."""
    for _ in range(3):
        try:
            region = Region.create(path, edges=list(edges), slots=slots, closed_entries=closed_entries(slots))
            created = True
        except FileExistsError:
            if not trusted:
                raise _channel.UntrustedError(f"{path} already exists and is not this server's") from None
            if not own_regular_file(path):
                raise _channel.UntrustedError(f"{path} is not a regular file this user owns") from None
            region, created = attach(path, wait), False
        try:
            hold = Hold(path)
        except FileNotFoundError:
            continue
        if hold.linked():
            return region, hold, created
        hold.release(remove=False)
    raise FileNotFoundError(errno.ENOENT, "the region file kept disappearing while it was made", path)



class Owner:
    """The requests this process (an API server) began, by request ID
    (``Region.begin`` for each), with the lookup other processes of the host
    read their tokens from, and its hold on the region file."""

    def __init__(
        self,
        path: str,
        edges: Iterable[Tuple[int, int]],
        slots: int,
        trusted: bool,
        plugin_named: bool,
        once: Once,
        said: Said,
        log: logging.Logger,
        log_requests: bool = False,
        wait: float = ATTACH_WAIT_S,
    ) -> None:
        self.path = path
        self.region, self.hold, self.created = create_or_attach(path, edges, slots, trusted, wait)
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
        # The last server out removes a region a server made (never one the
        # user made beforehand, `edgemark create`), and its lookup. A server
        # that made it says so in the lookup (MADE_BY_SERVER), for the one
        # that attached it and may be the last out.
        self._plugin_named = plugin_named
        if self.created and self.writer is not None:
            try:
                self.writer.mark(MADE_BY_SERVER)
            except OSError:
                pass
        self._released = False
        self._lookup_released = False
        #: The closed requests in its ring no exporter has sent, as the
        #: server's own export found them at exit (``_export``): the last
        #: server out then leaves the file for the next exporter.
        self.unsent = 0
        atexit.register(self.release)
        self.log = log
        self.said = said
        self.tokens: Dict[str, Token] = {}
        self.log_requests = log_requests
        #: Request IDs begun under a caller's trace context.
        self.parented: Set[str] = set()
        self.lock = threading.Lock()
        #: Closes asked for where the lock may be held (a finalizer that the
        #: garbage collector runs inside a locked section): done by ``tick``.
        self._later: Deque[Tuple[str, Token]] = collections.deque()
        self._successor: Dict[Token, Token] = {}
        #: Closes due at a time (``close_at``): (monotonic time, order,
        #: request ID, token, when the request finished), a heap.
        self._due: List[Tuple[float, int, str, Token, float]] = []
        self._due_lock = threading.Lock()
        self._due_order = itertools.count()

    def release(self) -> None:
        """At exit: the lookup entries this process wrote, and the region if
        nobody else holds it and a server made it. Idempotent."""
        if self._released:
            return
        self._released = True
        writer = self.writer
        made_by_server = (
            self.created
            or self._plugin_named
            or (writer is not None and not self._lookup_released and writer.marked(MADE_BY_SERVER))
        )
        self.release_lookup()
        remove_file = made_by_server
        if remove_file and self.unsent and self.hold.sole():
            remove_file = False
            self.log.warning(
                "edgemark: %d closed request(s) of %s not sent by any exporter yet: the file stays for the next "
                "exporter of it (edgemark export --dir); edgemark clean --force removes it and counts them",
                self.unsent,
                self.path,
            )
        if self.hold.release(remove=remove_file) and writer is not None:
            # Nobody holds the region any more: its lookup goes with it.
            lookup = _channel.lookup_dir(self.path)
            for remove, target in ((os.unlink, os.path.join(lookup, MADE_BY_SERVER)), (os.rmdir, lookup)):
                try:
                    remove(target)
                except OSError:
                    pass

    @property
    def released(self) -> bool:
        return self._released

    def release_lookup(self) -> None:
        """Removes the lookup entries this process wrote. Never the
        directory: a peer that holds the region reads it still."""
        writer = self.writer
        if writer is not None and not self._lookup_released:
            self._lookup_released = True
            writer.remove(rmdir=False)

    def begin(self, request_id: str, traceparent: Optional[str]) -> Optional[Token]:
        token = self.region.begin(traceparent, strict=False)
        if token is None:
            self.said.warn(
                "full",
                "edgemark: the region %s is full, requests run unrecorded (requests close when they end, or after "
                "the bound on open requests; a larger region: the plugin's _SLOTS variable)",
                self.path,
            )
            return None
        self.said.ended("full")
        if self.writer is not None:
            try:
                self.writer.publish(request_id, token)
            except OSError as e:
                # Unpublished, no other process could record or close it:
                # closed now rather than left holding its slot.
                self.region.close(token)
                self.said.warn(
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

    def close_later(self, request_id: str, token: Token) -> None:
        """Closes ``request_id``'s instance on the next ``tick``: safe where
        this object's lock may be held by the same thread (a finalizer).
        An instance begun again in its place (``succeeded``) is closed
        instead."""
        self._later.append((request_id, token))

    def close_at(self, request_id: str, token: Token, when: float, finished: float) -> None:
        """Closes ``request_id``'s instance (``token``'s) at monotonic time
        ``when`` or at the first ``tick`` after it, unless its ``decide``
        says otherwise then (``close_due``); ``finished`` is when the
        request finished here. Safe from any thread."""
        with self._due_lock:
            heapq.heappush(self._due, (when, next(self._due_order), request_id, token, finished))

    def close_due(self, now: float, decide: Callable[[str, Token, float], Optional[float]]) -> int:
        """Closes every request whose time has come and that is still open
        under its ID, unless ``decide(request_id, token, finished)`` gives a
        later time (``None``: close now; ``math.inf``: never, the bound on
        open requests closes it). How many it closed."""
        closed = 0
        while True:
            with self._due_lock:
                if not self._due or self._due[0][0] > now:
                    return closed
                _, _, rid, token, finished = heapq.heappop(self._due)
            with self.lock:
                if self.tokens.get(rid) != token:
                    continue  # closed already, or the ID begun again
            later = decide(rid, token, finished)
            if later is None:
                self.close(rid, token)
                closed += 1
            elif later != float("inf"):
                self.close_at(rid, token, later, finished)

    def succeeded(self, old: Token, new: Token) -> None:
        """``new`` was begun in place of ``old`` (same request, another
        trace context): a close queued for ``old`` closes ``new``."""
        with self.lock:
            self._successor[old] = new

    def forget_closed(self) -> int:
        """Forgets the requests that another process closed (their tokens
        no longer open), withdrawing their lookup entries; how many."""
        with self.lock:
            gone = [(rid, t) for rid, t in self.tokens.items() if not self.region.is_open(t)]
            for rid, _ in gone:
                del self.tokens[rid]
                self.parented.discard(rid)
                # Inside the lock, as in `close`: a new instance begun under
                # the ID meanwhile keeps its entry.
                if self.writer is not None:
                    self.writer.withdraw(rid)
        return len(gone)

    def tick(self, max_open_s: float) -> int:
        """The periodic duties: the queued closes, the bound on open
        requests (every request of the region, whoever began it), the
        requests others closed. How many requests the bound closed."""
        while self._later:
            rid, token = self._later.popleft()
            with self.lock:
                while token in self._successor:
                    token = self._successor.pop(token)
            self.close(rid, token)
        if self.writer is not None and self.writer.unlinked():
            # Removed by another process (a `clean` of an older release):
            # made again, or entries written from now on would be lost.
            try:
                self.writer = _channel.Writer(_channel.lookup_dir(self.path))
                self.said.warn("lookup-gone", "edgemark: the request lookup %s was removed; made again", self.writer.path)
            except OSError as e:
                self.said.warn("lookup-gone", "edgemark: the request lookup %s was removed: %s", self.writer.path, e)
        expired = self.region.expire(max_open_s)
        self.forget_closed()
        return expired


__all__ = [
    "ATTACH_WAIT_S",
    "MADE_BY_SERVER",
    "MIN_CLOSED_ENTRIES",
    "Hold",
    "Owner",
    "attach",
    "closed_entries",
    "create_or_attach",
    "file_identity",
    "own_regular_file",
]
