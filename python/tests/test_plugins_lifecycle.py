"""The lifecycle both vLLM plugins share (``edgemark._lifecycle``), in the
shapes users deploy, with real processes: servers that are each PID 1 of
their own PID namespace over one ``/dev/shm`` (containers with
``--ipc=host``), a server SIGKILLed and started again (an OOM kill), several
API servers of one launcher, a peer that outlives the creator of a shared
region, a region file removed under a running server, requests nobody
closes, a full region, a finalizer run inside a locked section, a
connector the plugin cannot follow; and ``clean``.

No vLLM is needed: each process builds the plugin's ``Recording`` as the
API server's wrappers do. The PID-namespace tests need ``unshare`` with the
right to make namespaces (root, as in CI) and are skipped without it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

import edgemark
from edgemark import _channel, _clean, _lifecycle
from edgemark.vllm import _recording as pd
from edgemark.vllm_omni import _recording as omni

TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
#: A bound on each wait, never a timing that is asserted.
PATIENCE_S = 60.0
NOBODY = 65534


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=30
        ).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


#: Skipped where PID namespaces cannot be made, never in CI (``CI=true``,
#: as root): there a missing ``unshare`` fails the tests.
needs_unshare = pytest.mark.skipif(
    os.environ.get("CI") != "true" and not _can_unshare(), reason="no PID namespaces here (unshare needs root)"
)

#: An API server as the P/D plugin's wrappers drive it: makes its region
#: (named under argv[1] unless EDGEMARK_VLLM_REGION names it), begins a
#: prefill request, says what it did as one JSON line, and serves until
#: killed or told to exit on stdin.
SERVER = r"""
import json, os, sys
from edgemark import _lifecycle
_lifecycle.default_dir = lambda: sys.argv[1]
from edgemark.vllm._recording import Recording
rec = Recording()
owner = rec.start(None)
token = rec.begin("p-" + sys.argv[2], {"do_remote_decode": True}, None)
ns = open("/proc/self/status").read().split("NSpid:")[1].split("\n")[0].split()
print(json.dumps({"path": rec.path, "token": str(token) if token else None, "pid_inside": int(ns[-1])}), flush=True)
sys.stdin.readline()
"""


class Server:
    """One API server process, optionally PID 1 of a PID namespace of its
    own."""

    def __init__(self, directory, name: str, namespace: bool = False, env=None) -> None:
        cmd = [sys.executable, "-c", SERVER, str(directory), name]
        if namespace:
            cmd = ["unshare", "--pid", "--fork", "--mount-proc", "--", *cmd]
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("EDGEMARK_", "_EDGEMARK_"))}
        environ.update(env or {})
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=environ, text=True)
        line = self.proc.stdout.readline()
        assert line, f"the server said nothing (exit {self.proc.poll()})"
        self.said = json.loads(line)
        self.path = self.said["path"]

    def python_pid(self) -> int:
        """The server's pid as seen from here (under ``unshare --fork``, the
        child of the unshare process)."""
        if self.proc.args[0] != "unshare":
            return self.proc.pid
        deadline = time.monotonic() + PATIENCE_S
        while time.monotonic() < deadline:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                kids = f.read().split()
            if kids:
                return int(kids[0])
            time.sleep(0.05)
        raise AssertionError("unshare started no child")

    def kill(self) -> None:
        """SIGKILL, as the OOM killer sends it."""
        os.kill(self.python_pid(), signal.SIGKILL)
        self.proc.wait(timeout=PATIENCE_S)

    def exit(self) -> None:
        """A normal exit (its exit handlers run)."""
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        assert self.proc.wait(timeout=PATIENCE_S) == 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.kill()


@pytest.fixture
def servers():
    started = []

    def start(*args, **kwargs):
        s = Server(*args, **kwargs)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def open_count(path) -> int:
    return len(edgemark.Region.attach(str(path)).open_requests())


# -- names and liveness in containers -------------------------------------------


@needs_unshare
def test_two_servers_each_pid_1_over_one_dev_shm_both_record(tmp_path, servers):
    a = servers(tmp_path, "a", namespace=True)
    b = servers(tmp_path, "b", namespace=True)
    assert a.said["pid_inside"] == b.said["pid_inside"] == 1
    assert a.path != b.path, "each server start names its own region"
    for s in (a, b):
        assert os.path.basename(s.path).startswith("edgemark-vllm-1-")
        assert s.said["token"] is not None, "it records"
        assert open_count(s.path) == 1


@needs_unshare
def test_a_server_killed_and_started_again_records_and_clean_removes_only_the_stale_files(tmp_path, servers):
    live = servers(tmp_path, "live", namespace=True)
    killed = servers(tmp_path, "killed", namespace=True)
    stale, stale_lookup = killed.path, _channel.lookup_dir(killed.path)
    killed.kill()
    assert os.path.exists(stale) and os.path.isdir(stale_lookup), "SIGKILL leaves its files"
    again = servers(tmp_path, "again", namespace=True)
    assert again.said["pid_inside"] == 1 and again.path != stale
    assert again.said["token"] is not None, "the restarted server records"
    out = subprocess.run(
        [sys.executable, "-m", "edgemark.vllm", "clean", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert sorted(out.splitlines()) == sorted([f"removed {stale}", f"removed {stale_lookup}"])
    for s in (live, again):
        assert os.path.exists(s.path) and os.path.isdir(_channel.lookup_dir(s.path))
        assert open_count(s.path) == 1, "a live region is untouched"


def test_clean_never_removes_a_region_a_process_holds_and_the_same_command_serves_both_plugins(tmp_path, servers):
    live = servers(tmp_path, "live")
    dead = servers(tmp_path, "dead")
    dead.kill()
    omni_stale = tmp_path / "edgemark-vllm-omni-7-0123456789abcdef.region"
    edgemark.Region.create(str(omni_stale), edges=[(0, 1)], slots=4)
    for module in ("edgemark.vllm_omni", "edgemark.vllm"):
        subprocess.run([sys.executable, "-W", "error", "-m", module, "clean", "--dir", str(tmp_path)], check=True)
    assert sorted(os.listdir(tmp_path)) == sorted(
        [os.path.basename(live.path), os.path.basename(_channel.lookup_dir(live.path))]
    )


def test_clean_survives_any_name_and_says_each_removal(tmp_path):
    names = [
        "edgemark-vllm-omni-99999999999999999999.region",
        "edgemark-vllm-0-0123456789abcdef.region",
        "edgemark-vllm-omni-0.region",
        "edgemark-vllm-omni-5.requests",  # its region is gone
    ]
    for n in names:
        (tmp_path / n).write_text("x")
    # A name that is not text, and names that only look like the plugins'.
    odd = [os.fsdecode(b"edgemark-vllm-omni-\xff.region"), "edgemark-vllm-omni-12.region.bak", "edgemark-vllm-.region"]
    for n in odd:
        (tmp_path / n).write_text("x")
    out = subprocess.run(
        [sys.executable, "-m", "edgemark.vllm_omni", "clean", "--dir", str(tmp_path)], capture_output=True, check=True
    ).stdout.decode("utf-8", "surrogateescape")
    assert sorted(os.listdir(tmp_path)) == sorted(odd)
    assert sorted(line.split("/")[-1] for line in out.splitlines()) == sorted(names)


def test_clean_says_nothing_when_there_is_nothing_to_remove(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-m", "edgemark.vllm", "clean", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", proc.stderr


def test_clean_never_follows_a_symlink_nor_removes_another_users_file(tmp_path):
    if os.geteuid() != 0 and os.environ.get("CI") != "true":
        pytest.skip("chown to another user needs root")
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("x")
    (tmp_path / "edgemark-vllm-omni-0.requests").symlink_to(target)
    (tmp_path / "edgemark-vllm-3.region").symlink_to(target / "keep")
    theirs = tmp_path / "edgemark-vllm-omni-9.region"
    theirs.write_text("x")
    os.chown(theirs, NOBODY, NOBODY)
    _clean.clean(str(tmp_path))
    assert (target / "keep").exists()
    assert not os.path.lexists(tmp_path / "edgemark-vllm-omni-0.requests")
    assert not os.path.lexists(tmp_path / "edgemark-vllm-3.region")
    assert theirs.exists()


def test_clean_takes_named_regions_and_their_lookups(tmp_path, monkeypatch):
    named = tmp_path / "named" / "mine.region"
    named.parent.mkdir()
    edgemark.Region.create(str(named), edges=[(0, 1)], slots=4)
    (tmp_path / "named" / "mine.requests").mkdir()
    (tmp_path / "named" / "mine.requests" / "entry").write_text("x")
    held = tmp_path / "held.region"
    edgemark.Region.create(str(held), edges=[(0, 1)], slots=4)
    hold = _lifecycle.Hold(str(held))
    monkeypatch.setenv("EDGEMARK_VLLM_REGION", str(held))
    monkeypatch.setenv("EDGEMARK_VLLM_OMNI_REGION", str(named))
    out = subprocess.run(
        [sys.executable, "-m", "edgemark.vllm", "clean", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.splitlines() == [f"removed {tmp_path / 'named' / 'mine.requests'}", f"removed {named}"]
    assert held.exists(), "held by this process"
    assert _clean.clean(str(tmp_path), named=str(tmp_path / "absent.region")) == []
    hold.release(remove=False)
    assert _clean.clean(str(tmp_path), named=[str(held)]) == [str(held)]


# -- several API servers, shared regions -----------------------------------------


def test_every_api_server_of_one_launcher_records_into_the_region_it_named(tmp_path, monkeypatch, servers):
    # The launcher names the region as it loads the plugins; the API
    # servers it starts inherit the name and all record into it.
    monkeypatch.setattr(_lifecycle, "default_dir", lambda: str(tmp_path))
    for var in ("EDGEMARK_VLLM_REGION", "_EDGEMARK_VLLM_NAMED"):
        monkeypatch.delenv(var, raising=False)
    launcher = pd.Recording()
    inherited = {"EDGEMARK_VLLM_REGION": launcher.path, "_EDGEMARK_VLLM_NAMED": launcher.path}
    api = [servers(tmp_path, f"api{i}", env=inherited) for i in range(3)]
    assert {s.path for s in api} == {launcher.path}
    assert all(s.said["token"] is not None for s in api)
    assert open_count(launcher.path) == 3
    # The last one out removes the region the plugin named, not before.
    for s in api[:-1]:
        s.exit()
        assert os.path.exists(launcher.path)
    api[-1].exit()
    assert not os.path.exists(launcher.path) and not os.path.exists(_channel.lookup_dir(launcher.path))


def test_a_shared_user_named_region_outlives_its_creator_while_a_peer_holds_it(tmp_path, servers):
    path = str(tmp_path / "pd.region")
    env = {"EDGEMARK_VLLM_REGION": path}
    creator = servers(tmp_path, "prefill", env=env)
    peer = servers(tmp_path, "decode", env=env)
    creator.exit()
    assert os.path.exists(path), "the peer still records into it"
    assert open_count(path) == 2
    restarted = servers(tmp_path, "prefill-again", env=env)
    assert restarted.path == path and restarted.said["token"] is not None
    assert open_count(path) == 3, "the restarted server records into the same region as its peer"
    peer.exit()
    assert os.path.exists(path)
    restarted.exit()
    # Made by a server, named by the user: the last server out removes it,
    # though it only attached it.
    assert not os.path.exists(path) and not os.path.exists(_channel.lookup_dir(path))


def test_a_region_made_beforehand_is_never_removed_by_a_server(tmp_path, servers):
    path = tmp_path / "made.region"
    edgemark.Region.create(str(path), edges=[(0, 1)], slots=16)
    s = servers(tmp_path, "p", env={"EDGEMARK_VLLM_REGION": str(path)})
    assert s.said["token"] is not None
    s.exit()
    assert path.exists()


def test_a_region_removed_under_a_running_server_is_noticed_and_made_again(tmp_path, monkeypatch, caplog):
    path = str(tmp_path / "gone.region")
    monkeypatch.setenv("EDGEMARK_VLLM_REGION", path)
    api, engine = pd.Recording(), pd.Recording()
    owner = api.start(None)
    assert engine.region() is not None
    old_id = owner.region.info()["region_id"]
    os.unlink(path)
    with caplog.at_level(logging.WARNING, logger="edgemark.vllm"):
        api.tick()
    assert any("removed or replaced under this server" in r.getMessage() for r in caplog.records)
    assert api.owner is not owner and os.path.exists(path)
    assert api.owner.region.info()["region_id"] != old_id
    token = api.begin("p-1", {"do_remote_decode": True}, TRACE)
    assert token is not None
    # The engine process notices too (within CHECK_S) and attaches the new one.
    engine._next_check = 0.0
    with caplog.at_level(logging.WARNING, logger="edgemark.vllm"):
        region = engine.region()
    assert region is not None and region.info()["region_id"] == api.owner.region.info()["region_id"]
    assert any("removed or replaced under this process" in r.getMessage() for r in caplog.records)


# -- nothing leaks --------------------------------------------------------------


def test_requests_nobody_closes_are_closed_within_the_bound_and_counted(tmp_path, monkeypatch):
    # Prefill requests whose decode side never comes, or went to an engine
    # on another node: only the bound closes them.
    monkeypatch.setenv("EDGEMARK_VLLM_REGION", str(tmp_path / "r.region"))
    monkeypatch.setenv("EDGEMARK_VLLM_MAX_OPEN_S", "1")
    monkeypatch.setenv("EDGEMARK_VLLM_SLOTS", "4")
    api, engine = pd.Recording(), pd.Recording()
    owner = api.start(None)
    # Their engine core records on this host (a prefill side whose engines
    # ran elsewhere would begin nothing: test_vllm_pd_closers).
    engine.announce(pd.SCHEDULER_PART)
    assert api.max_open_s == 1.0
    begun = []
    for round_ in range(4):
        tokens = [api.begin(f"p-{round_}-{i}", {"do_remote_decode": True}, TRACE) for i in range(4)]
        assert all(t is not None for t in tokens), "the region never fills"
        assert api.begin("one-too-many", {"do_remote_decode": True}, TRACE) is None
        deadline = time.monotonic() + PATIENCE_S
        time.sleep(1.0)
        while owner.region.open_requests() and time.monotonic() < deadline:
            api.tick()
            time.sleep(0.1)
        assert owner.region.open_requests() == []
        assert owner.tokens == {}, "the API server forgot them"
        begun += tokens
    assert owner.region.counters()["expired_requests"] == 16
    # Closed as any request closes: kept for the exporter (never fewer than
    # MIN_CLOSED_ENTRIES, whatever the slots), its events null.
    closed = owner.region.drain_closed()
    assert sorted(str(c["token"]) for c in closed) == sorted(str(t) for t in begun)
    assert all(c["snapshot"] == {} for c in closed)


def test_a_full_region_is_said_again_while_it_stays_full(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("EDGEMARK_VLLM_REGION", str(tmp_path / "r.region"))
    monkeypatch.setenv("EDGEMARK_VLLM_SLOTS", "1")
    api = pd.Recording()
    owner = api.start(None)
    api.said.every = 0.0
    with caplog.at_level(logging.WARNING, logger="edgemark.vllm"):
        assert api.begin("a", {"do_remote_decode": True}, None) is not None
        for i in range(3):
            assert api.begin(f"b{i}", {"do_remote_decode": True}, None) is None
    assert sum("is full" in r.getMessage() for r in caplog.records) == 3
    assert owner is api.owner


def test_said_repeats_a_lasting_condition_at_most_every_period():
    log = logging.getLogger("edgemark.test-said")
    said = _lifecycle.Said(log, every=3600.0)
    assert said.warn("x", "m") is True
    assert said.warn("x", "m") is False
    said.ended("x")
    assert said.warn("x", "m") is True, "said again once it started again"


def test_the_region_is_sized_for_data_parallel_ranks():
    once = _lifecycle.Once(logging.getLogger("edgemark.test"))
    cfg = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=128), parallel_config=SimpleNamespace(data_parallel_size=4)
    )
    assert pd.slots_for(cfg, once) == 4 * 128 * 4
    pools = [
        SimpleNamespace(stage_vllm_config=cfg),
        SimpleNamespace(stage_vllm_config=SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=8))),
    ]
    assert omni.slots_for(pools, once) == 4 * (128 * 4 + 8)


def test_a_finalizer_run_inside_a_locked_section_never_deadlocks(tmp_path, monkeypatch):
    from edgemark.vllm_omni import orchestrator

    monkeypatch.setenv("EDGEMARK_VLLM_OMNI_REGION", str(tmp_path / "o.region"))
    rec = omni.Recording()
    token = rec.begin("req-1")
    owner = rec.owner
    done = threading.Event()

    def gc_inside_the_lock():
        # The garbage collector runs a finalizer in whatever thread
        # allocates: here, inside the owner's (non-reentrant) lock.
        with owner.lock:
            orchestrator._close_by_finalizer(rec, "req-1", token, os.getpid())
        done.set()

    t = threading.Thread(target=gc_inside_the_lock, daemon=True)
    t.start()
    assert done.wait(PATIENCE_S), "the finalizer deadlocked"
    assert owner.region.is_open(token), "queued, not closed in place"
    rec.tick()
    assert not owner.region.is_open(token) and "req-1" not in owner.tokens


def test_a_stage_on_the_api_servers_host_never_begins_a_phantom_request(tmp_path, monkeypatch):
    # After the API server closed a request (an abort), a stage that first
    # sees it later must not begin a new, never-closed request for it.
    monkeypatch.setenv("EDGEMARK_VLLM_OMNI_REGION", str(tmp_path / "o.region"))
    api, stage = omni.Recording(), omni.Recording()
    api.begin("req-1", TRACE)
    api.close("req-1")
    region = api.owner.region
    stage.record("req-1", 0, 1, omni.ACCEPT, lambda: True, traceparent=lambda: TRACE)
    assert region.open_requests() == []
    # On a host of its own (no lookup: no API server), it does.
    monkeypatch.setenv("EDGEMARK_VLLM_OMNI_REGION", str(tmp_path / "stages.region"))
    remote = omni.Recording()
    remote.record("req-2", 1, 2, omni.ACCEPT, lambda: True, traceparent=lambda: TRACE)
    assert len(edgemark.Region.attach(str(tmp_path / "stages.region")).open_requests()) == 1


def test_a_connector_the_plugin_cannot_follow_begins_nothing_and_is_named_once(tmp_path, monkeypatch, caplog):
    from edgemark.vllm import connector

    monkeypatch.setenv("EDGEMARK_VLLM_REGION", str(tmp_path / "r.region"))
    for name, kv in (("MooncakeConnector", SimpleNamespace(kv_connector="MooncakeConnector")), ("(none)", None)):
        api = pd.Recording()
        with caplog.at_level(logging.WARNING, logger="edgemark.vllm"):
            assert api.start(SimpleNamespace(kv_transfer_config=kv)) is None
            for i in range(3):
                assert api.begin(f"p-{i}", {"do_remote_decode": True}, TRACE) is None
        said = [r.getMessage() for r in caplog.records if "not one edgemark follows" in r.getMessage()]
        assert len(said) == 1 and name in said[0]
        caplog.clear()
        assert not os.path.exists(tmp_path / "r.region"), "no region, no request left open"

    class MooncakeConnector:
        def update_state_after_alloc(self, request, blocks, num_external_tokens): ...
        def update_connector_output(self, connector_output): ...
        def request_finished(self, request, block_ids): ...

    c = MooncakeConnector()
    rec = pd.Recording()
    with caplog.at_level(logging.WARNING, logger="edgemark.vllm"):
        assert connector.wrap_instance(c, "SCHEDULER", rec) is False
        assert connector.wrap_instance(MooncakeConnector(), "SCHEDULER", rec) is False
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "MooncakeConnector" in msgs[0] and "remote_request_id" in msgs[0]
    assert "update_state_after_alloc" not in vars(c), "left alone"


def test_a_restarted_prefill_server_and_its_peer_keep_one_lookup(tmp_path, monkeypatch):
    # The prefill API server of a same-host pair exits and starts again: the
    # decode side still joins, and its engine still finds tokens.
    path = str(tmp_path / "pd.region")
    monkeypatch.setenv("EDGEMARK_VLLM_REGION", path)
    prefill, decode, engine = pd.Recording(), pd.Recording(), pd.Recording()
    prefill.start(None)
    decode.start(None)
    assert prefill.begin("p-1", {"do_remote_decode": True}, None) is not None
    assert decode.begin("d-1", {"remote_request_id": "p-1"}, None) is None, "joined"
    prefill.owner.release()
    assert os.path.isdir(_channel.lookup_dir(path)), "the peer reads it still"
    again = pd.Recording()
    again.start(None)
    token = again.begin("p-2", {"do_remote_decode": True}, None)
    assert decode.begin("d-2", {"remote_request_id": "p-2"}, None) is None, "joined"
    request = SimpleNamespace(request_id="d-2", kv_transfer_params={"remote_request_id": "p-2"})
    assert engine.pd_of(request).token == token


def test_no_tick_after_the_region_was_let_go(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEMARK_VLLM_REGION", str(tmp_path / "x.region"))
    rec = pd.Recording()
    rec.start(None)
    rec.owner.release()
    assert os.listdir(tmp_path) == []
    rec.tick()
    assert os.listdir(tmp_path) == [], "not made again at exit"


def test_a_region_that_cannot_be_made_again_is_retried_and_the_old_one_kept(tmp_path, monkeypatch, caplog):
    path = tmp_path / "o.region"
    monkeypatch.setenv("EDGEMARK_VLLM_OMNI_REGION", str(path))
    rec = omni.Recording()
    rec.begin("req-1")
    old = rec.owner
    os.unlink(path)
    path.write_bytes(b"\0" * 4096)  # in the way, and no region
    with caplog.at_level(logging.WARNING, logger="edgemark.vllm_omni"):
        rec.tick()
    assert rec.owner is old and not rec.failed, "kept, tried again later"
    os.unlink(path)
    rec._next_remake = 0.0
    rec.tick()
    assert rec.owner is not old and rec.begin("req-2") is not None
    assert any("cannot make the region" in r.getMessage() for r in caplog.records)


def test_a_request_begun_again_under_a_trace_context_is_closed_by_its_states_finalizer(tmp_path, monkeypatch):
    from edgemark.vllm_omni import orchestrator

    monkeypatch.setenv("EDGEMARK_VLLM_OMNI_REGION", str(tmp_path / "o.region"))
    rec = omni.Recording()
    first = rec.begin("r")
    rec.reparent("r", TRACE)
    orchestrator._close_by_finalizer(rec, "r", first, os.getpid())
    rec.tick()
    assert rec.owner.region.open_requests() == [] and rec.owner.tokens == {}


def test_clean_never_removes_a_live_file_that_took_the_name_of_the_one_it_locked(tmp_path, monkeypatch):
    # Between clean's open and its lock, the last server removed its file
    # and a restarted one made and holds a new one at the name.
    path = str(tmp_path / "pd.region")
    monkeypatch.setenv("EDGEMARK_VLLM_REGION", path)
    old = pd.Recording()
    old.start(None)
    state = {}
    real = _clean.fcntl.flock

    def flock(fd, op):
        if "new" not in state:
            old.owner.release()
            state["new"] = pd.Recording()
            state["new"].start(None)
        return real(fd, op)

    monkeypatch.setattr(_clean.fcntl, "flock", flock)
    assert _clean.clean(str(tmp_path), named=path) == []
    assert state["new"].owner.hold.linked()


def test_clean_leaves_what_an_exporter_has_not_sent_and_counts_what_it_removes(tmp_path):
    """A stale region whose ring holds closed requests no exporter sent:
    removed with their count when no exporter ever read it; left in place
    when one took them (a real ``edgemark export`` whose collector is
    down, then SIGKILLed: the next exporter adopts them), until
    ``--force``, which counts them."""
    from _live import edgemark_bin, wait_for

    cli = edgemark_bin()
    never = tmp_path / "edgemark-vllm-1-0123456789abcdef.region"
    region = edgemark.Region.create(str(never), edges=[(0, 1)], slots=8, closed_entries=16)
    for _ in range(3):
        region.close(region.begin())
    held = tmp_path / "edgemark-vllm-2-0123456789abcdef.region"
    region = edgemark.Region.create(str(held), edges=[(0, 1)], slots=8, closed_entries=16)
    for _ in range(2):
        region.close(region.begin())
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    exporter = subprocess.Popen(
        [cli, "export", str(held), "--otlp", f"http://127.0.0.1:{port}", "--listen", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(
            "the exporter holding both requests",
            lambda: region.report()["closed_unacknowledged"] == 2,
            30,
            lambda: str(region.report()),
        )
    finally:
        exporter.kill()
        exporter.wait()

    def clean(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "edgemark.vllm", "clean", "--dir", str(tmp_path), *extra],
            capture_output=True,
            text=True,
            check=True,
        )

    proc = clean()
    assert sorted(os.listdir(tmp_path)) == [held.name], proc.stderr
    assert proc.stdout == f"removed {never}\n"
    assert f"{never}: 3 closed requests in its ring were never sent (no exporter ever read it)" in proc.stderr
    assert f"{held} left in place: 2 closed requests in its ring are not sent yet" in proc.stderr
    proc = clean("--force")
    assert os.listdir(tmp_path) == [], proc.stderr
    assert proc.stdout == f"removed {held}\n"
    assert f"{held}: 2 closed requests in its ring were never sent (removed with --force)" in proc.stderr
