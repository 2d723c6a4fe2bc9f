"""A three-stage streaming pipeline (thinker -> talker -> code2wav) wired the
way vLLM-Omni wires its stages, recording its stream-edge first events only
through ``edgemark.stream_edge``.

    python python/examples/pipeline.py [--requests 4] [--json]

* The orchestrator (this process) creates a ``RequestStreamEdgeEvents`` with
  each request's state, starts segment 0 of the edges 0->1 and 1->2, and
  puts the handles into the dispatch message it sends to each stage.
* Each stage is its own process (started with ``spawn``) with an engine loop
  and, as vLLM-Omni's connectors have, a receive thread for its input edge
  and a send thread for its output edge; stages pass chunks to each other
  over pipes, never through the orchestrator.
* The four events are recorded where they happen: the producer's engine loop
  (first non-empty emit), the producer's send thread (first send complete),
  the consumer's receive thread (first accept) and the consumer's engine
  loop (first non-empty output). Heartbeats and the empty terminal chunk are
  recorded as not meaningful and leave no state.
* When the last stage finishes a request, the orchestrator's cleanup closes
  it and the final snapshot lands under ``metrics["stream_edge_metrics"]``.

Every record reads the region's shared clock (no ``elapsed_ms``): all stages
are on one host, so each edge's four events are in causal order on one
clock: emit, send complete, accept, output.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import queue
import sys
import threading
import time

from edgemark.stream_edge import RequestStreamEdgeEvents, StreamEdgeEvent, StreamEdgeKey

STAGES = ("thinker", "talker", "code2wav")
EDGES = (StreamEdgeKey(0, 1), StreamEdgeKey(1, 2))
#: Chunks the thinker streams per request (after one metadata-only chunk).
CHUNKS = 4
#: The marker a connector's send side writes after a frame to commit it.
COMMIT = b"commit"


# ---------------------------------------------------------------------------
# A stage process.


class Stage:
    """One stage's engine loop and its connector threads."""

    def __init__(self, stage_id, dispatch, conn_in, conn_out, outputs):
        self.stage_id = stage_id
        self.dispatch = dispatch
        self.conn_in = conn_in
        self.conn_out = conn_out
        self.outputs = outputs
        self.work: queue.Queue = queue.Queue()
        self.sendq: queue.Queue = queue.Queue()
        #: request_id -> {"in": handle, "out": handle}, from dispatch messages.
        self.handles: dict = {}
        self.arrived = threading.Condition()
        self.buffered: dict = {}

    def handle(self, request_id, side):
        """The handle the dispatch message brought for ``side`` of the
        request; waits for the message if a chunk came first."""
        with self.arrived:
            self.arrived.wait_for(lambda: request_id in self.handles, timeout=30)
            return self.handles[request_id].get(side)

    # -- threads ------------------------------------------------------------

    def dispatch_thread(self):
        while True:
            msg = self.dispatch.get()
            if msg is None:
                self.work.put(("stop",))
                return
            with self.arrived:
                # Unpickling the handles attached the region (once).
                self.handles[msg["request_id"]] = msg["stream_edge"]
                self.arrived.notify_all()
            if self.stage_id == 0:
                self.work.put(("generate", msg["request_id"], msg["prompt"]))

    def receive_thread(self):
        """The connector's receive side: decode, admit, record the first
        accept of the input edge."""
        while True:
            try:
                frame = self.conn_in.recv_bytes()
            except EOFError:
                self.work.put(("upstream_done",))
                return
            # A frame is admitted only once its sender committed it (the
            # commit marker that follows it), as a connector's receiver
            # takes a payload only after the put that wrote it completed.
            if self.conn_in.recv_bytes() != COMMIT:
                raise RuntimeError("a frame without its commit")
            request_id, seq, payload, final = json.loads(frame)
            # Decoded and admitted: recorded before the engine loop can see
            # it, so the accept comes before the consumer's output.
            self.handle(request_id, "in").record(
                StreamEdgeEvent.CONSUMER_ACCEPT, meaningful=bool(payload)
            )
            self.work.put(("chunk", request_id, seq, payload, final))

    def send_thread(self):
        """The connector's send side: the put writes the frame, the first
        send complete of the output edge is recorded, then the put commits
        the frame, which the receiver waits for before it admits it. So the
        send complete always comes before the consumer's accept."""
        while True:
            item = self.sendq.get()
            if item is None:
                self.conn_out.close()
                return
            request_id, seq, payload, final = item
            self.conn_out.send_bytes(json.dumps([request_id, seq, payload, final]).encode())
            self.handle(request_id, "out").record(
                StreamEdgeEvent.SEND_COMPLETE, meaningful=bool(payload)
            )
            self.conn_out.send_bytes(COMMIT)

    # -- the engine loop ------------------------------------------------------

    def emit(self, request_id, seq, payload, final=False):
        """The stage's output: downstream over the connector, or, from the
        last stage, to the orchestrator."""
        inp = self.handle(request_id, "in")
        if inp is not None:
            inp.record(StreamEdgeEvent.CONSUMER_OUTPUT, meaningful=bool(payload))
        out = self.handle(request_id, "out")
        if out is not None:
            out.record(StreamEdgeEvent.PRODUCER_EMIT, meaningful=bool(payload), chunk_seq=seq)
            self.sendq.put((request_id, seq, payload, final))
        else:
            self.outputs.put(("output", request_id, seq, len(payload)))
            if final:
                self.outputs.put(("finished", request_id))

    def run(self):
        threads = [threading.Thread(target=self.dispatch_thread, daemon=True)]
        if self.conn_in is not None:
            threads.append(threading.Thread(target=self.receive_thread, daemon=True))
        if self.conn_out is not None:
            threads.append(threading.Thread(target=self.send_thread, daemon=True))
        for t in threads:
            t.start()
        stops = 0
        needed = 1 if self.conn_in is None else 2  # dispatch closed, upstream closed
        while stops < needed:
            item = self.work.get()
            kind = item[0]
            if kind in ("stop", "upstream_done"):
                stops += 1
            elif kind == "generate":
                self.generate(item[1], item[2])
            elif kind == "chunk":
                self.step(*item[1:])
        self.sendq.put(None)
        for t in threads[1:]:
            t.join(10)

    def generate(self, request_id, prompt):
        """The thinker: a metadata-only chunk first (not meaningful), then
        text chunks, then the empty terminal chunk (not meaningful either)."""
        self.emit(request_id, 0, [])
        for seq in range(1, CHUNKS + 1):
            time.sleep(0.002)
            self.emit(request_id, seq, [f"{prompt}-{seq}"])
        self.emit(request_id, CHUNKS + 1, [], final=True)

    def step(self, request_id, seq, payload, final):
        """The talker and code2wav: the talker buffers its first text chunk
        (no output yet), code2wav turns every codec chunk into audio."""
        if final:
            rest = self.buffered.pop(request_id, [])
            if rest:
                self.emit(request_id, seq, rest)
            self.emit(request_id, seq + 1, [], final=True)
            return
        if not payload:
            # A metadata-only chunk passes on as one (still not meaningful).
            self.emit(request_id, seq, [])
            return
        time.sleep(0.001)
        if self.stage_id == 1:
            buf = self.buffered.setdefault(request_id, [])
            buf.extend(f"codec({p})" for p in payload)
            if len(buf) >= 2:
                self.emit(request_id, seq, buf[:])
                buf.clear()
        else:
            self.emit(request_id, seq, [f"wav({p})" for p in payload])


