"""The vLLM-Omni plugin (``edgemark.vllm_omni``) against the real vLLM-Omni.

Each scenario runs in fresh processes (``_vllm_omni_orchestrator.py``, which
starts real stage processes, ``_vllm_omni_stage.py``): the plugin patches
classes process-wide, and vLLM-Omni loads it once per process.

These tests need ``vllm-omni`` installed (CI installs vllm and vllm-omni
0.30.0 into a virtual environment of their own). Where it is not installed
they are skipped, unless ``EDGEMARK_REQUIRE_VLLM_OMNI=1``, which CI sets so
that they can never be skipped there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

if importlib.util.find_spec("vllm_omni") is None:
    if os.environ.get("EDGEMARK_REQUIRE_VLLM_OMNI") == "1":
        raise RuntimeError("EDGEMARK_REQUIRE_VLLM_OMNI=1 but vllm_omni is not installed")
    pytest.skip("vllm-omni is not installed", allow_module_level=True)

EVENTS = (
    "producer_first_nonempty_emit_ms",
    "edge_first_send_complete_ms",
    "consumer_first_accept_ms",
    "consumer_first_nonempty_output_ms",
)


def run(scenario: str, enabled: bool = True, wrap=(), **extra_env) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEMARK_VLLM_OMNI")}
    if enabled:
        env["EDGEMARK_VLLM_OMNI"] = "1"
    env.update(extra_env)
    # vLLM logs to stdout; the scenario's result is its last JSON line.
    proc = subprocess.run(
        [*wrap, sys.executable, os.path.join(HERE, "_vllm_omni_orchestrator.py"), scenario],
        env=env,
        capture_output=True,
        text=True,
        # Six processes each import vLLM (15 CPU-seconds apiece): on a
        # loaded two-core machine the main scenario alone nears 600 s.
        timeout=1800,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"scenario {scenario} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def main():
    return run("main")


def values(snapshot: dict, key: str = "0->1:0"):
    seg = snapshot[key]
    return [seg[e] for e in EVENTS]


def assert_causal_order(emit, send, accept, output) -> None:
    """The four events, all present, in every order that causality fixes.

    Send complete and accept are not ordered against each other: the
    producer stamps its send when its put returns, the consumer its accept
    when its admission returns, and the consumer can admit the chunk while
    the producer's thread is still on its way out of the put (docs/
    limitations.md). Each follows the emit, and precedes the output: the
    stages reply only after the send's thread is done with it and after the
    accept is recorded (``"accepted": true`` in their ``wait``)."""
    assert None not in (emit, send, accept, output)
    assert emit <= send <= output
    assert emit <= accept <= output


def test_every_process_is_instrumented(main):
    assert main["instrumented"] is True
    assert main["stages_instrumented"] == [True] * 5


def test_two_stage_processes_record_all_four_events_in_order(main):
    final = main["A"]
    assert list(final) == ["0->1:0"]
    seg = final["0->1:0"]
    assert (seg["from_stage"], seg["to_stage"], seg["segment_index"]) == (0, 1, 0)
    assert seg["first_chunk_seq"] == 0
    assert set(seg["clock_domains"].values()) == {"host_monotonic"}
    assert_causal_order(*values(final))


def test_the_response_metrics_carry_the_snapshot(main):
    # vLLM-Omni's own response builder, with the plugin: the upstream key
    # beside vLLM-Omni's own metrics, the upstream shape.
    assert main["A_response"]["stream_edge_metrics"] == main["A_first"]
    assert set(main["A_first"]["0->1:0"]) == {
        "from_stage", "to_stage", "segment_index", "first_chunk_seq", "clock_domains", *EVENTS
    }


def test_a_second_payload_and_output_change_nothing(main):
    # The first payload was accepted and the first output routed before the
    # second of each: every value is the first one's.
    assert main["A_first"] == main["A"]


def test_an_empty_terminal_payload_and_an_empty_output_record_nothing(main):
    assert main["B"] == {}


def test_a_failed_send_leaves_the_later_events_null(main):
    emit, send, accept, output = values(main["C"])
    assert emit is not None
    assert (send, accept, output) == (None, None, None)


def test_a_payload_not_admitted_leaves_accept_and_output_null(main):
    assert main["D_taken"] == 1
    emit, send, accept, output = values(main["D"])
    assert emit is not None and send is not None and emit <= send
    assert (accept, output) == (None, None)


def test_the_sync_abort_closes(main):
    # D was removed by Omni.abort (the path upstream left unreleased); no
    # request stays open at the end.
    assert main["D"] != {}
    assert main["open_after"] == 0


def test_a_reused_request_id_records_into_the_new_instance_only(main):
    # The second instance under the same ID got its own values (its origin
    # is its own begin: they are not A's), and A's final snapshot, taken at
    # its close, kept A's.
    assert_causal_order(*values(main["A2"]))
    assert main["A2"] != main["A"]


def test_full_payload_mode_records_its_edge(main):
    # send_full_payload_outputs, its send thread, the full-payload receive,
    # then the next stage's output: edge 1 -> 2 only.
    assert main["F_sent"] is True
    assert list(main["F"]) == ["1->2:0"]
    assert_causal_order(*values(main["F"], "1->2:0"))


def test_a_hand_off_the_orchestrator_makes_records_emit_and_send(main):
    assert main["H_submitted"] == ["req-H"]
    emit, send, accept, output = values(main["H"])
    assert emit is not None and send is not None and emit <= send
    assert (accept, output) == (None, None)


def test_the_region_is_removed_at_exit(main):
    assert main["region"].endswith(".region")
    assert not os.path.exists(main["region"])
    assert not os.path.exists(main["region"][: -len(".region")] + ".requests")


@pytest.fixture(scope="module")
def adapter():
    return run("adapter")


def test_the_adapter_path_records_all_four_events_in_order(adapter):
    # The default transport (async_chunk under the default model runner):
    # save_async, the save thread's put, the receive thread's admission.
    assert adapter["stages_instrumented"] == [True, True]
    assert adapter["A_puts"] == 1 and adapter["A_admitted"] is True
    final = adapter["A"]
    assert list(final) == ["0->1:0"]
    assert final["0->1:0"]["first_chunk_seq"] == 0
    assert_causal_order(*values(final))
    # A second chunk and output changed nothing.
    assert adapter["A_first"] == final


def test_the_adapter_path_ignores_empty_steps_and_the_empty_terminal_chunk(adapter):
    # The terminal chunk went out and was admitted, but carried nothing.
    assert adapter["E_admitted"] is True
    assert adapter["E"] == {}


def test_the_adapter_path_records_a_reused_id_into_the_new_instance(adapter):
    assert_causal_order(*values(adapter["A2"]))
    assert adapter["A2"] != adapter["A"]
    assert adapter["open_after"] == 0


def test_the_accept_wrapper_leaves_an_instance_override_in_place():
    out = run("override")
    assert out == {"received": True, "override_ran": True, "override_kept": True, "instance_attrs": []}


def test_every_stages_engine_request_carries_the_requests_trace_context():
    out = run("traced")
    assert out["wrapped"] is True
    trace, parent = out["incoming"].split("-")[1:3]
    # The caller's traceparent became the request's parent: the request was
    # begun again in the caller's trace (nothing was recorded yet).
    assert out["mine_before"].split("-")[1] != trace
    assert out["mine"].split("-")[1] == trace and out["mine"].split("-")[2] != parent
    # Stage 0's request carries the request's own span as the parent, beside
    # the caller's other headers; the caller's mapping is not changed.
    assert out["stage0"] == {"tracestate": "vendor=1", "traceparent": out["mine"]}
    assert out["caller_headers_unchanged"] is True
    # And so does every later stage's, through both modules' function.
    assert out["later"] == {"orchestrator": {"traceparent": out["mine"]}, "duplex": {"traceparent": out["mine"]}}


def test_a_region_too_large_for_dev_shm_leaves_the_server_serving(tmp_path):
    if os.geteuid() != 0:
        if os.environ.get("EDGEMARK_REQUIRE_VLLM_OMNI") == "1":
            raise RuntimeError("the /dev/shm size test needs root (a tmpfs of its own)")
        pytest.skip("needs root for a tmpfs of its own")
    # A container's default /dev/shm: 64 MiB, in a mount namespace of the
    # test's own; the stages ask for 65,536 slots (633 MiB).
    shm = tmp_path / "shm"
    shm.mkdir()
    region = shm / "edgemark-vllm-omni-small.region"
    out = run(
        "small",
        wrap=("unshare", "--mount", "--propagation", "private", "sh", "-c",
              f"mount -t tmpfs -o size=64m tmpfs '{shm}' && exec \"$@\"", "sh"),
        EDGEMARK_VLLM_OMNI_REGION=str(region),
        EDGEMARK_VLLM_OMNI_SLOTS="65536",
    )  # fmt: skip
    assert out["patched_before"] is True
    assert len(out["warnings"]) == 1 and "cannot create the region" in out["warnings"][0]
    assert "No space" in out["warnings"][0] or "ENOSPC" in out["warnings"][0] or "space" in out["warnings"][0]
    assert out["instrumented"] is False and out["same"] is True
    assert "stream_edge_metrics" not in out["response_keys"]
    assert out["roundtrip"] is True
    assert out["region_exists"] is False


def test_a_stage_killed_mid_request():
    out = run("kill")
    assert out["killed"] == -9
    # What the killed producer and the live consumer recorded is kept and
    # returned at close; nothing stays open.
    emit, send, accept, _ = values(out["final"])
    assert None not in (emit, send, accept)
    assert out["final"] == out["before"]
    assert out["open_after"] == 0


def test_unset_variable_replaces_nothing():
    out = run("disabled", enabled=False)
    assert out["same"] is True
    assert out["instrumented"] is False
    assert out["region_env"] is None
    assert out["roundtrip"] is True


@pytest.mark.parametrize("scenario", ["version", "renamed", "missing"])
def test_an_unsupported_vllm_omni_is_left_alone_with_one_warning(scenario):
    out = run(scenario)
    assert out["same"] is True
    assert out["instrumented"] is False and out["again"] is False
    # One warning, although the plugin was loaded and then called again.
    assert len(out["warnings"]) == 1
    assert ("not supported" if scenario == "version" else "nothing is patched") in out["warnings"][0]
    assert out["roundtrip"] is True


def test_a_newer_vllm_omni_records_when_everything_checks_out_and_says_the_tested_range():
    from edgemark.vllm_omni import package

    out = run("newer")
    assert out["patched"] is True and out["untested"] is True and out["again"] is True
    assert out["restored"] is True
    assert len(out["warnings"]) == 1, out["warnings"]
    assert "newer than the releases edgemark was tested with" in out["warnings"][0]
    assert package.SUPPORTED in out["warnings"][0]


def test_loaded_many_times_patches_once_and_uninstruments():
    out = run("twice")
    assert out == {"same": True, "child": 0, "restored": True}
