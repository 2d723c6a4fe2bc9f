"""What the vLLM-Omni plugin costs a real server: ``vllm-omni serve`` on the
CPU (the tiny Qwen3-TTS of ``tests/real_server``), a fresh server for each
mode in each round, the plugin off (``EDGEMARK_VLLM_OMNI`` unset) and on
(``=1``) alternated, the order swapped every round.

Per server: warm-up requests, then WAV requests one at a time (end-to-end
time), then streamed requests one at a time (time to the first audio delta,
and end to end). Per mode: the median over every round's requests, and the
spread of the rounds' medians. With the plugin on, the region is read at
the end of each round: every request must have closed with its four events
(a round that recorded nothing is an error, not a figure).

    python bench_vllm_omni_server.py MODEL_DIR [--rounds 3 --wav 20 --stream 6 --warmup 2]

Run it with the Python of an environment that has vllm-omni, the test CPU
platform (``tests/real_server/cpu_platform``) and this tree's edgemark.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The installed edgemark, not the sources beside this file (they lack the
# built extension); the test support's server helpers.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
sys.path.insert(0, os.path.join(HERE, "tests", "real_server"))

import server as omni  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog."
_REGION = re.compile(r"edgemark: recording vLLM-Omni .* region (\S+)")


def wav_once(port: int, tokens: int) -> float:
    t = time.perf_counter()
    body = omni.speech_wav(port, TEXT, max_new_tokens=tokens)
    e2e = time.perf_counter() - t
    assert omni.wav_samples(body) > 0
    return e2e


def stream_once(port: int, tokens: int) -> tuple:
    """(time to the first audio delta, end to end), in seconds."""
    t = time.perf_counter()
    conn, resp = omni._post(port, omni.speech_body(TEXT, tokens, stream=True), None, 120.0)
    first = None
    try:
        for name, data in omni._sse_events(resp):
            if first is None and name == "speech.audio.delta" and isinstance(data, dict) and data.get("audio"):
                first = time.perf_counter() - t
    finally:
        conn.close()
    assert first is not None, "no audio in the stream"
    return first, time.perf_counter() - t


def one_server(python: str, model: str, on: bool, args, work: str) -> dict:
    env = {"EDGEMARK_VLLM_OMNI": "1"} if on else {}
    log = os.path.join(work, f"server-{'on' if on else 'off'}-{time.time_ns()}.log")
    port = omni.free_port()
    srv = omni.OmniServer(python, model, omni.DEPLOY_FILE, port, env=env, log_path=log)
    srv.start()
    try:
        ready = srv.wait_ready(900)
        for i in range(args.warmup):
            (wav_once if i % 2 == 0 else lambda p, n: stream_once(p, n)[1])(port, args.tokens)
        wav = [wav_once(port, args.tokens) for _ in range(args.wav)]
        streams = [stream_once(port, args.tokens) for _ in range(args.stream)]
        recorded = None
        if on:
            with open(log, errors="replace") as f:
                regions = {m.group(1) for m in map(_REGION.search, f) if m}
            assert len(regions) == 1, f"the plugin named regions {regions}"
            recorded = complete_requests(regions.pop())
    finally:
        srv.stop()
    return {"ready": ready, "wav": wav, "ttfa": [s[0] for s in streams], "stream": [s[1] for s in streams],
            "recorded": recorded}


def complete_requests(region_path: str) -> int:
    """Closed requests the region counted (the exporter is not running, so
    the ring still holds them): those with all four events on 0->1."""
    import edgemark

    region = edgemark.Region.attach(region_path)
    closed = region.drain_closed(max=4096)
    full = 0
    for c in closed:
        edge = (c.get("snapshot") or {}).get("0->1:0") or {}
        if all(edge.get(f"{e}_ms") is not None for e in edgemark.EVENT_NAMES):
            full += 1
    return full


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="the tiny model's directory (tests/real_server/tiny_tts.py makes it)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--wav", type=int, default=20)
    p.add_argument("--stream", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--tokens", type=int, default=32, help="max_new_tokens of every request")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="edgemark-serve-bench-")
    rounds = {False: [], True: []}
    for r in range(args.rounds):
        for on in ((False, True) if r % 2 == 0 else (True, False)):
            got = one_server(sys.executable, args.model, on, args, work)
            rounds[on].append(got)
            per = args.warmup + args.wav + args.stream
            if on and got["recorded"] < per:
                print(f"round {r + 1}: only {got['recorded']} of {per} requests recorded all four events", file=sys.stderr)
                return 1
            print(
                f"round {r + 1} plugin {'on ' if on else 'off'}: ready in {got['ready']:.0f} s; "
                f"WAV median {statistics.median(got['wav']) * 1e3:.0f} ms, "
                f"first audio median {statistics.median(got['ttfa']) * 1e3:.0f} ms, "
                f"stream median {statistics.median(got['stream']) * 1e3:.0f} ms"
                + (f"; {got['recorded']} requests recorded all four events" if on else ""),
                flush=True,
            )
    print(f"\n{args.rounds} rounds, {args.wav} WAV + {args.stream} streamed requests per server, max_new_tokens {args.tokens}")
    for key, what in (("wav", "WAV end to end"), ("ttfa", "stream, first audio"), ("stream", "stream end to end")):
        for on in (False, True):
            every = [x for got in rounds[on] for x in got[key]]
            meds = [statistics.median(got[key]) for got in rounds[on]]
            print(
                f"  {what:<22} plugin {'on ' if on else 'off'}: median {statistics.median(every) * 1e3:7.1f} ms "
                f"(rounds' medians {min(meds) * 1e3:.1f}-{max(meds) * 1e3:.1f})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
