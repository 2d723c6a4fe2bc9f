"""Start real ``vllm serve`` instances for disaggregated prefill/decode
(P/D) on the CPU, and do a P/D proxy's two steps against them.

Test support, standard library only, so it imports with the Python of any
environment the servers run in::

    from server import VllmServer, free_port, pd_complete

    p, d = VllmServer(python, model, free_port(), free_port()), VllmServer(...)
    with p, d:
        p.wait_ready(300); d.wait_ready(300)
        first, second = pd_complete(p.port, d.port, "Hello " * 40, max_tokens=8,
                                    request_id="pd-1", traceparent=tp)

Each ``VllmServer`` runs ``<env>/bin/vllm serve MODEL`` as a user does for
P/D over NIXL on the CPU: ``--kv-transfer-config`` with ``NixlConnector``,
``kv_role`` ``kv_both`` and ``kv_buffer_device`` ``cpu``, its own
``VLLM_NIXL_SIDE_CHANNEL_PORT``, ``--enforce-eager --dtype float32
--block-size 32``, and ``VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1
VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=1``. It runs in a session of its own, so that the API server
and its engine core share one process group that ``stop`` clears.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# The process group and the HTTP the real-server suites share (``../_server.py``;
# the tests take ``free_port``, ``group_pids`` and ``health`` from here).
if str(HERE.parent) not in sys.path:
    sys.path.append(str(HERE.parent))
from _server import (  # noqa: E402, F401
    CPU_ENV,
    HOST,
    HTTPError,
    ServerProcess,
    bin_dir,
    free_port,
    group_pids,
    health,
    post,
)

# What each instance's environment needs on the CPU: ``CPU_ENV``, and its
# one OpenMP thread unbound. Without ``VLLM_CPU_OMP_THREADS_BIND=nobind``
# vLLM's CPU worker binds an OpenMP thread to every core and sets
# ``OMP_NUM_THREADS`` to match, whatever the environment says; two instances
# on two cores then spin four threads on two cores, and NIXL's hand-offs
# wait for the prefill side's lease to expire (README.md here).
SERVER_ENV = {**CPU_ENV, "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def kv_transfer_config(extra: dict | None = None) -> str:
    """The ``--kv-transfer-config`` of one instance: NIXL, either role,
    its KV buffer in host memory; `extra` becomes
    ``kv_connector_extra_config`` (``{"kv_lease_duration": 10}``: how long
    a prefill instance holds a request's blocks for a decode that does not
    come, 30 s by default)."""
    config = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}
    if extra:
        config["kv_connector_extra_config"] = dict(extra)
    return json.dumps(config, separators=(",", ":"))


class VllmServer(ServerProcess):
    """One ``vllm serve`` instance of a P/D pair (context manager: start,
    stop).

    `env` is laid over this process's environment without its ``EDGEMARK_*``
    variables and over ``SERVER_ENV``: the edgemark plugin stays off unless
    `env` sets ``EDGEMARK_VLLM``. `nice` runs the server at that niceness;
    `host` is the address it listens on, its NIXL side channel's too (the
    decode instance reaches the prefill instance's there).
    """

    name = "vllm serve"

    def __init__(
        self,
        python: str | os.PathLike,
        model_dir: str | os.PathLike,
        port: int,
        side_channel_port: int,
        env: dict[str, str] | None = None,
        log_path: str | os.PathLike | None = None,
        kv_extra: dict | None = None,
        extra_args: tuple[str, ...] = (),
        nice: int = 0,
        host: str = HOST,
    ):
        super().__init__(python, port, env, log_path, extra_args, host)
        self.model_dir = str(model_dir)
        self.side_channel_port = int(side_channel_port)
        self.kv_extra = kv_extra
        self.nice = int(nice)

    def command(self) -> list[str]:
        cmd = [
            str(bin_dir(self.python) / "vllm"),
            "serve",
            self.model_dir,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--enforce-eager",
            "--dtype",
            "float32",
            "--block-size",
            "32",
            "--max-model-len",
            "2048",
            "--kv-transfer-config",
            kv_transfer_config(self.kv_extra),
            *self.extra_args,
        ]
        return (["nice", "-n", str(self.nice)] if self.nice else []) + cmd

    def server_env(self) -> dict[str, str]:
        # The NIXL side channel's address, where the decode instance reaches it.
        nixl = {"VLLM_NIXL_SIDE_CHANNEL_HOST": self.host, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(self.side_channel_port)}
        return {**SERVER_ENV, **nixl}


# ------------------------------------------------------------------ requests


class CompletionError(HTTPError):
    what = "completion"


def model_name(port: int, host: str = HOST) -> str:
    """The one model the instance serves (``GET /v1/models``)."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", "/v1/models")
        return json.loads(conn.getresponse().read())["data"][0]["id"]
    finally:
        conn.close()


