"""python/examples/pipeline.py runs, and prints one valid stream-edge
snapshot per request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing

from edgemark.stream_edge import StreamEdgeEvent, StreamEdgeSnapshot

EXAMPLE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "pipeline.py"
)


def test_example_pipeline_prints_a_snapshot_per_request():
    env = {k: v for k, v in os.environ.items() if k != "EDGEMARK_REGION"}
    out = subprocess.run(
        [sys.executable, EXAMPLE, "--requests", "3", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [line["request_id"] for line in lines] == ["req-0", "req-1", "req-2"]
    fields = list(typing.get_type_hints(StreamEdgeSnapshot))
    for line in lines:
        snap = line["metrics"]["stream_edge_metrics"]
        assert list(snap) == ["0->1:0", "1->2:0"]
        for key, seg in snap.items():
            assert list(seg) == fields, key
            assert f"{seg['from_stage']}->{seg['to_stage']}:{seg['segment_index']}" == key
            for e in StreamEdgeEvent:
                v = seg[e.value + "_ms"]
                assert isinstance(v, float) and v >= 0.0, (key, e, v)
            assert seg["clock_domains"] == {e.value: "host_monotonic" for e in StreamEdgeEvent}
            # Causal order on one clock: emit, send complete (the producer),
            # accept, output (the consumer).
            values = [seg[e.value + "_ms"] for e in StreamEdgeEvent]
            assert values == sorted(values), (key, values)
        # The metadata-only chunk 0 is not meaningful: the thinker's first
        # non-empty chunk is 1; the talker buffers one chunk, so its first
        # output is chunk 2.
        assert snap["0->1:0"]["first_chunk_seq"] == 1
        assert snap["1->2:0"]["first_chunk_seq"] == 2
        # The talker's first output is recorded before it emits it downstream.
        assert (
            snap["0->1:0"]["consumer_first_nonempty_output_ms"]
            <= snap["1->2:0"]["producer_first_nonempty_emit_ms"]
        )
