"""The lifecycle both vLLM plugins share (``edgemark._lifecycle``), in the
shapes users deploy, with real processes: servers that are each PID 1 of
their own PID namespace over one ``/dev/shm`` (containers with
``--ipc=host``), a server SIGKILLed and started again (an OOM kill), several
API servers of one launcher, a peer that outlives the creator of a shared
region, a region file removed under a running server, requests nobody
closes, a full region, a finalizer run inside a locked section, a
connector the plugin cannot follow; races at the region file (a peer that
exits or a ``clean`` while a server attaches), errors that pass, an exit
during a tick, requests the bound cannot judge, a missing region, group
access; and ``clean``.

No vLLM is needed: each process builds the plugin's ``Recording`` as the
API server's wrappers do. The PID- and time-namespace tests need
``unshare`` with the right to make namespaces, the group-access test a
process of another uid (root, as in CI); they are skipped without them,
except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from types import SimpleNamespace

import pytest

import edgemark
from edgemark import _channel, _clean, _lifecycle, _region_file
from edgemark.vllm import _recording as pd

from _namespaces import needs_time_namespace, needs_unshare
from edgemark.vllm_omni import _recording as omni

TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
#: A bound on each wait, never a timing that is asserted.
PATIENCE_S = 60.0
NOBODY = 65534


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

    def __init__(self, directory, name: str, namespace: bool = False, env=None, umask: int = -1) -> None:
        cmd = [sys.executable, "-c", SERVER, str(directory), name]
        if namespace:
            cmd = ["unshare", "--pid", "--fork", "--mount-proc", "--", *cmd]
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("EDGEMARK_", "_EDGEMARK_"))}
        environ.update(env or {})
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=environ, text=True, umask=umask
        )
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


def test_clean_never_removes_a_live_file_that_took_the_name_of_the_one_it_locked(tmp_path, monkeypatch, servers):
    # Between clean's open and its lock, the last server removed its file
    # and a restarted one made and holds a new one at the name: the lock
    # clean takes is the removed file's (nobody holds it), and the name
    # leads to a live one.
    path = str(tmp_path / "pd.region")
    env = {"EDGEMARK_VLLM_REGION": path}
    old = servers(tmp_path, "old", env=env)
    real = _clean.fcntl.flock
    started = []

    def flock(fd, op):
        # Clean's lock, once: the real one from here on, in this process.
        monkeypatch.setattr(_clean.fcntl, "flock", real)
        old.exit()
        assert not os.path.exists(path), "the last server out removed it"
        started.append(servers(tmp_path, "new", env=env))
        return real(fd, op)

    monkeypatch.setattr(_clean.fcntl, "flock", flock)
    assert _clean.clean(str(tmp_path), named=path) == []
    assert started, "clean reached its lock"
    assert open_count(path) == 1 and os.path.isdir(_channel.lookup_dir(path)), "the new server's, untouched"


# -- races at the region file, and errors that pass -------------------------------


def _own_region_env(monkeypatch, path) -> None:
    monkeypatch.setenv("EDGEMARK_VLLM_REGION", str(path))
    monkeypatch.delenv("_EDGEMARK_VLLM_NAMED", raising=False)


def test_a_server_attaching_while_its_peer_exits_records_into_the_file_at_the_name(tmp_path, monkeypatch, servers):
    # The server that made the region exits (the last one out, it removes
    # the region) and another starts (and makes a new one) while this one
    # attaches: what this one begins must be in the file every process
    # finds at the name.
    path = str(tmp_path / "pd.region")
    env = {"EDGEMARK_VLLM_REGION": path}
    peer = servers(tmp_path, "peer", env=env)
    _own_region_env(monkeypatch, path)
    real = _region_file.attach
    started = []

    def attach(p, wait=_region_file.ATTACH_WAIT_S):
        region = real(p, wait)
        if not started:
            peer.exit()
            started.append(servers(tmp_path, "next", env=env))
        return region

    monkeypatch.setattr(_region_file, "attach", attach)
    api = pd.Recording()
    owner = api.start(None)
    assert started and owner is not None
    token = api.begin("p-mine", {"do_remote_decode": True}, None)
    assert token is not None
    assert edgemark.Region.attach(path).is_open(token), "begun in the file at the name"
    # The peer's (open until the bound closes it), the next server's, this one's.
    assert open_count(path) == 3, "one region for all three"
    assert owner.hold.linked()


class _Region:
    """``edgemark.Region`` as ``_region_file`` sees it, with ``before_create``
    run before each create (the tests' interleavings)."""

    def __init__(self, before_create=lambda path: None, after_create=lambda path: None) -> None:
        self.before_create = before_create
        self.after_create = after_create
        self.attach = edgemark.Region.attach

    def create(self, path, *args, **kwargs):
        self.before_create(path)
        try:
            return edgemark.Region.create(path, *args, **kwargs)
        finally:
            self.after_create(path)


def test_a_region_file_that_vanishes_as_a_server_attaches_it_is_made_again(tmp_path, monkeypatch, servers, caplog):
    # The server's create finds the peer's file; the peer exits (the last
    # one out, it removes it) before this server locks it.
    path = str(tmp_path / "pd.region")
    peer = servers(tmp_path, "peer", env={"EDGEMARK_VLLM_REGION": path})
    _own_region_env(monkeypatch, path)

    def peer_exits(p):
        if peer.proc.poll() is None:
            peer.exit()

    monkeypatch.setattr(_region_file, "Region", _Region(after_create=peer_exits))
    api = pd.Recording()
    with caplog.at_level(logging.WARNING, logger="edgemark.vllm"):
        owner = api.start(None)
        token = api.begin("p-1", {"do_remote_decode": True}, None)
    assert owner is not None and not api.failed, "not switched off"
    assert owner.created, "made again"
    assert token is not None and edgemark.Region.attach(path).is_open(token)
    assert not [r for r in caplog.records if "cannot" in r.getMessage()]


def test_a_region_file_that_keeps_vanishing_is_tried_again_not_switched_off(tmp_path, monkeypatch, servers, caplog):
    # Three times over, a peer makes the region just before this server's
    # create and removes it (its exit) before this server locks it.
    path = str(tmp_path / "pd.region")
    env = {"EDGEMARK_VLLM_REGION": path}
    _own_region_env(monkeypatch, path)
    peers = []

    def peer_starts(p):
        if len(peers) < 3:
            peers.append(servers(tmp_path, f"peer{len(peers)}", env=env))

    def peer_exits(p):
        if peers and peers[-1].proc.poll() is None:
            peers[-1].exit()

    monkeypatch.setattr(_region_file, "Region", _Region(peer_starts, peer_exits))
    api = pd.Recording()
    with caplog.at_level(logging.WARNING, logger="edgemark.vllm"):
        assert api.start(None) is None
    assert len(peers) == 3 and not os.path.exists(path)
    assert not api.failed, "tried again later, every call site still patched"
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and "cannot make or attach the region" in said[0] and path in said[0]
    assert api.begin("p-1", {"do_remote_decode": True}, None) is None, "not before the pause"
    api._owner_retry.now()  # the pause over
    token = api.begin("p-1", {"do_remote_decode": True}, None)
    assert token is not None and api.owner.created and edgemark.Region.attach(path).is_open(token)


#: A real ``clean`` of the region named in argv[1] that holds the file's
#: lock, once taken, until told to go on (stdin), then removes it.
CLEAN_HOLDING = r"""
import sys
from edgemark import _clean
real = _clean._lock_if_unused
def lock_and_wait(path):
    fd = real(path)
    print("locked" if fd is not None else "in use", flush=True)
    sys.stdin.readline()
    return fd
_clean._lock_if_unused = lock_and_wait
print(" ".join(_clean.clean(sys.argv[2], named=[sys.argv[1]])), flush=True)
"""


def test_a_region_file_removed_while_a_clean_held_its_lock_is_made_again(tmp_path, monkeypatch):
    # A stale region (nobody holds it) that a clean locks as this server
    # opens it: the server's lock waits for the clean's, which removes the
    # file. Held then is a file no name leads to.
    path = str(tmp_path / "pd.region")
    edgemark.Region.create(path, edges=[(0, 1)], slots=4)
    cleaner = subprocess.Popen(
        [sys.executable, "-c", CLEAN_HOLDING, path, str(tmp_path / "nothing-else")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    (tmp_path / "nothing-else").mkdir()
    try:
        assert cleaner.stdout.readline() == "locked\n"
        real_sleep = time.sleep

        class Clock:
            monotonic = staticmethod(time.monotonic)

            @staticmethod
            def sleep(s):
                # The hold waits for the clean's lock: the clean goes on,
                # removes the file and exits.
                if cleaner.poll() is None:
                    cleaner.stdin.write("\n")
                    cleaner.stdin.flush()
                    assert cleaner.stdout.readline() == f"{path}\n"
                    cleaner.wait(PATIENCE_S)
                real_sleep(s)

        monkeypatch.setattr(_region_file, "time", Clock)
        _own_region_env(monkeypatch, path)
        api = pd.Recording()
        owner = api.start(None)
    finally:
        if cleaner.poll() is None:
            cleaner.kill()
    assert cleaner.returncode == 0
    token = api.begin("p-1", {"do_remote_decode": True}, None)
    assert owner.created and owner.hold.linked(), "made again, and held"
    assert token is not None and edgemark.Region.attach(path).is_open(token)


def test_a_region_made_here_and_replaced_before_its_lock_is_attached_not_taken_for_its_own(tmp_path, monkeypatch):
    # Made by this server, then, before its lock: judged stale by a clean
    # (nobody held it yet) and removed, and a region made by hand at the
    # name (`edgemark create`). That one is attached, and stays when the
    # server exits.
    path = str(tmp_path / "pd.region")
    made = []

    def clean_then_create(p):
        if made:
            return
        made.append(p)
        out = subprocess.run(
            [sys.executable, "-m", "edgemark.vllm", "clean", "--dir", str(tmp_path), "--region", p],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert out == f"removed {p}\n"
        subprocess.run([sys.executable, "-m", "edgemark", "create", "--edge", "0:1", "--slots", "16", p], check=True)

    monkeypatch.setattr(_region_file, "Region", _Region(after_create=clean_then_create))
    _own_region_env(monkeypatch, path)
    api = pd.Recording()
    owner = api.start(None)
    assert made and owner is not None
    assert not owner.created, "attached: not the file it made"
    token = api.begin("p-1", {"do_remote_decode": True}, None)
    assert token is not None and edgemark.Region.attach(path).is_open(token)
    owner.release()
    assert os.path.exists(path), "made by hand: never removed by a server"


def test_a_stale_marker_of_a_killed_server_never_removes_a_region_made_by_hand(tmp_path, servers):
    # A server SIGKILLed leaves its region and its lookup, with the marker
    # that says a server made the region. The user removes the region and
    # makes one at the same path with `edgemark create`.
    path = str(tmp_path / "pd.region")
    env = {"EDGEMARK_VLLM_REGION": path}
    killed = servers(tmp_path, "killed", env=env)
    killed.kill()
    assert os.path.exists(os.path.join(_channel.lookup_dir(path), _lifecycle.MADE_BY_SERVER))
    os.unlink(path)
    subprocess.run([sys.executable, "-m", "edgemark", "create", "--edge", "0:1", "--slots", "16", path], check=True)
    s = servers(tmp_path, "next", env=env)
    assert s.said["token"] is not None
    s.exit()
    assert os.path.exists(path), "the marker was another region's"


#: An engine core that reads the lookup for request argv[1] while no file
#: descriptor is free (RLIMIT_NOFILE 0), then, with them back, as requests
#: keep needing it (for a bounded time); says what the reads found.
READ_STARVED = r"""
import json, resource, sys, time
from edgemark.vllm._recording import Recording
rec = Recording()
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (0, hard))
try:
    starved = rec.read_lookup(sys.argv[1])
finally:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
deadline = time.monotonic() + 30
after = None
while after is None and time.monotonic() < deadline:
    time.sleep(0.05)
    after = rec.read_lookup(sys.argv[1])
print(json.dumps({"starved": starved and str(starved), "after": after and str(after)}))
"""


def test_a_lookup_that_cannot_be_opened_for_a_moment_is_read_again(tmp_path, servers):
    path = str(tmp_path / "pd.region")
    env = {"EDGEMARK_VLLM_REGION": path}
    api = servers(tmp_path, "a", env=env)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("EDGEMARK_", "_EDGEMARK_"))}
    out = subprocess.run(
        [sys.executable, "-c", READ_STARVED, "p-a"], env={**environ, **env}, capture_output=True, text=True, check=True
    )
    found = json.loads(out.stdout)
    assert found["starved"] is None
    assert found["after"] == api.said["token"], "read once descriptors were free again"
    assert "cannot be opened now" in out.stderr


#: An API server whose request lookup cannot be made while no file
#: descriptor is free (RLIMIT_NOFILE 0 while the writer is made): it ticks
#: twice so, then, with them back, until it has a writer (for a bounded
#: time). Says what it had and said.
WRITER_STARVED = r"""
import json, logging, resource, sys, time
from edgemark import _channel
from edgemark.vllm._recording import Recording
said = []
class Keep(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())
logging.getLogger("edgemark.vllm").addHandler(Keep())
real = _channel.Writer.__init__
starve = [True]
def writer(self, *args, **kwargs):
    if not starve[0]:
        return real(self, *args, **kwargs)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (0, hard))
    try:
        real(self, *args, **kwargs)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
_channel.Writer.__init__ = writer
rec = Recording()
rec.said.every = 0.0
owner = rec.start(None)
none_at_start = owner.writer is None
for _ in range(2):
    rec.tick()
none_while_starved = owner.writer is None
starve[0] = False
deadline = time.monotonic() + 30
while owner.writer is None and time.monotonic() < deadline:
    time.sleep(0.05)
    rec.tick()
token = rec.begin("p-1", {"do_remote_decode": True}, None)
print(json.dumps({"none": [none_at_start, none_while_starved], "writer": owner.writer is not None,
                  "token": token and str(token), "said": said}))
sys.stdin.readline()
"""


def test_a_lookup_that_cannot_be_made_is_said_while_it_lasts_and_made_again(tmp_path):
    path = str(tmp_path / "pd.region")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("EDGEMARK_", "_EDGEMARK_"))}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER_STARVED],
        env={**environ, "EDGEMARK_VLLM_REGION": path},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        out = json.loads(proc.stdout.readline())
        assert out["none"] == [True, True] and out["writer"]
        said = [m for m in out["said"] if "request lookup" in m and "cannot be made" in m]
        assert len(said) >= 3, "said at the start and at each tick while it lasts"
        assert out["token"] is not None
        # Another process finds the token the server published.
        assert str(_channel.Reader(_channel.lookup_dir(path)).read("p-1")) == out["token"]
    finally:
        proc.stdin.write("\n")
        proc.stdin.close()
        proc.wait(timeout=PATIENCE_S)