def complete(
    port: int,
    body: dict,
    request_id: str | None = None,
    traceparent: str | None = None,
    timeout: float = 120.0,
    host: str = HOST,
) -> dict:
    """One ``POST /v1/completions``; its JSON. ``X-Request-Id`` and
    ``traceparent`` are sent as headers when given."""
    headers = {}
    if request_id is not None:
        headers["X-Request-Id"] = request_id
    if traceparent is not None:
        headers["traceparent"] = traceparent
    conn, resp = post(port, "/v1/completions", body, headers, timeout, CompletionError, host)
    try:
        return json.loads(resp.read())
    finally:
        conn.close()


def completion_body(model: str, prompt: str, max_tokens: int, **fields) -> dict:
    """A greedy completion of exactly `max_tokens` tokens (``ignore_eos``:
    a random model's end token must not cut it short)."""
    body = {"model": model, "prompt": prompt, "max_tokens": int(max_tokens), "temperature": 0.0, "ignore_eos": True}
    body.update(fields)
    return body


def prefill(
    port: int, body: dict, request_id: str | None = None, traceparent: str | None = None, host: str = HOST, timeout: float = 120.0
) -> dict:
    """The proxy's first step: `body` with ``max_tokens`` 1 and
    ``kv_transfer_params`` asking the prefill instance to keep the KV for a
    remote decode. Its response carries the ``kv_transfer_params`` the
    decode instance needs."""
    first = dict(body)
    first.update(
        max_tokens=1,
        stream=False,
        kv_transfer_params={
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        },
    )
    first.pop("max_completion_tokens", None)
    first.pop("stream_options", None)
    return complete(port, first, request_id, traceparent, timeout, host)


def decode(
    port: int,
    body: dict,
    kv_transfer_params: dict,
    request_id: str | None = None,
    traceparent: str | None = None,
    host: str = HOST,
    timeout: float = 120.0,
) -> dict:
    """The proxy's second step: the original `body` with the prefill
    response's ``kv_transfer_params``, to the decode instance."""
    second = dict(body)
    second["kv_transfer_params"] = kv_transfer_params
    return complete(port, second, request_id, traceparent, timeout, host)


def pd_complete(
    prefill_port: int,
    decode_port: int,
    prompt: str,
    max_tokens: int = 8,
    request_id: str | None = None,
    traceparent: str | None = None,
    model: str | None = None,
    prefill_host: str = HOST,
    decode_host: str = HOST,
    timeout: float = 120.0,
) -> tuple[dict, dict]:
    """Both steps, as vLLM's P/D proxy does them (the same ``X-Request-Id``
    and ``traceparent`` to both); returns the two responses. `timeout`
    bounds each step."""
    model = model or model_name(prefill_port, prefill_host)
    body = completion_body(model, prompt, max_tokens)
    first = prefill(prefill_port, body, request_id, traceparent, prefill_host, timeout)
    params = first.get("kv_transfer_params")
    if not params:
        raise CompletionError(200, json.dumps(first).encode())
    second = decode(decode_port, body, params, request_id, traceparent, decode_host, timeout)
    return first, second


