"""Start a real ``vllm-omni serve`` for a test and talk to it.

Test support, standard library only, so it imports with the Python of any
environment the server runs in::

    from server import OmniServer, free_port, speech_wav, speech_stream

    port = free_port()
    with OmniServer(python, model_dir, deploy_file, port, env={}, log_path=log) as srv:
        srv.wait_ready(timeout=300)
        wav = speech_wav(port, "Hello there.", request_id="t-1", max_new_tokens=32)

``OmniServer`` runs ``<env>/bin/vllm-omni serve MODEL --omni --deploy-config
FILE --port P`` in a session of its own, so that the API server, the stage
engine cores and their workers share one process group that ``stop`` can
clear. vLLM-Omni on the CPU needs the platform in ``cpu_platform/``
installed in that environment (``install_cpu_platform``).

The speech endpoint names each request itself: ``speech-<16 hex>`` in the
API server, and ``speech-<16 hex>-<8 hex>`` once vLLM's engine has added
its suffix; an ``X-Request-Id`` header is sent by the helpers here but the
speech endpoint does not take it as the request id.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEPLOY_FILE = HERE / "qwen3_tts_cpu.yaml"
CPU_PLATFORM = HERE / "cpu_platform"

# The process group and the HTTP the real-server suites share (``../_server.py``).
if str(HERE.parent) not in sys.path:
    sys.path.append(str(HERE.parent))
from _server import CPU_ENV, HOST, HTTPError, ServerProcess, bin_dir, free_port, post  # noqa: E402

# What the server's environment needs on the CPU (two cores, five processes:
# one OpenMP thread each).
SERVER_ENV = dict(CPU_ENV)


def install_cpu_platform(python: str | os.PathLike) -> None:
    """pip-install the test CPU platform into the environment of `python`,
    building from a copy so that no build files land in the source tree."""
    with tempfile.TemporaryDirectory(prefix="omni-cpu-platform-") as tmp:
        src = Path(tmp) / "cpu_platform"
        shutil.copytree(CPU_PLATFORM, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--no-deps", str(src)],
            check=True,
        )


class OmniServer(ServerProcess):
    """A ``vllm-omni serve`` process group (context manager: start, stop).

    `env` is laid over this process's environment without its ``EDGEMARK_*``
    variables and over ``SERVER_ENV``; so the edgemark plugin stays off unless
    `env` sets ``EDGEMARK_VLLM_OMNI``. The API server listens only once
    every stage is up, so a speech request works once ``wait_ready``
    returns.
    """

    name = "vllm-omni serve"

    def __init__(
        self,
        python: str | os.PathLike,
        model_dir: str | os.PathLike,
        deploy_file: str | os.PathLike,
        port: int,
        env: dict[str, str] | None = None,
        log_path: str | os.PathLike | None = None,
        extra_args: tuple[str, ...] = (),
    ):
        super().__init__(python, port, env, log_path, extra_args)
        self.model_dir = str(model_dir)
        self.deploy_file = str(deploy_file)

    def command(self) -> list[str]:
        return [
            str(bin_dir(self.python) / "vllm-omni"),
            "serve",
            self.model_dir,
            "--omni",
            "--deploy-config",
            self.deploy_file,
            "--host",
            HOST,
            "--port",
            str(self.port),
            *self.extra_args,
        ]

    def server_env(self) -> dict[str, str]:
        return dict(SERVER_ENV)


# ------------------------------------------------------------------ requests


class SpeechError(HTTPError):
    what = "speech request"


def speech_body(
    text: str,
    max_new_tokens: int,
    *,
    stream: bool = False,
    voice: str = "ryan",
    language: str = "English",
    **fields,
) -> dict:
    """The JSON of a ``POST /v1/audio/speech``. A random model never emits
    its end token: `max_new_tokens` (codec frames, 12.5 a second of audio)
    bounds every request."""
    body = {
        "input": text,
        "voice": voice,
        "language": language,
        "max_new_tokens": int(max_new_tokens),
    }
    if stream:
        body.update(stream=True, response_format="pcm")
    else:
        body["response_format"] = "wav"
    body.update(fields)
    return body


def _post(port: int, body: dict, request_id: str | None, timeout: float):
    headers = {"X-Request-Id": request_id} if request_id is not None else {}
    return post(port, "/v1/audio/speech", body, headers, timeout, SpeechError)


def speech_wav(
    port: int,
    text: str,
    request_id: str | None = None,
    max_new_tokens: int = 32,
    timeout: float = 120.0,
    **fields,
) -> bytes:
    """One non-streaming speech request; returns the WAV file's bytes."""
    conn, resp = _post(port, speech_body(text, max_new_tokens, **fields), request_id, timeout)
    try:
        return resp.read()
    finally:
        conn.close()


def _sse_events(resp):
    """(event name, parsed data) for each server-sent event of `resp`."""
    name, data = None, []
    while True:
        raw = resp.readline()
        if not raw:
            return
        line = raw.decode("utf-8").rstrip("\r\n")
        if line == "":
            if data:
                payload = "\n".join(data)
                try:
                    parsed = json.loads(payload)
                except ValueError:
                    parsed = payload
                yield name or "message", parsed
            name, data = None, []
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


