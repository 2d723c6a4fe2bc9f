"""The API-server side of the plugin tests, run in its own process:

    python _vllm_omni_orchestrator.py SCENARIO

It loads vLLM-Omni's general plugins as the API server does, starts real
stage processes (``_vllm_omni_stage.py``) where the scenario needs them,
drives requests through vLLM-Omni's own request state, orchestrator and
cleanup code, and prints one JSON object: what the test asserts on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))


class Stage:
    """A stage process, driven one JSON command at a time."""

    def __init__(self, stage_id: int, worker_type: str, *mode: str, script: str = "_vllm_omni_stage.py") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, script), str(stage_id), worker_type, *mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ready(self) -> dict:
        return self._reply()

    def _reply(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"stage process exited ({self.proc.poll()})")
            if line.startswith("{"):
                return json.loads(line)

    def __call__(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self(op="exit")
            except (RuntimeError, BrokenPipeError):
                pass
        self.proc.wait(timeout=60)


def output(rid: str, tokens):
    """A stage output as vLLM hands it to the orchestrator."""
    from vllm.outputs import CompletionOutput, RequestOutput

    completion = CompletionOutput(index=0, text="", token_ids=list(tokens), cumulative_logprob=None, logprobs=None)
    return RequestOutput(
        request_id=rid,
        prompt=None,
        prompt_token_ids=[1],
        prompt_logprobs=None,
        outputs=[completion],
        finished=False,
    )


class Server:
    """vLLM-Omni's API-server objects the plugin wraps, with the state their
    code reads (the engine and its stage processes are the test's own)."""

    def __init__(self) -> None:
        from vllm_omni.engine.orchestrator import Orchestrator, OrchestratorRequestState
        from vllm_omni.entrypoints.async_omni import AsyncOmni
        from vllm_omni.entrypoints.client_request_state import ClientRequestState
        from vllm_omni.entrypoints.omni import Omni

        self.ClientRequestState = ClientRequestState
        self.OrchestratorRequestState = OrchestratorRequestState
        self.api = object.__new__(AsyncOmni)
        self.api.request_states = {}
        self.api.log_stats = False
        self.api._enable_ar_profiler = False
        self.api.engine = SimpleNamespace(
            get_stage_metadata=lambda i: SimpleNamespace(
                final_output=True, final_output_type="text", stage_type="llm", model_stage=f"stage{i}"
            )
        )
        self.sync = object.__new__(Omni)
        self.sync.request_states = self.api.request_states
        self.sync.log_stats = False
        self.sync.engine = SimpleNamespace(abort=lambda ids: None)
        self.orch = object.__new__(Orchestrator)
        self.orch.stage_pools = [SimpleNamespace(final_output=False)] + [SimpleNamespace(final_output=True)] * 3
        self.orch._pd_pair = None
        self.loop = asyncio.new_event_loop()
        self.orch.output_async_queue = asyncio.Queue()

    def begin(self, rid: str):
        state = self.ClientRequestState(rid)
        self.api.request_states[rid] = state
        return state

    def route(self, stage_id: int, rid: str, tokens) -> None:
        req_state = self.OrchestratorRequestState(request_id=rid)
        self.loop.run_until_complete(self.orch._route_output(stage_id, 0, output(rid, tokens), req_state, None))

    def forward(self, rid: str, tokens) -> list:
        """The orchestrator hands stage 0's output to stage 1 itself (its
        prefill -> decode route), into a stage pool that takes the request."""
        from vllm.sampling_params import SamplingParams

        submitted = []

        async def submit_initial(req_id, req_state, request, prompt_text=None):
            submitted.append(request.request_id)
            return 0

        pool = SimpleNamespace(
            live_replica_ids=lambda: [0],
            stage_client=SimpleNamespace(requires_multimodal_data=False),
            stage_type="llm",
            stage_vllm_config=SimpleNamespace(model_config=SimpleNamespace(max_model_len=4096)),
            submit_initial=submit_initial,
            get_bound_replica_id=lambda req_id: 0,
        )
        orch = self.orch
        saved = orch.stage_pools
        orch.stage_pools = [saved[0], pool]
        orch._pd_pair = (0, 1)
        orch._pd_kv_params = {rid: {"remote_request_id": f"remote-{rid}"}}
        orch._pd_bootstrap_addr = orch._pd_prefill_engine_id = None
        orch._transfer_emitter = None
        req_state = self.OrchestratorRequestState(
            request_id=rid,
            prompt={"prompt_token_ids": [1, 2, 3]},
            sampling_params_list=[SamplingParams(), SamplingParams()],
        )
        try:
            self.loop.run_until_complete(orch._forward_to_next_stage_unguarded(rid, 0, output(rid, tokens), req_state))
        finally:
            orch.stage_pools, orch._pd_pair = saved, None
        return submitted

    def respond(self, stage_id: int, rid: str, tokens) -> dict:
        """The response vLLM-Omni builds for a stage output: its metrics."""
        from vllm_omni.engine.messages import OutputMessage
        from vllm_omni.metrics.stats import OrchestratorAggregator

        metrics = OrchestratorAggregator(len(self.orch.stage_pools), False, time.time(), stage_id)
        result = OutputMessage(
            request_id=rid,
            stage_id=stage_id,
            replica_id=0,
            engine_outputs=output(rid, tokens),
            metrics=None,
            finished=False,
            stage_submit_ts=None,
        )
        out = self.api._process_single_result(result, stage_id, metrics, {}, time.time(), stage_id)
        return out.metrics

    def snapshot(self, rid: str) -> dict:
        owner = owner_of_this_process()
        return owner.region.snapshot(owner.tokens[rid])

    def cleanup(self, rid: str) -> dict:
        state = self.api.request_states[rid]
        self.api._log_summary_and_cleanup(rid)
        return state.stream_edge_metrics

    def abort(self, rid: str) -> dict:
        state = self.api.request_states[rid]
        self.sync.abort(rid)
        return state.stream_edge_metrics


def owner_of_this_process():
    from edgemark import vllm_omni

    return vllm_omni.instrumentor.recording.owner


def every_target():
    from edgemark import vllm_omni

    return vllm_omni.instrumentor.targets()


def current(t):
    """The function at a target's place now (``None`` if there is none)."""
    import importlib

    try:
        mod = importlib.import_module(t.module)
    except ImportError:
        return None
    owner = mod if t.cls is None else getattr(mod, t.cls, None)
    return None if owner is None else owner.__dict__.get(t.attr)


def targets():
    return {t.name: id(current(t)) for t in every_target()}


def roundtrip() -> bool:
    """vLLM-Omni's transport still moves a payload between two runners."""
    from vllm_omni.worker.omni_connector_model_runner_mixin import OmniConnectorModelRunnerMixin

    class Runner(OmniConnectorModelRunnerMixin):
        pass

    def runner(stage):
        r = Runner()
        r.init_omni_connectors(
            model_config=SimpleNamespace(
                stage_connector_config={"name": "SharedMemoryConnector", "extra": {}},
                async_chunk=True,
                worker_type="ar",
                custom_process_next_stage_input_func=None,
                stage_id=stage,
            )
        )
        return r

    sys.path.insert(0, HERE)
    from _vllm_omni_stage import payload

    producer, consumer = runner(0), runner(1)
    producer._custom_process_func = lambda transfer_manager, pooling_output, request: payload(pooling_output)
    producer._custom_process_payload_kwarg = "pooling_output"
    rid = f"roundtrip-{os.getpid()}"
    consumer.register_chunk_recv(SimpleNamespace(request_id=rid, external_req_id=rid))
    producer.send_chunk(SimpleNamespace(request_id=rid, external_req_id=rid), pooling_output="data")
    deadline = time.monotonic() + 30
    got = {}
    while time.monotonic() < deadline and rid not in got:
        got.update(consumer.recv_chunk())
        time.sleep(0.01)
    producer.shutdown_omni_connectors()
    consumer.shutdown_omni_connectors()
    return rid in got


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record) -> None:
        self.messages.append(record.getMessage())


