"""The parts of the vLLM P/D plugin that need no vLLM: loading it,
refusing without vLLM, who begins, joins and closes each request of the
prefill -> decode hand-off (each process's recording state stood in for by
a ``Recording`` of its own, as the processes of two instances on one host
have), and the connector hooks on stand-in connectors."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import types
from types import SimpleNamespace

import pytest

import edgemark
from edgemark import EVENT_NAMES, _instrument
from edgemark import vllm as em_vllm
from edgemark.vllm import _recording, connector, package
from edgemark.vllm._recording import ACCEPT, EMIT, OUTPUT, SEND, Recording

TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def request(rid, **params):
    """A stand-in for vLLM's engine ``Request``."""
    return SimpleNamespace(request_id=rid, kv_transfer_params=dict(params) if params else None)


def prefill_params():
    return {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None}


def decode_params(remote):
    return {"do_remote_prefill": True, "do_remote_decode": False, "remote_request_id": remote, "remote_engine_id": "e"}


def step(*tokens_by_id):
    """A stand-in for a ``ModelRunnerOutput``: ``(request ID, sampled)``,
    with only the fields every release has (0.34 has no
    ``req_id_to_index``)."""
    return SimpleNamespace(
        req_ids=[rid for rid, _ in tokens_by_id],
        sampled_token_ids=[list(t) for _, t in tokens_by_id],
    )


class Pair:
    """The four processes of a P/D pair, each with its own recording
    state: the prefill API server and engine core, the decode API server
    and engine core (its worker in process, as with one CPU worker)."""

    def __init__(self, monkeypatch, prefill_region, decode_region):
        monkeypatch.setenv(em_vllm.ENV_REGION, prefill_region)
        self.p_api, self.p_engine = Recording(), Recording()
        monkeypatch.setenv(em_vllm.ENV_REGION, decode_region)
        self.d_api, self.d_engine = Recording(), Recording()
        self.p_api.start(None)
        self.d_api.start(None)

    def prefill(self, rid, tp=TRACE):
        token = self.p_api.begin(rid, prefill_params(), tp)
        self.p_engine.handed_over(request(rid, **prefill_params()), True, {"remote_request_id": rid})
        return token

    def decode_arrives(self, rid, remote, tp=TRACE):
        token = self.d_api.begin(rid, decode_params(remote), tp)
        self.d_engine.pd_of(request(rid, **decode_params(remote)))
        return token


def closed(region):
    """The closed requests of ``region``, by trace ID and span ID."""
    return region.drain_closed(1000)


def segment(final):
    return final["0->1:0"]


def ms(seg, event):
    return seg[EVENT_NAMES[event] + "_ms"]


def test_register_without_the_variable_does_nothing(monkeypatch):
    monkeypatch.delenv(em_vllm.ENV_ENABLE, raising=False)
    em_vllm.register()
    assert not em_vllm.is_instrumented()


def test_without_vllm_one_warning_and_nothing_patched(tmp_path):
    code = (
        "import logging, sys\n"
        "from edgemark import vllm as v\n"
        "from edgemark import _instrument\n"
        "_instrument.installed_version = lambda distribution: None\n"
        "logging.basicConfig(stream=sys.stdout, format='%(levelname)s %(message)s')\n"
        "print(v.instrument(), v.instrument(), v.is_instrumented())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    lines = out.splitlines()
    assert lines[-1] == "False False False"
    warnings = [line for line in lines if line.startswith("WARNING")]
    assert len(warnings) == 1 and "not installed" in warnings[0] and package.SUPPORTED in warnings[0]


def test_the_entry_point_has_ray_copy_the_plugins_variables(tmp_path):
    # vLLM's Ray executors copy to the processes they start only vLLM's
    # variables and the prefixes in VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY:
    # switched on, the entry point adds the plugins' (test_vllm_pd_releases
    # checks it against each release's own copy).
    code = (
        "import os\n"
        "from edgemark import vllm as v\n"
        "from edgemark import _instrument\n"
        "_instrument.installed_version = lambda distribution: None\n"
        "v.register()\n"
        "print(os.environ.get('VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY'))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EDGEMARK_", "_EDGEMARK_", "VLLM_RAY"))}
    run = lambda extra: subprocess.run(  # noqa: E731
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path, env={**env, **extra}
    ).stdout.splitlines()[-1]
    assert run({}) == "None", "off: untouched"
    assert run({"EDGEMARK_VLLM": "1"}) == "EDGEMARK_,_EDGEMARK_"
    assert run({"EDGEMARK_VLLM": "1", "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY": "A_"}) == "A_,EDGEMARK_,_EDGEMARK_"


