"""The READMEs' Python examples run as written, twice in a row: each cleans
up what it creates, so a reader who runs one again sees it work again."""

from __future__ import annotations

import os
import re

import pytest

import edgemark

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON_README = os.path.join(ROOT, "python", "README.md")
README = os.path.join(ROOT, "README.md")


def blocks(path):
    with open(path) as f:
        found = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert found, f"{path} has a Python example"
    return found


def run_twice(path, block, tmp_path, monkeypatch):
    """Runs ``block`` twice, each time in a fresh scope; returns the scopes.
    Region files go to ``tmp_path`` (``edgemark.default_dir``), which is
    empty again after each run."""
    monkeypatch.setattr(edgemark, "default_dir", lambda: str(tmp_path))
    scopes = []
    for run in range(2):
        scope: dict = {}
        exec(compile(block, path, "exec"), scope)
        assert os.listdir(tmp_path) == [], f"run {run + 1} left {os.listdir(tmp_path)}"
        scopes.append(scope)
    return scopes


def test_the_python_readme_example_runs_twice_in_a_row(tmp_path, monkeypatch):
    for scope in run_twice(PYTHON_README, blocks(PYTHON_README)[0], tmp_path, monkeypatch):
        final = scope["final"]
        seg = final["0->1:0"]
        assert seg["first_chunk_seq"] == 3
        assert seg["consumer_first_accept_ms"] == 4.2
        assert seg["clock_domains"]["consumer_first_accept"] == "device"
        assert scope["region"].snapshot(scope["token"]) == {}


def test_the_stream_edge_example_runs_twice_in_causal_order(tmp_path, monkeypatch):
    block = next(b for b in blocks(PYTHON_README) if "RequestStreamEdgeEvents()" in b)
    for scope in run_twice(PYTHON_README, block, tmp_path, monkeypatch):
        seg = scope["last"]["0->1:0"]
        emit, send = seg["producer_first_nonempty_emit_ms"], seg["edge_first_send_complete_ms"]
        assert emit is not None and send is not None
        assert emit <= send, "the send completes after the emit, on one clock"
        assert set(seg["clock_domains"].values()) == {"host_monotonic"}


@pytest.mark.parametrize("index", range(len(blocks(README))))
def test_the_readme_python_examples_run_twice_in_a_row(tmp_path, monkeypatch, index):
    for scope in run_twice(README, blocks(README)[index], tmp_path, monkeypatch):
        if "final" in scope:
            assert scope["final"]["0->1:0"]["first_chunk_seq"] == 3