def scenario_main() -> dict:
    from vllm_omni.plugins import load_omni_general_plugins

    load_omni_general_plugins()
    from edgemark import vllm_omni

    result = {"instrumented": vllm_omni.is_instrumented()}
    server = Server()
    producer, consumer, decoder = Stage(0, "ar"), Stage(1, "ar"), Stage(1, "generation")
    # Full-payload mode on the next edge: stage 1 hands stage 2 whole payloads.
    full_producer, full_consumer = Stage(1, "ar", "full"), Stage(2, "ar", "full")
    stages = (producer, consumer, decoder, full_producer, full_consumer)
    try:
        result["stages_instrumented"] = [s.ready()["instrumented"] for s in stages]

        # A: two payloads, two outputs.
        server.begin("req-A")
        consumer(op="register", rid="req-A")
        producer(op="send", rid="req-A", kind="data")
        consumer(op="wait", rid="req-A", chunks=1, accepted=True)
        server.route(1, "req-A", [7])
        result["A_response"] = server.respond(1, "req-A", [7])
        result["A_first"] = server.snapshot("req-A")
        producer(op="send", rid="req-A", kind="data")
        consumer(op="wait", rid="req-A", chunks=2)
        server.route(1, "req-A", [8])
        result["A"] = server.cleanup("req-A")
        result["A_after_close"] = "req-A" not in owner_of_this_process().tokens

        # B: an empty terminal payload, then an empty output.
        server.begin("req-B")
        consumer(op="register", rid="req-B")
        producer(op="send", rid="req-B", kind="terminal")
        consumer(op="wait", rid="req-B", chunks=1)
        server.route(1, "req-B", [])
        result["B"] = server.cleanup("req-B")

        # C: the connector's put fails (every retry).
        server.begin("req-C")
        consumer(op="register", rid="req-C")
        producer(op="send", rid="req-C", kind="unsendable")
        result["C"] = server.cleanup("req-C")

        # D: the payload arrives where it is not admitted (a decoder stage
        # waits for audio codes, not embeddings); closed by the sync abort.
        server.begin("req-D")
        decoder(op="register", rid="req-D")
        producer(op="send", rid="req-D", kind="data")
        result["D_taken"] = decoder(op="wait", rid="req-D", chunks=1)["chunks"]
        result["D"] = server.abort("req-D")

        # A again: a new instance under a reused request ID, after each
        # stage freed the first one.
        producer(op="free", rid="req-A")
        consumer(op="free", rid="req-A")
        server.begin("req-A")
        consumer(op="register", rid="req-A")
        producer(op="send", rid="req-A", kind="data")
        consumer(op="wait", rid="req-A", chunks=1, accepted=True)
        server.route(1, "req-A", [9])
        result["A2"] = server.cleanup("req-A")

        # H: a hand-off the orchestrator makes itself, without a connector.
        server.begin("req-H")
        result["H_submitted"] = server.forward("req-H", [4])
        result["H"] = server.cleanup("req-H")

        # F: one whole payload on 1 -> 2 (full-payload mode).
        server.begin("req-F")
        full_consumer(op="register", rid="req-F")
        result["F_sent"] = full_producer(op="send_full", rid="req-F", kind="data")["ok"]
        full_consumer(op="wait", rid="req-F", chunks=1, accepted=True)
        server.route(2, "req-F", [5])
        result["F"] = server.cleanup("req-F")

        result["open_after"] = len(owner_of_this_process().region.open_requests())
        result["region"] = owner_of_this_process().path
    finally:
        for s in stages:
            s.stop()
    return result


