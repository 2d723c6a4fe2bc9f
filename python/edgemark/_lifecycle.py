"""The lifecycle both serving-framework plugins (``edgemark.vllm``,
``edgemark.vllm_omni``) share, written once: how a host's region is named,
made, held, found, watched and given up, and the requests an API server
begins in it (``Owner``).

- **Names.** A region the user did not name is named for this server start:
  ``<default dir>/<prefix><pid>-<16 random hex>.region``. The pid is there
  for a reader; the random part makes the name unique across containers that
  share ``/dev/shm`` (each its own PID 1) and across restarts. The first
  process that loads the plugin names it and exports the name; the
  processes it starts (API servers, engine cores, workers) inherit it, so
  every API server of one launcher creates or attaches the same region.
- **Liveness without pids.** Every API server holds ``flock(LOCK_SH)`` on
  the region file for its life; the kernel drops it when the process dies,
  in any PID namespace. A region nobody holds is stale: ``clean`` removes
  it, and a server that exits removes a region only when nobody else holds
  it (``Hold``).
- **A bound on open requests.** An API server runs one daemon thread
  (``Recording.tick`` every ``TICK_S``) that closes every request of the
  region open longer than ``<PREFIX>_MAX_OPEN_S`` (``Region.expire``,
  counted in the region as ``expired_requests``), whichever process began
  it and whatever happened to the processes that would have closed it.
  The same thread closes requests whose state was dropped (finalizers only
  queue), forgets requests others closed, notices a region file removed or
  replaced under the server (and makes a new one), and repeats the warning
  while the region stays full.
- **Saying so.** A condition that stops recording is said each time it
  starts again, at most once per ``SAY_AGAIN_S`` while it lasts
  (``Said``), never once per process lifetime.
"""

from __future__ import annotations

import atexit
import collections
import errno
import fcntl
import json
import logging
import os
import secrets
import stat
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Set, Tuple

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
#: How often the API server's thread runs ``Recording.tick``.
TICK_S = 2.0
#: How often a process that attached a region checks that its path still
#: names the file it mapped.
CHECK_S = 5.0
#: The fewest closed requests a plugin's region keeps for its exporter.
MIN_CLOSED_ENTRIES = 1024
#: The marker a server that made a region leaves in its lookup.
MADE_BY_SERVER = ".made-by-server"
#: The bound on how long a request stays open, unless the plugin's
#: ``<PREFIX>_MAX_OPEN_S`` says otherwise.
MAX_OPEN_S = 600.0
MIN_MAX_OPEN_S, MAX_MAX_OPEN_S = 1.0, 7 * 86400.0
#: A condition that stops recording is said again after this long while it
#: lasts.
SAY_AGAIN_S = 60.0
RETRY_ATTACH_S = 1.0
RETRY_ATTACH_MAX_S = 30.0


@dataclass(frozen=True)
class Spec:
    """What one plugin calls its variables and files."""

    #: The variable that switches it on (``EDGEMARK_VLLM``); the others are
    #: named after it.
    env: str
    #: The default region file's name starts with this.
    file_prefix: str
    log: logging.Logger
    #: What is not recorded when the region cannot be made ("the P/D
    #: hand-off is").
    what: str

    @property
    def env_region(self) -> str:
        return self.env + "_REGION"

    @property
    def env_slots(self) -> str:
        return self.env + "_SLOTS"

    @property
    def env_max_open(self) -> str:
        return self.env + "_MAX_OPEN_S"

    @property
    def marker(self) -> str:
        """The variable that says the region's name is the plugin's, not
        the user's (inherited with it)."""
        return "_" + self.env + "_NAMED"


class Once:
    """Log lines said once per process, on ``log``: for what cannot change
    while the process runs (a bad variable, a connector it cannot follow)."""

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