def test_the_supported_range_is_declared_once_and_takes_the_cpu_build():
    assert package._instruments == ("vllm >= 0.32.0, < 0.35",)
    assert package.TESTED == ("0.32.0", "0.33.0", "0.34.0")
    for v in ("0.32.0", "0.32.0+cpu", "0.32.1", "0.33.0", "0.34.0", "0.34.2rc1"):
        assert package.is_supported(v), v
    for v in ("0.31.0", "0.32.0rc1", "0.35.0", "0.35.0rc1", "", None, "not a version"):
        assert not package.is_supported(v), v
    # Past the top: checked and recorded with a warning; below: refused.
    for v in ("0.35.0", "0.35.0rc1", "1.0.0"):
        assert _instrument.newer_than(v, package.SUPPORTED), v
    for v in ("0.31.0", "0.32.0rc1", "0.33.0", None, "not a version"):
        assert not _instrument.newer_than(v, package.SUPPORTED), v


def test_the_entry_point_is_its_own_and_the_omni_one_stays():
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert eps.get("edgemark_vllm") == "edgemark.vllm:register"
    assert eps.get("edgemark") == "edgemark.vllm_omni:register"


def test_each_process_patches_its_roles_only(monkeypatch):
    def roles(name):
        monkeypatch.setattr(_instrument, "process_name", lambda: name)
        return _instrument.process_roles(package.ROLES_BY_PROCESS, package.ROLES)

    assert roles("EngineCore") == ("engine", "connector")
    assert roles("EngineCore_DP1") == ("engine", "connector")
    assert roles("VllmWorker-0") == ("connector",)
    assert roles("MainProcess") == package.ROLES
    assert roles("ApiServer_1") == package.ROLES


def test_requests_are_told_apart_by_their_transfer_parameters():
    assert _recording.side_of(prefill_params()) == "prefill"
    assert _recording.side_of(decode_params("p-1")) == "decode"
    # NIXL clears do_remote_prefill once the decode side has allocated.
    assert _recording.side_of({**decode_params("p-1"), "do_remote_prefill": False}) == "decode"
    assert _recording.side_of(None) is None
    assert _recording.side_of({}) is None
    assert _recording.side_of({"do_remote_prefill": True}) is None
    engine_core_request = SimpleNamespace(sampling_params=SimpleNamespace(extra_args={"kv_transfer_params": {"a": 1}}))
    assert _recording.kv_params(engine_core_request) == {"a": 1}
    assert _recording.kv_params(SimpleNamespace(sampling_params=SimpleNamespace(extra_args=None))) is None


def test_one_host_all_four_events_in_one_request_closed_by_the_decode_side(region_env, monkeypatch):
    pair = Pair(monkeypatch, region_env, region_env)
    token = pair.prefill("p-1")
    assert token is not None
    # The decode side joins the prefill side's request: it begins nothing.
    assert pair.decode_arrives("d-1", "p-1") is None
    pair.p_engine.sent("p-1")
    region = pair.p_api.owner.region
    assert region.is_open(token), "a joined request waits for the decode side's first output"
    pair.d_engine.accepted("d-1")
    pair.d_engine.first_output(step(("other", []), ("d-1", [7])))
    assert not region.is_open(token)
    (only,) = closed(region)
    seg = segment(only["snapshot"])
    assert all(ms(seg, e) is not None for e in (EMIT, SEND, ACCEPT, OUTPUT))
    assert ms(seg, EMIT) <= ms(seg, SEND) and ms(seg, EMIT) <= ms(seg, ACCEPT) <= ms(seg, OUTPUT)
    assert only["trace_id"] == TRACE.split("-")[1]
    # The decode request finishing later closes nothing more.
    pair.d_engine.handed_over(request("d-1", **decode_params("p-1")), False, None)
    assert closed(region) == []


