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

What the wrappers *read* is checked the same way (``Field``): the fields
of the framework's objects, the attributes of its workers, the keys of its
parameter dictionaries. They are grouped in parts (``Part``), each naming
the events it feeds; a part whose fields do not check out is refused on its
own, with one warning that names what is lost, and its call sites are left
unpatched, while the other parts record. A part marked ``essential`` (what
every event needs) refuses the whole set.

A release newer than the tested range (``_instruments``) is instrumented
when every call site and field checks out, with one warning that names the
tested range; an older one is refused (docs/vllm.md, "Releases").
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
    #: The ``Part`` whose fields the wrapper reads: unpatched when that part
    #: is refused.
    part: Optional[str] = None

    @property
    def name(self) -> str:
        return f"{self.cls}.{self.attr}" if self.cls else f"{self.module}.{self.attr}"


#: The variable vLLM adds prefixes from to what its Ray executors copy to
#: the processes they start (vLLM 0.32 on; comma-separated).
RAY_PREFIXES_VAR = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"
#: The prefixes of the plugins' variables: the switches, the region's name
#: and the instance's (``_presence``), each inherited by every process.
OWN_PREFIXES = ("EDGEMARK_", "_EDGEMARK_")


def carry_to_ray() -> None:
    """Has vLLM's Ray executors copy the plugins' variables to the
    processes they start on any node (engine cores as Ray actors with data
    parallel over Ray, workers of the older Ray executor), as they copy
    vLLM's own: the plugins' prefixes are added to ``RAY_PREFIXES_VAR`` in
    this process's environment, which the processes it starts inherit and
    vLLM reads when it starts them. What the user put there stays."""
    have = [p.strip() for p in os.environ.get(RAY_PREFIXES_VAR, "").split(",") if p.strip()]
    missing = [p for p in OWN_PREFIXES if p not in have]
    if missing:
        os.environ[RAY_PREFIXES_VAR] = ",".join(have + missing)


class MissingError(LookupError):
    """A call site is not there at all."""


@dataclass(frozen=True)
class Field:
    """One thing a wrapper reads on the framework's objects, checked before
    anything is patched (``check_field``). ``kind`` says how:

    - ``"field"``: a field of ``module.cls`` (a dataclass or msgspec field,
      an annotation, or a class attribute);
    - ``"init"``: an attribute ``cls.__init__`` (or a base's) sets, or a
      field as above;
    - ``"method"``: a method of ``cls`` whose parameters after ``self``
      start with ``params``;
    - ``"key"``: the string ``attr``, quoted, in the source of ``module``
      (a key of a parameter dictionary the module reads or writes; ``cls``
      is ``None``).
    """

    module: str
    cls: Optional[str]
    attr: str
    kind: str = "field"
    params: Tuple[str, ...] = ()

    @property
    def name(self) -> str:
        if self.kind == "key":
            return f"the key {self.attr!r} in {self.module}"
        return f"{self.cls}.{self.attr}"


@dataclass(frozen=True)
class Part:
    """The fields one group of events is recorded from (``lost``: what a
    refusal costs, as the warning says it)."""

    fields: Tuple[Field, ...]
    lost: str
    #: Every event needs it: its refusal refuses the whole set.
    essential: bool = False


def _class_fields(cls: type) -> set:
    names: set = set()
    for c in cls.__mro__:
        own = getattr(c, "__dict__", {})
        for key in ("__annotations__", "__struct_fields__", "__dataclass_fields__"):
            found = own.get(key)
            if isinstance(found, (dict, tuple, list)):
                names.update(n for n in found if isinstance(n, str))
    return names


def check_field(f: Field) -> Optional[str]:
    """What is wrong with ``f`` in the installed framework, or ``None``."""
    try:
        module = importlib.import_module(f.module)
    except Exception as e:  # noqa: BLE001 - any import failure is a refusal
        return f"{f.module} does not import ({e})"
    if f.kind == "key":
        try:
            source = inspect.getsource(module)
        except (OSError, TypeError):
            return f"the source of {f.module} cannot be read"
        if f'"{f.attr}"' not in source and f"'{f.attr}'" not in source:
            return f"{f.name} is not used any more"
        return None
    cls = getattr(module, f.cls or "", None)
    if not isinstance(cls, type):
        return f"{f.module}.{f.cls} is missing"
    if f.kind == "method":
        method = inspect.getattr_static(cls, f.attr, None)
        method = _unwrap(method)
        if not inspect.isfunction(method):
            return f"{f.name} is missing"
        params = tuple(inspect.signature(method).parameters)[1:]
        if params[: len(f.params)] != f.params:
            return f"{f.name} takes {params}, expected {f.params}"
        return None
    if f.attr in _class_fields(cls) or inspect.getattr_static(cls, f.attr, None) is not None:
        return None
    if f.kind == "init":
        for c in cls.__mro__:
            init = c.__dict__.get("__init__")
            if inspect.isfunction(init) and f.attr in init.__code__.co_names:
                return None
    return f"{f.name} is missing"


