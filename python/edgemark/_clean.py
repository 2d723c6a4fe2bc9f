"""What ``python -m edgemark.vllm clean`` and ``python -m edgemark.vllm_omni
clean`` do (one command for both plugins): removes the regions, and their
request lookups, that no running server holds any more (servers killed
with SIGKILL, by the OOM killer, or with their container).

A region is live while some process holds a lock on its file
(``_region_file.Hold``: every API server holds one for its life, and the
kernel drops it when the process dies, whatever its PID namespace). So a
region is judged by taking that lock exclusively, without waiting: taken,
nobody uses the file and it is removed while the lock is held (a server
that starts at that moment sees its file gone and makes it again); refused,
it is left alone. Pids are never read: they mean nothing across
containers.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import shutil
import stat
import sys
from typing import Callable, List, Optional, Sequence, Tuple, Union

from ._channel import lookup_dir
from ._edgemark import Region, default_dir

log = logging.getLogger("edgemark")

#: The names the plugins give regions and lookups: ``<prefix><pid>-<16
#: hex>``, and ``<prefix><pid>`` of earlier releases.
_NAME = re.compile(r"edgemark-vllm-(?:omni-)?[0-9]+(?:-[0-9a-f]{16})?\.(region|requests)$")

#: The variables that name a region by hand, one per plugin.
NAMED_BY = ("EDGEMARK_VLLM_REGION", "EDGEMARK_VLLM_OMNI_REGION")


def _lock_if_unused(path: str) -> Optional[int]:
    """A descriptor of ``path`` locked exclusively (nobody else holds the
    file), or ``None`` when a process holds it, it is absent, or it is not
    a regular file of this user's. Never follows a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            os.close(fd)
            return None
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # Still the file at the name: not one removed between the open and
        # the lock, with a live server's new file at its name now.
        cur = os.lstat(path)
        if (cur.st_dev, cur.st_ino) != (st.st_dev, st.st_ino) or os.fstat(fd).st_nlink == 0:
            os.close(fd)
            return None
    except OSError:
        os.close(fd)
        return None
    return fd