def test_one_host_the_prefill_side_closes_when_the_first_output_came_first(region_env, monkeypatch):
    pair = Pair(monkeypatch, region_env, region_env)
    token = pair.prefill("p-2")
    pair.decode_arrives("d-2", "p-2")
    pair.d_engine.accepted("d-2")
    pair.d_engine.first_output(step(("d-2", [3])))
    region = pair.p_api.owner.region
    assert region.is_open(token), "send complete is still to come"
    # The decode request ends before the prefill side sees the notification.
    pair.d_engine.handed_over(request("d-2", **decode_params("p-2")), False, None)
    assert region.is_open(token)
    pair.p_engine.sent("p-2")
    assert not region.is_open(token)
    seg = segment(closed(region)[0]["snapshot"])
    assert all(ms(seg, e) is not None for e in (EMIT, SEND, ACCEPT, OUTPUT))


def test_a_lease_that_expires_closes_the_request_with_the_later_events_null(region_env, monkeypatch):
    pair = Pair(monkeypatch, region_env, region_env)
    token = pair.prefill("p-3")
    pair.p_engine.expired("p-3")
    region = pair.p_api.owner.region
    assert not region.is_open(token)
    seg = segment(closed(region)[0]["snapshot"])
    assert ms(seg, EMIT) is not None
    assert [ms(seg, e) for e in (SEND, ACCEPT, OUTPUT)] == [None, None, None]
    # A decode that comes after all finds no open request to join: one of
    # its own.
    assert pair.decode_arrives("d-3", "p-3") is not None


def test_a_request_not_handed_over_closes_with_nothing_recorded(region_env, monkeypatch):
    pair = Pair(monkeypatch, region_env, region_env)
    token = pair.p_api.begin("p-4", prefill_params(), None)
    pair.p_engine.handed_over(request("p-4", **prefill_params()), False, None)
    region = pair.p_api.owner.region
    assert not region.is_open(token)
    # Nothing recorded: the final snapshot has no segment at all.
    assert closed(region)[0]["snapshot"] == {}


def test_a_decode_aborted_before_its_first_output_closes(region_env, monkeypatch):
    pair = Pair(monkeypatch, region_env, region_env)
    token = pair.prefill("p-5")
    pair.decode_arrives("d-5", "p-5")
    pair.d_engine.accepted("d-5")
    pair.d_engine.handed_over(request("d-5", **decode_params("p-5")), False, None)
    region = pair.p_api.owner.region
    assert not region.is_open(token)
    assert pair.d_engine.awaiting_output == {}


def test_two_hosts_each_side_records_its_own_request_under_the_same_trace(tmp_path, monkeypatch):
    pair = Pair(monkeypatch, str(tmp_path / "host-a.region"), str(tmp_path / "host-b.region"))
    p_token = pair.prefill("p-6")
    d_token = pair.decode_arrives("d-6", "p-6")
    assert d_token is not None, "no prefill request on this host: the decode side begins its own"
    pair.p_engine.sent("p-6")
    a, b = pair.p_api.owner.region, pair.d_api.owner.region
    assert not a.is_open(p_token), "nobody joined: the prefill side's part is done at send complete"
    pair.d_engine.accepted("d-6")
    pair.d_engine.first_output(step(("d-6", [1])))
    assert b.is_open(d_token), "a request of its own closes when it finishes"
    pair.d_engine.handed_over(request("d-6", **decode_params("p-6")), False, None)
    assert not b.is_open(d_token)
    (pa,), (pb,) = closed(a), closed(b)
    sa, sb = segment(pa["snapshot"]), segment(pb["snapshot"])
    assert ms(sa, EMIT) is not None and ms(sa, SEND) is not None and ms(sa, ACCEPT) is None
    assert ms(sb, ACCEPT) is not None and ms(sb, OUTPUT) is not None and ms(sb, EMIT) is None
    assert pa["trace_id"] == pb["trace_id"] == TRACE.split("-")[1]