def stage_main(stage_id, dispatch, conn_in, conn_out, outputs):
    Stage(stage_id, dispatch, conn_in, conn_out, outputs).run()


# ---------------------------------------------------------------------------
# The orchestrator.


class ClientRequestState:
    def __init__(self, request_id):
        self.request_id = request_id
        # Where the request's state is created: its stream-edge events.
        self.stream_edge_events = RequestStreamEdgeEvents()
        self.metrics: dict = {}


def run(n_requests: int) -> list:
    ctx = multiprocessing.get_context("spawn")
    dispatch = [ctx.Queue() for _ in STAGES]
    outputs = ctx.Queue()
    # Connectors: stage 0 -> 1 and 1 -> 2, stage to stage.
    in01, out01 = ctx.Pipe(duplex=False)
    in12, out12 = ctx.Pipe(duplex=False)
    wiring = [(None, out01), (in01, out12), (in12, None)]
    procs = []
    for stage_id, (conn_in, conn_out) in enumerate(wiring):
        p = ctx.Process(
            target=stage_main,
            args=(stage_id, dispatch[stage_id], conn_in, conn_out, outputs),
            name=STAGES[stage_id],
            daemon=True,
        )
        p.start()
        procs.append(p)
    # Only the stages hold their ends of the connectors.
    for c in (in01, out01, in12, out12):
        c.close()

    request_states = {}
    for i in range(n_requests):
        rid = f"req-{i}"
        state = request_states[rid] = ClientRequestState(rid)
        ev = state.stream_edge_events
        h01, h12 = (ev.start_segment(k) for k in EDGES)
        # The handles travel inside the dispatch message each stage gets.
        stage_handles = [{"out": h01}, {"in": h01, "out": h12}, {"in": h12}]
        for stage_id in range(len(STAGES)):
            dispatch[stage_id].put(
                {"request_id": rid, "prompt": f"p{i}", "stream_edge": stage_handles[stage_id]}
            )

    done = []
    try:
        while len(done) < n_requests:
            msg = outputs.get(timeout=30)
            if msg[0] == "finished":
                rid = msg[1]
                state = request_states.pop(rid)
                # The cleanup path (completion here; abort, disconnect,
                # timeout and stage errors call the same close).
                final = state.stream_edge_events.close()
                state.metrics["stream_edge_metrics"] = final
                done.append((rid, state.metrics))
    finally:
        for q in dispatch:
            q.put(None)
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        for state in request_states.values():
            state.stream_edge_events.close()
    return done


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--json", action="store_true", help="one JSON line per request")
    args = ap.parse_args()
    for rid, metrics in sorted(run(args.requests)):
        if args.json:
            print(json.dumps({"request_id": rid, "metrics": metrics}))
            continue
        print(rid)
        for key, seg in metrics["stream_edge_metrics"].items():
            vals = ", ".join(
                f"{e.name.lower()} {seg[e.value + '_ms']:.3f} ms"
                if seg[e.value + "_ms"] is not None
                else f"{e.name.lower()} -"
                for e in StreamEdgeEvent
            )
            print(f"  {key}  chunk {seg['first_chunk_seq']}: {vals}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
