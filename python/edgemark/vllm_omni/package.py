"""The vLLM-Omni releases the plugin wraps, and the processes it runs in,
declared once.

Every call site the plugin wraps was checked, by name, parameters and
async-ness, in each release below (``edgemark._instrument.resolve`` checks
them again at run time, in the installed release):

- 0.30.0, 0.31.0rc1, 0.32.0rc1: all call sites present (the adapter's
  ``save_async_batch`` in 0.32.0rc1 only);
- 0.28.0 (the release before): refused. It has neither the model runner's
  connector mixin (``omni_connector_payload_transport``) nor
  ``OrchestratorBase``, and ``ClientRequestState.__init__`` has no
  ``final_stage_id``.
"""

from __future__ import annotations

from typing import Optional, Tuple

from .._instrument import is_supported as _is_supported, requirement

#: The requirement, as the OpenTelemetry contrib instrumentors declare theirs.
_instruments = ("vllm-omni >= 0.30.0, < 0.33",)

#: The installed release must satisfy this (pre-releases and local versions
#: included): the specifier of ``_instruments``, its one statement.
SUPPORTED = requirement(_instruments)[1]

#: The roles a process plays, by the name vLLM and vLLM-Omni give the
#: processes they start, and what each role's call sites are:
#:
#: - ``api``: the API server (or a script's ``Omni``): the orchestrator, the
#:   request state, the responses (``orchestrator``);
#: - ``scheduler``: a stage's engine core: its scheduler and the async-chunk
#:   transfer adapter the scheduler builds (``adapter``);
#: - ``runner``: a model runner's connector mixin (``runner``), in a model
#:   worker, or in the engine core itself when its executor runs the model
#:   in process.
#:
#: A process whose name matches none of these (the API server, a diffusion
#: process, a test's stand-in) patches every role's call sites.
ROLES_BY_PROCESS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("StageEngineCoreProc", ("scheduler", "runner")),
    ("EngineCore", ("scheduler", "runner")),
    ("VllmWorker", ("runner",)),
)

#: How the log line names each role's call sites.
ROLE_NAMES = {
    "api": "orchestrator",
    "scheduler": "transfer adapter",
    "runner": "model runner connector",
}


def is_supported(version: Optional[str]) -> bool:
    """Whether ``version`` (an installed vllm-omni's) is in ``SUPPORTED``."""
    return _is_supported(version, SUPPORTED)