def test_the_api_server_forgets_what_other_processes_closed(region_env, monkeypatch):
    pair = Pair(monkeypatch, region_env, region_env)
    pair.prefill("p-7")
    pair.p_engine.expired("p-7")
    owner = pair.p_api.owner
    assert "p-7" in owner.tokens
    assert owner.forget_closed() == 1
    assert owner.tokens == {}
    assert pair.p_api.read_lookup("p-7") is None, "its lookup entry is withdrawn"


def test_a_request_the_api_server_never_handed_to_the_engine_is_closed(region_env, monkeypatch):
    pair = Pair(monkeypatch, region_env, region_env)
    token = pair.p_api.begin("p-8", prefill_params(), None)
    pair.p_api.abandon("p-8", token)
    assert not pair.p_api.owner.region.is_open(token)


def test_the_step_wrapper_only_calls_through_while_nothing_waits(region_env):
    rec = Recording()
    calls = []

    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"the wrapper read {name}")

    def update_from_output(self, scheduler_output, model_runner_output):
        calls.append(model_runner_output)
        return "outputs"

    wrapped = connector.wrap_update_from_output(update_from_output, rec)
    out = Untouchable()
    assert wrapped(None, None, out) == "outputs"
    assert calls == [out]


# -- the connector hooks, on stand-ins ------------------------------------------


class Results:
    def __init__(self, sending=(), recving=(), failed=()):
        self.finished_sending, self.finished_recving, self.failed_recving = set(sending), set(recving), set(failed)


class NixlLikeWorker:
    """NIXL's worker as the plugin reads it: notified reads (pull mode),
    leases its reaper finds expired, WRITEs that completed (push mode, which
    from 0.33 reports no notifications), and what a replicated
    prefill-context-parallel rank reports unsent."""

    def __init__(self):
        self.notifs, self.expired, self.pushed = set(), set(), set()
        self._replicated_pcp_done_sending = set()

    def _get_new_notifs(self):
        out, self.notifs = self.notifs, set()
        return out

    def _reap_expired_send_leases(self, done_sending):
        done_sending.update(self.expired)
        self.expired = set()

    def get_transfer_results(self):
        done = self._get_new_notifs()
        done |= self._replicated_pcp_done_sending
        self._replicated_pcp_done_sending = set()
        self._reap_expired_send_leases(done)
        done |= self.pushed
        self.pushed = set()
        return done


class NixlLike:
    """The hooks NixlConnector has, with a worker that reports notified and
    expired sends in one set, as NIXL's does."""

    def __init__(self, worker=None):
        self.connector_worker = worker
        self.results = Results()
        self.log = []

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        # NIXL clears the flag here.
        request.kv_transfer_params["do_remote_prefill"] = False

    def update_connector_output(self, connector_output):
        self.log.append("output")

    def request_finished(self, request, block_ids):
        return True, {"remote_request_id": request.request_id}

    def request_finished_all_groups(self, request, block_ids):
        return True, {"remote_request_id": request.request_id}

    def get_transfer_results(self, finished_req_ids):
        r, self.results = self.results, Results()
        if self.connector_worker:
            r.finished_sending |= self.connector_worker.get_transfer_results()
        return r


