"""Whether this machine lets a test make the namespaces it needs
(``unshare``, as root), and the markers that skip a test where it cannot,
never in CI (``CI=true``, as root): there a missing ``unshare`` fails it."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def can_unshare(*flags: str) -> bool:
    """Whether ``unshare FLAGS true`` runs here."""
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", *flags, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _needs(reason: str, *flags: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(os.environ.get("CI") != "true" and not can_unshare(*flags), reason=reason)


#: PID namespaces (a container's PID 1).
needs_unshare = _needs("no PID namespaces here (unshare needs root)", "--pid", "--fork", "--mount-proc")
#: Time namespaces (a container with a clock of its own).
needs_time_namespace = _needs(
    "no time namespaces here (unshare --time needs root)", "--time", "--fork", "--monotonic", "1000"
)
