"""What the vLLM P/D plugin costs a real prefill/decode pair: two
``vllm serve`` instances on the CPU over NixlConnector (the tiny Qwen3 of
``tests/real_vllm``), a fresh pair for each mode in each round, the plugin
off (``EDGEMARK_VLLM`` unset) and on (``=1``, one region for both)
alternated, the order swapped every round.

Per pair: one warm-up hand-off (NIXL's side-channel handshake), then
requests one at a time, each as a P/D proxy does it: the prefill step
(``max_tokens`` 1, ``do_remote_decode``) and the decode step (the returned
``kv_transfer_params``), timed apart and end to end. Per mode: the median
over every round's requests, and the spread of the rounds' medians. With the
plugin on, the region is read at the end of each round: every request must
have closed with its four events on ``0->1:0`` (a round that recorded less
is an error, not a figure).

    python bench_vllm_pd_server.py MODEL_DIR [--rounds 3 --requests 20]

Run it with the Python of an environment that has vLLM with NIXL
(``.ci/vllm-cpu-env``, ``.ci/vllm-nixl``) and this tree's edgemark.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The installed edgemark, not the sources beside this file (they lack the
# built extension); the test support's server helpers.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
sys.path.insert(0, os.path.join(HERE, "tests", "real_vllm"))

import server as pd  # noqa: E402

EDGE = "0->1:0"


def one_pair(python: str, model: str, on: bool, args, work: str) -> dict:
    import edgemark

    tag = f"{'on' if on else 'off'}-{time.time_ns()}"
    # Where users put it and where the plugin names it by default: the
    # memory-backed directory. (A region on a disk's file system pays for
    # the kernel's write-back: a record into a page being written out waits
    # for it.)
    region = os.path.join(edgemark.default_dir(), f"edgemark-pd-bench-{tag}.region")
    # VLLM_PLUGINS: vLLM's allow-list; the same in both modes, so that the
    # only difference is EDGEMARK_VLLM.
    env = {"VLLM_PLUGINS": "edgemark_vllm"}
    if on:
        env.update(EDGEMARK_VLLM="1", EDGEMARK_VLLM_REGION=region)
    # A 120 s lease, as in the tests: a hand-off slowed by other jobs on the
    # machine must not expire.
    prefill = pd.VllmServer(
        python, model, pd.free_port(), pd.free_port(), env=env, log_path=os.path.join(work, f"prefill-{tag}.log"),
        kv_extra={"kv_lease_duration": 120},
    )
    decode = pd.VllmServer(
        python, model, pd.free_port(), pd.free_port(), env=env, log_path=os.path.join(work, f"decode-{tag}.log")
    )
    traces = []
    times = {"prefill": [], "decode": [], "total": []}
    try:
        prefill.start()
        decode.start()
        ready = max(prefill.wait_ready(900), decode.wait_ready(900))
        name = pd.model_name(prefill.port)
        pd.warm_up(prefill.port, decode.port)
        for i in range(args.requests):
            tp = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
            traces.append(tp.split("-")[1])
            body = pd.completion_body(name, pd.prompt_of(args.prompt, i + 1), args.tokens)
            rid = f"bench-{tag}-{i}"
            t0 = time.perf_counter()
            first = pd.prefill(prefill.port, body, rid, tp, timeout=600)
            t1 = time.perf_counter()
            second = pd.decode(decode.port, body, first["kv_transfer_params"], rid, tp, timeout=600)
            t2 = time.perf_counter()
            assert second["usage"]["completion_tokens"] == args.tokens, second["usage"]
            times["prefill"].append(t1 - t0)
            times["decode"].append(t2 - t1)
            times["total"].append(t2 - t0)
        recorded = complete_requests(region, set(traces)) if on else None
    finally:
        decode.stop()
        prefill.stop()
    return {"ready": ready, **times, "recorded": recorded}


def complete_requests(region_path: str, traces: set) -> int:
    """Of the counted requests (by trace), those the region closed with all
    four events on the edge (the exporter is not running, so the ring still
    holds them)."""
    import edgemark

    region = edgemark.Region.attach(region_path)
    deadline = time.monotonic() + 120
    full = set()
    while time.monotonic() < deadline and full != traces:
        for c in region.drain_closed(max=4096):
            edge = (c.get("snapshot") or {}).get(EDGE) or {}
            if c.get("trace_id") in traces and all(edge.get(f"{e}_ms") is not None for e in edgemark.EVENT_NAMES):
                full.add(c["trace_id"])
        time.sleep(0.2)
    return len(full)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="the tiny model's directory (tests/real_vllm/tiny_qwen3.py makes it)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--prompt", type=int, default=167, help="prompt tokens of every request")
    p.add_argument("--tokens", type=int, default=8, help="max_tokens of every request")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="edgemark-pd-bench-")
    rounds = {False: [], True: []}
    for r in range(args.rounds):
        for on in (False, True) if r % 2 == 0 else (True, False):
            got = one_pair(sys.executable, args.model, on, args, work)
            rounds[on].append(got)
            if on and got["recorded"] < args.requests:
                print(f"round {r + 1}: only {got['recorded']} of {args.requests} requests recorded all four events", file=sys.stderr)
                return 1
            print(
                f"round {r + 1} plugin {'on ' if on else 'off'}: ready in {got['ready']:.0f} s; "
                + ", ".join(f"{k} median {statistics.median(got[k]) * 1e3:.0f} ms" for k in ("prefill", "decode", "total"))
                + (f"; {got['recorded']} requests recorded all four events" if on else ""),
                flush=True,
            )
    print(f"\n{args.rounds} rounds, {args.requests} requests per pair, {args.prompt}-token prompts, max_tokens {args.tokens}")
    for key, what in (("prefill", "prefill step"), ("decode", "decode step"), ("total", "both steps")):
        for on in (False, True):
            every = [x for got in rounds[on] for x in got[key]]
            meds = [statistics.median(got[key]) for got in rounds[on]]
            q1, _, q3 = statistics.quantiles(every, n=4)
            print(
                f"  {what:<13} plugin {'on ' if on else 'off'}: median {statistics.median(every) * 1e3:7.1f} ms "
                f"(quartiles {q1 * 1e3:.1f}-{q3 * 1e3:.1f}, max {max(every) * 1e3:.1f}; "
                f"rounds' medians {min(meds) * 1e3:.1f}-{max(meds) * 1e3:.1f})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