def adapter_stage(stage_id: int) -> Stage:
    """A stage process on the adapter path (``_vllm_omni_adapter_stage.py``)."""
    return Stage(stage_id, "ar", script="_vllm_omni_adapter_stage.py")


def scenario_adapter() -> dict:
    """The default transport: chunks through the scheduler's transfer adapter."""
    from vllm_omni.plugins import load_omni_general_plugins

    load_omni_general_plugins()
    server = Server()
    producer, consumer = adapter_stage(0), adapter_stage(1)
    result = {}
    try:
        result["stages_instrumented"] = [producer.ready()["instrumented"], consumer.ready()["instrumented"]]

        # A: a step with content, its chunk through the adapter, an output;
        # then a second chunk and output, which change nothing.
        server.begin("req-A")
        consumer(op="register", rid="req-A")
        result["A_puts"] = producer(op="save", rid="req-A", kind="data")["puts"]
        result["A_admitted"] = consumer(op="wait", rid="req-A", accepted=True)["admitted"]
        server.route(1, "req-A", [7])
        result["A_first"] = server.snapshot("req-A")
        consumer(op="register", rid="req-A")
        producer(op="save", rid="req-A", kind="data")
        consumer(op="wait", rid="req-A")
        server.route(1, "req-A", [8])
        result["A"] = server.cleanup("req-A")

        # E: steps with no output, then the request finishes with an empty
        # terminal chunk (the processor built no payload): nothing recorded.
        server.begin("req-E")
        consumer(op="register", rid="req-E")
        producer(op="save", rid="req-E", kind="empty")
        result["E_puts"] = producer(op="save", rid="req-E", kind="empty", finished=True)["puts"]
        result["E_admitted"] = consumer(op="wait", rid="req-E")["admitted"]
        result["E"] = server.cleanup("req-E")

        # A again, after both stages freed it: a new instance records its own.
        producer(op="free", rid="req-A")
        consumer(op="free", rid="req-A")
        server.begin("req-A")
        consumer(op="register", rid="req-A")
        producer(op="save", rid="req-A", kind="data")
        consumer(op="wait", rid="req-A", accepted=True)
        server.route(1, "req-A", [9])
        result["A2"] = server.cleanup("req-A")
        result["open_after"] = len(owner_of_this_process().region.open_requests())
    finally:
        producer.stop()
        consumer.stop()
    return result


