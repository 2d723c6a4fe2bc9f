"""What edgemark's integrations share: a call site (``Target``), how one is
found and checked (``resolve``), and the instrumentor that patches a
process's call sites and puts them back (``Instrumentor``).

Shaped as the OpenTelemetry contrib instrumentors are (``instrument`` /
``uninstrument``, the supported range declared once). The wrappers are plain
closures made with ``functools.wraps``, not ``wrapt``: a ``wrapt`` method
wrapper cost 1.1 us per call here against 0.12 us for a closure
(docs/benchmarks.md), more than a plugin's whole budget per chunk.

A process patches the call sites of its roles only (an API server's, an
engine core's, a model worker's: ``process_roles``), each checked by name,
parameters and async-ness before anything is patched: one that is missing
or has changed refuses the whole set, with one warning, and the process
records nothing.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import multiprocessing
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Generic, Iterable, List, Optional, Sequence, Tuple, TypeVar

R = TypeVar("R")


@dataclass(frozen=True)
class Target:
    """One call site: ``module.cls.attr``, or the module function
    ``module.attr`` when ``cls`` is ``None``."""

    module: str
    cls: Optional[str]
    attr: str
    #: The parameter names the wrapper relies on, in order (``None``: any).
    params: Optional[Tuple[str, ...]]
    #: Makes the wrapper from the original and the recording; ``None``:
    #: checked, not patched.
    wrap: Optional[Callable[[Callable, Any], Callable]]
    is_async: bool = False
    #: Present in some supported releases only: wrapped where it exists.
    optional: bool = False

    @property
    def name(self) -> str:
        return f"{self.cls}.{self.attr}" if self.cls else f"{self.module}.{self.attr}"


class MissingError(LookupError):
    """A call site is not there at all."""


def _unwrap(raw: Any) -> Any:
    """The function inside a ``staticmethod`` or ``classmethod``."""
    return raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw


def _rewrap(raw: Any, wrapper: Callable) -> Any:
    """``wrapper`` as the same kind of attribute as ``raw`` was."""
    return type(raw)(wrapper) if isinstance(raw, (staticmethod, classmethod)) else wrapper


def resolve(target: Target) -> Tuple[Any, Callable]:
    """The class (or module) and the function a target wraps (the function
    itself for a ``staticmethod`` or ``classmethod``, whose first parameter
    is then ``cls``); ``LookupError`` saying what is missing or has
    changed."""
    module = importlib.import_module(target.module)
    if target.cls is None:
        owner: Any = module
        func = module.__dict__.get(target.attr)
    else:
        owner = getattr(module, target.cls, None)
        if not isinstance(owner, type):
            raise MissingError(f"{target.module}.{target.cls} is missing")
        func = _unwrap(owner.__dict__.get(target.attr))
    if not inspect.isfunction(func):
        raise MissingError(f"{target.name} is missing")
    if target.is_async != inspect.iscoroutinefunction(func):
        raise LookupError(f"{target.name} is {'not ' if target.is_async else ''}a coroutine function")
    if target.params is not None:
        names = tuple(inspect.signature(func).parameters)[: len(target.params)]
        if names != target.params:
            raise LookupError(f"{target.name} takes {names}, expected {target.params}")
    return owner, func


def installed_version(distribution: str) -> Optional[str]:
    """The installed version of ``distribution``, or ``None``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def is_supported(version: Optional[str], spec: str) -> bool:
    """Whether ``version`` is in the specifier set ``spec`` (pre-releases
    included)."""
    if not version:
        return False
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return SpecifierSet(spec, prereleases=True).contains(Version(version))
    except InvalidVersion:
        return False


def requirement(instruments: Tuple[str, ...]) -> Tuple[str, str]:
    """The distribution and the version specifier of a plugin's one
    requirement, as the OpenTelemetry contrib instrumentors declare it
    (``_instruments = ("vllm >= 0.32.0, < 0.33",)``): the one place the
    supported range is written."""
    (only,) = instruments
    m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*?)\s*", only)
    if m is None or not m.group(2):
        raise ValueError(f"not a requirement with a version range: {only!r}")
    return m.group(1), re.sub(r"\s+", "", m.group(2))


def process_name() -> str:
    """This process's name as ``multiprocessing`` knows it: what vLLM names
    the processes it starts (``EngineCore_DP0``, ``VllmWorker-0``, vLLM-Omni's
    ``StageEngineCoreProc_stage0_replica0``), ``MainProcess`` otherwise."""
    return multiprocessing.current_process().name


def process_roles(roles_by_prefix: Sequence[Tuple[str, Tuple[str, ...]]], every: Iterable[str]) -> Tuple[str, ...]:
    """The roles of this process: those of the first prefix its name starts
    with, else every role (an API server, a script, a process started some
    other way: patching a call site that never runs there costs nothing)."""
    name = process_name()
    for prefix, roles in roles_by_prefix:
        if name.startswith(prefix):
            return roles
    return tuple(every)


