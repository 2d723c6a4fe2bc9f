"""The Python README's example runs as written."""

from __future__ import annotations

import os
import re

import edgemark

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def test_readme_example_runs(tmp_path, monkeypatch):
    with open(README) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert blocks, "the README has a Python example"
    monkeypatch.setattr(edgemark, "default_dir", lambda: str(tmp_path))
    scope: dict = {"dispatch": {}}
    exec(compile(blocks[0], README, "exec"), scope)
    final = scope["final"]
    seg = final["0->1:0"]
    assert seg["first_chunk_seq"] == 3
    assert seg["consumer_first_accept_ms"] == 4.2
    assert seg["clock_domains"]["consumer_first_accept"] == "device"
    assert scope["region"].snapshot(scope["token"]) == {}
