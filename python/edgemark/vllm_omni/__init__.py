"""Records vLLM-Omni's stream-edge events into an edgemark region, with no
change to vLLM-Omni's code.

Install ``edgemark[vllm-omni]`` and set ``EDGEMARK_VLLM_OMNI=1``: vLLM and
vLLM-Omni load this package's ``register`` in every one of their processes
(the entry point is in both plugin groups, ``vllm.general_plugins`` and
``vllm_omni.general_plugins``: a stage's engine core loads only vLLM's),
and ``register`` wraps the call sites that run in that process, of both
stage transports and of the API server:

- ``adapter``: the async-chunk transfer adapter, which the scheduler builds
  under the default model runner with ``async_chunk: true`` (most deploy
  files, Qwen3-Omni's among them);
- ``runner``: the model runner's connector mixin (the v2 native data plane,
  and full-payload mode);
- ``orchestrator``: the API server, which begins and closes each request,
  hands its trace context to every stage's engine request, and puts the
  snapshot into every ``Omni``/``AsyncOmni`` output as
  ``metrics["stream_edge_metrics"]`` (the HTTP endpoints' responses do not
  carry it: see docs/vllm-omni.md).

Each module's documentation lists its call sites and what each records.
Supported releases: ``package.SUPPORTED``. The token reaches a stage process
on the API server's host through the request lookup (``_channel``); a stage
on another host begins a request of its own host's under the trace context
its engine request carries (see docs/vllm-omni.md).

Nothing here ever raises into vLLM-Omni: a wrapper that fails records
nothing and calls through; vLLM-Omni's own exceptions pass unchanged.
Outside the supported releases, or when a wrapped attribute is missing or
has another signature, ``instrument`` logs one warning and patches nothing.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

from .. import _instrument
from .._instrument import Instrumentor
from . import adapter, orchestrator, package, runner
from .._clean import clean
from ._recording import ENV_ENABLE, ENV_LOG_REQUESTS, ENV_MAX_OPEN, ENV_REGION, ENV_SLOTS, Recording, log
from .package import SUPPORTED

__all__ = [
    "ENV_ENABLE",
    "ENV_LOG_REQUESTS",
    "ENV_MAX_OPEN",
    "ENV_REGION",
    "ENV_SLOTS",
    "SUPPORTED",
    "clean",
    "close_request",
    "instrument",
    "instrumentor",
    "is_instrumented",
    "register",
    "stage_freed",
    "traceparent_of",
    "uninstrument",
]

#: This process's instrumentor: what ``register`` and ``instrument`` use.
instrumentor: Instrumentor[Recording] = Instrumentor(
    instruments=package._instruments,
    targets={"api": orchestrator.TARGETS, "scheduler": adapter.TARGETS, "runner": runner.TARGETS},
    make_recording=Recording,
    log=log,
    announce=lambda roles, rec: rec.say(
        f"edgemark: recording vLLM-Omni stream-edge events (vllm-omni {_instrument.installed_version('vllm-omni')}) "
        f"in {_instrument.process_name()}, pid {os.getpid()}: "
        f"{', '.join(package.ROLE_NAMES[r] for r in roles)} call sites patched; region {rec.path}"
    ),
)


def register() -> None:
    """The entry point vLLM and vLLM-Omni load in each of their processes
    (``vllm.general_plugins``: the API server, each engine core, each model
    worker; ``vllm_omni.general_plugins``: the API server, model workers,
    diffusion processes): ``instrument()`` when ``EDGEMARK_VLLM_OMNI=1``,
    else nothing. Says once per process, on vLLM's logger, what it patched
    and where it records, or why it records nothing. Never raises."""
    instrumentor.register_from(ENV_ENABLE, "vLLM-Omni", "stream-edge events are", instrument)


def instrument() -> bool:
    """Wraps the vLLM-Omni call sites that run in this process (its roles:
    ``package.ROLES_BY_PROCESS``). Idempotent: a later call does nothing.
    Returns whether they are patched; the call that patches says so in one
    INFO line."""
    return instrumentor.instrument(_instrument.process_roles(package.ROLES_BY_PROCESS, ("api", "scheduler", "runner")))


def uninstrument() -> None:
    """Puts back every function ``instrument`` replaced. Idempotent."""
    instrumentor.uninstrument()


def is_instrumented() -> bool:
    """Whether this process's vLLM-Omni is patched."""
    return instrumentor.is_instrumented


def traceparent_of(request_id: str) -> Optional[str]:
    """The W3C ``traceparent`` the API server hands ``request_id``'s stages
    (its trace, the request's own span as the parent), or ``None`` when this
    process began no such request."""
    rec = instrumentor.recording
    return rec.traceparent(request_id) if rec is not None else None


def close_request(request_id: str) -> Dict[str, Any]:
    """Closes a request this process (the API server) began, as its cleanup
    does; returns the final snapshot (``{}`` if there is none)."""
    rec = instrumentor.recording
    return rec.close(request_id) if rec is not None else {}


def stage_freed(request_id: str) -> None:
    """What a stage's wrappers do when the stage frees ``request_id``: forget
    the instance in this process, and close it if this process began it on
    its own host's region."""
    rec = instrumentor.recording
    if rec is not None:
        rec.stage_freed(request_id)
