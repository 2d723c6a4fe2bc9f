"""Which parts of a plugin's recording run on this host, told through the
region file itself, so that the API server begins a request only where
someone can record it and close it.

A process that records a part (the P/D plugin's scheduler side, its send
side, ...) of one instance (a server start: its API servers, engine cores
and workers, which inherit the instance's name, ``instance``) holds, for its
life, an open file description lock (``F_OFD_SETLK``, Linux 3.15 and later)
for reading on one byte of the region file far past its end: byte
``BASE + 16 * instance + part``. Any process asks whether
a part is present by testing that byte for a write lock (``F_OFD_GETLK``)
through a descriptor of its own. The kernel drops the lock when the holder
dies, in any PID namespace, as it drops the ``flock`` of ``_region_file.Hold``
(the two kinds of lock never conflict); a file removed and made again holds
no lock at all, so a stale presence cannot outlive its region. No file is
written, no pid is read.

The region file appears after the processes that announce start (vLLM's
engine cores and workers come up before its API server makes the region),
so ``Presence`` announces from a daemon thread that waits for the file,
checks it every ``CHECK_S`` and announces again in a file made again at the
same path.
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
import threading
from typing import Dict, Optional, Set, Tuple

#: The first byte of the locks; far past any region's end (a lock needs no
#: data under it).
BASE = 1 << 62
#: How often the announcing thread checks the file at its path.
CHECK_S = 0.5

# struct flock on Linux (x86_64, aarch64): l_type, l_whence, then l_start,
# l_len as off_t, l_pid (0 for an OFD lock).
_FLOCK = "hhxxxxqqixxxx"

#: Bytes per instance.
_STRIDE = 16
#: Instances are numbered by 40 bits of their name.
_INSTANCE_BITS = 40

#: The parts by name, each with its byte within its instance's.
PARTS: Dict[str, int] = {
    # vLLM P/D: a scheduler-side NIXL connector (emit, the prefill side's
    # close when nothing is handed over, the decode side's registration).
    "pd-scheduler": 0,
    # vLLM P/D: a worker-side NIXL connector that records send complete and
    # closes at an expired lease.
    "pd-sender": 1,
    # vLLM P/D: an API server, which begins the instance's requests on its
    # host (an engine core with none on its host begins its own).
    "pd-api": 2,
}


def instance(var: str) -> str:
    """This server start's name (16 hex digits) in variable ``var``: the
    first process that asks names it, the processes it starts inherit it."""
    name = os.environ.get(var, "")
    if len(name) != 16 or any(c not in "0123456789abcdef" for c in name):
        name = os.urandom(8).hex()
        os.environ[var] = name
    return name


def _byte(part: str, name: str) -> int:
    return BASE + _STRIDE * (int(name, 16) >> (64 - _INSTANCE_BITS)) + PARTS[part]


def supported() -> bool:
    """Whether this system has open file description locks."""
    return hasattr(fcntl, "F_OFD_SETLK") and hasattr(fcntl, "F_OFD_GETLK")


def _lock(fd: int, cmd: int, kind: int, at: int) -> bytes:
    return fcntl.fcntl(fd, cmd, struct.pack(_FLOCK, kind, os.SEEK_SET, at, 1, 0))


def _open(path: str) -> Tuple[int, Tuple[int, int]]:
    """A read-only descriptor of the region file at ``path`` (a regular
    file this user owns or shares by group; never through a symlink), and
    its identity."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, (st.st_dev, st.st_ino)


def held(fd: int, part: str, name: str) -> bool:
    """Whether another open file description than ``fd``'s holds instance
    ``name``'s ``part`` of the file ``fd`` is open on."""
    got = _lock(fd, fcntl.F_OFD_GETLK, fcntl.F_WRLCK, _byte(part, name))
    return struct.unpack(_FLOCK, got)[0] != fcntl.F_UNLCK


class Checker:
    """Asks whether parts are present in the region file at ``path``: one
    descriptor, opened again when the file at the path is replaced."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: Optional[int] = None
        self._identity: Optional[Tuple[int, int]] = None
        self._lock = threading.Lock()

    def present(self, part: str, name: str) -> Optional[bool]:
        """Whether some live process of instance ``name`` holds ``part`` of
        the file now at the path; ``None`` when that cannot be told (no
        file, no OFD locks)."""
        if not supported():
            return None
        with self._lock:
            try:
                st = os.lstat(self.path)
            except OSError:
                self._drop()
                return None
            if self._fd is None or self._identity != (st.st_dev, st.st_ino):
                self._drop()
                try:
                    self._fd, self._identity = _open(self.path)
                except OSError:
                    return None
            try:
                return held(self._fd, part, name)
            except OSError:
                return None

    def _drop(self) -> None:
        fd, self._fd, self._identity = self._fd, None, None
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        with self._lock:
            self._drop()


class Presence:
    """The parts this process of instance ``name`` records into the region
    file at ``path``, announced as soon as the file exists and again in a
    file made again at the path, for the life of the process (the daemon
    thread ``edgemark-presence``)."""

    def __init__(self, path: str, name: str, check_s: float = CHECK_S) -> None:
        self.path = path
        self.name = name
        self.check_s = check_s
        self._parts: Set[str] = set()
        self._fd: Optional[int] = None
        self._identity: Optional[Tuple[int, int]] = None
        self._locked: Set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._pid = os.getpid()

    def announce(self, part: str) -> None:
        """Holds ``part`` from now on (at once if the file exists, else as
        soon as it does). Idempotent."""
        if part not in PARTS:
            raise ValueError(f"unknown part {part!r}")
        if not supported():
            return
        with self._lock:
            self._parts.add(part)
        self.refresh()
        if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
            # A forked child inherits the descriptor (and so the lock) but
            # not the thread: it watches the path on its own.
            self._pid = os.getpid()
            t = threading.Thread(target=self._watch, name="edgemark-presence", daemon=True)
            self._thread = t
            t.start()

    def announced(self) -> Set[str]:
        """The parts held now, in the file now at the path."""
        with self._lock:
            if self._identity is None:
                return set()
            try:
                st = os.lstat(self.path)
            except OSError:
                return set()
            return set(self._locked) if (st.st_dev, st.st_ino) == self._identity else set()

    def refresh(self) -> None:
        """Locks every part in the file now at the path (opened again if it
        was replaced); nothing when there is none yet."""
        with self._lock:
            try:
                st = os.lstat(self.path)
            except OSError:
                # Gone: its locks with it (and the descriptor, which would
                # keep a removed file's memory).
                if self._fd is not None:
                    os.close(self._fd)
                    self._fd, self._identity = None, None
                    self._locked.clear()
                return
            if self._fd is not None and self._identity != (st.st_dev, st.st_ino):
                os.close(self._fd)
                self._fd, self._identity = None, None
                self._locked.clear()
            if self._fd is None:
                try:
                    self._fd, self._identity = _open(self.path)
                except OSError:
                    return
            for part in self._parts - self._locked:
                try:
                    _lock(self._fd, fcntl.F_OFD_SETLK, fcntl.F_RDLCK, _byte(part, self.name))
                    self._locked.add(part)
                except OSError:
                    pass

    def _watch(self) -> None:
        while True:
            self._wake.wait(self.check_s)
            self._wake.clear()
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - the thread must go on
                pass


__all__ = ["BASE", "CHECK_S", "PARTS", "Checker", "Presence", "held", "instance", "supported"]
