"""Every request the vLLM P/D plugin begins has a closer on its host, or is
not begun: the API server closes what it saw finish once nothing more can
come (``Recording.finished``, ``decide_close``), a process says which parts
of its instance it records (``_presence``: an OFD lock on the region file,
dropped by the kernel when it dies), and an API server whose instance has no
scheduler side on the host begins nothing and says so.

The processes are real: each test's API server, engine core and send side
are processes of their own (``PROC`` below, driven over a pipe), each with
the plugin's own recording state, on a real region file; only vLLM's calls
into the plugin are made by the test, in the order vLLM makes them."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

import edgemark
from edgemark import _channel, _presence, _said
from edgemark.vllm import _recording as pd

#: A bound on each wait, never a timing that is asserted.
PATIENCE_S = 60.0

#: One process of a P/D instance: its recording state (``pd.Recording``)
#: driven by one JSON command per line, one JSON answer per line. The API
#: server's periodic thread runs as in a server; the intervals it works at
#: (``TICK_S``, ``SETTLE_S``) may be scaled, as the tests scale the bound.
PROC = r"""
import json, sys, types
from edgemark import _lifecycle
from edgemark.vllm import _recording as pd

scale = json.loads(sys.argv[1])
_lifecycle.TICK_S = scale.get("tick", _lifecycle.TICK_S)
pd.SETTLE_S = scale.get("settle", pd.SETTLE_S)
rec = pd.Recording()

def request(rid, side, remote=None):
    if side == "prefill":
        params = {"do_remote_decode": True, "do_remote_prefill": False}
    else:
        params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_request_id": remote or rid}
    return types.SimpleNamespace(request_id=rid, kv_transfer_params=params)

def step(rid):
    return types.SimpleNamespace(req_ids=[rid], sampled_token_ids=[[7]])

print(json.dumps({"pid": __import__("os").getpid(), "path": rec.path, "instance": rec.instance}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    op, out = cmd["op"], None
    if op == "start":
        out = rec.start(None) is not None
    elif op == "announce":
        rec.announce(cmd["part"])
        out = sorted(rec.presence.announced())
    elif op == "begin":
        token = rec.begin(cmd["rid"], request(cmd["rid"], cmd["side"]).kv_transfer_params, cmd.get("tp"))
        out = None if token is None else str(token)
    elif op == "finished":
        rec.finished(cmd["rid"])
    elif op == "aborted":
        rec.aborted(cmd["rids"])
    elif op == "alloc":
        # The scheduler allocates the request's blocks (every request passes
        # update_state_after_alloc).
        pd_ = rec.pd_of(request(cmd["rid"], cmd["side"]))
        out = None if pd_ is None or pd_.token is None else str(pd_.token)
    elif op == "emit":
        rec.handed_over(request(cmd["rid"], "prefill"), True, {"remote_request_id": cmd["rid"]})
    elif op == "sent":
        rec.sent(cmd["rid"])
    elif op == "decode":
        # A decode request's life in its engine core: registered, its KV
        # loaded, its first token, finished.
        r = request(cmd["rid"], "decode", cmd.get("remote"))
        rec.pd_of(r)
        rec.accepted(cmd["rid"])
        rec.first_output(step(cmd["rid"]))
        rec.handed_over(r, False, None)
    elif op == "state":
        out = {"begins_own": rec.begins_own, "owner": rec.owner is not None}
    elif op == "open":
        out = len(rec.owner.tokens) if rec.owner is not None else None
    elif op == "exit":
        break
    print(json.dumps({"ok": out}), flush=True)
"""


class Proc:
    """One process of an instance, with the plugin's variables in ``env``
    (the instance's name among them, as a server start hands it on)."""

    def __init__(self, env: dict, scale: dict | None = None) -> None:
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("EDGEMARK_", "_EDGEMARK_"))}
        environ.update(env)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PROC, json.dumps(scale or {})],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environ,
            text=True,
        )
        line = self.proc.stdout.readline()
        assert line, f"the process said nothing: {self.proc.stderr.read()}"
        self.said = json.loads(line)

    def __call__(self, op: str, **kw):
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the process died: {self.proc.stderr.read()}"
        return json.loads(line)["ok"]

    def exit(self) -> int:
        """A normal exit (its exit handlers run); its status."""
        self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
        self.proc.stdin.flush()
        return self.proc.wait(timeout=PATIENCE_S)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=PATIENCE_S)

    def log(self) -> str:
        """What it logged (after it ended)."""
        return self.proc.stderr.read()


