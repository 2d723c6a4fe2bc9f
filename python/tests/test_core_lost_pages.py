"""Pages a process's mapping cannot keep: a region file truncated under it,
and a sparse region whose file system is full. Neither kills the process;
neither hands out a request that other processes cannot see; each is
reported for what it is.

The full file system is a real 4 MiB tmpfs mounted in a private mount
namespace (``unshare --mount``), which needs root (CI runs as root)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import edgemark
from edgemark import Event, Outcome, Region


def test_begin_start_segment_and_close_refuse_after_the_file_is_truncated(tmp_path):
    path = tmp_path / "r.region"
    region = Region.create(path, edges=[(0, 1)], slots=64)
    info = region.info()
    kept = (8192 - info["slots_offset"]) // info["slot_stride"]
    assert kept >= 1
    near = [region.begin() for _ in range(kept)]
    assert all(t is not None for t in near)
    os.truncate(path, 8192)
    # The next free slot lies past the new end: no token for it.
    assert region.begin() is None
    assert region.begin() is None
    assert region.start_segment(near[0], 0, 1, 1) is False
    assert region.start_segment_outcome(near[0], 0, 1, 1) == Outcome.FAULTED
    assert region.close(near[0]) is None
    assert region.close_json(near[0]) is None
    with pytest.raises(edgemark.RegionShrunkError, match="truncated"):
        region.open_requests()
    # Whole again, a fresh attach sees the requests and closes them.
    os.truncate(path, info["bytes"])
    again = Region.attach(path)
    assert sorted(t.slot for t in again.open_requests()) == [t.slot for t in near]
    assert again.close(near[0]) == {}


NO_SPACE_SCRIPT = textwrap.dedent(
    """
    import errno, os, sys
    import edgemark
    from edgemark import Region

    d = sys.argv[1]
    # Too large for the file system: refused at creation, nothing left behind.
    big = os.path.join(d, "big.region")
    try:
        Region.create(big, edges=[(0, 1)], slots=65536)
        raise SystemExit("a region larger than its file system was created")
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
        assert str(e).count("no space for") == 1 and "bytes" in str(e) and d in str(e), e
    assert not os.path.exists(big)

    # A sparse region is created, but a page it cannot get later is lost.
    path = os.path.join(d, "sparse.region")
    owner = Region.create(path, edges=[(0, 1)], slots=65536, sparse=True)
    with open(os.path.join(d, "filler"), "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\\0" * 65536)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
    tokens = [owner.begin() for _ in range(4)]
    assert tokens == [None] * 4, tokens
    viewer = Region.attach(path, read_only=True)
    assert viewer.open_requests() == []
    try:
        owner.open_requests()
        raise SystemExit("a sweep of a mapping with a lost page succeeded")
    except edgemark.RegionNoSpaceError as e:
        assert "no space" in str(e), e
    except edgemark.RegionShrunkError as e:
        raise SystemExit(f"reported as a truncation: {e}")
    print("ok")
    """
)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root (CI runs as root)")
def test_a_full_file_system_is_refused_at_create_and_reported_as_no_space_for_a_sparse_region(tmp_path):
    unshare = shutil.which("unshare")
    assert unshare, "util-linux's unshare"
    mnt = tmp_path / "small"
    mnt.mkdir()
    script = tmp_path / "no_space.py"
    script.write_text(NO_SPACE_SCRIPT)
    # The mount exists only in the child's private mount namespace and goes
    # with it.
    shell = 'mount -t tmpfs -o size=4m tmpfs "$1" && exec "$2" "$3" "$1"'
    out = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "sh", "-c", shell, "sh",
         str(mnt), sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "ok"
    assert os.listdir(mnt) == [], "nothing was written outside the private mount"
