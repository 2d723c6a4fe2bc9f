"""The lifecycle both serving-framework plugins (``edgemark.vllm``,
``edgemark.vllm_omni``) share, written once: a process's recording state
(``Recording``): its region's name, the region it records into (the API
server's ``Owner``, or attached by path), the periodic duties of its tick
thread, and the plugin's variables. The region file's own life (made, held,
given up) is ``_region_file``'s, the log lines ``_said``'s; both are
importable from here too.

- **Names.** A region the user did not name is named for this server start:
  ``<default dir>/<prefix><pid>-<16 random hex>.region``. The pid is there
  for a reader; the random part makes the name unique across containers that
  share ``/dev/shm`` (each its own PID 1) and across restarts. The first
  process that loads the plugin names it and exports the name; the
  processes it starts (API servers, engine cores, workers) inherit it, so
  every API server of one launcher creates or attaches the same region.
- **A bound on open requests.** An API server runs one daemon thread
  (``Recording.tick`` every ``TICK_S``) that closes every request of the
  region open longer than ``<PREFIX>_MAX_OPEN_S`` (``Region.expire``,
  counted in the region as ``expired_requests``), whichever process began
  it and whatever happened to the processes that would have closed it.
  The same thread closes requests whose state was dropped (finalizers only
  queue), forgets requests others closed, notices a region file removed or
  replaced under the server (and makes a new one), and repeats the warning
  while the region stays full.
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

from . import Event, _channel, _export, _presence
from ._edgemark import Region, Token, default_dir
from ._region_file import (
    ATTACH_WAIT_S,
    MADE_BY_SERVER,
    MIN_CLOSED_ENTRIES,
    Hold,
    Owner,
    attach,
    closed_entries,
    create_or_attach,
    file_identity,
    own_regular_file,
)
from ._said import SAY_AGAIN_S, Once, Said, say

# The event numbers, from the core's table.
EMIT = int(Event.PRODUCER_FIRST_NONEMPTY_EMIT)
SEND = int(Event.EDGE_FIRST_SEND_COMPLETE)
ACCEPT = int(Event.CONSUMER_FIRST_ACCEPT)
OUTPUT = int(Event.CONSUMER_FIRST_NONEMPTY_OUTPUT)

#: How often the API server's thread runs ``Recording.tick``.
TICK_S = 2.0
#: How often a process that attached a region checks that its path still
#: names the file it mapped.
CHECK_S = 5.0
#: The bound on how long a request stays open, unless the plugin's
#: ``<PREFIX>_MAX_OPEN_S`` says otherwise.
MAX_OPEN_S = 600.0
MIN_MAX_OPEN_S, MAX_MAX_OPEN_S = 1.0, 7 * 86400.0
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
    def env_instance(self) -> str:
        """The variable that names this server start (``_presence``),
        inherited by the processes it starts."""
        return "_" + self.env + "_INSTANCE"

    @property
    def marker(self) -> str:
        """The variable that says the region's name is the plugin's, not
        the user's (inherited with it)."""
        return "_" + self.env + "_NAMED"



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
        #: This server start's name, which its processes share: the parts
        #: each records are announced under it (``_presence``).
        self.instance = _presence.instance(spec.env_instance)
        self.presence = _presence.Presence(self.path, self.instance)
        self.checker = _presence.Checker(self.path)
        #: When this process's ``Owner`` started (``present``'s grace).
        self._owner_since = 0.0
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
        #: vLLM's ``--otlp-traces-endpoint``, when the plugin knows it.
        self.vllm_traces_endpoint: Optional[str] = None
        #: The server's own export of its region (``_export``), when an
        #: endpoint is configured.
        self.export: Optional[_export.Export] = None
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
                self._owner_since = time.monotonic()
                self.say_pending()
                self._start_ticker()
                self._start_export()
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

    def _start_export(self) -> None:
        """The server's own export (``_export``), when it is configured:
        tried now, then at each tick; stopped at exit before the region is
        let go (atexit is last in, first out)."""
        on, why = _export.configured(os.environ, self.vllm_traces_endpoint)
        if why is not None:
            self.once.warn("export-config", "edgemark: %s", why)
        if not on or self.export is not None:
            return
        if self.vllm_traces_endpoint and not os.environ.get(_export.TRACES_ENDPOINT):
            # As vLLM's own tracing does for the processes it starts.
            os.environ[_export.TRACES_ENDPOINT] = self.vllm_traces_endpoint
        self.export = _export.Export(self.path, self.log, self.said)
        atexit.register(self._stop_export)
        self._tick_export()

    def _tick_export(self) -> None:
        """The export's election and exporter (``_export.Export.tick``); a
        failure is said, and the server and the tick's other duties go on."""
        export = self.export
        if export is None:
            return
        try:
            export.tick()
        except Exception as e:  # noqa: BLE001 - the server serves without it
            self.said.warn("export-tick", "edgemark: the export of %s did not start: %r", self.path, e)

    def _stop_export(self) -> None:
        export, owner = self.export, self.owner
        if export is None:
            return
        unsent = export.stop(owner.region if owner is not None else None)
        if owner is not None:
            # Its last server out does not remove it unsent (said there).
            owner.unsent = unsent

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
            owner.close_due(time.monotonic(), self.decide_close)
        if expired:
            self.log.warning(
                "edgemark: closed %d request(s) of %s open longer than %gs (the bound, %s): the events they lack "
                "stay null",
                expired,
                self.path,
                self.max_open_s,
                self.spec.env_max_open,
            )
        self._tick_export()
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

    # -- closers ----------------------------------------------------------------

    #: How long after its ``Owner`` started a process waits for its
    #: instance's parts to announce themselves before it takes their
    #: absence for a fact (they announce within ``_presence.CHECK_S`` of the
    #: region file's creation).
    PRESENCE_GRACE_S = 4 * _presence.CHECK_S + 1.0

    def present(self, part: str) -> Optional[bool]:
        """Whether a process of this instance records ``part`` into the
        region on this host; ``None`` while that cannot be told yet (during
        ``PRESENCE_GRACE_S`` after this process's ``Owner`` started), and
        ``True`` where it can never be told (no OFD locks, no file: nothing
        is refused on a guess)."""
        found = self.checker.present(part, self.instance)
        if found is None or found:
            return True
        if time.monotonic() < self._owner_since + self.PRESENCE_GRACE_S:
            return None
        return False

    def announce(self, part: str) -> None:
        """This process records ``part`` of its instance into the region at
        ``path`` from now on (``_presence.Presence``); never raises."""
        try:
            self.presence.announce(part)
        except Exception as e:  # noqa: BLE001 - recording never fails a request
            self.once.warn("announce", "edgemark: this process cannot say it records %s: %r", part, e)

    def decide_close(self, request_id: str, token: Token, finished: float) -> Optional[float]:
        """When a close this process queued (``Owner.close_at``) has come:
        ``None`` to close now, a later monotonic time to ask again then, or
        ``math.inf`` to leave it to the bound. A subclass says."""
        return None

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
    "ATTACH_WAIT_S",
    "EMIT",
    "MADE_BY_SERVER",
    "MIN_CLOSED_ENTRIES",
    "OUTPUT",
    "SAY_AGAIN_S",
    "SEND",
    "Hold",
    "Once",
    "Owner",
    "Recording",
    "Said",
    "Spec",
    "attach",
    "closed_entries",
    "create_or_attach",
    "env_int",
    "env_number",
    "file_identity",
    "own_regular_file",
    "region_path",
    "say",
    "traceparent_in",
]
