"""A region file shrunk and regrown in a loop by another process, another
user where the tests run as root: Python sweeps never die of it, and a sweep
that met a shrunk file raises instead of returning an empty result."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

import edgemark
from edgemark import Event, Region

SOAK_SECONDS = float(os.environ.get("EDGEMARK_SOAK_SECONDS", "20"))
HOSTILE_USER = "edgemark-hostile"

# Shrinks the file to half and grows it back, every 2 ms, for a while.
SHRINKER = textwrap.dedent(
    """
    import os, sys, time
    path, seconds = sys.argv[1], float(sys.argv[2])
    fd = os.open(path, os.O_RDWR)
    full = os.fstat(fd).st_size
    end = time.monotonic() + seconds
    loops = 0
    while time.monotonic() < end:
        os.ftruncate(fd, full // 2)
        time.sleep(0.002)
        os.ftruncate(fd, full)
        time.sleep(0.002)
        loops += 1
    print(loops)
    """
)

# Attaches and sweeps in a loop; counts sweeps that worked and sweeps that
# raised because the file was found shrunk (then attaches again).
SWEEPER = textwrap.dedent(
    """
    import sys, time
    import edgemark
    path, seconds = sys.argv[1], float(sys.argv[2])
    ok = shrunk = 0
    end = time.monotonic() + seconds
    region = None
    while time.monotonic() < end:
        try:
            if region is None:
                region = edgemark.Region.attach(path, allow_foreign_owner=True)
            region.open_requests()
            region.snapshot_open()
            region.counters()
            region.info()
            ok += 1
        except edgemark.RegionShrunkError:
            shrunk += 1
            region = None
        except ValueError:
            # attached while the file was short: a length error
            shrunk += 1
            region = None
    print(ok, shrunk)
    """
)


def hostile_user():
    """The (uid, gid) of a user other than root to run the shrinker as, or
    None where this process cannot create one (not root)."""
    if os.geteuid() != 0:
        return None
    try:
        pw = pwd.getpwnam(HOSTILE_USER)
    except KeyError:
        useradd = shutil.which("useradd")
        if useradd is None:
            return None
        subprocess.run(
            [useradd, "--system", "--no-create-home", "--user-group", HOSTILE_USER],
            check=True,
            capture_output=True,
        )
        pw = pwd.getpwnam(HOSTILE_USER)
    return pw.pw_uid, pw.pw_gid


@pytest.fixture
def shared_dir():
    """A directory other users can enter (pytest's are owner-only)."""
    d = tempfile.mkdtemp(dir=edgemark.default_dir(), prefix="edgemark-hostile-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_sweeps_survive_a_region_shrunk_and_regrown_in_a_loop(shared_dir):
    path = os.path.join(shared_dir, "r.region")
    owner = Region.create(path, slots=512, group_access=True)
    tokens = [owner.begin() for _ in range(300)]
    for t in tokens:
        owner.record(t, 0, 1, Event.PRODUCER_FIRST_NONEMPTY_EMIT, chunk_seq=1)
    user = hostile_user()
    kwargs = {}
    # The other user cannot run this test's interpreter (it may live in a
    # private virtual environment); the shrinker needs only the standard
    # library, so it runs under the system's.
    shrinker_python = sys.executable
    if user is None:
        print("test_hostile: not root, so the shrinker runs as this user", file=sys.stderr)
    else:
        os.chown(path, -1, user[1])
        kwargs = {"user": user[0], "group": user[1], "extra_groups": []}
        shrinker_python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    shrinker = subprocess.Popen(
        [shrinker_python, "-c", SHRINKER, path, str(SOAK_SECONDS)],
        stdout=subprocess.PIPE,
        text=True,
        **kwargs,
    )
    sweepers = [
        subprocess.Popen(
            [sys.executable, "-c", SWEEPER, path, str(SOAK_SECONDS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    # This process sweeps too, through the creator's mapping: it faults once
    # the file is first cut, and from then on every sweep raises.
    own = {"ok": 0, "shrunk": 0}
    end = time.monotonic() + SOAK_SECONDS
    while time.monotonic() < end:
        try:
            owner.snapshot_open()
            own["ok"] += 1
        except edgemark.RegionShrunkError:
            own["shrunk"] += 1
        time.sleep(0.001)
    loops = int(shrinker.communicate(timeout=60)[0])
    assert shrinker.returncode == 0
    assert loops > 100, "the shrinker ran"
    deaths = 0
    totals = [0, 0]
    for s in sweepers:
        out, err = s.communicate(timeout=60)
        if s.returncode < 0:
            deaths += 1
            print(f"sweeper died of {signal.Signals(-s.returncode).name}: {err}")
            continue
        assert s.returncode == 0, err
        ok, shrunk = map(int, out.split())
        totals[0] += ok
        totals[1] += shrunk
    assert deaths == 0
    assert totals[0] + totals[1] > 0
    # The shrinks were met: some sweeps raised rather than returned nothing.
    assert totals[1] > 0 or own["shrunk"] > 0, (totals, own)
    print(f"test_hostile: {loops} shrink loops, sweeps ok/shrunk {totals}, own {own}")


def test_a_sweep_that_met_a_shrunk_file_raises_and_says_why(tmp_path):
    path = tmp_path / "r.region"
    region = Region.create(path, slots=64)
    t = region.begin()
    assert region.open_requests() == [t]
    with open(path, "r+b") as f:
        f.truncate(4096)
    for sweep in (region.open_requests, region.snapshot_open, region.reclaim_dead_owners):
        with pytest.raises(edgemark.RegionShrunkError, match="4096 bytes|truncated"):
            sweep()
    # A single-request call does not raise: it sees nothing there.
    assert region.snapshot(t) == {}
    assert isinstance(edgemark.RegionShrunkError("x"), OSError)


def test_a_region_of_another_user_needs_allow_foreign_owner(shared_dir):
    """A group member's view of a region shared with the group: the file
    belongs to another user, so attaching it is a trust decision the caller
    states with ``allow_foreign_owner``; ``read_only`` needs read permission
    alone and writes nothing."""
    user = hostile_user()
    if user is None:
        print("SKIPPED test_a_region_of_another_user_needs_allow_foreign_owner: "
              "not root, so no second user can own the file", file=sys.stderr)
        return
    path = os.path.join(shared_dir, "theirs.region")
    mine = Region.create(path, slots=8, group_access=True)
    t = mine.begin()
    assert mine.record(t, 0, 1, Event.PRODUCER_FIRST_NONEMPTY_EMIT, chunk_seq=1)
    os.chown(path, user[0], user[1])  # as if that user had created it
    with pytest.raises(PermissionError, match="allow foreign owners"):
        Region.attach(path)
    theirs = Region.attach(path, allow_foreign_owner=True)
    assert theirs.record(t, 0, 1, Event.EDGE_FIRST_SEND_COMPLETE)
    assert set(theirs.snapshot(t)["0->1:0"]["clock_domains"]) == {
        "producer_first_nonempty_emit",
        "edge_first_send_complete",
    }
    # Read-only: opened without write access, it still sees it all.
    os.chmod(path, 0o444)
    viewer = Region.attach(path, allow_foreign_owner=True, read_only=True)
    assert viewer.open_requests() == [t]
    assert viewer.record_outcome(t, 0, 1, Event.CONSUMER_FIRST_ACCEPT) == "read_only"
    assert viewer.begin() is None
    assert viewer.snapshot(t) == theirs.snapshot(t)
    with pytest.raises(PermissionError, match="read-only"):
        viewer.reclaim_dead_owners()
