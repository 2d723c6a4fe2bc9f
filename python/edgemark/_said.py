"""How the plugins (``edgemark.vllm``, ``edgemark.vllm_omni``) say what
happens to their recording, written once: a line said once per process for
what cannot change while it runs (``Once``), a warning said when its
condition starts and again at most once per ``SAY_AGAIN_S`` while it lasts
(``Said``, never once per process lifetime), and the one INFO line that
waits for vLLM's logging (``say``)."""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, Dict, Set

#: A condition that stops recording is said again after this long while it
#: lasts.
SAY_AGAIN_S = 60.0


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



def say(log: logging.Logger, message: str) -> bool:
    """Says ``message`` now (``True``) if vLLM's logging is set up or vLLM
    is not loaded; ``False`` when it should wait (a vLLM API server loads
    its plugins before it configures logging, and a line said then is
    lost)."""
    if logging.getLogger("vllm").handlers or "vllm" not in sys.modules:
        log.info("%s", message)
        return True
    return False



__all__ = ["SAY_AGAIN_S", "Once", "Said", "say"]