def test_a_nixl_like_connector_records_through_its_instance_hooks(region_env, monkeypatch):
    pair = Pair(monkeypatch, region_env, region_env)
    p_sched, p_worker = NixlLike(), NixlLike(NixlLikeWorker())
    d_sched, d_worker = NixlLike(), NixlLike(NixlLikeWorker())
    assert connector.wrap_instance(p_sched, "SCHEDULER", pair.p_engine)
    assert connector.wrap_instance(p_worker, "WORKER", pair.p_engine)
    assert connector.wrap_instance(d_sched, "SCHEDULER", pair.d_engine)
    assert connector.wrap_instance(d_worker, "WORKER", pair.d_engine)
    # The instances' hooks, never the class's.
    assert "request_finished" in vars(p_sched)
    assert vars(NixlLike)["request_finished"].__qualname__ == "NixlLike.request_finished"

    ok = pair.p_api.begin("p-1", prefill_params(), TRACE)
    aborted = pair.p_api.begin("p-2", prefill_params(), TRACE)
    for rid in ("p-1", "p-2"):
        p_sched.request_finished_all_groups(request(rid, **prefill_params()), ([1],))
    assert pair.d_api.begin("d-1", decode_params("p-1"), TRACE) is None
    d_req = request("d-1", **decode_params("p-1"))
    d_sched.update_state_after_alloc(d_req, None, 64)
    # The decode worker's read is done (its own results say so, which is
    # not yet the request's accept: with TP > 1 every rank must be done) and
    # it notified the prefill worker; the lease of p-2 expired.
    d_worker.results = Results(recving={"d-1"})
    d_worker.get_transfer_results(set())
    assert ms(segment(pair.p_api.owner.region.snapshot(ok)), ACCEPT) is None
    # The decode scheduler sees every rank done: accepted.
    d_sched.update_connector_output(SimpleNamespace(finished_recving={"d-1"}, failed_recving=set()))
    assert ms(segment(pair.p_api.owner.region.snapshot(ok)), ACCEPT) is not None
    p_worker.connector_worker.notifs = {"p-1"}
    p_worker.connector_worker.expired = {"p-2"}
    p_worker.get_transfer_results(set())
    region = pair.p_api.owner.region
    assert not region.is_open(aborted)
    assert region.is_open(ok)
    pair.d_engine.first_output(step(("d-1", [5])))
    assert not region.is_open(ok)
    finals = {str(c["token"]): segment(c["snapshot"]) for c in closed(region)}
    full, cut = finals[str(ok)], finals[str(aborted)]
    assert all(ms(full, e) is not None for e in (EMIT, SEND, ACCEPT, OUTPUT))
    assert ms(cut, EMIT) is not None and all(ms(cut, e) is None for e in (SEND, ACCEPT, OUTPUT))


def test_a_push_whose_write_completed_is_send_complete_not_an_expired_lease(region_env, monkeypatch):
    # From 0.33 the push worker's _get_new_notifs reports nothing: the
    # prefill side learns of a finished push from its WRITE handles and adds
    # it to finished_sending. Only what the lease reaper adds has expired;
    # what a replicated prefill-context-parallel rank reports is no send.
    pair = Pair(monkeypatch, region_env, region_env)
    p_worker = NixlLike(NixlLikeWorker())
    assert connector.wrap_instance(p_worker, "WORKER", pair.p_engine)
    pushed, expired, replicated = pair.prefill("p-20"), pair.prefill("p-21"), pair.prefill("p-22")
    assert pair.d_api.begin("d-20", decode_params("p-20"), TRACE) is None
    pair.d_engine.pd_of(request("d-20", **decode_params("p-20")))
    w = p_worker.connector_worker
    w.pushed, w.expired, w._replicated_pcp_done_sending = {"p-20"}, {"p-21"}, {"p-22"}
    p_worker.get_transfer_results(set())
    region = pair.p_api.owner.region
    assert ms(segment(region.snapshot(pushed)), SEND) is not None
    assert region.is_open(pushed), "joined: it waits for the decode side's first output"
    assert not region.is_open(expired)
    assert region.is_open(replicated)
    assert ms(segment(region.snapshot(replicated)), SEND) is None
    pair.d_engine.first_output(step(("d-20", [3])))
    assert not region.is_open(pushed)
    finals = {str(c["token"]): segment(c["snapshot"]) for c in closed(region)}
    assert all(ms(finals[str(pushed)], e) is not None for e in (EMIT, SEND, OUTPUT))
    assert ms(finals[str(expired)], EMIT) is not None and ms(finals[str(expired)], SEND) is None


