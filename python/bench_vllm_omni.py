"""What the vLLM-Omni plugin adds per chunk, on each of vLLM-Omni's two
stage transports, with the plugin off and on in one process, in one run,
alternating.

    pip install "./python[vllm-omni]" && python python/bench_vllm_omni.py [--repeats 200] [--n 100]

One round is one chunk's trip through vLLM-Omni's own transport code, with
the calls the plugin wraps:

- ``adapter`` (the async-chunk transfer adapter, the default under
  ``async_chunk: true``): the scheduler's ``save_async``, the save thread's
  ``_send_single_request`` (the stage's processor, ``connector.put``), the
  receive thread's ``_poll_single_request`` (``connector.get``,
  ``_commit_received_chunk``);
- ``mixin`` (the model runner's connector mixin): the producer's
  ``send_chunk`` (payload hook, ``_enqueue_chunk_payload``), its send
  thread's ``_send_single_request``, and the consumer's
  ``_poll_single_request``, then the scheduler's hand-off of the consumer's
  staged payload (cleared, as the model step would consume it).

The calls run on the bench's thread, not on the transports' background
threads, so that a round is timed whole; the connector is an in-memory
dict, as in vLLM-Omni's own unit tests, so that its cost does not drown the
difference (SharedMemoryConnector's put and get cost tens of microseconds).

Every round is timed on its own and the figures are medians of rounds, so
that a round the machine preempted does not move them; the modes alternate
block by block, so that drift hits them alike. A third mode wraps the same
call sites with closures that only call through: what wrapping costs before
a wrapper does anything, the floor of a plugin made of wrappers.

Both modes run the same rounds of one open request whose events were
recorded by its first chunk: the steady state of a stream. The first chunk
of a request in a stage process also reads the request's token from the
lookup (one small file): that read is measured on its own.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
# The tests' stand-in stages, whose requests and payloads the bench uses.
sys.path.insert(0, os.path.join(_HERE, "tests"))


def _plain(value):
    fields = getattr(value, "__struct_fields__", None)
    if fields is not None:
        return {f: _plain(getattr(value, f)) for f in fields if getattr(value, f) is not None}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


class DictConnector:
    """An in-memory connector with the put/get contract of vLLM-Omni's."""

    def __init__(self, stage_id: int = 0) -> None:
        self.store = {}
        self.stage_id = stage_id

    def put(self, from_stage, to_stage, put_key, data):
        # The wire turns vLLM-Omni's payload structs into dicts (its msgpack
        # decoder is type-erased): so does this connector.
        self.store[put_key] = _plain(data)
        return True, 1, None

    def get(self, from_stage, to_stage, get_key, metadata=None):
        data = self.store.pop(get_key, None)
        return None if data is None else (data, 1)

    def close(self):
        pass

    def reap_consumed(self):
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


def adapters():
    import torch
    from vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter import (
        OmniChunkTransferAdapter,
    )

    # The adapter-path test stage's payload builder and engine request.
    from _vllm_omni_adapter_stage import processor, vllm_request

    def make(stage):
        model_config = SimpleNamespace(
            stage_connector_config={"name": "SharedMemoryConnector", "extra": {}},
            stage_id=stage,
            worker_type="ar",
            async_chunk=True,
            max_model_len=4096,
            custom_process_next_stage_input_func=None,
        )
        a = OmniChunkTransferAdapter(
            SimpleNamespace(model_config=model_config, scheduler_config=SimpleNamespace(max_num_seqs=8))
        )
        # The bench drives every call itself: no background thread.
        a.shutdown()
        a.custom_process_next_stage_input_func = processor
        return a

    producer, consumer = make(0), make(1)
    connector = DictConnector()
    producer.connector, consumer.connector = connector, DictConnector(1)
    consumer.connector.store = connector.store

    return producer, consumer, vllm_request, {"hidden": torch.ones(2, 4)}, {}


_steps = itertools.count(1)


def adapter_rounds(parts, rid: str, n: int) -> list:
    """The nanoseconds of each of ``n`` rounds through the adapters."""
    from vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter import _LoadEntry

    producer, consumer, make_request, output, _ = parts
    request = parts[4].setdefault(rid, make_request(rid))
    pending = producer._pending_save_reqs
    clock = time.perf_counter_ns
    out = []
    for _ in range(n):
        # Each step commits one more token: the adapter takes it as new.
        request.num_computed_tokens = next(_steps)
        entry = _LoadEntry(request)
        consumer._registered_load_entries[rid] = entry
        t0 = clock()
        producer.save_async(output, request, False, new_token_ids=[7])
        producer._send_single_request(pending.popleft())
        ok = consumer._poll_single_request(entry)
        out.append(clock() - t0)
        assert ok is True
        # The scheduler takes the admitted chunk (not timed).
        consumer._finished_load_reqs.discard(rid)
        consumer._pending_ar_prompt_updates.pop(rid, None)
    return out


def rounds(producer, consumer, rid: str, n: int) -> list:
    """The nanoseconds of each of ``n`` rounds through the mixin."""
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