#: An API server whose tick is under way when the process exits cleanly: the
#: tick goes on until the exit's handlers have let the region go (so that
#: the hold it checks is let go under it), and the process ends only after
#: the tick (a handler registered first runs last).
EXIT_DURING_TICK = r"""
import atexit, threading, time
ticked = threading.Event()
atexit.register(lambda: ticked.wait(60))
from edgemark import _lifecycle
_lifecycle.STOP_WAIT_S = 0.5
from edgemark.vllm._recording import Recording
rec = Recording()
owner = rec.start(None)
in_tick = threading.Event()
real = owner.tick
def tick(max_open_s):
    n = real(max_open_s)
    in_tick.set()
    deadline = time.monotonic() + 60
    while not owner.released and time.monotonic() < deadline:
        time.sleep(0.01)
    return n
owner.tick = tick
def run():
    try:
        rec.tick()
    finally:
        ticked.set()
threading.Thread(target=run, daemon=True).start()
assert in_tick.wait(60)
"""


def test_a_clean_exit_during_a_tick_leaves_no_region_behind(tmp_path):
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("EDGEMARK_", "_EDGEMARK_"))}
    path = str(tmp_path / "x.region")
    proc = subprocess.run(
        [sys.executable, "-c", EXIT_DURING_TICK],
        env={**environ, "EDGEMARK_VLLM_REGION": path},
        capture_output=True,
        text=True,
        timeout=PATIENCE_S,
    )
    assert proc.returncode == 0, proc.stderr
    assert os.listdir(tmp_path) == [], "no region made at exit"
    assert "removed or replaced" not in proc.stderr