class Instrumentor(Generic[R]):
    """Patches the call sites of one integration in this process and puts
    them back. Idempotent, never raises.

    ``targets`` maps each role to its call sites; ``make_recording`` makes
    this process's recording state (once), given the callback that puts
    every call site back; ``announce`` says, once, what was patched (the
    roles, the recording state)."""

    def __init__(
        self,
        *,
        instruments: Tuple[str, ...],
        targets: Dict[str, Tuple[Target, ...]],
        make_recording: Callable[[Callable[[], None]], R],
        log: logging.Logger,
        announce: Optional[Callable[[Tuple[str, ...], R], None]] = None,
    ) -> None:
        self.instruments = instruments
        self.distribution, self.supported = requirement(instruments)
        self._targets = targets
        self._make_recording = make_recording
        self._log = log
        self._announce = announce
        #: (class or module, attribute, original attribute) of every patch
        #: in place.
        self._patched: List[Tuple[Any, str, Callable]] = []
        #: Whether this process's release was found unsupported (said once).
        self._refused = False
        self._lock = threading.RLock()
        #: The roles whose call sites are patched.
        self.roles: Tuple[str, ...] = ()
        self.recording: Optional[R] = None

    def instrumentation_dependencies(self) -> Tuple[str, ...]:
        return self.instruments

    @property
    def is_instrumented(self) -> bool:
        return bool(self._patched)

    def targets(self, roles: Optional[Iterable[str]] = None) -> Tuple[Target, ...]:
        """The call sites of ``roles`` (default: every role), each once."""
        chosen = self._targets if roles is None else {r: self._targets[r] for r in roles if r in self._targets}
        seen: Dict[Tuple[str, Optional[str], str], Target] = {}
        for group in chosen.values():
            for t in group:
                seen.setdefault((t.module, t.cls, t.attr), t)
        return tuple(seen.values())

    def instrument(self, roles: Optional[Iterable[str]] = None) -> bool:
        """Patches the call sites of ``roles`` (default: every role).
        Returns whether they are patched. Outside the supported range, or
        when a call site of these roles is missing or has another signature,
        logs one warning and patches nothing (later calls in this process
        return ``False`` without another warning)."""
        with self._lock:
            if self._patched:
                return True
            if self._refused:
                return False
            return self._instrument(tuple(self._targets) if roles is None else tuple(roles))

    def _instrument(self, roles: Tuple[str, ...]) -> bool:
        ver = installed_version(self.distribution)
        if not is_supported(ver, self.supported):
            self._refused = True
            self._log.warning(
                "edgemark: %s %s is not supported (%s %s); nothing is recorded in this process",
                self.distribution,
                ver or "(not installed)",
                self.distribution,
                self.supported,
            )
            return False
        resolved = []
        try:
            for t in self.targets(roles):
                try:
                    resolved.append((t, *resolve(t)))
                except MissingError:
                    if not t.optional:
                        raise
        except (LookupError, ImportError, ValueError, TypeError) as e:
            self._refused = True
            self._log.warning(
                "edgemark: %s %s has changed where edgemark hooks in (%s); nothing is patched", self.distribution, ver, e
            )
            return False
        rec = self.recording
        if rec is None:
            rec = self.recording = self._make_recording(self.uninstrument)
        for target, owner, func in resolved:
            if target.wrap is None:
                continue
            raw = owner.__dict__[target.attr]
            wrapper = functools.wraps(func)(target.wrap(func, rec))
            setattr(owner, target.attr, _rewrap(raw, wrapper))
            self._patched.append((owner, target.attr, raw))
        self.roles = roles
        if self._announce is not None:
            self._announce(roles, rec)
        return True

    def register_from(self, var: str, plugin: str, what: str, instrument: Callable[[], bool]) -> None:
        """The body of a plugin's entry point: nothing unless the variable
        ``var`` is set; ``instrument()`` when it is ``1``; else one warning
        that ``what`` is not recorded. Never raises (``plugin`` names the
        plugin in the warning if anything does)."""
        try:
            value = os.environ.get(var)
            if not value:
                return
            follow_vllm_logging()
            if value != "1":
                self.refuse("edgemark: %s=%r is not 1: %s not recorded", var, value, what)
                return
            instrument()
        except Exception as e:  # noqa: BLE001 - a plugin must not stop the server
            self._log.warning("edgemark: the %s plugin did not load: %s", plugin, e)

    def refuse(self, message: str, *args: Any) -> None:
        """Records nothing in this process, for a reason said once (as a
        warning): later ``instrument`` calls return ``False``."""
        with self._lock:
            if self._refused or self._patched:
                return
            self._refused = True
            self._log.warning(message, *args)

    def uninstrument(self) -> None:
        """Puts back every function ``instrument`` replaced. Idempotent.
        The recording state stays (a region this process made stays until
        the process exits)."""
        with self._lock:
            while self._patched:
                owner, attr, func = self._patched.pop()
                setattr(owner, attr, func)


def follow_vllm_logging() -> None:
    """Sends edgemark's log lines where vLLM sends its own, under vLLM's
    format and level, as vLLM-Omni does for its ``vllm_omni`` logger: the
    ``edgemark`` logger becomes a child of ``vllm``'s. Called only inside a
    vLLM process (by an entry point vLLM loads), and only while nobody gave
    the ``edgemark`` loggers handlers of their own (a logging configuration
    that names them is left as it is). Where vLLM's logging is not set up
    (``VLLM_CONFIGURE_LOGGING=0``), lines pass through ``vllm`` to the root
    logger as before."""
    vllm = logging.getLogger("vllm")
    ours = logging.getLogger("edgemark")
    if ours.parent is vllm or ours.handlers:
        return
    if any(
        isinstance(lg, logging.Logger) and lg.handlers
        for name, lg in logging.Logger.manager.loggerDict.items()
        if name.startswith("edgemark.")
    ):
        return
    ours.parent = vllm
