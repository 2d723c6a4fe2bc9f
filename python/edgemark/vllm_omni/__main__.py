"""``python -m edgemark.vllm_omni clean``: removes the regions (and their
request lookups) that API servers killed with SIGKILL left behind."""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
from typing import Callable, List, Optional

from .._edgemark import default_dir
from ._recording import PREFIX, log

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


def _say(line: str) -> None:
    # File names need not be text: written as the bytes they are.
    sys.stdout.buffer.write(os.fsencode(line) + b"\n")
    sys.stdout.buffer.flush()


def clean(directory: Optional[str] = None, report: Callable[[str], None] = lambda path: None) -> List[str]:
    """Removes the regions and request lookups of API servers that no
    longer run, found by the pid in their names under ``directory``
    (default ``edgemark.default_dir()``), and only those this user owns.
    Calls ``report`` with each path as soon as it is removed; returns them
    all. Never follows a symlink: one with such a name is removed itself."""
    directory = directory or default_dir()
    removed = []
    for name in sorted(os.listdir(directory)):
        m = _NAME.match(name)
        if not m or _alive(int(m.group(1))):
            continue
        path = os.path.join(directory, name)
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
    args = parser.parse_args(argv)
    clean(args.dir, report=lambda path: _say(f"removed {path}"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