def scenario_override() -> dict:
    """A runner whose receive helper is overridden on the instance (as a
    test double or a subclass's set-up might): the override runs as often
    with the plugin as without, and stays in place."""
    from vllm_omni.plugins import load_omni_general_plugins

    load_omni_general_plugins()
    from vllm_omni.worker.omni_connector_model_runner_mixin import OmniConnectorModelRunnerMixin

    sys.path.insert(0, HERE)
    from _vllm_omni_stage import payload

    class Runner(OmniConnectorModelRunnerMixin):
        pass

    def runner(stage):
        r = Runner()
        r.init_omni_connectors(
            model_config=SimpleNamespace(
                stage_connector_config={"name": "SharedMemoryConnector", "extra": {}},
                async_chunk=True,
                worker_type="ar",
                custom_process_next_stage_input_func=None,
                stage_id=stage,
            )
        )
        return r

    producer, consumer = runner(0), runner(1)
    producer._custom_process_func = lambda transfer_manager, pooling_output, request: payload(pooling_output)
    producer._custom_process_payload_kwarg = "pooling_output"
    calls = []
    bound = consumer._recv_async_chunk_result

    def override(*args, **kwargs):
        calls.append(1)
        return bound(*args, **kwargs)

    consumer._recv_async_chunk_result = override
    rid = f"override-{os.getpid()}"
    consumer.register_chunk_recv(SimpleNamespace(request_id=rid, external_req_id=rid))
    producer.send_chunk(SimpleNamespace(request_id=rid, external_req_id=rid), pooling_output="data")
    deadline = time.monotonic() + 30
    got = {}
    while time.monotonic() < deadline and rid not in got:
        got.update(consumer.recv_chunk())
        time.sleep(0.01)
    producer.shutdown_omni_connectors()
    consumer.shutdown_omni_connectors()
    return {
        "received": rid in got,
        "override_ran": len(calls) > 0,
        "override_kept": consumer.__dict__.get("_recv_async_chunk_result") is override,
        "instance_attrs": sorted(k for k in consumer.__dict__ if "edgemark" in k),
    }