def speech_stream(
    port: int,
    text: str,
    request_id: str | None = None,
    max_new_tokens: int = 32,
    timeout: float = 120.0,
    **fields,
) -> list[tuple[str, object]]:
    """One streaming speech request (server-sent events); returns every
    event as (name, data): ``speech.audio.delta`` events whose data carries
    base64 PCM in ``audio``, then one ``speech.audio.done``."""
    conn, resp = _post(port, speech_body(text, max_new_tokens, stream=True, **fields), request_id, timeout)
    try:
        return list(_sse_events(resp))
    finally:
        conn.close()


def speech_stream_disconnect(
    port: int,
    text: str,
    request_id: str | None = None,
    max_new_tokens: int = 32,
    after_events: int = 1,
    timeout: float = 120.0,
    **fields,
) -> list[tuple[str, object]]:
    """A streaming speech request that the client drops after `after_events`
    events, closing the connection mid-stream; returns the events read."""
    conn, resp = _post(port, speech_body(text, max_new_tokens, stream=True, **fields), request_id, timeout)
    events = []
    try:
        for event in _sse_events(resp):
            events.append(event)
            if len(events) >= after_events:
                break
    finally:
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        resp.close()
        conn.close()
    return events


def pcm_of(events) -> bytes:
    """The 16-bit PCM carried by the ``speech.audio.delta`` events."""
    return b"".join(
        base64.b64decode(data["audio"])
        for name, data in events
        if name == "speech.audio.delta" and isinstance(data, dict) and data.get("audio")
    )


def wav_samples(wav: bytes) -> int:
    """Number of 16-bit mono samples in a WAV file's data chunk (the header
    checked to be RIFF/WAVE)."""
    if wav[:4] != b"RIFF" or wav[8:12] != b"WAVE":
        raise ValueError("not a WAV file")
    pos = 12
    while pos + 8 <= len(wav):
        cid, size = wav[pos : pos + 4], int.from_bytes(wav[pos + 4 : pos + 8], "little")
        if cid == b"data":
            return min(size, len(wav) - pos - 8) // 2
        pos += 8 + size
    raise ValueError("WAV file without a data chunk")


# ----------------------------------------------------------------------- log

# vLLM's prefix on each line of a process it started: `(APIServer pid=4711)`
# (after a colour code when the output is not a terminal as well).
_PROCESS = re.compile(r"\(([\w.-]+) pid=(\d+)\)")
_API_SERVER = re.compile(r"Starting vLLM API server (\d+) on ")
_SPEECH = re.compile(r"\[SpeechE2E\] request_id=(\S+) stream=(\S+) status=(\S+)")


def log_process(line: str) -> tuple[str, int] | None:
    """The (name, pid) vLLM's prefix gives a line, or None."""
    m = _PROCESS.search(line)
    return (m.group(1), int(m.group(2))) if m else None


def api_servers(log: str) -> dict[int, int]:
    """API server index -> pid, from each API server's "Starting vLLM API
    server N" line (indices 0 to N-1 with ``--api-server-count N``)."""
    out = {}
    for line in log.splitlines():
        m, who = _API_SERVER.search(line), log_process(line)
        if m and who:
            out[int(m.group(1))] = who[1]
    return out


def speech_requests(log: str) -> dict[str, tuple[int | None, str, str]]:
    """Request id (``speech-<16 hex>``) -> (pid of the API server that
    served it, ``stream`` true/false, status), from the endpoint's
    ``[SpeechE2E]`` line: one per finished request, at INFO with
    ``--enable-log-requests`` (0.32.0rc1 logs it at DEBUG otherwise)."""
    out = {}
    for line in log.splitlines():
        m = _SPEECH.search(line)
        if m:
            who = log_process(line)
            out[m.group(1)] = (who[1] if who else None, m.group(2), m.group(3))
    return out


def remove_wake_dirs(log: str, shm: str = "/dev/shm") -> list[str]:
    """Removes what vLLM-Omni 0.32.0rc1 leaves after a clean shutdown, one
    ``omni_shm_wake_<n>_<pid>`` directory (holding a FIFO) per stage engine
    core, for the stage engine cores named in the server's `log` that no
    longer run; returns what it removed."""
    pids = {who[1] for who in map(log_process, log.splitlines()) if who and who[0].startswith("StageEngineCoreProc")}
    removed = []
    for pid in sorted(pids):
        if os.path.exists(f"/proc/{pid}"):
            continue
        for name in os.listdir(shm):
            if name.startswith("omni_shm_wake_") and name.endswith(f"_{pid}"):
                path = os.path.join(shm, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(path)
    return removed


if __name__ == "__main__":
    # python server.py ENV_PYTHON MODEL_DIR [LOG]: start, send two WAV and one
    # streaming request, stop.
    py, model = sys.argv[1], sys.argv[2]
    log = sys.argv[3] if len(sys.argv) > 3 else None
    port = free_port()
    with OmniServer(py, model, DEPLOY_FILE, port, env={}, log_path=log) as srv:
        print(f"ready after {srv.wait_ready(300):.1f} s, pids {srv.group_pids()}")
        for i in range(2):
            t = time.monotonic()
            wav = speech_wav(port, f"Hello number {i}.", request_id=f"smoke-wav-{i}")
            print(f"wav {i}: {wav_samples(wav)} samples in {time.monotonic() - t:.2f} s")
        t = time.monotonic()
        events = speech_stream(port, "Hello, streaming.", request_id="smoke-stream")
        print(f"stream: {len(events)} events, {len(pcm_of(events)) // 2} samples in {time.monotonic() - t:.2f} s")
    print("left:", srv.group_pids())
