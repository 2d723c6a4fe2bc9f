"""Test support for running vLLM-Omni on the CPU.

vLLM-Omni picks its platform among CUDA, ROCm, NPU, XPU and MUSA and has none
for the CPU. This package adds one through the ``vllm_omni.platform_plugins``
entry-point group: a platform that is vLLM-Omni's ``OmniPlatform`` over
vLLM's ``CpuPlatform``, with workers and model runners that are vLLM-Omni's
GPU ones over vLLM's ``CPUWorker`` and ``CPUModelRunner`` (the way vLLM-Omni
builds its XPU platform). It exists for the project's tests only.

The platform turns itself on when vLLM's own platform is the CPU, unless
``EDGEMARK_TEST_OMNI_CPU=0``.
"""

from __future__ import annotations

import os

PLATFORM = "edgemark_test_omni_cpu.platform.CPUOmniPlatform"


def omni_platform() -> str | None:
    """Entry point of ``vllm_omni.platform_plugins``: the platform class's
    qualified name when this process runs vLLM on the CPU, else ``None``."""
    if os.environ.get("EDGEMARK_TEST_OMNI_CPU", "1") == "0":
        return None
    try:
        from vllm.platforms import current_platform
    except Exception:
        return None
    if getattr(current_platform, "device_type", None) != "cpu":
        return None
    return PLATFORM