#: A stage of another time namespace (a container of its own) that begins a
#: request in the region at argv[1]: its origin is on its own clock.
FOREIGN_BEGIN = r"""
import sys
import edgemark
print(edgemark.Region.attach(sys.argv[1], allow_foreign_clock=True).begin())
"""


@needs_time_namespace
def test_requests_the_bound_cannot_judge_are_counted_and_said_while_they_stay_open(tmp_path, monkeypatch, caplog):
    path = str(tmp_path / "pd.region")
    _own_region_env(monkeypatch, path)
    monkeypatch.setenv("EDGEMARK_VLLM_MAX_OPEN_S", "1")
    api = pd.Recording()
    owner = api.start(None)
    api.said.every = 0.0
    theirs = subprocess.run(
        ["unshare", "--time", "--fork", "--monotonic", "1000", sys.executable, "-c", FOREIGN_BEGIN, path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    mine = api.begin("p-1", {"do_remote_decode": True}, None)
    deadline = time.monotonic() + PATIENCE_S
    with caplog.at_level(logging.WARNING, logger="edgemark.vllm"):
        while owner.region.is_open(mine) and time.monotonic() < deadline:
            time.sleep(0.2)
            api.tick()
    assert not owner.region.is_open(mine), "its own request expires"
    assert owner.region.is_open(theirs), "left open: its age cannot be told"
    said = [r.getMessage() for r in caplog.records if "cannot be judged" in r.getMessage()]
    assert said and all(m.startswith("edgemark: 1 open request(s) of " + path) for m in said)
    assert owner.unjudged == 1
    caplog.clear()
    owner.region.close(theirs)
    with caplog.at_level(logging.WARNING, logger="edgemark.vllm"):
        api.tick()
    assert owner.unjudged == 0 and not [r for r in caplog.records if "cannot be judged" in r.getMessage()]


def test_a_process_with_no_region_says_so_at_warning_while_requests_need_it(tmp_path, monkeypatch, caplog, servers):
    # A model worker, which records into the region its API server made and
    # never begins (an engine core with no API server on its host begins its
    # own: test_vllm_pd_closers).
    path = str(tmp_path / "pd.region")
    _own_region_env(monkeypatch, path)
    worker = pd.Recording()
    worker.said.every = 0.0
    with caplog.at_level(logging.DEBUG, logger="edgemark.vllm"):
        for i in range(4):
            worker._next_attach = 0.0  # the pause between attempts over
            assert worker.pd_of_sent(f"p-{i}").token is None
    said = [r for r in caplog.records if "no region at" in r.getMessage()]
    warned = [r for r in said if r.levelno == logging.WARNING]
    assert len(warned) >= 3, "said while it lasts"
    assert all(path in r.getMessage() and "EDGEMARK_VLLM_REGION" in r.getMessage() for r in warned)
    assert not os.path.exists(path), "a worker makes no region"
    # The API server starts: the next attempt attaches, and finds its token.
    api = servers(tmp_path, "p", env={"EDGEMARK_VLLM_REGION": path})
    worker._next_attach = 0.0
    assert str(worker.pd_of_sent("p-p").token) == api.said["token"]


def test_a_stage_on_a_host_of_its_own_makes_its_region_without_a_word_of_a_missing_one(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("EDGEMARK_VLLM_OMNI_REGION", str(tmp_path / "stages.region"))
    stage = omni.Recording()
    stage.said.every = 0.0
    with caplog.at_level(logging.WARNING, logger="edgemark.vllm_omni"):
        stage.record("req-1", 1, 2, omni.ACCEPT, lambda: True, traceparent=lambda: TRACE)
    assert stage.host_hold is not None and len(stage._region.open_requests()) == 1
    assert not [r for r in caplog.records if "no region" in r.getMessage()]


# -- group access ----------------------------------------------------------------


def test_the_lookup_is_trusted_with_its_groups_read_bits_only_under_group_access(tmp_path):
    # mode: trusted without group access, with it.
    cases = {0o700: (True, True), 0o750: (False, True), 0o710: (False, True), 0o770: (False, False),
             0o701: (False, False), 0o755: (False, False)}  # fmt: skip
    d = tmp_path / "r.requests"
    d.mkdir()
    for mode, expected in cases.items():
        os.chmod(d, mode)
        for group, trusted in zip((False, True), expected):
            for side in (lambda: _channel.Reader(str(d), group).open(), lambda: _channel.Writer(str(d), group)):
                try:
                    side()
                    got = True
                except _channel.UntrustedError:
                    got = False
                assert got == trusted, (oct(mode), group)


def test_group_access_makes_the_region_and_lookup_group_readable_whatever_the_umask_and_again_when_remade(
    tmp_path, monkeypatch
):
    path = str(tmp_path / "pd.region")
    _own_region_env(monkeypatch, path)
    monkeypatch.setenv("EDGEMARK_VLLM_GROUP_ACCESS", "1")
    old = os.umask(0o077)
    try:
        api = pd.Recording()
        owner = api.start(None)
        assert api.begin("p-1", {"do_remote_decode": True}, None) is not None
        lookup = _channel.lookup_dir(path)

        def modes():
            entry = os.path.join(lookup, _channel.entry_name("p-1"))
            return [stat.S_IMODE(os.stat(p).st_mode) for p in (path, lookup, entry)]

        assert modes() == [0o660, 0o750, 0o640]
        # Removed under the server (a clean of an older release, by hand):
        # made again, shared as before.
        os.unlink(path)
        shutil.rmtree(lookup)
        api.tick()
        assert api.owner is not owner
        assert api.begin("p-1", {"do_remote_decode": True}, None) is not None
        assert modes() == [0o660, 0o750, 0o640]
        # A stage on a host of its own makes its region shared too.
        monkeypatch.setenv("EDGEMARK_VLLM_OMNI_REGION", str(tmp_path / "stages.region"))
        monkeypatch.setenv("EDGEMARK_VLLM_OMNI_GROUP_ACCESS", "1")
        omni.Recording().record("req-1", 1, 2, omni.ACCEPT, lambda: True, traceparent=lambda: TRACE)
        assert stat.S_IMODE(os.stat(tmp_path / "stages.region").st_mode) == 0o660
    finally:
        os.umask(old)


#: What a process of another user reads, as uid argv[3], gid argv[4] and
#: the supplementary groups that follow: the region at argv[1] (attached
#: read-only, as an exporter does) and the entry argv[2] of its lookup.
READ_AS = r"""
import json, os, sys
import edgemark
path, entry = sys.argv[1], sys.argv[2]
os.setgroups([int(g) for g in sys.argv[5:]])
os.setgid(int(sys.argv[4]))
os.setuid(int(sys.argv[3]))
out = {}
try:
    out["open_requests"] = len(edgemark.Region.attach(path, allow_foreign_owner=True, read_only=True).open_requests())
except OSError as e:
    out["open_requests"] = e.__class__.__name__
try:
    with open(entry, "rb") as f:
        out["entry"] = f.read().decode().split("\n")[1]
except OSError as e:
    out["entry"] = e.__class__.__name__
print(json.dumps(out))
"""


def test_group_access_lets_another_uid_of_the_group_read_the_region_and_its_lookup_and_nobody_else(servers):
    if os.geteuid() != 0 and os.environ.get("CI") != "true":
        pytest.skip("another uid needs root")
    # Beside the regions of /dev/shm, in a directory anyone may enter
    # (pytest's own is its owner's only).
    directory = tempfile.mkdtemp(prefix="edgemark-group-", dir="/dev/shm")
    try:
        os.chmod(directory, 0o755)
        group = os.getegid()
        reads = {}
        for shared in (True, False):
            path = os.path.join(directory, f"{'shared' if shared else 'own'}.region")
            env = {"EDGEMARK_VLLM_REGION": path, "EDGEMARK_VLLM_GROUP_ACCESS": "1" if shared else "0"}
            s = servers(directory, "g", env=env, umask=0o077)
            entry = os.path.join(_channel.lookup_dir(path), _channel.entry_name("p-g"))
            for who, groups in (("in the group", [group]), ("outside it", [])):
                out = subprocess.run(
                    [sys.executable, "-c", READ_AS, path, entry, str(NOBODY), str(NOBODY), *map(str, groups)],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                reads[shared, who] = json.loads(out)
            s.exit()
        assert reads[True, "in the group"] == {"open_requests": 1, "entry": "p-g"}
        denied = {"open_requests": "PermissionError", "entry": "PermissionError"}
        assert reads[True, "outside it"] == denied, "others never"
        assert reads[False, "in the group"] == denied, "the group only with the variable"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


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