def warm_up(
    prefill_port: int,
    decode_port: int,
    attempts: int = 5,
    prefill_host: str = HOST,
    decode_host: str = HOST,
    timeout: float = 600.0,
    salt: int = 4242,
) -> int:
    """The first hand-off between a new pair, retried: it does NIXL's
    side-channel handshake, whose reply vLLM waits for 5 s at most (a fixed
    ``RCVTIMEO``); on a loaded machine the prefill instance may answer later,
    and vLLM then fails that request (HTTP 500, "handshake_failed") and
    tries the handshake again with the next one. Returns the attempts it
    took; raises the last error after `attempts`. `salt` picks the prompt:
    an instance that already decoded the default one (the peer of a
    restarted instance) finds its blocks in its prefix cache and may load
    nothing, so that hand-off would not make the handshake."""
    for attempt in range(1, attempts + 1):
        try:
            pd_complete(
                prefill_port, decode_port, prompt_of(167, salt), 2, request_id=f"pd-warm-up-{os.getpid()}-{attempt}",
                prefill_host=prefill_host, decode_host=decode_host, timeout=timeout,
            )
            return attempt
        except CompletionError:
            if attempt == attempts:
                raise
            time.sleep(1.0)
    raise AssertionError("unreachable")


@contextlib.contextmanager
def started_pair(
    python: str | os.PathLike,
    model_dir: str | os.PathLike,
    logs: str | os.PathLike,
    env: dict[str, str],
    prefill_kv: dict | None = None,
    prefill_args: tuple[str, ...] = (),
    patience: float = 900.0,
    step_timeout: float = 600.0,
):
    """A prefill and a decode instance on this host, started together
    (niceness 5, logs ``prefill.log`` and ``decode.log`` in `logs`), ready,
    and warmed up (NIXL's handshake done, ``warm_up``); stopped on the way
    out, on failure too. Yields ``(prefill, decode)``."""
    logs = Path(logs)
    prefill = VllmServer(
        python, model_dir, free_port(), free_port(), env=env, log_path=logs / "prefill.log", kv_extra=prefill_kv,
        extra_args=prefill_args, nice=5,
    )  # fmt: skip
    decode = VllmServer(python, model_dir, free_port(), free_port(), env=env, log_path=logs / "decode.log", nice=5)
    try:
        prefill.start()
        decode.start()
        prefill.wait_ready(patience)
        decode.wait_ready(patience)
        warm_up(prefill.port, decode.port, timeout=step_timeout)
        yield prefill, decode
    finally:
        decode.stop()
        prefill.stop()


def prompt_of(n_tokens: int, salt: int = 0) -> str:
    """A prompt of exactly `n_tokens` tokens for the tiny model (one token
    per byte), differing by `salt`."""
    words = f"request {salt} asks: " + "the quick brown fox jumps over the lazy dog " * (n_tokens // 40 + 2)
    return words[:n_tokens]


if __name__ == "__main__":
    # python server.py ENV_PYTHON MODEL_DIR: start a pair, send one request, stop.
    import sys

    py, model = sys.argv[1], sys.argv[2]
    p = VllmServer(py, model, free_port(), free_port(), log_path="/tmp/pd-prefill.log", nice=5)
    d = VllmServer(py, model, free_port(), free_port(), log_path="/tmp/pd-decode.log", nice=5)
    with p, d:
        print(f"prefill ready after {p.wait_ready(600):.1f} s, decode after {d.wait_ready(600):.1f} s")
        t = time.monotonic()
        first, second = pd_complete(p.port, d.port, prompt_of(167), 8, request_id="smoke-1")
        print(f"{time.monotonic() - t:.2f} s:", first["choices"][0]["text"], "|", second["choices"][0]["text"])
        print(first.get("kv_transfer_params"))
    print("left:", p.group_pids(), d.group_pids())
