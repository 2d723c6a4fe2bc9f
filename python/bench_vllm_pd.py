"""What the vLLM P/D plugin adds to each scheduler step: its wrapper on
``Scheduler.update_from_output``, which runs every step for every running
request, against a pass-through wrapper and no wrapper, in one process, in
one run, rotating.

    pip install ./python && python python/bench_vllm_pd.py [--repeats 200] [--n 2000]

One round is one call of the wrapped ``update_from_output`` with a
``ModelRunnerOutput`` of 1, 64 or 256 running requests (vLLM's own class when
vLLM is installed), around a stand-in for the scheduler's method that reads
every request's sampled tokens, as the real one does. Modes:

- ``off``: the stand-in, unwrapped;
- ``pass``: wrapped by a closure that only calls through (the floor of any
  wrapper);
- ``on``: the plugin's wrapper with every request already recorded (nothing
  waits for a first token): the steady state;
- ``on+1``: the plugin's wrapper while one accepted request, not in this
  step, waits for its first token (a decode request between its KV load and
  its first step).

Figures are medians over blocks of ``--n`` calls (each block's mean), the
modes rotated block by block so that drift hits them alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

from edgemark.vllm import connector  # noqa: E402
from edgemark.vllm._recording import PD, Recording  # noqa: E402


def runner_output(n: int):
    ids = [f"cmpl-bench-{i}-0-0123abcd" for i in range(n)]
    sampled = [[7] for _ in range(n)]
    fields = {"req_ids": ids, "sampled_token_ids": sampled}
    try:
        import dataclasses

        from vllm.v1.outputs import ModelRunnerOutput

        # The release's own fields: up to 0.33 it also has req_id_to_index.
        if "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}:
            fields["req_id_to_index"] = {r: i for i, r in enumerate(ids)}
        return ModelRunnerOutput(**fields)
    except Exception:  # noqa: BLE001 - no vLLM: a stand-in with 0.34's fields
        return SimpleNamespace(**fields)


def update_from_output(self, scheduler_output, model_runner_output):
    # The scheduler's loop over the step's requests, cut to what it reads.
    out = 0
    sampled = model_runner_output.sampled_token_ids
    for i, _rid in enumerate(model_runner_output.req_ids):
        out += len(sampled[i])
    return out


def passthrough(orig):
    def wrapper(self, scheduler_output, model_runner_output, *args, **kwargs):
        return orig(self, scheduler_output, model_runner_output, *args, **kwargs)

    return wrapper


def block(fn, mro, n: int) -> float:
    t = time.perf_counter_ns()
    for _ in range(n):
        fn(None, None, mro)
    return (time.perf_counter_ns() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=200, help="rotated blocks per mode")
    ap.add_argument("--n", type=int, default=2000, help="calls per block")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["EDGEMARK_VLLM_REGION"] = os.path.join(tmp, "bench.region")
        rec = Recording()
        waiting = Recording()
        waiting.awaiting_output["cmpl-not-in-this-step-0-0123abcd"] = PD("decode", "x", None, True, 0.0)
        modes = {
            "off": update_from_output,
            "pass": passthrough(update_from_output),
            "on": connector.wrap_update_from_output(update_from_output, rec),
            "on+1": connector.wrap_update_from_output(update_from_output, waiting),
        }
        print(f"{'running':>8} " + " ".join(f"{m:>9}" for m in modes) + "   on - pass   (ns per step, median of block means)")
        for n_req in (1, 64, 256):
            mro = runner_output(n_req)
            times = {m: [] for m in modes}
            for _ in range(args.repeats):
                for m, fn in modes.items():
                    times[m].append(block(fn, mro, args.n))
            med = {m: statistics.median(v) for m, v in times.items()}
            print(
                f"{n_req:>8} "
                + " ".join(f"{med[m]:>9.0f}" for m in modes)
                + f"   {med['on'] - med['pass']:>+9.0f}"
            )


if __name__ == "__main__":
    main()
