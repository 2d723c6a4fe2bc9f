"""What ``python -m edgemark.vllm_omni clean`` does: removes the regions
(and their request lookups) that API servers killed with SIGKILL left
behind."""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
from typing import Callable, List, Optional

from .._edgemark import Region, default_dir
from .._channel import lookup_dir
from ._recording import ENV_REGION, PREFIX, log

_NAME = re.compile(re.escape(PREFIX) + r"(\d+)\.(region|requests)$")


def _pid_max() -> int:
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 22


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` runs. Pid 0 and numbers past the kernel's
    largest pid name no process (``kill(0, 0)`` would ask about this
    process's own group)."""
    if pid <= 0 or pid > _pid_max():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _started_unix_ns(pid: int) -> Optional[int]:
    """When process ``pid`` started, in Unix nanoseconds (from its
    ``/proc`` start time and the boot time), or ``None``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        return btime * 1_000_000_000 + int(fields[19]) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _creator_gone(path: str) -> bool:
    """Whether the process that created the region at ``path`` no longer
    runs: its pid is free, or taken by a process that started after the
    region was made. A file that is not a region of this user's is never
    judged gone."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return False
        info = Region.attach(path).info()
    except (OSError, ValueError):
        return False
    if not info:
        return False
    pid, created = int(info["creator_pid"]), int(info["created_unix_ns"])
    if not _alive(pid):
        return True
    started = _started_unix_ns(pid)
    # Start times are known to a clock tick: one second of slack.
    return started is not None and started > created + 1_000_000_000


def _say(line: str) -> None:
    # File names need not be text: written as the bytes they are.
    sys.stdout.buffer.write(os.fsencode(line) + b"\n")
    sys.stdout.buffer.flush()


def clean(
    directory: Optional[str] = None,
    report: Callable[[str], None] = lambda path: None,
    named: Optional[str] = None,
) -> List[str]:
    """Removes the regions and request lookups of API servers that no
    longer run, and only those this user owns: under ``directory`` (default
    ``edgemark.default_dir()``) those the plugin named, found by the pid in
    their names; and the region ``named`` (default: the one
    ``EDGEMARK_VLLM_OMNI_REGION`` names) with its lookup, when the process
    that created it no longer runs. Calls ``report`` with each path as soon
    as it is removed; returns them all. Never follows a symlink: one with
    such a name is removed itself."""
    directory = directory or default_dir()
    named = named if named is not None else os.environ.get(ENV_REGION)
    gone = []
    for name in sorted(os.listdir(directory)):
        m = _NAME.match(name)
        if m and not _alive(int(m.group(1))):
            gone.append(os.path.join(directory, name))
    if named and _creator_gone(named):
        gone += [p for p in (named, lookup_dir(named)) if p not in gone and os.path.lexists(p)]
    removed = []
    for path in gone:
        try:
            st = os.lstat(path)
            if st.st_uid != os.geteuid():
                log.warning("edgemark: %s belongs to uid %d, left in place", path, st.st_uid)
                continue
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except OSError as e:
            log.warning("edgemark: cannot remove %s: %s", path, e)
            continue
        removed.append(path)
        report(path)
    return removed


def main(argv: List[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m edgemark.vllm_omni",
        description="The edgemark plugin for vLLM-Omni: remove regions that killed servers left behind.",
    )
    parser.add_argument("command", choices=["clean"], help="clean: remove the regions of servers that no longer run")
    parser.add_argument("--dir", default=None, help="where to look (default: edgemark's default directory)")
    parser.add_argument(
        "--region",
        default=None,
        help=f"a region named by hand, removed with its lookup when its creator no longer runs (default: ${ENV_REGION})",
    )
    args = parser.parse_args(argv)
    clean(args.dir, report=lambda path: _say(f"removed {path}"), named=args.region)
    return 0

