"""The dict ``Region.info()`` returns: the core's report of the region,
which also answers, for one release, the keys of the previous one that
moved into its objects, with a ``DeprecationWarning``."""

from __future__ import annotations

import warnings
from typing import Any, Dict, Tuple

# Former key -> where the report keeps it now.
_MOVED: Dict[str, Tuple[str, str]] = {
    "shares_clock": ("clock", "shared_with_this_process"),
    "mixed_pid_namespaces": ("pid_namespaces", "mixed"),
    "pids_unjudged": ("pid_namespaces", "why_not_judged"),
}


class InfoDict(dict):
    """``Region.info()``: a plain dict of the report's keys; a former key
    (``info()["shares_clock"]``, ``info().get("pids_unjudged")``) warns and
    answers from the report's object. Iteration, ``in`` and ``len`` see the
    report's keys only."""

    def _former(self, key: Any) -> Tuple[bool, Any]:
        moved = _MOVED.get(key) if isinstance(key, str) else None
        if moved is None:
            return False, None
        group, field = moved
        warnings.warn(
            f'Region.info()["{key}"] is deprecated and goes in the next release: '
            f'use info()["{group}"]["{field}"]',
            DeprecationWarning,
            stacklevel=3,
        )
        return True, self[group][field]

    def __missing__(self, key: Any) -> Any:
        found, value = self._former(key)
        if not found:
            raise KeyError(key)
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        found, value = self._former(key)
        return value if found else default