def _remove(path: str, report: Callable[[str], None], removed: List[str]) -> None:
    """Removes ``path`` (a file, a symlink itself, or a directory tree of
    this user's), reporting it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        log.warning("edgemark: cannot read %s: %s", path, e)
        return
    if st.st_uid != os.geteuid():
        log.warning("edgemark: %s belongs to uid %d, left in place", path, st.st_uid)
        return
    try:
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except OSError as e:
        log.warning("edgemark: cannot remove %s: %s", path, e)
        return
    removed.append(path)
    report(path)


def _region_of(lookup: str) -> str:
    return lookup[: -len(".requests")] + ".region"


def _unsent(region: str) -> Optional[Tuple[int, int]]:
    """The closed requests in ``region``'s ring that no exporter has sent
    (not taken, or taken and not acknowledged), and the readers registered
    in its reader table; ``None`` when it cannot be read as a region."""
    try:
        report = Region.attach(region).report()
    except Exception:  # noqa: BLE001 - any file at all: what cannot be read is judged as before
        return None
    if report is None:  # a disabled region
        return None
    try:
        return int(report["closed_unread"]) + int(report["closed_unacknowledged"]), int(report["closed_readers"])
    except (KeyError, TypeError, ValueError):
        return None


def _remove_if_unused(
    region: str, report: Callable[[str], None], removed: List[str], force: bool = False
) -> bool:
    """Removes the region file ``region`` and its lookup when no process
    holds it; ``True`` if it was judged unused. A region whose ring holds
    closed requests not yet sent, which an exporter follows, is left for
    it (said), unless ``force``; removed with closed requests never sent,
    it says how many. A symlink at the name is no region: it is removed
    itself."""
    try:
        st = os.lstat(region)
    except OSError:
        return False
    if stat.S_ISLNK(st.st_mode):
        _remove(region, report, removed)
        return True
    fd = _lock_if_unused(region)
    if fd is None:
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            log.warning("edgemark: %s is not a regular file of this user's, left in place", region)
        return False
    try:
        unsent = _unsent(region)
        if unsent is not None and unsent[0] > 0:
            count, readers = unsent
            if readers > 0 and not force:
                # An exporter follows it (or followed it, and the next one
                # adopts what it left): removed once that is sent.
                log.warning(
                    "edgemark: %s left in place: %d closed requests in its ring are not sent yet by the exporter "
                    "that follows it (removed once they are; --force removes it now, counting them)",
                    region,
                    count,
                )
                return True
            log.warning(
                "edgemark: %s: %d closed requests in its ring were never sent (%s); removed with it",
                region,
                count,
                "removed with --force" if readers > 0 else "no exporter ever read it",
            )
        # The lookup first, the region last, both under the lock: a server
        # that starts meanwhile waits for the lock, then finds its file
        # gone and makes both afresh.
        lookup = lookup_dir(region)
        if os.path.lexists(lookup):
            _remove(lookup, report, removed)
        _remove(region, report, removed)
    finally:
        os.close(fd)
    return True


def clean(
    directory: Optional[str] = None,
    report: Callable[[str], None] = lambda path: None,
    named: Union[None, str, Sequence[str]] = None,
    force: bool = False,
) -> List[str]:
    """Removes the regions no process holds, and their request lookups,
    and only those this user owns: under ``directory`` (default
    ``edgemark.default_dir()``) those the plugins named; and the regions
    ``named`` (default: those ``EDGEMARK_VLLM_REGION`` and
    ``EDGEMARK_VLLM_OMNI_REGION`` name). A lookup whose region is gone goes
    too. Calls ``report`` with each path as soon as it is removed; returns
    them all. Never follows a symlink: one with such a name is removed
    itself.

    Closed requests are never removed unsaid: a region whose ring holds
    some that no exporter has sent stays while an exporter follows it
    (``edgemark export``, which registers as its reader: it, or the next
    one, sends them), unless ``force``; one that no exporter ever read is
    removed, and how many it held is said at WARNING."""
    directory = directory or default_dir()
    if named is None:
        named = [p for p in (os.environ.get(v) for v in NAMED_BY) if p]
    elif isinstance(named, str):
        named = [named]
    removed: List[str] = []
    names = sorted(os.listdir(directory))
    for name in names:
        m = _NAME.match(name)
        if m and m.group(1) == "region":
            _remove_if_unused(os.path.join(directory, name), report, removed, force)
    for name in names:
        m = _NAME.match(name)
        path = os.path.join(directory, name)
        if m and m.group(1) == "requests" and path not in removed and not os.path.lexists(_region_of(path)):
            # Its region is gone (removed above, or by hand).
            _remove(path, report, removed)
    for region in named:
        if region not in removed:
            _remove_if_unused(region, report, removed, force)
    return removed


def _say(line: str) -> None:
    # File names need not be text: written as the bytes they are.
    sys.stdout.buffer.write(os.fsencode(line) + b"\n")
    sys.stdout.buffer.flush()


def main(prog: str, argv: List[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog=prog,
        description="edgemark's vLLM and vLLM-Omni plugins: remove the regions no running server holds.",
    )
    parser.add_argument(
        "command", choices=["clean"], help="clean: remove the regions (and lookups) of servers that no longer run"
    )
    parser.add_argument("--dir", default=None, help="where to look (default: edgemark's default directory)")
    parser.add_argument(
        "--region",
        action="append",
        default=None,
        help="a region named by hand, removed with its lookup when no process holds it (repeatable; default: "
        + " and ".join("$" + v for v in NAMED_BY)
        + ")",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="also remove regions whose closed requests an exporter has not sent yet (their count is said)",
    )
    args = parser.parse_args(argv)
    try:
        clean(args.dir, report=lambda path: _say(f"removed {path}"), named=args.region, force=args.force)
    except OSError as e:
        print(f"{prog}: {e.strerror if e.errno != errno.ENOENT else 'no such directory'}: {e.filename}", file=sys.stderr)
        return 1
    return 0