def test_a_worker_without_the_reaper_records_no_send_and_says_so_once(region_env, monkeypatch, caplog):
    # Without the reaper nothing tells a completed push from an expired
    # lease: the send side is not recorded (the bound closes the requests);
    # the accept side is the scheduler's.
    class OldWorker(NixlLikeWorker):
        _reap_expired_send_leases = None

        def get_transfer_results(self):
            return self._get_new_notifs()

    pair = Pair(monkeypatch, region_env, region_env)
    a, b = NixlLike(OldWorker()), NixlLike(OldWorker())
    with caplog.at_level(logging.WARNING, logger="edgemark"):
        assert connector.wrap_instance(a, "WORKER", pair.p_engine)
        assert connector.wrap_instance(b, "WORKER", pair.p_engine)
    said = [r for r in caplog.records if "edge_first_send_complete is not recorded" in r.getMessage()]
    assert len(said) == 1 and "_reap_expired_send_leases" in said[0].getMessage()
    token = pair.prefill("p-30")
    a.connector_worker.notifs = {"p-30"}
    a.get_transfer_results(set())
    assert ms(segment(pair.p_api.owner.region.snapshot(token)), SEND) is None
    assert pair.p_api.owner.region.is_open(token)


def test_an_optional_hook_that_changed_is_skipped_not_the_connector(region_env):
    class Changed(NixlLike):
        def on_new_request(self, req, extra):
            pass

    class Current(NixlLike):
        def on_new_request(self, request):
            pass

    rec = Recording()
    changed, current = Changed(), Current()
    assert connector.wrap_instance(changed, "SCHEDULER", rec)
    assert "on_new_request" not in vars(changed) and "update_state_after_alloc" in vars(changed)
    assert connector.wrap_instance(current, "SCHEDULER", rec)
    assert "on_new_request" in vars(current)


def test_a_refused_part_leaves_its_hooks_alone_and_the_others_record(region_env, monkeypatch):
    pair = Pair(monkeypatch, region_env, region_env)
    pair.d_engine.broken = {"accept": "KVConnectorOutput.finished_recving is missing"}
    pair.p_engine.broken = {"send": "NixlBaseConnectorWorker._reap_expired_send_leases is missing"}
    d_sched, p_worker = NixlLike(), NixlLike(NixlLikeWorker())
    assert connector.wrap_instance(d_sched, "SCHEDULER", pair.d_engine)
    assert connector.wrap_instance(p_worker, "WORKER", pair.p_engine)
    assert "update_connector_output" not in vars(d_sched)
    assert "update_state_after_alloc" in vars(d_sched)
    assert "_get_new_notifs" not in vars(p_worker.connector_worker)


def test_a_failed_receive_is_no_accept(region_env, monkeypatch):
    pair = Pair(monkeypatch, region_env, region_env)
    d_sched = NixlLike()
    connector.wrap_instance(d_sched, "SCHEDULER", pair.d_engine)
    token = pair.prefill("p-9")
    pair.decode_arrives("d-9", "p-9")
    d_sched.update_connector_output(SimpleNamespace(finished_recving={"d-9"}, failed_recving={"d-9"}))
    seg = segment(pair.p_api.owner.region.snapshot(token))
    assert ms(seg, ACCEPT) is None
    # Still watched for its first token: vLLM may recompute it locally.
    assert set(pair.d_engine.awaiting_output) == {"d-9"}


def test_a_decode_with_nothing_to_load_records_its_first_output(region_env, monkeypatch):
    # No successful KV load is ever reported (a local prefix hit, prompt
    # logprobs, a recompute): the first token is recorded all the same.
    pair = Pair(monkeypatch, region_env, region_env)
    token = pair.prefill("p-10")
    pair.decode_arrives("d-10", "p-10")
    pair.d_engine.first_output(step(("d-10", [])))
    assert "d-10" in pair.d_engine.awaiting_output, "an empty step is no first output"
    pair.d_engine.first_output(step(("d-10", [4])))
    seg = segment(pair.p_api.owner.region.snapshot(token))
    assert ms(seg, OUTPUT) is not None and ms(seg, ACCEPT) is None
    assert pair.d_engine.awaiting_output == {}