def scenario_traced() -> dict:
    """The API server hands each stage's engine request the request's trace
    context: stage 0's through the engine's request message, the later
    stages' through build_engine_core_request_from_tokens (the function as
    the orchestrator and the duplex orchestrator each import it)."""
    from vllm_omni.plugins import load_omni_general_plugins

    load_omni_general_plugins()
    from vllm.sampling_params import SamplingParams

    from edgemark import vllm_omni
    from vllm_omni.engine import duplex_orchestrator, orchestrator
    from vllm_omni.engine.async_omni_engine import AsyncOmniEngine

    server = Server()
    server.begin("req-T")
    seen = {}

    def fake_build(self, request_id, *args, **kwargs):
        # Stand-in for the engine's processing past the wrapper: what it got.
        seen[request_id] = kwargs.get("trace_headers")
        raise RuntimeError("stop here")

    engine = object.__new__(AsyncOmniEngine)
    # The installed wrapper, around a stand-in of what it wraps (the real
    # one processes a whole prompt): the same wrapper code, made the same way.
    from edgemark.vllm_omni import orchestrator as plugin_orch

    probe = plugin_orch.wrap_add_request_message(fake_build, vllm_omni.instrumentor.recording)
    incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    mine_before = vllm_omni.traceparent_of("req-T")
    caller_headers = {"traceparent": incoming, "tracestate": "vendor=1"}
    try:
        probe(engine, "req-T", prompt=None, trace_headers=caller_headers)
    except RuntimeError:
        pass
    mine = vllm_omni.traceparent_of("req-T")
    later = {}
    for name, module in (("orchestrator", orchestrator), ("duplex", duplex_orchestrator)):
        request = module.build_engine_core_request_from_tokens(
            request_id="req-T", prompt={"prompt_token_ids": [1, 2]}, params=SamplingParams(max_tokens=4)
        )
        later[name] = request.trace_headers
    final = server.cleanup("req-T")
    return {
        "wrapped": hasattr(AsyncOmniEngine._build_add_request_message, "__wrapped__"),
        "mine_before": mine_before,
        "mine": mine,
        "incoming": incoming,
        "stage0": seen.get("req-T"),
        "caller_headers_unchanged": caller_headers == {"traceparent": incoming, "tracestate": "vendor=1"},
        "later": later,
        "final": final,
    }


def scenario_small() -> dict:
    """The region does not fit in /dev/shm (a container's 64 MiB, 65,536
    slots asked for): one warning, nothing left patched, the server serves."""
    handler = Warnings()
    logging.getLogger("edgemark.vllm_omni").addHandler(handler)
    from vllm_omni.plugins import load_omni_general_plugins

    load_omni_general_plugins()
    from edgemark import vllm_omni
    from vllm_omni.engine.orchestrator import OrchestratorBase

    patched = vllm_omni.is_instrumented()
    orch = object.__new__(OrchestratorBase)
    try:
        OrchestratorBase.__init__(orch, None, None, None, [])
    except Exception:  # noqa: BLE001 - its own set-up needs a whole engine
        pass
    # vLLM-Omni's __init__ ran into our stand-in arguments; the wrapper runs
    # after it only when it returns, so create the region as it would.
    vllm_omni.instrumentor.recording.ensure_owner([(a, b) for a in range(3) for b in range(3) if a != b], 65536)
    server = Server()
    server.begin("req-S")
    response = server.respond(1, "req-S", [7])
    return {
        "patched_before": patched,
        "instrumented": vllm_omni.is_instrumented(),
        "warnings": [m for m in handler.messages if m.startswith("edgemark")],
        "response_keys": sorted(response),
        "same": all(not hasattr(current(t), "__wrapped__") for t in every_target() if current(t) is not None),
        "roundtrip": roundtrip(),
        "region_exists": os.path.exists(os.environ[vllm_omni.ENV_REGION]),
    }


