"""The ``edgemark`` command as the wheel installs it: ``python -m edgemark``
and the console script run the command compiled into the native module,
with the binary's exit statuses, output and signals."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

import edgemark

CLI = [sys.executable, "-m", "edgemark"]


def run(*args, **kw):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, **kw)


def test_version_and_statuses():
    o = run("--version")
    assert o.returncode == 0, o
    assert o.stdout == f"edgemark {edgemark.__version__}\n"
    o = run("no-such-command")
    assert o.returncode == 2 and "unrecognized subcommand" in o.stderr, o
    o = run("inspect", "/nonexistent/edgemark.region")
    assert o.returncode == 1 and o.stderr.startswith("edgemark: "), o


def test_the_console_script_is_the_same_command():
    script = os.path.join(os.path.dirname(sys.executable), "edgemark")
    if not os.path.exists(script) and os.environ.get("CI") != "true":
        # An in-place build; CI installs the package, and must find it.
        pytest.skip("no console script beside this interpreter")
    o = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
    assert o.returncode == 0 and o.stdout == f"edgemark {edgemark.__version__}\n", o


def test_a_region_made_by_the_command_is_recorded_from_python(tmp_path):
    path = str(tmp_path / "cli.region")
    assert run("create", path, "--edge", "0:1", "--slots", "64").returncode == 0
    token = run("begin", path).stdout.strip()
    region = edgemark.Region.attach(path)
    assert region.record(token, 0, 1, edgemark.Event.PRODUCER_FIRST_NONEMPTY_EMIT)
    o = run("close", path, token)
    assert o.returncode == 0 and "producer_first_nonempty_emit_ms" in o.stdout, o


def test_the_demo_starts_its_workers_as_python_m_edgemark():
    o = run("demo", "--requests", "20", "--quiet")
    assert o.returncode == 0, o.stderr
    assert "edge 0->1 (segment 0)" in o.stdout and "edge 1->2 (segment 0)" in o.stdout


def _sigint_at_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _sigint_ignored() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_a_sigint_ignored_by_its_starter_stays_ignored(tmp_path):
    # As a binary started with SIGINT ignored (`cmd &` in a script) keeps it
    # ignored: the command does not put Python's default back.
    path = str(tmp_path / "watch.region")
    assert run("create", path, "--edge", "0:1", "--slots", "64").returncode == 0
    p = subprocess.Popen(
        [*CLI, "watch", path, "--interval", "0.1"], stdout=subprocess.PIPE, preexec_fn=_sigint_ignored
    )
    try:
        assert p.stdout.readline().startswith(b"region")
        p.send_signal(signal.SIGINT)
        p.send_signal(signal.SIGTERM)
        # Had the SIGINT ended it, it would have died of that one: the lower
        # of two pending signals is delivered first.
        assert p.wait(timeout=20) == -signal.SIGTERM
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=20)


def test_sigint_ends_it_and_a_closed_pipe_is_quiet(tmp_path):
    path = str(tmp_path / "watch.region")
    assert run("create", path, "--edge", "0:1", "--slots", "64").returncode == 0
    # Ctrl-C ends the command as it ends the binary: killed by SIGINT, not
    # a KeyboardInterrupt waiting for the command to return.
    # Started as a shell starts a command in the foreground, SIGINT at its
    # default (a runner started in the background, `cmd &`, ignores it, and
    # the command rightly keeps it ignored: test_a_sigint_ignored_by_its_
    # starter_stays_ignored); sent once the command runs (its first line
    # out), not while Python starts.
    p = subprocess.Popen(
        [*CLI, "watch", path, "--interval", "0.1"], stdout=subprocess.PIPE, preexec_fn=_sigint_at_default
    )
    assert p.stdout.readline().startswith(b"region")
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=20) == -signal.SIGINT
    # A reader that goes away: status 0, nothing on standard error.
    p = subprocess.Popen(
        [*CLI, "watch", path, "--interval", "0.01"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert p.stdout.readline().startswith(b"region")
    p.stdout.close()
    assert p.wait(timeout=20) == 0
    assert p.stderr.read() == b""
