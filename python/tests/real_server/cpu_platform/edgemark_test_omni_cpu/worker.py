"""Test support: vLLM-Omni's stage workers and model runners on vLLM's CPU
worker and CPU model runner."""

from __future__ import annotations

from vllm.logger import init_logger
from vllm.v1.worker.cpu_model_runner import CPUModelRunner, _torch_cuda_wrapper
from vllm.v1.worker.cpu_worker import CPUWorker

from vllm_omni.worker.gpu_ar_model_runner import GPUARModelRunner
from vllm_omni.worker.gpu_generation_model_runner import GPUGenerationModelRunner
from vllm_omni.worker.mixins import OmniWorkerMixin

logger = init_logger(__name__)


class _CPURunnerMixin:
    """Builds the runner with CUDA streams and events stubbed out, as vLLM's
    CPU runner does, and re-points every device buffer at its host copy
    (vLLM-Omni's runners add buffers after vLLM's CPU runner has done so)."""

    def __init__(self, vllm_config, device):
        # vLLM's CPU platform empties the CUDA-graph capture sizes but leaves
        # their maximum unset, which vLLM-Omni's talker sizes buffers by.
        compilation = vllm_config.compilation_config
        if compilation.max_cudagraph_capture_size is None:
            compilation.max_cudagraph_capture_size = 0
        with _torch_cuda_wrapper():
            super().__init__(vllm_config, device)
        self._postprocess_tensors()

    def _init_device_properties(self):
        self.num_sms = None

    def _sync_device(self) -> None:
        return None


class CPUOmniARModelRunner(_CPURunnerMixin, GPUARModelRunner, CPUModelRunner):
    """vLLM-Omni's autoregressive runner (talker stages) on the CPU."""


class CPUOmniGenerationModelRunner(_CPURunnerMixin, GPUGenerationModelRunner, CPUModelRunner):
    """vLLM-Omni's generation runner (code2wav stages) on the CPU."""


class _CPUOmniWorker(OmniWorkerMixin, CPUWorker):
    model_runner_cls: type

    def init_device(self):
        super().init_device()
        if getattr(self, "use_v2_model_runner", False):
            # vLLM-Omni's stage hooks live in the v1 runners; the v2 CPU
            # runner also needs Triton.
            logger.warning("%s forces the v1 model runner.", type(self).__name__)
            self.use_v2_model_runner = False
        self.model_runner = self.model_runner_cls(self.vllm_config, self.device)


class CPUOmniARWorker(_CPUOmniWorker):
    """CPU worker for vLLM-Omni's autoregressive stages (test support)."""

    model_runner_cls = CPUOmniARModelRunner


class CPUOmniGenerationWorker(_CPUOmniWorker):
    """CPU worker for vLLM-Omni's generation stages (test support)."""

    model_runner_cls = CPUOmniGenerationModelRunner