def test_the_decode_engine_follows_its_api_server_after_the_lease_expired(region_env, monkeypatch):
    # The prefill side's entry outlives its request until its owner sweeps:
    # the decode engine must record into the request its API server began,
    # not into the closed one.
    pair = Pair(monkeypatch, region_env, region_env)
    p_token = pair.prefill("p-11")
    pair.p_engine.expired("p-11")
    assert pair.p_api.read_lookup("p-11") == p_token, "the entry is still there"
    d_token = pair.decode_arrives("d-11", "p-11")
    assert d_token is not None
    pd = pair.d_engine.requests["d-11"]
    assert pd.token == d_token and not pd.shared
    pair.d_engine.accepted("d-11")
    pair.d_engine.first_output(step(("d-11", [2])))
    pair.d_engine.handed_over(request("d-11", **decode_params("p-11")), False, None)
    region = pair.d_api.owner.region
    assert not region.is_open(d_token)
    finals = {str(c["token"]): segment(c["snapshot"]) if c["snapshot"] else {} for c in closed(region)}
    own = finals[str(d_token)]
    assert ms(own, ACCEPT) is not None and ms(own, OUTPUT) is not None


def test_a_request_whose_lookup_entry_cannot_be_written_is_closed(region_env, monkeypatch, caplog):
    pair = Pair(monkeypatch, region_env, region_env)
    owner = pair.p_api.owner

    def fail(request_id, token):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(owner.writer, "publish", fail)
    with caplog.at_level(logging.WARNING, logger="edgemark.vllm"):
        for i in range(3):
            assert pair.p_api.begin(f"p-full-{i}", prefill_params(), TRACE) is None
    assert owner.tokens == {}
    assert owner.region.open_requests() == [], "no slot is left held"
    assert sum("takes no entry" in r.getMessage() for r in caplog.records) == 1


def test_the_engine_never_waits_for_a_region_file_it_cannot_use(tmp_path, monkeypatch, caplog):
    path = tmp_path / "pd.region"
    path.write_bytes(b"not a region" * 100)
    monkeypatch.setenv(em_vllm.ENV_REGION, str(path))
    monkeypatch.delenv("_EDGEMARK_VLLM_NAMED", raising=False)
    rec = Recording()
    import time as time_module

    from edgemark import _lifecycle

    def no_sleep(_s):
        raise AssertionError("a vLLM thread slept")

    monkeypatch.setattr(time_module, "sleep", no_sleep)
    with caplog.at_level(logging.WARNING, logger="edgemark.vllm"):
        assert rec.region() is None
        first_retry = rec._next_attach
        assert rec.region() is None, "retried only after its pause"
        assert rec._next_attach == first_retry
        rec._next_attach = 0.0
        assert rec.region() is None
        assert rec._attach_pause > _lifecycle.RETRY_ATTACH_S / 2, "the pause grows"
    assert sum("not a region this process can record into" in r.getMessage() for r in caplog.records) == 1


def test_api_servers_of_one_launcher_share_the_region_it_named(tmp_path, monkeypatch):
    # `vllm serve --api-server-count 2`: the launcher names the region when it
    # loads its plugins; each API server it starts inherits the name.
    from edgemark import _lifecycle

    monkeypatch.setattr(_lifecycle, "default_dir", lambda: str(tmp_path))
    monkeypatch.delenv(em_vllm.ENV_REGION, raising=False)
    monkeypatch.delenv("_EDGEMARK_VLLM_NAMED", raising=False)
    launcher = Recording()
    assert not launcher.user_named and os.path.dirname(launcher.path) == str(tmp_path)
    first, second = Recording(), Recording()
    assert first.path == second.path == launcher.path
    assert first.start(None) is not None
    assert second.start(None) is not None, "the second API server attaches"
    t = second.begin("p-1", prefill_params(), TRACE)
    assert first.owner.region.is_open(t)


def test_a_connector_without_the_hooks_is_left_alone_with_one_warning(region_env, caplog):
    rec = Recording()

    class OtherNixl:
        def get_finished(self, finished_req_ids):
            return set(), set()

    with caplog.at_level(logging.WARNING, logger="edgemark.vllm"):
        assert not connector.wrap_instance(OtherNixl(), "SCHEDULER", rec)
        assert not connector.wrap_instance(OtherNixl(), "SCHEDULER", rec)
    assert vars(OtherNixl()) == {}
    lines = [r.getMessage() for r in caplog.records if "not one edgemark follows" in r.getMessage()]
    assert len(lines) == 1 and "OtherNixl" in lines[0] and "update_state_after_alloc" in lines[0]


