"""What the vLLM-Omni plugin adds per chunk, with the plugin off and on in
one process, in one run, alternating.

    pip install "./python[vllm-omni]" && python python/bench_vllm_omni.py [--repeats 200] [--n 100]

One round is one chunk's trip through vLLM-Omni's own transport code, with
the calls the plugin wraps: the producer's ``send_chunk`` (payload hook,
``_enqueue_chunk_payload``), its send thread's ``_send_single_request``
(``connector.put``), and the consumer's ``_poll_single_request``
(``connector.get``, admission), then the scheduler's hand-off of the
consumer's staged payload (cleared, as the model step would consume it).
The calls run on the bench's thread, not on the transport's background
threads, so that a round is timed whole; the connector is an in-memory
dict, as in vLLM-Omni's own unit tests, so that its cost does not drown the
difference (SharedMemoryConnector's put and get cost tens of microseconds).

Every round is timed on its own and the figures are medians of rounds, so
that a round the machine preempted does not move them; the modes alternate
block by block, so that drift hits both alike.

Both modes run the same rounds of one open request whose four events were
recorded by its first chunk: the steady state of a stream. The first chunk
of a request in a stage process also reads the request's token from the
lookup (one small file): that read is measured on its own.
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


class DictConnector:
    """An in-memory connector with the put/get contract of vLLM-Omni's."""

    def __init__(self) -> None:
        self.store = {}

    def put(self, from_stage, to_stage, put_key, data):
        self.store[put_key] = data
        return True, 1, None

    def get(self, from_stage, to_stage, get_key, metadata=None):
        data = self.store.pop(get_key, None)
        return None if data is None else (data, 1)

    def close(self):
        pass


def runners():
    import torch
    from vllm_omni.worker.omni_connector_model_runner_mixin import OmniConnectorModelRunnerMixin

    class Runner(OmniConnectorModelRunnerMixin):
        pass

    def make(stage, worker_type):
        r = Runner()
        r.init_omni_connectors(
            model_config=SimpleNamespace(
                stage_connector_config=None,
                async_chunk=True,
                worker_type=worker_type,
                custom_process_next_stage_input_func=None,
                stage_id=stage,
            )
        )
        # The bench drives every call itself: no background thread.
        r._stop_event.set()
        return r

    producer, consumer = make(0, "ar"), make(1, "generation")
    connector = DictConnector()
    producer._omni_connector = consumer._omni_connector = connector
    codes = torch.ones(4, dtype=torch.long)
    chunk = {"codes": {"audio": codes}, "meta": {"finished": False}}
    producer._custom_process_func = lambda transfer_manager, pooling_output, request: chunk
    producer._custom_process_payload_kwarg = "pooling_output"
    return producer, consumer


def rounds(producer, consumer, rid: str, n: int) -> list:
    """The nanoseconds of each of ``n`` rounds."""
    request = SimpleNamespace(request_id=rid, external_req_id=rid)
    handle = SimpleNamespace(request_id=rid, external_req_id=rid, payload_sender_info=None)
    consumer._request_ids_mapping[rid] = rid
    pending = producer._pending_save_reqs
    clock = time.perf_counter_ns
    out = []
    for _ in range(n):
        t0 = clock()
        producer.send_chunk(request, pooling_output=None)
        task = pending[rid].popleft()
        del pending[rid]
        producer._send_single_request(task)
        consumer._pending_load_reqs[rid] = handle
        consumer._poll_single_request(rid)
        out.append(clock() - t0)
        # The model step consumes the staged payload (not timed).
        consumer._local_stage_payload_cache.pop(rid, None)
        consumer._local_request_metadata.pop(rid, None)
        consumer._finished_load_reqs.discard(rid)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=200, help="alternated off/on blocks")
    ap.add_argument("--n", type=int, default=100, help="rounds per block")
    args = ap.parse_args()

    os.environ.setdefault("EDGEMARK_VLLM_OMNI_REGION", os.path.join(tempfile.mkdtemp(), "bench.region"))
    from edgemark import vllm_omni

    producer, consumer = runners()
    rid = "bench-request"
    owner = vllm_omni._get_owner(2, 16)
    if owner is None:
        sys.exit("no region")
    owner.begin(rid)
    off, on = [], []  # every round's time, per mode
    # Warm-up in both modes; the first instrumented chunk records the events.
    rounds(producer, consumer, rid, args.n)
    vllm_omni.instrument() or sys.exit("the plugin did not instrument this vllm-omni")
    rounds(producer, consumer, rid, args.n)
    snap = owner.region.snapshot(owner.tokens[rid])["0->1:0"]
    assert snap["producer_first_nonempty_emit_ms"] is not None and snap["consumer_first_accept_ms"] is not None
    for i in range(args.repeats):
        # Alternate which mode goes first, so that drift hits both alike.
        for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):
            if mode == "on":
                vllm_omni.instrument()
                on.extend(rounds(producer, consumer, rid, args.n))
            else:
                vllm_omni.uninstrument()
                off.extend(rounds(producer, consumer, rid, args.n))
    vllm_omni.uninstrument()

    # The first chunk of a request in a stage process: one lookup read.
    directory = owner.dir
    reads = []
    for _ in range(max(args.repeats, 3)):
        t0 = time.perf_counter()
        for _ in range(200):
            vllm_omni._read_entry(directory, rid)
        reads.append((time.perf_counter() - t0) / 200)

    us = lambda xs: statistics.median(xs) / 1000  # noqa: E731
    q = lambda xs, p: sorted(xs)[int(p * (len(xs) - 1))] / 1000  # noqa: E731
    print(
        f"rounds of send_chunk + _send_single_request + _poll_single_request,"
        f" {args.repeats} alternated blocks of {args.n} per mode, every round timed"
    )
    print(f"  plugin off              {us(off):8.2f} us per chunk (median; p90 {q(off, 0.9):.2f})")
    print(f"  plugin on               {us(on):8.2f} us per chunk (median; p90 {q(on, 0.9):.2f})")
    print(f"  added by the plugin     {us(on) - us(off):8.2f} us per chunk (difference of the medians)")
    print(f"  token lookup read       {statistics.median(reads) * 1e6:8.2f} us, once per request and stage process")


if __name__ == "__main__":
    main()