class PassThrough:
    """Every transport call site the plugin wraps, wrapped instead by a
    closure that only calls through: what any wrapper costs before it does
    anything (the floor of a plugin made of wrappers)."""

    def __init__(self) -> None:
        from edgemark.vllm_omni import adapter, runner
        from edgemark._instrument import MissingError, resolve

        self.sites = []
        for target in adapter.TARGETS + runner.TARGETS:
            try:
                owner, func = resolve(target)
            except MissingError:
                continue
            self.sites.append((owner, target.attr, func))

    def patch(self) -> None:
        import functools

        def through(orig):
            # Shaped as the plugin's wrappers are: a closure over the original.
            def call_through(self, *args, **kwargs):
                return orig(self, *args, **kwargs)

            return call_through

        for owner, attr, func in self.sites:
            setattr(owner, attr, functools.wraps(func)(through(func)))

    def restore(self) -> None:
        for owner, attr, func in self.sites:
            setattr(owner, attr, func)


def measure(name: str, run, repeats: int, n: int) -> tuple:
    """Alternated blocks of ``run`` with the plugin off, on, and replaced
    by pass-through wrappers."""
    from edgemark import vllm_omni

    off, on, bare = [], [], []
    through = PassThrough()
    orders = (("off", "on", "bare"), ("on", "bare", "off"), ("bare", "off", "on"))
    for i in range(repeats):
        # Rotate which mode goes first, so that drift hits all alike.
        for mode in orders[i % 3]:
            vllm_omni.uninstrument()
            through.restore()
            if mode == "on":
                vllm_omni.instrument()
                on.extend(run())
            elif mode == "bare":
                through.patch()
                bare.extend(run())
            else:
                off.extend(run())
    through.restore()
    vllm_omni.uninstrument()
    return off, on, bare


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=200, help="alternated off/on blocks")
    ap.add_argument("--n", type=int, default=100, help="rounds per block")
    args = ap.parse_args()

    os.environ.setdefault("EDGEMARK_VLLM_OMNI_REGION", os.path.join(tempfile.mkdtemp(), "bench.region"))
    from edgemark import _channel, vllm_omni
    from edgemark.vllm_omni import _recording

    vllm_omni.instrument() or sys.exit("the plugin did not instrument this vllm-omni")
    rec = vllm_omni.instrumentor.recording
    owner = rec.ensure_owner(_recording.edges(2), 16)
    if owner is None:
        sys.exit("no region")
    rid_a, rid_m = "bench-adapter", "bench-mixin"
    rec.begin(rid_a)
    rec.begin(rid_m)
    producer, consumer = runners()
    parts = adapters()
    # Warm-up with the plugin on: the first chunk records the events.
    adapter_rounds(parts, rid_a, args.n)
    rounds(producer, consumer, rid_m, args.n)
    for rid in (rid_a, rid_m):
        snap = owner.region.snapshot(owner.tokens[rid])["0->1:0"]
        assert snap["producer_first_nonempty_emit_ms"] is not None, rid
        assert snap["edge_first_send_complete_ms"] is not None, rid
        assert snap["consumer_first_accept_ms"] is not None, rid
    results = {
        "adapter": measure("adapter", lambda: adapter_rounds(parts, rid_a, args.n), args.repeats, args.n),
        "mixin": measure("mixin", lambda: rounds(producer, consumer, rid_m, args.n), args.repeats, args.n),
    }

    # The first chunk of a request in a stage process: the lookup opened and
    # one entry read.
    writer = _channel.Writer(_channel.lookup_dir(owner.path))
    writer.publish(rid_a, owner.tokens[rid_a])
    reads = []
    for _ in range(max(args.repeats, 3)):
        t0 = time.perf_counter()
        for _ in range(200):
            reader = _channel.Reader(writer.path)
            reader.read(rid_a)
            reader.close()
        reads.append((time.perf_counter() - t0) / 200)
    writer.remove()

    us = lambda xs: statistics.median(xs) / 1000  # noqa: E731
    q = lambda xs, p: sorted(xs)[int(p * (len(xs) - 1))] / 1000  # noqa: E731
    print(f"one chunk per round, {args.repeats} alternated blocks of {args.n} per mode, every round timed")
    for name, (off, on, bare) in results.items():
        print(f"{name}:")
        print(f"  plugin off              {us(off):8.2f} us per chunk (median; p90 {q(off, 0.9):.2f})")
        print(f"  plugin on               {us(on):8.2f} us per chunk (median; p90 {q(on, 0.9):.2f})")
        print(f"  pass-through wrappers   {us(bare):8.2f} us per chunk (median; p90 {q(bare, 0.9):.2f})")
        print(f"  added by the plugin     {us(on) - us(off):8.2f} us per chunk (difference of the medians)")
        print(f"  added by pass-through   {us(bare) - us(off):8.2f} us per chunk (the floor of any wrapper)")
    print(f"token lookup (open + read) {statistics.median(reads) * 1e6:7.2f} us, once per request and stage process")


if __name__ == "__main__":
    main()
