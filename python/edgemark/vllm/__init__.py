"""Records vLLM's disaggregated prefill -> decode hand-off (the KV transfer
between a prefill instance and a decode instance) into an edgemark region,
with no change to vLLM's code: the four first events of each request on the
edge prefill (stage 0) -> decode (stage 1).

Install edgemark into vLLM's environment and set ``EDGEMARK_VLLM=1`` on both
instances; give both the same ``EDGEMARK_VLLM_REGION`` when they run on one
host. vLLM loads this package's ``register`` (entry point ``edgemark_vllm``
in ``vllm.general_plugins``) in the API server, the engine core and each
model worker, and ``register`` wraps the call sites of that process:

- ``api``: the API server, which begins each request (``api``);
- ``connector``: ``KVConnectorFactory.create_connector``, whose connector
  instances get their hooks wrapped: NixlConnector, and any connector with
  the same hooks (``connector``);
- ``engine``: the scheduler's per-step output, for the decode side's first
  token (``connector``).

================================  =============================  ==========================
event                             process                        where
================================  =============================  ==========================
``producer_first_nonempty_emit``  prefill engine core            the connector's
                                                                 ``request_finished`` keeps
                                                                 the blocks for a decode
``edge_first_send_complete``      prefill worker                 a decode side notified it
                                                                 has read the blocks
``consumer_first_accept``         decode engine core             ``update_connector_output``:
                                                                 every worker rank has
                                                                 loaded the KV
``consumer_first_nonempty_output``decode engine core             first sampled token
================================  =============================  ==========================

Tested releases: ``package.SUPPORTED`` (0.32.0, 0.33.0, 0.34.0). Nothing
here ever raises into vLLM: a wrapper that fails records nothing and calls
through. Below the tested range, or when a wrapped attribute is missing or
has another signature, ``instrument`` logs one warning and patches nothing;
above it, it records when every call site and field checks out, with one
warning that names the tested range. A field a part of the wrappers reads
that is missing refuses that part, with one warning naming the events lost
(``package.PARTS``); a connector without the hooks is left alone with one
warning. See docs/vllm.md.
"""

from __future__ import annotations

import os

from .. import _instrument
from .._clean import clean
from .._instrument import Instrumentor
from . import api, connector, package
from ._recording import ENV_ENABLE, ENV_MAX_OPEN, ENV_REGION, ENV_SLOTS, Recording, log
from .package import SUPPORTED

__all__ = [
    "ENV_ENABLE",
    "ENV_MAX_OPEN",
    "ENV_REGION",
    "ENV_SLOTS",
    "SUPPORTED",
    "clean",
    "instrument",
    "instrumentor",
    "is_instrumented",
    "register",
    "uninstrument",
]

#: This process's instrumentor: what ``register`` and ``instrument`` use.
instrumentor: Instrumentor[Recording] = Instrumentor(
    instruments=package._instruments,
    targets={"api": api.TARGETS, "engine": connector.ENGINE_TARGETS, "connector": connector.TARGETS},
    make_recording=Recording,
    log=log,
    parts=package.PARTS,
    announce=lambda roles, rec: rec.say(
        f"edgemark: recording the P/D KV hand-off (vllm {_instrument.installed_version('vllm')}) "
        f"in {_instrument.process_name()}, pid {os.getpid()}: "
        f"{', '.join(package.ROLE_NAMES[r] for r in roles)} call sites patched; region {rec.path}"
    ),
)


def register() -> None:
    """The entry point vLLM loads in each of its processes
    (``vllm.general_plugins``: the API server, each engine core, each model
    worker): ``instrument()`` when ``EDGEMARK_VLLM=1``, else nothing. Says
    once per process, on vLLM's logger, what it patched and where it
    records, or why it records nothing. Never raises."""
    instrumentor.register_from(ENV_ENABLE, "vLLM", "the P/D hand-off is", instrument)


def instrument() -> bool:
    """Wraps the vLLM call sites that run in this process (its roles:
    ``package.ROLES_BY_PROCESS``). Idempotent. Returns whether they are
    patched; the call that patches says so in one INFO line."""
    return instrumentor.instrument(_instrument.process_roles(package.ROLES_BY_PROCESS, package.ROLES))


def uninstrument() -> None:
    """Puts back every function ``instrument`` replaced (connector instances
    already wrapped keep their wrappers). Idempotent."""
    instrumentor.uninstrument()


def is_instrumented() -> bool:
    """Whether this process's vLLM is patched."""
    return instrumentor.is_instrumented
