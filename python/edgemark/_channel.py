"""The request lookup: how another process on the same host finds a
request's token by a request ID (vLLM-Omni's external request ID for its
stages; the prefill instance's request ID for vLLM's decode instance).
Shared by the integrations (``edgemark.vllm_omni``, ``edgemark.vllm``).

The process that begins requests (an API server) keeps one small file per
open request in a directory beside the region (``<region>.requests``), named
by a hash of the request ID and holding ``token \\n request ID``. A reader
reads an entry once per request instance.

A reader may also *join* an entry (``Reader.join``): an empty marker file
beside it (``<entry>.joined``), which says that another party (vLLM's decode
instance) shares the request and will close it; ``Reader.joined`` asks.

Only a directory this user owns is trusted, at both ends:

- the owner creates it with mode 0700; one that already exists is used only
  if it is a real directory (not a symlink), owned by this user, with no
  access for anyone else; anything else turns the lookup off, with one
  warning (stage processes then record nothing; the API server's own events
  are still recorded);
- a reader opens the directory once (``O_DIRECTORY | O_NOFOLLOW``), checks the
  same, and opens entries relative to that descriptor, so that a directory
  swapped afterwards is never read;
- an entry is read only if it is a regular file owned by this user, opened
  ``O_NONBLOCK | O_NOFOLLOW`` (a FIFO never blocks a stage's thread), at most
  4 KiB; anything that does not parse is "no token";
- the owner writes entries 0600 (to a fresh temporary name, then renamed),
  and at exit removes only the entries it wrote, and the directory only if
  it created it.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from typing import Optional, Set

from ._edgemark import Token

#: An entry larger than this is not one of the owner's.
_MAX_ENTRY = 4096
#: The suffix of an entry's join marker.
JOINED = ".joined"


def lookup_dir(region_path: str) -> str:
    """The lookup directory beside ``region_path``."""
    base = region_path[: -len(".region")] if region_path.endswith(".region") else region_path
    return base + ".requests"


def entry_name(request_id: str) -> str:
    """The file name of ``request_id``'s entry."""
    return hashlib.blake2b(request_id.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


class UntrustedError(OSError):
    """The lookup directory is not one this user alone can write."""


def _check_dir(st: os.stat_result, path: str) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedError(f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise UntrustedError(f"{path} belongs to uid {st.st_uid}, not to this user ({os.geteuid()})")
    if st.st_mode & 0o077:
        raise UntrustedError(f"{path} has mode {stat.S_IMODE(st.st_mode):o}: others can reach it (0700 expected)")


def _open_dir(path: str) -> int:
    """A descriptor of the trusted directory ``path``: never through a
    symlink, never one another user owns or can write."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _check_dir(os.fstat(fd), path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def parse_entry(data: bytes, request_id: str) -> Optional[Token]:
    """The token an entry's bytes hold for ``request_id``; ``None`` for
    anything else (another ID, garbage, bytes that do not decode)."""
    token, sep, rid = data.partition(b"\n")
    if not sep:
        return None
    try:
        if rid.decode("utf-8", "surrogatepass") != request_id:
            return None
        return Token(token.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        return None


class Reader:
    """A stage process's side: reads entries, never blocks, never raises."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: Optional[int] = None

    def _dir(self) -> Optional[int]:
        fd = self._fd
        if fd is None:
            fd = self._fd = _open_dir(self.path)
        return fd

    def open(self) -> None:
        """Opens the directory now: ``OSError`` (``UntrustedError`` for one
        that is not this user's alone) if it cannot be trusted or is absent."""
        self._dir()

    def read(self, request_id: str) -> Optional[Token]:
        """The token published under ``request_id``, or ``None``."""
        try:
            dirfd = self._dir()
            fd = os.open(
                entry_name(request_id),
                os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                dir_fd=dirfd,
            )
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > _MAX_ENTRY:
                return None
            data = os.read(fd, _MAX_ENTRY)
        except OSError:
            return None
        finally:
            os.close(fd)
        return parse_entry(data, request_id)

    def join(self, request_id: str) -> bool:
        """Leaves the marker that another party shares ``request_id``'s
        entry; ``True`` if it is there now (made here or before)."""
        try:
            fd = os.open(
                entry_name(request_id) + JOINED,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=self._dir(),
            )
        except FileExistsError:
            return self.joined(request_id)
        except OSError:
            return False
        os.close(fd)
        return True

    def joined(self, request_id: str) -> bool:
        """Whether ``request_id``'s entry was joined: its marker is a
        regular file this user owns."""
        try:
            st = os.stat(entry_name(request_id) + JOINED, dir_fd=self._dir(), follow_symlinks=False)
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()

    def unlink(self, request_id: str) -> None:
        """Removes ``request_id``'s entry and its marker (whoever wrote them:
        the party that closes a request it did not begin)."""
        for name in (entry_name(request_id), entry_name(request_id) + JOINED):
            try:
                os.unlink(name, dir_fd=self._dir())
            except OSError:
                pass

    def unlinked(self) -> bool:
        """Whether the directory this reader opened was removed since (a
        new one may stand at its path)."""
        fd = self._fd
        if fd is None:
            return False
        try:
            return os.fstat(fd).st_nlink == 0
        except OSError:
            return True

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class Writer:
    """The API server's side: publishes and withdraws entries."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            os.mkdir(path, 0o700)
            self.created = True
        except FileExistsError:
            self.created = False
        self._fd = _open_dir(path)
        self._pid = os.getpid()
        #: Entry names this writer published and has not withdrawn.
        self._mine: Set[str] = set()
        self._lock = threading.Lock()

    def publish(self, request_id: str, token: Token) -> None:
        name = entry_name(request_id)
        tmp = f".{name}.{os.getpid()}.{threading.get_ident()}"
        data = str(token).encode("ascii") + b"\n" + request_id.encode("utf-8", "surrogatepass")
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=self._fd,
        )
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=self._fd, dst_dir_fd=self._fd)
        with self._lock:
            self._mine.add(name)

    def withdraw(self, request_id: str) -> None:
        name = entry_name(request_id)
        with self._lock:
            if name not in self._mine:
                return
            self._mine.discard(name)
        for n in (name, name + JOINED):
            try:
                os.unlink(n, dir_fd=self._fd)
            except OSError:
                pass

    def mark(self, name: str) -> None:
        """Leaves an empty marker file ``name`` (a dot name, never an
        entry's) in the directory."""
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self._fd)
        os.close(fd)

    def marked(self, name: str) -> bool:
        """Whether the marker ``name`` is there, a regular file this user
        owns."""
        try:
            st = os.stat(name, dir_fd=self._fd, follow_symlinks=False)
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()

    def unlinked(self) -> bool:
        """Whether the directory this writer opened was removed (another
        process removed it: entries written now are lost)."""
        try:
            return os.fstat(self._fd).st_nlink == 0
        except OSError:
            return True

    def forget(self, request_id: str) -> None:
        """Stops tracking ``request_id``'s entry without touching the files
        (another process removed them)."""
        with self._lock:
            self._mine.discard(entry_name(request_id))

    def remove(self, rmdir: bool = True) -> None:
        """Removes the entries this writer published, and, with ``rmdir``,
        the directory if it created it (and it is then empty). Only in the
        process that made them: a forked child inherits the writer, not its
        files."""
        if os.getpid() != self._pid:
            return
        with self._lock:
            mine, self._mine = self._mine, set()
        for name in mine:
            for n in (name, name + JOINED):
                try:
                    os.unlink(n, dir_fd=self._fd)
                except OSError:
                    pass
        os.close(self._fd)
        if rmdir and self.created:
            try:
                os.rmdir(self.path)
            except OSError:
                pass