class Said:
    """A warning said when its condition starts and again at most every
    ``every`` seconds while it lasts, with how often it happened since."""

    def __init__(self, log: logging.Logger, every: float = SAY_AGAIN_S) -> None:
        self.log = log
        self.every = every
        self._next: Dict[str, float] = {}
        self._since: Dict[str, int] = {}
        self._lock = threading.Lock()

    def warn(self, what: str, msg: str, *args: Any) -> bool:
        """Says ``msg`` now unless it was said less than ``every`` seconds
        ago; ``True`` if it was said."""
        now = time.monotonic()
        with self._lock:
            if now < self._next.get(what, 0.0):
                self._since[what] = self._since.get(what, 0) + 1
                return False
            self._next[what] = now + self.every
            since = self._since.pop(what, 0)
        if since:
            self.log.warning(msg + " (%d more times since it was last said)", *args, since)
        else:
            self.log.warning(msg, *args)
        return True

    def ended(self, what: str) -> None:
        """The condition is over: the next occurrence is said at once."""
        with self._lock:
            self._next.pop(what, None)
            self._since.pop(what, None)


def env_number(var: str, once: Once, lo: float, hi: float, kind: Callable[[str], Any] = int) -> Optional[Any]:
    """The number in variable ``var``, clamped to ``[lo, hi]``; ``None``
    when unset or not a number (said once)."""
    v = os.environ.get(var)
    if not v:
        return None
    try:
        n = kind(v)
    except ValueError:
        once.warn(var, "edgemark: %s=%r is not a number, using the default", var, v)
        return None
    if n != n:  # NaN
        once.warn(var, "edgemark: %s=%r is not a number, using the default", var, v)
        return None
    return kind(min(max(n, lo), hi))


def env_int(var: str, once: Once, lo: int, hi: int) -> Optional[int]:
    return env_number(var, once, lo, hi, int)


def region_path(spec: Spec) -> Tuple[str, bool]:
    """This host's region file, and whether the user named it. Unnamed, the
    first process that loads the plugin names it for this server start and
    says so in ``spec.marker``; the processes it starts inherit both."""
    path = os.environ.get(spec.env_region)
    if path:
        return path, os.environ.get(spec.marker) != path
    path = os.path.join(default_dir(), f"{spec.file_prefix}{os.getpid()}-{secrets.token_hex(8)}.region")
    os.environ[spec.env_region] = path
    os.environ[spec.marker] = path
    return path, False


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
        if self.hold.release(remove=made_by_server) and writer is not None:
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