def scenario_kill() -> dict:
    from vllm_omni.plugins import load_omni_general_plugins

    load_omni_general_plugins()
    from edgemark import vllm_omni

    server = Server()
    producer, consumer = Stage(0, "ar"), Stage(1, "ar")
    try:
        producer.ready(), consumer.ready()
        state = server.begin("req-K")
        consumer(op="register", rid="req-K")
        producer(op="send", rid="req-K", kind="data")
        consumer(op="wait", rid="req-K", chunks=1, accepted=True)
        os.kill(producer.proc.pid, signal.SIGKILL)
        producer.proc.wait(timeout=60)
        before = server.snapshot("req-K")
        final = server.cleanup("req-K")
        return {
            "killed": producer.proc.returncode,
            "before": before,
            "final": final,
            "open_after": len(owner_of_this_process().region.open_requests()),
        }
    finally:
        consumer.stop()


def scenario_disabled() -> dict:
    before = targets()
    from vllm_omni.plugins import load_omni_general_plugins

    load_omni_general_plugins()
    from edgemark import vllm_omni

    return {
        "same": before == targets(),
        "instrumented": vllm_omni.is_instrumented(),
        "region_env": os.environ.get(vllm_omni.ENV_REGION),
        "roundtrip": roundtrip(),
    }


def _refused(change) -> dict:
    from edgemark import vllm_omni

    handler = Warnings()
    logging.getLogger("edgemark.vllm_omni").addHandler(handler)
    change(vllm_omni)
    before = targets()
    from vllm_omni.plugins import load_omni_general_plugins

    load_omni_general_plugins()
    again = vllm_omni.instrument()
    return {
        "same": before == targets(),
        "instrumented": vllm_omni.is_instrumented(),
        "again": again,
        "warnings": [m for m in handler.messages if m.startswith("edgemark")],
        "roundtrip": roundtrip(),
    }


def scenario_version() -> dict:
    # Older than the tested range: refused.
    def change(plugin):
        from edgemark import _instrument

        _instrument.installed_version = lambda distribution: "0.28.0"

    return _refused(change)


def scenario_newer() -> dict:
    # Newer than the tested range, every call site as this release has it:
    # patched, with one warning that names the tested range.
    from edgemark import _instrument, vllm_omni

    handler = Warnings()
    logging.getLogger("edgemark.vllm_omni").addHandler(handler)
    _instrument.installed_version = lambda distribution: "0.33.0"
    before = targets()
    from vllm_omni.plugins import load_omni_general_plugins

    load_omni_general_plugins()
    patched = vllm_omni.is_instrumented() and targets() != before
    again = vllm_omni.instrument()
    vllm_omni.uninstrument()
    return {
        "patched": patched,
        "untested": vllm_omni.instrumentor.untested,
        "again": again,
        "restored": targets() == before,
        "warnings": [m for m in handler.messages if m.startswith("edgemark")],
    }


def scenario_renamed() -> dict:
    def change(plugin):
        from vllm_omni.distributed.omni_connectors.model_runner import omni_connector_payload_transport as t

        cls = t._OmniConnectorPayloadTransportMixin
        orig = cls._send_single_request

        def _send_single_request(self, job):  # the same call, another parameter name
            return orig(self, job)

        cls._send_single_request = _send_single_request

    return _refused(change)


def scenario_missing() -> dict:
    def change(plugin):
        from vllm_omni.distributed.omni_connectors.model_runner import omni_connector_payload_transport as t

        del t._OmniConnectorPayloadTransportMixin._recv_full_payload_result

    return _refused(change)


def scenario_twice() -> dict:
    """Loaded again (a second plugin load, a forked child): one set of patches."""
    from vllm_omni.plugins import load_omni_general_plugins

    load_omni_general_plugins()
    from edgemark import vllm_omni

    first = targets()
    vllm_omni.register()
    vllm_omni.instrument()
    pid = os.fork()
    if pid == 0:
        vllm_omni.register()
        os._exit(0 if targets() == first else 3)
    _, status = os.waitpid(pid, 0)
    same = targets() == first
    vllm_omni.uninstrument()
    vllm_omni.uninstrument()
    restored = all(
        current(t) is None or (current(t).__name__ == t.attr and not hasattr(current(t), "__wrapped__"))
        for t in every_target()
    )
    return {"same": same, "child": os.waitstatus_to_exitcode(status), "restored": restored}


if __name__ == "__main__":
    print(json.dumps(globals()["scenario_" + sys.argv[1]]()), flush=True)