def test_a_hook_with_other_parameters_is_not_wrapped(region_env):
    class Changed(NixlLike):
        def update_connector_output(self, output, extra):
            pass

    hooks, why = connector.check_hooks(Changed(), "SCHEDULER")
    assert hooks == {} and "update_connector_output" in why


def test_a_connector_made_of_others_is_left_alone_with_one_warning(region_env, caplog):
    # vLLM's MultiConnector makes its children itself (not through the
    # factory) and aggregates their answers: neither it nor its children
    # are wrapped.
    rec = Recording()
    made = []

    class Multi(NixlLike):
        def __init__(self):
            super().__init__()
            self._children = [NixlLike(), NixlLike()]

        @property
        def sub_connectors(self):
            return self._children

        def request_finished(self, request, blocks):
            return True, {}

    class Factory:
        @classmethod
        def create_connector(cls, config, role, kv_cache_config):
            made.append(Multi() if config == "multi" else NixlLike())
            return made[-1]

    raw = Factory.__dict__["create_connector"].__func__
    Factory.create_connector = classmethod(connector.wrap_create_connector(raw, rec))
    with caplog.at_level(logging.WARNING, logger="edgemark.vllm"):
        for role in ("SCHEDULER", "WORKER"):
            parent = Factory.create_connector("multi", SimpleNamespace(name=role), None)
            assert vars(parent).keys() == {"connector_worker", "results", "log", "_children"}
            assert all("update_connector_output" not in vars(c) for c in parent.sub_connectors)
    lines = [r.getMessage() for r in caplog.records if "not one edgemark follows" in r.getMessage()]
    assert len(lines) == 2 and all("made of other connectors" in line for line in lines)
    single = Factory.create_connector("one", SimpleNamespace(name="SCHEDULER"), None)
    assert "update_connector_output" in vars(single)


def test_classmethods_and_staticmethods_are_patched_as_what_they_are(monkeypatch):
    mod = types.ModuleType("edgemark_test_descriptors")

    class Thing:
        @classmethod
        def make(cls, x):
            return ("made", cls.__name__, x)

        @staticmethod
        def name(x):
            return ("name", x)

    mod.Thing = Thing
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    seen = []

    def spy(func, rec):
        def wrapper(*args):
            seen.append(args[-1])
            return func(*args)

        return wrapper

    inst = _instrument.Instrumentor(
        instruments=("edgemark >= 0",),
        targets={
            "all": (
                _instrument.Target(mod.__name__, "Thing", "make", ("cls", "x"), spy),
                _instrument.Target(mod.__name__, "Thing", "name", ("x",), spy),
            )
        },
        make_recording=lambda uninstrument: None,
        log=logging.getLogger("edgemark.test"),
    )
    monkeypatch.setattr(_instrument, "installed_version", lambda d: "1.0")
    assert inst.instrument()
    assert isinstance(Thing.__dict__["make"], classmethod) and isinstance(Thing.__dict__["name"], staticmethod)
    assert Thing.make(1) == ("made", "Thing", 1) and Thing().name(2) == ("name", 2)
    assert seen == [1, 2]
    inst.uninstrument()
    assert Thing.make(3) == ("made", "Thing", 3) and seen == [1, 2]


def test_the_logger_is_the_packages():
    assert _recording.log is logging.getLogger("edgemark.vllm")


def test_edgemark_is_imported_once(region_env):
    # The shared machinery lives beside both integrations.
    from edgemark import _lifecycle
    from edgemark.vllm_omni import _recording as omni

    assert omni.Owner is _lifecycle.Owner is _recording.Owner
    assert omni.Recording.__mro__[1] is _lifecycle.Recording is _recording.Recording.__mro__[1]
    assert edgemark.vllm is em_vllm
