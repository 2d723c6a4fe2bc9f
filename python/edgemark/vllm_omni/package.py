"""The vLLM-Omni releases the plugin wraps, declared once.

Every call site the plugin wraps was checked, by name, parameters and
async-ness, in each release below (``_instrumentor.resolve`` checks them
again at run time, in the installed release):

- 0.30.0, 0.31.0rc1, 0.32.0rc1: all call sites present;
- 0.28.0 (the release before): refused. It has neither the model runner's
  connector mixin (``omni_connector_payload_transport``) nor
  ``OrchestratorBase``, and ``ClientRequestState.__init__`` has no
  ``final_stage_id``.
"""

from __future__ import annotations

from typing import Optional

#: The requirement, as the OpenTelemetry contrib instrumentors declare theirs.
_instruments = ("vllm-omni >= 0.30.0, < 0.33",)

#: The installed release must satisfy this (pre-releases included).
SUPPORTED = ">=0.30.0,<0.33"


def is_supported(version: Optional[str]) -> bool:
    """Whether ``version`` (an installed vllm-omni's) is in ``SUPPORTED``."""
    if not version:
        return False
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return SpecifierSet(SUPPORTED, prereleases=True).contains(Version(version))
    except InvalidVersion:
        return False