class Recording:
    """What both plugins' per-process recording state shares: the region
    (as the API server's ``Owner``, or attached by path), the lookup other
    processes publish tokens in, the periodic duties, and the log lines.
    Each plugin subclasses it with what its processes know of a request."""

    #: The plugin's names (a subclass sets it).
    spec: Spec

    def __init__(self, uninstrument: Callable[[], None] = lambda: None) -> None:
        spec = self.spec
        self.log = spec.log
        self.once = Once(spec.log)
        self.said = Said(spec.log)
        self.path, self.user_named = region_path(spec)
        max_open = env_number(spec.env_max_open, self.once, MIN_MAX_OPEN_S, MAX_MAX_OPEN_S, float)
        #: Every request is closed within this many seconds of its begin
        #: (plus one ``TICK_S``).
        self.max_open_s: float = MAX_OPEN_S if max_open is None else max_open
        self.owner: Optional[Owner] = None
        self._region: Optional[Region] = None
        self._identity: Optional[Tuple[int, int]] = None
        self._next_check = 0.0
        self._next_attach = 0.0
        self._attach_pause = RETRY_ATTACH_S / 2
        self._reader = _channel.Reader(_channel.lookup_dir(self.path))
        self._reader_ok: Optional[bool] = None
        self.lock = threading.RLock()
        #: Puts every call site back (the instrumentor's): when the region
        #: cannot be made, nothing stays patched.
        self.uninstrument = uninstrument
        #: This process could not make its region as the API server.
        self.failed = False
        self._pending: Optional[str] = None
        self._ticker: Optional[threading.Thread] = None
        self._stopping = False
        self._next_remake = 0.0
        self._remake_pause = TICK_S
        #: The hold of a region this process made for its own host's
        #: requests, with no API server on the host (vLLM-Omni's stages on
        #: a host of their own).
        self.host_hold: Optional[Hold] = None
        #: What ``ensure_owner`` was last asked for (a region made again
        #: after its file was removed has the same shape).
        self._shape: Optional[Tuple[List[Tuple[int, int]], int]] = None

    # -- the log line ---------------------------------------------------------

    def say(self, message: str) -> None:
        """Says ``message`` (this process's one INFO line) now if vLLM's
        logging is set up, else when the process first uses its region."""
        if not say(self.log, message):
            self._pending = message

    def say_pending(self) -> None:
        message, self._pending = self._pending, None
        if message is not None:
            self.log.info("%s", message)

    # -- the API server ---------------------------------------------------------

    def slots(self, default: int) -> int:
        """The region's slots: the plugin's ``_SLOTS`` variable, else
        ``default``."""
        n = env_int(self.spec.env_slots, self.once, 1, 65536)
        return default if n is None else n

    def ensure_owner(self, edges: List[Tuple[int, int]], slots: int) -> Optional[Owner]:
        """The region as the API server, created or attached on first use.
        If that fails, says so and puts every call site back: the server
        serves, unrecorded."""
        owner = self.owner
        if owner is not None or self.failed:
            return owner
        with self.lock:
            if self.owner is None and not self.failed:
                self._shape = (list(edges), slots)
                try:
                    self.owner = self._make_owner()
                except (OSError, ValueError) as e:
                    self.failed = True
                    self.log.warning(
                        "edgemark: cannot create the region %s, nothing is patched and %s not recorded: %s",
                        self.path,
                        self.spec.what,
                        e,
                    )
                    self.uninstrument()
                    return None
                self._region = self.owner.region
                self.say_pending()
                self._start_ticker()
            return self.owner

    def _make_owner(self, wait: float = ATTACH_WAIT_S) -> Owner:
        assert self._shape is not None
        edges, slots = self._shape
        # A name the user gave, or the one the plugin gave this server start
        # (inherited by every API server of one launcher): attached if it
        # exists. Unique per start, a plugin's name is never another's.
        return Owner(
            self.path,
            edges,
            slots,
            True,
            not self.user_named,
            self.once,
            self.said,
            self.log,
            self.log_requests(),
            wait,
        )

    def log_requests(self) -> bool:
        """Whether the API server logs each closed request (a subclass
        says)."""
        return False

    def _start_ticker(self) -> None:
        if self._ticker is not None and self._ticker.is_alive():
            return
        # Registered after the owner's release, so run before it (atexit is
        # last in, first out): no tick after the region is let go.
        atexit.register(self._stop_ticking)
        t = threading.Thread(target=self._tick_loop, name="edgemark-tick", daemon=True)
        self._ticker = t
        t.start()

    def _stop_ticking(self) -> None:
        self._stopping = True

    def _tick_loop(self) -> None:
        while not self._stopping:
            time.sleep(TICK_S)
            if self._stopping:
                return
            try:
                self.tick()
            except Exception as e:  # noqa: BLE001 - the thread must go on
                self.said.warn("tick", "edgemark: a periodic check failed: %r", e)

    def tick(self) -> None:
        """The API server's periodic duties (``Owner.tick``), and a region
        file removed or replaced under it noticed: said, and made again at
        its path (requests open in the old one close with it)."""
        owner = self.owner
        if self._stopping or (owner is not None and owner.released):
            return
        if owner is None:
            region = self._region
            if self.host_hold is None or region is None:
                return
            expired = region.expire(self.max_open_s)
        else:
            expired = owner.tick(self.max_open_s)
        if expired:
            self.log.warning(
                "edgemark: closed %d request(s) of %s open longer than %gs (the bound, %s): the events they lack "
                "stay null",
                expired,
                self.path,
                self.max_open_s,
                self.spec.env_max_open,
            )
        if self._reader.unlinked():
            self._reader.close()
            self._reader_ok = None
        if owner is not None and not owner.hold.linked():
            self.said.warn(
                "unlinked",
                "edgemark: the region file %s was removed or replaced under this server; recording into a new one",
                self.path,
            )
            self._replace_owner(owner)

    def _replace_owner(self, old: Owner) -> None:
        # On the tick's thread, never under ``self.lock`` (which vLLM's
        # threads take): made first, swapped in under the lock. On failure
        # the old one stays (its mapping of the removed file is harmless)
        # and the next tick tries again, after a pause that doubles.
        now = time.monotonic()
        if now < self._next_remake:
            return
        # The old one's lookup entries go first: the new one makes its own.
        old.release_lookup()
        try:
            new = self._make_owner(wait=0.0)
        except (OSError, ValueError) as e:
            self._remake_pause = min(self._remake_pause * 2, RETRY_ATTACH_MAX_S)
            self._next_remake = now + self._remake_pause
            self.said.warn("remake", "edgemark: cannot make the region %s again, nothing is recorded: %s", self.path, e)
            return
        self._remake_pause = TICK_S
        self.said.ended("remake")
        with self.lock:
            self.owner, self._region = new, new.region
            self._reader.close()
            self._reader_ok = None
        old.release()
        self.forget_all()

    def forget_all(self) -> None:
        """Forgets what this process knows of requests (their region is
        gone); a subclass clears its own maps."""

    # -- every process --------------------------------------------------------

    def region(self) -> Optional[Region]:
        """The region: the API server's own, or attached by path (one
        attempt, never a wait: a failure is tried again after a pause that
        doubles, up to ``RETRY_ATTACH_MAX_S``). A region file removed or
        replaced under this process is noticed within ``CHECK_S``, said, and
        attached again."""
        region = self._region
        owner = self.owner
        if owner is not None:
            return owner.region
        now = time.monotonic()
        if region is not None:
            if now < self._next_check:
                return region
            self._next_check = now + CHECK_S
            if self._reader.unlinked():
                # The lookup was made again (its region's last server left
                # and another started): read the new one.
                self._reader.close()
                self._reader_ok = None
                self.forget_all()
            if file_identity(self.path) == self._identity:
                return region
            self.said.warn(
                "unlinked",
                "edgemark: the region file %s was removed or replaced under this process; attaching it again",
                self.path,
            )
            self._region = None
            self._reader.close()
            self._reader_ok = None
            self.forget_all()
            self._next_attach = 0.0
        if now < self._next_attach:
            return None
        try:
            if not own_regular_file(self.path):
                raise FileNotFoundError(f"no region file of this user's at {self.path}")
            before = file_identity(self.path)
            attached = Region.attach(self.path)
            if before is None or file_identity(self.path) != before:
                raise FileNotFoundError(f"the region file {self.path} was replaced while it was attached")
        except (OSError, ValueError) as e:
            self._attach_pause = min(self._attach_pause * 2, RETRY_ATTACH_MAX_S)
            self._next_attach = time.monotonic() + self._attach_pause
            if isinstance(e, ValueError):
                # A file that is not a region this build can use (or one
                # whose header is still being written).
                self.said.warn("attach-bad", "edgemark: %s is not a region this process can record into: %s", self.path, e)
            else:
                self.once.debug("attach", "edgemark: no region at %s, this process records nothing yet: %s", self.path, e)
            return None
        self._attach_pause = RETRY_ATTACH_S / 2
        self.said.ended("attach-bad")
        self._region, self._identity, self._next_check = attached, before, now + CHECK_S
        self.say_pending()
        return attached

    def read_lookup(self, request_id: str) -> Optional[Token]:
        """The token another process published under ``request_id``, or
        ``None``."""
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

    def lookup(self, request_id: str) -> Optional[Token]:
        """``request_id``'s token: one this process began, else the lookup's."""
        owner = self.owner
        if owner is not None:
            token = owner.tokens.get(request_id)
            if token is not None:
                return token
        return self.read_lookup(request_id)


__all__ = [
    "ACCEPT",
    "EMIT",
    "OUTPUT",
    "SEND",
    "Hold",
    "Once",
    "Owner",
    "Recording",
    "Said",
    "Spec",
    "attach",
    "create_or_attach",
    "env_int",
    "env_number",
    "file_identity",
    "own_regular_file",
    "region_path",
    "say",
    "traceparent_in",
]
