"""One vLLM-Omni stage process for the plugin tests: vLLM-Omni's own chunk
transport (the model runner's connector mixin, as vLLM-Omni's CPU unit tests
build it) over its real SharedMemoryConnector, no model, no GPU.

    python _vllm_omni_stage.py STAGE_ID WORKER_TYPE [full]

(``full``: the stage moves whole payloads, vLLM-Omni's full-payload mode,
instead of async chunks.)

It loads the plugins as a model worker does (under vLLM's name for that
process, through vLLM-Omni's loader, both groups: so the edgemark plugin
patches the model runner's call sites when EDGEMARK_VLLM_OMNI=1), prints
``{"ready": true}``, then answers one JSON command per stdin line with one
JSON line on stdout:

- ``{"op": "send", "rid": R, "kind": K}``: the producer emits one payload
  of kind K (``data``, ``terminal``, ``unsendable``) through ``send_chunk``
  and waits until its send thread is done with it (sent or given up);
- ``{"op": "send_full", "rid": R, "kind": K}``: the producer hands one
  finished output to ``send_full_payload_outputs`` and waits as for ``send``;
- ``{"op": "register", "rid": R}``: the consumer registers R for receiving;
- ``{"op": "wait", "rid": R, "chunks": N}``: waits until the consumer's
  receive thread has taken N payloads of R off the connector, and with
  ``"accepted": true`` until the plugin recorded this stage's accept of R;
- ``{"op": "free", "rid": R}``: the runner frees R, as vLLM-Omni's model
  runner does when a request finishes (``cleanup_finished_request``);
- ``{"op": "exit"}``.
"""

from __future__ import annotations

import sys
import threading
import time
from types import SimpleNamespace

from _vllm_omni_stage_support import answer_commands, print_json, wait_accept_recorded


def payload(kind: str):
    import torch

    if kind == "data":
        return {"embed": {"decode": torch.ones(2, 4)}, "meta": {"finished": torch.tensor(False)}}
    if kind == "terminal":
        # An empty terminal marker: only the finish flag.
        return {"meta": {"finished": torch.tensor(True)}}
    if kind == "unsendable":
        # The connector's serializer cannot encode a lock: its put fails.
        return {"embed": {"decode": torch.ones(2, 4)}, "extra": {"lock": threading.Lock()}}
    raise ValueError(kind)


def wait_sent(runner, rid: str) -> None:
    """Waits until the send thread is done with every payload of ``rid``
    (sent, or given up after its retries)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with runner._lock:
            if not runner._pending_save_counts.get(rid) and rid not in runner._pending_save_reqs:
                return
        time.sleep(0.005)


def main() -> None:
    stage_id, worker_type = int(sys.argv[1]), sys.argv[2]
    full = sys.argv[3:] == ["full"]
    import multiprocessing

    from vllm_omni.plugins import load_omni_general_plugins
    from vllm_omni.worker.omni_connector_model_runner_mixin import OmniConnectorModelRunnerMixin

    # Plugins load as in a model worker, which vLLM starts under this name
    # and where vLLM-Omni's worker mixin loads both plugin groups: the
    # plugin patches the model runner's call sites only.
    multiprocessing.current_process().name = f"VllmWorker-{stage_id}"
    load_omni_general_plugins()

    class Runner(OmniConnectorModelRunnerMixin):
        pass

    runner = Runner()
    runner.init_omni_connectors(
        model_config=SimpleNamespace(
            stage_connector_config={"name": "SharedMemoryConnector", "extra": {}},
            async_chunk=not full,
            worker_type=worker_type,
            custom_process_next_stage_input_func=None,
            stage_id=stage_id,
        )
    )
    # The stage's payload hook: the command names the payload it returns.
    runner._custom_process_func = lambda transfer_manager, pooling_output, request: payload(pooling_output)
    runner._custom_process_payload_kwarg = "pooling_output"
    from edgemark import vllm_omni

    print_json({"ready": True, "instrumented": vllm_omni.is_instrumented()})

    def handle(op: str, cmd: dict):
        rid = cmd.get("rid")
        if op == "send":
            ok = runner.send_chunk(SimpleNamespace(request_id=rid, external_req_id=rid), pooling_output=cmd["kind"])
            wait_sent(runner, rid)
            return {"ok": ok}
        if op == "send_full":
            request = SimpleNamespace(request_id=rid, external_req_id=rid)
            sent = runner.send_full_payload_outputs(None, {rid: (cmd["kind"], request)})
            wait_sent(runner, rid)
            return {"ok": sent == [rid]}
        if op == "register":
            runner.register_chunk_recv(SimpleNamespace(request_id=rid, external_req_id=rid))
            return {"ok": True}
        if op == "wait":
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and runner._get_req_chunk.get(rid, 0) < cmd["chunks"]:
                time.sleep(0.005)
            if cmd.get("accepted"):
                # The receive thread counts, admits, then the plugin stamps
                # the accept: wait for the stamp itself, so that the output
                # routed next follows it however long that thread waits.
                wait_accept_recorded(rid, stage_id, deadline)
            else:
                # Nothing to be stamped: let the receive thread finish.
                time.sleep(0.05)
            return {"chunks": runner._get_req_chunk.get(rid, 0)}
        if op == "free":
            # The model runner frees a finished request.
            runner.cleanup_finished_request(rid)
            return {"ok": True}
        return None

    answer_commands(handle, runner.shutdown_omni_connectors)

if __name__ == "__main__":
    main()