def newer_than(version: Optional[str], spec: str) -> bool:
    """Whether ``version`` is past the top of ``spec``: it satisfies every
    lower bound and fails an upper one (a release newer than the tested
    range, rather than an older one)."""
    if not version:
        return False
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(version)
    except InvalidVersion:
        return False
    upper = [s for s in SpecifierSet(spec, prereleases=True) if s.operator in ("<", "<=")]
    rest = [s for s in SpecifierSet(spec, prereleases=True) if s.operator not in ("<", "<=", "!=")]
    return (
        bool(upper)
        and all(s.contains(v, prereleases=True) for s in rest)
        and not all(s.contains(v, prereleases=True) for s in upper)
    )


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

    ``targets`` maps each role to its call sites; ``parts`` names the
    fields each part of the wrappers reads (``Part``; a target's ``part``
    ties it to one); ``make_recording`` makes this process's recording state
    (once), given the callback that puts every call site back; ``announce``
    says, once, what was patched (the roles, the recording state)."""

    def __init__(
        self,
        *,
        instruments: Tuple[str, ...],
        targets: Dict[str, Tuple[Target, ...]],
        make_recording: Callable[[Callable[[], None]], R],
        log: logging.Logger,
        announce: Optional[Callable[[Tuple[str, ...], R], None]] = None,
        parts: Optional[Dict[str, Part]] = None,
    ) -> None:
        self.instruments = instruments
        self.distribution, self.supported = requirement(instruments)
        self._targets = targets
        self._make_recording = make_recording
        self._log = log
        self._announce = announce
        self._parts: Dict[str, Part] = dict(parts or {})
        #: The parts refused in this process, with why (their wrappers are
        #: not patched; the recording state's ``broken`` is the same dict).
        self.broken: Dict[str, str] = {}
        #: Whether the installed release is newer than the tested range.
        self.untested = False
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
        Returns whether they are patched. Below the supported range, or
        when a call site of these roles is missing or has another signature,
        or an essential part's fields do not check out, logs one warning and
        patches nothing (later calls in this process return ``False``
        without another warning). Above the range, patches when all of that
        checks out, with one warning naming the tested range. A part whose
        fields do not check out is left unpatched, with one warning each."""
        with self._lock:
            if self._patched:
                return True
            if self._refused:
                return False
            return self._instrument(tuple(self._targets) if roles is None else tuple(roles))

    def _instrument(self, roles: Tuple[str, ...]) -> bool:
        ver = installed_version(self.distribution)
        untested = newer_than(ver, self.supported)
        if not untested and not is_supported(ver, self.supported):
            self._refused = True
            self._log.warning(
                "edgemark: %s %s is not supported (%s %s); nothing is recorded in this process",
                self.distribution,
                ver or "(not installed)",
                self.distribution,
                self.supported,
            )
            return False
        broken = self.check_parts()
        essential = [name for name in broken if self._parts[name].essential]
        if essential:
            self._refused = True
            self._log.warning(
                "edgemark: %s %s has changed what edgemark reads (%s); nothing is patched",
                self.distribution,
                ver,
                broken[essential[0]],
            )
            return False
        resolved = []
        try:
            for t in self.targets(roles):
                if t.part in broken:
                    continue
                try:
                    resolved.append((t, *resolve(t)))
                except (MissingError, ImportError):
                    # An optional call site may be missing, its module too.
                    if not t.optional:
                        raise
        except (LookupError, ImportError, ValueError, TypeError) as e:
            self._refused = True
            self._log.warning(
                "edgemark: %s %s has changed where edgemark hooks in (%s); nothing is patched", self.distribution, ver, e
            )
            return False
        if untested:
            self._log.warning(
                "edgemark: %s %s is newer than the releases edgemark was tested with (%s %s); every call site "
                "and field edgemark uses checks out, so it records. If an event goes missing, pin %s to the "
                "tested range or upgrade edgemark",
                self.distribution,
                ver,
                self.distribution,
                self.supported,
                self.distribution,
            )
        self.untested = untested
        for name, why in broken.items():
            self._log.warning(
                "edgemark: %s %s has changed what edgemark reads (%s): %s not recorded; the other events are",
                self.distribution,
                ver,
                why,
                self._parts[name].lost,
            )
        self.broken.clear()
        self.broken.update(broken)
        rec = self.recording
        if rec is None:
            rec = self.recording = self._make_recording(self.uninstrument)
        if hasattr(rec, "broken"):
            rec.broken = self.broken  # type: ignore[attr-defined]
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

    def check_parts(self) -> Dict[str, str]:
        """The parts whose fields do not check out in the installed
        release, each with its first problem."""
        broken: Dict[str, str] = {}
        for name, part in self._parts.items():
            for f in part.fields:
                try:
                    why = check_field(f)
                except Exception as e:  # noqa: BLE001 - a check that fails refuses its part
                    why = f"{f.name} could not be checked ({e!r})"
                if why is not None:
                    broken[name] = why
                    break
        return broken

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
            carry_to_ray()
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