@pytest.fixture
def procs():
    started = []

    def start(*args, **kwargs):
        p = Proc(*args, **kwargs)
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()


def instance_env(tmp_path, name: str = "a", **extra) -> dict:
    env = {
        "EDGEMARK_VLLM_REGION": str(tmp_path / "pd.region"),
        "_EDGEMARK_VLLM_INSTANCE": name.encode().hex().ljust(16, "0")[:16],
    }
    env.update({k: str(v) for k, v in extra.items()})
    return env


def trace(i: int) -> str:
    return f"00-{i + 1:032x}-{i + 1:016x}-01"


def wait_for(what, timeout: float = PATIENCE_S, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(every)
    raise AssertionError("not within the patience bound")


def closed_by_trace(region) -> dict:
    return {e["trace_id"]: e["snapshot"] for e in region.drain_closed(4096)}


def events(snapshot: dict) -> set:
    seg = snapshot.get("0->1:0", {})
    return {e for e in edgemark.EVENT_NAMES if seg.get(e + "_ms") is not None}


EMIT, SEND = edgemark.EVENT_NAMES[pd.EMIT], edgemark.EVENT_NAMES[pd.SEND]
ACCEPT, OUTPUT = edgemark.EVENT_NAMES[pd.ACCEPT], edgemark.EVENT_NAMES[pd.OUTPUT]


# -- presence -------------------------------------------------------------------


def test_a_part_is_present_while_its_process_lives_and_gone_when_it_is_killed(tmp_path, procs):
    env = instance_env(tmp_path)
    api = procs(env)
    assert api("start")
    checker = _presence.Checker(env["EDGEMARK_VLLM_REGION"])
    name = api.said["instance"]
    assert checker.present(pd.SENDER_PART, name) is False
    sender = procs(env)
    assert sender("announce", part=pd.SENDER_PART) == [pd.SENDER_PART]
    assert checker.present(pd.SENDER_PART, name) is True
    assert checker.present(pd.SCHEDULER_PART, name) is False, "only the part announced"
    assert checker.present(pd.SENDER_PART, "b" * 16) is False, "only for its own instance"
    sender.kill()
    assert checker.present(pd.SENDER_PART, name) is False, "the kernel dropped it with its process"


def test_a_part_announced_before_the_region_exists_is_held_once_it_does_and_in_a_file_made_again(tmp_path, procs):
    # vLLM's engine cores and workers come up before the API server makes
    # the region: they announce into a file that does not exist yet.
    env = instance_env(tmp_path)
    engine = procs(env)
    assert engine("announce", part=pd.SCHEDULER_PART) == []
    path = env["EDGEMARK_VLLM_REGION"]
    checker = _presence.Checker(path)
    assert checker.present(pd.SCHEDULER_PART, engine.said["instance"]) is None, "no file: cannot be told"
    edgemark.Region.create(path, edges=[(0, 1)], slots=8)
    wait_for(lambda: checker.present(pd.SCHEDULER_PART, engine.said["instance"]))
    # Removed and made again (a server's restart at a named path): the new
    # file holds no lock until the process announces into it.
    os.unlink(path)
    edgemark.Region.create(path, edges=[(0, 1)], slots=8)
    wait_for(lambda: checker.present(pd.SCHEDULER_PART, engine.said["instance"]))


def test_the_lock_is_not_a_pid_nor_a_file(tmp_path, procs):
    env = instance_env(tmp_path)
    api = procs(env)
    assert api("start")
    before = sorted(os.listdir(tmp_path))
    sender = procs(env)
    sender("announce", part=pd.SENDER_PART)
    assert sorted(os.listdir(tmp_path)) == before, "nothing written beside the region"
    assert os.path.getsize(env["EDGEMARK_VLLM_REGION"]) < _presence.BASE


# -- who begins -----------------------------------------------------------------


def test_no_scheduler_side_of_the_instance_on_the_host_begins_nothing_and_says_so(tmp_path, monkeypatch, caplog):
    # Multi-node data parallel with every engine on another node, or an
    # engine core whose connector is not followed: nobody here could record
    # or close its requests.
    for k, v in instance_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    api = pd.Recording()
    api.PRESENCE_GRACE_S = 0.0
    # Said again after half a second while it lasts (a server: SAY_AGAIN_S).
    api.said = _said.Said(api.log, every=0.5)
    owner = api.start(None)
    with caplog.at_level(logging.WARNING, logger="edgemark.vllm"):
        assert api.begin("p-1", {"do_remote_decode": True}, trace(1)) is None
        assert api.begin("p-2", {"do_remote_decode": True}, trace(2)) is None
    lines = [r.getMessage() for r in caplog.records if "not begun here" in r.getMessage()]
    assert len(lines) == 1 and api.path in lines[0], "said at WARNING, once per SAY_AGAIN_S"
    assert owner.region.open_requests() == [] and owner.tokens == {}
    time.sleep(0.6)
    with caplog.at_level(logging.WARNING, logger="edgemark.vllm"):
        assert api.begin("p-3", {"do_remote_decode": True}, trace(3)) is None
    assert "1 more times" in [r.getMessage() for r in caplog.records if "not begun here" in r.getMessage()][-1]
    # An engine core of another instance on the host is not this one's.
    other = _presence.Presence(api.path, "c" * 16)
    other.announce(pd.SCHEDULER_PART)
    assert api.begin("p-4", {"do_remote_decode": True}, trace(4)) is None
    # Its own engine core comes: requests are begun again.
    mine = _presence.Presence(api.path, api.instance)
    mine.announce(pd.SCHEDULER_PART)
    assert api.begin("p-5", {"do_remote_decode": True}, trace(5)) is not None


def test_requests_are_begun_while_the_instance_s_parts_may_still_be_announcing(tmp_path, monkeypatch):
    for k, v in instance_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    api = pd.Recording()
    api.start(None)
    assert api.begin("p-1", {"do_remote_decode": True}, trace(1)) is not None, "within the grace"


def test_no_lookup_to_publish_in_begins_nothing_and_says_so(tmp_path, monkeypatch, caplog):
    for k, v in instance_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    api = pd.Recording()
    owner = api.start(None)
    owner.writer = None
    with caplog.at_level(logging.WARNING, logger="edgemark.vllm"):
        assert api.begin("p-1", {"do_remote_decode": True}, trace(1)) is None
    assert any("cannot be written" in r.getMessage() and "not begun" in r.getMessage() for r in caplog.records)
    assert owner.region.open_requests() == []


# -- who closes -----------------------------------------------------------------


@pytest.fixture
def instance(tmp_path, procs):
    """An API server and an engine core of one instance (no send side
    unless a test starts one), the periodic thread at 0.2 s, the settle
    time 0.2 s."""
    env = instance_env(tmp_path)
    scale = {"tick": 0.2, "settle": 0.2}
    api = procs(env, scale)
    assert api("start")
    engine = procs(env)
    engine("announce", part=pd.SCHEDULER_PART)
    region = edgemark.Region.attach(env["EDGEMARK_VLLM_REGION"])
    return env, api, engine, region


def test_a_prefill_handed_to_another_host_with_no_send_side_here_closes_after_it_finished(instance):
    env, api, engine, region = instance
    assert api("begin", rid="p-1", side="prefill", tp=trace(1))
    engine("emit", rid="p-1")
    api("finished", rid="p-1")
    wait_for(lambda: region.open_requests() == [])
    (snap,) = closed_by_trace(region).values()
    assert events(snap) == {EMIT}
    assert region.counters()["expired_requests"] == 0, "closed by its API server, not by the bound"
    assert api("open") == 0


def test_a_prefill_never_handed_over_here_closes_after_it_finished(instance):
    # Prefilled by an engine on another node (data parallel across nodes):
    # nothing here recorded its emit.
    env, api, engine, region = instance
    assert api("begin", rid="p-1", side="prefill", tp=trace(1))
    api("finished", rid="p-1")
    wait_for(lambda: region.open_requests() == [])
    assert region.counters()["expired_requests"] == 0


def test_a_prefill_waits_for_its_send_side_while_it_lives_and_closes_when_it_dies(instance, procs):
    env, api, engine, region = instance
    sender = procs(env)
    sender("announce", part=pd.SENDER_PART)
    for i in (1, 2):
        assert api("begin", rid=f"p-{i}", side="prefill", tp=trace(i))
        engine("emit", rid=f"p-{i}")
        api("finished", rid=f"p-{i}")
    # The send side records send complete for one and closes it.
    sender("sent", rid="p-1")
    wait_for(lambda: len(region.open_requests()) == 1)
    # The other waits for its decode side while the send side lives (well
    # past the settle time, a few of the API server's ticks).
    time.sleep(1.0)
    assert len(region.open_requests()) == 1
    sender.kill()
    wait_for(lambda: region.open_requests() == [])
    got = closed_by_trace(region)
    assert events(got[trace(1).split("-")[1]]) == {EMIT, SEND}
    assert events(got[trace(2).split("-")[1]]) == {EMIT}
    assert region.counters()["expired_requests"] == 0


@pytest.mark.parametrize("emitted_here", [True, False], ids=["prefilled-here", "prefilled-on-another-node"])
def test_a_joined_decode_side_keeps_it_open_until_its_first_output_when_no_send_side_records(instance, emitted_here):
    # Prefilled by this host's engine core with no send side recording here,
    # or by an engine on another node (data parallel across nodes: no emit
    # here); either way the decode instance on this host joins it as its
    # request arrives.
    env, api, engine, region = instance
    assert api("begin", rid="p-1", side="prefill", tp=trace(1))
    if emitted_here:
        engine("emit", rid="p-1")
    api("finished", rid="p-1")
    reader = _channel.Reader(_channel.lookup_dir(env["EDGEMARK_VLLM_REGION"]))
    reader.open()
    assert reader.join("p-1")
    time.sleep(1.0)
    assert len(region.open_requests()) == 1, "the joined side still records"
    # Its engine core records accept and first output; the decode side waits
    # for a send complete that no process here can record: the API server
    # closes it.
    token = reader.read("p-1")
    region.record(token, 0, 1, edgemark.Event.CONSUMER_FIRST_ACCEPT)
    region.record(token, 0, 1, edgemark.Event.CONSUMER_FIRST_NONEMPTY_OUTPUT)
    wait_for(lambda: region.open_requests() == [])
    (snap,) = closed_by_trace(region).values()
    assert events(snap) == ({EMIT} if emitted_here else set()) | {ACCEPT, OUTPUT}
    assert region.counters()["expired_requests"] == 0


def test_a_decode_request_of_its_own_and_an_aborted_request_close_when_they_end(instance):
    env, api, engine, region = instance
    assert api("begin", rid="d-1", side="decode", tp=trace(1))
    api("finished", rid="d-1")
    assert api("begin", rid="p-2", side="prefill", tp=trace(2))
    api("aborted", rids=["p-2", "never-begun"])
    wait_for(lambda: region.open_requests() == [])
    assert len(closed_by_trace(region)) == 2 and api("open") == 0


# -- the rate it holds ----------------------------------------------------------


def test_requests_with_no_closer_here_at_several_times_slots_per_bound_never_fill_the_region(tmp_path, procs):
    # The shape of a prefill instance whose send side records nothing (its
    # worker refused the send part, or runs where the plugin's variables do
    # not reach), beside local requests: decode requests of the same host's
    # instance, recorded and closed by its engine core. Before the API
    # server closed what it saw finish, the first kind held its slots until
    # the bound and the region refused everything after it filled.
    slots, bound = 64, 10.0
    env = instance_env(tmp_path, EDGEMARK_VLLM_SLOTS=slots, EDGEMARK_VLLM_MAX_OPEN_S=bound)
    api = procs(env, {"tick": 0.5, "settle": 0.5})
    assert api("start")
    engine = procs(env)
    engine("announce", part=pd.SCHEDULER_PART)
    region = edgemark.Region.attach(env["EDGEMARK_VLLM_REGION"])
    rate = 3 * slots / bound  # requests without a closer here, per second
    n_remote, n_local = int(rate * 2.5 * bound), int(rate * 0.5 * bound)
    start = time.monotonic()
    remote, local, most_open = [], [], 0
    for i in range(n_remote + n_local):
        # The pace is a load, never a measured figure: sent at `rate` (plus
        # the local ones), however the machine keeps up.
        pause = start + i / (rate * (n_remote + n_local) / n_remote) - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        if i % 6 == 5 and len(local) < n_local:
            rid = f"d-{i}"
            assert api("begin", rid=rid, side="decode", tp=trace(i)), "every local request is begun"
            engine("decode", rid=rid)
            api("finished", rid=rid)
            local.append(trace(i).split("-")[1])
        else:
            rid = f"p-{i}"
            assert api("begin", rid=rid, side="prefill", tp=trace(i)), "the region is never full"
            engine("emit", rid=rid)
            api("finished", rid=rid)
            remote.append(trace(i).split("-")[1])
        most_open = max(most_open, len(region.open_requests()))
    wait_for(lambda: region.open_requests() == [])
    counters = region.counters()
    assert counters["refused"]["region_full"] == 0
    assert counters["expired_requests"] == 0, "each closed where it ended, none by the bound"
    assert most_open < slots
    got = closed_by_trace(region)
    assert len(got) == len(remote) + len(local) and counters["closed_lost"] == 0
    assert all(events(got[t]) == {ACCEPT, OUTPUT} for t in local), "every local request recorded"
    assert all(events(got[t]) == {EMIT} for t in remote), "the others counted where they end"


# -- a host with no API server ---------------------------------------------------


def test_an_engine_core_with_no_api_server_on_its_host_begins_and_closes_its_own_requests(tmp_path, procs):
    # A headless data parallel node (`vllm serve --headless`): its engine
    # cores and workers load the plugin, the API server runs on another
    # node. Nothing made this host's region.
    env = instance_env(tmp_path)
    path = env["EDGEMARK_VLLM_REGION"]
    engine = procs(env, {"tick": 0.2, "settle": 0.2})
    engine("announce", part=pd.SCHEDULER_PART)
    sender = procs(env)
    sender("announce", part=pd.SENDER_PART)
    assert not os.path.exists(path)
    assert engine("alloc", rid="p-1", side="prefill"), "begun here, in a region it made"
    assert os.path.exists(path) and engine("state") == {"begins_own": True, "owner": True}
    region = edgemark.Region.attach(path)
    assert engine("alloc", rid="p-2", side="prefill")
    assert engine("alloc", rid="d-3", side="decode")
    engine("emit", rid="p-1")
    engine("emit", rid="p-2")
    # The worker finds the engine core's tokens in the lookup: send complete
    # for one; the other's decode side never reads it.
    sender("sent", rid="p-1")
    engine("decode", rid="d-3")
    wait_for(lambda: len(region.open_requests()) == 1)
    sender.kill()
    wait_for(lambda: region.open_requests() == [])
    got = sorted(sorted(events(snap)) for snap in closed_by_trace(region).values())
    assert got == sorted(sorted(e) for e in ({EMIT, SEND}, {EMIT}, {ACCEPT, OUTPUT})), got
    assert region.counters()["expired_requests"] == 0
    assert engine.exit() == 0
    said = [line for line in engine.log().splitlines() if "no API server of this instance" in line]
    assert len(said) == 1 and path in said[0]


def test_an_engine_core_beside_its_api_server_never_begins(tmp_path, procs):
    env = instance_env(tmp_path)
    api = procs(env)
    assert api("start")
    engine = procs(env)
    engine("announce", part=pd.SCHEDULER_PART)
    # A request the API server did not begin (refused, or full): nothing
    # here begins it instead.
    assert engine("alloc", rid="p-1", side="prefill") is None
    assert engine("state") == {"begins_own": False, "owner": False}
    # Another instance's API server on the host is not this one's.
    other = procs(instance_env(tmp_path, "b"))
    assert other("start")
    assert edgemark.Region.attach(env["EDGEMARK_VLLM_REGION"]).open_requests() == []
