"""The instrumentor: one object that checks the installed vLLM-Omni, wraps
its call sites and puts them back, and holds this process's ``Recording``.

Shaped as the OpenTelemetry contrib instrumentors are (``instrument`` /
``uninstrument`` around ``_instrument`` / ``_uninstrument``, the supported
range declared once in ``package.py``). The wrappers are plain closures
made with ``functools.wraps``, not ``wrapt``: a ``wrapt`` method wrapper cost
1.1 us per call here against 0.12 us for a closure (docs/benchmarks.md),
more than the plugin's whole budget per chunk.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import threading
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

from . import package
from ._recording import Recording, log


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
    wrap: Optional[Callable[[Callable, Recording], Callable]]
    is_async: bool = False

    @property
    def name(self) -> str:
        return f"{self.cls}.{self.attr}" if self.cls else f"{self.module}.{self.attr}"


class MissingError(LookupError):
    """A call site is not there at all."""


def resolve(target: Target) -> Tuple[Any, Callable]:
    """The class (or module) and the function a target wraps;
    ``LookupError`` saying what is missing or has changed."""
    module = importlib.import_module(target.module)
    if target.cls is None:
        owner: Any = module
        func = module.__dict__.get(target.attr)
    else:
        owner = getattr(module, target.cls, None)
        if not isinstance(owner, type):
            raise MissingError(f"{target.module}.{target.cls} is missing")
        func = owner.__dict__.get(target.attr)
    if not inspect.isfunction(func):
        raise MissingError(f"{target.name} is missing")
    if target.is_async != inspect.iscoroutinefunction(func):
        raise LookupError(f"{target.name} is {'not ' if target.is_async else ''}a coroutine function")
    if target.params is not None:
        names = tuple(inspect.signature(func).parameters)[: len(target.params)]
        if names != target.params:
            raise LookupError(f"{target.name} takes {names}, expected {target.params}")
    return owner, func


def installed_version() -> Optional[str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm-omni")
    except PackageNotFoundError:
        return None


class VllmOmniInstrumentor:
    """Wraps vLLM-Omni's call sites in this process (see the package's
    documentation for which and why). Idempotent, never raises."""

    def __init__(self) -> None:
        #: (class or module, attribute, original) of every patch in place.
        self._patched: List[Tuple[Any, str, Callable]] = []
        #: Whether this process's vLLM-Omni was found unsupported (said once).
        self._refused = False
        self._lock = threading.RLock()
        self.recording: Optional[Recording] = None

    def instrumentation_dependencies(self) -> Tuple[str, ...]:
        return package._instruments

    @property
    def is_instrumented(self) -> bool:
        return bool(self._patched)

    def targets(self) -> Tuple[Target, ...]:
        """Every call site a supported release has."""
        from . import adapter, orchestrator, runner

        return adapter.TARGETS + runner.TARGETS + orchestrator.TARGETS

    def optional_targets(self) -> Tuple[Target, ...]:
        """Call sites of some supported releases only."""
        from . import adapter

        return adapter.OPTIONAL

    def instrument(self) -> bool:
        """Returns whether the call sites are patched. Outside
        ``package.SUPPORTED``, or when any wrapped attribute is missing or
        has another signature, logs one warning and patches nothing (later
        calls in this process return ``False`` without another warning)."""
        with self._lock:
            if self._patched:
                return True
            if self._refused:
                return False
            return self._instrument()

    def _instrument(self) -> bool:
        ver = installed_version()
        if not package.is_supported(ver):
            self._refused = True
            log.warning(
                "edgemark: vllm-omni %s is not supported (vllm-omni %s); stream-edge events are not recorded",
                ver or "(not installed)",
                package.SUPPORTED,
            )
            return False
        try:
            resolved = [(t, *resolve(t)) for t in self.targets()]
            for t in self.optional_targets():
                try:
                    resolved.append((t, *resolve(t)))
                except MissingError:
                    pass
        except (LookupError, ImportError, ValueError, TypeError) as e:
            self._refused = True
            log.warning("edgemark: vllm-omni %s has changed where the plugin hooks in (%s); nothing is patched", ver, e)
            return False
        # The API server names the region now, before it starts the stage
        # processes that inherit the name.
        rec = self.recording = self.recording or Recording()
        rec.uninstrument = self.uninstrument
        for target, owner, func in resolved:
            if target.wrap is None:
                continue
            wrapper = functools.wraps(func)(target.wrap(func, rec))
            setattr(owner, target.attr, wrapper)
            self._patched.append((owner, target.attr, func))
        return True

    def uninstrument(self) -> None:
        """Puts back every function ``instrument`` replaced. Idempotent. The
        region, if this process created one, stays until the process exits."""
        with self._lock:
            self._uninstrument()

    def _uninstrument(self) -> None:
        while self._patched:
            owner, attr, func = self._patched.pop()
            setattr(owner, attr, func)
