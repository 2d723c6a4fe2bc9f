"""``Region.report()``, ``info()`` and ``counters()`` are the core's one
report of a region, and say what ``edgemark inspect --json`` says, key by
key."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import warnings

import pytest

import edgemark
from edgemark import Event as E
from edgemark import Region

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _cli():
    """The `edgemark` command: $EDGEMARK_CLI, or the one `cargo test` (or
    `cargo build`) leaves in the repository's target directory."""
    for path in (os.environ.get("EDGEMARK_CLI"), ROOT / "target" / "debug" / "edgemark"):
        if path and os.access(path, os.X_OK):
            return str(path)
    return None


def _busy_region(path):
    """A region with something in every counter but reclaims."""
    r = Region.create(path, edges=[(0, 1), (1, 2)], slots=8, segments=2, domains=["gpu"], closed_entries=2)
    done = r.begin()
    r.record(done, 0, 1, E.PRODUCER_FIRST_NONEMPTY_EMIT, chunk_seq=1)
    r.close(done)
    r.record(done, 0, 1, E.EDGE_FIRST_SEND_COMPLETE)  # closed
    t = r.begin()
    r.record(t, 1, 2, E.CONSUMER_FIRST_ACCEPT, elapsed_ms=-1.0)  # invalid
    r.record(t, 1, 2, E.CONSUMER_FIRST_ACCEPT, elapsed_ms=1.0, clock_domain="late")
    for s in (1, 2, 3):
        r.start_segment(t, 0, 1, s)  # drops segments
    r.begin(traceparent="00-not-a-trace", strict=False)
    for _ in range(3):
        r.close(r.begin())
    r.drain_closed()  # a ring behind: the closes counted the lost
    r.close(r.begin())  # one left unread in the ring
    return r


def test_report_is_info_then_counters_then_occupancy(tmp_path):
    r = _busy_region(tmp_path / "r.region")
    report, info, counters = r.report(), r.info(), r.counters()
    assert info.pop("path") == r.path
    keys = list(report)
    occupancy = ["open_requests", "free_slots", "closed_unread", "closed_unacknowledged", "closed_readers"]
    assert keys == list(info) + list(counters) + occupancy
    for key, value in list(info.items()) + list(counters.items()):
        assert report[key] == value, key
    assert (report["open_requests"], report["free_slots"]) == (2, 6)
    # The ring: one close not yet taken, and no registered reader (what
    # drain_closed takes is done with, nothing to acknowledge).
    assert (report["closed_unread"], report["closed_unacknowledged"], report["closed_readers"]) == (1, 0, 0)
    assert len(r.open_requests()) == 2
    assert report["edges"] == ["0->1", "1->2"]
    assert report["domains"] == ["host_monotonic", "gpu", "late"]
    assert report["events"][0] == {
        "name": "producer_first_nonempty_emit",
        "domain": "host_monotonic",
        "keeps_chunk_seq": True,
    }
    assert [e["name"] for e in report["events"]] == r.events
    assert report["clock"]["kind"] == "monotonic" and report["clock"]["shared_with_this_process"] is True
    assert report["pid_namespaces"]["pids_judged"] is True
    assert report["closed_ring"]["entries"] == 2
    assert report["refused"]["invalid"] == 1 and report["refused"]["closed"] == 1
    assert report["closed_requests"] == 5 and report["closed_lost"] >= 1
    assert report["closed_acknowledged"] == 0 and report["closed_overwritten_taken"] == 0
    assert report["closed_settled_overwritten"] == 0
    assert report["closed_given_up"] == {"queue_full": 0, "retries_exhausted": 0, "refused": 0}
    assert report["dropped_segments"] >= 1 and report["bad_trace_contexts"] == 1
    assert list(report["refused"]) == [o for o in edgemark.OUTCOME_NAMES if o in report["refused"]]
    # Plain values all the way down: the JSON of the dict is the dict.
    assert json.loads(json.dumps(report)) == report


def test_report_says_what_inspect_json_says(tmp_path):
    cli = _cli()
    if cli is None:
        if os.environ.get("CI") == "true":
            raise RuntimeError("CI=true but no edgemark command is built (cargo test builds it first)")
        pytest.skip("no edgemark command built (cargo build -p edgemark-cli, or set EDGEMARK_CLI)")
    path = tmp_path / "r.region"
    r = _busy_region(path)
    report = r.report()
    out = subprocess.run([cli, "inspect", str(path), "--json"], check=True, capture_output=True)
    inspect = json.loads(out.stdout)
    open_ = inspect.pop("open")
    assert list(inspect) == list(report)
    for key, value in report.items():
        assert inspect[key] == value, key
    assert sorted(o["token"] for o in open_) == sorted(str(t) for t in r.open_requests())


def test_a_disabled_region_reports_nothing():
    r = Region.disabled()
    assert r.report() is None and r.info() is None
    assert r.counters()["closed_requests"] == 0


def test_former_info_keys_answer_with_a_deprecation_warning():
    r = Region.in_memory()
    info = r.info()
    moved = {
        "shares_clock": ("clock", "shared_with_this_process"),
        "mixed_pid_namespaces": ("pid_namespaces", "mixed"),
        "pids_unjudged": ("pid_namespaces", "why_not_judged"),
    }
    for old, (group, field) in moved.items():
        assert old not in info
        with pytest.warns(DeprecationWarning, match=old):
            assert info[old] == info[group][field]
        with pytest.warns(DeprecationWarning, match=old):
            assert info.get(old) == info[group][field]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert info["slots"] == 4096 and info.get("slots") == 4096
        assert info.get("no_such_key", 3) == 3
        with pytest.raises(KeyError):
            info["no_such_key"]
    assert isinstance(info, dict)


def test_reclaim_reports_in_the_core_names(tmp_path):
    r = Region.create(tmp_path / "r.region")
    assert r.reclaim_dead_owners() == {
        "dead_owners": 0,
        "dead_holders": 0,
        "unjudged": None,
        "live_owners_locked": 0,
    }
